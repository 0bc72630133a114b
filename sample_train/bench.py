"""Measured peaks taken inside the smoke run: a square matmul and an all-reduce."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_tflops(device: torch.device, dtype: torch.dtype, n: int, seconds: float, windows: int = 5) -> float:
    """Peak TFLOP/s of n x n x n matmuls in dtype: the best of several timed windows, after a
    warm-up that lets GPU clocks ramp up (the best window, so that a moment of CPU contention
    on a shared host does not pass for the hardware's peak)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)

    def burst(k: int) -> None:
        for _ in range(k):
            torch.mm(a, b, out=out)

    warm_until = time.perf_counter() + seconds / 3
    while time.perf_counter() < warm_until:
        burst(4)
        synchronize(device)
    best = 0.0
    for _ in range(windows):
        count, start = 0, time.perf_counter()
        while True:
            burst(4)
            count += 4
            synchronize(device)
            elapsed = time.perf_counter() - start
            if elapsed >= seconds / windows:
                break
        best = max(best, 2 * n**3 * count / elapsed / 1e12)
    return best


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
