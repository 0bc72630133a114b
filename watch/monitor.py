"""The in-process monitor: gpudoctor.watch.Monitor, and the engine under the Lightning and Hugging Face callbacks
(callbacks.py). The torch side: hooks, timing, the per-window exchange; watch/steps.py judges (pure).

    monitor = Monitor(model=model, window_s=30, report="watch.json")   # after init_process_group and DDP(...)
    for batch in monitor.loader(train_loader):
        with monitor.step(tokens=batch["input_ids"].numel()):
            loss = model(batch).loss; loss.backward(); optimizer.step(); optimizer.zero_grad()
    monitor.close()

What a step is made of, per rank, without a torch.cuda.synchronize() per step: the wait for the batch (host time
in the loader's __next__), then one or more passes, each from a forward (a forward pre-hook on the model) through
its backward: forward+backward runs until autograd has run the whole backward graph (every gradient accumulated:
the first of autograd's final callbacks, queued by a post-accumulate-grad hook at the pass's first gradient), and
the wait after it until backward() returns (a second final callback, queued from the first so that it runs after
DDP's own, which waits for every bucket's all-reduce). That wait is the gradient all-reduce a rank spends waiting
for the others (none without DDP); the rest of the step (optimizer, logging) is what is left. Several passes in a
step (gradient accumulation, several optimizer steps) add up. On a GPU the marks are CUDA events, read at the
window's end (one event synchronize per window); on CPU, host time.

A window's figures are each part's mean per step over the window (its total over the steps): a rank slowed in
bursts (a CPU quota's throttled periods, a neighbour's time slices) loses its time in a few of its steps, which a
median per step would not see, and every second a rank spends on its own is a second the others wait in DDP.

The exchange: every window (window_s; the first after FIRST_WINDOW_STEPS steps) each rank posts one all_gather of a
fixed-size float64 row (PACKED) on the monitor's own gloo group, asynchronously, and only tests whether it completed
at its later steps: no rank ever waits in it. The window's end is a step count every rank computes alike from the
previous exchange's rows (identical everywhere), so the collectives pair up; while one is in flight no other is
posted. One that has not completed OVERDUE_MIN_S (or OVERDUE_WINDOWS windows) and 3 steps after it was posted, or
that failed (a rank left the group), stands the exchange down: the ranks that closed their Monitor (a key in the
job's store, set at close) or that did not reach the window's end are GD-WATCH-012, the group's gloo backend is
aborted (its peers fail at once instead of waiting for gloo's timeout), and the Monitor goes on counting steps
only. close() (also at exit) posts a last row marked closed and waits for it CLOSE_WAIT_S at most: a rank that
stopped early says so there. The groups are kept for the process's life (_GROUPS): freeing one joins gloo's
threads, one of which may be in a collective left in flight, and the job's destroy_process_group() would wait.
Rank 0 judges (steps.judge_windows), prints each new finding once, and writes report= atomically after every window
and at close. Every rank writes a heartbeat (heartbeat_path) at every window's end. No numpy, no pickled object:
torch's object collectives need numpy, which a training environment may not have.

Report-only: the monitor never stops, slows on purpose or changes the job; an error in it is printed once (one
line, sanitized) and turns it off, never into the training loop.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import socket
import sys
import tempfile
import time
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

from gpudoctor.watch.samples import heartbeat_file
from gpudoctor.watch.steps import RankWindow, Stopped, Window, judge_windows

FIRST_WINDOW_STEPS = 10  # the first window, before any step time is known
MIN_WINDOW_STEPS = 3
MAX_WINDOWS_KEPT = 1000  # about 8 h of 30 s windows; the oldest are dropped after the first few
# One rank's window as exchanged: float64, NaN for None. count: its steps so far; closed: 1 in the row of close().
PACKED = (
    "rank",
    "local_rank",
    "steps",
    "count",
    "closed",
    "step_s",
    "data_s",
    "other_s",
    "compute_s",
    "comm_s",
    "tokens_per_s",
)
IDENTITY_BYTES = 512  # a rank's identity (host, local rank, device, pid) as JSON, UTF-8, zero-padded
GROUP_TIMEOUT_S = 600.0  # gloo's own bound on an exchange in flight; the monitor never waits for it
OVERDUE_MIN_S = 30.0  # an exchange not completed after max(this, OVERDUE_WINDOWS windows): a rank stopped
OVERDUE_WINDOWS = 3
CLOSE_WAIT_S = 5.0  # close(): the longest it waits for the last exchange
STORE_PREFIX = "gpudoctor-monitor"
# The dataloader checks whose fixes make a loader keep up (checks/dataloader.py): workers against the CPUs, workers
# at all, pinned memory, persistent workers, /dev/shm for the workers' batches.
INPUT_CHECKS = ("GD-DL-001", "GD-DL-002", "GD-DL-003", "GD-DL-004", "GD-DL-005")


def heartbeat_path(pid: int | None = None) -> str:
    """Where a rank writes its heartbeat: a folder of this user's own under the temporary directory, named for
    the process, so that the outside watcher (which runs as the job's user on the node) finds it by PID."""
    return heartbeat_file(tempfile.gettempdir(), os.getuid(), pid or os.getpid())


class _Step:
    """The marks of one step: host seconds, or CUDA events. passes: [start, graph done, backward end] each."""

    __slots__ = ("data_s", "host_enter", "host_exit", "enter", "exit", "tokens", "passes")

    def __init__(self, data_s: float) -> None:
        self.data_s = data_s
        self.host_enter = self.host_exit = 0.0
        self.enter: Any = None
        self.exit: Any = None
        self.tokens: float | None = None
        self.passes: list[list] = []


class _Clock:
    """Marks: host time on CPU; on a GPU a CUDA event recorded on the current stream, read later."""

    def __init__(self, torch, device) -> None:
        self.cuda = device is not None and getattr(device, "type", "") == "cuda"
        self.torch = torch

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, a, b) -> float | None:
        if a is None or b is None:
            return None
        if not self.cuda:
            return max(0.0, b - a)
        return max(0.0, a.elapsed_time(b) / 1000.0)

    def settle(self, last) -> None:
        """Wait for the window's last event, so every earlier one can be read (once per window)."""
        if self.cuda and last is not None:
            last.synchronize()


