"""Fit the run to the GPUs as they are: size the model from the memory that is free, and say first when another
process holds a GPU (no torch).

Each rank reports, when it joins, its GPU's free memory (torch.cuda.mem_get_info) and the processes NVML sees
on it. A process that is not one of the job's ranks and holds memory is named with its PID and how much it
holds; the model is then chosen from the free memory instead of the total (a large model on an H200 with
131.8 GiB held by another process fails in DDP's broadcast with torch's out-of-memory text). Below what the
smallest model needs the run stops before training, with the same finding.
"""

from __future__ import annotations

from gpudoctor.model import Severity, manual
from gpudoctor.sample_train.judge import peaks
from gpudoctor.sample_train.judge.findings import make
from gpudoctor.sample_train.sizes import size_for_gpu
from gpudoctor.units import GIB

# A GPU whose free memory is below this share of its total is in use by something (this rank's own CUDA context
# takes about 0.5 GiB of 80-141 GiB).
FREE_SHARE = 0.9


def _gib(n: int | float) -> str:
    return f"{n / GIB:.1f} GiB"


def _others(join: dict, job_pids: set) -> list[dict]:
    return [p for p in join.get("gpu_processes") or [] if p.get("pid") not in job_pids]


def judge(joins: dict[int, dict], opts) -> tuple[str | None, list]:
    """(the largest model the free memory allows, or None where the free memory is not known or not the
    deciding figure; the GD-SMOKE-023 findings). CPU runs: (None, [])."""
    gpus = {r: j for r, j in joins.items() if j.get("device_type") == "cuda" and j.get("gpu_memory_bytes")}
    if not gpus:
        return None, []
    job_pids = {j.get("pid") for j in joins.values()}
    busy = {}
    for rank, j in sorted(gpus.items()):
        free, total = j.get("gpu_free_bytes"), j["gpu_memory_bytes"]
        others = _others(j, job_pids)
        if others or (free is not None and free < FREE_SHARE * total):
            busy[rank] = (free, total, others)
    known = [j["gpu_free_bytes"] for j in gpus.values() if j.get("gpu_free_bytes") is not None]
    if not busy:
        if not known:
            return None, []
        return None, [
            make("GD-SMOKE-023", Severity.PASS, f"every GPU's memory is free (at least {_gib(min(known))} each)")
        ]
    least_free = min(known) if known else None
    found = [peaks.identify(j.get("gpu_name"), j["gpu_memory_bytes"]) for j in gpus.values()]
    spec = min((p.tflops for p in found if p), default=None)
    by_total = size_for_gpu(min(j["gpu_memory_bytes"] for j in gpus.values()), spec)
    fits = size_for_gpu(least_free, spec, floor=True) if least_free is not None else by_total
    described = "; ".join(_describe(joins[r], *busy[r]) for r in sorted(busy))
    explicit = opts.train.size != "auto"
    evidence = {
        "ranks_sharing": sorted(busy),
        "held": {r: busy[r][2] for r in sorted(busy)},
        "free_bytes_min": least_free,
    }
    pids = sorted({p["pid"] for r in busy for p in busy[r][2]})
    fix = manual(
        "See what holds the GPU, and stop it if it is yours (or run on a free node)",
        "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv",
        *(f"ps -o user,pid,etime,cmd -p {pid}" for pid in pids[:4]),
    )
    if fits is None and not explicit:
        return None, [
            make(
                "GD-SMOKE-023",
                Severity.FAIL,
                f"{described}: {_gib(least_free or 0)} free is less than the smallest smoke model needs; the run "
                "stops before training (a training job would fail with CUDA out of memory)",
                fix,
                **evidence,
            )
        ]
    chosen = opts.train.size if explicit else fits
    sized = (
        f"the run uses --size {opts.train.size} as asked"
        if explicit
        else (
            f"the run is sized from the free memory: {chosen} instead of {by_total}"
            if chosen != by_total
            else f"the {chosen} model still fits"
        )
    )
    return (None if explicit else fits), [
        make(
            "GD-SMOKE-023",
            Severity.WARN,
            f"{described}; {sized}. The job's own training would share this GPU and its memory",
            fix,
            **evidence,
        )
    ]


def _describe(join: dict, free: int | None, total: int, others: list[dict]) -> str:
    where = f"rank {join['rank']} on {join.get('host')} GPU {join.get('device_index')}"
    held = ", ".join(
        f"PID {p['pid']}" + (f" ({_gib(p['used_memory_bytes'])})" if p.get("used_memory_bytes") else "") for p in others
    )
    free_text = f"{_gib(free)} of {_gib(total)} free" if free is not None else f"{_gib(total)} in total"
    if held:
        return f"{where}: {free_text}, another process holds it: {held}"
    return f"{where}: {free_text}, held by a process NVML does not show (another container or PID namespace)"
