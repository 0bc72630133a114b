"""Issue 18: the rule classes it adds or sharpens stay quiet on clean inputs - every facts fixture (the recorded
H100 and CPU machines included), as recorded and as one node of a two-node job."""

from __future__ import annotations

import pytest

from gpudoctor.model import Severity
from tests.factsutil import FIXTURES, make_facts, run

ISSUE_18_CHECKS = (
    "GD-CUDA-005",  # a second cuDNN on the loader path
    "GD-CUDA-006",  # a second cuBLAS / CUDA runtime on the loader path
    "GD-NCCL-009",  # InfiniBand ports ACTIVE and DOWN
    "GD-NCCL-010",  # NICs NCCL's bootstrap may pick
    "GD-NCCL-011",  # GeForce P2P under driver branches with hangs
    "GD-DIST-003",  # loopback MASTER_ADDR (only across hosts)
    "GD-NCCL-002",
    "GD-NCCL-003",
    "GD-NCCL-007",
)
TWO_NODES = {"SLURM_JOB_ID": "42", "SLURM_NNODES": "2", "SLURM_NTASKS": "16", "SLURM_NTASKS_PER_NODE": "8"}
FIXTURE_NAMES = sorted(p.stem for p in (FIXTURES / "facts").glob("*.json"))


@pytest.mark.parametrize("two_nodes", [False, True], ids=["as-recorded", "two-nodes"])
@pytest.mark.parametrize("fixture", FIXTURE_NAMES)
def test_no_warn_or_fail_on_the_fixtures(fixture, two_nodes):
    base = make_facts(fixture)
    facts = make_facts(fixture, env={**base.env, **TWO_NODES}) if two_nodes else base
    loud = {
        (f.id, f.severity.value, f.message)
        for check_id in ISSUE_18_CHECKS
        for f in run(check_id, facts)
        if f.severity in (Severity.WARN, Severity.FAIL, Severity.ERROR)
    }
    assert not loud, loud
