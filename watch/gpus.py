"""The rules read from NVML samples of the job's GPUs: another process on a GPU (GD-WATCH-003), throttling
(GD-WATCH-004), memory creep (GD-WATCH-005), a GPU held but idle (GD-WATCH-002) and a GPU waiting for input
(GD-WATCH-007); the rules are judge.py's docstring. Pure."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from gpudoctor.model import Finding, Severity, manual
from gpudoctor.probe.nvidia import THROTTLE_REASONS
from gpudoctor.watch.hang import FLIGHT_RECORDER, where_stuck
from gpudoctor.watch.processes import ranks_on
from gpudoctor.watch.samples import GpuTrace, NodeObservation
from gpudoctor.watch.verdict import (
    HELD_BYTES,
    IDLE_UTIL,
    MIN_SAMPLES,
    gib,
    job_pids,
    make,
    sampled_traces,
    secs,
    util_samples,
)

IDLE_SHARE = 0.9  # share of the window's samples that must be idle for "did nothing"
CAUSE_REASONS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
CAUSE_SHARE = 0.2  # share of samples with a cause reason active
BUSY_UTIL = 90  # %: "under full load" for comparing clocks between GPUs
SLOW_CLOCK = 0.85  # a busy GPU's median SM clock below this share of the node's other busy GPUs'
WARMUP_SHARE = 0.25
CREEP_R = 0.9
CREEP_MIN_BYTES = 64 * 2**20
CREEP_MIN_STEPS = 3
CREEP_WARN_S = 24 * 3600.0  # full within a day: warn; later: info
INPUT_GPU_UTIL = 50  # %: a GPU busy at most half the time ...
INPUT_WORKER_SHARE = 0.9  # ... while its loader's workers each use this share of a core: input-bound


def foreign_processes(node: NodeObservation) -> list[Finding]:
    pids = job_pids(node)
    out = []
    for g, t in sorted(sampled_traces(node).items()):
        seen: dict[int, list[int | None]] = {}
        for s in t.samples:
            for pid, used in s.processes:
                if pid not in pids:
                    seen.setdefault(pid, []).append(used)
        for pid, used in sorted(seen.items()):
            who = node.others.get(pid) or {}
            mem = max((u for u in used if u is not None), default=None)
            share = len(used) / len(t.samples)
            user = who.get("user")
            what = f"PID {pid}" + (f" of user {user}" if user else "")
            if who.get("cmdline"):
                what += f" (`{' '.join(who['cmdline'])[:80]}`)"
            if who.get("slurm_job"):  # its own environment's word, no proof (node.job_processes): said as such
                what += f", its environment naming SLURM job {str(who['slurm_job'])[:20]}"
            visible = bool(who)
            msg = (
                f"{node.node} GPU {g}: {what} is not a process of this job"
                + (f" and holds {gib(mem)}" if mem else "")
                + f" ({share:.0%} of the window's samples)"
            )
            if not visible:
                msg += "; it is not visible in the node's /proc (another PID namespace, or it has exited)"
            out.append(
                make(
                    "GD-WATCH-003",
                    Severity.WARN if visible else Severity.INFO,
                    msg,
                    manual(f"Stop PID {pid} if it is yours; otherwise exclude {node.node}", f"kill {pid}")
                    if visible
                    else None,
                    node=node.node,
                    gpu=g,
                    pid=pid,
                    user=user,
                    used_memory_bytes=mem,
                    sample_share=round(share, 3),
                )
            )
    return out


# ---------------------------------------------------------------- GD-WATCH-004


def _reasons(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


def _busy_clock(t: GpuTrace) -> float | None:
    busy = [s.sm_clock_mhz for s in t.samples if (s.util_gpu or 0) >= BUSY_UTIL and s.sm_clock_mhz is not None]
    return statistics.median(busy) if len(busy) >= max(MIN_SAMPLES, len(t.samples) // 2) else None


def throttled(node: NodeObservation) -> list[Finding]:
    from gpudoctor.checks.hardware.gpu import SLOWDOWN_REASONS

    traces = sampled_traces(node)
    clocks = {g: c for g, t in traces.items() if (c := _busy_clock(t)) is not None}
    out = []
    for g, t in sorted(traces.items()):
        n = len(t.samples)
        counts: dict[str, int] = {}
        for s in t.samples:
            for r in _reasons(s.clock_event_reasons or 0):
                counts[r] = counts.get(r, 0) + 1
        causes = {r: c for r, c in counts.items() if r in CAUSE_REASONS and c >= max(3, CAUSE_SHARE * n)}
        ev = {"node": node.node, "gpu": g, "reason_share": {r: round(c / n, 3) for r, c in counts.items()}}
        ev.update(sm_clock_busy_median_mhz=clocks.get(g), sm_clock_max_mhz=t.sm_clock_max_mhz)
        temps = [s.temp_c for s in t.samples if s.temp_c is not None]
        ev["temp_max_c"] = max(temps) if temps else None
        others = [c for o, c in clocks.items() if o != g]
        slow = g in clocks and others and clocks[g] < SLOW_CLOCK * statistics.median(others)
        if not causes and not slow:
            continue
        parts = []
        if causes:
            parts.append(
                ", ".join(f"{SLOWDOWN_REASONS.get(r, r)} in {c / n:.0%} of samples" for r, c in causes.items())
            )
        if slow:
            ev["others_busy_median_mhz"] = statistics.median(others)
            parts.append(
                f"SM clock {clocks[g]:.0f} MHz under full load while the node's other busy GPUs run at "
                f"{statistics.median(others):.0f} MHz" + (f" (active: {', '.join(sorted(counts))})" if counts else "")
            )
        out.append(
            make(
                "GD-WATCH-004",
                Severity.WARN,
                f"{node.node} GPU {g} is slowed: " + "; ".join(parts),
                manual(
                    f"Look at {node.node}'s GPU {g}; exclude the node until it is fixed",
                    f"nvidia-smi -i {g} -q -d PERFORMANCE,TEMPERATURE,POWER",
                    f"sbatch --exclude={node.node} ...",
                ),
                **ev,
            )
        )
    return out


# ---------------------------------------------------------------- GD-WATCH-005


@dataclass(frozen=True)
class Creep:
    slope_bytes_per_s: float
    r: float
    rises: int
    rise_bytes: float
    last_bytes: int
    seconds_to_full: float | None


def creep(t: GpuTrace) -> Creep | None:
    """The used memory's growth after warm-up, when it is a steady rise (module docstring); else None."""
    pts = [(s.t, s.mem_used_bytes) for s in t.samples if s.mem_used_bytes is not None]
    if len(pts) < MIN_SAMPLES:
        return None
    start = pts[0][0] + WARMUP_SHARE * (pts[-1][0] - pts[0][0])
    pts = [p for p in pts if p[0] >= start]
    if len(pts) < MIN_SAMPLES:
        return None
    xs, ys = [float(p[0]) for p in pts], [float(p[1]) for p in pts]
    if len(set(ys)) < 2 or len(set(xs)) < 2:
        return None
    slope, _ = statistics.linear_regression(xs, ys)
    r = statistics.correlation(xs, ys)
    rises = sum(1 for a, b in zip(ys, ys[1:], strict=False) if b > a)
    rise = slope * (xs[-1] - xs[0])
    if slope <= 0 or r < CREEP_R or rises < CREEP_MIN_STEPS or rise < CREEP_MIN_BYTES:
        return None
    total = t.memory_total_bytes
    to_full = max(0.0, (total - ys[-1]) / slope) if total else None
    return Creep(slope, r, rises, rise, int(ys[-1]), to_full)


