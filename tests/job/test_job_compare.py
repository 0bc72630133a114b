"""gpudoctor compare and the job checks over the job view (facts fixtures: data, not mocks)."""

from __future__ import annotations

import json

import pytest

from gpudoctor.cli import main
from gpudoctor.facts import Facts
from gpudoctor.job.compare import Member, aspects, digest, ranks_text, view
from gpudoctor.model import Context, Severity
from gpudoctor.registry import load_all
from gpudoctor.runner import run_checks
from tests.factsutil import make_facts, said

ENV = {"NCCL_SOCKET_IFNAME": "eth0", "MASTER_ADDR": "gpu-node-01", "MASTER_PORT": "29500", "OMP_NUM_THREADS": "8"}


def _write(tmp_path, name: str, facts: Facts) -> str:
    path = tmp_path / name
    facts.dump(str(path))
    return str(path)


def _compare(capsys, *paths: str, json_out: bool = False):
    """The report's words, its lines joined (the text report wraps to the terminal; a long path is cut)."""
    import os
    from unittest import mock

    with mock.patch.dict(os.environ, {"COLUMNS": "1000"}):  # one finding, one line: what is said, not its layout
        code = main(["compare", *paths, *(["--json"] if json_out else [])])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_agreeing_snapshots_pass(tmp_path, capsys):
    a = _write(tmp_path, "a.json", make_facts(env=ENV))
    b = _write(tmp_path, "b.json", make_facts(env=ENV, patch={"host.hostname": "gpu-node-02"}))
    code, out, _ = _compare(capsys, a, b)
    assert code == 0, out
    assert "pass on 2 of 2 node(s)" in out


def test_the_node_that_differs_is_named_with_the_fact(tmp_path, capsys):
    a = _write(tmp_path, "a.json", make_facts(env=ENV))
    b = _write(
        tmp_path,
        "b.json",
        make_facts(
            env={**ENV, "OMP_NUM_THREADS": "1"}, patch={"host.hostname": "gpu-node-02", "torch.nccl": [2, 18, 1]}
        ),
    )
    c = _write(tmp_path, "c.json", make_facts(env=ENV, patch={"host.hostname": "gpu-node-03"}))
    code, out, _ = _compare(capsys, a, b, c)
    assert code == 1
    assert f"on gpu-node-02 ({b})" in out and "nccl=2.18.1 where" in out  # the node, then what differs there
    assert "OMP_NUM_THREADS=1 where" in out
    assert "pass on 2 of 3 node(s)" in out


def test_snapshots_of_one_host_name_each_file_once(tmp_path, capsys):
    # Two recordings of the same host (e.g. two days): the host name alone cannot tell them apart,
    # so the label names the file, once.
    a = _write(tmp_path, "day1.json", make_facts(env=ENV))
    b = _write(tmp_path, "day2.json", make_facts(env={**ENV, "NCCL_SOCKET_IFNAME": "ib0"}))
    code, out, _ = _compare(capsys, a, b)
    assert f"({b}) ({b})" not in out and f"({a}) ({a})" not in out
    assert f"({b})" in out and "NCCL_SOCKET_IFNAME=ib0 where" in out


def test_json_report_carries_the_job_findings(tmp_path, capsys):
    a = _write(tmp_path, "a.json", make_facts(env=ENV))
    b = _write(tmp_path, "b.json", make_facts(env=ENV, patch={"host.hostname": "n2", "nvidia.driver_version": "535.1"}))
    code, out, _ = _compare(capsys, a, b, json_out=True)
    rep = json.loads(out)
    assert rep["schema"] == "gpudoctor.report/1"
    drift = [f for f in rep["findings"] if f["id"] == "GD-JOB-002"]
    assert drift and drift[0]["severity"] == "warn" and drift[0]["evidence"]["differs"] == {"driver": "535.1"}
    assert code == 0  # a driver drift alone warns


@pytest.mark.parametrize("content", ["{not json", '{"schema": "other/1"}', ""])
def test_unreadable_snapshot_exits_2_with_one_line(tmp_path, capsys, content):
    good = _write(tmp_path, "a.json", make_facts(env=ENV))
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    code, out, err = _compare(capsys, good, str(bad))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "bad.json" in err


def test_one_snapshot_is_a_usage_error(tmp_path, capsys):
    code, _, err = _compare(capsys, _write(tmp_path, "a.json", make_facts(env=ENV)))
    assert code == 2 and "two snapshots" in err


# --- the live view's checks, over views built from fixture facts --------------------------------------------


def _member(rank: int, node: str, facts: Facts, gpu: str | None = None, leader: bool = True) -> Member:
    parts = aspects(facts, [], ranks_here=None, leader=leader)
    return Member(
        rank=rank,
        node=node,
        hostname=node,
        node_index=None,
        gpu=gpu,
        leader=leader,
        digests={a: digest(c) for a, c in parts.items()},
        contents=parts,
    )


