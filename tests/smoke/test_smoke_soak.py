"""smoke --soak (issue 28, item 2): each rank's figures over time, judged against its own first minute and the
other ranks. Pure tests over constructed series (GPU-shaped ones carry the fields worker._brief keeps of NVML's
device state), and a real CPU run in which one rank gets a tenth of a CPU from a cgroup part-way through its soak."""

from __future__ import annotations

import os
import time
import uuid

import pytest

from gpudoctor.sample_train.judge import soak
from tests.factsutil import said
from tests.smoke.networld import _cgroup_root
from tests.smoke.test_smoke_run import findings, report_of, validate


def series(n: int, matmul: float, copy: float = 3000.0, step: float = 2.0, **condition) -> list[dict]:
    return [
        {"t": i * step, "matmul_tflops": matmul, "memory_copy_gbps": copy, "sm_clock_mhz": 1980, **condition}
        for i in range(n)
    ]


def ranks(n: int) -> list[dict]:
    return [{"rank": r, "host": "gpu01", "gpu_index": r, "gpu_uuid": f"GPU-{r}"} for r in range(n)]


def test_a_gpu_that_slows_once_hot_is_named_with_when_and_why():
    results = [{"rank": r, "soak": series(90, 700.0)} for r in range(4)]
    hot = results[2]["soak"]
    for i in range(50, 90):  # from 100 s on: 30 % slower, clocks held down by the thermal slowdown
        hot[i].update(matmul_tflops=490.0, sm_clock_mhz=1350, temperature_c=91, throttle=["hw_thermal_slowdown"])
    section, (f,) = soak.judge(ranks(4), results, "cuda", 180)
    assert f.id == "GD-SMOKE-024" and f.severity.value == "warn" and f.evidence["ranks"] == [2]
    assert "from 100 s on" in f.message and "hw_thermal_slowdown" in f.message and "SM clock 1350" in f.message
    assert [x["rank"] for x in section["fell"]] == [2] and section["samples_per_rank"] == 90


def test_one_stall_is_not_a_fall_and_steady_noise_names_nobody():
    results = [{"rank": r, "soak": series(60, 700.0 + (r * 7 + 3) % 11)} for r in range(8)]
    results[5]["soak"][40]["matmul_tflops"] = 100.0  # one sample: a stall, not a throttling GPU
    _section, (f,) = soak.judge(ranks(8), results, "cuda", 120)
    assert f.severity.value == "pass"


def test_every_gpu_falling_together_names_the_node_not_a_gpu_and_on_cpu_is_a_note():
    results = [{"rank": r, "soak": series(60, 700.0)} for r in range(4)]
    for r in results:
        for i in range(30, 60):
            r["soak"][i]["matmul_tflops"] = 500.0
    _section, (f,) = soak.judge(ranks(4), results, "cuda", 120)
    assert f.severity.value == "warn" and "the whole node slowed" in f.message and "ranks" not in f.evidence
    for r in results:
        for i in range(30, 60):
            r["soak"][i]["matmul_tflops"] = 100.0
    _section, (f,) = soak.judge(ranks(4), results, "cpu", 120)
    assert f.severity.value == "info"


def test_without_soak_there_is_no_section():
    assert soak.judge(ranks(1), [{"rank": 0}], "cuda", 0) == (None, [])


def _throttle(pid: int, cpus: float) -> str:
    found = _cgroup_root()
    if found is None:
        pytest.skip("no cgroup CPU controller here")
    root, version = found
    path = os.path.join(root, f"gdsoak{uuid.uuid4().hex[:8]}")
    os.makedirs(path)
    period = 20_000
    if version == "v2":
        with open(os.path.join(root, "cgroup.subtree_control"), "w") as fh:
            fh.write("+cpu")
        with open(os.path.join(path, "cpu.max"), "w") as fh:
            fh.write(f"{int(cpus * period)} {period}")
    else:
        with open(os.path.join(path, "cpu.cfs_period_us"), "w") as fh:
            fh.write(str(period))
        with open(os.path.join(path, "cpu.cfs_quota_us"), "w") as fh:
            fh.write(str(int(cpus * period)))
    with open(os.path.join(path, "cgroup.procs"), "w") as fh:
        fh.write(str(pid))
    return path


@pytest.mark.world
@pytest.mark.ddp
@pytest.mark.xdist_group("multi-node-worlds")  # timed against the other ranks: one such world at a time
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a cgroup CPU quota)")
def test_a_rank_slowed_part_way_through_its_soak_is_named_with_the_reason(tmp_path):
    import subprocess
    import sys

    from tests.cliutil import clean_env

    mark = tmp_path / "rank1.pid"
    env = clean_env(drop=("GPUDOCTOR_SMOKE_FAULT",))
    env["GPUDOCTOR_SMOKE_FAULT"] = f"rank=1,at=soak,do=announce,to={mark}"
    cmd = [sys.executable, "-m", "gpudoctor", "smoke", "--device", "cpu", "--json", "--gpus", "2", "--soak", "12"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cgroup = None
    try:
        until = time.monotonic() + 150
        while not mark.exists() and time.monotonic() < until and proc.poll() is None:
            time.sleep(0.1)
        assert mark.exists(), proc.communicate(timeout=60)
        time.sleep(4.5)  # past its first quarter (3 s): the reference is the rank at full speed
        cgroup = _throttle(int(mark.read_text()), 0.1)
        out, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
        if cgroup:
            proc.wait(timeout=30)
            time.sleep(0.5)
            os.rmdir(cgroup)
    rep = report_of(subprocess.CompletedProcess(cmd, proc.returncode, out, err))
    validate(rep)
    f = findings(rep)["GD-SMOKE-024"]
    figures = [(r["rank"], [round(s["matmul_tflops"], 4) for s in r["samples"]]) for r in rep["soak"]["per_rank"]]
    assert f["severity"] == "warn" and f["evidence"]["ranks"] == [1], figures
    assert "its cgroup's CPU quota is 0.1 CPU" in said(f)