class Monitor:
    """Times each step's parts on every rank and judges them every window (module docstring).

    model: the model as trained (DDP-wrapped or not); window_s: seconds per window; report: a file written
    atomically with the findings so far (gpudoctor.report/1); heartbeat: the heartbeat file (True:
    heartbeat_path(); False: none); echo: where rank 0 prints each new finding (default stderr); comm_hook:
    accepted for compatibility, no longer needed (the all-reduce's wait is timed from the backward's own end).
    """

    def __init__(
        self,
        model=None,
        window_s: float = 30.0,
        report: str | None = None,
        *,
        heartbeat: str | bool = True,
        echo=None,
        comm_hook: bool = False,
    ) -> None:
        if not window_s or window_s <= 0:
            raise ValueError(f"window_s must be positive, got {window_s!r}")
        import torch

        self._torch = torch
        self.window_s = float(window_s)
        self.report = report
        self.heartbeat = heartbeat_path() if heartbeat is True else (heartbeat or None)
        self._echo = echo
        self._t0 = time.perf_counter()
        self._steps: list[_Step] = []
        self._cur: _Step | None = None
        self._pass: list | None = None  # the open pass: [start, graph done, end]
        self._queued = False  # the pass's final callbacks are queued in autograd
        self._pending_data_s = 0.0
        self._count = 0
        self._next_window_at: int | None = FIRST_WINDOW_STEPS
        self._window_end = 0  # the nominal step count of the last window's end (the same on every rank)
        self._inflight: list[_Exchange] = []  # posted, not completed: the window's, and close()'s
        self._windows: list[Window] = []
        self._stopped: list[Stopped] = []
        self._printed: set[tuple] = set()
        self._loader: Iterable | None = None
        self._advice: list | None = None
        self._handles: list = []
        self._closed = False
        self._broken = False
        self._alone = False  # the exchange stood down: this rank times itself only
        self._passes_seen = False
        self._rank, self._world = _rank_and_world(torch)
        self._identity = _identity(model, self._rank)
        self._identities: list[dict] = [self._identity]
        self._clock = _Clock(torch, _device_of(model))
        self._group: Any = None
        self._store: Any = None
        self._hello: _Hello | None = None
        self._serial = _next_serial()  # the same on every rank: each makes its Monitors in the same order
        self._guarded(lambda: self._setup(model))
        _close_at_exit(self)

    def _setup(self, model) -> None:
        if model is not None:
            self._attach(model)
        if self._world > 1:
            self._group, self._store = _make_group(self._torch, self._serial)
            self._hello = _Hello(self._torch, self._group, self._world, self._identity)

    # ------------------------------------------------------------ the public faces

    def loader(self, iterable: Iterable) -> Iterator:
        """Yields iterable's batches, timing the wait for each one."""
        self._loader = iterable
        it = iter(iterable)
        while True:
            start = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            self._pending_data_s += time.perf_counter() - start
            yield batch

    @contextlib.contextmanager
    def step(self, tokens: float | None = None):
        """One training step (forward, backward, optimizer); tokens: what it consumed, for tokens/s."""
        self.begin_step()
        try:
            yield self
        finally:
            self.end_step(tokens)

    def begin_step(self, data_s: float | None = None) -> None:
        """The start of a step; data_s: its wait for the batch when the loader is not wrapped by loader()."""
        if self._closed or self._broken:
            return
        self._guarded(lambda: self._begin(data_s))

    def _begin(self, data_s: float | None) -> None:
        waited = self._pending_data_s if data_s is None else data_s
        self._pending_data_s = 0.0
        s = _Step(waited)
        s.host_enter = time.perf_counter()
        s.enter = self._clock.mark()
        self._cur = s
        self._pass = None
        self._queued = False

    def end_step(self, tokens: float | None = None) -> None:
        s = self._cur
        if s is None or self._closed or self._broken:
            return
        self._guarded(lambda: self._end(s, tokens))

    def _end(self, s: _Step, tokens: float | None) -> None:
        s.exit = self._clock.mark()
        s.host_exit = time.perf_counter()
        s.tokens = tokens
        self._cur = None
        self._steps.append(s)
        self._count += 1
        self._after_step()

    def close(self) -> list:
        """Stops timing; the last row is exchanged (waited for CLOSE_WAIT_S at most); rank 0 judges what it has and
        writes the report. Returns the findings (rank 0). Called at exit too, when the job did not."""
        if self._closed:
            return []
        self._closed = True
        for h in self._handles:
            with contextlib.suppress(Exception):
                h.remove()
        if self._broken:
            return []
        findings = self._guarded(self._close) or []
        self._guarded(self._write_heartbeat)
        return findings

    def _close(self) -> list:
        if self._group is not None and not self._alone:
            self._mark_closed()
            self._post(closing=True)
            self._settle_at_close()
        elif self._group is None and len(self._steps) >= MIN_WINDOW_STEPS:
            self._add_window((self._medians(),))
        return self._judge(final=True) if self._rank == 0 else []

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def windows(self) -> list[Window]:
        return list(self._windows)

    # ------------------------------------------------------------ hooks on the model

    def attach(self, model) -> None:
        """Time forward and backward of a model given after the monitor was made (callbacks)."""
        if not self._handles and not self._broken:
            self._clock = _Clock(self._torch, _device_of(model))
            self._identity["device"] = _device_text(model)
            self._guarded(lambda: self._attach(model))

    def _attach(self, model) -> None:
        self._handles.append(model.register_forward_pre_hook(self._on_forward))
        for p in model.parameters():
            if p.requires_grad and hasattr(p, "register_post_accumulate_grad_hook"):
                self._handles.append(p.register_post_accumulate_grad_hook(self._on_grad))

    def _on_forward(self, module, args) -> None:
        if self._cur is not None and self._pass is None and not self._broken:
            self._pass = [self._guarded(self._clock.mark), None, None]

    def _on_grad(self, param) -> None:
        """The first gradient of a backward: queue the callback that marks the graph's end (autograd runs final
        callbacks in the order queued, DDP's after this one, and those a callback queues after all of them)."""
        if self._queued or self._cur is None or self._broken:
            return
        self._queued = True
        self._guarded(lambda: _queue_callback(self._torch, self._on_graph_done))

    def _on_graph_done(self) -> None:
        def mark() -> None:
            if self._pass is None:
                self._pass = [None, None, None]  # a backward without a forward seen in this step
            self._pass[1] = self._clock.mark()
            _queue_callback(self._torch, self._on_backward_end)

        if not self._broken:
            self._guarded(mark)

    def _on_backward_end(self) -> None:
        def mark() -> None:
            s, p = self._cur, self._pass
            self._queued, self._pass = False, None
            if s is not None and p is not None:
                p[2] = self._clock.mark()
                s.passes.append(p)
                self._passes_seen = True

        if not self._broken:
            self._guarded(mark)

    # ------------------------------------------------------------ windows and the exchange

    def _after_step(self) -> None:
        if self._inflight:
            ex = self._inflight[0]
            state = ex.state()
            if state == "done":
                self._finish_exchange()
            elif state == "failed":
                self._stand_down(ex, failed=True)
            elif time.perf_counter() - ex.posted > self._overdue_s() and self._count - ex.count >= MIN_WINDOW_STEPS:
                # and steps since: in DDP a rank cannot step ahead of one that has not posted (a long checkpoint)
                self._stand_down(ex, failed=False)
        if self._next_window_at is not None and self._count >= self._next_window_at:
            self._end_window()

    def _overdue_s(self) -> float:
        return max(OVERDUE_MIN_S, OVERDUE_WINDOWS * self.window_s)

    def _end_window(self) -> None:
        if self._alone:  # stood down: the heartbeat only (one rank's windows are not the job's)
            mine = self._medians()
            self._steps = []
            self._write_heartbeat(mine)
            self._next_window_at = self._count + self._window_steps(mine.step_s)
            return
        if self._group is None:
            mine = self._medians()
            self._steps = []
            self._write_heartbeat(mine)
            self._add_window((mine,))
            self._next_window_at = self._count + self._window_steps(mine.step_s)
            if self._rank == 0:
                self._judge()
            return
        self._window_end = self._next_window_at or self._count
        self._next_window_at = None  # known once this exchange completes (the same on every rank)
        self._post(closing=False)

    def _post(self, closing: bool) -> None:
        mine = self._medians()
        self._steps = []
        self._write_heartbeat(mine)
        row = [getattr(mine, k, None) for k in PACKED]
        row[PACKED.index("count")] = self._count
        row[PACKED.index("closed")] = 1.0 if closing else 0.0
        ex = _Exchange(self._torch, self._group, self._world, row, self._window_end, closing)
        ex.count = self._count
        self._inflight.append(ex)

    def _window_steps(self, step_s: float) -> int:
        if step_s <= 0:
            return FIRST_WINDOW_STEPS
        return max(MIN_WINDOW_STEPS, int(round(self.window_s / step_s)))

    def _finish_exchange(self) -> None:
        ex = self._inflight.pop(0)
        rows = [dict(zip(PACKED, r, strict=True)) for r in ex.rows()]
        self._learn_identities()
        ranks = tuple(_unpack(row, self._identities) for row in rows)
        if all(r.steps >= MIN_WINDOW_STEPS for r in ranks) or not ex.closing:
            self._add_window(ranks)
        closed = [r for r in rows if r["closed"] == 1.0]
        if closed and len(closed) < len(rows) or (closed and len({int(r["count"]) for r in rows}) > 1):
            # a rank closed its Monitor while another went on: no later exchange can complete
            top = max(int(r["count"]) for r in rows)
            for r in closed:
                if int(r["count"]) < top:
                    self._add_stopped(int(r["rank"]), int(r["count"]), "closed", top)
            if len(closed) < len(rows):
                self._alone = True
        elif not ex.closing:
            slowest = max((r.step_s for r in ranks), default=0.0)
            self._next_window_at = ex.end + self._window_steps(slowest)
        if self._rank == 0:
            self._judge()
        if self._alone:
            self._next_window_at = self._count + FIRST_WINDOW_STEPS

    def _learn_identities(self) -> None:
        if self._hello is not None and self._hello.state() == "done":
            self._identities = self._hello.identities()
            self._hello = None

    def _stand_down(self, ex: _Exchange, failed: bool, at_close: bool = False) -> None:
        """The exchange in flight failed or is overdue (or close() waited for it in vain): no later one can
        complete. The ranks that closed their Monitor earlier (the store says at which step) stopped stepping;
        without that, a rank that did not reach the window's end is named when it can be told (two ranks: the
        other one). This rank goes on timing itself alone."""
        self._inflight = []
        self._alone = True
        self._next_window_at = self._count + FIRST_WINDOW_STEPS
        self._learn_identities()
        _abort(self._torch, self._group)
        closed = self._closed_ranks()
        for rank, count in sorted(closed.items()):
            if count < self._count:
                self._add_stopped(rank, count, "closed", self._count)
        if not closed:
            others = [r for r in range(self._world) if r != self._rank]
            # a collective does not say which rank did not post; with two ranks it is the other one
            how = "left" if failed else ("behind" if at_close else "silent")
            self._add_stopped(others[0] if len(others) == 1 else -1, None, how, ex.end)
        if self._rank == 0 and not at_close:
            self._judge()

    def _settle_at_close(self) -> None:
        until = time.perf_counter() + CLOSE_WAIT_S
        while self._inflight and not self._alone:
            state = self._inflight[0].state()
            if state == "done":
                self._finish_exchange()
                continue
            if state == "failed" or time.perf_counter() > until:
                self._stand_down(self._inflight[0], failed=state == "failed", at_close=True)
                return
            time.sleep(0.005)

    def _mark_closed(self) -> None:
        """Says in the job's store that this rank's Monitor closed, at which step (for the ranks still stepping)."""
        if self._store is not None:
            with contextlib.suppress(Exception):
                self._store.set(f"closed/{self._rank}", str(self._count))

    def _closed_ranks(self) -> dict[int, int]:
        if self._store is None:
            return {}
        out = {}
        for r in range(self._world):
            key = f"closed/{r}"
            with contextlib.suppress(Exception):
                if r != self._rank and self._store.check([key]):
                    out[r] = int(self._store.get(key))
        return out

    def _add_stopped(self, rank: int, count: int | None, how: str, others_at: int) -> None:
        ident = self._identities[rank] if 0 <= rank < len(self._identities) else {}
        if any(s.rank == rank for s in self._stopped):
            return
        self._stopped.append(
            Stopped(
                rank=rank,
                count=count,
                how=how,
                others_at=others_at,
                seen_by=self._rank,
                host=str(ident.get("host", "?")),
                local_rank=ident.get("local_rank"),
            )
        )

    def _add_window(self, ranks: tuple[RankWindow, ...]) -> None:
        self._windows.append(Window(len(self._windows), time.perf_counter() - self._t0, ranks))
        if len(self._windows) > MAX_WINDOWS_KEPT:  # keep the first ones: the job's own reference
            del self._windows[8]

    def _medians(self) -> RankWindow:
        """This rank's window: each part's mean per step (module docstring), named as RankWindow names them."""
        steps = self._steps
        if steps:
            self._clock.settle(steps[-1].exit)
        c = self._clock.seconds
        inside = [c(s.enter, s.exit) or (s.host_exit - s.host_enter) for s in steps]
        compute = [_sum_known(c(p[0], p[1]) for p in s.passes) for s in steps]
        comm = [_sum_known(c(p[1], p[2]) for p in s.passes) for s in steps]
        other = [max(0.0, i - (a or 0.0) - (b or 0.0)) for i, a, b in zip(inside, compute, comm, strict=True)]
        walls = [s.data_s + i for s, i in zip(steps, inside, strict=True)]
        tokens = [s.tokens for s in steps]
        rate = sum(t for t in tokens if t) / sum(walls) if all(tokens) and sum(walls) > 0 else None
        ident = self._identity
        return RankWindow(
            rank=self._rank,
            steps=len(steps),
            step_s=_mean(walls) or 0.0,
            data_s=_mean([s.data_s for s in steps]) or 0.0,
            other_s=_mean(other) or 0.0,
            compute_s=_mean(compute),
            comm_s=_mean(comm),
            tokens_per_s=rate,
            host=ident["host"],
            local_rank=ident["local_rank"],
            device=ident["device"],
        )

    # ------------------------------------------------------------ rank 0: judge, print, report

    def _judge(self, final: bool = False) -> list:
        from gpudoctor.model import Severity

        findings = judge_windows(self._windows, self._loader_advice(), self._loader_settings(), self._stopped)
        for f in findings:
            key = (f.id, f.evidence.get("rank"))
            if f.severity in (Severity.WARN, Severity.FAIL) and key not in self._printed:
                self._printed.add(key)
                _say(f"gpudoctor watch: {f.id} {f.severity.value}: {f.message}", self._echo)
        if self.report:
            self._write_report(findings, final)
        return findings

    def _loader_settings(self) -> dict | None:
        if self._loader is None:
            return None
        from gpudoctor.api import AuditError, loader_settings

        try:
            return loader_settings(self._loader)
        except AuditError:
            return None

    def _loader_advice(self) -> list:
        """What `gpudoctor check` says of rank 0's DataLoader, once a rank is input-bound (probes once)."""
        if self._advice is not None or self._loader is None or not _input_bound(self._windows):
            return self._advice or []
        from gpudoctor.api import AuditError, audit_dataloader
        from gpudoctor.model import Severity

        gpu = (self._identity.get("device") or "").startswith("cuda")
        try:
            found = audit_dataloader(self._loader, world_size=self._world, expect_gpus=gpu)
        except AuditError:
            found = []
        bad = (Severity.INFO, Severity.WARN, Severity.FAIL)
        self._advice = [f for f in found if f.id in INPUT_CHECKS and f.severity in bad and f.fix is not None]
        return self._advice

    def _write_report(self, findings: list, final: bool) -> None:
        from gpudoctor.fileio import write_output
        from gpudoctor.report import json_report
        from gpudoctor.watch.steps import rank_medians

        watch = {
            "inside": True,
            "world_size": self._world,
            "window_s": self.window_s,
            "windows": [w.to_dict() for w in self._windows[-20:]],
            "windows_total": len(self._windows),
            "medians": rank_medians(self._windows),
            "steps": self._count,
            "closed": final,
            "allreduce_timed": self._passes_seen,
            "exchange": "alone" if self._alone else ("none" if self._group is None else "gloo"),
            "stopped": [s.to_dict() for s in self._stopped],
        }
        source = {"monitor": "gpudoctor.watch.Monitor", "ranks": self._identities}
        assert self.report is not None
        write_output(self.report, json_report.document(findings, source, {"watch": watch}), what="report=")

    def _write_heartbeat(self, mine: RankWindow | None = None) -> None:
        if not self.heartbeat:
            return
        from gpudoctor.fileio import write_output

        os.makedirs(os.path.dirname(self.heartbeat) or ".", mode=0o700, exist_ok=True)
        beat = {"pid": os.getpid(), "rank": self._rank, "step": self._count, "time": time.time()}
        beat.update(window_s=self.window_s, closed=self._closed)
        if mine is not None:
            beat["step_s"] = round(mine.step_s, 6)
        write_output(self.heartbeat, json.dumps(beat) + "\n", what="heartbeat")

    def _guarded(self, fn):
        """Runs a piece of the monitor; an error turns the monitor off (said once, one sanitized line), never
        reaches the job."""
        try:
            return fn()
        except Exception as e:  # report-only: the training loop must not see the monitor's errors
            if not self._broken:
                self._broken = True
                self._stop_hooks()
                _say(f"gpudoctor watch: monitor off after an error: {type(e).__name__}: {e}", None)
            return None

    def _stop_hooks(self) -> None:
        for h in self._handles:
            with contextlib.suppress(Exception):
                h.remove()
        self._handles = []