def _judge(job: dict, check_id: str):
    facts = Facts(sections={"job": job})
    return run_checks([load_all()[check_id]], facts, Context())


def test_missing_ranks_are_named():
    f = make_facts(env=ENV)
    job = view([_member(0, "n0", f), _member(1, "n0", f, leader=False)], source="live", world_size=4, missing=[2, 3])
    job["timeout_s"] = 5
    (finding,) = _judge(job, "GD-JOB-001")
    assert finding.severity is Severity.FAIL and "ranks 2–3 of a world of 4 never reported within 5 s" in said(finding)


def test_two_ranks_on_one_gpu_fail():
    f = make_facts(env=ENV)
    job = view(
        [
            _member(0, "n0", f, gpu="GPU-a"),
            _member(1, "n0", f, gpu="GPU-a", leader=False),
            _member(2, "n0", f, gpu="GPU-b", leader=False),
        ],
        source="live",
        world_size=3,
    )
    (finding,) = _judge(job, "GD-JOB-006")
    assert finding.severity is Severity.FAIL and "ranks 0–1 all use GPU GPU-a" in said(finding)


def test_more_ranks_than_gpus_fail():
    f = make_facts(env=ENV)  # 8 GPUs
    members = [_member(r, "n0", f, leader=r == 0) for r in range(9)]
    (finding,) = _judge(view(members, source="live", world_size=9), "GD-JOB-007")
    assert finding.severity is Severity.FAIL and "9 ranks share 8 GPU(s)" in said(finding)


def test_ranks_text_spans():
    assert ranks_text([8, 9, 10, 11, 13]) == "ranks 8–11, 13"
    assert ranks_text([3]) == "rank 3"


def test_the_job_view_follows_the_facts_schema(tmp_path):
    from gpudoctor.facts import SCHEMA
    from gpudoctor.factschema import first_problem

    f = make_facts(env=ENV)
    job = view(
        [_member(0, "n0", f, gpu="GPU-a"), _member(1, "n1", f, gpu="GPU-b")], source="live", world_size=3, missing=[2]
    )
    job.update(timeout_s=5.0, missing_nodes=[2])
    assert first_problem({"schema": SCHEMA, "job": job}) is None
    job["members"][0]["digests"] = "not an object"
    assert first_problem({"schema": SCHEMA, "job": job}) is not None


def test_a_ranks_message_is_small_whatever_its_facts():
    """The exchange sends digests, not facts: a rank's message stays a few hundred bytes (docs/benchmarks.md)."""
    f = make_facts(env={**ENV, **{f"NCCL_SETTING_{i}": "x" * 50 for i in range(40)}})
    wire = json.dumps(
        _member(12345, "gpu-node-0417", f, gpu="GPU-5b1c2f3e-0000-4000-8000-000000000000").to_wire(),
        separators=(",", ":"),
    )
    assert len(wire) < 500, len(wire)
    assert len(json.dumps(aspects(f, []))) > 2000  # what would have been sent without digests


def _gpus(name: str, memory_gib: int, count: int = 8) -> list[dict]:
    base = make_facts().gpus[0]
    return [
        {**base, "index": i, "uuid": f"GPU-{name[:4]}-{i}", "name": name, "memory_total_bytes": memory_gib << 30}
        for i in range(count)
    ]


# (check id, what the second node's snapshot changes, expected severity of that check, words in its message)
DRIFTS = [
    ("GD-JOB-003", {"nvidia.gpus": _gpus("NVIDIA A100-SXM4-40GB", 40)}, "warn", "A100"),
    ("GD-JOB-004", {"nvidia.gpus": _gpus("NVIDIA H100 80GB HBM3", 80, count=4)}, "fail", "4"),
    (
        "GD-JOB-008",
        {
            "rendezvous": {
                "master_addr": "gpu-node-01",
                "master_port": "29500",
                "hostname": "gpu-node-02",
                "resolve": {"seconds": 2.0, "error": "Name or service not known"},
                "binds_port_here": False,
                "binds_port_reason": "MASTER_ADDR names another host",
            }
        },
        "fail",
        "Name or service not known",
    ),
    (
        "GD-JOB-009",
        {"nvidia.available": False, "nvidia.gpus": [], "nvidia.error": "no libnvidia-ml.so"},
        "fail",
        "GD-DRV-001",
    ),
]


@pytest.mark.parametrize("check_id, patch, expected, words", DRIFTS, ids=[d[0] for d in DRIFTS])
def test_each_job_check_names_the_node_that_differs(tmp_path, capsys, check_id, patch, expected, words):
    a = _write(tmp_path, "a.json", make_facts(env=ENV))
    b = _write(tmp_path, "b.json", make_facts(env=ENV, patch={"host.hostname": "gpu-node-02", **patch}))
    code, out, _ = _compare(capsys, a, b, json_out=True)
    findings = [f for f in json.loads(out)["findings"] if f["id"] == check_id]
    worst = max(findings, key=lambda f: Severity(f["severity"]).rank)
    assert worst["severity"] == expected and "gpu-node-02" in said(worst) and words in said(worst), findings
    assert code == (1 if expected == "fail" else 0)
    # the same two snapshots without the difference: no warn or fail from this check
    same = _write(tmp_path, "c.json", make_facts(env=ENV, patch={"host.hostname": "gpu-node-03"}))
    _, out, _ = _compare(capsys, a, same, json_out=True)
    assert {f["severity"] for f in json.loads(out)["findings"] if f["id"] == check_id} <= {"pass", "skip", "info"}


