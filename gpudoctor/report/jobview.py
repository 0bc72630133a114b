"""`gpudoctor check --sbatch F --show-job`: the model of the job as it will run (gpudoctor/job/model.py), as text.

Per node, each task's launcher and the processes it starts with their rank, world size, GPUs and rendezvous;
what is unknown. A small job is listed process by process; nodes that look alike are folded into one line
("nodes 2..15: like node 1"), so a 64-node job still fits a screen. Shows what the model holds; decides nothing.
"""

from __future__ import annotations

from gpudoctor.job.model import JobModel, Process, Task, Unknown, known
from gpudoctor.sanitize import clean

MAX_LISTED = 16  # processes listed one by one; above this, one line per task


def _ranks(values: list) -> str:
    """[0, 1, 2, 3] -> '0..3'; unknown or scattered values as a short list."""
    if not values:
        return "-"
    if any(not known(v) for v in values):
        return "?"
    if values == list(range(values[0], values[0] + len(values))):
        return str(values[0]) if len(values) == 1 else f"{values[0]}..{values[-1]}"
    shown = ",".join(str(v) for v in values[:8])
    return shown + (",..." if len(values) > 8 else "")


def _gpus(value) -> str:
    if isinstance(value, Unknown):
        return "?"
    return ",".join(value) if value else "none"


def _rendezvous(p: Process) -> str:
    r = p.rendezvous
    if r is None:
        return "-"
    reaches = r.reaches
    where = "?" if not known(reaches) else f"node {reaches}" if isinstance(reaches, int) else str(reaches)
    return f"{r.describe()} -> {where}"


def _task_line(task: Task, procs: list[Process]) -> str:
    la = task.launcher
    head = f"task {task.procid} (local {task.localid}): {la.kind}"
    if la.kind == "unknown":
        return f"{head}: {la.why_unknown}"
    if not procs:
        return f"{head}: its processes are unknown"
    spawned = " (spawned)" if any(p.spawned for p in procs) else ""
    worlds = {str(p.world) for p in procs}
    sizes = "/".join(sorted({str(p.world_size) for p in procs}))
    return (
        f"{head}, {len(procs)} process(es){spawned}: ranks {_ranks([p.rank for p in procs])} of {sizes}"
        f" [{procs[0].rank_source}], GPUs {_gpus(task.visible_gpus)}, rendezvous {_rendezvous(procs[0])}"
        + (f", world {next(iter(worlds))}" if len(worlds) == 1 else "")
    )


def _process_line(p: Process) -> str:
    return (
        f"    rank {p.rank} of {p.world_size}  local {p.local_rank}  SLURM_PROCID {p.procid}  "
        f"GPU {p.gpu if p.gpu is not None else 'none'} of {_gpus(p.visible_gpus)}"
    )


def _signature(model: JobModel, node: int) -> tuple:
    """What a node's line says apart from its index and rank numbers (nodes alike are folded)."""
    out = []
    for t in (t for t in model.tasks if t.node == node):
        procs = [p for p in model.processes() if p.procid == t.procid]
        rdv = procs[0].rendezvous if procs else None
        out.append(
            (
                t.localid,
                t.launcher.kind,
                len(procs),
                _gpus(t.visible_gpus),
                rdv.describe() if rdv else None,
                str(procs[0].world_size) if procs else None,
                procs[0].rank_source if procs else None,
                known(rdv.reaches) and rdv.reaches == node if rdv else None,  # reaches itself (loopback)
            )
        )
    return tuple(out)


def render(model: JobModel) -> str:
    alloc = model.allocation
    script = getattr(model.script, "path", "the script") or "the script"
    lines = [
        f"The job as it will run ({script}): {alloc.nodes} node(s), tasks per node {_tasks(alloc.tasks_per_node)}, "
        f"GPUs per node {alloc.gpus_per_node}" + ("" if alloc.srun else "; no srun: the batch shell runs it on node 0")
    ]
    if model.launch is not None:
        lines.append(f"  launch: line {model.launch.line}: {model.launch.text[:160]}")
        if model.tasks and model.tasks[0].wrappers:
            lines.append(f"  wrappers: {' > '.join(model.tasks[0].wrappers)}")
    processes = list(model.processes())
    listed = len(processes) <= MAX_LISTED
    nodes = sorted({t.node for t in model.tasks})
    i = 0
    while i < len(nodes):
        node = nodes[i]
        host = next((p.hostname for p in processes if p.node == node and p.hostname), None)
        lines.append(f"  node {node}" + (f" ({host})" if host else "") + ":")
        for t in (t for t in model.tasks if t.node == node):
            procs = [p for p in processes if p.procid == t.procid]
            lines.append(f"    {_task_line(t, procs)}")
            if listed:
                lines.extend(f"  {_process_line(p)}" for p in procs)
        j = i + 1
        sig = _signature(model, node) if node > 0 else None
        while sig is not None and j < len(nodes) and _signature(model, nodes[j]) == sig:
            j += 1
        if j > i + 1:
            lines.append(f"  nodes {nodes[i + 1]}..{nodes[j - 1]}: like node {node}")
        i = j
    worlds = model.worlds()
    if processes:
        sizes = ", ".join(f"{len(v)}" for v in list(worlds.values())[:8])
        lines.append(
            f"  worlds: {len(worlds)}" + (f" ({sizes} processes)" if worlds else "") + f"; {len(processes)} processes"
        )
    for u in model.unknown:
        lines.append(f"  unknown: {u}")
    for n in model.notes:
        lines.append(f"  note: {n}")
    return "\n".join(clean(line) for line in lines) + "\n"


def _tasks(value) -> str:
    if isinstance(value, Unknown):
        return "?"
    if len(set(value)) == 1:
        return str(value[0])
    return ",".join(str(v) for v in value)