def _say(line: str, echo) -> None:
    """One line to echo (stderr by default): sanitized (no control byte, no escape sequence, bounded), and never
    an error of its own."""
    from gpudoctor.sanitize import bounded, clean

    with contextlib.suppress(Exception):
        print(bounded(clean(line).replace("\n", " "), 1000), file=echo or sys.stderr)


_OPEN: weakref.WeakSet = weakref.WeakSet()


def _close_at_exit(monitor: Monitor) -> None:
    """A Monitor the job did not close is closed at exit (its last row, bounded by CLOSE_WAIT_S), so the ranks
    still stepping learn that it stopped."""
    if not _OPEN:
        atexit.register(_close_all)
    _OPEN.add(monitor)


def _close_all() -> None:
    for m in list(_OPEN):
        with contextlib.suppress(Exception):
            m.close()


# ---------------------------------------------------------------- the exchange


class _Exchange:
    """One asynchronous all_gather of every rank's row (PACKED, float64) on the monitor's gloo group. end: the
    nominal step count of the window it closes; closing: the row of close()."""

    def __init__(self, torch, group, world: int, row: list, end: int, closing: bool) -> None:
        import torch.distributed as dist

        self.mine = torch.tensor([math.nan if v is None else float(v) for v in row], dtype=torch.float64)
        self.out = [torch.full_like(self.mine, math.nan) for _ in range(world)]
        self.end = end
        self.count = end  # this rank's step count when it posted
        self.closing = closing
        self.posted = time.perf_counter()
        self.work = dist.all_gather(self.out, self.mine, group=group, async_op=True)

    def state(self) -> str:
        """'pending', 'done' or 'failed' (a rank left the group, or gloo's own timeout): never waits."""
        return _state(self.work)

    def rows(self) -> list[list[float]]:
        return [t.tolist() for t in self.out]


