"""The pure judgement of `gpudoctor watch`: one node's observation (samples.NodeObservation) -> Findings.

No I/O here: the node probe (node.py) and the command (cli.py) gather; these rules judge, so every rule runs on
recorded data in the tests (tests/fixtures/watch/: a real H200's NVML trace; constructed process tables).

The rules, and what they rest on:
- allocated GPUs no process of the job uses (GD-WATCH-001). With NVML: no process of the job has a context on
  the GPU in any sample (nvmlDeviceGetComputeRunningProcesses), its utilization stays at or below IDLE_UTIL, and
  nothing /proc cannot name holds it (a PID the node's /proc does not show, or HELD_BYTES held with no process
  listed): inside a container NVML lists host PIDs the job's /proc does not show, and a GPU at work is not
  idle whoever runs on it. Without NVML: what each training process can see -- its own CUDA_VISIBLE_DEVICES read
  as the CUDA driver reads it (readers/cudavis), counted against the GPUs its step holds (SLURM_STEP_GPUS, or
  SLURM_JOB_GPUS in the batch step). SLURM writes indices local to the step when devices are constrained
  (task/cgroup ConstrainDevices: physical 4,5 read 0,1) and the physical indices otherwise; which one a node
  uses is read from a task leader's own environment, where SLURM's value is still as SLURM wrote it. A GPU no
  training process can see is certainly unused; a GPU only a process that sees several can use is unused by
  convention (CUDA's current device is 0 until the program calls cudaSetDevice/torch.cuda.set_device; the
  launchers' convention is cuda:LOCAL_RANK), which the program may break by driving several GPUs itself: said
  so, and a warn rather than a fail.
- a training process is a Python process of the job that is not a launcher (torchrun, python -m
  torch.distributed.run/launch, accelerate launch, deepspeed: readers/sbatch/launch.describe_command reads their
  command lines) and whose parent is not another such process, or is a launcher, or gave it another LOCAL_RANK
  (Lightning's own launcher: the main process is local rank 0 and starts the others). Children with their
  parent's LOCAL_RANK are its helpers (DataLoader workers, compile workers).
- another process on a job's GPU (GD-WATCH-003): an NVML process that is none of the job's, named with the
  PID and the user /proc shows for it on the node.
- throttling that is a cause (GD-WATCH-004): NVML's clock event reasons (nvml.h nvmlClocksEventReason*, the same
  bits as probe/nvidia.THROTTLE_REASONS): thermal slowdowns, HW slowdown and the power brake, in CAUSE_SHARE of
  the samples or more; the software power cap is what a GPU at full load does (the recorded H200 at 691 W of
  700 with SM 1485 of 1980 MHz) and is not a cause. Also a GPU whose median SM clock under full load is below
  SLOW_CLOCK of the node's other GPUs under the same load, whatever the reason.
- memory creeping toward the limit (GD-WATCH-005): after the window's first WARMUP_SHARE, a straight-line fit of
  used memory with correlation >= CREEP_R, at least CREEP_MIN_STEPS rises and CREEP_MIN_BYTES in all; the slope
  and the time until the GPU is full at that rate.
- a GPU held but idle (GD-WATCH-002): a job process holds HELD_BYTES or more on a GPU whose utilization stays at
  or below IDLE_UTIL in IDLE_SHARE of the samples, and whose memory is not creeping: a hung or waiting rank.
- waiting for input (GD-WATCH-007): a training process's GPU (the one NVML lists it on) busy at most
  INPUT_GPU_UTIL % (median) while its Python children (DataLoader workers) each use INPUT_WORKER_SHARE of a core
  or more (median, CPU time over the window): the loader sets the pace. Without NVML, or without workers, not
  judged (a process loading in its own main thread looks like any CPU-bound process from outside).
- GD-WATCH-002 adds the process's innermost Python frame where the probe could take its stack (py-spy, for a
  Python process that used under 2 % of a core), and where PyTorch's flight recorder writes its dump when the
  job set one: TORCH_NCCL_TRACE_BUFFER_SIZE (or TORCH_FR_BUFFER_SIZE) > 0 turns the ring buffer on, and on a
  collective's timeout each rank writes to TORCH_NCCL_DEBUG_INFO_TEMP_FILE (TORCH_FR_DUMP_TEMP_FILE in newer
  releases) followed by its rank (PyTorch's torch_nccl_environment_variables page; torchtitan sets the prefix
  `<dir>/rank_`).
- a suspected hang (GD-WATCH-008): every training process of the job used under NO_PROGRESS_SHARE of a core for
  a window of HANG_MIN_WINDOW_S or more, no GPU sampled did work (a GPU at work may keep its process's CPU idle
  in a blocking sync), and the stacks (py-spy) show at least one main thread waiting in a torch.distributed
  collective; without that evidence a sleep, a pause or a wait for I/O look the same, and it is a skip that says
  so. The process the others wait for is the one whose main thread is not in a collective while others' are.
  A rank spinning in an NCCL collective uses its CPU (CUDA's spin wait) and its GPU (the NCCL kernel), so this
  rule does not see NCCL hangs: that needs the in-process heartbeat or a GPU machine to calibrate.
- not observed (GD-WATCH-006): a node that did not answer is a fail ("could not observe", never healthy); a
  node without NVML is info, naming the rules that could not be judged there.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

from gpudoctor.model import (
    SPAWNING_LAUNCHERS,
    Action,
    ActionKind,
    Finding,
    Fix,
    Safety,
    Severity,
    manual,
)
from gpudoctor.probe.nvidia import THROTTLE_REASONS
from gpudoctor.readers import cudavis, slurmfmt
from gpudoctor.readers.sbatch.launch import describe_command
from gpudoctor.watch.samples import NO_PROGRESS_SHARE, GpuTrace, JobProcess, NodeObservation

IDLE_UTIL = 5  # %: at or below, the GPU did no work in that sample
IDLE_SHARE = 0.9  # share of the window's samples that must be idle for "did nothing"
HELD_BYTES = 2**30  # memory a process must hold for "holds the GPU"
CAUSE_REASONS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
CAUSE_SHARE = 0.2  # share of samples with a cause reason active
BUSY_UTIL = 90  # %: "under full load" for comparing clocks between GPUs
SLOW_CLOCK = 0.85  # a busy GPU's median SM clock below this share of the node's other busy GPUs'
WARMUP_SHARE = 0.25
CREEP_R = 0.9
CREEP_MIN_BYTES = 64 * 2**20
CREEP_MIN_STEPS = 3
CREEP_WARN_S = 24 * 3600.0  # full within a day: warn; later: info
MIN_SAMPLES = 5
HANG_MIN_WINDOW_S = 10.0
INPUT_GPU_UTIL = 50  # %: a GPU busy at most half the time ...
INPUT_WORKER_SHARE = 0.9  # ... while its loader's workers each use this share of a core: input-bound
# Launchers started as `python /path/bin/NAME ...` (their console scripts' shebang): read NAME's own arguments.
LAUNCHER_SCRIPTS = ("torchrun", "accelerate", "deepspeed", "lightning", "fabric")
# The batch-script checks that explain idle GPUs (checks/slurm.py), in the order their fixes are combined.
CAUSE_CHECKS = ("GD-SLURM-003", "GD-SLURM-010", "GD-SLURM-005")


def make(fid: str, severity: Severity, message: str, fix: Fix | None = None, **evidence) -> Finding:
    import gpudoctor.checks.watch  # noqa: F401  (registers the GD-WATCH verdicts)
    from gpudoctor.registry import registered

    spec = registered(fid)
    if spec is None or spec.source != "watch":
        raise KeyError(f"{fid} is not a watch verdict (checks/watch.py)")
    return Finding(fid, spec.name, spec.category, severity, spec.title, message, evidence, fix)


# ---------------------------------------------------------------- the job's training processes


def _describe(p: JobProcess) -> dict:
    words = list(p.cmdline)
    try:
        desc = describe_command(words)
        script = os.path.basename(desc.get("script") or "")
        if desc.get("launcher") == "python" and script in LAUNCHER_SCRIPTS:
            at = next(i for i, w in enumerate(words) if w == desc["script"])
            desc = describe_command(words[at:])
    except Exception:  # a command line the launch reader cannot follow: judged as a plain process
        return {}
    return desc


def _is_launcher(desc: dict) -> bool:
    if desc.get("launcher") in SPAWNING_LAUNCHERS:
        return True
    return desc.get("launcher") == "lightning" and desc.get("program") in ("lightning", "fabric")


def _is_gpudoctor(desc: dict) -> bool:
    return bool(desc.get("gpudoctor")) or (desc.get("module") or "").startswith("gpudoctor")


def training_processes(processes: tuple[JobProcess, ...]) -> list[JobProcess]:
    """The job's training processes (the module docstring's rule), in PID order."""
    by_pid = {p.pid: p for p in processes}
    desc = {p.pid: _describe(p) for p in processes}
    out = []
    for p in processes:
        d = desc[p.pid]
        if not p.runs_python or _is_launcher(d) or _is_gpudoctor(d):
            continue
        parent = by_pid.get(p.ppid) if p.ppid is not None else None
        pd = desc.get(parent.pid, {}) if parent is not None else {}
        if (
            parent is None
            or not parent.runs_python
            or _is_launcher(pd)
            or p.env.get("LOCAL_RANK") != parent.env.get("LOCAL_RANK")
        ):
            out.append(p)
    return sorted(out, key=lambda p: p.pid)


# ---------------------------------------------------------------- which GPUs a process can see and uses


def _indices(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return slurmfmt.parse_index_list(text)
    except slurmfmt.SlurmFormatError:
        return None


def local_numbering(node: NodeObservation) -> bool:
    """Whether SLURM numbers CUDA_VISIBLE_DEVICES from 0 within each step on this node (devices constrained),
    read from a task leader (a job process whose parent is not one): its value is SLURM's own."""
    pids = {p.pid for p in node.processes}
    for p in node.processes:
        if p.ppid in pids:
            continue
        base = _indices(p.env.get("SLURM_STEP_GPUS") or p.env.get("SLURM_JOB_GPUS"))
        seen = _indices(p.env.get(cudavis.VARIABLE))
        if not base or seen is None:
            continue
        if seen == base:
            return False
        if seen == list(range(len(base))):
            return True
    return False


