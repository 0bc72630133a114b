"""NCCL's transport read from its own log, the all-reduce and GPU pairs against published floors (GD-SMOKE-025/026/027;
sample_train/judge/transport.py). Pure: the log lines are in the forms NCCL 2.18-2.28 print (NCCL's own issue
threads quote them), the results shaped as a rank sends them."""

from __future__ import annotations

from pathlib import Path

from gpudoctor.model import Severity
from gpudoctor.sample_train.judge import transport

TWO_NODES_OVER_SOCKETS = """\
n1:919:1150 [0] NCCL INFO Using network Socket
n1:919:1150 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/IPC/read
n1:919:1150 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM
n1:926:1151 [1] NCCL INFO Channel 03/0 : 1[1] -> 2[0] [send] via NET/Socket/3
n1:926:1151 [0] NCCL INFO Channel 03/0 : 3[1] -> 0[0] [receive] via NET/Socket/3
"""
OVER_IB = """\
n1:4015:4016 [0] NCCL INFO Using network IB
n1:4015:4016 [0] NCCL INFO NVLS multicast support is available on dev 0
n1:4015:4016 [0] NCCL INFO Channel 07/0 : 2[0] -> 0[0] [receive] via NET/IB/3/GDRDMA
n1:4015:4016 [1] NCCL INFO Channel 00/0 : 3[1] -> 1[1] [send] via NET/IBext_v8/2
n1:4015:4016 [1] NCCL INFO Channel 05/0 : 6[6] -> 3[3] via P2P/direct pointer/read
n1:4015:4016 [1] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct
n1:4015:4016 [1] NCCL WARN something unrelated via nothing
"""


def _result(text: str, rdma: list[str]) -> dict:
    return {"backend": "nccl", "nccl_transport": {**transport.parse(text), "rdma_devices": rdma}}


def test_each_connection_is_read_by_its_kind():
    parsed = transport.parse(OVER_IB)
    assert parsed["paths"] == {"NET/IB": 1, "NET/IB/GDRDMA": 1, "P2P": 1, "SHM": 1}
    assert parsed["networks"] == ["IB"] and parsed["nvls"] is True
    assert parsed["net_peers"] == {"NET/IB": [1, 3], "NET/IB/GDRDMA": [0, 2]}
    assert transport.parse("") == {"paths": {}, "net_peers": {}, "networks": [], "nvls": False}


def test_sockets_between_nodes_that_have_rdma_devices_fail():
    results = [_result(TWO_NODES_OVER_SOCKETS, ["mlx5_0", "mlx5_1"]), _result(TWO_NODES_OVER_SOCKETS, ["mlx5_0"])]
    section, (finding,) = transport.judge_transport(results, "nccl", nodes=2)
    assert finding.severity is Severity.FAIL
    assert "NET/Socket" in finding.message and "mlx5_0, mlx5_1" in finding.message
    assert section["paths"]["NET/Socket"] == 4 and section["ranks_read"] == 2


def test_sockets_where_the_nodes_have_nothing_faster_are_named_not_failed():
    section, (finding,) = transport.judge_transport([_result(TWO_NODES_OVER_SOCKETS, [])], "nccl", nodes=2)
    assert finding.severity is Severity.PASS and "NET/Socket (2 connections)" in finding.message


def test_rdma_between_nodes_passes_and_says_what_it_used():
    _, (finding,) = transport.judge_transport([_result(OVER_IB, ["mlx5_0"])], "nccl", nodes=2)
    assert finding.severity is Severity.PASS
    assert "NET/IB/GDRDMA" in finding.message and "network plug-in: IB" in finding.message
    assert "NVLS available" in finding.message


def test_cpu_ranks_and_an_unread_log_say_why():
    _, (cpu,) = transport.judge_transport([{"backend": "gloo"}], "gloo", nodes=1)
    assert cpu.severity is Severity.SKIP
    _, (unread,) = transport.judge_transport([{"backend": "nccl"}], "nccl", 1, "NCCL_DEBUG_FILE is set (yours)")
    assert unread.severity is Severity.INFO and "NCCL_DEBUG_FILE" in unread.message


