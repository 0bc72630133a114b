"""The report's first lines around the checks: what is judged, the nodes the job lands on, the rank and
host under a launcher, the fix command. Nothing here reads the machine: the rank label comes from the
environment the caller gives (a replayed snapshot's own) and the facts' host. Rendering only: which
partition to ask about and a --node-snapshot merged in as the job's node are decided with the target
(gpudoctor.job.target).
"""

from __future__ import annotations

import os

from gpudoctor import shellquote
from gpudoctor.facts import Facts
from gpudoctor.report.result import View


def _mib(n: int | None) -> str:
    if not n:
        return "memory not known"
    return f"{n / 1024:,.0f} GiB" if n >= 10 * 1024 else f"{n:,} MiB"


def node_lines(facts: Facts, target, ctx) -> list[str]:
    """What the report can say about the nodes the job lands on."""
    if target.kind != "job":
        return []
    if target.nodes:
        gpus = facts.gpus
        names = sorted({str(g.get("name") or "GPU") for g in gpus})
        what = f"{len(gpus)}x {', '.join(names)}" if gpus else "no NVIDIA GPU"
        return [f"node: {facts.host.get('hostname') or 'recorded node'} from {target.nodes} ({what})"]
    cluster = facts.cluster
    if not cluster:
        return []
    if not cluster.get("available"):
        if not ctx.sbatch:  # a config alone names no partition: the cluster's silence says nothing about the job
            return []
        return [
            f"nodes: not known ({cluster.get('reason', 'cluster not queried')}); "
            "give --node-snapshot F recorded on a compute node (gpudoctor snapshot -o F)"
        ]
    lines: list[str] = []
    name = cluster.get("partition")
    source = cluster.get("partition_source")
    for t in cluster.get("node_types") or []:
        gpu_text = f"{t['gpus']}x {t['gpu_type'] or 'GPU'}" if t.get("gpus") else "no GPUs"
        cpus = f"{t['cpus']} CPUs" if t.get("cpus") else "CPUs not known"
        feats = f", features {','.join(t['features'])}" if t.get("features") else ""
        memory = _mib(t.get("memory_mb"))
        what = f"{t['count']} node(s) with {gpu_text}, {cpus}, {memory}{feats}"
        lines.append(f"nodes: partition {name} ({source}): {what}")
    if not lines:
        lines.append(f"nodes: partition {name} has no nodes listed")
    if len(lines) > 3:
        lines = lines[:3] + [f"nodes: ... {len(lines) - 3} more node types (--json)"]
    return lines


def rank_label(env: dict, hostname: str | None) -> str | None:
    """'rank 3/8 on gpu07' for a task started by srun or a launcher; None for a lone process."""
    rank = env.get("RANK") or env.get("SLURM_PROCID")
    if rank is None:
        return None
    size = env.get("WORLD_SIZE") or env.get("SLURM_NTASKS") or env.get("SLURM_STEP_NUM_TASKS")
    host = hostname or env.get("SLURMD_NODENAME") or env.get("HOSTNAME") or "this host"
    return f"rank {rank}{'/' + size if size else ''} on {host}"


def fix_command(ctx, python: str | None = None, node_snapshot: str | None = None) -> str:
    """`gpudoctor fix --apply` with this run's inputs, so the edits it writes are the ones shown."""
    parts = ["gpudoctor", "fix", "--apply"]
    if ctx.sbatch_path:
        parts += ["--sbatch", ctx.sbatch_path]
    if ctx.config_path:
        parts += ["--config", ctx.config_path]
    if ctx.launcher:
        parts += ["--launcher", ctx.launcher]
    if ctx.expect_gpus is not None:
        parts += ["--expect-gpus", str(ctx.expect_gpus)]
    if python:
        parts += ["--python", python]
    return shellquote.command(parts)  # a file name with any bytes is copy-pasted exactly


def header(version: str, facts: Facts, target, snapshot: str | None) -> str:
    """The first line: what this report judges."""
    line = f"gpudoctor {version} · {target.label}"
    if snapshot:
        line += f" · replaying {os.path.basename(snapshot)}"
        if facts.meta.get("collected_at"):
            line += f", recorded {facts.meta['collected_at']}"
    return line


def machine_line(facts: Facts) -> str | None:
    """The machine's GPUs and torch, said once under the header."""
    parts = []
    gpus = facts.gpus
    if gpus:
        names = sorted({str(g.get("name") or "GPU") for g in gpus})
        driver = facts.nvidia.get("driver_version")
        parts.append(f"{len(gpus)} GPU(s): {', '.join(names)}" + (f", driver {driver}" if driver else ""))
    elif facts.has("nvidia"):
        parts.append("no NVIDIA GPU")
    version = facts.torch.get("version") or facts.torch_meta.get("version")
    if version:
        parts.append(f"torch {version}")
    return " · ".join(parts) if parts else None


def json_target(target, outside) -> dict:
    """The report's top-level "target" object: what the verdict is about and which findings stay outside it."""
    return {**target.to_dict(), "outside_verdict": sorted({f.id for f in outside})}


def view(version: str, facts: Facts, ctx, target, args, rank_env: dict) -> View:
    """The text report's View for this run. rank_env: the environment whose rank the report is labelled with
    (the snapshot's own for a replay, this process's for a live run: the caller decides, never the renderer)."""
    lines = []
    machine = machine_line(facts)
    if machine and target.machine_in_verdict:
        lines.append(machine)
    nodes = node_lines(facts, target, ctx)
    unknown = [line for line in nodes if line.startswith("nodes: not known")]  # GD-SLURM-020 says it too
    lines.extend(line for line in nodes if line not in unknown)
    from gpudoctor.job.target import in_job_environment

    lone = target.kind == "machine" and not in_job_environment(facts.env) and not getattr(args, "snapshot", None)
    if lone and facts.has("nvidia") and not facts.nvidia.get("available") and ctx.gpus_expected:
        lines.append("no GPU here: on a login node, `gpudoctor check --sbatch job.slurm` judges the job instead")
    return View(
        header=header(version, facts, target, getattr(args, "snapshot", None)),
        lines=lines,
        more_lines=unknown,
        target=target,
        fix_command=fix_command(ctx, getattr(args, "python", None)),
        subject="this task" if rank_label(rank_env, None) else None,
        label=rank_label(rank_env, facts.host.get("hostname")),
    )