def visible_gpus(p: JobProcess, node: NodeObservation, local: bool) -> tuple[int, ...] | None:
    """The node's GPU indices process p can use, in CUDA's order; None when they cannot be told (a UUID without
    NVML, an unreadable base)."""
    base = _indices(p.env.get("SLURM_STEP_GPUS") or p.env.get("SLURM_JOB_GPUS")) or list(node.allocated)
    uuids = {g.index: g.uuid for g in node.gpus}
    if local:
        order = base
    else:
        named = _indices(p.env.get(cudavis.VARIABLE)) or []
        order = list(range(max([*base, *node.allocated, *named, -1]) + 1))
    gpus = [{"index": i, "uuid": uuids.get(i)} for i in order]
    value = p.env.get(cudavis.VARIABLE)
    vis = cudavis.parse_visible_devices(value, gpus)
    if value is None:
        return tuple(base)  # SLURM always sets it in a job with GPUs; unset: the step's GPUs
    if any(e.kind in ("gpu_uuid", "mig") for e in vis.entries) and not all(g["uuid"] for g in gpus):
        return None  # a UUID names a GPU only NVML can tell (it was not readable)
    return vis.gpus


@dataclass(frozen=True)
class Rank:
    process: JobProcess
    sees: tuple[int, ...] | None
    runs_on: int | None
    why: str

    def describe(self) -> str:
        p = self.process
        cmd = " ".join(p.cmdline)[:80] or "?"
        seen = "unknown GPUs" if self.sees is None else f"GPU(s) {_list(self.sees)}"
        cvd = p.env.get(cudavis.VARIABLE)
        shown = f"CUDA_VISIBLE_DEVICES={cvd}" if cvd is not None else "CUDA_VISIBLE_DEVICES unset"
        return f"PID {p.pid} `{cmd}` ({shown}: sees {seen})"


