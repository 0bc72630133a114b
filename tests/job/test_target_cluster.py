"""Issue 10 on a real single-node SLURM (tests/slurmcluster.py: partition debug, one node with 8 h200 GPUs and
256 CPUs): from outside any job, `gpudoctor check --sbatch` asks the controller what the partition's nodes have
(scontrol show partition/node) and judges the script's per-node request against it (GD-SLURM-020)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.factsutil import said

pytestmark = pytest.mark.slurm

SCRIPTS = Path(__file__).parents[1] / "fixtures" / "sbatch"
GD = [sys.executable, "-m", "gpudoctor"]


def check(cluster, tmp_path: Path, script: str, *args: str) -> subprocess.CompletedProcess:
    path = tmp_path / "job.slurm"
    path.write_text(script)
    return subprocess.run(
        [*GD, "check", "--sbatch", str(path), "--select", "slurm", *args],
        capture_output=True,
        text=True,
        env=cluster.env(),
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def verdict(cluster, tmp_path: Path, script: str) -> dict:
    r = check(cluster, tmp_path, script, "--json")
    report = json.loads(r.stdout)
    return next(f for f in report["findings"] if f["id"] == "GD-SLURM-020")


def test_cluster_probe_reads_the_default_partition(slurm_cluster):
    code = "import json; from gpudoctor.probe.cluster import probe; print(json.dumps(probe()))"
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=slurm_cluster.env(), timeout=60
    )
    facts = json.loads(r.stdout)
    assert facts["available"] and facts["partition"] == "debug"
    (node,) = facts["node_types"]
    assert (node["gpus"], node["gpu_type"], node["cpus"], node["count"]) == (8, "h200", 256, 1)


def test_request_that_fits_passes_and_the_nodes_are_named(slurm_cluster, tmp_path):
    script = "#!/bin/bash\n#SBATCH -N1\n#SBATCH --ntasks-per-node=8\n#SBATCH --gres=gpu:h200:8\n#SBATCH -c 16\n"
    script += "srun --cpus-per-task=16 python t.py\n"  # SLURM 22.05's srun does not inherit -c (GD-SLURM-007)
    assert verdict(slurm_cluster, tmp_path, script)["severity"] == "pass"
    r = check(slurm_cluster, tmp_path, script)
    shown = " ".join(r.stdout.split())  # the line wrapped to the terminal, words kept
    assert r.returncode == 0 and "nodes: partition debug" in shown and "8x h200, 256 CPUs" in shown
    full = subprocess.run(
        [*GD, "check", "--sbatch", str(tmp_path / "job.slurm")],
        capture_output=True,
        text=True,
        env=slurm_cluster.env(),
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert full.returncode == 0 and len(full.stdout.splitlines()) <= 24, full.stdout  # a healthy job: one screen


def test_gpu_type_the_partition_lacks_fails(slurm_cluster, tmp_path):
    script = "#!/bin/bash\n#SBATCH -N1\n#SBATCH --ntasks-per-node=8\n#SBATCH --gres=gpu:a100:8\nsrun python t.py\n"
    f = verdict(slurm_cluster, tmp_path, script)
    assert f["severity"] == "fail" and "GPU type h200, not a100" in said(f)


def test_more_cpus_per_node_than_the_nodes_have_fails(slurm_cluster, tmp_path):
    script = (
        "#!/bin/bash\n#SBATCH -N1\n#SBATCH --ntasks-per-node=8\n#SBATCH --gres=gpu:8\n#SBATCH -c 64\nsrun python t.py\n"
    )
    f = verdict(slurm_cluster, tmp_path, script)
    assert f["severity"] == "fail" and "256 CPUs < 512" in said(f)


def test_more_nodes_than_the_partition_has_fails(slurm_cluster, tmp_path):
    script = "#!/bin/bash\n#SBATCH -N2\n#SBATCH --ntasks-per-node=8\n#SBATCH --gres=gpu:8\nsrun python t.py\n"
    f = verdict(slurm_cluster, tmp_path, script)
    assert f["severity"] == "fail" and "only 1 node(s)" in said(f)


def test_unknown_partition_fails(slurm_cluster, tmp_path):
    script = "#!/bin/bash\n#SBATCH -p nosuch\n#SBATCH --gres=gpu:1\nsrun python t.py\n"
    f = verdict(slurm_cluster, tmp_path, script)
    assert f["severity"] == "fail" and "nosuch" in said(f)


def test_seed_script_from_the_guide_fails_against_the_real_cluster(slurm_cluster, tmp_path):
    """The login-node stand-in with a real controller: the seed's "fixed" script still fails (Lightning 2.x)."""
    path = SCRIPTS / "seed-guide-correct-approach.slurm"
    r = subprocess.run(
        [*GD, "check", "--sbatch", str(path)],
        capture_output=True,
        text=True,
        env=slurm_cluster.env(),
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 1 and "GD-SLURM-005" in r.stdout and "nodes: partition debug" in r.stdout


def test_each_srun_task_labels_its_report_with_rank_and_host(slurm_cluster, tmp_path):
    r = slurm_cluster.srun(["--ntasks=2", "--gres=gpu:h200:2", *GD, "check", "--select", "slurm"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if line]
    for rank in (0, 1):
        mine = [line for line in lines if line.startswith(f"[rank {rank}/2 on ")]
        assert mine and "this task: no problems found" in mine[-1], r.stdout
    assert all(line.startswith("[rank ") for line in lines), r.stdout
