"""Dense tensor-core peak TFLOP/s per GPU model, from NVIDIA's datasheets (see docs/gpu_peaks.md).

Dense, not sparse: datasheets print the 2:4-sparsity figure with an asterisk; we halve it.
The precision is the one the smoke run trains in on that GPU: bf16 where the GPU has it,
fp16 (with fp32 accumulation) on Volta and Turing, which have no bf16 tensor cores.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Peak:
    model: str  # the GPU as the table names it
    tflops: float  # dense tensor-core TFLOP/s
    dtype: str  # bfloat16 | float16
    source: str


_SHEET = "NVIDIA datasheet"
# Order matters: the first pattern that matches the device name wins (H100 PCIe before H100).
_TABLE: tuple[tuple[str, Peak], ...] = (
    (r"\bB200\b", Peak("B200", 2250.0, "bfloat16", f"{_SHEET} (HGX B200: 4.5 PFLOPS sparse / 2)")),
    (r"\bGH200\b", Peak("GH200", 989.4, "bfloat16", f"{_SHEET} (1979 sparse / 2)")),
    (r"\bH200\b.*\bNVL\b", Peak("H200 NVL", 835.5, "bfloat16", f"{_SHEET} (1671 sparse / 2)")),
    (r"\bH200\b", Peak("H200 SXM", 989.4, "bfloat16", f"{_SHEET} (1979 sparse / 2)")),
    (r"\bH100\b.*\bNVL\b", Peak("H100 NVL", 835.5, "bfloat16", f"{_SHEET} (1671 sparse / 2)")),
    (r"\bH100\b.*\bPCIE\b", Peak("H100 PCIe", 756.5, "bfloat16", f"{_SHEET} (1513 sparse / 2)")),
    (r"\bH100\b.*(\bSXM|\bHBM3\b)", Peak("H100 SXM", 989.4, "bfloat16", f"{_SHEET} (1979 sparse / 2)")),
    (r"\bA100\b", Peak("A100", 312.0, "bfloat16", f"{_SHEET} (624 sparse / 2; SXM and PCIe alike)")),
    (r"\bL40S\b", Peak("L40S", 362.05, "bfloat16", f"{_SHEET} (733 sparse / 2)")),
    (r"\bL40\b", Peak("L40", 181.05, "bfloat16", f"{_SHEET} (362 sparse / 2)")),
    (r"\bL4\b", Peak("L4", 121.0, "bfloat16", f"{_SHEET} (242 sparse / 2)")),
    (r"\bA10\b", Peak("A10", 125.0, "bfloat16", f"{_SHEET} (250 sparse / 2); not the A10G")),
    # GeForce: the fp32-accumulate figure (what autocast matmuls use); fp16-accumulate is twice it.
    # The 4090 D and the 3090 Ti are other SKUs with other peaks: no match rather than a wrong one.
    (
        r"\bRTX 4090\b(?! D\b)",
        Peak("GeForce RTX 4090", 165.2, "bfloat16", "NVIDIA Ada whitepaper (330.4 sparse / 2, fp32 accumulate)"),
    ),
    (
        r"\bRTX 3090\b(?! Ti\b)",
        Peak("GeForce RTX 3090", 71.0, "bfloat16", "NVIDIA Ampere GA102 whitepaper (142 sparse / 2, fp32 accumulate)"),
    ),
    (r"\bV100S\b", Peak("V100S PCIe", 130.0, "float16", f"{_SHEET} (no bf16: fp16 tensor cores)")),
    (r"\bV100\b.*\bPCIE\b", Peak("V100 PCIe", 112.0, "float16", f"{_SHEET} (no bf16: fp16 tensor cores)")),
    (r"\bV100\b", Peak("V100 SXM2", 125.0, "float16", f"{_SHEET} (no bf16: fp16 tensor cores)")),
    (r"\bT4\b", Peak("T4", 65.0, "float16", f"{_SHEET} (no bf16: fp16 tensor cores)")),
)


_MOBILE = re.compile(r"\b(Laptop|Mobile|Max Q)\b", re.IGNORECASE)


def lookup(device_name: str | None) -> Peak | None:
    """The spec peak for a torch/NVML device name such as 'NVIDIA H100 80GB HBM3', or None."""
    if not device_name:
        return None
    name = device_name.replace("-", " ")
    if _MOBILE.search(name):  # laptop parts share desktop names but not their clocks or power
        return None
    for pattern, peak in _TABLE:
        if re.search(pattern, name, re.IGNORECASE):
            return peak
    return None


def table() -> list[Peak]:
    return [peak for _, peak in _TABLE]


def identify(name: str | None, memory_bytes: int | None = None, power_limit_w: float | None = None) -> Peak | None:
    """The table's row for a GPU (by name for now; memory and power limit tell form factors apart later)."""
    return lookup(name)


def expectation(ref: Peak, figure: str):
    """What a healthy device of this model reaches for a measured figure; None: no published figure yet."""
    return None
