"""CPUs per task: srun passes --cpus-per-task on (GD-SLURM-007), and each task has CPUs for its loader
workers (GD-SLURM-008).
"""

from __future__ import annotations

from collections.abc import Mapping

from gpudoctor import versions
from gpudoctor.checks.slurm._shared import (
    directive_fix,
    env_int,
    known_node_cpus,
    ranks_per_task,
    shape_evidence,
    slurm_shape,
)
from gpudoctor.job.env import job_env, probe_env
from gpudoctor.job.shape import JobShape
from gpudoctor.model import Fix, Outcome, fail, info, manual, passed, set_env_reference, skip, warn
from gpudoctor.registry import check

FIXED_AGAIN = (23, 11)  # srun reads SLURM_CPUS_PER_TASK again (see the module docstring)


def _slurm_version(facts) -> tuple[int, ...] | None:
    return versions.parse((facts.slurm or {}).get("version"))


# ---------------------------------------------------------------- GD-SLURM-007


@check(
    id="GD-SLURM-007",
    scope="job",
    name="srun-drops-cpus-per-task",
    category="slurm",
    title="srun tasks get the CPUs per task the job asked for",
    needs=["env", "slurm", "host"],
    requires=["slurm-job"],
    what="For a job with --cpus-per-task above 1 whose training starts with srun: is SRUN_CPUS_PER_TASK "
    "exported or `srun --cpus-per-task` given; which SLURM version runs (`srun --version`); and, inside a "
    "task, how many CPUs the task may really use (sched_getaffinity).",
    why="SLURM 22.05 to 23.02 srun no longer reads SLURM_CPUS_PER_TASK (release notes 22.05; 23.11 reads it again): a "
    "step started with plain `srun` gets the default of one CPU per task, and with CPU binding every rank and all its "
    "DataLoader workers run on one core. The job runs, many times slower.",
    fix="In the batch script, before srun: `export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK` (harmless on "
    "older SLURM), or `srun --cpus-per-task=$SLURM_CPUS_PER_TASK ...`.",
)
def srun_drops_cpus_per_task(facts, ctx):
    shape = slurm_shape(facts, ctx)
    cpt = shape.cpus_per_task
    version = _slurm_version(facts)
    raw_version = (facts.slurm or {}).get("version")
    ev = shape_evidence(shape, slurm_version=raw_version)
    if not cpt or cpt <= 1:
        return passed("no --cpus-per-task above 1 to pass on", **ev)
    if shape.srun_launch is False:
        return passed(f"the training runs in the batch shell (no srun), which has the job's {cpt} CPUs per task", **ev)
    if shape.from_script and not shape.srun_launch and not ctx.sbatch.srun_lines:
        # A finding only where its cause is (issue 25): no srun, no srun step, nothing to inherit.
        return passed(
            f"the script starts no srun step itself (srun appears nowhere in it): its commands run in the batch shell, "
            f"which has the job's {cpt} CPUs per task",
            **ev,
        )
    fix = set_env_reference(
        "SRUN_CPUS_PER_TASK",
        "SLURM_CPUS_PER_TASK",
        title="export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK before srun (or srun --cpus-per-task)",
    )
    allowed = facts.host.get("cpus_allowed_count")
    in_task = not shape.from_script and ("SLURM_STEP_ID" in (here := probe_env(facts)) or "SLURM_STEPID" in here)
    if in_task and isinstance(allowed, int):
        return _cpus_this_task_may_use(allowed, cpt, version, raw_version, fix, ev)
    if shape.srun_cpus_per_task:
        told = (
            "srun --cpus-per-task"
            if shape.srun_options and "cpus-per-task" in shape.srun_options
            else "SRUN_CPUS_PER_TASK"
        )
        value = "" if shape.srun_cpus_per_task == -1 else f"={shape.srun_cpus_per_task}"
        return passed(f"{told}{value} passes --cpus-per-task={cpt} on to srun", **ev)
    return _srun_inherits_by_version(shape, cpt, version, raw_version, fix, ev)


def _cpus_this_task_may_use(
    allowed: int, cpt: int, version: tuple[int, ...] | None, raw_version: str | None, fix: Fix, ev: dict
) -> Outcome:
    """Inside an srun task: the CPUs its affinity mask allows, against --cpus-per-task."""
    ev["cpus_this_task_may_use"] = allowed
    if allowed < cpt:
        if version is not None and (22, 5) <= version < FIXED_AGAIN:
            cause = f"SLURM {raw_version} srun does not inherit --cpus-per-task unless SRUN_CPUS_PER_TASK is exported"
        else:
            # srun was told, or inherits it: the node gave fewer (binding, or fewer CPUs than slurm.conf declares)
            cause = (
                "the step was given fewer CPUs than asked (srun's "
                "--cpus-per-task, CPU binding, or the node's real CPUs)"
            )
        return fail(
            f"this task may use {allowed} CPU(s) (its affinity mask) but the job asked --cpus-per-task={cpt}: {cause}",
            fix,
            **ev,
        )
    return passed(f"this task may use {allowed} CPU(s) for --cpus-per-task={cpt}", **ev)


