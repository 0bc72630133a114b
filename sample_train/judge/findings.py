"""The smoke run's verdicts, as gpudoctor Findings (ids GD-SMOKE-NNN, registered in checks/smoke.py)."""

from __future__ import annotations

from gpudoctor.model import Finding, Fix, Severity


def make(fid: str, severity: Severity, message: str, fix: Fix | None = None, **evidence) -> Finding:
    import gpudoctor.checks.smoke  # noqa: F401  (registers the GD-SMOKE checks; no torch)
    from gpudoctor.registry import registered

    spec = registered(fid)
    if spec is None or spec.source != "smoke":
        raise KeyError(f"{fid} is not a smoke check (checks/smoke.py)")
    return Finding(fid, spec.name, spec.category, severity, spec.title, message, evidence, fix)


def ranks_text(ranks) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def failed(findings: list[Finding]) -> bool:
    return any(f.severity in (Severity.FAIL, Severity.ERROR) for f in findings)


def visible_text(value) -> str:
    """CUDA_VISIBLE_DEVICES as a person reads it: unset (every GPU), set empty (none), or its value."""
    if value is None:
        return "CUDA_VISIBLE_DEVICES unset"
    return "CUDA_VISIBLE_DEVICES set empty (no GPU)" if value == "" else f"CUDA_VISIBLE_DEVICES={value}"


def build_text(cuda) -> str:
    """torch.version.cuda as a person reads it: None is a CPU-only build."""
    return "a CPU-only build" if cuda is None else f"built for CUDA {cuda}"
