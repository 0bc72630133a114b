"""The GPUs the facts describe, with their compute capabilities: shared by the cuda and precision checks."""

from __future__ import annotations

from gpudoctor import versions
from gpudoctor.facts import Facts

Capability = tuple[int, int]


def nvml_gpus(facts: Facts) -> list[dict]:
    """GPUs the driver sees and could describe (NVML)."""
    if not facts.nvidia.get("available"):
        return []
    return [g for g in facts.gpus if not g.get("error")]


def _capability(gpu: dict) -> Capability | None:
    cc = gpu.get("compute_capability") or gpu.get("capability")
    return (int(cc[0]), int(cc[1])) if cc and len(cc) >= 2 else None


def gpu_capabilities(facts: Facts) -> dict[int, tuple[str, Capability]]:
    """GPU index -> (name, compute capability), from NVML, else from torch."""
    gpus = nvml_gpus(facts) or [d for d in facts.torch.get("devices") or [] if not d.get("error")]
    out: dict[int, tuple[str, Capability]] = {}
    for g in gpus:
        cc = _capability(g)
        if cc:
            out[g.get("index", len(out))] = (g.get("name") or "?", cc)
    return out


def format_indices(idx: list[int]) -> str:
    return ",".join(str(i) for i in sorted(idx))


def describe_groups(groups: dict[tuple[str, Capability], list[int]]) -> str:
    """'GPU 0,1 (NVIDIA H100, compute capability 9.0); GPU 2 (...)' for GPUs grouped by (name, capability)."""
    return "; ".join(
        f"GPU {format_indices(idx)} ({name}, compute capability {versions.fmt(cc)})"
        for (name, cc), idx in groups.items()
    )