def _srun_inherits_by_version(
    shape: JobShape, cpt: int, version: tuple[int, ...] | None, raw_version: str | None, fix: Fix, ev: dict
) -> Outcome:
    """Nothing passes --cpus-per-task on to srun: whether srun inherits it depends on the SLURM version."""
    if version is not None and version < (22, 5):
        return passed(f"SLURM {raw_version} srun still inherits --cpus-per-task={cpt} (changed in 22.05)", **ev)
    if version is not None and version >= FIXED_AGAIN:
        return passed(
            f"SLURM {raw_version} srun inherits --cpus-per-task={cpt} again (SLURM_CPUS_PER_TASK is read since 23.11)",
            **ev,
        )
    where = f"line {shape.launch_lineno}: srun" if shape.from_script and shape.launch_lineno else "srun"
    if version is None:
        ev["SLURM 22.05 to 23.02"] = (
            f"{where} does not inherit --cpus-per-task={cpt} (SRUN_CPUS_PER_TASK is not set): each task may get "
            "1 CPU; 23.11 and later inherit it again"
        )
        return info(f"on SLURM 22.05-23.02 {where} gets 1 CPU per task, not {cpt} (version not known here)", fix, **ev)
    which = f"SLURM {raw_version}"
    if not shape.from_script and not shape.srun_launch and (shape.tasks_here or 1) <= 1 and (shape.nodes or 1) <= 1:
        return info(
            f"{which}: if the training is started with srun from this shell, srun will not inherit "
            f"--cpus-per-task={cpt}; export SRUN_CPUS_PER_TASK",
            fix,
            **ev,
        )
    return warn(
        f"{which}: {where} does not inherit --cpus-per-task={cpt} and SRUN_CPUS_PER_TASK is not set, so each task "
        "may get 1 CPU for its rank and DataLoader workers",
        fix,
        **ev,
    )


# ---------------------------------------------------------------- GD-SLURM-008


@check(
    id="GD-SLURM-008",
    name="cpus-per-task-too-few-for-workers",
    category="slurm",
    title="Each SLURM task has CPUs for its DataLoader workers",
    needs=["env"],
    requires=["slurm-job"],
    scope="job",
    what="Compares the CPUs a SLURM task gets (--cpus-per-task / SLURM_CPUS_PER_TASK, else SLURM_CPUS_ON_NODE "
    "over the tasks) with what its ranks need: (num_workers + 1) per rank, times the ranks the task starts "
    "(torchrun --nproc-per-node, Lightning's own launcher). num_workers comes from --config.",
    why="Every rank runs its main process plus num_workers loader processes; squeezed onto fewer CPUs they "
    "take turns and the GPUs wait for data. SLURM gives one CPU per task unless asked for more.",
    fix="Ask for enough CPUs: `#SBATCH --cpus-per-task=<ranks per task x (num_workers + 1)>`, or lower num_workers.",
)
def cpus_per_task_too_few_for_workers(facts, ctx):
    shape = slurm_shape(facts, ctx)
    workers = _num_workers(ctx, job_env(facts, ctx))
    if workers is None:
        return skip("num_workers is not known (give the training config with --config)", **shape_evidence(shape))
    per_task, why = ranks_per_task(shape, facts)
    per_task = per_task or 1
    need = per_task * (workers + 1)
    cpus, source = _task_cpus(shape, probe_env(facts))
    ev = shape_evidence(
        shape,
        num_workers=workers,
        ranks_per_task=per_task,
        cpus_per_task_needed=need,
        cpus_per_task=cpus,
        cpus_source=source,
    )
    if cpus is None or cpus < need:
        fix = _cpus_fix(shape, facts, ctx, need, per_task, workers)
        if cpus is None:
            ev["default"] = "SLURM gives 1 CPU per task unless asked (or the cluster sets DefCpuPerGPU)"
            return warn(
                f"no --cpus-per-task: 1 CPU per task for {per_task} rank(s) x ({workers} workers + 1)", fix, **ev
            )
        return warn(
            f"{cpus} CPU(s) per task for {per_task} rank(s) x ({workers} workers + 1) = {need} processes", fix, **ev
        )
    return passed(
        f"{cpus} CPU(s) per task ({source}) for {per_task} rank(s) x ({workers} workers + 1) = {need} processes", **ev
    )


def _cpus_fix(shape: JobShape, facts, ctx, need: int, per_task: int, workers: int) -> Fix:
    """--cpus-per-task for the loaders, proposed only from a node size gpudoctor knows (the partition's
    nodes, a --node-snapshot); else what to ask for per rank, for the user to check against the node."""
    node = known_node_cpus(facts, ctx)
    tasks = shape.tasks_here or 1
    if node is None:
        return manual(
            f"Ask for {workers + 1} CPUs per rank ({need} per task) if the node has {need * tasks}, "
            "else lower num_workers",
            f"#SBATCH --cpus-per-task={need}",
            "sinfo -o '%P %c'   # the CPUs of each partition's nodes",
        )
    if need * tasks <= node:
        return directive_fix(shape, facts, f"Ask for --cpus-per-task={need}", {"cpus-per-task": str(need)})
    fit = node // tasks
    return manual(
        f"The node's {node} CPUs give {fit} per task: --cpus-per-task={fit} and "
        f"num_workers={max(fit // per_task - 1, 0)}",
        f"#SBATCH --cpus-per-task={fit}",
    )


def _num_workers(ctx, env: dict) -> int | None:
    from gpudoctor.readers import dlconfig

    settings = dlconfig.from_context(ctx, env)
    value = settings.value("num_workers") if settings else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _task_cpus(shape: JobShape, env: Mapping[str, str]) -> tuple[int | None, str | None]:
    if shape.srun_launch and shape.srun_cpus_per_task and shape.srun_cpus_per_task > 0:
        return shape.srun_cpus_per_task, "srun --cpus-per-task / SRUN_CPUS_PER_TASK"
    if shape.cpus_per_task:
        return shape.cpus_per_task, "--cpus-per-task" if shape.from_script else "SLURM_CPUS_PER_TASK"
    if not shape.from_script and env.get("SLURM_CPUS_ON_NODE") and shape.tasks_here:
        n = env_int(env, "SLURM_CPUS_ON_NODE")
        if n:
            return n // max(shape.tasks_here, 1), f"SLURM_CPUS_ON_NODE={n} over {shape.tasks_here} task(s)"
    return None, None
