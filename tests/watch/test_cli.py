"""`gpudoctor watch` as a command: bad input is one line and exit 2; the report, exit code and --log of a job
whose scontrol and srun are stand-ins (constructed: scontrol prints a record in 22.05's format, srun prints what
the node probe would, built from the recorded H200 trace's idle phase). The real SLURM run is
tests/watch/test_watch_slurm.py."""

from __future__ import annotations

import json
import os
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
