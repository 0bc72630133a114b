"""Fit the run to the GPU as it is (issue 28, item 4): free memory and the processes on each GPU at the
rendezvous, judged by sample_train/judge/fit.py. The placement records are shaped like the one recorded on a real H200
(a smoke report of a stray compute process, copied into the facts below); the held memory is
constructed."""

from __future__ import annotations

from gpudoctor.sample_train.coordinator import plan_run
from gpudoctor.sample_train.judge import fit
from gpudoctor.sample_train.options import SmokeOptions

GIB = 1 << 30
H200_TOTAL = 150109880320  # as torch reported it on the recorded H200


def h200(rank: int = 0, free: int | None = H200_TOTAL - GIB // 2, processes: list | None = None) -> dict:
    return {
        "rank": rank,
        "host": "vm",
        "pid": 1097 + rank,
        "device_type": "cuda",
        "device_index": rank,
        "gpu_name": "NVIDIA H200",
        "gpu_memory_bytes": H200_TOTAL,
        "compute_capability": [9, 0],
        "bf16_native": True,
        "gpu_free_bytes": free,
        "gpu_processes": processes if processes is not None else [{"pid": 1097 + rank, "used_memory_bytes": GIB // 2}],
    }


def test_a_free_gpu_passes_and_keeps_the_large_model():
    joins = {0: h200()}
    fits, found = fit.judge(joins, SmokeOptions())
    assert fits is None and [f.severity.value for f in found] == ["pass"]
    assert plan_run(joins, SmokeOptions(), fits)["model"]["name"] == "large"


def test_another_process_holding_most_of_the_memory_is_named_first_and_the_run_is_sized_to_what_is_free():
    held = int(131.8 * GIB)
    joins = {0: h200(free=H200_TOTAL - held - GIB // 2, processes=[{"pid": 1052, "used_memory_bytes": held}])}
    fits, found = fit.judge(joins, SmokeOptions())
    (f,) = found
    assert f.id == "GD-SMOKE-023" and f.severity.value == "warn"
    assert "PID 1052 (131.8 GiB)" in f.message and "small instead of large" in f.message
    assert "ps -o user,pid,etime,cmd -p 1052" in f.fix.actions[1].target
    assert fits == "small" and plan_run(joins, SmokeOptions(), fits)["model"]["name"] == "small"


def test_too_little_free_memory_stops_the_run_before_training_unless_a_size_is_asked_for():
    joins = {0: h200(free=2 * GIB, processes=[{"pid": 77, "used_memory_bytes": H200_TOTAL - 2 * GIB}])}
    _fits, (f,) = fit.judge(joins, SmokeOptions())
    assert f.severity.value == "fail" and "smallest smoke model" in f.message
    _fits, (f,) = fit.judge(joins, SmokeOptions.of(size="tiny"))
    assert f.severity.value == "warn" and "--size tiny as asked" in f.message


def test_memory_held_where_nvml_shows_no_process_is_said_as_such():
    joins = {0: h200(free=40 * GIB, processes=[])}
    fits, (f,) = fit.judge(joins, SmokeOptions())
    assert f.severity.value == "warn" and "NVML does not show" in f.message and fits == "medium"


def test_the_jobs_own_ranks_are_not_another_process():
    joins = {
        r: h200(r, processes=[{"pid": 1097, "used_memory_bytes": GIB}, {"pid": 1098, "used_memory_bytes": GIB}])
        for r in range(2)
    }
    _fits, found = fit.judge(joins, SmokeOptions())
    assert [f.severity.value for f in found] == ["pass"]


def test_quick_takes_the_small_model_and_cpu_runs_are_not_judged():
    assert plan_run({0: h200()}, SmokeOptions.of(quick=True))["model"]["name"] == "small"
    assert fit.judge({0: {"rank": 0, "device_type": "cpu", "pid": 1}}, SmokeOptions()) == (None, [])
