"""The numbers the smoke report states, and the formulas behind them (no torch)."""

from __future__ import annotations

import math

FLOP_FORMULA = (
    "FLOPs per step = (6*N + 12*L*d*S) * tokens, tokens = batch*S per rank; "
    "N = matmul parameters = 12*L*d^2 + V*d (attention and MLP weights plus the tied LM head; "
    "embedding lookups excluded); 12*L*d*S = attention scores and values, forward and backward, "
    "counted in full without halving for the causal mask (PaLM, appendix B)"
)
BUSBW_FORMULA = "busbw = algbw * 2*(n-1)/n, algbw = payload bytes / time per all-reduce (nccl-tests)"


def matmul_params(n_layer: int, d_model: int, vocab: int) -> int:
    return 12 * n_layer * d_model * d_model + vocab * d_model


def flops_per_token(n_layer: int, d_model: int, seq_len: int, vocab: int) -> int:
    return 6 * matmul_params(n_layer, d_model, vocab) + 12 * n_layer * d_model * seq_len


def percentile(values: list[float | None], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100), like numpy's default, of the values measured (a None is a rank
    that did not measure it: one rank runs no straggler probe); None when none were."""
    ordered = sorted(v for v in values if v is not None)
    if not ordered:
        return None
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def median(values: list[float | None]) -> float | None:
    return percentile(values, 50)


def bus_bandwidth(payload_bytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in bytes/s for one all-reduce of payload_bytes across world_size ranks."""
    algbw = payload_bytes / seconds
    return algbw, algbw * 2 * (world_size - 1) / world_size


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator
