"""`gpudoctor diagnose` on failures produced now, for real: gloo ranks under torchrun, a DataLoader in a tiny
/dev/shm, jobs of the test SLURM (tests/slurmcluster.py) read back by `--job`. These are the worlds the logs in
tests/fixtures/logs/real/ came from (README there); each takes more than a few seconds: the world tier."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cliutil import clean_env, run_gpudoctor

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]

pytestmark = pytest.mark.world


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(tmp_path: Path, scenario: str, nproc: int, env: dict | None = None, port: int | None = None) -> Path:
    pytest.importorskip("torch")
    log = tmp_path / f"{scenario}.log"
    cmd = [*TORCHRUN, f"--nproc_per_node={nproc}", f"--master_port={port or _free_port()}"]
    with open(log, "w") as out:
        subprocess.run(
            [*cmd, "-m", "tests.diagnose.programs", scenario],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=clean_env({"T": "15", **(env or {})}),
            timeout=300,
        )
    return log


def _first(*args: str) -> tuple[dict, list[dict]]:
    r = run_gpudoctor("diagnose", "--json", *args)
    assert r.returncode in (0, 1), r.stderr
    findings = json.loads(r.stdout)["findings"]
    return findings[0], findings[1:]


@pytest.mark.ddp
def test_a_rank_that_raises_first_is_named_and_the_others_followed(tmp_path):
    first, rest = _first(str(_torchrun(tmp_path, "raises_first", 3)))
    assert first["id"] == "GD-DIAG-001" and first["evidence"]["rank"] == 1
    assert "ValueError: bad batch shape on rank 1" in first["message"]
    assert any(f["id"] == "GD-DIAG-049" and f["message"].startswith("followed") for f in rest)


@pytest.mark.ddp
def test_ddp_unused_parameters(tmp_path):
    first, _ = _first(str(_torchrun(tmp_path, "unused_parameters", 2)))
    assert first["id"] == "GD-DIAG-032" and first["severity"] == "fail"


@pytest.mark.ddp
def test_a_collective_mismatch_names_itself_with_detail_and_is_a_hang_without(tmp_path):
    first, _ = _first(str(_torchrun(tmp_path, "collective_mismatch", 2, {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})))
    assert first["id"] == "GD-DIAG-034"
    first, _ = _first(str(_torchrun(tmp_path, "collective_mismatch", 2)))
    assert first["id"] == "GD-DIAG-001" and "TORCH_DISTRIBUTED_DEBUG=DETAIL" in first["fix"]["title"]


@pytest.mark.ddp
def test_two_torchruns_on_one_port(tmp_path):
    pytest.importorskip("torch")
    port = _free_port()
    holder = subprocess.Popen(
        [*TORCHRUN, "--nproc_per_node=1", f"--master_port={port}", "-m", "tests.diagnose.programs", "sleep_then_ok"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
        env=clean_env({"HOLD": "60"}),
    )
    try:
        import socket
        import time

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the first launcher's store listens on the port
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.5)
        first, _ = _first(str(_torchrun(tmp_path, "sleep_then_ok", 1, port=port)))
        assert first["id"] == "GD-DIAG-007"
    finally:
        holder.terminate()
        holder.wait(timeout=60)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="a private /dev/shm needs root")
def test_a_dataloader_in_a_tiny_dev_shm(tmp_path):
    pytest.importorskip("torch")
    log = tmp_path / "shm.log"
    script = (
        f"mount -t tmpfs -o size=8m tmpfs /dev/shm && exec {sys.executable} -m tests.diagnose.programs loader_bus_error"
    )
    with open(log, "w") as out:
        subprocess.run(
            ["unshare", "-m", "bash", "-c", script], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, timeout=300
        )
    first, _ = _first(str(log))
    assert first["id"] == "GD-DIAG-026"


# ---------------------------------------------------------------- the test SLURM


def _job(cluster, tmp_path: Path, name: str, body: str, directives: str = "") -> tuple[str, Path]:
    out = tmp_path / f"{name}.out"
    script = tmp_path / f"{name}.slurm"
    script.write_text(f"#!/bin/bash\n#SBATCH --output={out}\n{directives}{body}\n")
    r = cluster.sbatch_wait(script, timeout=400)
    return r.stdout.strip(), out


@pytest.mark.slurm
def test_a_task_that_exits_1_under_srun_read_back_by_job_id(slurm_cluster, tmp_path):
    body = (
        'srun --label bash -c \'if [ "$SLURM_PROCID" = 1 ]; then echo "ValueError: bad shard 7 on rank '
        "$SLURM_PROCID\" >&2; exit 1; fi; sleep 2'"
    )
    job, out = _job(slurm_cluster, tmp_path, "task_exit", body, "#SBATCH --ntasks=2\n")
    r = run_gpudoctor("diagnose", "--json", "--job", job, cluster=str(slurm_cluster.conf))
    assert r.returncode == 0, r.stderr
    findings = json.loads(r.stdout)["findings"]
    assert findings[0]["evidence"]["task"] == 1 and "ValueError: bad shard 7" in findings[0]["message"]
    assert findings[0]["evidence"]["line"] == f"{out}:1"
    assert any(f["id"] == "GD-DIAG-052" for f in findings)  # srun's task line: what followed
    assert any(
        f["id"] == "GD-DIAG-066" and f["message"].startswith(f"job {job}: FAILED, exit code 1:0") for f in findings
    )


@pytest.mark.slurm
def test_a_step_larger_than_the_job(slurm_cluster, tmp_path):
    _, out = _job(slurm_cluster, tmp_path, "step", "srun --ntasks=300 hostname", "#SBATCH --ntasks=1\n")
    first, _ = _first(str(out))
    assert first["id"] == "GD-DIAG-040"


@pytest.mark.slurm
def test_a_step_asking_for_gres_the_job_lacks(slurm_cluster, tmp_path):
    _, out = _job(slurm_cluster, tmp_path, "gres", "srun --gres=gpu:a100:1 hostname", "#SBATCH --ntasks=1\n")
    first, _ = _first(str(out))
    assert first["id"] == "GD-DIAG-041"


@pytest.mark.slurm
def test_a_job_killed_at_its_time_limit(slurm_cluster, tmp_path):
    """SLURM checks time limits about every 30 s: this job runs one to two minutes."""
    _, out = _job(slurm_cluster, tmp_path, "limit", "echo start\nsrun sleep 300", "#SBATCH --time=1\n")
    first, _ = _first(str(out))
    assert first["id"] == "GD-DIAG-039"
