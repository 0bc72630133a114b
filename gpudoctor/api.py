"""Python API: audit a live torch.utils.data.DataLoader from inside the training process.

    import gpudoctor
    for f in gpudoctor.audit_dataloader(train_loader):
        if f.severity.value in ("warn", "fail"):
            print(f.id, f.message)

Only the fact sections the dataloader checks need are probed (host CPUs and /dev/shm, the
environment); torch is not imported or probed here beyond the loader and the torch module
the caller already has loaded.
"""

from __future__ import annotations

import sys

from gpudoctor.model import Context, Finding
from gpudoctor.readers.dlconfig import LIVE_KEY, LIVE_SOURCE

CATEGORY = "dataloader"


class AuditError(TypeError):
    """The object given is not a DataLoader."""


def _class_name(obj) -> str | None:
    if obj is None:
        return None
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def loader_settings(loader) -> dict:
    """The DataLoader's arguments, as the loader holds them (defaults included)."""
    if not hasattr(loader, "num_workers") or not hasattr(loader, "dataset"):
        raise AuditError(f"audit_dataloader expects a torch.utils.data.DataLoader, got {type(loader).__name__}")
    batch_sampler = getattr(loader, "batch_sampler", None)
    batch_size = getattr(loader, "batch_size", None)
    drop_last = getattr(loader, "drop_last", None)
    if batch_size is None and batch_sampler is not None:  # DataLoader(batch_sampler=...) leaves these None/False
        batch_size = getattr(batch_sampler, "batch_size", None)
        drop_last = getattr(batch_sampler, "drop_last", drop_last)
    sampler = _sampler(loader, batch_sampler)
    return {
        "num_workers": loader.num_workers,
        "pin_memory": bool(getattr(loader, "pin_memory", False)),
        "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
        "prefetch_factor": getattr(loader, "prefetch_factor", None),
        "batch_size": batch_size,
        "drop_last": drop_last,
        "sampler": _class_name(sampler),
    }


def _sampler(loader, batch_sampler):
    """What decides which samples this rank reads.

    DataLoader always builds a default sampler (Sequential/Random), even when a batch_sampler is
    given and never asks it; a custom batch_sampler without a .sampler of its own (a bucketing or
    distributed batch sampler) is what chooses the samples then.
    """
    inner = getattr(batch_sampler, "sampler", None)
    if inner is not None:
        return inner
    if batch_sampler is not None and getattr(loader, "batch_size", None) is None:  # DataLoader(batch_sampler=...)
        return batch_sampler
    return getattr(loader, "sampler", None)


def _gpu_training() -> bool:
    """Whether the caller's torch (already imported: it built the loader) can use a GPU."""
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_available())
    except Exception:
        return False


def _live_world_size() -> int | None:
    torch = sys.modules.get("torch")
    if torch is None:  # not imported by the caller: no process group can exist
        return None
    try:
        dist = torch.distributed
        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else None
    except Exception:
        return None


def _facts(facts, needed: set[str], local_ranks, world_size):
    from gpudoctor.facts import Facts

    if facts is None:
        from gpudoctor.probe import collect

        facts = collect(needed - {"torch", "nvidia"})
    env = dict(facts.env)
    if world_size is not None:
        env["WORLD_SIZE"] = str(world_size)
    if local_ranks is not None:
        env["LOCAL_WORLD_SIZE"] = str(local_ranks)
    sections = dict(facts.sections)
    sections["env"] = {**(sections.get("env") or {}), "vars": env}
    return Facts(sections=sections, meta=dict(facts.meta))


def audit_dataloader(
    loader,
    *,
    local_ranks: int | None = None,
    world_size: int | None = None,
    facts=None,
    expect_gpus: bool | None = None,
) -> list[Finding]:
    """Run the dataloader checks on a live DataLoader; returns every finding (pass and skip included).

    local_ranks: training processes on this node (default: LOCAL_WORLD_SIZE, else the layout the
    environment shows); world_size: all ranks (default: torch.distributed's, else WORLD_SIZE);
    facts: a gpudoctor Facts object to use instead of probing this host; expect_gpus: whether the
    batches go to a GPU (default: torch.cuda.is_available() in this process).
    """
    from gpudoctor.registry import load_all
    from gpudoctor.runner import run_checks

    for name, n in (("local_ranks", local_ranks), ("world_size", world_size)):
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
            raise ValueError(f"{name} must be a positive integer, got {n!r}")
    settings = loader_settings(loader)
    specs = [s for s in load_all().values() if s.category == CATEGORY]
    needed = {n for s in specs for n in s.needs}
    world = world_size if world_size is not None else _live_world_size()
    live_facts = _facts(facts, needed, local_ranks, world)
    gpus = _gpu_training() if expect_gpus is None else bool(expect_gpus)
    ctx = Context(expect_gpus=None if gpus else 0, config={LIVE_KEY: settings}, config_path=LIVE_SOURCE)
    return run_checks(specs, live_facts, ctx)
