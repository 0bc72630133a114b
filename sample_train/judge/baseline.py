"""A fleet baseline: one known-good run's figures per part, saved and compared against later (no torch).

`gpudoctor smoke --save-baseline base.json` on a node known to be good; `--baseline base.json` afterwards
judges every rank's parts against it. A baseline only compares with a run of the same kind: the same GPU
model (or CPU), the same world size and the same model, precision and batch; any other is refused before
anything is judged (exit 2), since its figures would mean something else.
"""

from __future__ import annotations

import json
import math

from gpudoctor import __version__
from gpudoctor.sample_train.options import OptionsError

SCHEMA = "gpudoctor.smoke-baseline/1"
MAX_BYTES = 1 << 20
KIND_KEYS = ("device_type", "gpu_model", "world_size", "nodes", "model", "precision", "seq_len", "batch_size")


def kind_of(report: dict) -> dict:
    """What a run must share with a baseline for their figures to compare."""
    placement = report.get("placement") or []
    run = report.get("run") or {}
    model = run.get("model") or {}
    gpu_models = sorted({p.get("gpu_name") or "?" for p in placement if p.get("device_type") == "cuda"})
    return {
        "device_type": placement[0].get("device_type") if placement else None,
        "gpu_model": ", ".join(gpu_models) if gpu_models else "cpu",
        "world_size": report.get("launch", {}).get("world_size"),
        "nodes": len(report.get("nodes") or []) or 1,
        "model": model.get("name"),
        "precision": run.get("precision"),
        "seq_len": model.get("seq_len"),
        "batch_size": model.get("batch_size"),
    }


def from_report(report: dict) -> dict:
    """The baseline of a finished, passing run: its kind, the median over ranks of every figure of the table
    (judge/figures.py; slowness keeps them as job_medians) and the job's own figures (report._slowness)."""
    return {
        "schema": SCHEMA,
        "tool": {"name": "gpudoctor", "version": __version__},
        "kind": kind_of(report),
        "figures": report["expectations"]["job_medians"],
    }


def load(path: str) -> dict:
    """Reads and validates a baseline file; one line (OptionsError) for anything unusable."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except OSError as e:
        raise OptionsError(f"--baseline {path}: cannot read it ({e.strerror or e})") from None
    if len(raw) > MAX_BYTES:
        raise OptionsError(f"--baseline {path}: larger than {MAX_BYTES // 1024} KiB: not a smoke baseline")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise OptionsError(f"--baseline {path}: not JSON ({str(e).splitlines()[0][:120]})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise OptionsError(f"--baseline {path}: not a {SCHEMA} file (schema {found!r}); save one with --save-baseline")
    kind, figures = data.get("kind"), data.get("figures")
    if not isinstance(kind, dict) or not isinstance(figures, dict):
        raise OptionsError(f"--baseline {path}: 'kind' and 'figures' must be objects")
    for name, value in figures.items():
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0
        ):
            raise OptionsError(f"--baseline {path}: figure {name!r} is {value!r}, not a non-negative number")
    return data


def mismatch(baseline: dict, report: dict) -> str | None:
    """Why this run cannot be judged against the baseline, in one line; None when it can."""
    theirs, ours = baseline.get("kind") or {}, kind_of(report)
    differ = [key for key in KIND_KEYS if key in theirs and theirs[key] != ours[key]]
    if not differ:
        return None
    shown = "; ".join(f"{key} {theirs[key]!r} there, {ours[key]!r} here" for key in differ)
    return _refusal(shown)


def early_mismatch(baseline: dict, world_size: int, device_type: str) -> str | None:
    """The part of mismatch() known before any rank starts."""
    theirs = baseline.get("kind") or {}
    differ = []
    if theirs.get("world_size") not in (None, world_size):
        differ.append(f"world_size {theirs['world_size']!r} there, {world_size!r} here")
    if theirs.get("device_type") not in (None, device_type):
        differ.append(f"device_type {theirs['device_type']!r} there, {device_type!r} here")
    if not differ:
        return None
    return _refusal("; ".join(differ))


def _refusal(differences: str) -> str:
    return (
        f"the baseline is from another kind of run ({differences}): save one from this kind of run with --save-baseline"
    )