def ranks_on(node: NodeObservation) -> list[Rank]:
    local = local_numbering(node)
    out = []
    for p in training_processes(node.processes):
        sees = visible_gpus(p, node, local)
        runs_on, why = None, "unknown"
        if sees:
            lr = p.env.get("LOCAL_RANK")
            if len(sees) == 1:
                runs_on, why = sees[0], "the only GPU it can see"
            elif lr is not None and lr.isdigit() and int(lr) < len(sees):
                runs_on, why = sees[int(lr)], f"cuda:{lr} by the launchers' convention (LOCAL_RANK={lr})"
            else:
                runs_on, why = sees[0], "cuda:0, CUDA's current device until the program picks another"
        out.append(Rank(p, sees, runs_on, why))
    return out


# ---------------------------------------------------------------- GD-WATCH-001


def _traces(node: NodeObservation) -> dict[int, GpuTrace]:
    return {g.index: g for g in node.gpus if g.index in node.allocated and g.samples}


def _utils(trace: GpuTrace) -> list[int]:
    return [s.util_gpu for s in trace.samples if s.util_gpu is not None]


def _job_pids(node: NodeObservation) -> set[int]:
    return {p.pid for p in node.processes}


def _unused_by_nvml(node: NodeObservation) -> tuple[list[int], dict]:
    traces, pids = _traces(node), _job_pids(node)
    unused, util = [], {}
    for g in node.allocated:
        t = traces.get(g)
        if t is None:
            continue
        utils = _utils(t)
        median = statistics.median(utils) if utils else None
        util[g] = median
        on_it = any(pid in pids for s in t.samples for pid, _ in s.processes)
        if not on_it and median is not None and median <= IDLE_UTIL and not _unknown_holder(t, node):
            unused.append(g)
    return unused, util


