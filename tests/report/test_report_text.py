"""Issue 10: preflight from the login node, judged on the job, said in one screen.

The login-node stand-in is a real `gpudoctor check --sbatch` on this GPU-less machine with --expect-gpus unset:
no driver, a CPU torch. The seed scripts are stored as the guide prints them (seeds/slurm-ddp-hang-fix.md:
its "CORRECT APPROACH" block, and its "WRONG APPROACH" directives followed by the same launch command), each
under a #!/bin/bash line, since sbatch refuses a script without one.
"""

from __future__ import annotations

import io
import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpudoctor.job.target import Target, decide
from gpudoctor.model import Action, ActionKind, Context, Finding, Fix, Safety, Severity
from gpudoctor.readers.sbatch import parse_sbatch
from gpudoctor.report import text
from gpudoctor.shellquote import Reference
from gpudoctor.verdict import split
from tests.cliutil import clean_env, flat, run_gpudoctor, run_gpudoctor_here
from tests.factsutil import FIXTURES, RECORDED_CPU, make_facts, run, said

SCRIPTS = FIXTURES / "sbatch"
SEEDS = ["seed-guide-wrong-approach.slurm", "seed-guide-correct-approach.slurm"]
HEALTHY = SCRIPTS / "correct-srun-ntasks8-gres8.slurm"
CPU_SNAPSHOT = str(FIXTURES / "facts" / f"{RECORDED_CPU}.json")
GPU_SNAPSHOT = str(FIXTURES / "facts" / "synthetic-h100x8-healthy.json")
ESC = "\x1b"