def memory_creeping(node: NodeObservation) -> list[Finding]:
    out = []
    for g, t in sorted(sampled_traces(node).items()):
        c = creep(t)
        if c is None:
            continue
        holders = sorted({pid for s in t.samples for pid, _ in s.processes})
        when = f"full in about {secs(c.seconds_to_full)} at this rate" if c.seconds_to_full is not None else ""
        msg = (
            f"{node.node} GPU {g}: used memory grows {gib(c.slope_bytes_per_s)}/s after warm-up "
            f"({gib(c.rise_bytes)} in the window, now {gib(c.last_bytes)} of {gib(t.memory_total_bytes)})"
            + (f"; {when}" if when else "")
            + (f"; processes on it: {', '.join(str(p) for p in holders)}" if holders else "")
        )
        sev = Severity.WARN if c.seconds_to_full is None or c.seconds_to_full <= CREEP_WARN_S else Severity.INFO
        out.append(
            make(
                "GD-WATCH-005",
                sev,
                msg,
                None,
                node=node.node,
                gpu=g,
                slope_bytes_per_s=round(c.slope_bytes_per_s),
                correlation=round(c.r, 3),
                seconds_to_full=None if c.seconds_to_full is None else round(c.seconds_to_full, 1),
                used_bytes=c.last_bytes,
                total_bytes=t.memory_total_bytes,
                pids=holders,
            )
        )
    return out