def _unknown_holder(t: GpuTrace, node: NodeObservation) -> bool:
    """Something holds the GPU that /proc cannot name: a PID NVML lists that the node's /proc does not show, or
    memory held with no process listed -- inside a container NVML's PIDs are the host's. It may be the job's."""
    pids = {pid for s in t.samples for pid, _ in s.processes}
    if pids - _job_pids(node) - set(node.others):
        return True
    used = [s.mem_used_bytes for s in t.samples if s.mem_used_bytes is not None]
    return not pids and bool(used) and statistics.median(used) >= HELD_BYTES


def unused_gpus(node: NodeObservation, script_causes: list[Finding] | None = None) -> Finding | None:
    """GD-WATCH-001 for one node; None when every allocated GPU is used (or nothing can be said)."""
    if not node.observed or not node.allocated:
        return None
    ranks = ranks_on(node)
    ev: dict = {"node": node.node, "allocated": list(node.allocated), "window_s": node.window_s}
    ev["training_processes"] = [
        {"pid": r.process.pid, "sees": None if r.sees is None else list(r.sees), "runs_on": r.runs_on, "why": r.why}
        for r in ranks
    ]
    certain: list[int]
    likely: list[int] = []
    if _traces(node):
        certain, util = _unused_by_nvml(node)
        ev["median_util_pct"] = util
        basis = (
            f"no process of the job had a context on {'it' if len(certain) == 1 else 'them'} during the "
            f"{_secs(node.window_s)} window and utilization stayed at or below {IDLE_UTIL} % (NVML)"
        )
    else:
        known = [r for r in ranks if r.sees is not None]
        seen = {g for r in known for g in r.sees or ()}
        used = {r.runs_on for r in known}
        certain = [g for g in node.allocated if g not in seen]
        if len(known) < len(ranks):  # a process whose GPUs cannot be told may use any of them
            certain = []
        likely = [g for g in node.allocated if g in seen and g not in used] if len(known) == len(ranks) else []
        basis = "no training process of the job can see " + ("it" if len(certain) == 1 else "them")
        basis += " (each process's own CUDA_VISIBLE_DEVICES, read from /proc; NVML was not readable)"
    if not certain and not likely:
        return None
    n = len(node.allocated)
    parts = []
    if certain:
        parts.append(f"GPU(s) {_list(certain)}: {basis}")
    if likely:
        users = [r for r in ranks if r.sees and set(likely) & set(r.sees)]
        parts.append(
            f"GPU(s) {_list(likely)}: only "
            + "; ".join(f"{r.describe()}, which runs on GPU {r.runs_on} ({r.why}){_helpers(r, node)}" for r in users)
            + " can use them: idle unless the program drives several GPUs itself"
        )
    cause = _cause(ranks, n)
    overrides = overridden(node, ranks)
    if overrides:
        cause += ". " + "; ".join(
            f"PID {r.process.pid}'s CUDA_VISIBLE_DEVICES={r.process.env.get(cudavis.VARIABLE)} was set by the job, "
            f"not by SLURM (SLURM set {slurm} for its step)"
            for r, slurm in overrides
        )
    ev.update(unused=certain, unused_by_convention=likely, cause=cause)
    fix = _script_fix(script_causes or [])
    if overrides:
        leave = manual(
            "Leave CUDA_VISIBLE_DEVICES to SLURM",
            *sorted(
                {
                    f"do not set CUDA_VISIBLE_DEVICES={r.process.env.get(cudavis.VARIABLE)} before starting "
                    f"`{' '.join(r.process.cmdline)[:60]}`; SLURM sets it"
                    for r, _ in overrides
                }
            ),
        )
        fix = _join([fix, leave] if fix is not None else [leave])
    if script_causes:
        ev["batch_script"] = {f.id: f.message for f in script_causes}
    msg = f"{node.node}: {len(certain) + len(likely)} of {n} allocated GPU(s) unused -- " + "; ".join(parts)
    msg += f". {cause}"
    if script_causes:
        msg += ". The batch script says why: " + " ".join(f"{f.id}: {f.message}" for f in script_causes)
    elif fix is None:
        fix = manual(
            f"Start one process per GPU on {node.node} ({n}), or request only the GPUs the job uses",
            f"srun --ntasks-per-node={n} <the training command>, or one task per node running "
            f"torchrun --nproc-per-node={n} <the training script>",
        )
    return make("GD-WATCH-001", Severity.FAIL if certain else Severity.WARN, msg, fix, **ev)