def _state(work) -> str:
    """'pending', 'done' or 'failed' (a rank left the group, or gloo's own timeout). Never waits: wait() is
    called only on a completed work, where it returns at once or raises the work's error."""
    if not work.is_completed():
        return "pending"
    try:
        work.wait()
    except Exception:
        return "failed"
    return "done"


class _Hello:
    """Every rank's identity, once, as a fixed-size uint8 row (JSON, UTF-8), gathered asynchronously."""

    def __init__(self, torch, group, world: int, identity: dict) -> None:
        import torch.distributed as dist

        data = json.dumps(identity).encode("utf-8", "replace")[:IDENTITY_BYTES]
        row = torch.zeros(IDENTITY_BYTES, dtype=torch.uint8)
        row[: len(data)] = torch.tensor(list(data), dtype=torch.uint8)
        self.out = [torch.zeros_like(row) for _ in range(world)]
        self.work = dist.all_gather(self.out, row, group=group, async_op=True)
        self.world = world

    def state(self) -> str:
        return _state(self.work)

    def identities(self) -> list[dict]:
        out = []
        for r, t in enumerate(self.out):
            raw = bytes(t.tolist()).rstrip(b"\0").decode("utf-8", "replace")
            try:
                ident = json.loads(raw)
            except ValueError:
                ident = {}
            if not isinstance(ident, dict):
                ident = {}
            out.append(_clean_identity(ident, r))
        return out


