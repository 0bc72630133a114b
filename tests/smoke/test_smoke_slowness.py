"""Real slowness, named: smoke runs across "nodes" in network namespaces (tests/smoke/networld.py), one with a
rate-limited link (tc tbf) and one whose rank runs under a CPU quota (a cgroup), and a healthy world that must name
nobody, gloo over the veths. The healthy world runs torchrun agents, one per node, c10d rendezvous on node 1 (its
node table is torchrun's GROUP_RANK); the two slow ones start one rank per node from the environment, as a
Kubernetes PyTorchJob does (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; the store hosted by rank 0), which spares
each node a torchrun agent's torch import (3 CPU-s) and keeps the launcher out of what is timed.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time

import jsonschema
import pytest

from tests.cliutil import clean_env
from tests.smoke.networld import NetWorld, usable
from tests.smoke.test_smoke_nodes import SCHEMA, cpu_smoke_agent

pytestmark = [
    pytest.mark.ddp,
    pytest.mark.world,
    pytest.mark.skipif(usable() is not None, reason=str(usable())),
    pytest.mark.xdist_group("multi-node-worlds"),  # one world at a time (pyproject.toml: --dist loadgroup)
]
PORT = 29400


def _launch(world: NetWorld, i: int, per_node: int, smoke_args: tuple[str, ...], torchrun: bool) -> subprocess.Popen:
    """Node i's torchrun agent, or (torchrun=False, one rank per node) its rank started from the environment."""
    if torchrun:
        agent = shutil.which("torchrun") or pytest.skip("torchrun not on PATH")
        argv = cpu_smoke_agent(agent, world.n, per_node, f"{world.address(0)}:{PORT}", world.prefix, *smoke_args)
        env = clean_env()
    else:
        assert per_node == 1
        argv = [sys.executable, "-m", "gpudoctor", "smoke", "--device", "cpu", "--json", *smoke_args]
        ranks = {"RANK": i, "WORLD_SIZE": world.n, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 1, "MASTER_PORT": PORT}
        env = clean_env({**{k: str(v) for k, v in ranks.items()}, "MASTER_ADDR": world.address(0)})
    return world.popen(i, argv, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_world(
    world: NetWorld,
    *smoke_args: str,
    timeout: float = 200,
    throttle: int | None = None,
    per_node: int = 1,
    torchrun: bool = True,
) -> tuple[dict, int]:
    """One torchrun agent per node, or one rank per node started from the environment; returns the report the
    coordinating rank printed and its process's exit status. throttle: the node whose quota starts once its rank
    is connected."""
    agents = [_launch(world, i, per_node, smoke_args, torchrun) for i in range(world.n)]
    if throttle is not None:
        world.throttle_once_connected(throttle, "gpudoctor")
    outs = [a.communicate(timeout=timeout) for a in agents]
    reports = [(json.loads(out), a.returncode) for a, (out, _) in zip(agents, outs, strict=True) if out.strip()]
    assert len(reports) == 1, [err[-1500:] for _, err in outs]
    jsonschema.validate(reports[0][0], SCHEMA)
    return reports[0]


def by_id(rep: dict) -> dict:
    return {f["id"]: f for f in rep["findings"]}


def test_a_slow_link_is_named_by_its_node_with_the_exclude_line():
    # node 3's link runs at 200 Mbit/s both ways (25 MB/s, a fortieth of a veth here); the others' are unlimited.
    # Three nodes suffice: node 3 is slow with both partners, nodes 1 and 2 are fast with each other.
    with NetWorld(3, slow_mbit={2: 200}) as world:
        rep, _ = run_world(world, "--steps", "10", torchrun=False)
        found = by_id(rep)
        assert found["GD-SMOKE-018"]["severity"] == "warn", found["GD-SMOKE-018"]["message"]
        assert found["GD-SMOKE-018"]["evidence"]["slow_nodes"] == [world.host(2)]
        assert f"node {world.host(2)} is slow with every partner" in found["GD-SMOKE-018"]["message"]
        assert rep["exclude"]["sbatch"] == f"--exclude={world.host(2)}"
        assert rep["exclude"]["keep_hosts"] == [world.host(i) for i in (0, 1)]
    assert world.leftovers() == []


class OthersCpu:
    """CPU seconds the machine's other processes used while the block ran: every CPU's busy time (/proc/stat)
    less what this process and its reaped children (the world's agents and ranks) used. A timing test that
    fails while others held the CPUs could not measure; one that fails on a quiet machine found a fault."""

    def __enter__(self) -> OthersCpu:
        self.start = (_busy_seconds(), _own_seconds(), time.monotonic())
        return self

    def __exit__(self, *exc) -> None:
        busy, own, started = self.start
        self.seconds = max(0.0, (_busy_seconds() - busy) - (_own_seconds() - own))
        self.wall = time.monotonic() - started

    @property
    def cpus(self) -> float:
        """The others' average load over the block, in CPUs."""
        return self.seconds / self.wall if self.wall > 0 else 0.0


def _busy_seconds() -> float:
    fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")  # user..steal; guest is inside user


def _own_seconds() -> float:
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


# Other processes' load (in CPUs) above which a 3-node world on this machine's CPUs cannot resolve a tenth of a
# CPU against its healthy ranks: each of them then gets less than the share the test's gap assumes.
BUSY_CPUS = 0.5


def test_a_rank_slowed_by_a_cpu_quota_is_named_with_its_host_and_the_reason():
    # node 2's rank gets a tenth of a CPU from its cgroup, from the moment it reaches its rendezvous on; the
    # healthy two set the median it falls short of
    with NetWorld(3, cpu_quota={1: 0.1}, late_quota=True) as world:
        with OthersCpu() as others:
            rep, _ = run_world(world, "--steps", "10", throttle=1, torchrun=False)
        found = by_id(rep)
        naming = [found[i] for i in ("GD-SMOKE-010", "GD-SMOKE-016") if found[i]["severity"] == "warn"]
        figures = [(r["rank"], r["compute_tokens_per_s"], r["matmul_tflops"], r["condition"]) for r in rep["ranks"]]
        problems = [] if naming else ["no finding named a rank"]
        for f in naming:  # its own compute, its matmuls and memory copy: whichever fell short names it
            if f["evidence"]["ranks"] != [1] or f"rank 1 on {world.host(1)}" not in f["message"]:
                problems.append(f"{f['id']} named {f['evidence']['ranks']}: {f['message']}")
            elif "its cgroup's CPU quota is 0.1 CPU" not in f["message"]:
                problems.append(f"{f['id']} gave no quota: {f['message']}")
        if (rep["exclude"] or {}).get("keep_hosts") != [world.host(i) for i in (0, 2)]:
            problems.append(f"exclude: {rep['exclude']}")
        if problems and others.cpus > BUSY_CPUS:
            pytest.skip(
                f"could not measure: other processes used {others.cpus:.1f} CPUs on average during the run "
                f"({others.seconds:.0f} CPU-s in {others.wall:.0f} s; {problems[0]}; ranks {figures})"
            )
        assert not problems, (problems, figures, f"others used {others.cpus:.2f} CPUs")
        assert rep["exclude"]["sbatch"] == f"--exclude={world.host(1)}"
    assert world.leftovers() == []


def test_a_healthy_world_names_nobody_and_tables_its_nodes():
    # another shape: 3 nodes of 2 ranks, unpinned (every node sees both CPUs, as nodes sharing a host do). The
    # busbw floor no all-reduce here can reach is a stated failure of the run (GD-SMOKE-014), not a slowness
    # finding: it names no rank or node, so the world still names nobody. --quick, the node qualification run
    # (half-length timing windows: where noise would name a healthy node first), without torch._dynamo's import in
    # each of the 6 ranks (14 CPU-s of this test's 60); the two slow worlds above run the default DDP training.
    with NetWorld(3, pin_cpus=False) as world:
        rep, status = run_world(world, "--quick", "--min-busbw", "1000000", per_node=2)
        found = by_id(rep)
        assert rep["exclude"] is None, [(f["id"], f["message"]) for f in rep["findings"] if f["severity"] == "warn"]
        assert found["GD-SMOKE-018"]["severity"] == "pass" and len(rep["links"]["pairs"]) == 3
        assert {r["host"] for r in rep["ranks"]} == {world.host(i) for i in range(3)} and len(rep["ranks"]) == 6
        assert found["GD-SMOKE-015"]["severity"] in ("pass", "info")  # CPU ranks: timing noise is never a warning
        # the per-node table: a node is the launcher's (GROUP_RANK), each its own host's two ranks
        nodes = rep["nodes"]
        assert sorted(n["node"] for n in nodes) == [world.host(i) for i in range(3)]
        assert sorted(n["node_index"] for n in nodes) == [0, 1, 2] and all(n["node"] == n["host"] for n in nodes)
        assert sorted(r for n in nodes for r in n["ranks"]) == list(range(6)) and all(
            len(n["ranks"]) == 2 for n in nodes
        )
        # measured apart: each node's own all-reduce, and across nodes the i-th rank of every node
        assert all(n["intra_busbw_gbps"] > 0 for n in nodes)
        ar = rep["allreduce"]
        assert ar["inter_node_busbw_gbps_min"] > 0 and ar["intra_node_busbw_gbps_min"] > 0
        ith = [sorted(sorted(n["ranks"])[i] for n in nodes) for i in (0, 1)]
        assert sorted(sorted(g["ranks"]) for g in ar["inter_node_groups"]) == ith
        slow = rep["slowest_node"]  # the table's lowest row, described; not a finding, so nothing to exclude
        assert slow["node"] in {n["node"] for n in nodes} and 0 <= slow["below_median"] < 1
        floor = found["GD-SMOKE-014"]
        assert floor["severity"] == "fail" and "floor 1e+06 GB/s" in floor["message"]
        assert "ranks" not in floor["evidence"] and "slow_nodes" not in floor["evidence"]
        assert rep["floors"]["min_busbw_gbps"] == 1000000 and not rep["ok"] and status != 0
    assert world.leftovers() == []
