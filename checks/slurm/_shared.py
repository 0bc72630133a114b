"""The helpers the SLURM checks share: the job's shape, the evidence it gives, the #SBATCH fix, the GPU request
in the job's own spelling, and the processes each task becomes.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpudoctor import versions
from gpudoctor.job.lightning import lightning_major, lightning_plan
from gpudoctor.job.process_model import python_processes
from gpudoctor.job.shape import JobShape, job_shape
from gpudoctor.model import Action, ActionKind, Fix, Safety, manual
from gpudoctor.readers import slurmfmt


def slurm_shape(facts, ctx) -> JobShape:
    """The job's shape, for a check declared with requires=["slurm-job"] or ["sbatch"]: the runner skips
    the check where there is no job (no --sbatch script, not inside a SLURM job), so here there is one."""
    shape = job_shape(facts, ctx)
    assert shape is not None, 'a check that judges the job\'s shape declares requires=["slurm-job"]'
    return shape


def _script(shape: JobShape, facts) -> str | None:
    """The batch script a directive fix edits: --sbatch, or the running job's (scontrol's Command)."""
    if shape.script:
        return shape.script
    job = (facts.slurm or {}).get("job") or {}
    if str(job.get("BatchFlag")) == "1" and job.get("Command"):
        return job["Command"].split()[0]
    return None


def directive_fix(
    shape: JobShape, facts, title: str, changes: dict, note: str | None = None, srun_prefix: str | None = None
) -> Fix:
    """#SBATCH changes as sbatch_set/sbatch_remove actions on the script (and, with srun_prefix, `srun` put
    before the launch line); a manual fix when no script is known.

    Always `unsafe`: every directive these checks change is a resource request (GPUs, tasks, nodes, CPUs)
    or the launch topology, which changes what the job does (issue 11: safe means meaning-preserving).
    """
    per_node = changes.get("ntasks-per-node")
    if per_node is not None and "ntasks" in shape.directives and "ntasks" not in changes:
        # With --ntasks the per-node count is only a maximum, and --ntasks=16 at 1 per node on 2 nodes
        # cannot be placed: drop --ntasks unless it equals nodes x ntasks-per-node.
        if not (str(per_node).isdigit() and shape.ntasks_option == int(per_node) * (shape.nodes or 0)):
            changes = {**changes, "ntasks": None}
            if "--ntasks " not in title and "--ntasks=" not in title and "--ntasks)" not in title:
                title += ", without --ntasks"  # the title names every edit the fix makes (issue 38)
    target = _script(shape, facts)
    if target:
        actions = tuple(
            Action(ActionKind.SBATCH_SET, target, value=v, key=k)
            if v is not None
            else Action(ActionKind.SBATCH_REMOVE, target, key=k)
            for k, v in changes.items()
        )
        if srun_prefix is not None:
            actions += (Action(ActionKind.SRUN_PREFIX, target, value=srun_prefix),)
        return Fix(title, Safety.UNSAFE, actions)
    lines = [f"#SBATCH --{k}={v}" if v is not None else f"remove #SBATCH --{k}" for k, v in changes.items()]
    if note:
        lines.append(note)
    return manual(title, *lines)


def gpu_request(shape: JobShape, count: int) -> tuple[str, str]:
    """The directive and value asking for `count` GPUs per node, in the spelling the job already uses."""
    d = shape.directives
    if "gpus-per-node" in d or (not shape.from_script and shape.evidence.get("SLURM_GPUS_PER_NODE")):
        return "gpus-per-node", f"{shape.gpu_type}:{count}" if shape.gpu_type else str(count)
    if "gpus" in d and "gres" not in d:
        return "gpus", f"{shape.gpu_type}:{count * (shape.nodes or 1)}" if shape.gpu_type else str(
            count * (shape.nodes or 1)
        )
    return "gres", f"gpu:{shape.gpu_type}:{count}" if shape.gpu_type else f"gpu:{count}"


def shape_evidence(shape: JobShape, **extra) -> dict:
    out = dict(shape.evidence)
    out.update({k: v for k, v in extra.items() if v is not None})
    return out


def _slurm_version(facts) -> tuple[int, ...] | None:
    return versions.parse((facts.slurm or {}).get("version"))


# Lightning 2.0 (March 2023) is the current major release; 1.x is end-of-life (no releases since 1.9.5).
CURRENT_LIGHTNING_MAJOR = 2


def lightning_major_or_current(facts) -> tuple[int, str | None]:
    """The installed Lightning's major version; when it is not known here (a login node without the training
    env), the current major release, with the note that says so and how to be exact."""
    major = lightning_major(facts)
    if major is not None:
        return major, None
    return CURRENT_LIGHTNING_MAJOR, (
        f"judged as Lightning {CURRENT_LIGHTNING_MAJOR}.x, the current major "
        "release (1.x is end-of-life): the installed version is not known here; "
        "run with --python <the training env's python> to judge the one the job uses"
    )


def ranks_per_task(shape: JobShape, facts) -> tuple[int | None, str]:
    """Processes each SLURM task becomes (1 for plain python), with the reason."""
    if shape.launcher == "lightning":
        major, assumed = lightning_major_or_current(facts)
        plan = lightning_plan(shape, major)
        if plan.spawns:
            return plan.devices, f"Lightning starts {plan.devices} process(es) per task ({plan.devices_source})"
        if plan.spawns is False:
            note = " (version assumed, see GD-SLURM-005)" if assumed else ""
            return 1, f"Lightning {major}.x runs one rank per SLURM task{note}"
        return None, "depends on the Lightning version (see GD-SLURM-005)"
    if shape.launcher == "python" and shape.from_script:
        return python_processes(shape)  # a spawning program starts its own processes
    if shape.procs_per_task:
        return shape.procs_per_task, f"{shape.launcher} starts {shape.procs_per_task} per task"
    if shape.launcher == "python":
        return python_processes(shape)
    return None, "launcher unknown (give --launcher)"


def same_cpus_per_node(shape: JobShape, old_tasks: int | None, new_tasks: int) -> dict:
    """{'cpus-per-task': N} keeping the CPUs the job asks per node when its tasks per node change
    (1 task x 128 CPUs becomes 8 tasks x 16, not 8 x 128); {} when it cannot be kept exactly."""
    cpt = shape.directives.get("cpus-per-task") if shape.from_script else None
    if cpt is None or not str(cpt).isdigit() or not old_tasks or not new_tasks:
        return {}
    total = int(cpt) * old_tasks
    if total % new_tasks or total < new_tasks or total // new_tasks == int(cpt):
        return {}
    return {"cpus-per-task": str(total // new_tasks)}


def env_int(env: Mapping[str, str], name: str) -> int | None:
    try:
        return slurmfmt.parse_int(env[name], name) if name in env else None
    except slurmfmt.SlurmFormatError:
        return None


def known_node_cpus(facts, ctx) -> int | None:
    """The CPUs of a node the job lands on, only where gpudoctor knows them: the node a --node-snapshot
    recorded or the one it runs on inside the job, else the fewest of the partition's node types that have
    GPUs (`scontrol show node` CPUTot). None otherwise: a CPU count for a fix is never guessed (issue 38)."""
    inside = ctx.sbatch is None and bool(facts.env.get("SLURM_JOB_ID"))  # gpudoctor runs on the job's node
    if (ctx.node_facts and facts.has("nvidia")) or inside:
        n = facts.host.get("cpu_count_logical")
        return n if isinstance(n, int) and n > 0 else None
    cluster = facts.cluster
    if not cluster.get("available"):
        return None
    types = [t for t in cluster.get("node_types") or [] if t.get("cpus") and t.get("gpus")]
    return min(t["cpus"] for t in types) if types else None
