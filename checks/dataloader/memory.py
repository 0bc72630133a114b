"""dataloader checks of the memory batches go through: pinned memory, /dev/shm, WSL2."""

from __future__ import annotations

from gpudoctor.checks.dataloader._loader import change_setting, is_wsl, loader_settings, worker_count
from gpudoctor.job.layout import layout
from gpudoctor.model import Fix, info, manual, passed, skip, warn
from gpudoctor.registry import check
from gpudoctor.units import MIB

# Below this much /dev/shm per in-flight batch, ordinary image batches (32 x 3x224x224 float32
# is 18 MiB) no longer fit and workers die with "Bus error".
SHM_PER_BATCH_MIN = 32 * MIB


DEFAULT_PREFETCH = 2  # torch's default prefetch_factor when num_workers > 0


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
    settings = loader_settings(facts, ctx)
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
        change_setting(settings, "pin_memory", True, "Set pin_memory to true"),
        **settings.evidence(),
    )


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
    requires=["loader-settings", "loader-workers"],
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
    settings = loader_settings(facts, ctx)
    workers = worker_count(settings)
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
    settings = loader_settings(facts, ctx)
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
        change_setting(settings, "pin_memory", False, "Set pin_memory to false"),
        **evidence,
    )
