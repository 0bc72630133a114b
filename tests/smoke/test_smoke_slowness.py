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
from tests.smoke.test_smoke_nodes import SCHEMA

pytestmark = [pytest.mark.ddp, pytest.mark.skipif(usable() is not None, reason=str(usable()))]
PORT = 29400


def run_world(world: NetWorld, *smoke_args: str, timeout: float = 200) -> dict:
    """One torchrun agent per node; returns the report the coordinating rank printed."""
    torchrun = shutil.which("torchrun") or pytest.skip("torchrun not on PATH")
    env = clean_env()
    agents = [
        world.popen(
            i,
            [
                torchrun,
                "--nnodes",
                str(world.n),
                "--nproc-per-node",
                "1",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"{world.address(0)}:{PORT}",
                "--rdzv-id",
                world.prefix,
                "--max-restarts",
                "0",
                "-m",
                "gpudoctor",
                "smoke",
                "--device",
                "cpu",
                "--json",
                *smoke_args,
            ],
            env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(world.n)
    ]
    outs = [a.communicate(timeout=timeout) for a in agents]
    reports = [json.loads(out) for out, _ in outs if out.strip()]
    assert len(reports) == 1, [err[-1500:] for _, err in outs]
    jsonschema.validate(reports[0], SCHEMA)
    return reports[0]


def by_id(rep: dict) -> dict:
    return {f["id"]: f for f in rep["findings"]}


def test_a_slow_link_and_a_slowed_rank_are_named_with_the_exclude_line():
    # node 2: its cgroup gives it a tenth of a CPU; node 3: its link runs at 40 Mbit/s both ways
    with NetWorld(4, slow_mbit={2: 40}, cpu_quota={1: 0.1}) as world:
        rep = run_world(world, "--steps", "10")
        slow, link = world.host(1), world.host(2)
        found = by_id(rep)
        assert found["GD-SMOKE-018"]["severity"] == "warn", found["GD-SMOKE-018"]["message"]
        assert found["GD-SMOKE-018"]["evidence"]["slow_nodes"] == [link]
        straggler = found["GD-SMOKE-010"]
        assert straggler["severity"] == "warn" and straggler["evidence"]["ranks"] == [1], straggler["message"]
        assert f"rank 1 on {slow}" in straggler["message"] and "CPU quota is 0.1 CPU" in straggler["message"]
        exclude = rep["exclude"]
        assert exclude["hosts"] == sorted([slow, link]) and exclude["sbatch"] == f"--exclude={world.prefix}node[2-3]"
        assert exclude["keep_hosts"] == [world.host(0), world.host(3)]
    assert world.leftovers() == []


def test_a_healthy_world_of_the_same_shape_names_nobody():
    with NetWorld(4) as world:
        rep = run_world(world, "--steps", "10")
        found = by_id(rep)
        assert rep["exclude"] is None, [(f["id"], f["message"]) for f in rep["findings"] if f["severity"] == "warn"]
        assert found["GD-SMOKE-018"]["severity"] == "pass" and len(rep["links"]["pairs"]) == 4
        assert {r["host"] for r in rep["ranks"]} == {world.host(i) for i in range(4)}
    assert world.leftovers() == []
