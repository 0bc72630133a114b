"""GD-WATCH-001: allocated GPUs no process of the job uses, with the likely cause and the batch script's own
fixes (the rule is judge.py's docstring). Pure."""

from __future__ import annotations

import statistics

from gpudoctor.model import Finding, Fix, Severity, manual
from gpudoctor.readers import cudavis
from gpudoctor.watch.processes import Rank, ranks_on
from gpudoctor.watch.samples import GpuTrace, NodeObservation
from gpudoctor.watch.verdict import (
    HELD_BYTES,
    IDLE_UTIL,
    job_pids,
    join_fixes,
    listed,
    make,
    sampled_traces,
    secs,
    util_samples,
)

# The batch-script checks that explain idle GPUs (checks/slurm/), in the order their fixes are combined.
CAUSE_CHECKS = ("GD-SLURM-003", "GD-SLURM-010", "GD-SLURM-005")


def _unused_by_nvml(node: NodeObservation) -> tuple[list[int], dict]:
    traces, pids = sampled_traces(node), job_pids(node)
    unused, util = [], {}
    for g in node.allocated:
        t = traces.get(g)
        if t is None:
            continue
        utils = util_samples(t)
        median = statistics.median(utils) if utils else None
        util[g] = median
        on_it = any(pid in pids for s in t.samples for pid, _ in s.processes)
        if not on_it and median is not None and median <= IDLE_UTIL and not _unknown_holder(t, node):
            unused.append(g)
    return unused, util


def _unknown_holder(t: GpuTrace, node: NodeObservation) -> bool:
    """Something holds the GPU that /proc cannot name: a PID NVML lists that the node's /proc does not show, or
    memory held with no process listed -- inside a container NVML's PIDs are the host's. It may be the job's."""
    pids = {pid for s in t.samples for pid, _ in s.processes}
    if pids - job_pids(node) - set(node.others):
        return True
    used = [s.mem_used_bytes for s in t.samples if s.mem_used_bytes is not None]
    return not pids and bool(used) and statistics.median(used) >= HELD_BYTES


def unused_gpus(node: NodeObservation, script_causes: list[Finding] | None = None) -> Finding | None:
    """GD-WATCH-001 for one node; None when every allocated GPU is used (or nothing can be said)."""
    if not node.observed or not node.allocated:
        return None
    ranks = ranks_on(node)
    ev: dict = {"node": node.node, "allocated": list(node.allocated), "window_s": node.window_s}
    ev["training_processes"] = [
        {"pid": r.process.pid, "sees": None if r.sees is None else list(r.sees), "runs_on": r.runs_on, "why": r.why}
        for r in ranks
    ]
    certain: list[int]
    likely: list[int] = []
    if sampled_traces(node):
        certain, util = _unused_by_nvml(node)
        ev["median_util_pct"] = util
        basis = (
            f"no process of the job had a context on {'it' if len(certain) == 1 else 'them'} during the "
            f"{secs(node.window_s)} window and utilization stayed at or below {IDLE_UTIL} % (NVML)"
        )
    else:
        known = [r for r in ranks if r.sees is not None]
        seen = {g for r in known for g in r.sees or ()}
        used = {r.runs_on for r in known}
        certain = [g for g in node.allocated if g not in seen]
        if len(known) < len(ranks):  # a process whose GPUs cannot be told may use any of them
            certain = []
        likely = [g for g in node.allocated if g in seen and g not in used] if len(known) == len(ranks) else []
        basis = "no training process of the job can see " + ("it" if len(certain) == 1 else "them")
        basis += " (each process's own CUDA_VISIBLE_DEVICES, read from /proc; NVML was not readable)"
    if not certain and not likely:
        return None
    n = len(node.allocated)
    parts = []
    if certain:
        parts.append(f"GPU(s) {listed(certain)}: {basis}")
    if likely:
        users = [r for r in ranks if r.sees and set(likely) & set(r.sees)]
        parts.append(
            f"GPU(s) {listed(likely)}: only "
            + "; ".join(f"{r.describe()}, which runs on GPU {r.runs_on} ({r.why}){_helpers(r, node)}" for r in users)
            + " can use them: idle unless the program drives several GPUs itself"
        )
    cause = _cause(ranks, n)
    overrides = overridden(node, ranks)
    if overrides:
        cause += ". " + "; ".join(
            f"PID {r.process.pid}'s CUDA_VISIBLE_DEVICES={r.process.env.get(cudavis.VARIABLE)} was set by the job, "
            f"not by SLURM (SLURM set {slurm} for its step)"
            for r, slurm in overrides
        )
    ev.update(unused=certain, unused_by_convention=likely, cause=cause)
    fix = _script_fix(script_causes or [])
    if overrides:
        leave = manual(
            "Leave CUDA_VISIBLE_DEVICES to SLURM",
            *sorted(
                {
                    f"do not set CUDA_VISIBLE_DEVICES={r.process.env.get(cudavis.VARIABLE)} before starting "
                    f"`{' '.join(r.process.cmdline)[:60]}`; SLURM sets it"
                    for r, _ in overrides
                }
            ),
        )
        fix = join_fixes([fix, leave] if fix is not None else [leave])
    if script_causes:
        ev["batch_script"] = {f.id: f.message for f in script_causes}
    msg = f"{node.node}: {len(certain) + len(likely)} of {n} allocated GPU(s) unused -- " + "; ".join(parts)
    msg += f". {cause}"
    if script_causes:
        msg += ". The batch script says why: " + " ".join(f"{f.id}: {f.message}" for f in script_causes)
    elif fix is None:
        fix = manual(
            f"Start one process per GPU on {node.node} ({n}), or request only the GPUs the job uses",
            f"srun --ntasks-per-node={n} <the training command>, or one task per node running "
            f"torchrun --nproc-per-node={n} <the training script>",
        )
    return make("GD-WATCH-001", Severity.FAIL if certain else Severity.WARN, msg, fix, **ev)


