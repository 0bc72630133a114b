"""Does every rank compute right (issue 28): the pure judgement over constructed per-rank results, and a real CPU
smoke run in which one rank's matmul chain and another's memory test are corrupted by the test-only fault hook."""

from __future__ import annotations

import pytest

from gpudoctor.sample_train.judge import correctness
from tests.smoke.test_smoke_run import findings, shares_the_healthy_run, validate

GOOD = {
    "chain_bf16": "aaaa",
    "chain_fp32": "bbbb",
    "train_step": "cccc",
    "reference": [{"n": 256, "dtype": "float32", "rel_error": 2e-7, "tolerance": 4e-6}],
    "memory": {"bytes": 1 << 30, "errors": 0, "patterns": 3},
}


def world(n: int, gpu: str = "NVIDIA H100 80GB HBM3", changed: dict | None = None):
    ranks = [{"rank": r, "host": f"node{r // 4}", "gpu_index": r % 4, "gpu_uuid": f"GPU-{r:04d}"} for r in range(n)]
    joins = {
        r: {"device_type": "cuda", "gpu_name": gpu, "multiprocessors": 132, "torch": "2.13.0", "cuda": "12.6"}
        for r in range(n)
    }
    results = [{"rank": r, "correctness": {**GOOD, **(changed or {}).get(r, {})}} for r in range(n)]
    return ranks, joins, results


def by_id(found: list) -> dict:
    return {f.id: f for f in found}


def test_identical_results_pass():
    section, found = correctness.judge(*world(8))
    f = by_id(found)
    assert section["verdict"] == "pass" and section["wrong"] == []
    assert f["GD-SMOKE-021"].severity.value == "pass" and f["GD-SMOKE-022"].severity.value == "pass"


def test_the_rank_that_differs_from_the_majority_is_named_with_host_gpu_and_uuid():
    section, found = correctness.judge(*world(8, changed={5: {"chain_bf16": "dead"}}))
    f = by_id(found)["GD-SMOKE-021"]
    assert f.severity.value == "fail" and f.evidence["ranks"] == [5]
    assert "rank 5 on node1 GPU 1 (GPU-0005)" in f.message and "bf16 matmul chain" in f.message
    assert section["wrong"] == [
        {"rank": 5, "host": "node1", "gpu_index": 1, "gpu_uuid": "GPU-0005", "tests": section["wrong"][0]["tests"]}
    ]


def test_two_ranks_that_disagree_are_both_named_as_no_majority_can_tell():
    _section, found = correctness.judge(*world(2, changed={1: {"train_step": "dead"}}))
    f = by_id(found)["GD-SMOKE-021"]
    assert f.severity.value == "fail" and f.evidence["ranks"] == [0, 1] and "no majority" in f.message


def test_ranks_of_another_gpu_model_are_not_compared_bitwise():
    ranks, joins, results = world(4, changed={2: {"chain_fp32": "other"}, 3: {"chain_fp32": "other"}})
    for r in (2, 3):
        joins[r]["gpu_name"] = "NVIDIA A100-SXM4-80GB"
    section, found = correctness.judge(ranks, joins, results)
    assert by_id(found)["GD-SMOKE-021"].severity.value == "pass"
    assert len(section["groups"]) == 2


def test_a_rank_alone_of_its_kind_is_compared_with_float64_only_and_says_so():
    section, found = correctness.judge(*world(1))
    f = by_id(found)["GD-SMOKE-021"]
    assert f.severity.value == "pass" and "float64 only" in f.message
    assert section["compared_with_float64_only"] == [0]


def test_a_matmul_far_from_float64_is_named():
    far = [{"n": 256, "dtype": "float32", "rel_error": 3e-3, "tolerance": 4e-6}]
    _section, found = correctness.judge(*world(1, changed={0: {"reference": far}}))
    f = by_id(found)["GD-SMOKE-021"]
    assert f.severity.value == "fail" and "from float64" in f.message


def test_memory_errors_fail_and_a_test_that_could_not_run_is_a_warning_not_a_pass():
    _s, found = correctness.judge(*world(2, changed={1: {"memory": {"bytes": 1 << 30, "errors": 7, "patterns": 3}}}))
    f = by_id(found)["GD-SMOKE-022"]
    assert f.severity.value == "fail" and f.evidence["ranks"] == [1] and "7 wrong word(s)" in f.message
    section, found = correctness.judge(*world(2, changed={0: {"chain_bf16": {"error": "OutOfMemoryError: CUDA"}}}))
    assert by_id(found)["GD-SMOKE-021"].severity.value == "warn" and section["verdict"] == "incomplete"


@pytest.mark.ddp
@shares_the_healthy_run
def test_a_rank_that_computes_wrong_and_one_whose_memory_flips_a_bit_are_named_in_a_real_quick_run(judged_run):
    """--quick keeps the correctness tests and the parts, with 10 training steps (the shared judged run: 3 ranks,
    rank=1,at=selftest,do=corrupt;rank=2,at=memory,do=corrupt)."""
    r, rep = judged_run.result, judged_run.report
    assert judged_run.FAULT == "rank=1,at=selftest,do=corrupt;rank=2,at=memory,do=corrupt"
    validate(rep)
    f = findings(rep)
    assert r.returncode == 1 and rep["correctness"]["verdict"] == "fail"
    assert f["GD-SMOKE-021"]["severity"] == "fail" and f["GD-SMOKE-021"]["evidence"]["ranks"] == [1]
    assert f["GD-SMOKE-022"]["severity"] == "fail" and f["GD-SMOKE-022"]["evidence"]["ranks"] == [2]
    assert [w["rank"] for w in rep["correctness"]["wrong"]] == [1]
    assert rep["run"]["quick"] is True and rep["run"]["model"]["steps"] == 10
    # trained without DDP and torch.optim (sample_train/handdp.py), and still every rank holds the same parameters
    assert rep["run"]["optimizer"].startswith("AdamW (hand-written") and rep["params_identical"] is True
    assert all(r["ffn_gemm_tflops"] and r["memory_copy_gbps"] for r in rep["ranks"])
