"""The job's training processes, and which GPUs each can see and runs on (read from /proc on a node; the
rules are judge.py's docstring). Pure."""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpudoctor.model import SPAWNING_LAUNCHERS
from gpudoctor.readers import cudavis, slurmfmt
from gpudoctor.readers.sbatch.launch import describe_command
from gpudoctor.watch.samples import JobProcess, NodeObservation
from gpudoctor.watch.verdict import listed

# Launchers started as `python /path/bin/NAME ...` (their console scripts' shebang): read NAME's own arguments.
LAUNCHER_SCRIPTS = ("torchrun", "accelerate", "deepspeed", "lightning", "fabric")


def _describe(p: JobProcess) -> dict:
    words = list(p.cmdline)
    try:
        desc = describe_command(words)
        script = os.path.basename(desc.get("script") or "")
        if desc.get("launcher") == "python" and script in LAUNCHER_SCRIPTS:
            at = next(i for i, w in enumerate(words) if w == desc["script"])
            desc = describe_command(words[at:])
    except Exception:  # a command line the launch reader cannot follow: judged as a plain process
        return {}
    return desc


def _is_launcher(desc: dict) -> bool:
    if desc.get("launcher") in SPAWNING_LAUNCHERS:
        return True
    return desc.get("launcher") == "lightning" and desc.get("program") in ("lightning", "fabric")


def _is_gpudoctor(desc: dict) -> bool:
    return bool(desc.get("gpudoctor")) or (desc.get("module") or "").startswith("gpudoctor")


def training_processes(processes: tuple[JobProcess, ...]) -> list[JobProcess]:
    """The job's training processes (the module docstring's rule), in PID order."""
    by_pid = {p.pid: p for p in processes}
    desc = {p.pid: _describe(p) for p in processes}
    out = []
    for p in processes:
        d = desc[p.pid]
        if not p.runs_python or _is_launcher(d) or _is_gpudoctor(d):
            continue
        parent = by_pid.get(p.ppid) if p.ppid is not None else None
        pd = desc.get(parent.pid, {}) if parent is not None else {}
        if (
            parent is None
            or not parent.runs_python
            or _is_launcher(pd)
            or p.env.get("LOCAL_RANK") != parent.env.get("LOCAL_RANK")
        ):
            out.append(p)
    return sorted(out, key=lambda p: p.pid)


# ---------------------------------------------------------------- which GPUs a process can see and uses


def _indices(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return slurmfmt.parse_index_list(text)
    except slurmfmt.SlurmFormatError:
        return None


def local_numbering(node: NodeObservation) -> bool:
    """Whether SLURM numbers CUDA_VISIBLE_DEVICES from 0 within each step on this node (devices constrained),
    read from a task leader (a job process whose parent is not one): its value is SLURM's own."""
    pids = {p.pid for p in node.processes}
    for p in node.processes:
        if p.ppid in pids:
            continue
        base = _indices(p.env.get("SLURM_STEP_GPUS") or p.env.get("SLURM_JOB_GPUS"))
        seen = _indices(p.env.get(cudavis.VARIABLE))
        if not base or seen is None:
            continue
        if seen == base:
            return False
        if seen == list(range(len(base))):
            return True
    return False


def visible_gpus(p: JobProcess, node: NodeObservation, local: bool) -> tuple[int, ...] | None:
    """The node's GPU indices process p can use, in CUDA's order; None when they cannot be told (a UUID without
    NVML, an unreadable base)."""
    base = _indices(p.env.get("SLURM_STEP_GPUS") or p.env.get("SLURM_JOB_GPUS")) or list(node.allocated)
    uuids = {g.index: g.uuid for g in node.gpus}
    if local:
        order = base
    else:
        named = _indices(p.env.get(cudavis.VARIABLE)) or []
        order = list(range(max([*base, *node.allocated, *named, -1]) + 1))
    gpus = [{"index": i, "uuid": uuids.get(i)} for i in order]
    value = p.env.get(cudavis.VARIABLE)
    vis = cudavis.parse_visible_devices(value, gpus)
    if value is None:
        return tuple(base)  # SLURM always sets it in a job with GPUs; unset: the step's GPUs
    if any(e.kind in ("gpu_uuid", "mig") for e in vis.entries) and not all(g["uuid"] for g in gpus):
        return None  # a UUID names a GPU only NVML can tell (it was not readable)
    return vis.gpus


@dataclass(frozen=True)
class Rank:
    process: JobProcess
    sees: tuple[int, ...] | None
    runs_on: int | None
    why: str

    def describe(self) -> str:
        p = self.process
        cmd = " ".join(p.cmdline)[:80] or "?"
        seen = "unknown GPUs" if self.sees is None else f"GPU(s) {listed(self.sees)}"
        cvd = p.env.get(cudavis.VARIABLE)
        shown = f"CUDA_VISIBLE_DEVICES={cvd}" if cvd is not None else "CUDA_VISIBLE_DEVICES unset"
        return f"PID {p.pid} `{cmd}` ({shown}: sees {seen})"


def ranks_on(node: NodeObservation) -> list[Rank]:
    local = local_numbering(node)
    out = []
    for p in training_processes(node.processes):
        sees = visible_gpus(p, node, local)
        runs_on, why = None, "unknown"
        if sees:
            lr = p.env.get("LOCAL_RANK")
            if len(sees) == 1:
                runs_on, why = sees[0], "the only GPU it can see"
            elif lr is not None and lr.isdigit() and int(lr) < len(sees):
                runs_on, why = sees[int(lr)], f"cuda:{lr} by the launchers' convention (LOCAL_RANK={lr})"
            else:
                runs_on, why = sees[0], "cuda:0, CUDA's current device until the program picks another"
        out.append(Rank(p, sees, runs_on, why))
    return out
