"""`gpudoctor fix` end to end on real files: dry run, --apply, backups, --diff, --json, --shell, refusals.

Facts come from the recorded CPU snapshot (no probing), the scripts are the seed fixtures copied
to a temp dir; every assertion reads the real files back.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpudoctor.cli import main
from tests.cliutil import clean_env, run_gpudoctor_here

FIXTURES = Path(__file__).parents[1] / "fixtures"
SNAPSHOT = str(FIXTURES / "facts" / "recorded-cpu-debian12-torch2.13-nogpu.json")
SEED_BROKEN = FIXTURES / "sbatch" / "seed-broken-gres1-ntasks8.slurm"
SEED_FIXED = FIXTURES / "sbatch" / "seed-fixed-ntasks1-lightning.slurm"
SCHEMA = Path(__file__).parents[2] / "docs" / "fix.schema.json"


def fix(*args: str) -> int:
    return main(["fix", "--snapshot", SNAPSHOT, "--launcher", "lightning", *args])


def report(capsys, *args: str) -> tuple[int, dict]:
    rc = fix(*args, "--json")
    out = capsys.readouterr().out
    return rc, json.loads(out)


@pytest.fixture
def seed_fixed(tmp_path: Path) -> Path:
    p = tmp_path / "job.slurm"
    shutil.copyfile(SEED_FIXED, p)
    return p


@pytest.fixture
def seed_broken(tmp_path: Path) -> Path:
    p = tmp_path / "broken.slurm"
    shutil.copyfile(SEED_BROKEN, p)
    return p


def test_dry_run_writes_nothing_and_shows_a_diff(seed_fixed, capsys):
    before = seed_fixed.read_bytes()
    rc = fix("--sbatch", str(seed_fixed), "--unsafe-fixes")
    out = capsys.readouterr().out
    assert rc == 0
    assert seed_fixed.read_bytes() == before
    assert sorted(os.listdir(seed_fixed.parent)) == ["job.slurm"]
    assert f"--- a/{seed_fixed}" in out and "+srun python run_training_dense.py" in out
    assert "dry run" in out


def test_apply_safe_only_keeps_resources(seed_fixed, capsys):
    rc, rep = report(capsys, "--sbatch", str(seed_fixed), "--apply")
    # written, but GD-SLURM-005's fail stays (its fix is unsafe): exit 1, as `ruff check --fix` with a rest
    assert rc == 1 and any(r["id"] == "GD-SLURM-005" and r["severity"] == "fail" for r in rep["remaining"])
    text = seed_fixed.read_text()
    # The safe fix drops the CUDA_VISIBLE_DEVICES export (it named exactly the 8 GPUs requested) ...
    assert "\nexport CUDA_VISIBLE_DEVICES" not in text and "# Make all GPUs visible" in text
    # ... and nothing that changes the request or the launch topology.
    for kept in (
        "#SBATCH --ntasks=1",
        "#SBATCH --cpus-per-task=128",
        "#SBATCH --gres=gpu:8",
        "\npython run_training_dense.py",
    ):
        assert kept in text
    assert {u["id"] for u in rep["unsafe_available"]} >= {"GD-SLURM-005"}
    assert rep["mode"] == "apply" and rep["files"][0]["written"]


def test_apply_unsafe_then_second_apply_is_a_noop_and_backup_restores(seed_fixed, capsys):
    original = seed_fixed.read_bytes()
    os.chmod(seed_fixed, 0o640)
    rc, rep = report(capsys, "--sbatch", str(seed_fixed), "--apply", "--unsafe-fixes")
    assert rc == 0
    fixed = seed_fixed.read_bytes()
    assert fixed != original
    backup = Path(rep["files"][0]["backup"])
    assert backup == seed_fixed.with_name("job.slurm.gpudoctor.bak")
    assert backup.read_bytes() == original
    assert os.stat(seed_fixed).st_mode & 0o7777 == 0o640
    text = fixed.decode()
    assert "#SBATCH --ntasks-per-node=8" in text and "#SBATCH --cpus-per-task=16" in text
    assert "srun python run_training_dense.py \\\n    agent=hydra_mdp_v8192_w_ep" in text
    # every comment line of the original is still there (removed directives keep theirs, marked)
    for line in original.decode().splitlines():
        if line.startswith("# "):
            assert line in text
    assert "# Launch only 1 process" in text and "# Make all GPUs visible" in text

    rc, rep2 = report(capsys, "--sbatch", str(seed_fixed), "--apply", "--unsafe-fixes")
    assert rc == 0 and rep2["files"] == [] and seed_fixed.read_bytes() == fixed
    assert sorted(os.listdir(seed_fixed.parent)) == ["job.slurm", "job.slurm.gpudoctor.bak"]

    # check on the fixed script: no fail and no warn from the SLURM checks
    assert (
        main(
            [
                "check",
                "--snapshot",
                SNAPSHOT,
                "--launcher",
                "lightning",
                "--sbatch",
                str(seed_fixed),
                "--select",
                "slurm",
                "--json",
            ]
        )
        == 0
    )
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert [f["id"] for f in findings if f["severity"] in ("warn", "fail", "error")] == []

    shutil.move(backup, seed_fixed)
    assert seed_fixed.read_bytes() == original


def test_seed_broken_gets_one_gpu_per_task(seed_broken, capsys):
    rc, rep = report(capsys, "--sbatch", str(seed_broken), "--apply", "--unsafe-fixes")
    text = seed_broken.read_text()
    assert "#SBATCH --gres=gpu:h200:8" in text and "#SBATCH --ntasks-per-node=8" in text
    fixed = {f["id"] for f in rep["fixed"]}
    assert {"GD-SLURM-002", "GD-SLURM-005"} <= fixed
    assert not [r for r in rep["remaining"] if r["id"].startswith("GD-SLURM") and r["severity"] in ("warn", "fail")]


def test_diff_exit_code_is_a_ci_gate(seed_fixed, capsys):
    assert fix("--sbatch", str(seed_fixed), "--diff") == 1
    assert fix("--sbatch", str(seed_fixed), "--apply") == 1  # written; GD-SLURM-005's fail remains (unsafe fix)
    capsys.readouterr()
    assert fix("--sbatch", str(seed_fixed), "--diff") == 0


def test_json_matches_its_schema(seed_fixed, capsys):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text())
    for args in (("--sbatch", str(seed_fixed)), ("--sbatch", str(seed_fixed), "--unsafe-fixes", "--apply")):
        _, rep = report(capsys, *args)
        jsonschema.validate(rep, schema)
        assert rep["schema"] == "gpudoctor.fix/1"


@pytest.mark.parametrize(
    "content, why",
    [
        (b"", "empty"),
        (b"#!/bin/bash\n#SBATCH --ntasks=abc\npython train.py\n", "ntasks"),
    ],
)
def test_malformed_script_is_exit_2_and_untouched(tmp_path, capsys, content, why):
    p = tmp_path / "bad.slurm"
    p.write_bytes(content)
    assert fix("--sbatch", str(p), "--apply", "--unsafe-fixes") == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and why in err
    assert p.read_bytes() == content
    assert os.listdir(tmp_path) == ["bad.slurm"]


def test_dos_line_breaks_are_converted_with_a_backup_then_the_rest_is_fixed(tmp_path, capsys):
    """sbatch 22.05 refuses the file ("Batch script contains DOS line breaks (\\r\\n)"): the conversion is a fix."""
    p = tmp_path / "job.slurm"
    original = b"#!/bin/bash\r\n#SBATCH --gres=gpu:1\r\nexport PYTORCH_CUDA_ALLOC_CONF=expandable_segments:true\r\n"
    original += b"python train.py\r\n"
    p.write_bytes(original)
    assert fix("--sbatch", str(p)) == 1  # the plan: nothing written
    assert "4 DOS line break(s)" in capsys.readouterr().err and p.read_bytes() == original
    assert fix("--sbatch", str(p), "--apply") == 0
    assert "converted 4 DOS line break(s)" in capsys.readouterr().err
    assert (tmp_path / "job.slurm.gpudoctor.bak").read_bytes() == original
    text = p.read_text()
    assert "\r" not in text and "expandable_segments:True" in text  # then judged and fixed as usual
    assert fix("--sbatch", str(p), "--apply") == 0  # a second --apply changes nothing
    assert sorted(os.listdir(tmp_path)) == ["job.slurm", "job.slurm.gpudoctor.bak", "job.slurm.gpudoctor.bak.1"]


def test_broken_yaml_config_is_exit_2_and_untouched(tmp_path, seed_fixed, capsys):
    cfg = tmp_path / "train.yaml"
    cfg.write_bytes(b"dataloader:\n  num_workers: [1, 2\n")
    assert fix("--sbatch", str(seed_fixed), "--config", str(cfg), "--apply") == 2
    assert "broken YAML" in capsys.readouterr().err
    assert cfg.read_bytes() == b"dataloader:\n  num_workers: [1, 2\n"


def test_symlink_in_its_own_directory_edits_the_target(tmp_path, capsys):
    real = tmp_path / "real.slurm"
    shutil.copyfile(SEED_FIXED, real)
    link = tmp_path / "job.slurm"
    link.symlink_to("real.slurm")
    assert fix("--sbatch", str(link), "--apply") == 1  # written; the unsafe-only GD-SLURM-005 fail remains
    assert link.is_symlink() and os.readlink(link) == "real.slurm"
    assert "\nexport CUDA_VISIBLE_DEVICES" not in real.read_text()
    assert (tmp_path / "real.slurm.gpudoctor.bak").read_bytes() == SEED_FIXED.read_bytes()


def test_symlink_out_of_its_directory_is_refused(tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    real = elsewhere / "real.slurm"
    shutil.copyfile(SEED_FIXED, real)
    here = tmp_path / "jobs"
    here.mkdir()
    (here / "job.slurm").symlink_to(real)
    assert fix("--sbatch", str(here / "job.slurm"), "--apply") == 2
    assert "outside its own directory" in capsys.readouterr().err
    assert real.read_bytes() == SEED_FIXED.read_bytes()
    assert os.listdir(elsewhere) == ["real.slurm"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_directory_is_refused(tmp_path, seed_fixed, capsys):
    os.chmod(tmp_path, 0o555)
    try:
        assert fix("--sbatch", str(seed_fixed), "--apply") == 2
    finally:
        os.chmod(tmp_path, 0o755)
    assert seed_fixed.read_bytes() == SEED_FIXED.read_bytes()


def test_file_changed_between_plan_and_write_is_not_overwritten(tmp_path):
    from gpudoctor.fixes.apply import Planned, WriteRefused, write_all

    p = tmp_path / "job.slurm"
    p.write_text("#!/bin/bash\npython a.py\n")
    planned = Planned(str(p), p.read_bytes(), "#!/bin/bash\nsrun python a.py\n")
    p.write_text("#!/bin/bash\npython b.py  # the user edited it meanwhile\n")
    with pytest.raises(WriteRefused, match="changed since"):
        write_all([planned])
    assert p.read_text() == "#!/bin/bash\npython b.py  # the user edited it meanwhile\n"
    assert os.listdir(tmp_path) == ["job.slurm"]


def test_backup_never_overwrites_an_earlier_one(tmp_path):
    from gpudoctor.fixes.apply import Planned, write_all

    p = tmp_path / "job.slurm"
    p.write_text("one\n")
    (tmp_path / "job.slurm.gpudoctor.bak").write_text("older\n")
    backups = write_all([Planned(str(p), b"one\n", "two\n")])
    assert backups[str(p)].endswith("job.slurm.gpudoctor.bak.1")
    assert (tmp_path / "job.slurm.gpudoctor.bak").read_text() == "older\n"
    assert (tmp_path / "job.slurm.gpudoctor.bak.1").read_text() == "one\n" and p.read_text() == "two\n"


def test_shell_lines_fix_the_environment_they_judge(tmp_path):
    """eval "$(gpudoctor fix --shell)" in a real bash, then check the environment that bash is left with."""
    wrong = dict(PYTORCH_CUDA_ALLOC_CONF="expandable_segments:true", NCCL_DEBUG="INFO", CUDA_LAUNCH_BLOCKING="1")
    before = run_gpudoctor_here("check", "--select", "allocator,nccl", "--json", env=wrong)
    bad_before = {f["id"] for f in json.loads(before.stdout)["findings"] if f["severity"] in ("warn", "fail", "info")}
    assert {"GD-ALLOC-001", "GD-NCCL-005"} <= bad_before
    lines = run_gpudoctor_here("fix", "--select", "allocator,nccl", "--shell", env=wrong, cwd=tmp_path).stdout
    script = 'eval "$1" && echo "NCCL_DEBUG=$NCCL_DEBUG" && env -0'
    r = subprocess.run(
        ["bash", "-c", script, "bash", lines], env=clean_env(wrong), capture_output=True, text=True, timeout=120
    )
    assert r.stdout.startswith("NCCL_DEBUG=INFO\n"), r.stdout + r.stderr  # a debugging switch is the user's (#38)
    fixed = dict(v.split("=", 1) for v in r.stdout.split("\n", 1)[1].split("\0") if v)
    after = run_gpudoctor_here("check", "--select", "allocator,nccl", "--json", env=fixed, cwd=tmp_path)
    findings = json.loads(after.stdout)["findings"]
    assert [f["id"] for f in findings if f["severity"] in ("warn", "fail")] == []
    assert os.listdir(tmp_path) == []  # nothing written: no rc file, no env file


def test_env_file_is_written_and_sourceable(tmp_path):
    wrong = {"NCCL_DEBUG": "INFO", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:true"}
    env = clean_env(wrong)
    target = tmp_path / "gpudoctor.env"
    r = run_gpudoctor_here("fix", "--select", "allocator,nccl", "--env-file", str(target), env=wrong)
    assert r.returncode == 0, r.stderr
    written = target.read_text()
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in written
    assert "NCCL_DEBUG" not in written  # NCCL_DEBUG=INFO is a debugging switch: a note, never rewritten (#38)
    r = subprocess.run(
        ["bash", "-c", f"source {target} && echo $PYTORCH_CUDA_ALLOC_CONF $NCCL_DEBUG"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.stdout.strip() == "expandable_segments:True INFO"


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_owner_and_mode_are_kept(seed_fixed, capsys):
    os.chown(seed_fixed, 65534, 65534)
    os.chmod(seed_fixed, 0o604)
    assert fix("--sbatch", str(seed_fixed), "--apply") == 1  # written; GD-SLURM-005's fail remains
    st = os.stat(seed_fixed)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (65534, 65534, 0o604)
    backup = os.stat(seed_fixed.with_name("job.slurm.gpudoctor.bak"))
    assert (backup.st_uid, backup.st_mode & 0o7777) == (65534, 0o604)
    assert "\nexport CUDA_VISIBLE_DEVICES" not in seed_fixed.read_text()


@pytest.mark.parametrize("option", ["--sbatch", "--config"])
def test_fifo_input_is_refused_at_once(tmp_path, option):
    fifo = tmp_path / "job.fifo"
    os.mkfifo(fifo)
    cmd = [sys.executable, "-m", "gpudoctor", "fix", "--snapshot", SNAPSHOT, option, str(fifo), "--apply"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and "not a regular file" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert os.listdir(tmp_path) == ["job.fifo"]


def test_before_submission_this_hosts_driver_is_not_the_jobs_to_fix(seed_fixed, capsys):
    # The recorded machine has no NVIDIA driver: a login node. check keeps its driver out of the
    # job's verdict, so fix must not plan a driver install for it either.
    rc, out = report(capsys, "--sbatch", str(seed_fixed))
    assert rc == 0
    manual = {m["id"] for m in out["manual"]}
    assert not manual & {"GD-DRV-001", "GD-CUDA-002"}
    assert {f["id"] for f in out["unsafe_available"]} >= {"GD-SLURM-005"}


def test_validate_before_submission_runs_nothing_and_says_where_to_run(seed_fixed, capsys):
    rc, out = report(capsys, "--sbatch", str(seed_fixed), "--validate")
    assert rc == 0
    v = out["validation"]
    assert v["ran"] is False and v["ok"] is None and "srun" in v["command"]


@pytest.mark.world
def test_validate_runs_a_real_smoke_with_the_fixed_environment(tmp_path):
    # This machine is the target (no script): the smoke run (gloo on CPU processes) carries the
    # planned environment changes; a bad allocator setting in the environment is fixed first.
    env = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    r = run_gpudoctor_here("fix", "--expect-gpus", "0", "--validate", "--json", env=env)
    out = json.loads(r.stdout)
    assert {"name": "PYTORCH_NO_CUDA_MEMORY_CACHING", "value": None, "action": "unset"} in out["env"]
    v = out["validation"]
    assert v["ran"] is True and v["ok"] is True and v["summary"].startswith("smoke passed"), v
    assert r.returncode == 0


def test_apply_repairs_a_stray_bang_directive_and_the_rendezvous_port(tmp_path, capsys):
    """A safe plan on a real pattern: `!#SBATCH --signal` made a directive, a one-node c10d endpoint freed."""
    p = tmp_path / "job.slurm"
    p.write_text(
        "#!/bin/bash\n#SBATCH --gres=gpu:2\n!#SBATCH --signal=SIGUSR1@90\n"
        "torchrun --nproc_per_node=2 --rdzv_backend=c10d --rdzv_endpoint=localhost:6000 --rdzv_id=100 t.py\n"
    )
    rc = main(["fix", "--snapshot", SNAPSHOT, "--sbatch", str(p), "--apply", "--select", "GD-SLURM-025,GD-SLURM-026"])
    capsys.readouterr()
    assert rc == 0
    assert p.read_text() == (
        "#!/bin/bash\n#SBATCH --gres=gpu:2\n#SBATCH --signal=SIGUSR1@90\n"
        "torchrun --nproc_per_node=2 --rdzv_backend=c10d --rdzv_endpoint=localhost:0 --rdzv_id=100 t.py\n"
    )


def test_apply_never_reverses_a_debugging_switch(tmp_path, capsys):
    """Issue 38: `export NCCL_DEBUG=INFO` in a script whose author debugs NCCL is a note with the command to
    lower it, never a safe edit that `fix --apply` writes (it once became WARN)."""
    script = tmp_path / "job.slurm"
    script.write_text(
        "#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:1\n"
        "export NCCL_DEBUG=INFO\nexport NCCL_DEBUG_SUBSYS=INIT,NET\nsrun python train.py\n"
    )
    before = script.read_text()
    fix("--sbatch", str(script), "--apply", "--unsafe-fixes")
    assert script.read_text() == before
    r = run_gpudoctor_here("check", "--sbatch", str(script), "-v")
    assert "export NCCL_DEBUG=WARN" in r.stdout and "GD-NCCL-005" in r.stdout


def test_the_plan_never_starts_with_a_blank_line_and_points_up_to_its_manual_steps(tmp_path, capsys):
    good = tmp_path / "good.slurm"
    good.write_text("#!/bin/bash\n#SBATCH --gres=gpu:1\nsrun python train.py\n")
    fix("--sbatch", str(good))
    assert capsys.readouterr().out.startswith("gpudoctor fix: ")
    noisy = tmp_path / "noisy.slurm"
    noisy.write_text("#!/bin/bash\n#SBATCH --gres=gpu:1\nexport NCCL_DEBUG=INFO\nsrun python train.py\n")
    fix("--sbatch", str(noisy))
    out = capsys.readouterr().out
    assert not out.startswith("\n") and out.index("Manual steps") < out.index("Remaining")
    assert "a manual step (listed under Manual steps)" in out and "see below" not in out
