"""The pure judgement of the in-process monitor (gpudoctor.watch.Monitor): per-rank step figures, window after
window -> Findings (GD-WATCH-009 to 012, checks/watch.py). No torch and no I/O here: monitor.py measures and
exchanges, these rules judge, so each runs on constructed window series in the tests.

What a window holds, per rank: each part's mean per step over the window (its total over the window's steps) --
waiting for data (the loader's __next__), forward+backward (a forward to the end of its backward graph, summed over
the step's passes), the wait in the gradient all-reduce (from the end of the backward graph to backward()'s
return, where DDP waits for its buckets) and the rest of the step (optimizer, logging) -- and the tokens per
second. A mean, not a median per step: a rank slowed in bursts (a CPU quota's throttled periods, a neighbour's
time slices) loses its time in a few steps, and in synchronous DDP each of those seconds is one the others wait.
Every rank's step takes the same wall time there; a rank's own work is its step less that wait, and the slow rank
is the one that waits least while the others wait for it.

The rules, robust by construction (totals within a window, runs of windows and medians across them):
- the straggler (GD-WATCH-009): a rank whose own work is above the median of the other ranks' own work by
  STRAGGLER_SHARE of theirs, STRAGGLER_STEP_SHARE of its step (what the job loses to it) and STRAGGLER_MIN_S, and
  (with DDP) that waits less than they do in the all-reduce, in
  STRAGGLER_WINDOWS windows or more in a row; a stall (a checkpoint, a page-cache miss) or a loaded machine's
  contention, which moves from rank to rank, is not named.
  The part named is the own part most above the other ranks' median over those windows; the ranks waiting for it
  are those whose all-reduce wait is at least half the gap above its own. Every rank's medians over the windows
  judged are in the evidence (rank_medians), named or not.
- input-bound steps (GD-WATCH-010): a rank whose data wait is INPUT_SHARE of its step or more (and at least
  INPUT_MIN_S) in CONSECUTIVE windows in a row. The fix is what `gpudoctor check` derives for the rank's own
  DataLoader (the findings of gpudoctor.audit_dataloader, given as loader_advice), else the settings to look at.
- slower than the job itself was (GD-WATCH-011): the job's throughput (tokens/s summed over ranks, else steps/s)
  SLOWER_SHARE or more below the median of its first BASELINE windows (the very first, warm-up, left out) in
  CONSECUTIVE windows in a row; the part of the step that grew most is named.
- a rank that stopped stepping (GD-WATCH-012): what the monitor's exchange learnt (Stopped): a rank closed its
  Monitor while another went on, left the group, or did not reach a window's end in time.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, fields

from gpudoctor.model import Finding, Severity, manual
from gpudoctor.watch.verdict import join_fixes, make

CONSECUTIVE = 3  # windows in a row for a verdict ...
STRAGGLER_WINDOWS = 4  # ... and for a straggler: a loaded machine slows one rank, then another, for a few seconds
STRAGGLER_SHARE = 0.25  # own work above the other ranks' median by this share ...
STRAGGLER_STEP_SHARE = 0.05  # ... by this share of the step at least (what the job loses to it) ...
STRAGGLER_MIN_S = 0.0002  # ... and by this much (a timer's and Python's own jitter)
INPUT_SHARE = 0.30  # data wait as a share of the step
INPUT_MIN_S = 0.002
SLOWER_SHARE = 0.20  # throughput below the job's own first windows by this share
BASELINE = 3  # windows after the first that make the job's own reference
# The parts of a step, as RankWindow names them, and how a message says them.
PARTS = {
    "data_s": "waiting for data",
    "compute_s": "forward+backward",
    "comm_s": "the gradient all-reduce",
    "other_s": "the rest of the step (optimizer, logging: outside forward, backward and the all-reduce)",
}
SHORT = {
    "data_s": "waiting for data",
    "compute_s": "forward+backward",
    "comm_s": "the all-reduce",
    "other_s": "the rest of the step",
}
OWN_PARTS = ("data_s", "compute_s", "other_s")  # what a rank spends by itself (not waiting for the others)


@dataclass(frozen=True)
class RankWindow:
    """One rank's window: each part's mean per step (seconds). compute_s and comm_s None: no backward seen (no
    model given, or no gradient); comm_s is about 0 without DDP."""

    rank: int
    steps: int
    step_s: float
    data_s: float
    other_s: float
    compute_s: float | None = None
    comm_s: float | None = None
    tokens_per_s: float | None = None
    host: str = "?"
    local_rank: int | None = None
    device: str | None = None

    @property
    def own_s(self) -> float:
        """The step less its wait for the other ranks in the all-reduce."""
        return self.step_s - (self.comm_s or 0.0)

    def part(self, name: str) -> float | None:
        value = getattr(self, name)
        return None if value is None else float(value)

    def describe(self) -> str:
        where = [f"host {self.host}"]
        if self.local_rank is not None:
            where.append(f"local rank {self.local_rank}")
        if self.device:
            where.append(self.device)
        return f"rank {self.rank} ({', '.join(where)})"

    def to_dict(self) -> dict:
        return {f.name: _round(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict) -> RankWindow:
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


@dataclass(frozen=True)
class Window:
    index: int
    end_s: float  # seconds since the monitor started, on rank 0's clock
    ranks: tuple[RankWindow, ...]

    def to_dict(self) -> dict:
        return {"index": self.index, "end_s": round(self.end_s, 3), "ranks": [r.to_dict() for r in self.ranks]}


def _round(v):
    return round(v, 6) if isinstance(v, float) and math.isfinite(v) else (None if isinstance(v, float) else v)


def median_known(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _runs(flags: list[bool], needed: int = CONSECUTIVE) -> list[tuple[int, int]]:
    """The [start, end) index ranges of `needed` or more True flags in a row."""
    out, start = [], None
    for i, flag in enumerate([*flags, False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            if i - start >= needed:
                out.append((start, i))
            start = None
    return out


def _windows_text(windows: Sequence[Window], run: tuple[int, int]) -> str:
    first, last = windows[run[0]], windows[run[1] - 1]
    return f"{run[1] - run[0]} windows in a row (windows {first.index}-{last.index}, up to {last.end_s:.0f} s in)"


# ---------------------------------------------------------------- GD-WATCH-009


def _slow_in(w: Window, rank: int) -> bool:
    """Whether `rank` is slower than the others in window w: its own work well above theirs, and not waiting
    longer than they do in the all-reduce (it is not the one waiting)."""
    me = next((r for r in w.ranks if r.rank == rank), None)
    others = [r for r in w.ranks if r.rank != rank]
    if me is None or not others:
        return False
    ref = statistics.median(r.own_s for r in others)
    if me.own_s - ref < max(STRAGGLER_SHARE * ref, STRAGGLER_STEP_SHARE * me.step_s, STRAGGLER_MIN_S):
        return False
    waits = median_known([r.comm_s for r in others])
    return me.comm_s is None or waits is None or me.comm_s < waits


def rank_medians(windows: Sequence[Window], skip_first: bool = True) -> list[dict]:
    """Every rank's medians over the windows (the first, warm-up, left out when there are more): own work, the
    step, and each part, per step, in seconds: what the straggler verdict rests on."""
    use = list(windows[1:] if skip_first and len(windows) > 1 else windows)
    ranks = sorted({r.rank for w in use for r in w.ranks})
    out = []
    for rank in ranks:
        mine = [r for w in use for r in w.ranks if r.rank == rank]
        row: dict = {"rank": rank, "host": mine[-1].host, "local_rank": mine[-1].local_rank, "windows": len(mine)}
        row["own_s"] = _round(median_known([r.own_s for r in mine]))
        for name in ("step_s", *PARTS):
            row[name] = _round(median_known([r.part(name) for r in mine]))
        out.append(row)
    return out


def stragglers(windows: Sequence[Window]) -> list[Finding]:
    ranks = sorted({r.rank for w in windows for r in w.ranks})
    out = []
    for rank in ranks:
        runs = _runs([_slow_in(w, rank) for w in windows], STRAGGLER_WINDOWS)
        if not runs:
            continue
        run = runs[-1]
        seen = windows[run[0] : run[1]]
        medians = {m["rank"]: m for m in rank_medians(seen, skip_first=False)}
        me, others = medians[rank], [m for r, m in medians.items() if r != rank]
        gaps = {}
        for name in OWN_PARTS:
            theirs = median_known([m[name] for m in others])
            if me[name] is not None and theirs is not None:
                gaps[name] = me[name] - theirs
        part = max(gaps, key=lambda k: gaps[k]) if gaps else "other_s"
        theirs = median_known([m[part] for m in others]) or 0.0
        gap = me["own_s"] - (median_known([m["own_s"] for m in others]) or 0.0)
        waiting = [
            m["rank"] for m in others if m["comm_s"] is not None and (m["comm_s"] - (me["comm_s"] or 0.0)) >= gap / 2
        ]
        last = next(r for r in seen[-1].ranks if r.rank == rank)
        msg = f"rank {rank} on {last.host} is slow in {SHORT[part]}: {_ms(me[part])} a step against {_ms(theirs)}"
        if waiting:
            wait = median_known([m["comm_s"] for m in others if m["rank"] in waiting])
            msg += f"; {_ranks_text(waiting)} wait{'s' if len(waiting) == 1 else ''} {_ms(wait)} for it"
        out.append(
            make(
                "GD-WATCH-009",
                Severity.WARN,
                msg,
                _straggler_fix(last, part),
                rank=rank,
                host=last.host,
                local_rank=last.local_rank,
                device=last.device,
                part=part,
                waiting=waiting,
                windows=[w.index for w in seen],
                medians=list(medians.values()),
                per_rank=[r.to_dict() for r in seen[-1].ranks],
                detail=(
                    f"{last.describe()}, {len(seen)} windows in a row: "
                    f"own work {_ms(me['own_s'])} a step against the other ranks' {_ms(me['own_s'] - gap)} "
                    f"(medians over windows {seen[0].index}-{seen[-1].index}, up to {seen[-1].end_s:.0f} s in); "
                    f"{PARTS[part]} explains the gap"
                ),
            )
        )
    return out


def _ranks_text(ranks: Sequence[int]) -> str:
    if len(ranks) > 4:
        return f"{len(ranks)} ranks"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def _straggler_fix(me: RankWindow, part: str):
    where = f"{me.host}" + (f" GPU {me.local_rank}" if me.local_rank is not None else "")
    if part == "compute_s":
        return manual(
            f"Look at {where}: a slow, throttled or shared GPU; exclude the node until it is fixed",
            "gpudoctor watch --job $SLURM_JOB_ID",
            f"sbatch --exclude={me.host} ...",
        )
    if part == "data_s":
        return manual(f"Make rank {me.rank}'s input keep up on {me.host}: its loader, CPUs and storage")
    return manual(
        f"Find what rank {me.rank} does between steps on {me.host} (logging, checkpoints, CPU contention)",
        f"py-spy top --pid <rank {me.rank}'s PID>",
    )


# ---------------------------------------------------------------- GD-WATCH-010


def input_bound(
    windows: Sequence[Window], loader_advice: Sequence[Finding] = (), loader: dict | None = None
) -> list[Finding]:
    ranks = sorted({r.rank for w in windows for r in w.ranks})
    out = []
    for rank in ranks:
        mine = [next((r for r in w.ranks if r.rank == rank), None) for w in windows]
        runs = _runs([r is not None and _waits_for_data(r) for r in mine])
        if not runs:
            continue
        run = runs[-1]
        me = mine[run[1] - 1]
        assert me is not None
        share = me.data_s / me.step_s
        msg = f"rank {rank} on {me.host} waits for data {share:.0%} of its step in {run[1] - run[0]} windows in a row"
        detail = (
            f"{me.describe()}: {_ms(me.data_s)} of {_ms(me.step_s)} a step (means) in {_windows_text(windows, run)}; "
            "the GPU idles while the loader prepares the next batch"
        )
        if loader:
            detail += "; its DataLoader: " + ", ".join(f"{k}={loader.get(k)}" for k in LOADER_KEYS if k in loader)
        out.append(
            make(
                "GD-WATCH-010",
                Severity.WARN,
                msg,
                _loader_fix(loader_advice),
                rank=rank,
                host=me.host,
                local_rank=me.local_rank,
                data_share=round(share, 3),
                windows=[windows[i].index for i in range(*run)],
                per_rank=[r.to_dict() for r in windows[run[1] - 1].ranks],
                loader=loader,
                check_advice={f.id: f.message for f in loader_advice},
                detail=detail,
            )
        )
    return out


LOADER_KEYS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "batch_size")


def _waits_for_data(r: RankWindow) -> bool:
    return r.step_s > 0 and r.data_s >= INPUT_MIN_S and r.data_s >= INPUT_SHARE * r.step_s


def _loader_fix(advice: Sequence[Finding]):
    derived = join_fixes([f.fix for f in advice if f.fix is not None])
    if derived is not None:
        return derived
    return manual(
        "Make the input keep up: more DataLoader workers where CPUs are free (num_workers up to CPUs per rank - 1), "
        "pin_memory=True, persistent_workers=True, cheaper batches",
        "gpudoctor check --config <the training config>",
    )


# ---------------------------------------------------------------- GD-WATCH-011


def throughput(w: Window) -> tuple[float, str] | None:
    """The job's tokens/s (summed over ranks) when every rank counts tokens, else its steps/s."""
    tokens = [r.tokens_per_s for r in w.ranks]
    if tokens and all(t is not None and t > 0 for t in tokens):
        return sum(t for t in tokens if t is not None), "tokens/s"
    step = median_known([r.step_s for r in w.ranks])
    return (1.0 / step, "steps/s") if step else None


