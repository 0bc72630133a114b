"""How the smoke run's measured matmul peak compares with other ways of measuring the same GPU (issue 28, item 6).

Run on a GPU machine: `python benchmarks/matmul_methods.py` prints one JSON line per method (TFLOP/s, bf16):
- plain: `a @ b` on random 8192^3 data in a loop, timed by CUDA events over 3 s after 1 s of warm-up;
- mm_out: the same with `torch.mm(a, b, out=c)` (what the smoke run's gemm calls);
- old_inrun: the smoke run's method before issue 28 (square 8192, four products per call, a host sync after each
  call, best of 5 windows in 1 s after 0.33 s of warm-up);
- sweep: a sweep over 18 shapes (0.25 s each, warm clocks), as mamf-finder searches, best first;
- inrun: gpudoctor's bench.max_matmul as the smoke run calls it (1 s, 0.3 s warm-up), and with 4 s.
"""

from __future__ import annotations

import itertools
import json
import time

import torch

from gpudoctor.sample_train import bench


def events_rate(fn, flop: float, seconds: float) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    calls = max(1, round(seconds / max(start.elapsed_time(end) / 1e3, 1e-6)))
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return flop * calls / (start.elapsed_time(end) / 1e3) / 1e12


def warm(seconds: float) -> None:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        a @ a
        torch.cuda.synchronize()


def main() -> None:
    dev = torch.device("cuda")
    dt = torch.bfloat16
    n = 8192
    a, b = torch.randn(n, n, device=dev, dtype=dt), torch.randn(n, n, device=dev, dtype=dt)
    c = torch.empty(n, n, device=dev, dtype=dt)
    flop = 2 * n**3
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}), flush=True)
    t0 = time.perf_counter()
    print(json.dumps({"method": "old_inrun", "tflops": round(old_inrun(dev, dt), 1)}), flush=True)
    warm(1.0)
    print(json.dumps({"method": "plain", "tflops": round(events_rate(lambda: a @ b, flop, 3.0), 1)}), flush=True)
    mm_out = events_rate(lambda: torch.mm(a, b, out=c), flop, 3.0)
    print(json.dumps({"method": "mm_out", "tflops": round(mm_out, 1)}), flush=True)
    zeros = torch.zeros_like(a)
    print(json.dumps({"method": "plain_zeros", "tflops": round(events_rate(lambda: zeros @ zeros, flop, 2.0), 1)}))
    rows = []
    for m, k, nn in itertools.product((4096, 8192, 16384), (4096, 8192, 16384), (4096, 8192)):
        x = torch.randn(m, k, device=dev, dtype=dt)
        y = torch.randn(k, nn, device=dev, dtype=dt)
        rows.append([m, k, nn, round(events_rate(lambda: x @ y, 2 * m * k * nn, 0.25), 1)])  # noqa: B023
    rows.sort(key=lambda r: -r[3])
    print(json.dumps({"method": "sweep", "best_first": rows}), flush=True)
    for seconds in (1.0, 4.0):
        t = time.perf_counter()
        peak = bench.max_matmul(dev, dt, seconds, 0.3)
        peak.pop("method")
        print(json.dumps({"method": f"inrun_{seconds:g}s", "took_s": round(time.perf_counter() - t, 2), **peak}))
    # 4096^3 led the sweep: measured again last, after seconds of full load (is it the shape, or the power headroom
    # left by the low-power zeros run before the sweep?)
    x = torch.randn(4096, 4096, device=dev, dtype=dt)
    again = [round(events_rate(lambda: x @ x, 2 * 4096**3, 1.0), 1) for _ in range(3)]
    print(json.dumps({"method": "4096_cubed_again_1s_x3", "tflops": again}), flush=True)
    print(json.dumps({"total_s": round(time.perf_counter() - t0, 1)}), flush=True)


def old_inrun(dev: torch.device, dt: torch.dtype) -> float:
    """The smoke run's matmul figure before issue 28: square 8192, host-timed windows with a sync per call."""
    n = 8192
    a, b = torch.randn(n, n, device=dev, dtype=dt), torch.randn(n, n, device=dev, dtype=dt)
    out = torch.empty(n, n, device=dev, dtype=dt)

    def four() -> None:
        for _ in range(4):
            torch.mm(a, b, out=out)

    amount, seconds, windows = 4 * 2 * n**3 / 1e12, 1.0, 5
    four()
    torch.cuda.synchronize()
    until = time.perf_counter() + seconds / 3
    while time.perf_counter() < until:
        four()
        torch.cuda.synchronize()
    best = 0.0
    for _ in range(windows):
        count, start = 0, time.perf_counter()
        while True:
            four()
            count += 1
            torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            if elapsed >= seconds / windows:
                break
        best = max(best, amount * count / elapsed)
    return best


if __name__ == "__main__":
    main()