def _helpers(rank: Rank, node: NodeObservation) -> str:
    """Its Python children, which may be DataLoader workers or workers of its own on other GPUs
    (torch.multiprocessing.spawn sets no LOCAL_RANK): said, since /proc cannot tell them apart."""
    children = [p for p in node.processes if p.ppid == rank.process.pid and p.runs_python]
    if not children:
        return ""
    return (
        f"; it has {len(children)} Python child process(es): DataLoader workers, or workers of its own that may "
        "use the other GPUs"
    )


def _cause(ranks: list[Rank], gpus: int) -> str:
    if not ranks:
        return f"No training process of the job runs on this node ({gpus} GPU(s) allocated)"
    listed = "; ".join(r.describe() for r in ranks[:4]) + (f"; and {len(ranks) - 4} more" if len(ranks) > 4 else "")
    if len(ranks) < gpus:
        return f"Likely cause: {len(ranks)} training process(es) where {gpus} were meant (one per GPU): {listed}"
    return f"Training processes: {listed}"


def overridden(node: NodeObservation, ranks: list[Rank]) -> list[tuple[Rank, str]]:
    """Training processes whose CUDA_VISIBLE_DEVICES is not the value SLURM set for their step (read from the
    step's task leader, whose environment SLURM wrote), with SLURM's value."""
    pids = {p.pid for p in node.processes}
    slurm: dict[str | None, str] = {}
    for p in node.processes:
        if p.ppid not in pids and cudavis.VARIABLE in p.env:
            slurm.setdefault(p.env.get("SLURM_STEP_ID"), p.env[cudavis.VARIABLE])
    out = []
    for r in ranks:
        mine = r.process.env.get(cudavis.VARIABLE)
        theirs = slurm.get(r.process.env.get("SLURM_STEP_ID"))
        if r.process.ppid in pids and mine is not None and theirs is not None and mine != theirs:
            out.append((r, theirs))
    return out


def _script_fix(causes: list[Finding]) -> Fix | None:
    """The batch-script checks' own fixes, joined into one (each check's rule stays in checks/slurm.py)."""
    return _join([f.fix for f in causes if f.fix is not None])


