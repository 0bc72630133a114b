"""Measured peaks taken inside the smoke run: a square matmul and an all-reduce."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_rate(op, amount: float, device: torch.device, seconds: float, windows: int, warm_s: float = 0.0) -> float:
    """amount per second of op(): the best of several timed windows, after one call (and warm_s of calls,
    which lets GPU clocks ramp up). The best window, so that a moment of CPU contention on a shared host
    does not pass for the hardware's figure. On a GPU each window is timed by CUDA events around calls queued back
    to back (no host round trip between them, as the maximum-achievable-matmul method times it)."""
    op()
    synchronize(device)
    warm_until = time.perf_counter() + warm_s
    while time.perf_counter() < warm_until:
        op()
        synchronize(device)
    window = seconds / windows
    timed = _gpu_window if device.type == "cuda" else _host_window
    return max(amount * calls / elapsed for calls, elapsed in (timed(op, device, window) for _ in range(windows)))


def _host_window(op, device: torch.device, window: float) -> tuple[int, float]:
    count, start = 0, time.perf_counter()
    while True:
        op()
        count += 1
        synchronize(device)
        elapsed = time.perf_counter() - start
        if elapsed >= window:
            return count, elapsed


def _gpu_window(op, device: torch.device, window: float) -> tuple[int, float]:
    """(calls, seconds) of about `window` seconds of op() queued back to back, timed on the GPU."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    op()
    end.record()
    end.synchronize()
    one = max(start.elapsed_time(end) / 1e3, 1e-6)
    calls = max(1, min(10_000, round(window / one)))
    start.record()
    for _ in range(calls):
        op()
    end.record()
    end.synchronize()
    return calls, max(start.elapsed_time(end) / 1e3, 1e-9)


# The shapes of the maximum achievable matmul (mamf-finder, stas00/ml-engineering: the peak is the best of many
# shapes, measured with warm clocks; the square 8192 is rarely the best one). A few large shapes that fill every SM
# with full tiles, so that the run's figure is the hardware's, not one shape's.
# On an H200 (docs/benchmarks.md, 2026-11-27), sustained after a warm-up: 8192^3 660-680 TFLOP/s, 4096x16384x8192
# and 8192x16384x4096 685-716, 4096^3 673-693 (771 only right after an idle moment: the power limit's headroom).
MATMUL_SHAPES_GPU = ((8192, 8192, 8192), (4096, 16384, 8192), (8192, 16384, 4096))
MATMUL_SHAPES_CPU = ((256, 256, 256),)
MATMUL_METHOD = (
    "maximum achievable matmul: the best sustained window over a few large shapes, after the clocks warmed up "
    "(as mamf-finder measures it); each window calls queued back to back and timed by the device"
)


def max_matmul(device: torch.device, dtype: torch.dtype, seconds: float, warm_s: float) -> dict:
    """The measured matmul peak: {tflops, best_shape, shapes: [[m, k, n, tflops], ...], method}."""
    shapes = MATMUL_SHAPES_GPU if device.type == "cuda" else MATMUL_SHAPES_CPU
    each = seconds / len(shapes)
    measured = []
    for i, (m, k, n) in enumerate(shapes):
        tflops = gemm_tflops(device, dtype, m, k, n, each, windows=3, warm_s=warm_s if i == 0 else 0.0)
        measured.append([m, k, n, round(tflops, 2)])
    best = max(measured, key=lambda row: row[3])
    return {"tflops": best[3], "best_shape": best[:3], "shapes": measured, "method": MATMUL_METHOD}


def gemm_tflops(
    device: torch.device, dtype: torch.dtype, m: int, k: int, n: int, seconds: float, windows: int, warm_s: float = 0
) -> float:
    """TFLOP/s of (m x k) @ (k x n) in dtype, four products per timed call."""
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    out = torch.empty(m, n, device=device, dtype=dtype)

    def four() -> None:
        for _ in range(4):
            torch.mm(a, b, out=out)

    return best_rate(four, 4 * 2 * m * k * n / 1e12, device, seconds, windows, warm_s)


def copy_gbps(src: torch.Tensor, dst: torch.Tensor, device: torch.device, seconds: float, windows: int = 3) -> float:
    """GB/s of dst.copy_(src): between device memory and itself (counted as read + write, as
    nvbandwidth and STREAM's copy do) or across the host link (pinned memory, bytes once)."""
    nbytes = src.numel() * src.element_size()
    moved = 2 * nbytes if src.device == dst.device else nbytes
    return best_rate(lambda: dst.copy_(src, non_blocking=True), moved / 1e9, device, seconds, windows)


def first_allreduce(device: torch.device, world_size: int) -> float:
    """The first collective (NCCL builds its communicator here); returns seconds. Checks the sum."""
    start = time.perf_counter()
    t = torch.ones(1, device=device)
    dist.all_reduce(t)
    synchronize(device)
    if int(t.item()) != world_size:
        raise RuntimeError(f"first all-reduce summed to {t.item()}, expected {world_size}: a rank is not in the group")
    return time.perf_counter() - start


def allreduce_seconds(
    device: torch.device, payload_bytes: int, dtype: torch.dtype, iters: int, warmup: int, group=None
) -> float:
    """Mean seconds per all-reduce of payload_bytes, as nccl-tests times it (after warm-up); group: a subgroup."""
    x = torch.zeros(payload_bytes // torch.tensor([], dtype=dtype).element_size(), device=device, dtype=dtype)
    for _ in range(warmup):
        dist.all_reduce(x, group=group)
    synchronize(device)
    # Start together, as nccl-tests does with a barrier: a rank that starts its clock early would
    # count its wait for the late ones as transfer time, and the slowest rank's mean is reported.
    align = torch.zeros(1, device=device, dtype=dtype)
    dist.all_reduce(align, group=group)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x, group=group)
    synchronize(device)
    return (time.perf_counter() - start) / iters


def exchange_gbps(device: torch.device, peer: int | None, payload_bytes: int, iters: int) -> float | None:
    """Both directions at once with one peer rank (send and receive payload_bytes, iters times after one
    warm-up); GB/s per direction in the best exchange, as this rank saw it (the best, as in best_rate: a
    moment of CPU contention slows an exchange, nothing makes a link faster). peer None: this rank sits the
    round out. Every rank ends at a barrier, so rounds of disjoint pairs do not overlap."""
    rate = None
    if peer is not None:
        out = torch.ones(payload_bytes, device=device, dtype=torch.uint8)
        into = torch.empty(payload_bytes, device=device, dtype=torch.uint8)

        def swap() -> None:
            ops = [dist.P2POp(dist.isend, out, peer), dist.P2POp(dist.irecv, into, peer)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()

        swap()
        synchronize(device)
        best = float("inf")
        for _ in range(iters):
            start = time.perf_counter()
            swap()
            synchronize(device)
            best = min(best, time.perf_counter() - start)
        rate = payload_bytes / best / 1e9
    dist.barrier()
    return rate
