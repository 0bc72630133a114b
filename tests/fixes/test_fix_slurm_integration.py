"""The seed's scripts, fixed by `gpudoctor fix --apply --unsafe-fixes`, then run for real with `sbatch --wait`.

The single-node SLURM of tests/slurmcluster.py (8 fake h200 GPUs in gres.conf) runs the fixed
script unchanged except for the program it starts: `run_training_dense.py` is a stand-in written
next to the script that records what each rank of a Lightning DDP job would use -- SLURM_PROCID
(global rank), SLURM_LOCALID (local rank), SLURM_NTASKS (Lightning's world size under SLURM) and
CUDA_VISIBLE_DEVICES, from which the GPU it selects is visible[local rank].
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cliutil import run_gpudoctor

pytestmark = pytest.mark.slurm

SCRIPTS = Path(__file__).parents[1] / "fixtures" / "sbatch"
GD = [sys.executable, "-m", "gpudoctor"]

STAND_IN = """
import json, os, sys
env = os.environ
visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
local = int(env.get("SLURM_LOCALID", "0"))
rank = {
    "procid": env.get("SLURM_PROCID"),
    "localid": local,
    "world_size": int(env.get("SLURM_NTASKS", "1")),
    "visible": visible,
    "device": visible[local] if local < len(visible) else None,  # what cuda:LOCAL_RANK selects
    "cpus_per_task": env.get("SLURM_CPUS_PER_TASK"),
    "args": sys.argv[1:],
}
with open(f"rank-{env.get('SLURM_PROCID', 'x')}.json", "w") as fh:
    json.dump(rank, fh)
"""


def _gd(*args: str, cluster, cwd: Path) -> subprocess.CompletedProcess:
    """gpudoctor before submission to the test cluster: its preflight asks that cluster, no other."""
    return run_gpudoctor(*args, cluster=str(cluster.conf), timeout=300, cwd=cwd)


@pytest.mark.parametrize(
    "seed, cpus",
    [
        ("seed-broken-gres1-ntasks8.slurm", "16"),
        ("seed-fixed-ntasks1-lightning.slurm", "16"),  # 1 task x 128 CPUs becomes 8 x 16
        # as the guide prints them: `arg \    # comment` cut the launch line short (GD-SLURM-013)
        ("seed-guide-wrong-approach.slurm", None),
        ("seed-guide-correct-approach.slurm", "16"),
    ],
)
def test_fixed_seed_script_starts_one_rank_per_gpu(slurm_cluster, tmp_path, seed, cpus):
    job = tmp_path / "job.slurm"
    shutil.copyfile(SCRIPTS / seed, job)
    (tmp_path / "run_training_dense.py").write_text(STAND_IN)
    (tmp_path / "logs").mkdir()  # the broken seed writes --output=logs/train_%j.out

    r = _gd(
        "fix",
        "--sbatch",
        str(job),
        "--launcher",
        "lightning",
        "--apply",
        "--unsafe-fixes",
        cluster=slurm_cluster,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    fixed = job.read_text()
    assert (tmp_path / "job.slurm.gpudoctor.bak").read_bytes() == (SCRIPTS / seed).read_bytes()
    assert "run_training_dense.py \\\n    agent=hydra_mdp_v8192_w_ep" in fixed  # the user's launch command is kept

    check = _gd(
        "check",
        "--sbatch",
        str(job),
        "--launcher",
        "lightning",
        "--select",
        "slurm",
        "--json",
        cluster=slurm_cluster,
        cwd=tmp_path,
    )
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr
    fails = [f["id"] for f in json.loads(check.stdout)["findings"] if f["severity"] == "fail"]
    assert fails == []

    # the fixed script as written, submitted the way a user or CI does (`python` is the test interpreter)
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    run = slurm_cluster.sbatch_wait(job, env=env, cwd=tmp_path, real_wait=True, timeout=240)
    assert run.returncode == 0, (run.stdout, run.stderr)
    ranks = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank-*.json"))]
    gres = slurm_cluster.gpus
    assert len(ranks) == gres == 8, fixed
    assert sorted(int(r["procid"]) for r in ranks) == list(range(8))
    assert {r["world_size"] for r in ranks} == {8}
    devices = [r["device"] for r in ranks]
    assert None not in devices and len(set(devices)) == 8  # each rank on a GPU of its own
    assert {r["cpus_per_task"] for r in ranks} == {cpus}
    for r in ranks:  # every argument of the launch line reaches the program
        assert r["args"] == [
            "agent=hydra_mdp_v8192_w_ep",
            "trainer.params.accelerator=gpu",
            "trainer.params.num_nodes=1",
            "dataloader.params.batch_size=22",
        ]

    again = _gd(
        "fix",
        "--sbatch",
        str(job),
        "--launcher",
        "lightning",
        "--apply",
        "--unsafe-fixes",
        "--json",
        cluster=slurm_cluster,
        cwd=tmp_path,
    )
    assert again.returncode == 0 and json.loads(again.stdout)["files"] == []  # a second --apply changes nothing
    assert job.read_text() == fixed


def test_unfixed_seed_script_puts_every_rank_on_one_gpu(slurm_cluster, tmp_path):
    """The control: the same stand-in under the seed's broken script as written -- what the fix prevents."""
    job = tmp_path / "job.slurm"
    shutil.copyfile(SCRIPTS / "seed-broken-gres1-ntasks8.slurm", job)
    (tmp_path / "run_training_dense.py").write_text(STAND_IN)
    (tmp_path / "logs").mkdir()
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    run = slurm_cluster.sbatch_wait(job, env=env, cwd=tmp_path, timeout=240)
    assert run.returncode == 0, (run.stdout, run.stderr)
    ranks = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank-*.json"))]
    assert len(ranks) == 8
    assert {tuple(r["visible"]) for r in ranks} == {("0",)}  # one GPU for eight ranks
    assert sum(r["device"] is not None for r in ranks) == 1  # cuda:LOCAL_RANK exists for local rank 0 only
