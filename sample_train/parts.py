"""Each rank's part benchmarks, briefly, before training: one measurement per part that a row of the figure
table (sample_train/judge/figures.py) names in its `measured` (torch).

A new figure measured here is a function `(device, dtype, cfg, seconds) -> {field: value, ...}` in MEASURE under
the part's name; a part a device cannot run (pinned host copies without a GPU) returns None and is left out.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gpudoctor.sample_train import bench
from gpudoctor.sample_train.judge import figures
from gpudoctor.sample_train.sizes import GPTConfig

PART_SECONDS_GPU, PART_SECONDS_CPU = 0.3, 0.1  # each part benchmark's timed windows together
HOST_COPY_BYTES = 256 * 2**20


def _ffn_gemm(device: torch.device, dtype: torch.dtype, cfg: GPTConfig, seconds: float) -> dict:
    tokens = cfg.batch_size * cfg.seq_len
    shape = [tokens, cfg.d_model, 4 * cfg.d_model]
    return {"shape": shape, "tflops": bench.gemm_tflops(device, dtype, *shape, seconds, 3)}


def _memory_copy(device: torch.device, dtype: torch.dtype, cfg: GPTConfig, seconds: float) -> dict:
    size = 512 * 2**20 if device.type == "cuda" else 64 * 2**20
    src = torch.ones(size, dtype=torch.uint8, device=device)
    return {"bytes": size, "gbps": bench.copy_gbps(src, torch.zeros_like(src), device, seconds)}


def _host_copy(to_device: bool) -> Callable[[torch.device, torch.dtype, GPTConfig, float], dict | None]:
    """Pinned host memory to the GPU or back (no GPU: no host link to measure)."""

    def measure(device: torch.device, dtype: torch.dtype, cfg: GPTConfig, seconds: float) -> dict | None:
        if device.type != "cuda":
            return None
        host = torch.ones(HOST_COPY_BYTES, dtype=torch.uint8).pin_memory()
        on_gpu = torch.zeros_like(host, device=device)
        src, dst = (host, on_gpu) if to_device else (on_gpu, host)
        return {"bytes": host.numel(), "gbps": bench.copy_gbps(src, dst, device, seconds)}

    return measure


MEASURE: dict[str, Callable[[torch.device, torch.dtype, GPTConfig, float], dict | None]] = {
    "ffn_gemm": _ffn_gemm,
    "memory_copy": _memory_copy,
    "h2d": _host_copy(to_device=True),
    "d2h": _host_copy(to_device=False),
}


def measure(device: torch.device, dtype: torch.dtype, cfg: GPTConfig, quick: bool = False) -> dict:
    """This rank's parts, in the figure table's order: {part: {field: value}}; --quick: half the time each."""
    seconds = (PART_SECONDS_GPU if device.type == "cuda" else PART_SECONDS_CPU) / (2 if quick else 1)
    parts = {}
    for name in figures.measured_parts():
        found = MEASURE[name](device, dtype, cfg, seconds)
        if found is not None:
            parts[name] = found
    return parts