def gpudoctor(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The CLI's answer, run in this process (what it prints is the point here, not its process)."""
    return run_gpudoctor_here(*args, env=env, drop=("NO_COLOR",))


def by_id(report: dict) -> dict:
    return {f["id"]: f for f in report["findings"]}


def joined(text: str) -> str:
    """The report with each shell command's continuation lines joined back as the shell reads them: ` \\`
    between words, `\\` inside a word, `'\\` + `'` inside single quotes (gpudoctor/report/screen.py)."""
    return re.sub(r" \\\n *", " ", text).replace("'\\\n'", "").replace("\\\n", "")


# ---------------------------------------------------------------- the job is the target


@pytest.mark.parametrize("name", SEEDS)
def test_seed_scripts_fail_from_a_login_node_with_cause_and_fix(name):
    path = str(SCRIPTS / name)
    r = gpudoctor("check", "--sbatch", path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "GD-SLURM-005" in r.stdout and "next: gpudoctor fix --apply" in r.stdout
    verbose = gpudoctor("check", "--sbatch", path, "-v").stdout  # the version judged, and how to know it: -v
    assert "Lightning 2.x" in flat(verbose) and "--python" in verbose
    report = json.loads(gpudoctor("check", "--sbatch", path, "--json").stdout)
    f = by_id(report)["GD-SLURM-005"]
    assert f["severity"] == "fail" and f["fix"] is not None
    assert report["target"]["kind"] == "job" and report["target"]["this_machine_in_verdict"] is False
    assert "GD-SLURM-005" not in report["target"]["outside_verdict"]
    import jsonschema

    schema = json.loads((Path(__file__).parents[2] / "docs" / "report.schema.json").read_text())
    jsonschema.validate(report, schema)


def test_fixed_seed_fails_because_lightning_2_trains_on_one_gpu():
    report = json.loads(gpudoctor("check", "--sbatch", str(SCRIPTS / SEEDS[1]), "--json", "--select", "slurm").stdout)
    assert "1 of 8 GPU(s)" in by_id(report)["GD-SLURM-005"]["message"]


def test_healthy_job_from_a_login_node_exits_0_and_fits_one_screen():
    """This machine has no driver (GD-DRV-001 fails here) but it is not where the job runs."""
    r = gpudoctor("check", "--sbatch", str(HEALTHY))
    assert r.returncode == 0, r.stdout
    lines = r.stdout.splitlines()
    assert len(lines) <= 24, r.stdout
    assert any("not the job's node: 1 fail, not counted (-v)" in line for line in lines)  # on the summary line
    assert "GD-DRV-001" not in r.stdout and "GD-DRV-001" in gpudoctor("check", "--sbatch", str(HEALTHY), "-v").stdout
    assert r.stdout.rstrip().splitlines()[-1].startswith("✓ the job: no problems found")
    report = json.loads(gpudoctor("check", "--sbatch", str(HEALTHY), "--json").stdout)
    assert "GD-DRV-001" in report["target"]["outside_verdict"]
    assert by_id(report)["GD-DRV-001"]["severity"] == "fail"  # reported as it is, outside the verdict


def test_plain_check_still_judges_this_machine():
    r = gpudoctor("check", "--snapshot", CPU_SNAPSHOT, "--select", "driver")
    assert r.returncode == 1 and "this machine" in r.stdout.splitlines()[0]


def test_node_snapshot_makes_the_recorded_node_count():
    r = gpudoctor(
        "check", "--snapshot", CPU_SNAPSHOT, "--node-snapshot", GPU_SNAPSHOT, "--sbatch", str(HEALTHY), "--json"
    )
    report = json.loads(r.stdout)
    assert report["target"]["this_machine_in_verdict"] is True and report["target"]["outside_verdict"] == []
    assert by_id(report)["GD-DRV-001"]["severity"] == "pass"  # the recorded node has its driver
    bad = gpudoctor("check", "--node-snapshot", "/nonexistent.json", "--sbatch", str(HEALTHY), "--select", "slurm")
    assert bad.returncode == 2 and "--node-snapshot" in bad.stderr and "Traceback" not in bad.stderr


def test_target_decision():
    cpu = make_facts(RECORDED_CPU, env={})
    sb = parse_sbatch("#!/bin/bash\n#SBATCH --gres=gpu:8\nsrun python t.py\n", "job.slurm")
    assert decide(cpu, Context(sbatch=sb, sbatch_path="job.slurm")).kind == "job"
    assert not decide(cpu, Context(sbatch=sb, sbatch_path="job.slurm")).machine_in_verdict
    assert decide(cpu, Context(config={"trainer": {}}, config_path="c.yaml", expect_gpus=8)).kind == "job"
    assert decide(cpu, Context()).machine_in_verdict
    inside = make_facts(RECORDED_CPU, env={"SLURM_JOB_ID": "7"})
    assert decide(inside, Context(sbatch=sb, sbatch_path="job.slurm")).machine_in_verdict
    ranked = make_facts(RECORDED_CPU, env={"RANK": "1", "WORLD_SIZE": "2"})
    assert decide(ranked, Context()).machine_in_verdict
    # a config on a GPU machine is that machine's job, unless it is judged before submission (the pre-commit hook)
    gpu = make_facts("recorded-h100x1-driver580-torch2.11-cu130", env={})
    config = {"config": {"trainer": {}}, "config_path": "c.yaml", "expect_gpus": 1}
    assert decide(gpu, Context(**config)).machine_in_verdict
    before = decide(gpu, Context(**config, before_submission=True))
    assert before.kind == "job" and not before.machine_in_verdict


# ---------------------------------------------------------------- the job's resources


def test_cpu_checks_use_the_scripts_cpus_per_task(tmp_path):
    """12 CPUs per task with num_workers: 0 is fine, whatever this host has."""
    script = (
        "#!/bin/bash\n#SBATCH -N1\n#SBATCH --ntasks-per-node=8\n#SBATCH --gres=gpu:8\n#SBATCH --cpus-per-task=12\n"
        "srun python t.py\n"
    )
    sb = parse_sbatch(script, str(tmp_path / "job.slurm"))
    config = {"dataloader": {"num_workers": 0, "batch_size": 32}}
    facts = make_facts(RECORDED_CPU, env={}, patch={"host.cpus_allowed_count": 2, "host.cpu_count_logical": 2})
    ctx = dict(sbatch=sb, sbatch_path=sb.path, config=config, config_path=str(tmp_path / "c.yaml"))
    (dl1,) = run("GD-DL-001", facts, **ctx)
    assert dl1.severity is Severity.PASS and "12 CPUs" in said(dl1) and "compete" not in said(dl1)
    (dl6,) = run("GD-DL-006", facts, **ctx)
    assert "12" in dl6.evidence["cpus"]
    config["dataloader"]["num_workers"] = 16  # 17 processes on 12 CPUs: a verdict about the job, not a hint
    (dl1,) = run("GD-DL-001", facts, **ctx)
    assert dl1.severity is Severity.WARN and "12 CPUs" in said(dl1)


def test_slurm_002_does_not_pass_eight_tasks_that_never_start():
    sb = parse_sbatch((SCRIPTS / SEEDS[0]).read_text(), str(SCRIPTS / SEEDS[0]))
    (f,) = run("GD-SLURM-002", make_facts(RECORDED_CPU, env={}), sbatch=sb, sbatch_path=sb.path)
    assert f.severity is not Severity.PASS and "no srun" in said(f)


def test_socket_ifname_matching_nothing_fails_in_the_jobs_own_environment():
    env = {"NCCL_SOCKET_IFNAME": "=ens1f0", "SLURM_JOB_ID": "42"}
    (f,) = run("GD-NCCL-002", make_facts(env=env))
    assert f.severity is Severity.FAIL
    (alone,) = run("GD-NCCL-002", make_facts(env={"NCCL_SOCKET_IFNAME": "=ens1f0"}))
    assert alone.severity is Severity.WARN  # a lone process outside any job


# ---------------------------------------------------------------- one screen


def _commands_in_json(report: dict) -> list[str]:
    """The commands of the verdict's findings (the machine gpudoctor runs on, when it is not the job's, is -v's)."""
    out = []
    outside = set(report["target"]["outside_verdict"])
    for f in report["findings"]:
        if f["id"] in outside or f["severity"] in ("pass", "skip"):
            continue
        for a in (f["fix"] or {}).get("actions", []):
            if a["kind"] == "command":
                out.append(a["target"])
            elif a["kind"] == "set_env":
                out.append(text.export_line(a["target"], Action.from_dict(a).env_value))
            elif a["kind"] == "unset_env":
                out.append(f"unset {a['target']}")
    return out


FIX_CASES = [
    *(["--sbatch", str(SCRIPTS / s)] for s in SEEDS),
    ["--sbatch", str(SCRIPTS / "realworld" / "gres-typo-gpus.slurm")],
    ["--sbatch", str(SCRIPTS / "broken-srun-torchrun-double-launch.slurm")],
    ["--config", str(FIXTURES / "configs" / "seed-navsim-h200-dataloader.yaml"), "--expect-gpus", "8"],
]


@pytest.mark.parametrize("args", FIX_CASES, ids=lambda a: Path(a[1]).name)
def test_every_fix_command_in_the_json_is_in_the_text_verbatim(args):
    base = ["check", "--snapshot", CPU_SNAPSHOT, *args]
    report = json.loads(gpudoctor(*base, "--json").stdout)
    shown = joined(gpudoctor(*base).stdout)
    commands = _commands_in_json(report)
    for cmd in commands:
        assert cmd in shown, f"{cmd!r} not in the text report"


def test_quiet_prints_only_problems_and_verbose_everything():
    base = ["check", "--snapshot", CPU_SNAPSHOT, "--sbatch", str(SCRIPTS / SEEDS[1])]
    quiet, default, verbose = (gpudoctor(*base, *flag).stdout for flag in (["-q"], [], ["-v"]))
    assert "[✓]" not in quiet and "✗" in quiet and "next: gpudoctor fix" in quiet
    assert "passed" not in quiet and "the job:" not in quiet and "gpudoctor 0.1" not in quiet  # problems and fixes
    assert "[✓]" not in default and "passed" in default and "GD-SLURM-004" not in default
    assert "[✓]" in verbose and "GD-SLURM-004" in verbose  # a passed check, with -v
    assert len(quiet.splitlines()) < len(default.splitlines()) < len(verbose.splitlines())
    assert "None" not in default and ": ?" not in default


def test_safety_label_explained_once():
    fixes = [
        Finding("GD-X-001", "a", "slurm", Severity.FAIL, "t", "m", {}, Fix(f"fix {i}", Safety.UNSAFE)) for i in range(3)
    ]
    out = io.StringIO()
    text.write(fixes, file=out)
    assert out.getvalue().count("needs --unsafe-fixes") == 1 and out.getvalue().count("fix (unsafe)") == 3


def test_escape_sequences_from_a_replayed_snapshot_are_not_written(tmp_path):
    data = json.loads(Path(CPU_SNAPSHOT).read_text())
    data["host"]["hostname"] = "node\x1b]0;pwned\x07\x1b[2J\x9b31m01"
    path = tmp_path / "evil.json"
    path.write_text(json.dumps(data))
    r = gpudoctor("check", "--snapshot", str(path), "--select", "driver")
    assert r.returncode in (0, 1) and ESC not in r.stdout and "\x9b" not in r.stdout and "\x07" not in r.stdout
    assert "node" in r.stdout and "01" in r.stdout


def test_clean_and_human():
    assert text.clean("a\x1b[31mb\x1b]0;t\x07c\x00") == "abc\\x00"
    assert text.human(None) == "not known" and text.human(0.0591234) == "0.0591" and text.human(True) == "yes"


def test_no_color_on_a_pipe_and_with_no_color(tmp_path):
    piped = run_gpudoctor("check", "--snapshot", CPU_SNAPSHOT, "--select", "driver", drop=("NO_COLOR",))
    assert ESC not in piped.stdout and ESC not in piped.stderr
    for env, colored in (({}, True), ({"NO_COLOR": "1"}, False)):
        leader, follower = pty.openpty()
        full = clean_env({**env, "TERM": "xterm"}, drop=("NO_COLOR",))
        p = subprocess.run(
            [sys.executable, "-m", "gpudoctor", "check", "--snapshot", CPU_SNAPSHOT, "--select", "driver"],
            stdout=follower,
            stderr=subprocess.DEVNULL,
            env=full,
            timeout=120,
        )
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(leader)
        got = b"".join(chunks).decode()
        assert p.returncode == 1 and (ESC in got) is colored, got[:200]


def test_each_task_labelled_with_the_snapshots_rank_and_host(tmp_path, monkeypatch, capsys):
    """A replayed snapshot is labelled as it was recorded (its own rank variables and host), never with the
    replaying shell's: the label is taken from the facts before rendering (in-process, no CLI subprocess)."""
    from gpudoctor.cli import main

    recorded = json.loads(Path(CPU_SNAPSHOT).read_text())
    recorded["env"]["vars"].update({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3"})
    recorded["host"]["hostname"] = "gpu07"
    snapshot = tmp_path / "rank3.json"
    snapshot.write_text(json.dumps(recorded))
    for name in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_JOB_ID", "SLURM_JOBID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "5")  # the replaying shell's own rank: not the snapshot's
    monkeypatch.setenv("WORLD_SIZE", "16")
    main(["check", "--snapshot", str(snapshot), "--select", "distributed"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line]
    assert lines and all(line.startswith("[rank 3/8 on gpu07] ") for line in lines), lines


def test_next_steps_are_one_fix_line_and_commands_stay_under_their_finding():
    findings = [
        Finding(
            "GD-A-001",
            "a",
            "nccl",
            Severity.FAIL,
            "t",
            "m",
            {},
            Fix("set it", Safety.SAFE, (Action(ActionKind.SET_ENV, "NCCL_X", "a b"),)),
        ),
        Finding(
            "GD-A-002",
            "b",
            "slurm",
            Severity.WARN,
            "t",
            "m",
            {},
            Fix("edit", Safety.UNSAFE, (Action(ActionKind.SBATCH_SET, "job.slurm", "8", "ntasks-per-node"),)),
        ),
    ]
    steps = text.next_steps(findings, "gpudoctor fix --apply --sbatch job.slurm")
    assert steps == ["gpudoctor fix --apply --sbatch job.slurm --unsafe-fixes"]
    out = io.StringIO()
    text.write(findings, file=out)
    lines = out.getvalue().splitlines()
    head = next(i for i, line in enumerate(lines) if "GD-A-001" in line)
    assert lines[head + 1].startswith("  fix (safe): set it") and lines[head + 2] == "    export NCCL_X='a b'"
    assert (
        text.export_line("SRUN_CPUS_PER_TASK", Reference("SLURM_CPUS_PER_TASK"))
        == 'export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"'
    )
    assert text.export_line("X", "$HOME") == "export X='$HOME'"  # a value read from the user: kept literal


def test_split_keeps_job_findings_in_the_verdict():
    from gpudoctor.registry import load_all

    load_all()  # the checks' scopes decide the split: registered, as the CLI has them (not left to test order)
    target = Target("job", "the job", False, "test", "login1")
    job = Finding("GD-SLURM-002", "several-tasks-share-one-gpu", "slurm", Severity.FAIL, "t", "m")
    machine = Finding("GD-DRV-001", "nvidia-driver-missing", "driver", Severity.FAIL, "t", "m")
    assert split([job, machine], target) == ([job], [machine])


def _expected(path: Path) -> str | None:
    m = re.search(r"^# expect: (\w+)", path.read_text(errors="replace"), re.M)
    return m.group(1) if m else None


HEALTHY_REALWORLD = sorted(p for p in (SCRIPTS / "realworld").glob("*.slurm") if _expected(p) == "pass")


@pytest.mark.parametrize("path", HEALTHY_REALWORLD, ids=lambda p: p.stem)
def test_healthy_realworld_jobs_fit_24_lines(path):
    r = gpudoctor("check", "--snapshot", CPU_SNAPSHOT, "--sbatch", str(path))
    assert r.returncode == 0 and len(r.stdout.splitlines()) <= 24, r.stdout


# ---------------------------------------------------------------- smaller items


def test_did_you_mean_for_a_mistyped_command():
    r = gpudoctor("chekc")
    assert r.returncode == 2 and "did you mean 'check'?" in r.stderr and "Traceback" not in r.stderr


def test_did_you_mean_for_a_misspelled_option_and_a_synonym():
    """Issue 38: `--sbtach` gets its suggestion as `chek` does; `--device gpu` means cuda, not the nearer 'cpu'."""
    r = gpudoctor("check", "--sbtach", "job.slurm")
    assert r.returncode == 2 and "did you mean '--sbatch'?" in r.stderr and "Traceback" not in r.stderr
    from gpudoctor.report.usage import did_you_mean

    said = did_you_mean("argument --device: invalid choice: 'gpu' (choose from 'auto', 'cuda', 'cpu')")
    assert said.endswith("did you mean 'cuda'?")


def test_select_is_case_insensitive():
    upper = json.loads(gpudoctor("check", "--snapshot", CPU_SNAPSHOT, "--select", "DRIVER,gd-dev-001", "--json").stdout)
    assert {f["id"] for f in upper["findings"]} >= {"GD-DRV-001", "GD-DEV-001"}
    assert {f["category"] for f in upper["findings"]} == {"driver", "devices"}


def test_list_shows_titles():
    r = gpudoctor("list")
    assert r.returncode == 0 and "Each SLURM task has a GPU of its own" in r.stdout


def test_sigterm_exits_143(tmp_path):
    """SIGTERM while the torch probe runs: exit 143 as a shell reports it, and the probe's process is stopped.

    The torch here is a stand-in whose import writes its pid and then hangs, so the signal certainly lands
    inside the probe (a fixed sleep raced a `check` that finishes in about 1 s)."""
    import signal
    import time

    pid_file = tmp_path / "torch.pid"
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n"
    )
    env = clean_env({"PYTHONPATH": str(fake.parent)})
    p = subprocess.Popen(
        [sys.executable, "-m", "gpudoctor", "check", "--torch-timeout", "120"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert p.poll() is None, "check ended before its torch probe started"
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 143 and "Traceback" not in err and "internal error" not in err, err
    probe_pid = int(pid_file.read_text())
    for _ in range(100):
        try:
            os.kill(probe_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(probe_pid, signal.SIGKILL)
        raise AssertionError("the torch probe outlived gpudoctor's SIGTERM")


@pytest.fixture(scope="module")
def python_without_torch(tmp_path_factory):
    env_dir = tmp_path_factory.mktemp("notorch") / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    return str(env_dir / "bin" / "python")


def test_smoke_without_torch_is_a_finding_and_exit_2(python_without_torch):
    r = gpudoctor("smoke", "--python", python_without_torch)
    assert r.returncode == 2 and "GD-SMOKE-013" in r.stdout and "internal error" not in r.stderr
    assert f"{python_without_torch} -m pip install torch" in joined(r.stdout)
    report = json.loads(gpudoctor("smoke", "--python", python_without_torch, "--json").stdout)
    assert report["findings"][0]["id"] == "GD-SMOKE-013" and report["ok"] is False


def test_smoke_python_must_be_an_interpreter(tmp_path):
    r = gpudoctor("smoke", "--python", str(tmp_path / "nope"))
    assert r.returncode == 2 and "not an executable file" in r.stderr


def test_shares_shown_as_percentages():
    assert text.evidence_lines({"mfu_vs_spec": 0.059}) == ["mfu_vs_spec: 5.9 %"]


def test_junit_failures_match_the_exit_code(tmp_path):
    out = tmp_path / "report.xml"
    r = gpudoctor("check", "--snapshot", CPU_SNAPSHOT, "--sbatch", str(HEALTHY), "--junit", str(out))
    assert r.returncode == 0
    import xml.etree.ElementTree as ET

    root = ET.parse(out).getroot()
    assert root.get("failures") == "0"
    skipped = [s.get("message") for s in root.iter("skipped")]
    assert any(m.startswith("about ") and "(fail)" in m for m in skipped)  # GD-DRV-001 on this driverless machine


def test_spinner_only_on_a_terminal(monkeypatch):
    import time

    from gpudoctor.report.progress import spinner

    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    piped = io.StringIO()
    with spinner("probing", stream=piped):
        time.sleep(0.5)
    assert piped.getvalue() == ""
    leader, follower = pty.openpty()
    with os.fdopen(follower, "w") as tty:
        with spinner("probing", stream=tty):
            time.sleep(0.6)
        with spinner("quiet", stream=tty, enabled=False):  # --json
            time.sleep(0.5)
    got = os.read(leader, 65536).decode()
    os.close(leader)
    assert "probing…" in got and "quiet" not in got and got.endswith("\r\x1b[2K")


def test_node_snapshot_recorded_on_a_real_h100_judges_the_request_against_that_node():
    """The lent H100 machine's recording (1 GPU, 16 CPUs) cannot hold a node of an 8-task, 8-GPU job."""
    node = str(FIXTURES / "facts" / "recorded-h100x1-driver580-torch2.11-cu130.json")
    r = gpudoctor("check", "--snapshot", CPU_SNAPSHOT, "--node-snapshot", node, "--sbatch", str(HEALTHY), "--json")
    assert r.returncode == 1
    f = by_id(json.loads(r.stdout))["GD-SLURM-020"]
    assert f["severity"] == "fail" and "1 GPU(s) < 8" in said(f) and "16 CPUs < 128" in said(f)


def test_torch_warnings_do_not_leak_into_smoke_output():
    code = (
        "from gpudoctor.sample_train.interpreter import HELD_WARNINGS, hold_warnings\n"
        "hold_warnings()\nimport torch\ntorch.zeros(1).storage()\nprint(len(HELD_WARNINGS))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr == "" and int(r.stdout) >= 1  # TypedStorage's deprecation, held


def test_healthy_job_with_advice_notes_fits_24_lines_and_keeps_the_commands():
    """huggingface/accelerate#1239's template: no problem, two notes that come with commands. The default view
    prints each note's commands (verbatim) on its fix line, so a healthy job still fits one screen; -v keeps
    the fix titles."""
    path = SCRIPTS / "realworld" / "accelerate-template-escaped-procid-notes.slurm"
    r = gpudoctor("check", "--snapshot", CPU_SNAPSHOT, "--sbatch", str(path))
    assert r.returncode == 0 and len(r.stdout.splitlines()) <= 24, r.stdout
    for command in ("export TORCH_NCCL_ASYNC_ERROR_HANDLING=1", "unset NCCL_ASYNC_ERROR_HANDLING"):
        assert command in r.stdout, r.stdout
    # a note's block: title, message, `fix (...): <first command>` (on a login node the machine section is longer)
    assert "fix (safe): export TORCH_NCCL_ASYNC_ERROR_HANDLING=1\n" in r.stdout, r.stdout
    assert "and unset NCCL_ASYNC_ERROR_HANDLING" not in r.stdout
    verbose = gpudoctor("check", "--snapshot", CPU_SNAPSHOT, "--sbatch", str(path), "-v")
    assert "export TORCH_NCCL_ASYNC_ERROR_HANDLING=1 and unset NCCL_ASYNC_ERROR_HANDLING" in flat(verbose.stdout)