def _clean_identity(ident: dict, rank: int) -> dict:
    """Another rank's identity as this one shows it: known keys only, strings sanitized and bounded."""
    from gpudoctor.sanitize import bounded, clean

    def text(v) -> str | None:
        return None if v is None else bounded(clean(str(v)), 255)

    local = ident.get("local_rank")
    pid = ident.get("pid")
    return {
        "rank": rank,
        "host": text(ident.get("host")) or "?",
        "local_rank": local if isinstance(local, int) else None,
        "device": text(ident.get("device")),
        "pid": pid if isinstance(pid, int) else None,
    }


def _unpack(row: dict, identities: list[dict]) -> RankWindow:
    d: dict = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
    rank = int(d["rank"]) if d["rank"] is not None else -1
    ident = identities[rank] if 0 <= rank < len(identities) else {}
    return RankWindow(
        rank=rank,
        steps=int(d["steps"] or 0),
        step_s=d["step_s"] or 0.0,
        data_s=d["data_s"] or 0.0,
        other_s=d["other_s"] or 0.0,
        compute_s=d["compute_s"],
        comm_s=d["comm_s"],
        tokens_per_s=d["tokens_per_s"],
        host=ident.get("host", "?"),
        local_rank=ident.get("local_rank"),
        device=ident.get("device"),
    )