def test_the_allreduce_is_judged_only_against_a_published_node_shape():
    (good,) = transport.judge_allreduce(361.0, ["H100 SXM"] * 8, nodes=1, ranks=8)
    assert good.severity is Severity.PASS and "460" in good.message
    (slow,) = transport.judge_allreduce(120.0, ["H100 SXM"] * 8, nodes=1, ranks=8)
    assert slow.severity is Severity.FAIL and slow.evidence["expected_gbps"] == 276.0
    for args in ((300.0, ["H100 SXM"] * 4, 1, 4), (300.0, ["H100 SXM"] * 16, 2, 16), (None, ["H200 SXM"], 1, 1)):
        (skipped,) = transport.judge_allreduce(*args)
        assert skipped.severity is Severity.SKIP
    (mixed,) = transport.judge_allreduce(400.0, ["H100 SXM"] * 7 + [None], nodes=1, ranks=8)
    assert mixed.severity is Severity.SKIP


def test_a_real_one_rank_log_names_the_network_and_no_connection():
    """NCCL 2.28.9's own log of a one-rank communicator on an H200 VM (tests/fixtures/nccl/README.md)."""
    text = (Path(__file__).resolve().parents[1] / "fixtures" / "nccl" / "h200-one-rank-nccl-2.28.9.log").read_text()
    parsed = transport.parse(text)
    assert parsed == {"paths": {}, "net_peers": {}, "networks": ["Socket"], "nvls": False}
    section, (finding,) = transport.judge_transport([_result(text, [])], "nccl", nodes=1)
    assert finding.severity is Severity.PASS and "no connection (one rank)" in finding.message


def _h100_joins(n):
    return {r: {"gpu_name": "NVIDIA H100 80GB HBM3", "gpu_memory_bytes": 85 * 10**9} for r in range(n)}


def test_a_gpu_pair_that_lost_its_nvlink_fails_against_the_models_floor():
    """GD-SMOKE-027: one H100 pair at PCIe speed among healthy NVLink pairs."""
    pairs = [{"node": "n1", "pairs": [{"ranks": [0, 1], "gbps": 360.0}, {"ranks": [2, 3], "gbps": 36.5}]}]
    (finding,) = transport.judge_gpu_pairs(pairs, _h100_joins(4))
    assert finding.severity is Severity.FAIL and finding.evidence["pairs"][0]["ranks"] == [2, 3]
    assert "185.5 GB/s" in finding.message and "ranks 2 and 3 on node n1: 36.5 GB/s" in finding.message
    healthy = [{"node": "n1", "pairs": [{"ranks": [0, 1], "gbps": 350.0}]}]
    assert transport.judge_gpu_pairs(healthy, _h100_joins(2))[0].severity is Severity.PASS


def test_gpu_pairs_without_a_published_reference_or_measurement_are_skipped():
    a100 = {r: {"gpu_name": "NVIDIA A100-SXM4-80GB", "gpu_memory_bytes": 85 * 10**9} for r in range(2)}
    (finding,) = transport.judge_gpu_pairs([{"node": "n1", "pairs": [{"ranks": [0, 1], "gbps": 10.0}]}], a100)
    assert finding.severity is Severity.SKIP and "A100" in finding.message
    assert transport.judge_gpu_pairs(None, a100)[0].severity is Severity.SKIP
    cpu = {r: {"device_type": "cpu"} for r in range(2)}
    (on_cpu,) = transport.judge_gpu_pairs([{"node": "n1", "pairs": [{"ranks": [0, 1], "gbps": 1.0}]}], cpu)
    assert on_cpu.severity is Severity.SKIP and "CPU ranks" in on_cpu.message
