"""srun -n 4 gpudoctor check --job on the real single-node SLURM (tests/slurmcluster.py)."""

from __future__ import annotations

import shlex
import socket

import pytest

from tests.cliutil import flat

pytestmark = pytest.mark.slurm
pytest.importorskip("torch.distributed")


@pytest.mark.world
def test_srun_four_tasks_one_report_and_the_drifting_rank_named(slurm_cluster, tmp_path):
    with socket.socket() as s:  # test clusters restart job ids at 1: the derived port may be taken
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gd = " ".join(shlex.quote(a) for a in slurm_cluster.python_command())
    # task 3 alone gets another NCCL setting, the way a node-specific profile would set it
    script = (
        f'[ "$SLURM_PROCID" = 3 ] && export NCCL_IB_HCA=mlx5_9; '
        f"exec {gd} check --job --strict --timeout 30 --expect-gpus 0 --select distributed"
    )
    r = slurm_cluster.srun(
        ["--ntasks=4", f"--output={tmp_path}/task-%t.out", f"--error={tmp_path}/task-%t.err", "bash", "-c", script],
        env={"MASTER_PORT": str(port)},
        timeout=150,
    )
    outs = {t: (tmp_path / f"task-{t}.out").read_text() for t in range(4)}
    errs = {t: (tmp_path / f"task-{t}.err").read_text() for t in range(4)}
    report = outs[0]
    assert "gpudoctor check --job (srun, world size 4" in report, (outs, errs, r.stderr)
    assert "4 rank(s) on 1 node(s)" in report
    assert "(rank 3): NCCL_IB_HCA=mlx5_9 where" in report and "(ranks 0–2) has unset" in report
    assert all(outs[t] == "" for t in (1, 2, 3)), "only rank 0 prints"
    assert r.returncode == 1, "--strict: the drift's warn is the job's verdict, exit 1 (srun: the tasks' worst)"


def test_srun_agreeing_tasks_all_exit_0(slurm_cluster, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = slurm_cluster.srun(
        [
            "--ntasks=2",  # every task's exit status is the job's: two show it (each task is a torch import)
            *slurm_cluster.python_command(),
            "check",
            "--job",
            "--timeout",
            "30",
            "--expect-gpus",
            "0",
            "--select",
            "distributed",
        ],
        env={"MASTER_PORT": str(port)},
        timeout=150,
    )
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert r.stdout.count("gpudoctor check --job") == 1 and "pass on 1 of 1 node(s)" in r.stdout


@pytest.mark.world
@pytest.mark.parametrize("distribution", [None, "cyclic"])
def test_srun_a_task_that_cannot_reach_the_store_is_placed_by_the_step_layout(slurm_cluster, tmp_path, distribution):
    """Task 2 of 3 gets a MASTER_PORT nothing listens on; rank 0 names its node from srun's own variables
    (SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE, SLURM_DISTRIBUTION as this srun sets them, or
    leaves unset: block, srun's default)."""
    with socket.socket() as s, socket.socket() as r:
        s.bind(("127.0.0.1", 0))
        r.bind(("127.0.0.1", 0))
        port, refused = s.getsockname()[1], r.getsockname()[1]
    gd = " ".join(shlex.quote(a) for a in slurm_cluster.python_command())
    script = (
        f'[ "$SLURM_PROCID" = 2 ] && export MASTER_PORT={refused}; '
        f"exec {gd} check --job --timeout 10 --expect-gpus 0 --select distributed"
    )
    r = slurm_cluster.srun(
        [
            "--ntasks=3",
            *([f"--distribution={distribution}"] if distribution else []),
            f"--output={tmp_path}/task-%t.out",
            f"--error={tmp_path}/task-%t.err",
            "bash",
            "-c",
            script,
        ],
        env={"MASTER_PORT": str(port)},
        timeout=150,
    )
    outs = {t: (tmp_path / f"task-{t}.out").read_text() for t in range(3)}
    errs = {t: (tmp_path / f"task-{t}.err").read_text() for t in range(3)}
    report = flat(outs[0])
    assert "rank 2 of a world of 3 never reported within 10 s (2 arrived)" in report, (outs, errs, r.stderr)
    assert f"rank 2 on node {slurm_cluster.node}, by SLURM's {distribution or 'block'} distribution" in report, (
        outs,
        errs,
        r.stderr,
    )
    assert f"127.0.0.1:{refused}" in errs[2] and "could not reach the job's store" in errs[2]
    assert r.returncode == 1