_SERIAL = [0]
# Every monitor group made in this process, kept: freeing a gloo group (the job's destroy_process_group() drops
# torch's own reference) joins its worker threads, and one may be in an exchange left in flight, until gloo's
# timeout. Kept here, the group is never freed before the process ends, and the job's destroy and exit go on.
_GROUPS: list = []


def _next_serial() -> int:
    _SERIAL[0] += 1
    return _SERIAL[0]


def _make_group(torch, serial: int) -> tuple[object, object]:
    """The monitor's own gloo group (created once: every rank of the job makes it) and the job's store (where a
    rank says that its Monitor closed), under a prefix of this Monitor's own; None where there is none."""
    import datetime

    import torch.distributed as dist

    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    _GROUPS.append(group)  # never freed while the process lives (see _GROUPS)
    store = None
    with contextlib.suppress(Exception):
        from torch.distributed.distributed_c10d import _get_default_store

        store = dist.PrefixStore(f"{STORE_PREFIX}/{serial}/", _get_default_store())
    return group, store


def _abort(torch, group) -> None:
    """Aborts the monitor's gloo group where an exchange may be left in flight: its collective would otherwise
    keep one of gloo's threads until the group's timeout, and freeing the group (the job's destroy_process_group())
    joins that thread: the job's exit would wait up to GROUP_TIMEOUT_S. Peers still in an exchange on it fail at
    once (they stand down too)."""
    with contextlib.suppress(Exception):
        group._get_backend(torch.device("cpu")).abort()


def _queue_callback(torch, fn) -> None:
    """fn at the end of the backward running now (autograd's final callbacks, as DDP queues its own)."""
    torch.autograd.Variable._execution_engine.queue_callback(fn)


def _rank_and_world(torch) -> tuple[int, int]:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _device_of(model):
    if model is None:
        return None
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError, TypeError):
        return None


def _device_text(model) -> str | None:
    device = _device_of(model)
    return str(device) if device is not None else None


def _identity(model, rank: int) -> dict:
    local = os.environ.get("LOCAL_RANK") or os.environ.get("SLURM_LOCALID")
    return {
        "rank": rank,
        "host": socket.gethostname(),
        "local_rank": int(local) if local and local.isascii() and local.isdigit() else None,
        "device": _device_text(model),
        "pid": os.getpid(),
    }


def _sum_known(values) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _mean(values) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _input_bound(windows: list[Window]) -> bool:
    from gpudoctor.watch.steps import input_bound

    return bool(input_bound(windows))
