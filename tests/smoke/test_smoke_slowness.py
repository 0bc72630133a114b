"""Real slowness, named: smoke runs across "nodes" in network namespaces (tests/smoke/networld.py), one with a
rate-limited link (tc tbf) and one whose rank runs under a CPU quota (a cgroup), and a healthy world of the same
shape that must name nobody. torchrun agents, one per node, c10d rendezvous on node 1, gloo over the veths.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import jsonschema
import pytest

from tests.cliutil import clean_env
from tests.smoke.networld import NetWorld, usable
from tests.smoke.test_smoke_nodes import SCHEMA, cpu_smoke_agent

pytestmark = [
    pytest.mark.ddp,
    pytest.mark.skipif(usable() is not None, reason=str(usable())),
    pytest.mark.xdist_group("multi-node-worlds"),  # one world at a time (pyproject.toml: --dist loadgroup)
]
PORT = 29400


def run_world(
    world: NetWorld, *smoke_args: str, timeout: float = 200, throttle: int | None = None, per_node: int = 1
) -> dict:
    """One torchrun agent per node; returns the report the coordinating rank printed. throttle: the node whose
    quota starts once its rank is connected."""
    torchrun = shutil.which("torchrun") or pytest.skip("torchrun not on PATH")
    env = clean_env()
    agents = [
        world.popen(
            i,
            cpu_smoke_agent(torchrun, world.n, per_node, f"{world.address(0)}:{PORT}", world.prefix, *smoke_args),
            env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(world.n)
    ]
    if throttle is not None:
        world.throttle_once_connected(throttle, "gpudoctor")
    outs = [a.communicate(timeout=timeout) for a in agents]
    reports = [json.loads(out) for out, _ in outs if out.strip()]
    assert len(reports) == 1, [err[-1500:] for _, err in outs]
    jsonschema.validate(reports[0], SCHEMA)
    return reports[0]


def by_id(rep: dict) -> dict:
    return {f["id"]: f for f in rep["findings"]}


def test_a_slow_link_is_named_by_its_node_with_the_exclude_line():
    # node 3's link runs at 200 Mbit/s both ways (25 MB/s, a fortieth of a veth here); the others' are unlimited
    with NetWorld(4, slow_mbit={2: 200}) as world:
        rep = run_world(world, "--steps", "10")
        found = by_id(rep)
        assert found["GD-SMOKE-018"]["severity"] == "warn", found["GD-SMOKE-018"]["message"]
        assert found["GD-SMOKE-018"]["evidence"]["slow_nodes"] == [world.host(2)]
        assert f"node {world.host(2)} is slow with every partner" in found["GD-SMOKE-018"]["message"]
        assert rep["exclude"]["sbatch"] == f"--exclude={world.host(2)}"
        assert rep["exclude"]["keep_hosts"] == [world.host(i) for i in (0, 1, 3)]
    assert world.leftovers() == []


def test_a_rank_slowed_by_a_cpu_quota_is_named_with_its_host_and_the_reason():
    # node 2's rank gets a tenth of a CPU from its cgroup, from the moment it reaches its rendezvous on
    with NetWorld(4, cpu_quota={1: 0.1}, late_quota=True) as world:
        rep = run_world(world, "--steps", "10", throttle=1)
        found = by_id(rep)
        naming = [found[i] for i in ("GD-SMOKE-010", "GD-SMOKE-016") if found[i]["severity"] == "warn"]
        figures = [(r["rank"], r["compute_tokens_per_s"], r["matmul_tflops"], r["condition"]) for r in rep["ranks"]]
        assert naming, figures
        for f in naming:  # its own compute, its matmuls and memory copy: whichever fell short names it
            assert f["evidence"]["ranks"] == [1] and f"rank 1 on {world.host(1)}" in f["message"]
            assert "its cgroup's CPU quota is 0.1 CPU" in f["message"]
        assert rep["exclude"]["sbatch"] == f"--exclude={world.host(1)}"
        assert rep["exclude"]["keep_hosts"] == [world.host(i) for i in (0, 2, 3)]
    assert world.leftovers() == []


def test_a_healthy_world_names_nobody():
    # another shape: 3 nodes of 2 ranks, unpinned (every node sees both CPUs, as nodes sharing a host do)
    with NetWorld(3, pin_cpus=False) as world:
        rep = run_world(world, "--steps", "10", per_node=2)
        found = by_id(rep)
        assert rep["exclude"] is None, [(f["id"], f["message"]) for f in rep["findings"] if f["severity"] == "warn"]
        assert found["GD-SMOKE-018"]["severity"] == "pass" and len(rep["links"]["pairs"]) == 3
        assert {r["host"] for r in rep["ranks"]} == {world.host(i) for i in range(3)} and len(rep["ranks"]) == 6
    assert world.leftovers() == []
