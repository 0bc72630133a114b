"""`gpudoctor watch` as a command: bad input is one line and exit 2; the report, exit code and --log of a job
whose scontrol and srun are stand-ins (constructed: scontrol prints a record in 22.05's format, srun prints what
the node probe would, built from the recorded H200 trace's idle phase). The real SLURM run is
tests/watch/test_watch_slurm.py."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import jsonschema
import pytest

from gpudoctor.watch.samples import GpuTrace, NodeObservation, read_trace
from tests.cliutil import run_gpudoctor_here

TRACE = Path(__file__).parents[1] / "fixtures" / "watch" / "recorded-h200-nvml-trace-5-phases.jsonl"
SCHEMA = Path(__file__).parents[2] / "docs" / "report.schema.json"
RECORD = """JobId={job} JobName=train
   UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A
   JobState={state} Reason=None Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=0 Reboot=0 ExitCode=0:0
   NodeList=fake01
     Nodes=fake01 CPU_IDs=0-3 Mem=0 GRES=gpu:h200:1(IDX:0)
   Command=(null)
"""


def _exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _stand_ins(tmp_path: Path, state: str = "RUNNING", answer: bool = True) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "record.txt").write_text(RECORD.format(job=42, state=state))
    _exe(bin_dir / "scontrol", f'#!/bin/sh\n[ "$1" = show ] && exec cat {tmp_path}/record.txt\nexit 1\n')
    trace, phases = read_trace(TRACE.read_text().splitlines())
    idle = GpuTrace(**{**trace.__dict__, "samples": trace.samples[: phases.index("train")]})
    obs = NodeObservation("fake01", (0,), (), (idle,), window_s=15.0)
    (tmp_path / "node.json").write_text(json.dumps(obs.to_dict()) + "\n")
    failed = 'echo "srun: error: fake01: task 0: Exited with exit code 1" >&2; exit 1'
    _exe(bin_dir / "srun", f"#!/bin/sh\n{'cat ' + str(tmp_path / 'node.json') if answer else failed}\n")
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.parametrize(
    "args, said",
    [
        (["--job", "12\x1b]0;pwned\x07"], "expected a SLURM job id"),
        (["--job", "12; rm -rf ~"], "expected a SLURM job id"),
        (["--job", "12", "--for", "0"], "--for"),
        (["--job", "12", "--for", "2 weeks"], "--for"),
        (["--job", "12", "--rate", "nan"], "--rate"),
        (["--job", "12", "--python", "/nonexistent/python"], "not an executable file"),
        ([], "--job JOBID is required outside a SLURM job"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, said):
    r = run_gpudoctor_here("watch", *args)
    assert r.returncode == 2, r.stderr
    assert said in r.stderr and "Traceback" not in r.stderr
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2  # argparse's usage line and its message


def test_a_job_that_is_not_running_is_bad_input(tmp_path):
    r = run_gpudoctor_here("watch", "--job", "42", env=_stand_ins(tmp_path, state="PENDING"))
    assert r.returncode == 2 and "job 42 is PENDING, not RUNNING" in r.stderr


def test_no_scontrol_answer_is_one_line(tmp_path):
    r = run_gpudoctor_here("watch", "--job", "42")  # SLURM_CONF is an empty file: scontrol fails at once
    assert r.returncode == 2 and r.stderr.startswith("gpudoctor: ") and "Traceback" not in r.stderr


def test_an_idle_allocated_gpu_is_reported_with_exit_1_and_logged(tmp_path):
    log, prom = tmp_path / "samples.jsonl", tmp_path / "watch.prom"
    args = ("--for", "1s", "--log", str(log), "--prometheus", str(prom))
    r = run_gpudoctor_here("watch", "--job", "42", *args, env=_stand_ins(tmp_path))
    assert r.returncode == 1, r.stderr
    metrics = prom.read_text()
    assert 'gpudoctor_watch_check{id="GD-WATCH-001",name="allocated-gpu-unused"' in metrics
    assert "gpudoctor_watch_exit_code 1" in metrics
    assert "GD-WATCH-001" in r.stdout and "fake01" in r.stdout
    assert "job 42: 1 fail — it does not run as intended" in r.stdout  # a running job, not a plan
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert lines[0]["static"]["name"] == "NVIDIA H200" and lines[0]["node"] == "fake01"
    assert len(lines) > 10 and all(x["gpu"] == 0 for x in lines[1:])
    # the log reads back like a recording
    again, _ = read_trace(log.read_text().splitlines())
    assert len(again.samples) == len(lines) - 1


def test_json_report_and_a_node_that_gives_no_answer(tmp_path):
    r = run_gpudoctor_here("watch", "--job", "42", "--for", "1s", "--json", env=_stand_ins(tmp_path, answer=False))
    report = json.loads(r.stdout)
    assert report["schema"] == "gpudoctor.report/1" and report["watch"]["answered"] == []
    found = {f["id"]: f for f in report["findings"]}
    unobserved = found["GD-WATCH-006"]
    assert unobserved["severity"] == "fail" and "could not observe" in unobserved["message"]
    assert "fake01: task 0: Exited with exit code 1" in unobserved["message"]  # srun's own line for this node
    jsonschema.validate(report, json.loads(SCHEMA.read_text()))
    assert r.returncode == 1


SCRIPT = "#!/bin/bash\n#SBATCH --gres=gpu:8\n#SBATCH --ntasks=1\npython3 train.py\n"


DDP_PROGRAM = (
    "import os\nimport torch.distributed as dist\n"
    "rank, world = int(os.environ['SLURM_PROCID']), int(os.environ['SLURM_NTASKS'])\n"
    "dist.init_process_group('nccl', rank=rank, world_size=world)\n"
)


def test_the_batch_scripts_own_checks_give_the_cause_and_edit_the_file_slurm_names(tmp_path):
    from gpudoctor.model import ActionKind
    from gpudoctor.watch.cli import script_causes

    script = tmp_path / "job.sbatch"
    script.write_text(SCRIPT)
    # the program is not there: one process on 8 GPUs is the cause, but more tasks would start 8 copies of a
    # program that may not be distributed (README, "Do no harm"): a note without a fix
    (cause,) = script_causes("42", str(script), SCRIPT, str(tmp_path))
    assert cause.id == "GD-SLURM-003" and cause.severity.value == "info" and cause.fix is None
    # a program that is one rank per SLURM task, read from the job's working directory: the fix edits the script
    (tmp_path / "train.py").write_text(DDP_PROGRAM)
    (cause,) = script_causes("42", str(script), SCRIPT, str(tmp_path))
    assert cause.id == "GD-SLURM-003" and "8 allocated GPU(s): 7 stay idle" in cause.message
    edits = {(a.kind, a.key, a.value, a.target) for a in cause.fix.actions}
    assert (ActionKind.SBATCH_SET, "ntasks-per-node", "8", str(script)) in edits


def test_a_script_changed_since_submission_gets_lines_not_edits(tmp_path):
    from gpudoctor.watch.cli import script_causes

    script = tmp_path / "job.sbatch"
    script.write_text(SCRIPT.replace("python3", "python3 -u"))  # edited after sbatch: not the job's text
    (tmp_path / "train.py").write_text(DDP_PROGRAM)
    (cause,) = script_causes("42", str(script), SCRIPT, str(tmp_path))
    assert cause.fix.safety.value == "manual"
    assert [a.target for a in cause.fix.actions][:2] == ["#SBATCH --ntasks-per-node=8", "remove #SBATCH --ntasks"]
    assert script.read_text() != SCRIPT  # nothing was written


# ---------------------------------------------------------------- hostile input (issue 35 items 5, 6, 7, 9)


@pytest.mark.parametrize(
    "args, said",
    [
        (["--job", "0"], "expected a SLURM job id"),  # `scontrol show job 0` lists every job
        (["--job", "46\n"], "expected a SLURM job id"),  # `$` would match before the newline
        (["--job", "٤٦"], "expected a SLURM job id"),  # Arabic-Indic digits: int() reads them, SLURM does not
        (["--job", "046"], "expected a SLURM job id"),
        (["--job", "46_"], "expected a SLURM job id"),
        (["--job", "12", "--for", "١"], "--for"),
        (["--job", "12", "--for", "1_0"], "--for"),
        (["--job", "12", "--for", " 30s"], "--for"),
        (["--job", "12", "--rate", "١"], "--rate"),
        (["--job", "12", "--rate", "inf"], "--rate"),
        (["--job", "12", "--log", ""], "--log '': an empty path"),
        (["--job", "12", "--prometheus", ""], "--prometheus '': an empty path"),
        (["--job", "12", "--python", ""], "--python '': an empty path"),
    ],
)
def test_hostile_ids_numbers_and_paths_are_one_line_and_exit_2(args, said):
    r = run_gpudoctor_here("watch", *args)
    assert r.returncode == 2, r.stderr
    assert said in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_an_unusable_log_path_is_refused_before_the_window(tmp_path):
    env = _stand_ins(tmp_path)
    for path, said in ((tmp_path, "is a directory"), (tmp_path / "no" / "x.jsonl", "no directory")):
        r = run_gpudoctor_here("watch", "--job", "42", "--for", "1s", "--log", str(path), env=env)
        assert r.returncode == 2 and said in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("job", ["123_4", "123+1"])
def test_array_and_het_job_ids_are_accepted_and_matched(tmp_path, job):
    env = _stand_ins(tmp_path)
    array, het = ("ArrayJobId=123 ArrayTaskId=4", "") if "_" in job else ("", "HetJobId=123 HetJobOffset=1")
    other = RECORD.format(job=130, state="RUNNING").replace(
        "JobName=train", "JobName=other ArrayJobId=123 ArrayTaskId=5"
    )
    mine = RECORD.format(job=42, state="RUNNING").replace("JobName=train", f"JobName=train {array}{het}")
    (tmp_path / "record.txt").write_text(other + "\n" + mine)
    r = run_gpudoctor_here("watch", "--job", job, "--for", "1s", "--json", env=env)
    assert r.returncode == 1, r.stderr
    assert json.loads(r.stdout)["watch"]["job"] == "42"  # the task's own JobId, the one asked for


def test_the_job_judged_is_the_one_asked_for(tmp_path):
    env = _stand_ins(tmp_path)
    # the controller lists another job first (as `scontrol show job` with no id, or 0, does)
    first = RECORD.format(job=7, state="CANCELLED")
    (tmp_path / "record.txt").write_text(first + "\n" + RECORD.format(job=42, state="RUNNING"))
    r = run_gpudoctor_here("watch", "--job", "42", "--for", "1s", "--json", env=env)
    assert r.returncode == 1 and json.loads(r.stdout)["watch"]["job"] == "42", r.stderr
    # an answer about another job only: refused, never judged as this one
    (tmp_path / "record.txt").write_text(first)
    r = run_gpudoctor_here("watch", "--job", "42", "--for", "1s", env=env)
    assert r.returncode == 2 and "its answer names another job (JobId=7)" in r.stderr, r.stderr


def test_a_job_that_ends_during_the_watch_is_said_to_have_ended(tmp_path):
    env = _stand_ins(tmp_path, answer=False)
    ended = RECORD.format(job=42, state="COMPLETED").replace(
        "ExitCode=0:0", "ExitCode=0:0\n   EndTime=2026-11-29T01:02:03"
    )
    (tmp_path / "ended.txt").write_text(ended)
    # the first `show job` finds it running, every later one ended (the controller's answer after the window)
    (tmp_path / "bin" / "scontrol").write_text(
        f'#!/bin/sh\n[ "$1" = show ] || exit 1\n'
        f"if [ -e {tmp_path}/asked ]; then exec cat {tmp_path}/ended.txt; fi\n"
        f"touch {tmp_path}/asked\nexec cat {tmp_path}/record.txt\n"
    )
    r = run_gpudoctor_here("watch", "--job", "42", "--for", "1s", "--json", env=env)
    found = {f["id"]: f for f in json.loads(r.stdout)["findings"]}
    ended_f = found["GD-WATCH-006"]
    assert "job 42 ended during the watch (COMPLETED at 2026-11-29T01:02:03)" in ended_f["message"], ended_f
    assert ended_f["severity"] == "info" and ended_f["evidence"]["ended"]["state"] == "COMPLETED"
    assert "could not observe" not in ended_f["message"] and r.returncode == 0
    # a job that failed meanwhile: a warn, with its state
    (tmp_path / "ended.txt").write_text(ended.replace("COMPLETED", "FAILED"))
    (tmp_path / "asked").unlink()
    r = run_gpudoctor_here("watch", "--job", "42", "--for", "1s", "--json", env=env)
    ended_f = {f["id"]: f for f in json.loads(r.stdout)["findings"]}["GD-WATCH-006"]
    assert ended_f["severity"] == "warn" and "(FAILED at 2026-11-29T01:02:03)" in ended_f["message"]


def test_next_steps_name_the_jobs_batch_script_shell_quoted(tmp_path):
    from gpudoctor.report.text import next_steps
    from gpudoctor.watch.cli import fix_command, script_causes

    work = tmp_path / "my jobs; $(x)"
    work.mkdir()
    script = work / "job.sbatch"
    script.write_text(SCRIPT)
    (work / "train.py").write_text(DDP_PROGRAM)
    causes = script_causes("42", str(script), SCRIPT, str(work))
    command = fix_command(str(script))
    assert command == f"gpudoctor fix --apply --sbatch '{script}'"
    first = next_steps(causes, command)[0]
    assert first.startswith(f"gpudoctor fix --apply --sbatch '{script}' --unsafe-fixes"), first
    assert fix_command(None) is None


def test_a_job_that_ends_after_every_node_answered_is_said_once(tmp_path):
    env = _stand_ins(tmp_path)
    ended = RECORD.format(job=42, state="CANCELLED").replace("Command=(null)", "EndTime=2026-11-29T01:02:03\n")
    (tmp_path / "ended.txt").write_text(ended)
    (tmp_path / "bin" / "scontrol").write_text(
        f'#!/bin/sh\n[ "$1" = show ] || exit 1\n'
        f"if [ -e {tmp_path}/asked ]; then exec cat {tmp_path}/ended.txt; fi\n"
        f"touch {tmp_path}/asked\nexec cat {tmp_path}/record.txt\n"
    )
    r = run_gpudoctor_here("watch", "--job", "42", "--for", "1s", "--json", env=env)
    said = [f for f in json.loads(r.stdout)["findings"] if f["id"] == "GD-WATCH-006"]
    assert len(said) == 1 and said[0]["severity"] == "warn", said
    assert "job 42 ended during the watch (CANCELLED at 2026-11-29T01:02:03)" in said[0]["message"]


def test_a_job_gone_from_the_controller_after_the_window_is_said_to_have_ended(tmp_path):
    env = _stand_ins(tmp_path, answer=False)
    (tmp_path / "bin" / "scontrol").write_text(
        f'#!/bin/sh\n[ "$1" = show ] || exit 1\n'
        f'if [ -e {tmp_path}/asked ]; then echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; fi\n'
        f"touch {tmp_path}/asked\nexec cat {tmp_path}/record.txt\n"
    )
    r = run_gpudoctor_here("watch", "--job", "42", "--for", "1s", "--json", env=env)
    said = [f for f in json.loads(r.stdout)["findings"] if f["id"] == "GD-WATCH-006"]
    assert len(said) == 1 and said[0]["severity"] == "info", said
    assert "job 42 ended during the watch (no longer in the controller's list)" in said[0]["message"]


def test_the_text_reports_next_step_fixes_the_jobs_script_not_this_machine(tmp_path):
    """A job whose script (Command=) still holds the submitted text: the next step is `gpudoctor fix --apply
    --sbatch <that script>`, quoted for the shell (issue 35 item 9)."""
    from gpudoctor.watch.samples import JobProcess

    env = _stand_ins(tmp_path)
    work = tmp_path / "my jobs"
    work.mkdir()
    script = work / "job.sbatch"
    script.write_text(SCRIPT)
    (work / "train.py").write_text(DDP_PROGRAM)
    (tmp_path / "script.txt").write_text(SCRIPT)
    record = (
        RECORD.format(job=42, state="RUNNING")
        .replace("BatchFlag=0", "BatchFlag=1")
        .replace("GRES=gpu:h200:1(IDX:0)", "GRES=gpu:h200:8(IDX:0-7)")
        .replace("Command=(null)", f"Command={script}\n   WorkDir={work}")
    )
    (tmp_path / "record.txt").write_text(record)
    (tmp_path / "bin" / "scontrol").write_text(
        f'#!/bin/sh\n[ "$1" = show ] && exec cat {tmp_path}/record.txt\n'
        f'[ "$1" = write ] && exec cat {tmp_path}/script.txt\nexit 1\n'
    )
    rank = JobProcess(pid=4242, ppid=1, cmdline=("python3", "train.py"), env={"CUDA_VISIBLE_DEVICES": "0"})
    obs = NodeObservation("fake01", tuple(range(8)), (rank,), window_s=1.0)
    (tmp_path / "node.json").write_text(json.dumps(obs.to_dict()) + "\n")
    r = run_gpudoctor_here("watch", "--job", "42", "--for", "1s", env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    shown = re.sub(r" \\\n *", " ", r.stdout).replace("'\\\n'", "").replace("\\\n", "")  # as bash reads
    assert f"gpudoctor fix --apply --sbatch '{script}'" in shown, r.stdout
    assert "gpudoctor fix --apply   #" not in shown and "gpudoctor fix --apply --unsafe-fixes" not in shown


@pytest.mark.parametrize("as_json", [False, True])
def test_argv_secrets_of_the_jobs_processes_reach_no_report(tmp_path, as_json):
    """GD-WATCH-001's message and evidence.cause quote the ranks' command lines: an option and its value in two
    words (curl/wget's `-u bob:PW`, `--proxy-user u:PW`) is blanked as in one (issue 35 item 1), even from a
    probe that printed them raw."""
    env = _stand_ins(tmp_path)
    (tmp_path / "record.txt").write_text(
        RECORD.format(job=42, state="RUNNING").replace("GRES=gpu:h200:1(IDX:0)", "GRES=gpu:h200:2(IDX:0-1)")
    )
    argv = ["python3", "train.py", "-u", "bob:MARKERu", "--user", "c:MARKERc", "--proxy-user", "p:MARKERp"]
    argv += ["-ud:MARKERd", "--password", "MARKERpw", "--token", "MARKERtok"]
    raw = {"pid": 4242, "ppid": 1, "cmdline": argv, "env": {"CUDA_VISIBLE_DEVICES": "0"}}
    node = {"node": "fake01", "allocated": [0, 1], "processes": [raw], "window_s": 1.0}
    (tmp_path / "node.json").write_text(json.dumps(node) + "\n")
    r = run_gpudoctor_here("watch", "--job", "42", "--for", "1s", *(["--json"] if as_json else []), env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "GD-WATCH-001" in r.stdout and "train.py -u bob:<redacted>" in r.stdout  # quoted, and blanked
    assert "MARKER" not in r.stdout + r.stderr, [x for x in r.stdout.splitlines() if "MARKER" in x]
