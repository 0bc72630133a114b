"""Does each rank hold its speed? The judgement of `smoke --soak` (no torch).

A short run misses a GPU that throttles once hot. Under --soak every rank measures its square matmul and its
device memory copy again and again (worker.Rank.soak: each sample the mean over its window), reading the device's
condition after each. A figure is judged against two references at once:
- the rank's own first minute (the first quarter of a shorter soak): a GPU that fell from its own speed;
- the other ranks at the same sample: one GPU that fell while the others held, not the whole host getting busier.
A rank is named when its figure stays below both by GAP (13 % on a GPU, as slowness.MIN_GAP; 40 % on a CPU)
for at least MIN_RUN samples in a row (a rolling median of three: one stall is not a fall), with the time it
began and the device's condition then (clocks, temperature, throttle reasons; the CPU quota on a CPU rank). When
every rank falls together the host is named instead (a GPU: the node's power or cooling; a CPU run: the machine
got busier, a note).
"""

from __future__ import annotations

from gpudoctor.model import Severity, manual
from gpudoctor.sample_train.judge import figures, metrics
from gpudoctor.sample_train.judge.findings import make, ranks_text
from gpudoctor.sample_train.judge.slowness import IDLE_REASONS, MIN_GAP

SOAKED = ("matmul_tflops", "memory_copy_gbps")  # what worker.Rank.soak measures again and again
FIGURES = tuple((f.key, f.what, f.unit) for f in figures.RANK if f.key in SOAKED)
REFERENCE_S = 60.0
MIN_RUN = 3
# A CPU rank's soak samples (0.4 s windows, rolling median of three) stayed within 20 % of their own first quarter
# and of each other on a 2-core machine at load 10; a rank given 0.1 CPU by its cgroup there fell by half (every
# rank got little CPU), on a quiet machine by far more. A part's single measurement needs slowness's wider 60 %.
GAP = {"cuda": MIN_GAP["cuda"], "cpu": 0.4}


def _rolling(values: list[float], width: int = 3) -> list[float]:
    return [metrics.median(values[max(0, i - width + 1) : i + 1]) for i in range(len(values))]


def _said(sample: dict) -> str:
    """The device's condition at a sample, as it says it."""
    parts = []
    if sample.get("sm_clock_mhz") is not None:
        top = sample.get("sm_clock_max_mhz")
        parts.append(f"SM clock {sample['sm_clock_mhz']}" + (f" of {top}" if top else "") + " MHz")
    if sample.get("temperature_c") is not None:
        parts.append(f"{sample['temperature_c']} °C")
    active = [r for r in sample.get("throttle") or [] if r not in IDLE_REASONS]
    if active:
        parts.append("clocks held down: " + ", ".join(active))
    if sample.get("cpu_limit") is not None and sample["cpu_limit"] < 1:
        parts.append(f"its cgroup's CPU quota is {sample['cpu_limit']:g} CPU")
    if sample.get("load_1m") is not None and sample.get("affinity_cpus"):
        parts.append(f"load {sample['load_1m']:g} on {sample['affinity_cpus']} CPU(s)")
    return ", ".join(parts)


def _falls(own: list[float], peers: list[float | None], reference: float, gap: float, start: int) -> int | None:
    """The first index (from start) of MIN_RUN samples in a row below the reference and the peers by the gap."""
    run = 0
    for i in range(start, len(own)):
        below_own = own[i] < reference * (1 - gap)
        peer = peers[i]
        below_peers = peer is None or own[i] < peer * (1 - gap)
        run = run + 1 if below_own and below_peers else 0
        if run >= MIN_RUN:
            return i - MIN_RUN + 1
    return None


