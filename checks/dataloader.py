"""dataloader checks: DataLoader settings (from --config or a live DataLoader) against this host and job.

Settings come from gpudoctor.readers.dlconfig: the training config given with --config, or a DataLoader
object read by gpudoctor.audit_dataloader(). Every DataLoader argument is per rank: each
training process builds its own loader with its own worker processes.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpudoctor.job.env import job_env, probe_env
from gpudoctor.job.layout import Known, env_int, in_srun_step, intended_launcher, layout
from gpudoctor.model import Action, ActionKind, Fix, Safety, Severity, fail, info, manual, passed, set_env, skip, warn
from gpudoctor.readers.dlconfig import LoaderSettings, from_context
from gpudoctor.registry import check

MIB = 1024 * 1024
# Below this much /dev/shm per in-flight batch, ordinary image batches (32 x 3x224x224 float32
# is 18 MiB) no longer fit and workers die with "Bus error".
SHM_PER_BATCH_MIN = 32 * MIB
DEFAULT_PREFETCH = 2  # torch's default prefetch_factor when num_workers > 0


def _settings(facts, ctx) -> LoaderSettings:
    """The DataLoader settings of a check declared with requires=["loader-settings"] (the runner skips it
    when there are none)."""
    settings = from_context(ctx, job_env(facts, ctx))
    assert settings is not None, 'a check that reads the settings declares requires=["loader-settings"]'
    return settings


def _worker_count(settings):
    """(num_workers, None) when it is a count to judge; (None, skip) when unknown or not a count."""
    workers = settings.value("num_workers")
    if workers is None:
        return None, skip(settings.unknown("num_workers"), **settings.evidence())
    if workers < 0:
        return None, skip(
            f"{settings.describe('num_workers')} is negative: torch.utils.data.DataLoader rejects it (see GD-DL-008); "
            "code that reads it as 'all CPUs' picks the count itself, which is known only when the job runs",
            **settings.evidence(),
        )
    return workers, None


def _change_setting(settings, name: str, value, title: str) -> Fix:
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


def _job_resources(evidence: dict) -> dict:
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


# --- GD-DL-001 -----------------------------------------------------------------------------


@check(
    id="GD-DL-001",
    name="dataloader-workers-oversubscribe-cpus",
    category="dataloader",
    title="DataLoader workers fit the CPUs this task may use",
    needs=["host", "env"],
    requires=["loader-settings"],
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
    settings = _settings(facts, ctx)
    workers, unknown = _worker_count(settings)
    if unknown:
        return unknown
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
        evidence = _job_resources(evidence)
    sum_text = f"{sharing.value} rank(s) x ({workers} workers + 1 main process) = {demand} processes"
    if demand <= cpus.value:
        return passed(f"{sum_text} on {cpus.value} CPUs ({cpus.source})", **evidence)
    suggested = max(1, cpus.value // sharing.value - 1)
    message = (
        f"{settings.describe('num_workers')} is per rank: {sum_text} compete for {cpus.value} CPUs "
        f"({cpus.source}); workers will time-slice and starve the GPUs"
    )
    fix = _change_setting(settings, "num_workers", suggested, f"Set num_workers to {suggested} (CPUs / ranks - 1)")
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


# --- GD-DL-002 -----------------------------------------------------------------------------


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
    settings = _settings(facts, ctx)
    default = settings.defaults.get("num_workers")
    if settings.found.get("num_workers") is None and default is not None:
        return _main_process_by_default(facts, ctx, settings, default)
    workers, unknown = _worker_count(settings)
    if unknown:
        return unknown
    if workers > 0:
        return passed(
            f"{settings.describe('num_workers')}: batches are prepared in worker processes", **settings.evidence()
        )
    suggested = _suggested_workers(facts, ctx)
    return warn(
        f"{settings.describe('num_workers')}: batches are loaded in the training process, so the GPU waits while each "
        "one is read and augmented (fine only for in-memory tensor data)",
        _change_setting(settings, "num_workers", suggested, f"Set num_workers to {suggested}"),
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


# --- GD-DL-003 -----------------------------------------------------------------------------


@check(
    id="GD-DL-003",
    name="dataloader-memory-not-pinned",
    category="dataloader",
    title="DataLoader pins host memory for GPU copies",
    needs=[],
    scope="job",
    requires=["gpus-expected", "loader-settings"],
    what="On GPU training, looks for pin_memory=False (the DataLoader default).",
    why="Pinned (page-locked) batches are copied to the GPU by DMA straight from their buffer, and "
    "`.to('cuda', non_blocking=True)` can then overlap the copy with compute. From pageable memory the "
    "driver first stages the data through a pinned buffer and the copy cannot overlap. The gain is "
    "largest for big input batches (images, video); for small token batches it is minor.",
    fix="DataLoader(..., pin_memory=True) and move batches with .to(device, non_blocking=True).",
)
def dataloader_memory_not_pinned(facts, ctx):
    settings = _settings(facts, ctx)
    pin = settings.value("pin_memory")
    if pin is None:
        return skip(settings.unknown("pin_memory"), **settings.evidence())
    if pin:
        return passed(f"{settings.describe('pin_memory')}", **settings.evidence())
    if is_wsl(facts):  # pinned memory is limited under WSL2: unpinned is the right choice there (GD-DL-010)
        why = "right under WSL2, where pinned memory is limited (see GD-DL-010)"
        return passed(f"{settings.describe('pin_memory')}: {why}", **settings.evidence())
    return info(
        f"{settings.describe('pin_memory')}: host-to-GPU copies go through a staging buffer and cannot overlap compute",
        _change_setting(settings, "pin_memory", True, "Set pin_memory to true"),
        **settings.evidence(),
    )


# --- GD-DL-004 -----------------------------------------------------------------------------


@check(
    id="GD-DL-004",
    name="dataloader-workers-not-persistent",
    category="dataloader",
    title="DataLoader keeps its workers between epochs",
    needs=[],
    requires=["loader-settings"],
    scope="job",
    what="With num_workers > 0, looks for persistent_workers=False (the DataLoader default).",
    why="Without persistent workers every epoch (and every validation loop) shuts the workers down and "
    "starts new ones: the dataset is pickled to each worker again and worker_init_fn re-runs. With large "
    "datasets or many workers this is seconds to minutes per epoch of idle GPUs.",
    fix="DataLoader(..., persistent_workers=True). Workers then keep their state across epochs: make sure "
    "per-epoch randomness comes from the sampler (set_epoch) rather than from worker start-up.",
)
def dataloader_workers_not_persistent(facts, ctx):
    settings = _settings(facts, ctx)
    workers, unknown = _worker_count(settings)
    if unknown:
        return unknown
    persistent = settings.value("persistent_workers")
    if persistent is None:
        return skip(settings.unknown("persistent_workers"), **settings.evidence())
    if workers == 0:
        return skip("num_workers=0: there are no worker processes to keep", **settings.evidence())
    if persistent:
        return passed(f"{settings.describe('persistent_workers')}", **settings.evidence())
    return info(
        f"{settings.describe('persistent_workers')} with {workers} workers: the workers are re-created every epoch",
        _change_setting(settings, "persistent_workers", True, "Set persistent_workers to true"),
        **settings.evidence(),
    )


# --- GD-DL-005 -----------------------------------------------------------------------------


def _shm_fix(facts) -> Fix:
    if (facts.host.get("container") or {}).get("in_container"):
        return manual("Start the container with more shared memory", "docker run --shm-size=16g ...  # or --ipc=host")
    return manual("Enlarge /dev/shm", "sudo mount -o remount,size=16G /dev/shm")


@check(
    id="GD-DL-005",
    name="shm-too-small-for-workers",
    category="dataloader",
    title="/dev/shm has room for the batches DataLoader workers hand over",
    needs=["host", "env"],
    requires=["loader-settings"],
    scope="node",
    what="DataLoader workers pass every batch to the training process through shared memory (/dev/shm). "
    "Compares the free /dev/shm with ranks on this node x num_workers x prefetch_factor batches in flight.",
    why="When /dev/shm fills, workers die with 'Bus error' or 'DataLoader worker (pid N) is killed by "
    "signal' ('This might be caused by insufficient shared memory'). Docker gives containers 64 MiB by "
    "default, enough for a few small batches only.",
    fix="Start the container with --shm-size (e.g. 16g) or --ipc=host; in Kubernetes mount an emptyDir "
    "with medium: Memory at /dev/shm. Fewer workers or a smaller prefetch_factor also reduce the need.",
)
def shm_too_small_for_workers(facts, ctx):
    settings = _settings(facts, ctx)
    workers, unknown = _worker_count(settings)
    if unknown:
        return unknown
    if workers == 0:
        return passed("num_workers=0: batches do not pass through shared memory", **settings.evidence())
    shm = facts.host.get("shm")
    lay = layout(facts, ctx)
    ranks = lay.local_ranks.value or 1
    prefetch = settings.value("prefetch_factor") or DEFAULT_PREFETCH
    in_flight = ranks * workers * prefetch
    evidence = {
        **settings.evidence(),
        "shm": shm,
        "ranks_on_node": f"{ranks} ({lay.local_ranks.source or 'assumed'})",
        "batches_in_flight": in_flight,
    }
    if not shm:
        return warn(
            "no /dev/shm on this host: DataLoader workers cannot hand tensors to the training process",
            _shm_fix(facts),
            **evidence,
        )
    free = shm.get("free_bytes") or 0
    per_batch = free / in_flight
    evidence["shm_per_batch_mib"] = round(per_batch / MIB, 1)
    sum_text = f"{ranks} rank(s) x {workers} workers x prefetch {prefetch} = {in_flight} batches in flight"
    if per_batch >= SHM_PER_BATCH_MIN:
        return passed(
            f"/dev/shm has {free / MIB:,.0f} MiB free for {sum_text} ({per_batch / MIB:,.0f} MiB each)", **evidence
        )
    batch = settings.value("batch_size")
    per_sample = f", {per_batch / batch / 1024:,.0f} KiB per sample at batch_size {batch}" if batch else ""
    return warn(
        f"/dev/shm has only {free / MIB:,.0f} MiB free ({shm.get('total_bytes', 0) / MIB:,.0f} MiB total) "
        f"for {sum_text}: "
        f"{per_batch / MIB:,.1f} MiB per batch{per_sample}; larger batches kill the workers with 'Bus error'",
        _shm_fix(facts),
        **evidence,
    )


# --- GD-DL-006 -----------------------------------------------------------------------------


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
        evidence = _job_resources(evidence)
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


# --- GD-DL-007 -----------------------------------------------------------------------------


def _data_parallel_size(settings, world: int) -> tuple[int, str]:
    tp = settings.value("tensor_parallel") or 1
    pp = settings.value("pipeline_parallel") or 1
    cp = settings.value("context_parallel") or 1
    model_parallel = tp * pp * cp
    if model_parallel > 1 and world % model_parallel == 0:
        parts = " x ".join(f"{n} {v}" for n, v in (("tensor", tp), ("pipeline", pp), ("context", cp)) if v > 1)
        return world // model_parallel, f"world size {world} / ({parts} parallel)"
    return world, f"world size {world}"


def _batch_framework(settings) -> str | None:
    """Frameworks that refuse to start on an inconsistent global batch."""
    key = (settings.where("global_batch_size") or "").rsplit(".", 1)[-1]  # the key itself: not global_train_batch_size
    if key == "train_batch_size":
        return "DeepSpeed"
    if key == "global_batch_size" and (settings.where("batch_size") or "").rsplit(".", 1)[-1] == "micro_batch_size":
        return "Megatron"
    if key == "IMS_PER_BATCH":  # detectron2's build_batch_data_loader asserts it divides by the world size
        return "detectron2"
    return None


@dataclass(frozen=True)
class BatchRule:
    """What the global batch must be a multiple of (unit), or equal to (exact), and why."""

    unit: int
    unit_text: str
    exact: int | None = None
    exact_text: str | None = None
    quotient: str = "samples per data-parallel rank"  # what global // unit is


def _batch_rule(settings, framework: str | None, dp: int) -> BatchRule:
    """The rule the framework applies (DeepSpeed's _set_batch_related_parameters, Megatron's
    num-microbatches calculator); for hand-written loops, micro x accumulation x ranks."""
    micro, accum = settings.value("batch_size"), settings.value("gradient_accumulation_steps")
    micro_text = settings.describe("batch_size")
    accum_text = settings.describe("gradient_accumulation_steps")
    if framework == "Megatron" and micro:
        # Megatron derives the accumulation (global / (micro x dp)); a trainer's accumulate_grad_batches is not used.
        return BatchRule(
            micro * dp, f"{micro_text} x {dp} data-parallel ranks", quotient="micro-batches accumulated per step"
        )
    if micro and accum:
        return BatchRule(
            dp, f"{dp} data-parallel ranks", micro * accum * dp, f"{micro_text} x {accum_text} x {dp} ranks"
        )
    if framework == "DeepSpeed" and micro:
        # DeepSpeed sets accumulation = train_batch_size // micro // world and then asserts equality.
        return BatchRule(
            micro * dp, f"{micro_text} x {dp} data-parallel ranks", quotient="micro-batches accumulated per step"
        )
    if framework == "DeepSpeed" and accum:
        return BatchRule(accum * dp, f"{accum_text} x {dp} data-parallel ranks", quotient="samples per micro-batch")
    return BatchRule(dp, f"{dp} data-parallel ranks")


@check(
    id="GD-DL-007",
    name="global-batch-not-divisible",
    category="dataloader",
    title="The global batch size divides evenly across the data-parallel ranks",
    needs=["env"],
    requires=["loader-settings"],
    scope="job",
    what="When the config states a global batch (DeepSpeed train_batch_size, Megatron/NeMo global_batch_size, "
    "detectron2 SOLVER.IMS_PER_BATCH, effective_batch_size...), checks it against the data-parallel size "
    "(world size, divided by tensor x pipeline x context parallel sizes when the config states them) the way "
    "the framework does: DeepSpeed needs train_batch_size = micro batch x gradient accumulation x "
    "data-parallel size (deriving the one left out), Megatron/NeMo need global_batch_size to be a multiple of "
    "micro_batch_size x data-parallel size, detectron2 needs IMS_PER_BATCH to be a multiple of the world "
    'size. DeepSpeed\'s "auto" (filled in by the HF Trainer or accelerate) is consistent by construction. '
    "Per-device batches (HF per_device_train_batch_size) have no global rule.",
    why="DeepSpeed, Megatron and detectron2 refuse to start ('train_batch_size is not equal to micro_batch_per_gpu * "
    "gradient_acc_step * world_size', 'global batch size is not divisible by micro batch size times data "
    "parallel size'); hand-written loops silently round the per-rank batch down and train on a different "
    "batch size than the one tuned.",
    fix="Choose a global batch that is a multiple of micro batch x data-parallel size (DeepSpeed: exactly "
    'micro x accumulation x ranks), or leave DeepSpeed\'s train_batch_size to "auto" / state only the '
    "per-rank batch and the accumulation steps.",
)
def global_batch_not_divisible(facts, ctx):
    settings = _settings(facts, ctx)
    if settings.is_auto("global_batch_size"):
        return passed(
            f"{settings.describe('global_batch_size')}: the HF Trainer / accelerate fills it in as world size x "
            "per-device batch x accumulation, consistent by construction",
            **settings.evidence(),
        )
    global_batch = settings.value("global_batch_size")
    if global_batch is None:
        if "global_batch_size" in settings.found:
            return skip(settings.unknown("global_batch_size"), **settings.evidence())
        return skip(
            f"{settings.source} states no global batch size (per-device batches have no global rule)",
            **settings.evidence(),
        )
    lay = layout(facts, ctx)
    if not lay.world_size.known:
        return skip(
            "the world size is not known here (set WORLD_SIZE, or --expect-gpus on one node)", **settings.evidence()
        )
    dp, dp_text = _data_parallel_size(settings, lay.world_size.value)
    framework = _batch_framework(settings)
    rule = _batch_rule(settings, framework, dp)
    evidence = {**settings.evidence(), **lay.evidence(), "data_parallel": dp_text, "framework": framework}
    sev = fail if framework else warn
    stops = f"; {framework} refuses to start" if framework else ""
    target = rule.exact or max(rule.unit, round(global_batch / rule.unit) * rule.unit)
    fix = _change_setting(
        settings, "global_batch_size", target, f"Set the global batch to {target} (a multiple of {rule.unit})"
    )
    stated = settings.describe("global_batch_size")
    if global_batch % rule.unit or global_batch < rule.unit:
        return sev(
            f"{stated} is not a multiple of {rule.unit_text} = {rule.unit} ({dp_text}, {lay.world_size.source}){stops}",
            fix,
            **evidence,
        )
    if rule.exact is not None and rule.exact != global_batch:
        return sev(f"{rule.exact_text} = {rule.exact}, not the stated {stated}{stops}", fix, **evidence)
    if rule.exact is not None:
        return passed(f"{stated} = {rule.exact_text}", **evidence)
    return passed(f"{stated} = {rule.unit_text} x {global_batch // rule.unit} {rule.quotient}", **evidence)


# --- GD-DL-008 -----------------------------------------------------------------------------


def rejected_arguments(settings, torch_version) -> list[str]:
    """Combinations torch.utils.data.DataLoader raises ValueError on.

    A worker count left to a framework's default (HF TrainingArguments: 0) counts: the
    framework passes it on all the same.
    """
    workers_found = settings.effective("num_workers")
    workers = workers_found.value if workers_found else None
    by_default = workers_found is not None and workers_found is settings.defaults.get("num_workers")
    workers_text = f" ({workers_found.path} is not set: TrainingArguments' default is {workers})" if by_default else ""
    prefetch = settings.value("prefetch_factor")
    out = []
    if workers is not None and workers < 0:
        out.append(f"{settings.describe('num_workers')} is negative")
    if workers == 0 and settings.value("persistent_workers"):
        out.append(f"{settings.describe('persistent_workers')} needs num_workers > 0")
    if workers == 0 and prefetch is not None and (torch_version is None or torch_version >= (2, 0) or prefetch != 2):
        out.append(f"{settings.describe('prefetch_factor')} is allowed only with num_workers > 0")
    if out and workers_text:
        out[-1] += workers_text
    if workers and prefetch is not None and prefetch < 1:
        out.append(f"{settings.describe('prefetch_factor')} must be at least 1")
    batch = settings.value("batch_size")
    if batch is not None and batch < 1:
        out.append(f"{settings.describe('batch_size')} must be at least 1")
    return out


def _rejected_fix(settings):
    workers = settings.value("num_workers")
    if workers is not None and workers < 0:
        return manual(
            f"Set {settings.describe('num_workers').split('=')[0]} to 0 or a positive count (or resolve -1 in your "
            "code before DataLoader)"
        )
    keys = [settings.describe(n).split("=")[0] for n in ("prefetch_factor", "persistent_workers") if settings.value(n)]
    return manual(
        f"Remove {' and '.join(keys) or 'the rejected arguments'} while num_workers is 0, or set num_workers above 0"
    )


@check(
    id="GD-DL-008",
    scope="job",
    name="dataloader-arguments-rejected",
    category="dataloader",
    title="DataLoader arguments are a combination torch accepts",
    needs=["torch_meta"],
    requires=["loader-settings"],
    what="Looks for DataLoader argument combinations torch rejects: persistent_workers=True or a "
    "prefetch_factor with num_workers=0 (torch >= 2.0), prefetch_factor < 1, negative num_workers, a "
    "batch size below 1.",
    why="torch.utils.data.DataLoader raises ValueError on these when the training script builds the loader, "
    "after the job has started and the model is loaded. Code that drops the argument when num_workers is 0 "
    "is not affected.",
    fix="Leave prefetch_factor and persistent_workers unset when num_workers is 0.",
)
def dataloader_arguments_rejected(facts, ctx):
    settings = _settings(facts, ctx)
    from gpudoctor import versions

    problems = rejected_arguments(settings, versions.parse(facts.torch_version()))
    evidence = {**settings.evidence(), "torch": facts.torch_version()}
    if not problems:
        return passed("the stated DataLoader arguments are a combination torch accepts", **evidence)
    if settings.live:
        raiser = "DataLoader raises ValueError"
    elif "huggingface" in settings.frameworks:
        raiser = "TrainingArguments or DataLoader raises ValueError when the Trainer starts"
    else:
        raiser = "DataLoader raises ValueError if the config's values reach torch.utils.data.DataLoader unchanged"
    return warn(
        "; ".join(problems) + f": {raiser}",
        _rejected_fix(settings),
        **evidence,
    )


# --- GD-DL-009 -----------------------------------------------------------------------------

_SELF_SHARDING = ("lightning", "accelerate")
# Samplers that read the rank and world size themselves and hand each rank its own share.
RANK_AWARE_SAMPLERS = {
    "DefaultSampler": "mmengine",  # mmengine.dataset.DefaultSampler / InfiniteSampler: get_dist_info()
    "InfiniteSampler": "mmengine",
    "TrainingSampler": "detectron2",  # detectron2.data.samplers: shards its infinite stream by rank
    "RepeatFactorTrainingSampler": "detectron2",
    "RepeatAugSampler": "timm",
    "DistributedBucketSampler": "",
    "ElasticDistributedSampler": "torchelastic",
    "StatefulDistributedSampler": "torchdata",
}


@check(
    id="GD-DL-009",
    name="dataloader-not-sharded-across-ranks",
    category="dataloader",
    title="Each rank reads its own share of the data",
    needs=["env"],
    requires=["loader-settings"],
    scope="job",
    what="With more than one rank, the DataLoader's sampler should be a DistributedSampler (or another "
    "sampler that splits the dataset by rank: mmengine's DefaultSampler/InfiniteSampler, detectron2's "
    "TrainingSampler...). Read from a live DataLoader (a custom batch_sampler counts as the sampler) or a "
    "config's `sampler`; an IterableDataset must shard itself (info).",
    why="With a RandomSampler or SequentialSampler every rank iterates the whole dataset: an epoch does "
    "world-size times the work, and with a SequentialSampler all ranks train on identical batches. "
    "Lightning and accelerate swap in a distributed sampler themselves when they prepare the loader.",
    fix="DataLoader(dataset, sampler=DistributedSampler(dataset), ...) and call sampler.set_epoch(epoch) every epoch.",
)
def dataloader_not_sharded_across_ranks(facts, ctx):
    settings = _settings(facts, ctx)
    sampler = settings.value("sampler")
    if sampler is None:
        return skip(f"the sampler is not stated in {settings.source}", **settings.evidence())
    lay = layout(facts, ctx)
    evidence = {**settings.evidence(), **lay.evidence()}
    name = sampler.rsplit(".", 1)[-1]
    if not (lay.world_size.value and lay.world_size.value > 1):
        return skip(f"a single rank (world size {lay.world_size.value or 'unknown'}): nothing to shard", **evidence)
    if name == "_InfiniteConstantSampler":
        return info(
            f"an IterableDataset on {lay.world_size.value} ranks: torch cannot shard it, so its __iter__ must split "
            "the stream by rank (and by worker) itself, or every rank trains on the same samples",
            manual(
                "Split the stream by rank",
                "datasets.distributed.split_dataset_by_node(ds, rank, world_size)  # or "
                "torch.utils.data.get_worker_info() + the rank in __iter__",
            ),
            **evidence,
        )
    if "distributed" in name.lower() or name in RANK_AWARE_SAMPLERS:
        return passed(f"sampler {name} splits the data by rank", **evidence)
    self_sharding = (
        intended_launcher(ctx) in _SELF_SHARDING
        or "lightning" in settings.frameworks
        or any(k.startswith(("PL_", "LIGHTNING_", "ACCELERATE_")) for k in job_env(facts, ctx))
    )
    msg = f"sampler {name} on {lay.world_size.value} ranks: every rank reads the whole dataset"
    fix = manual("Use a DistributedSampler", "DataLoader(ds, sampler=DistributedSampler(ds), ...)")
    if self_sharding or name not in ("RandomSampler", "SequentialSampler"):
        return info(msg + " (unless Lightning/accelerate, or the sampler itself, shards it by rank)", fix, **evidence)
    return warn(msg, fix, **evidence)


# --- GD-DL-010 (issue 13) ---------------------------------------------------------------------


def is_wsl(facts) -> bool:
    """WSL kernels carry 'microsoft' in their release string (5.15.153.1-microsoft-standard-WSL2)."""
    return "microsoft" in str(facts.host.get("kernel") or "").lower()


@check(
    id="GD-DL-010",
    name="pin-memory-under-wsl2",
    category="dataloader",
    title="DataLoader does not pin memory under WSL2",
    needs=["host"],
    requires=["gpus-expected", "loader-settings"],
    what="Under WSL2 (a kernel release naming Microsoft), looks for pin_memory=True, stated or by the framework's "
    "default (Hugging Face's dataloader_pin_memory is True).",
    why="NVIDIA's CUDA on WSL user guide lists pinned system memory as limited for Linux CUDA applications under "
    "WSL2; every worker batch is pinned, and loaders fail with 'CUDA error: out of memory' in the pin-memory "
    "thread while GPU memory is free (microsoft/WSL#8447).",
    fix="pin_memory=False (dataloader_pin_memory: false for Hugging Face) under WSL2, or train on native Linux.",
)
def pin_memory_under_wsl2(facts, ctx):
    if not is_wsl(facts):
        return passed("not WSL: pinned memory is not restricted", kernel=facts.host.get("kernel"))
    settings = _settings(facts, ctx)
    found = settings.effective("pin_memory")
    evidence = {"kernel": facts.host.get("kernel"), **settings.evidence()}
    if found is None or found.value is None:
        return skip(settings.unknown("pin_memory"), **evidence)
    if not found.value:
        return passed(f"{settings.describe('pin_memory')} under WSL2", **evidence)
    where = "" if "pin_memory" in settings.found else f" (the framework's default, {found.path})"
    return warn(
        f"pin_memory is on{where} under WSL2, where pinned host memory is limited: loaders can fail with "
        "'CUDA error: out of memory' while the GPU has room",
        _change_setting(settings, "pin_memory", False, "Set pin_memory to false"),
        **evidence,
    )
