"""Batch scripts as they really run: on the test SLURM's nodes (tests/slurmcluster.MultiNodeCluster), with the real
torchrun (gloo) and a stand-in program (tests/job/recorder.py) that records every process it became.

Each script of tests/job/jobscripts.SCRIPTS runs once (the worlds are heavy: a torch import per process) and its
records are compared, process by process, with what the script means, written by hand here (EXPECTED: which
node, the rank as the program reads it, the world size it reads, the GPUs it sees, the rendezvous endpoint as its
node resolves it, argv), with what the job model predicts (tests/job/modelcompare.py; UNKNOWN: what the model
does not know), and with the script's own facts (CHECKS: the worlds formed). The rest tests the cluster itself.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.job.model import JobModel, known
from tests import netnodes
from tests.job.jobscripts import SCRIPTS, Proc, observed_all
from tests.job.modelcompare import compare, model_of, split_known
from tests.job.reality import JobRun, run_job
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
    "python_m_distributed_run": [Proc(0, str(r), "2", "0,1", (0, None), ("recorder.py",)) for r in range(2)],
    "srun_3_tasks_2_nodes": [Proc(n, str(r), "3", None, None, EPOCH) for n, r in ((0, 0), (0, 1), (1, 2))],
    "srun_gpus_per_task": [Proc(0, str(r), "2", str(r), None, EPOCH) for r in range(2)],  # its own GPU each
    "torchrun_2nodes": [Proc(r // 2, str(r), "4", "0,1", (0, 29500), EPOCH) for r in range(4)],
    "torchrun_2nodes_static_bash_c": [Proc(r // 2, str(r), "4", "0,1", (0, 29500), EPOCH) for r in range(4)],
    "torchrun_2nodes_localhost": [],  # no worker starts: both rendezvous time out
    "torchrun_2nodes_own_hostname": [],  # the same: each node's torchrun hosts its own store
}


# What the model does not know for each script, field by field (its reasons are printed by the test).
UNKNOWN: dict[str, set[str]] = {
    # recorder.py reads RANK first and falls back to SLURM_PROCID; the model takes the first name it reads
    "srun_python": {"rank", "world_size"},
    "plain_python": {"rank", "world_size"},
    "srun_rank_argument": {"world_size"},
    "srun_bash_c_rank": {"world_size"},
    "srun_gpus_per_task": {"rank", "world_size"},
    "cvd_export_torchrun": set(),
    "cvd_split_by_bash": set(),
    "python_m_distributed_run": set(),
    "torchrun_2nodes": set(),
    "torchrun_2nodes_static_bash_c": set(),
    "torchrun_2nodes_localhost": {"rank", "world_size"},  # no world forms: nothing runs
    "torchrun_2nodes_own_hostname": {"rank", "world_size"},
    "torchrun_2nodes_no_nnodes": {"rank", "world_size"},  # node 2 is not admitted
}
# Scripts the model does not read to their processes, and says so (model.unknown); reality decides them.
NOT_UNDERSTOOD = {"srun_3_tasks_2_nodes"}  # SLURM's placement of 3 tasks on 2 nodes: unknown to the model


def one_world_of_four(run: JobRun, cluster, model: JobModel) -> None:
    assert run.returncode == 0, run.output[-2000:]
    worlds = run.worlds()
    assert None not in worlds and len(worlds) == 1, [r.world for r in run.records]
    (members,) = worlds.values()
    assert sorted(r.world.rank for r in members if r.world) == [0, 1, 2, 3]
    assert {r.world.size for r in members if r.world} == {4}
    assert sorted((r.node, r.get("GROUP_RANK"), r.get("LOCAL_RANK")) for r in members) == [
        (0, "0", "0"),
        (0, "0", "1"),
        (1, "1", "0"),
        (1, "1", "1"),
    ]


def each_node_meets_itself(run: JobRun, cluster, model: JobModel) -> None:
    """localhost, or $(hostname) in each task's shell: each node's torchrun hosts its own store and waits for a
    second node until its join timeout; no worker starts. The model says each node reaches itself, no world."""
    assert run.returncode != 0
    assert run.records == [], "no worker may start"
    assert run.output.count("RendezvousTimeoutError") >= 2, run.output[-2000:]  # both nodes' torchrun
    assert sorted(p.rendezvous.reaches for p in model.processes() if p.rendezvous) == [0, 0, 1, 1]
    assert not any(known(p.rank) for p in model.processes())


def node_1_alone(run: JobRun, cluster, model: JobModel) -> None:
    """Without --nnodes (1:1): node 1's torchrun completes a rendezvous of one node alone, a world of 2; node 2's
    is not admitted and fails when node 1's agent closes the store (or, timed otherwise, forms its own world of
    2). Never one world of 4. The model: node 1 ranks 0 and 1, node 2 no rank."""
    formed = {k: v for k, v in run.worlds().items() if k is not None}
    assert formed, ("node 1's torchrun forms a world of its own", run.output[-2000:])
    for members in formed.values():
        assert len({r.node for r in members}) == 1, "no world spans the two nodes"
        assert {r.world.size for r in members if r.world} == {2}, "each world is one node's (nnodes=1)"
        assert {r.get("WORLD_SIZE") for r in members} == {"2"}
    assert run.returncode != 0
    assert [p.rank for p in model.on_node(0)] == [0, 1] and not any(known(p.rank) for p in model.on_node(1))
    # the negative control: the 2-node script's model against this run disagrees, and says where
    other = model_of(run, SCRIPTS["torchrun_2nodes"].text)
    assert any("world_size: model 4, ran '2'" in line for line in compare(other, run, cluster.node_names)[0])


def rank_once_per_batch_shell(run: JobRun, cluster, model: JobModel) -> None:
    # the negative control: the model of the per-task form predicts ranks 0 and 1; this run had 0 twice
    other = model_of(run, SCRIPTS["srun_bash_c_rank"].text)
    assert any("rank: model 1, ran '0'" in line for line in compare(other, run, cluster.node_names)[0])


CHECKS: dict[str, Callable[[JobRun, Any, JobModel], None]] = {
    "torchrun_2nodes": one_world_of_four,
    "torchrun_2nodes_static_bash_c": one_world_of_four,
    "torchrun_2nodes_localhost": each_node_meets_itself,
    "torchrun_2nodes_own_hostname": each_node_meets_itself,
    "torchrun_2nodes_no_nnodes": node_1_alone,
    "srun_rank_argument": rank_once_per_batch_shell,
}


@pytest.mark.world
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_script_runs_as_it_means_and_as_the_model_says(slurm_nodes, name):
    """One job per script (a heavy world: run once, every comparison on the same records)."""
    script = SCRIPTS[name]
    run = run_job(slurm_nodes, script.text, join=script.join, join_timeout=60, timeout=240)
    names = slurm_nodes.node_names
    if name in EXPECTED:
        assert observed_all(run, names) == sorted(EXPECTED[name]), run.output[-2000:]
    model = model_of(run)
    if name in NOT_UNDERSTOOD:
        assert model.unknown, "what the model cannot place says so"
        print(f"{name}: not understood by the model: {model.unknown}; ran: {observed_all(run, names)}")
        return
    assert model.understood, model.unknown
    bad, unknown = compare(model, run, names)
    bad, known_met = split_known(bad)
    assert bad == [], (bad, run.output[-1500:])
    assert set(unknown) == UNKNOWN[name], unknown
    CHECKS.get(name, lambda *_: None)(run, slurm_nodes, model)
    print(f"{name}: unknown to the model: {unknown or 'nothing'}; known differences: {known_met or 'none'}")


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
    sleeper = None
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
        # srun, not sbatch: on a loaded machine a batch launch that times out is requeued held, never run
        sleeper = subprocess.Popen(
            ["srun", "--nodes=3", "sleep", marker],
            env=b.env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        while len(_sleepers(marker)) < 3 and time.monotonic() < deadline and sleeper.poll() is None:
            time.sleep(0.2)
        assert len(_sleepers(marker)) == 3, ("one sleep per node", sleeper.poll())
    finally:
        a.stop()
        b.stop()
        if sleeper is not None and sleeper.poll() is None:  # srun itself runs here, outside the nodes
            sleeper.kill()
            sleeper.wait(timeout=10)
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


def test_a_cluster_that_fails_to_start_says_why_and_leaves_nothing(tmp_path):
    if missing_binaries():
        pytest.skip(f"SLURM is not installed ({', '.join(missing_binaries())})")
    cluster = MultiNodeCluster(tmp_path, nodes=2, extra_conf="NoSuchParameter=1\n")
    with pytest.raises(ClusterUnavailable) as failed:
        cluster.start(timeout=30)
    if "slurmctld" not in str(failed.value):  # not root, no namespaces here: the reason is another
        pytest.skip(str(failed.value))
    assert "Unable to process configuration file" in str(failed.value)
    assert cluster.leftovers() == [] and cluster._lock is None