# ---------------------------------------------------------------- GD-WATCH-002


def held_but_idle(node: NodeObservation) -> list[Finding]:
    pids = {p.pid: p for p in node.processes}
    out = []
    for g, t in sorted(sampled_traces(node).items()):
        utils = util_samples(t)
        if not utils or sum(1 for u in utils if u <= IDLE_UTIL) < IDLE_SHARE * len(utils) or creep(t) is not None:
            continue
        held: dict[int, list[int]] = {}
        for s in t.samples:
            for pid, used in s.processes:
                if pid in pids and used is not None:
                    held.setdefault(pid, []).append(used)
        for pid, used in sorted(held.items()):
            mem = statistics.median(used)
            if mem < HELD_BYTES:
                continue
            p = pids[pid]
            cpu = ""
            busy = p.cpu_share(node.window_s)
            if busy is not None:
                cpu = f"; it used {busy:.0%} of a CPU meanwhile" + (
                    " (no progress on the CPU either: stuck)" if busy < 0.02 else " (busy on the CPU)"
                )
            cpu += where_stuck(p)
            span = t.samples[-1].t - t.samples[0].t
            msg = (
                f"{node.node} GPU {g}: PID {pid} (`{' '.join(p.cmdline)[:80]}`) holds {gib(mem)} and the GPU did "
                f"nothing for {secs(span)} (utilization <= {IDLE_UTIL} % in "
                f"{sum(1 for u in utils if u <= IDLE_UTIL) / len(utils):.0%} of samples){cpu}: a hung rank, or one "
                "waiting for input or for the other ranks"
            )
            out.append(
                make(
                    "GD-WATCH-002",
                    Severity.WARN,
                    msg,
                    manual(f"Look at what PID {pid} waits for", f"py-spy dump --pid {pid}"),
                    node=node.node,
                    gpu=g,
                    pid=pid,
                    used_memory_bytes=int(mem),
                    idle_seconds=round(span, 1),
                    stack=p.stack,
                    flight_recorder={k: v for k, v in p.env.items() if k in FLIGHT_RECORDER} or None,
                )
            )
    return out


def waits_for_input(node: NodeObservation) -> list[Finding]:
    traces = sampled_traces(node)
    out = []
    for r in ranks_on(node):
        pid = r.process.pid
        on = [g for g, t in sorted(traces.items()) if any(pid == q for s in t.samples for q, _ in s.processes)]
        if len(on) != 1:
            continue  # its GPU is not known from NVML (or it drives several): not judged
        utils = util_samples(traces[on[0]])
        workers = [p for p in node.processes if p.ppid == pid and p.runs_python]
        shares = [x for p in workers if (x := p.cpu_share(node.window_s)) is not None]
        if not utils or not shares or len(shares) < len(workers):
            continue
        util, busy = statistics.median(utils), statistics.median(shares)
        if util > INPUT_GPU_UTIL or busy < INPUT_WORKER_SHARE:
            continue
        out.append(
            make(
                "GD-WATCH-007",
                Severity.WARN,
                f"{node.node} GPU {on[0]}: utilization {util:.0f} % (median) while the {len(workers)} Python child "
                f"process(es) of PID {pid} (DataLoader workers) each used {busy:.0%} of a core (median): the GPU "
                "waits for input",
                manual(
                    "Make the input keep up: more workers where CPUs are free, cheaper batches, persistent workers",
                    "gpudoctor check --config <the training config>",
                ),
                node=node.node,
                gpu=on[0],
                pid=pid,
                median_util_pct=util,
                worker_cpu_shares=[round(x, 3) for x in shares],
            )
        )
    return out
