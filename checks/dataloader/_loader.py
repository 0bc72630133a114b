"""The DataLoader's settings and the CPUs each rank has for its workers; shared by the dataloader checks."""

from __future__ import annotations

from gpudoctor.job.env import job_env, probe_env
from gpudoctor.job.layout import Known, env_int, in_srun_step
from gpudoctor.model import Action, ActionKind, Fix, Safety
from gpudoctor.readers.dlconfig import LoaderSettings, from_context


def loader_settings(facts, ctx) -> LoaderSettings:
    """The DataLoader settings of a check declared with requires=["loader-settings"] (the runner skips it
    when there are none)."""
    settings = from_context(ctx, job_env(facts, ctx))
    assert settings is not None, 'a check that reads the settings declares requires=["loader-settings"]'
    return settings


def worker_count(settings: LoaderSettings) -> int:
    """num_workers of a check declared with requires=["loader-settings", "loader-workers"] (the runner skips it
    when num_workers is not stated or negative)."""
    workers = settings.value("num_workers")
    assert isinstance(workers, int) and workers >= 0, 'a check that counts workers declares requires="loader-workers"'
    return workers


def change_setting(settings, name: str, value, title: str) -> Fix:
    """An unsafe fix: it changes what the job does. A yaml edit when the key's place is known."""
    where = settings.where(name)
    if settings.live or where is None:
        return Fix(f"{title} (DataLoader({name}={value}))", Safety.UNSAFE)
    return Fix(title, Safety.UNSAFE, (Action(ActionKind.YAML_SET, settings.source, value, where),))


def cpu_budget(facts) -> Known:
    host = facts.host
    allowed = host.get("cpus_allowed_count") or host.get("cpu_count_logical")
    limit = (host.get("container") or {}).get("cpu_limit")
    if limit and allowed and limit < allowed:
        return Known(max(1, int(limit)), f"container CPU quota {limit:g}")
    return Known(allowed, "CPUs this process may run on") if allowed else Known(None)


def script_cpu_budget(facts, ctx, lay) -> tuple[Known, Known] | None:
    """Before submission (--sbatch, also with a --node-snapshot): (CPUs one task of the job gets, ranks sharing them),
    from the batch script rather than this host's CPUs; None otherwise. With srun each task gets
    --cpus-per-task CPUs for its own ranks; without srun the one batch-shell task holds every rank."""
    from gpudoctor.job.shape import job_shape

    if ctx.sbatch is None or "SLURM_JOB_ID" in probe_env(
        facts
    ):  # inside the job, SLURM's grant is this process's CPU set
        return None
    shape = job_shape(facts, ctx)
    if shape is None:
        return None
    if shape.srun_launch and shape.srun_cpus_per_task and shape.srun_cpus_per_task > 0:
        cpus = Known(shape.srun_cpus_per_task, "srun --cpus-per-task in the batch script, per task")
    elif shape.cpus_per_task:
        cpus = Known(shape.cpus_per_task, "#SBATCH --cpus-per-task, per task")
    else:
        cpus = Known(None, "the batch script sets no --cpus-per-task (see GD-SLURM-008)")
    ranks = lay.local_ranks.value or 1
    tasks = shape.tasks_here or 1
    if shape.srun_launch and tasks > 1:
        return cpus, Known(max(1, ranks // tasks), f"{ranks} rank(s) per node in {tasks} srun task(s)")
    return cpus, Known(ranks, lay.local_ranks.source or "assumed: one process")


def job_resources(evidence: dict) -> dict:
    from gpudoctor.job.target import JOB_RESOURCES, JUDGED_FOR

    return {**evidence, JUDGED_FOR: JOB_RESOURCES}


def ranks_sharing_cpus(facts, ctx, lay) -> Known:
    """How many ranks share the CPU set this probe saw.

    torchrun, Lightning and mp.spawn start all ranks of a node inside one CPU set. srun starts
    one task per rank; each task has a CPU set of its own only when SLURM binds tasks to CPUs,
    which shows as an affinity smaller than the job's CPUs on the node (SLURM_CPUS_ON_NODE).
    """
    env = probe_env(facts)  # the CPU set this probe ran in
    allowed = facts.host.get("cpus_allowed_count")
    if lay.srun_per_rank and in_srun_step(env) and allowed:
        on_node = env_int(env, "SLURM_CPUS_ON_NODE") or facts.host.get("cpu_count_logical")
        if on_node and allowed < on_node:
            return Known(1, f"srun task bound to {allowed} of the node's {on_node} CPUs")
    if lay.local_ranks.known:
        return lay.local_ranks
    return Known(1, "assumed: one process")


def is_wsl(facts) -> bool:
    """WSL kernels carry 'microsoft' in their release string (5.15.153.1-microsoft-standard-WSL2)."""
    return "microsoft" in str(facts.host.get("kernel") or "").lower()
