"""dataloader checks of the worker processes: how many, against the CPUs each rank has, and their OpenMP threads."""

from __future__ import annotations

from gpudoctor.checks.dataloader._loader import (
    change_setting,
    cpu_budget,
    job_resources,
    loader_settings,
    ranks_sharing_cpus,
    script_cpu_budget,
    worker_count,
)
from gpudoctor.job.env import job_env
from gpudoctor.job.layout import Known, intended_launcher, layout
from gpudoctor.model import Action, ActionKind, Fix, Safety, Severity, info, passed, set_env, skip, warn
from gpudoctor.registry import check


@check(
    id="GD-DL-001",
    name="dataloader-workers-oversubscribe-cpus",
    category="dataloader",
    title="DataLoader workers fit the CPUs this task may use",
    needs=["host", "env"],
    requires=["loader-settings", "loader-workers"],
    scope="node",
    defers_to=["GD-SLURM-008"],
    what="Counts ranks sharing this CPU set x (num_workers + 1 main process) and compares it with the CPUs "
    "the process may run on (its affinity mask: a SLURM task's or container's CPU set, or the container's "
    "CPU quota). num_workers is per rank. Inside a SLURM job where GD-SLURM-008, in the same run, already "
    "warns that the task's CPUs are too few, this reports the same shortage as info instead of a second warning.",
    why="Each rank starts its own num_workers processes. A per-GPU figure written as a per-node one "
    "('num_workers: 16  # 2 per GPU') becomes 128 workers on 8 GPUs; more busy processes than CPUs makes "
    "them time-slice, so batches arrive late and the GPUs wait. Worker counts from tables "
    "('3 workers per GPU') only hold for the CPU count they were written for.",
    fix="Set num_workers to at most CPUs / ranks - 1 (e.g. 112 CPUs, 8 ranks: 13), or ask SLURM for more "
    "CPUs per task (--cpus-per-task).",
)
def dataloader_workers_oversubscribe_cpus(facts, ctx):
    settings = loader_settings(facts, ctx)
    workers = worker_count(settings)
    lay = layout(facts, ctx)
    scripted = script_cpu_budget(facts, ctx, lay)
    cpus, sharing = scripted if scripted else (cpu_budget(facts), ranks_sharing_cpus(facts, ctx, lay))
    if not cpus.known:
        return skip(cpus.source if scripted else "the host probe did not report the CPUs this process may use")
    demand = sharing.value * (workers + 1)
    evidence = {
        **settings.evidence(),
        "cpus": f"{cpus.value} ({cpus.source})",
        "ranks_sharing_cpus": f"{sharing.value} ({sharing.source})",
        **lay.evidence(),
    }
    if scripted:
        evidence = job_resources(evidence)
    sum_text = f"{sharing.value} rank(s) x ({workers} workers + 1 main process) = {demand} processes"
    if demand <= cpus.value:
        return passed(f"{sum_text} on {cpus.value} CPUs ({cpus.source})", **evidence)
    suggested = max(1, cpus.value // sharing.value - 1)
    message = (
        f"{settings.describe('num_workers')} is per rank: {sum_text} compete for {cpus.value} CPUs "
        f"({cpus.source}); workers will time-slice and starve the GPUs"
    )
    fix = change_setting(settings, "num_workers", suggested, f"Set num_workers to {suggested} (CPUs / ranks - 1)")
    slurm = _slurm_reports_same_shortage(facts, ctx, cpus)
    if slurm is not None:
        # One shortage, one warning: GD-SLURM-008 carries it with the --cpus-per-task fix.
        return info(
            f"{message}; {SLURM_WORKERS_CHECK} warns about this shortage with the SLURM fix (more --cpus-per-task)",
            fix,
            **evidence,
            reported_by={SLURM_WORKERS_CHECK: slurm},
        )
    return warn(message, fix, **evidence)


SLURM_WORKERS_CHECK = "GD-SLURM-008"


def _slurm_reports_same_shortage(facts, ctx, cpus: Known) -> str | None:
    """GD-SLURM-008's message when, inside a SLURM job and in this same run, it already warns that
    the task's CPUs are too few.

    Both checks count ranks x (num_workers + 1); SLURM-008 against the CPUs SLURM grants a task,
    this one against the CPUs the process may run on, which inside a job is SLURM's grant. A
    container CPU quota is a cause SLURM-008 does not see, so that warning stays here.
    """
    if "container" in (cpus.source or "") or ("SLURM_JOB_ID" not in job_env(facts, ctx) and not ctx.sbatch):
        return None
    # The runner hands over GD-SLURM-008's outcomes (defers_to) when it is in this run.
    for outcome in ctx.deferred.get(SLURM_WORKERS_CHECK, ()):
        if outcome.severity is Severity.WARN:
            return outcome.message
    return None


@check(
    id="GD-DL-002",
    scope="job",
    name="dataloader-loads-in-main-process",
    category="dataloader",
    title="DataLoader uses worker processes on GPU training",
    needs=["host", "env"],
    requires=["gpus-expected", "loader-settings"],
    what="On GPU training, looks for num_workers=0. A Hugging Face TrainingArguments config that leaves "
    "dataloader_num_workers out gets the Trainer's default of 0: reported as info.",
    why="With num_workers=0 every batch is read, decoded and augmented in the training process itself, "
    "between GPU steps: the GPU idles while the CPU works. It is fine only when the data is already in "
    "memory as tensors and cheap to collate.",
    fix="Set num_workers to a few workers per rank (as many as the CPUs allow, see GD-DL-001) and "
    "persistent_workers=True.",
)
def dataloader_loads_in_main_process(facts, ctx):
    settings = loader_settings(facts, ctx)
    default = settings.defaults.get("num_workers")
    if settings.found.get("num_workers") is None and default is not None:
        return _main_process_by_default(facts, ctx, settings, default)
    unknown = settings.workers_unknown()
    if unknown:
        return skip(unknown, **settings.evidence())
    workers = settings.value("num_workers")
    if workers > 0:
        return passed(
            f"{settings.describe('num_workers')}: batches are prepared in worker processes", **settings.evidence()
        )
    suggested = _suggested_workers(facts, ctx)
    return warn(
        f"{settings.describe('num_workers')}: batches are loaded in the training process, so the GPU waits while each "
        "one is read and augmented (fine only for in-memory tensor data)",
        change_setting(settings, "num_workers", suggested, f"Set num_workers to {suggested}"),
        **settings.evidence(),
    )


def _suggested_workers(facts, ctx) -> int:
    lay = layout(facts, ctx)
    scripted = script_cpu_budget(facts, ctx, lay)  # before submission: the job's CPUs, not this host's
    cpus, sharing = (
        scripted if scripted and scripted[0].known else (cpu_budget(facts), ranks_sharing_cpus(facts, ctx, lay))
    )
    return max(1, min(8, (cpus.value or 4) // (sharing.value or 1) - 1))


def _main_process_by_default(facts, ctx, settings, default):
    """The config leaves the workers to a framework whose default is 0 (HF TrainingArguments)."""
    key = default.path
    suggested = _suggested_workers(facts, ctx)
    return info(
        f"{key} is not set, so TrainingArguments' default of {default.value} workers loads every batch in the "
        "training process (fine for tokenized text in memory; slow for images, audio or on-the-fly decoding)",
        Fix(f"Set {key}: {suggested}", Safety.UNSAFE, (Action(ActionKind.YAML_SET, settings.source, suggested, key),)),
        **settings.evidence(),
        default=f"{key}={default.value}",
    )


@check(
    id="GD-DL-004",
    name="dataloader-workers-not-persistent",
    category="dataloader",
    title="DataLoader keeps its workers between epochs",
    needs=[],
    requires=["loader-settings", "loader-workers"],
    scope="job",
    what="With num_workers > 0, looks for persistent_workers=False (the DataLoader default).",
    why="Without persistent workers every epoch (and every validation loop) shuts the workers down and "
    "starts new ones: the dataset is pickled to each worker again and worker_init_fn re-runs. With large "
    "datasets or many workers this is seconds to minutes per epoch of idle GPUs.",
    fix="DataLoader(..., persistent_workers=True). Workers then keep their state across epochs: make sure "
    "per-epoch randomness comes from the sampler (set_epoch) rather than from worker start-up.",
)
def dataloader_workers_not_persistent(facts, ctx):
    settings = loader_settings(facts, ctx)
    workers = worker_count(settings)
    persistent = settings.value("persistent_workers")
    if persistent is None:
        return skip(settings.unknown("persistent_workers"), **settings.evidence())
    if workers == 0:
        return skip("num_workers=0: there are no worker processes to keep", **settings.evidence())
    if persistent:
        return passed(f"{settings.describe('persistent_workers')}", **settings.evidence())
    return info(
        f"{settings.describe('persistent_workers')} with {workers} workers: the workers are re-created every epoch",
        change_setting(settings, "persistent_workers", True, "Set persistent_workers to true"),
        **settings.evidence(),
    )


def omp_threads(env: dict) -> tuple[int | None, str | None]:
    """OMP_NUM_THREADS as OpenMP reads it: the first entry of a comma list; (None, problem) if unreadable."""
    text = env.get("OMP_NUM_THREADS")
    if text is None:
        return None, None
    first = text.split(",", 1)[0].strip()
    # libgomp reads it with strtoul: ASCII digits, and a value past ULONG_MAX (ERANGE) is invalid too
    digits = first.lstrip("0") or "0"
    if first.isascii() and first.isdigit() and len(digits) <= 20 and 0 < int(digits) < 2**64:
        return int(digits), None
    shown = repr(text) if len(text) <= 40 else f"{text[:40]!r}... ({len(text):,} characters)"
    return None, f"OMP_NUM_THREADS={shown} is not a positive integer: OpenMP ignores it and uses every CPU"


@check(
    id="GD-DL-006",
    name="omp-threads-oversubscribe-cpus",
    category="dataloader",
    title="OpenMP threads of all ranks fit the CPUs",
    needs=["host", "env"],
    scope="node",
    what="Ranks sharing this CPU set x OMP_NUM_THREADS, compared with the CPUs the process may use. When "
    "OMP_NUM_THREADS is unset, torchrun sets it to 1 for more than one process per node; other launchers "
    "(Lightning, srun, mp.spawn) leave each rank's thread pool at the number of CPUs it may use.",
    why="torch's CPU operators run on an OpenMP pool in every rank. Eight ranks with a pool of all CPUs each "
    "run eight times more threads than cores, and CPU-side work (data preparation in the main process, "
    "optimizer offload, metrics) slows down through contention.",
    fix="export OMP_NUM_THREADS=<CPUs / ranks per node> in the job script.",
)
def omp_threads_oversubscribe_cpus(facts, ctx):
    env = job_env(facts, ctx)
    lay = layout(facts, ctx)
    scripted = script_cpu_budget(facts, ctx, lay)
    cpus, sharing = scripted if scripted else (cpu_budget(facts), ranks_sharing_cpus(facts, ctx, lay))
    if not cpus.known:
        return skip(cpus.source if scripted else "the host probe did not report the CPUs this process may use")
    threads, problem = omp_threads(env)
    share = max(1, cpus.value // sharing.value)
    evidence = {
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS"),
        "cpus": f"{cpus.value} ({cpus.source})",
        "ranks_sharing_cpus": f"{sharing.value} ({sharing.source})",
        **lay.evidence(),
    }
    if scripted:
        evidence = job_resources(evidence)
    if problem:
        return warn(problem, set_env("OMP_NUM_THREADS", str(share)), **evidence)
    torchrun = lay.under_torchrun or intended_launcher(ctx) == "torchrun"
    if threads is None:
        if sharing.value > 1 and torchrun:
            return passed(f"OMP_NUM_THREADS unset: torchrun sets it to 1 for its {sharing.value} processes", **evidence)
        if sharing.value > 1:
            return info(
                f"OMP_NUM_THREADS is unset: each of {sharing.value} ranks starts {cpus.value} OpenMP threads "
                f"({sharing.value * cpus.value} on {cpus.value} CPUs); CPU-side work will contend",
                set_env("OMP_NUM_THREADS", str(share)),
                **evidence,
            )
        return passed(f"one process on this CPU set: OpenMP uses its {cpus.value} CPUs", **evidence)
    total = threads * sharing.value
    if total > cpus.value:
        return warn(
            f"OMP_NUM_THREADS={threads} x {sharing.value} rank(s) = "
            f"{total} threads on {cpus.value} CPUs ({cpus.source})",
            set_env("OMP_NUM_THREADS", str(share)),
            **evidence,
        )
    return passed(
        f"OMP_NUM_THREADS={threads} x {sharing.value} rank(s) = {total} threads on {cpus.value} CPUs", **evidence
    )
