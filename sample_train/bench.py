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
    does not pass for the hardware's figure."""
    op()
    synchronize(device)
    warm_until = time.perf_counter() + warm_s
    while time.perf_counter() < warm_until:
        op()
        synchronize(device)
    best = 0.0
    for _ in range(windows):
        count, start = 0, time.perf_counter()
        while True:
            op()
            count += 1
            synchronize(device)
            elapsed = time.perf_counter() - start
            if elapsed >= seconds / windows:
                break
        best = max(best, amount * count / elapsed)
    return best


def matmul_tflops(device: torch.device, dtype: torch.dtype, n: int, seconds: float, windows: int = 5) -> float:
    """Peak TFLOP/s of n x n x n matmuls in dtype (a third of the time warms the clocks up)."""
    return gemm_tflops(device, dtype, n, n, n, seconds, windows, warm_s=seconds / 3)


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