def slower_than_itself(windows: Sequence[Window]) -> list[Finding]:
    if len(windows) < 1 + BASELINE + CONSECUTIVE:
        return []
    rates = [throughput(w) for w in windows]
    base_rates = [r for r in rates[1 : 1 + BASELINE] if r is not None]
    if len(base_rates) < BASELINE or len({unit for _, unit in base_rates}) != 1:
        return []
    unit = base_rates[0][1]
    base = statistics.median(v for v, _ in base_rates)
    later = rates[1 + BASELINE :]
    runs = _runs([r is not None and r[1] == unit and r[0] < (1 - SLOWER_SHARE) * base for r in later])
    if not runs:
        return []
    run = (runs[-1][0] + 1 + BASELINE, runs[-1][1] + 1 + BASELINE)
    now = statistics.median(r[0] for r in rates[run[0] : run[1]] if r is not None)
    grew = _grown_part(windows[1 : 1 + BASELINE], windows[run[0] : run[1]])
    msg = f"the job runs at {now:.4g} {unit}, {1 - now / base:.0%} below the {base:.4g} of its first windows"
    detail = f"in {_windows_text(windows, run)}"
    if grew is not None:
        msg += f"; {SHORT[grew[0]]} grew most"
        detail += f"; {PARTS[grew[0]]} grew from {_ms(grew[1])} to {_ms(grew[2])} a step (median over ranks)"
    return [
        make(
            "GD-WATCH-011",
            Severity.WARN,
            msg,
            manual("Look where the step grew: the loader and storage, the GPUs, the network between nodes"),
            unit=unit,
            baseline=round(base, 4),
            now=round(now, 4),
            part=None if grew is None else grew[0],
            windows=[windows[i].index for i in range(*run)],
            per_rank=[r.to_dict() for r in windows[run[1] - 1].ranks],
            detail=detail,
        )
    ]