def judge(ranks: list[dict], results: list[dict], device: str, duration: float) -> tuple[dict | None, list]:
    """(the report's soak section, GD-SMOKE-024 findings); (None, []) without --soak."""
    series: dict[int, list[dict]] = {r["rank"]: r["soak"] for r in results if r.get("soak") is not None}
    if not series:
        return None, []
    row_of = {r["rank"]: r for r in ranks}
    gap = GAP["cuda" if device == "cuda" else "cpu"]
    length = min(len(s) for s in series.values())
    fell, together, per_rank = [], [], []
    for key, what, unit in FIGURES:
        rolled = {rank: _rolling([x[key] for x in s[:length]]) for rank, s in series.items()}
        ref_end = min(REFERENCE_S, duration / 4)
        first = {
            rank: metrics.median([x[key] for x in s[:length] if x["t"] < ref_end] or [x[key] for x in s[:2]])
            for rank, s in series.items()
        }
        start = len([x for x in next(iter(series.values()))[:length] if x["t"] < ref_end])
        own_falls = {}
        for rank, values in rolled.items():
            others = [v for r, v in rolled.items() if r != rank]
            peers = [metrics.median([o[i] for o in others]) if others else None for i in range(length)]
            at = _falls(values, peers, first[rank], gap, start)
            alone_at = _falls(values, [None] * length, first[rank], gap, start)
            if at is not None:
                own_falls[rank] = at
            elif alone_at is not None:
                together.append((rank, key, alone_at))
        for rank, at in sorted(own_falls.items()):
            raw = [x[key] for x in series[rank][:length]]
            while at > start and raw[at - 1] < first[rank] * (1 - gap):  # the rolling median lags the first slow one
                at -= 1
            sample = series[rank][at]
            late = metrics.median(rolled[rank][at:])
            fell.append(
                {
                    "rank": rank,
                    "host": row_of.get(rank, {}).get("host"),
                    "gpu_index": row_of.get(rank, {}).get("gpu_index"),
                    "gpu_uuid": row_of.get(rank, {}).get("gpu_uuid"),
                    "figure": key,
                    "what": what,
                    "unit": unit,
                    "first": first[rank],
                    "after": late,
                    "fell_by": 1 - late / first[rank] if first[rank] else None,
                    "from_s": sample["t"],
                    "condition": _said(sample),
                }
            )
    for rank, s in sorted(series.items()):
        per_rank.append({"rank": rank, "samples": s})
    section = {
        "duration_s": duration,
        "samples_per_rank": length,
        "reference": f"each rank's first {min(REFERENCE_S, duration / 4):g} s, and the other ranks at the same sample",
        "gap": gap,
        "fell": fell,
        "fell_together": sorted({r for r, _k, _a in together}),
        "per_rank": per_rank,
    }
    return section, _findings(fell, together, row_of, device, length, duration)


def _findings(fell: list[dict], together: list, row_of: dict, device: str, length: int, duration: float) -> list:
    out = []
    if fell:
        named = "; ".join(
            f"rank {f['rank']} on {f['host']}"
            + (f" GPU {f['gpu_index']}" if f.get("gpu_index") is not None else "")
            + f": {f['what']} fell from {f['first']:.3g} to {f['after']:.3g} {f['unit']} ({f['fell_by']:.0%}) "
            f"from {f['from_s']:.0f} s on" + (f" ({f['condition']})" if f["condition"] else "")
            for f in fell
        )
        out.append(
            make(
                "GD-SMOKE-024",
                Severity.WARN,
                f"{ranks_text({f['rank'] for f in fell})} did not hold their speed under load: {named}",
                manual(
                    "Look at the named GPU's cooling and power, and its clocks while it is loaded",
                    "nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER",
                    "nvidia-smi dmon -s pucm -d 5",
                ),
                ranks=sorted({f["rank"] for f in fell}),
                fell=fell,
            )
        )
    elif together and device == "cuda":
        ranks = sorted({r for r, _k, _a in together})
        out.append(
            make(
                "GD-SMOKE-024",
                Severity.WARN,
                f"{ranks_text(ranks)} fell together from their first minute's speed: the whole node slowed (its "
                "power or cooling), not one GPU",
                hosts=sorted({str(row_of[r].get("host")) for r in ranks if r in row_of}),
            )
        )
    elif together:
        out.append(
            make(
                "GD-SMOKE-024",
                Severity.INFO,
                f"every rank slowed together during the soak: the machine got busier (CPU ranks share it); "
                f"no rank fell behind the others ({length} samples over {duration:g} s)",
            )
        )
    else:
        out.append(
            make(
                "GD-SMOKE-024",
                Severity.PASS,
                f"every rank held its speed for {duration:g} s ({length} samples each; square matmul and device "
                "memory copy against its first minute and the other ranks)",
            )
        )
    return out