def _join(fixes: list[Fix]) -> Fix | None:
    if not fixes:
        return None
    if len(fixes) == 1:
        return fixes[0]
    actions: list[Action] = []
    for fx in fixes:
        actions += [a for a in fx.actions if a not in actions]
    safety = (
        Safety.MANUAL
        if all(fx.safety is Safety.MANUAL for fx in fixes)
        else Safety.UNSAFE
        if any(fx.safety is not Safety.SAFE for fx in fixes)
        else Safety.SAFE
    )
    if safety is not Safety.MANUAL and any(a.kind is ActionKind.COMMAND for a in actions):
        safety = Safety.MANUAL  # a fix that mixes edits with instructions is the user's to apply
        actions = [a if a.kind is ActionKind.COMMAND else Action(ActionKind.COMMAND, fix_line(a)) for a in actions]
    return Fix("; ".join(fx.title for fx in fixes), safety, tuple(actions))


def fix_line(a: Action) -> str:
    """One edit of a batch script as the line the user writes."""
    if a.kind is ActionKind.SBATCH_SET:
        return f"#SBATCH --{a.key}={a.value}"
    if a.kind is ActionKind.SBATCH_REMOVE:
        return f"remove #SBATCH --{a.key}"
    if a.kind is ActionKind.SRUN_PREFIX:
        return f"start the launch line with `{('srun ' + (a.value or '')).strip()}`"
    if a.kind is ActionKind.EXPORT_REMOVE:
        return f"remove the assignment of {a.key} before the launch line"
    if a.kind is ActionKind.EXPORT_SET:
        return f"export {a.key}={a.value}"
    if a.kind is ActionKind.OVERRIDE_SET:
        return f"--{a.key}={a.value} on the launch line"
    return str(a.target)


# ---------------------------------------------------------------- GD-WATCH-003


