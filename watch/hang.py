"""GD-WATCH-008, a suspected hang, and the stacks and flight recorder dumps GD-WATCH-002 names (the rule is
judge.py's docstring). Pure."""

from __future__ import annotations

import statistics

from gpudoctor.model import Finding, Severity, manual
from gpudoctor.watch.processes import ranks_on
from gpudoctor.watch.samples import NO_PROGRESS_SHARE, JobProcess, NodeObservation
from gpudoctor.watch.verdict import IDLE_UTIL, make, sampled_traces, secs, util_samples

HANG_MIN_WINDOW_S = 10.0


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


def where_stuck(p: JobProcess) -> str:
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


def stalled_loop(nodes: list[NodeObservation]) -> tuple[Finding | None, bool]:
    """From the heartbeats of gpudoctor.watch.Monitor, where the job runs one: (a finding naming every rank whose
    loop counted no step for 3 of its windows (at least HANG_MIN_WINDOW_S), True) -- this sees a hang whose
    processes spin (NCCL's progress thread keeps a core busy), which CPU time cannot; (None, True) when every
    heartbeat is fresh (the loop moves: no hang, whatever the CPU did); (None, False) with no heartbeat to read."""
    beats = [
        (n, r, r.process.heartbeat)
        for n in nodes
        if n.observed
        for r in ranks_on(n)
        if r.process.heartbeat and not r.process.heartbeat.get("closed")
    ]
    if not beats:
        return None, False
    stalled = [(n, r, b) for n, r, b in beats if b["age_s"] > max(3 * b["window_s"], HANG_MIN_WINDOW_S)]
    if not stalled:
        return None, True
    msg = "; ".join(
        f"{n.node} PID {r.process.pid}{_rank(r.process)} counted no step for {secs(b['age_s'])} (last at step "
        f"{b['step']}; its Monitor writes a heartbeat every {secs(b['window_s'])} window){where_stuck(r.process)}"
        for n, r, b in stalled[:4]
    )
    ev = {
        "heartbeats": [
            {"node": n.node, "pid": r.process.pid, "rank": r.process.env.get("RANK"), **b} for n, r, b in beats
        ],
        "stalled": [r.process.pid for _, r, _ in stalled],
    }
    fix = manual(
        "Read the stalled process's stack, then its flight recorder dump after the timeout",
        *[f"py-spy dump --pid {r.process.pid}" for _, r, _ in stalled[:4]],
    )
    verdict = f"the training loop stopped on {len(stalled)} of {len(beats)} monitored rank(s): {msg}"
    return make("GD-WATCH-008", Severity.WARN, verdict, fix, **ev), True


def suspected_hang(nodes: list[NodeObservation]) -> Finding | None:
    """A stalled heartbeat (stalled_loop) where the job runs gpudoctor.watch.Monitor; else: every training
    process of the job, on every node that answered, used under NO_PROGRESS_SHARE of a core
    for a window of HANG_MIN_WINDOW_S or more, and none of their GPUs NVML sampled did work: nothing moved.
    The one the others wait for is named where the stacks say it: the ranks whose main thread is not in a
    torch.distributed collective while others' are (a rank that never reaches the collective)."""
    from_beats, heard = stalled_loop(nodes)
    if heard:
        return from_beats
    observed = [n for n in nodes if n.observed and n.window_s and n.window_s >= HANG_MIN_WINDOW_S]
    if not observed or len(observed) < len([n for n in nodes if n.observed]):
        return None
    ranks = [(n, r) for n in observed for r in ranks_on(n)]
    shares = [r.process.cpu_share(n.window_s) for n, r in ranks]
    if not ranks or any(x is None or x >= NO_PROGRESS_SHARE for x in shares):
        return None
    for n in observed:
        traces = sampled_traces(n)
        busy = [g for g, t in traces.items() if (u := util_samples(t)) and statistics.median(u) > IDLE_UTIL]
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
        f"core for {secs(window)} and no GPU sampled did work"
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