def _grown_part(before: Sequence[Window], after: Sequence[Window]) -> tuple[str, float, float] | None:
    def level(ws: Sequence[Window], name: str) -> float | None:
        return median_known([median_known([r.part(name) for r in w.ranks]) for w in ws])

    growth = {}
    for name in PARTS:
        a, b = level(before, name), level(after, name)
        if a is not None and b is not None:
            growth[name] = (b - a, a, b)
    if not growth:
        return None
    name = max(growth, key=lambda k: growth[k][0])
    return (name, growth[name][1], growth[name][2]) if growth[name][0] > 0 else None


# ---------------------------------------------------------------- GD-WATCH-012


@dataclass(frozen=True)
class Stopped:
    """A rank the exchange found not stepping: how -- 'closed' (its Monitor closed at step `count` while the
    others went on to `others_at`), 'left' (it left the monitor's group: the exchange failed), 'silent' (it did not
    reach the window ending at step `others_at` in time), 'behind' (not there yet when rank seen_by closed).
    rank -1: which one cannot be told (a collective does not say who did not post)."""

    rank: int
    count: int | None
    how: str
    others_at: int
    seen_by: int = 0
    host: str = "?"
    local_rank: int | None = None

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def stopped_ranks(stopped: Sequence[Stopped]) -> list[Finding]:
    out = []
    for s in stopped:
        who = "a rank" if s.rank < 0 else f"rank {s.rank}" + (f" on {s.host}" if s.host != "?" else "")
        msg = {
            "closed": f"{who} stopped stepping at step {s.count} while another rank went on to step {s.others_at}",
            "left": f"{who} left the monitor's group: the exchange at step {s.others_at} failed",
            "silent": f"{who} did not reach step {s.others_at} in time: it stopped stepping or is stuck",
            "behind": f"{who} had not reached step {s.others_at} when rank {s.seen_by} closed",
        }[s.how]
        out.append(
            make(
                "GD-WATCH-012",
                Severity.WARN,
                msg,
                manual(
                    "Give every rank the same number of steps (an even sampler: DistributedSampler(drop_last=True)),"
                    " or wrap uneven loops in torch.distributed.algorithms.Join"
                ),
                rank=s.rank,
                host=s.host,
                local_rank=s.local_rank,
                how=s.how,
                step=s.count,
                others_at=s.others_at,
                detail="the monitor's exchange stood down: each rank goes on counting its steps for its heartbeat",
            )
        )
    return out


