"""The smoke run across nodes on one host: a node is the launcher's (GROUP_RANK), so two nodes of one host are
named apart. Where network namespaces can be made (root), the per-node table, the slowest node and the busbw
floor are proved by test_smoke_slowness.py's healthy world (a host per node); here, the naming of nodes that
share a host in-process, and without namespaces the same facts from two torchrun agents on loopback."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path

import jsonschema
import pytest

from gpudoctor.sample_train.coordinator import node_layout
from gpudoctor.sample_train.judge import report
from tests.cliutil import clean_env
from tests.smoke.networld import usable

pytest.importorskip("torch.distributed")

SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "smoke.schema.json").read_text())
HOST = socket.gethostname()


def cpu_smoke_agent(torchrun: str, nodes: int, per_node: int, endpoint: str, rdzv_id: str, *smoke_args: str):
    """One node's torchrun agent of a CPU smoke run across nodes (c10d rendezvous, no restarts), JSON report."""
    return [
        torchrun,
        "--nnodes",
        str(nodes),
        "--nproc-per-node",
        str(per_node),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        rdzv_id,
        "--max-restarts",
        "0",
        "-m",
        "gpudoctor",
        "smoke",
        "--device",
        "cpu",
        "--json",
        *smoke_args,
    ]


def _rank(rank: int, node_index: int, compute_s: float) -> dict:
    return {"rank": rank, "host": "gpu-1", "node_index": node_index, "tokens_per_s": 100.0,
            "step_time_s": {"p50": 0.5}, "local_compute_s_p50": compute_s}  # fmt: skip


def test_two_nodes_of_one_host_are_named_by_their_group_rank():
    # the coordinator's layout (which ranks all-reduce inside a node, which across) and the report's table
    joins = {r: {"host": "gpu-1", "node_index": r // 2} for r in range(4)}
    assert node_layout(joins) == [[0, 1], [2, 3]]
    table = report._nodes([_rank(0, 0, 0.2), _rank(1, 0, 0.2), _rank(2, 1, 0.4), _rank(3, 1, 0.4)], 1000)
    assert [(n["node"], n["host"], n["ranks"]) for n in table["nodes"]] == [
        ("gpu-1#0", "gpu-1", [0, 1]),
        ("gpu-1#1", "gpu-1", [2, 3]),
    ]
    assert table["slowest_node"]["node"] == "gpu-1#1" and table["slowest_node"]["below_median"] > 0


@pytest.mark.world
@pytest.mark.skipif(
    usable() is None, reason="netns worlds run here: test_smoke_slowness.py's healthy world proves the node table"
)
@pytest.mark.xdist_group("multi-node-worlds")  # not beside the netns worlds (pyproject.toml: --dist loadgroup)
def test_two_nodes_per_node_table_slowest_node_and_busbw_floor(tmp_path):
    torchrun = shutil.which("torchrun") or pytest.skip("torchrun not on PATH")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = clean_env()
    agents = [
        subprocess.Popen(
            cpu_smoke_agent(torchrun, 2, 2, f"127.0.0.1:{port}", f"smoke-{port}", "--min-busbw", "1000000"),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        for _ in range(2)
    ]
    try:
        outs = [a.communicate(timeout=240) for a in agents]
    finally:
        for a in agents:  # never leave an agent behind (their workers die with them: torchrun's own handling)
            if a.poll() is None:
                a.kill()
                a.communicate()
    reports = [json.loads(out) for out, _ in outs if out.strip()]
    assert len(reports) == 1, outs
    rep = reports[0]
    jsonschema.validate(rep, SCHEMA)
    nodes = rep["nodes"]
    assert sorted(n["node"] for n in nodes) == [f"{HOST}#0", f"{HOST}#1"], "GROUP_RANK makes two nodes of one host"
    assert sorted(r for n in nodes for r in n["ranks"]) == [0, 1, 2, 3]
    # measured apart: each node's own all-reduce, and across nodes the i-th rank of every node
    assert all(n["intra_busbw_gbps"] > 0 for n in nodes)
    ar = rep["allreduce"]
    assert ar["inter_node_busbw_gbps_min"] > 0 and ar["intra_node_busbw_gbps_min"] > 0
    assert sorted(sorted(g["ranks"]) for g in ar["inter_node_groups"]) == [[0, 2], [1, 3]]
    slow = rep["slowest_node"]
    assert slow["node"] in (f"{HOST}#0", f"{HOST}#1") and 0 <= slow["below_median"] < 1
    by_id = {f["id"]: f for f in rep["findings"]}
    assert by_id["GD-SMOKE-015"]["severity"] in ("pass", "info")  # CPU ranks: timing noise is never a warning
    assert by_id["GD-SMOKE-014"]["severity"] == "fail" and "floor 1e+06 GB/s" in by_id["GD-SMOKE-014"]["message"]
    assert rep["floors"]["min_busbw_gbps"] == 1000000
    reporter = next(a for a, (out, _) in zip(agents, outs, strict=True) if out.strip())
    assert not rep["ok"] and reporter.returncode != 0
