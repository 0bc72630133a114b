"""What every rule of `gpudoctor watch` shares: a finding of a registered GD-WATCH verdict (checks/watch.py),
the samples of a node's GPUs, and the words the messages use. Pure: no I/O."""

from __future__ import annotations

from gpudoctor.model import Action, ActionKind, Finding, Fix, Safety, Severity
from gpudoctor.watch.samples import GpuTrace, NodeObservation

IDLE_UTIL = 5  # %: at or below, the GPU did no work in that sample
HELD_BYTES = 2**30  # memory a process must hold for "holds the GPU"
MIN_SAMPLES = 5


def make(fid: str, severity: Severity, message: str, fix: Fix | None = None, **evidence) -> Finding:
    import gpudoctor.checks.watch  # noqa: F401  (registers the GD-WATCH verdicts)
    from gpudoctor.registry import registered

    spec = registered(fid)
    if spec is None or spec.source != "watch":
        raise KeyError(f"{fid} is not a watch verdict (checks/watch.py)")
    return Finding(fid, spec.name, spec.category, severity, spec.title, message, evidence, fix)


def join_fixes(fixes: list[Fix]) -> Fix | None:
    """Several fixes as one: their actions in order, once each; safe only when all are."""
    if not fixes:
        return None
    if len(fixes) == 1:
        return fixes[0]
    actions: list[Action] = []
    for fx in fixes:
        actions += [a for a in fx.actions if a not in actions]
    safety = (
        Safety.MANUAL
        if all(fx.safety is Safety.MANUAL for fx in fixes)
        else Safety.UNSAFE
        if any(fx.safety is not Safety.SAFE for fx in fixes)
        else Safety.SAFE
    )
    if safety is not Safety.MANUAL and any(a.kind is ActionKind.COMMAND for a in actions):
        safety = Safety.MANUAL  # a fix that mixes edits with instructions is the user's to apply
        actions = [a if a.kind is ActionKind.COMMAND else Action(ActionKind.COMMAND, fix_line(a)) for a in actions]
    return Fix("; ".join(fx.title for fx in fixes), safety, tuple(actions))


def fix_line(a: Action) -> str:
    """One edit of a batch script as the line the user writes."""
    if a.kind is ActionKind.SBATCH_SET:
        return f"#SBATCH --{a.key}={a.value}"
    if a.kind is ActionKind.SBATCH_REMOVE:
        return f"remove #SBATCH --{a.key}"
    if a.kind is ActionKind.SRUN_PREFIX:
        return f"start the launch line with `{('srun ' + (a.value or '')).strip()}`"
    if a.kind is ActionKind.EXPORT_REMOVE:
        return f"remove the assignment of {a.key} before the launch line"
    if a.kind is ActionKind.EXPORT_SET:
        return f"export {a.key}={a.value}"
    if a.kind is ActionKind.OVERRIDE_SET:
        return f"--{a.key}={a.value} on the launch line"
    return str(a.target)


def sampled_traces(node: NodeObservation) -> dict[int, GpuTrace]:
    return {g.index: g for g in node.gpus if g.index in node.allocated and g.samples}


def util_samples(trace: GpuTrace) -> list[int]:
    return [s.util_gpu for s in trace.samples if s.util_gpu is not None]


def job_pids(node: NodeObservation) -> set[int]:
    return {p.pid for p in node.processes}


def listed(items) -> str:
    return ",".join(str(i) for i in items)


def gib(n: float | None) -> str:
    if n is None:
        return "?"
    return f"{n / 2**30:.1f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.0f} MiB"


def secs(s: float | None) -> str:
    if s is None:
        return "?"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"