# ---------------------------------------------------------------- all of them


def judge_windows(
    windows: Sequence[Window],
    loader_advice: Sequence[Finding] = (),
    loader: dict | None = None,
    stopped: Sequence[Stopped] = (),
) -> list[Finding]:
    """Every rule over the windows so far, then a pass (or a skip, with too few windows) for each verdict with
    nothing found; GD-WATCH-009's pass holds every rank's medians (rank_medians)."""
    findings = stragglers(windows) + input_bound(windows, loader_advice, loader) + slower_than_itself(windows)
    findings += stopped_ranks(stopped)
    found = {f.id for f in findings}
    ranks = max((len(w.ranks) for w in windows), default=0)
    needed = {
        "GD-WATCH-009": STRAGGLER_WINDOWS,
        "GD-WATCH-010": CONSECUTIVE,
        "GD-WATCH-011": 1 + BASELINE + CONSECUTIVE,
    }
    for fid, n in needed.items():
        if fid in found:
            continue
        if len(windows) < n:
            findings.append(make(fid, Severity.SKIP, f"not judged yet: {len(windows)} window(s) of the {n} it needs"))
        elif fid == "GD-WATCH-009" and ranks < 2:
            findings.append(make(fid, Severity.SKIP, "one rank: no other rank to compare with"))
        elif fid == "GD-WATCH-009":
            medians = rank_medians(windows)
            own = [m["own_s"] for m in medians if m["own_s"] is not None]
            spread = f"; own work a step {_ms(min(own))} to {_ms(max(own))} across ranks (medians)" if own else ""
            msg = f"nothing found in {len(windows)} window(s) of {ranks} rank(s){spread}"
            findings.append(make(fid, Severity.PASS, msg, medians=medians))
        else:
            findings.append(make(fid, Severity.PASS, f"nothing found in {len(windows)} window(s) of {ranks} rank(s)"))
    if "GD-WATCH-012" not in found and ranks >= 2:
        findings.append(make("GD-WATCH-012", Severity.PASS, f"every rank of {ranks} stepped to the end of each window"))
    return findings


def _ms(s: float | None) -> str:
    return "?" if s is None else f"{s * 1000:.1f} ms"