def _helpers(rank: Rank, node: NodeObservation) -> str:
    """Its Python children, which may be DataLoader workers or workers of its own on other GPUs
    (torch.multiprocessing.spawn sets no LOCAL_RANK): said, since /proc cannot tell them apart."""
    children = [p for p in node.processes if p.ppid == rank.process.pid and p.runs_python]
    if not children:
        return ""
    return (
        f"; it has {len(children)} Python child process(es): DataLoader workers, or workers of its own that may "
        "use the other GPUs"
    )


def _cause(ranks: list[Rank], gpus: int) -> str:
    if not ranks:
        return f"No training process of the job runs on this node ({gpus} GPU(s) allocated)"
    listed = "; ".join(r.describe() for r in ranks[:4]) + (f"; and {len(ranks) - 4} more" if len(ranks) > 4 else "")
    if len(ranks) < gpus:
        return f"Likely cause: {len(ranks)} training process(es) where {gpus} were meant (one per GPU): {listed}"
    return f"Training processes: {listed}"


def overridden(node: NodeObservation, ranks: list[Rank]) -> list[tuple[Rank, str]]:
    """Training processes whose CUDA_VISIBLE_DEVICES is not the value SLURM set for their step (read from the
    step's task leader, whose environment SLURM wrote), with SLURM's value."""
    pids = {p.pid for p in node.processes}
    slurm: dict[str | None, str] = {}
    for p in node.processes:
        if p.ppid not in pids and cudavis.VARIABLE in p.env:
            slurm.setdefault(p.env.get("SLURM_STEP_ID"), p.env[cudavis.VARIABLE])
    out = []
    for r in ranks:
        mine = r.process.env.get(cudavis.VARIABLE)
        theirs = slurm.get(r.process.env.get("SLURM_STEP_ID"))
        if r.process.ppid in pids and mine is not None and theirs is not None and mine != theirs:
            out.append((r, theirs))
    return out


def _script_fix(causes: list[Finding]) -> Fix | None:
    """The batch-script checks' own fixes, joined into one (each check's rule stays in checks/slurm/)."""
    return join_fixes([f.fix for f in causes if f.fix is not None])
