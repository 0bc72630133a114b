"""Batch scripts as they really run: on the test SLURM's nodes (tests/slurmcluster.MultiNodeCluster), with the real
torchrun (gloo) and a stand-in program (tests/job/recorder.py) that records every process it became.

Each script of SCRIPTS is run once per session (the worlds are heavy: a torch import per process) and its records
are compared, process by process, with what the script means, written by hand here: which node, the rank as the
program reads it, the world size it reads, the GPUs it sees, the rendezvous endpoint (as its node resolves it) and
argv. tests/job/test_job_model_reality.py compares the same records with the job model's prediction.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests import netnodes
from tests.job.jobscripts import Proc, observed_all, ran
from tests.slurmcluster import ClusterUnavailable, MultiNodeCluster, missing_binaries

pytestmark = pytest.mark.slurm

# What each script means, by hand: the processes it starts.
EPOCH = ("recorder.py", "--epochs", "1")
EXPECTED: dict[str, list[Proc]] = {
    "srun_python": [Proc(0, str(r), "2", "0,1", None, EPOCH) for r in range(2)],
    "plain_python": [Proc(0, "0", "2", "0,1", None, EPOCH)],  # one process that reads a world of 2
    "srun_rank_argument": [Proc(0, "0", "2", None, None, ("recorder.py", "--rank=0"))] * 2,
    "srun_bash_c_rank": [Proc(0, str(r), "2", None, None, ("recorder.py", f"--rank={r}")) for r in range(2)],
    "cvd_export_torchrun": [Proc(0, str(r), "4", "0", (0, None), ("recorder.py",)) for r in range(4)],
    "cvd_split_by_bash": [Proc(0, str(r), "2", "0,", (0, None), ("recorder.py",)) for r in range(2)],
    "srun_gpus_per_task": [Proc(0, str(r), "2", str(r), None, EPOCH) for r in range(2)],  # its own GPU each
    "torchrun_2nodes": [Proc(r // 2, str(r), "4", "0,1", (0, 29500), EPOCH) for r in range(4)],
    "torchrun_2nodes_static_bash_c": [Proc(r // 2, str(r), "4", "0,1", (0, 29500), EPOCH) for r in range(4)],
    "torchrun_2nodes_localhost": [],  # no worker starts: both rendezvous time out
    "torchrun_2nodes_own_hostname": [],  # the same: each node's torchrun hosts its own store
}


@pytest.mark.world
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_processes_are_the_ones_the_script_means(slurm_nodes, name):
    run = ran(slurm_nodes, name)
    assert observed_all(run, slurm_nodes.node_names) == sorted(EXPECTED[name]), run.output[-2000:]


@pytest.mark.world
def test_two_nodes_form_one_world_of_four_with_unique_ranks(slurm_nodes):
    run = ran(slurm_nodes, "torchrun_2nodes")
    assert run.returncode == 0, run.output[-2000:]
    worlds = run.worlds()
    assert list(worlds) != [None] and None not in worlds, [r.world for r in run.records]
    (members,) = worlds.values()
    assert sorted(r.world.rank for r in members if r.world) == [0, 1, 2, 3]
    assert {r.world.size for r in members if r.world} == {4}
    assert {r.node for r in members} == {0, 1}
    assert sorted((r.node, r.get("GROUP_RANK"), r.get("LOCAL_RANK")) for r in members) == [
        (0, "0", "0"),
        (0, "0", "1"),
        (1, "1", "0"),
        (1, "1", "1"),
    ]


@pytest.mark.world
@pytest.mark.parametrize("name", ["torchrun_2nodes_localhost", "torchrun_2nodes_own_hostname"])
def test_a_rendezvous_each_node_resolves_to_itself_really_never_forms(slurm_nodes, name):
    run = ran(slurm_nodes, name)
    assert run.returncode != 0
    assert run.records == [], "no worker may start: each node waits for a second node at its own store"
    assert run.output.count("RendezvousTimeoutError") >= 2, run.output[-2000:]  # both nodes' torchrun


@pytest.mark.world
def test_two_nodes_without_nnodes_never_form_one_world(slurm_nodes):
    run = ran(slurm_nodes, "torchrun_2nodes_no_nnodes")
    formed = {k: v for k, v in run.worlds().items() if k is not None}
    assert formed, ("node 1's torchrun forms a world of its own", run.output[-2000:])
    for members in formed.values():
        assert len({r.node for r in members}) == 1, "no world spans the two nodes"
        assert {r.world.size for r in members if r.world} == {2}, "each world is one node's (nnodes=1)"
        assert {r.get("WORLD_SIZE") for r in members} == {"2"}
    assert run.returncode != 0, "node 2's torchrun loses the store node 1's held, or forms a world of 2 alone"


def test_each_node_is_its_own_host_with_its_own_gpus(slurm_nodes, tmp_path):
    """The cluster itself: srun places two tasks per node; each sees its node's name, node id and GPUs."""
    r = slurm_nodes.srun(
        [
            "--nodes=2",
            "--ntasks-per-node=2",
            "--gres=gpu:2",
            "bash",
            "-c",
            'echo "$(hostname) $SLURM_NODEID $SLURM_PROCID $CUDA_VISIBLE_DEVICES $(hostname -i 2>/dev/null)"',
        ],
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    rows = sorted(line.split() for line in r.stdout.splitlines())
    names = slurm_nodes.node_names
    assert [row[:4] for row in rows] == [
        [names[0], "0", "0", "0,1"],
        [names[0], "0", "1", "0,1"],
        [names[1], "1", "2", "0,1"],
        [names[1], "1", "3", "0,1"],
    ]
    assert {row[4] for row in rows if len(row) > 4} <= {slurm_nodes.address(0), slurm_nodes.address(1)}


def _sleepers(marker: str) -> list[int]:
    """Pids whose command line is `sleep <marker>` (srun starts it by its full path)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")[:-1] if proc.name.isdigit() else []
            if len(argv) == 2 and os.path.basename(argv[0]) == b"sleep" and argv[1] == marker.encode():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def test_two_clusters_at_once_get_their_own_subnets_and_leave_nothing(tmp_path):
    """Instances running together (xdist workers, other sessions) never share a subnet or a name; stop()
    removes the namespaces, the bridge and every process left in them, a job's still-running tasks included."""
    if missing_binaries():
        pytest.skip(f"SLURM is not installed ({', '.join(missing_binaries())})")
    a, b = MultiNodeCluster(tmp_path / "a", nodes=2), MultiNodeCluster(tmp_path / "b", nodes=3)
    marker = f"{300 + os.getpid() % 1000}"  # this test's sleeps, not another's
    try:
        a.start()
        b.start()
    except ClusterUnavailable as e:
        a.stop()
        pytest.skip(f"no multi-node SLURM cluster here: {e}")
    try:
        assert a.subnet != b.subnet and not set(a.node_names) & set(b.node_names)
        r = b.srun(["--nodes=3", "hostname"], timeout=60)
        assert sorted(r.stdout.split()) == b.node_names, r.stderr
        script = tmp_path / "sleep.sbatch"
        script.write_text(f"#!/bin/bash\n#SBATCH --nodes=3\nsrun sleep {marker}\n")
        sub = subprocess.run(["sbatch", str(script)], env=b.env(), capture_output=True, timeout=30, cwd=tmp_path)
        assert sub.returncode == 0, sub.stderr
        deadline = time.monotonic() + 60
        while len(_sleepers(marker)) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(_sleepers(marker)) == 3, "one task per node"
    finally:
        a.stop()
        b.stop()
    assert a.leftovers() == [] and b.leftovers() == []
    assert _sleepers(marker) == []


def test_where_nodes_cannot_be_made_the_reason_is_said():
    why = netnodes.usable(("ip", "no-such-tool-here"))
    assert why in ("no-such-tool-here is not installed", "needs root (network namespaces)")


def test_instances_claim_distinct_subnets_until_they_let_go():
    if shutil.which("ip") is None:
        pytest.skip("ip is not installed")
    k1, lock1 = netnodes.claim_subnet()
    try:
        k2, lock2 = netnodes.claim_subnet(first=k1, count=50)
        assert k2 != k1, "a held subnet is never handed out again"
        name = lock2.name
        lock2.close()
        with open(name) as again:
            fcntl.flock(again, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a subnet let go is free again
    finally:
        lock1.close()