def foreign_processes(node: NodeObservation) -> list[Finding]:
    pids = _job_pids(node)
    out = []
    for g, t in sorted(_traces(node).items()):
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
            if who.get("slurm_job"):
                what += f", of SLURM job {who['slurm_job']}"
            visible = bool(who)
            msg = (
                f"{node.node} GPU {g}: {what} is not a process of this job"
                + (f" and holds {_gib(mem)}" if mem else "")
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

    traces = _traces(node)
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
    for g, t in sorted(_traces(node).items()):
        c = creep(t)
        if c is None:
            continue
        holders = sorted({pid for s in t.samples for pid, _ in s.processes})
        when = f"full in about {_secs(c.seconds_to_full)} at this rate" if c.seconds_to_full is not None else ""
        msg = (
            f"{node.node} GPU {g}: used memory grows {_gib(c.slope_bytes_per_s)}/s after warm-up "
            f"({_gib(c.rise_bytes)} in the window, now {_gib(c.last_bytes)} of {_gib(t.memory_total_bytes)})"
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
    for g, t in sorted(_traces(node).items()):
        utils = _utils(t)
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
            cpu += _where_stuck(p)
            span = t.samples[-1].t - t.samples[0].t
            msg = (
                f"{node.node} GPU {g}: PID {pid} (`{' '.join(p.cmdline)[:80]}`) holds {_gib(mem)} and the GPU did "
                f"nothing for {_secs(span)} (utilization <= {IDLE_UTIL} % in "
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


FLIGHT_RECORDER = (
    "TORCH_NCCL_TRACE_BUFFER_SIZE",
    "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    "TORCH_FR_DUMP_TEMP_FILE",
)


def innermost_frame(stack: str | None) -> str | None:
    """The innermost Python frame of the main thread in `py-spy dump` output (each thread's frames follow its
    `Thread N (...): "name"` line, innermost first, indented); None without a readable stack."""
    if not stack or stack.startswith(("py-spy", "cannot run")):
        return None
    blocks: list[tuple[str, list[str]]] = []
    for line in stack.splitlines():
        if line.startswith("Thread "):
            blocks.append((line, []))
        elif line.startswith("    ") and line.strip() and blocks:
            blocks[-1][1].append(line.strip())
    main = [frames for head, frames in blocks if '"MainThread"' in head and frames]
    frames = main[0] if main else next((f for _, f in blocks if f), [])
    return frames[0][:160] if frames else None


def in_collective(frame: str | None) -> bool:
    """A frame of torch.distributed's collectives (distributed_c10d.py and the modules under torch/distributed)."""
    return frame is not None and ("distributed_c10d" in frame or "torch/distributed/" in frame)


def _where_stuck(p: JobProcess) -> str:
    """Its innermost Python frame and where its flight recorder dump will go, where the probe saw them."""
    out = ""
    frame = innermost_frame(p.stack)
    if frame is not None:
        out += f"; its stack (py-spy) is in {frame}"
    elif p.stack:
        out += f"; no stack: {p.stack[:160]}"
    dump = p.env.get("TORCH_FR_DUMP_TEMP_FILE") or p.env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    if dump and (p.env.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or p.env.get("TORCH_FR_BUFFER_SIZE")):
        out += f"; its flight recorder dumps to {dump}<rank> on a collective's timeout"
    return out


# ---------------------------------------------------------------- GD-WATCH-008


def suspected_hang(nodes: list[NodeObservation]) -> Finding | None:
    """Every training process of the job, on every node that answered, used under NO_PROGRESS_SHARE of a core
    for a window of HANG_MIN_WINDOW_S or more, and none of their GPUs NVML sampled did work: nothing moved.
    The one the others wait for is named where the stacks say it: the ranks whose main thread is not in a
    torch.distributed collective while others' are (a rank that never reaches the collective)."""
    observed = [n for n in nodes if n.observed and n.window_s and n.window_s >= HANG_MIN_WINDOW_S]
    if not observed or len(observed) < len([n for n in nodes if n.observed]):
        return None
    ranks = [(n, r) for n in observed for r in ranks_on(n)]
    shares = [r.process.cpu_share(n.window_s) for n, r in ranks]
    if not ranks or any(x is None or x >= NO_PROGRESS_SHARE for x in shares):
        return None
    for n in observed:
        traces = _traces(n)
        busy = [g for g, t in traces.items() if (u := _utils(t)) and statistics.median(u) > IDLE_UTIL]
        if busy:
            return None  # a GPU at work: the CPU may just wait for it (blocking sync)
    window = min(n.window_s or 0.0 for n in observed)
    frames = {r.process.pid: innermost_frame(r.process.stack) for _, r in ranks}
    waiting = [r for _, r in ranks if in_collective(frames[r.process.pid])]
    elsewhere = [
        (n, r) for n, r in ranks if frames[r.process.pid] is not None and not in_collective(frames[r.process.pid])
    ]
    idle = (
        f"{len(ranks)} training process(es) on {len(observed)} node(s) each used under {NO_PROGRESS_SHARE:.0%} of a "
        f"core for {_secs(window)} and no GPU sampled did work"
    )
    if not waiting:  # a sleep, a pause or a wait outside torch.distributed: not a hang gpudoctor can tell
        why = "none is in a torch.distributed collective" if any(frames.values()) else "no stacks (py-spy)"
        return make(
            "GD-WATCH-008",
            Severity.SKIP,
            f"{idle}; {why}: a hang cannot be told from a pause"
            + ("" if any(frames.values()) else "; install py-spy on the nodes for each process's stack"),
            window_s=window,
        )
    msg = f"no training process of the job made progress: {idle}, and {len(waiting)} wait in a collective"
    if elsewhere:
        msg += ". " + "; ".join(
            f"{n.node} PID {r.process.pid}{_rank(r.process)} is not in a collective (in {frames[r.process.pid]})"
            for n, r in elsewhere
        )
        msg += f" while {len(waiting)} other(s) wait in one (in {frames[waiting[0].process.pid]}): they wait for it"
    else:
        msg += f" (in {frames[waiting[0].process.pid]}): a hang, or a slow collective"
    ev = {
        "window_s": window,
        "processes": [
            {"node": n.node, "pid": r.process.pid, "rank": r.process.env.get("RANK"), "frame": frames[r.process.pid]}
            for n, r in ranks
        ],
        "not_in_collective": [r.process.pid for _, r in elsewhere],
    }
    suspects = [r for _, r in elsewhere] or [r for _, r in ranks]
    fix = manual(
        "Read the stuck process's stack, then its flight recorder dump after the timeout",
        *[f"py-spy dump --pid {r.process.pid}" for r in suspects[:4]],
    )
    return make("GD-WATCH-008", Severity.WARN, msg, fix, **ev)


def _rank(p: JobProcess) -> str:
    rank = p.env.get("RANK") or p.env.get("SLURM_PROCID")
    return f" (rank {rank})" if rank is not None else ""


# ---------------------------------------------------------------- GD-WATCH-007


def waits_for_input(node: NodeObservation) -> list[Finding]:
    traces = _traces(node)
    out = []
    for r in ranks_on(node):
        pid = r.process.pid
        on = [g for g, t in sorted(traces.items()) if any(pid == q for s in t.samples for q, _ in s.processes)]
        if len(on) != 1:
            continue  # its GPU is not known from NVML (or it drives several): not judged
        utils = _utils(traces[on[0]])
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


# ---------------------------------------------------------------- GD-WATCH-006 and the whole job


NVML_RULES = ("GD-WATCH-002", "GD-WATCH-003", "GD-WATCH-004", "GD-WATCH-005", "GD-WATCH-007")


def not_observed(node: NodeObservation) -> Finding | None:
    if node.error is not None:
        return make(
            "GD-WATCH-006",
            Severity.FAIL,
            f"{node.node}: could not observe: {node.error}",
            None,
            node=node.node,
            error=node.error,
        )
    if node.allocated and not _traces(node):
        why = node.nvml_error or "no NVML samples of its GPUs"
        return make(
            "GD-WATCH-006",
            Severity.INFO,
            f"{node.node}: GPU utilization, memory and clocks could not be read ({why}): its allocated GPUs are "
            "judged from the processes' own CUDA_VISIBLE_DEVICES only; held-but-idle, foreign processes, "
            "throttling, memory creep and waiting for input are not judged there",
            None,
            node=node.node,
            error=why,
            not_judged=list(NVML_RULES),
        )
    return None


def judge(nodes: list[NodeObservation], script_causes: list[Finding] | None = None) -> list[Finding]:
    """Every rule over every node, then a pass or skip for each verdict nothing was found for."""
    findings: list[Finding] = []
    for node in sorted(nodes, key=lambda n: n.node):
        for f in (not_observed(node), unused_gpus(node, script_causes)):
            if f is not None:
                findings.append(f)
        if node.observed:
            findings += held_but_idle(node) + foreign_processes(node) + throttled(node) + memory_creeping(node)
            findings += waits_for_input(node)
    hang = suspected_hang(nodes)
    if hang is not None:
        findings.append(hang)
    observed = [n for n in nodes if n.observed]
    sampled = [n for n in observed if _traces(n)]
    found = {f.id for f in findings}
    gpus = sum(len(n.allocated) for n in observed)
    for fid in ("GD-WATCH-001", *NVML_RULES, "GD-WATCH-008", "GD-WATCH-006"):
        if fid in found:
            continue
        if fid == "GD-WATCH-008":
            judged = observed and all((n.window_s or 0) >= HANG_MIN_WINDOW_S for n in observed)
            findings.append(
                make(fid, Severity.PASS, "the job's processes made progress on the CPU or GPU")
                if judged
                else make(fid, Severity.SKIP, f"not judged: no node observed for {HANG_MIN_WINDOW_S:g} s or more")
            )
        elif fid == "GD-WATCH-006":
            findings.append(make(fid, Severity.PASS, f"all {len(nodes)} node(s) answered with NVML samples"))
        elif fid == "GD-WATCH-001" and observed:
            findings.append(
                make(fid, Severity.PASS, f"every allocated GPU is used ({gpus} on {len(observed)} node(s))")
            )
        elif sampled:
            findings.append(make(fid, Severity.PASS, f"nothing found on {len(sampled)} node(s) with NVML samples"))
        else:
            findings.append(make(fid, Severity.SKIP, "no NVML samples from any node"))
    return findings


# ---------------------------------------------------------------- words


def _list(items) -> str:
    return ",".join(str(i) for i in items)


def _gib(n: float | None) -> str:
    if n is None:
        return "?"
    return f"{n / 2**30:.1f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.0f} MiB"


def _secs(s: float | None) -> str:
    if s is None:
        return "?"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"