def test_env_drift_is_gd_job_005(tmp_path, capsys):
    a = _write(tmp_path, "a.json", make_facts(env=ENV))
    b = _write(tmp_path, "b.json", make_facts(env={**ENV, "OMP_NUM_THREADS": "2"}, patch={"host.hostname": "n2"}))
    _, out, _ = _compare(capsys, a, b, json_out=True)
    (f,) = [f for f in json.loads(out)["findings"] if f["id"] == "GD-JOB-005" and f["severity"] != "pass"]
    assert "OMP_NUM_THREADS=2 where" in said(f)


# --- issue 18: a loopback rendezvous is a problem only across hosts --------------------------------------

LOOPBACK_ENV = {
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
    "NCCL_SOCKET_IFNAME": "lo",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_WORLD_SIZE": "2",
}
LOOPBACK_RDV = {
    "master_addr": "127.0.0.1",
    "master_port": "29500",
    "resolved": ["127.0.0.1"],
    "loopback": True,
    "resolve": {"seconds": 0.0},
    "binds_port_here": False,
    "binds_port_reason": "not rank 0",
}


def _loopback_node(tmp_path, name: str, host: str, rank: int) -> str:
    env = {**LOOPBACK_ENV, "RANK": str(2 * rank), "GROUP_RANK": str(rank)}
    patch = {"host.hostname": host, "rendezvous": {**LOOPBACK_RDV, "hostname": host}}
    return _write(tmp_path, name, make_facts(env=env, patch=patch))


def _node_problems(out: str) -> str:
    findings = json.loads(out)["findings"]
    return " ".join(said(f) for f in findings if f["id"] == "GD-JOB-009" and f["severity"] != "pass")


def test_loopback_rendezvous_on_two_hosts_is_named(tmp_path, capsys):
    a = _loopback_node(tmp_path, "a.json", "gpu-node-01", 0)
    b = _loopback_node(tmp_path, "b.json", "gpu-node-02", 1)
    code, out, _ = _compare(capsys, a, b, json_out=True)
    problems = _node_problems(out)
    assert code == 1, out
    assert "GD-DIST-003" in problems and "loopback" in problems
    assert "GD-NCCL-002" in problems and "selects only lo" in problems


def test_loopback_rendezvous_on_one_host_is_fine(tmp_path, capsys):
    a = _loopback_node(tmp_path, "a.json", "gpu-node-01", 0)
    b = _loopback_node(tmp_path, "b.json", "gpu-node-01", 1)
    code, out, _ = _compare(capsys, a, b, json_out=True)
    problems = _node_problems(out)
    assert "GD-DIST-003" not in problems and "GD-NCCL-002" not in problems, problems
    (node_check,) = [f for f in json.loads(out)["findings"] if f["id"] == "GD-JOB-009"]
    assert node_check["severity"] == "pass" and "every rank runs on gpu-node-01" in said(node_check)
    assert code == 0, out


def test_one_host_needs_every_rank_and_a_real_host_name():
    from gpudoctor.checks.job import one_host

    members = [{"rank": 0, "hostname": "n1"}, {"rank": 1, "hostname": "n1"}]
    assert one_host({"members": members}) == "n1"
    assert one_host({"members": members, "missing_ranks": [2]}) is None  # rank 2 may be elsewhere
    assert one_host({"members": [*members, {"rank": 2, "hostname": "n2"}]}) is None
    assert one_host({"members": [{"rank": 0, "hostname": "localhost"}, {"rank": 1, "hostname": "localhost"}]}) is None


def _finding(severity: str, nodes: list[str]):
    from gpudoctor.model import Finding

    return Finding("GD-X-001", "x", "host", Severity(severity), "t", "m", evidence={"nodes": nodes})


def test_a_node_with_only_warnings_is_not_a_failed_node():
    from gpudoctor.report.jobtext import nodes_summary

    assert nodes_summary(["n1"], [_finding("warn", ["n1"])]) == "1 node with warnings"
    assert nodes_summary(["n1", "n2"], [_finding("info", ["n1"])]) == "pass on 2 of 2 node(s)"
    mixed = [_finding("warn", ["n1", "n2"]), _finding("fail", ["n2"]), _finding("error", ["n3"])]
    summary = nodes_summary(["n1", "n2", "n3", "n4"], mixed)
    assert summary == "pass on 1 of 4 node(s), 1 node with warnings, 2 nodes failing"
