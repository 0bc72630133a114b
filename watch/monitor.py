"""The in-process monitor: gpudoctor.watch.Monitor, and the engine under the Lightning and Hugging Face callbacks
(callbacks.py). The torch side: hooks, timing, the per-window gather; watch/steps.py judges (pure).

    monitor = Monitor(model=model, window_s=30, report="watch.json")   # after init_process_group and DDP(...)
    for batch in monitor.loader(train_loader):
        with monitor.step(tokens=batch["input_ids"].numel()):
            loss = model(batch).loss; loss.backward(); optimizer.step(); optimizer.zero_grad()
    monitor.close()

Per rank and step, without a torch.cuda.synchronize() per step: the wait for the batch (host time in the loader's
__next__), forward+backward (a forward pre-hook on the model to the last gradient accumulated: a post-accumulate
hook on each trainable parameter), the wait in the gradient all-reduce of a DDP model (from the last gradient
accumulated, when DDP launches its last bucket, to the optimizer's step, which starts once DDP has waited for every
bucket; with comm_hook=True, from the last bucket's launch marked by a communication hook), and the rest.
On a GPU the marks are CUDA events, read at the window's end (one event synchronize per window); on CPU, host
time. Every window (window_s; the first after FIRST_WINDOW_STEPS steps) each rank computes its medians and all
ranks exchange them with one small asynchronous all_gather on a separate gloo group, created once, here, after
the default group exists (a single process needs none). Windows end at step counts every rank computes alike
(from the previous exchange's results, identical everywhere), so the collectives of the ranks always pair up and
never wait for a rank that is between two steps. Rank 0 judges (steps.judge_windows), prints each new finding
once, and writes report= atomically as a gpudoctor.report/1 object after every window and at close. Every rank
writes a heartbeat (heartbeat_path: its step count and time) at every window's end.

Report-only: the monitor never stops, slows on purpose or changes the job; an error in it is printed once and
turns it off, never into the training loop.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from typing import Any

from gpudoctor.watch.samples import heartbeat_file
from gpudoctor.watch.steps import RankWindow, Window, judge_windows, median_known

FIRST_WINDOW_STEPS = 10  # the first window, before any step time is known
MIN_WINDOW_STEPS = 3
MAX_WINDOWS_KEPT = 1000  # about 8 h of 30 s windows; the oldest are dropped after the first few
PACKED = ("rank", "local_rank", "steps", "step_s", "data_s", "other_s", "compute_s", "comm_s", "tokens_per_s")
GROUP_TIMEOUT_S = 600.0
# The dataloader checks whose fixes make a loader keep up (checks/dataloader.py): workers against the CPUs, workers
# at all, pinned memory, persistent workers, /dev/shm for the workers' batches.
INPUT_CHECKS = ("GD-DL-001", "GD-DL-002", "GD-DL-003", "GD-DL-004", "GD-DL-005")


def heartbeat_path(pid: int | None = None) -> str:
    """Where a rank writes its heartbeat: a folder of this user's own under the temporary directory, named for
    the process, so that the outside watcher (which runs as the job's user on the node) finds it by PID."""
    return heartbeat_file(tempfile.gettempdir(), os.getuid(), pid or os.getpid())


class _Step:
    """The marks of one step: host seconds, or CUDA events."""

    __slots__ = ("data_s", "host_enter", "host_exit", "enter", "fwd", "bwd", "launch", "done", "exit", "tokens")

    def __init__(self, data_s: float) -> None:
        self.data_s = data_s
        self.host_enter = self.host_exit = 0.0
        # a mark: host seconds (float) or a torch.cuda.Event; None until the step reaches it
        self.enter: Any = None
        self.fwd: Any = None
        self.bwd: Any = None
        self.launch: Any = None
        self.done: Any = None
        self.exit: Any = None
        self.tokens: float | None = None


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
    heartbeat_path(); False: none); echo: where rank 0 prints each new finding (default stderr); comm_hook: mark
    each bucket's launch with a DDP communication hook (exact, but a Python callback per bucket) instead of taking
    the last gradient accumulated as the last bucket's launch.
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
        self._use_comm_hook = comm_hook
        self._t0 = time.perf_counter()
        self._steps: list[_Step] = []
        self._cur: _Step | None = None
        self._pending_data_s = 0.0
        self._count = 0
        self._next_window_at = FIRST_WINDOW_STEPS
        self._exchange: _Exchange | None = None
        self._windows: list[Window] = []
        self._printed: set[tuple] = set()
        self._loader: Iterable | None = None
        self._advice: list | None = None
        self._handles: list = []
        self._closed = False
        self._broken = False
        self._rank, self._world = _rank_and_world(torch)
        self._identity = _identity(torch, model, self._rank)
        self._clock = _Clock(torch, _device_of(model))
        self._expected_grads = 0
        self._grads_this_step = 0
        self._comm_timed = False
        if model is not None:
            self._attach(model)
        if self._world > 1:
            self._identities, self._group = _make_group(torch, self._identity)
        else:
            self._identities, self._group = [self._identity], None

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
        waited = self._pending_data_s if data_s is None else data_s
        self._pending_data_s = 0.0
        s = _Step(waited)
        s.host_enter = time.perf_counter()
        s.enter = self._clock.mark()
        self._cur = s
        self._grads_this_step = 0

    def end_step(self, tokens: float | None = None) -> None:
        s = self._cur
        if s is None or self._closed or self._broken:
            return
        s.exit = self._clock.mark()
        s.host_exit = time.perf_counter()
        s.tokens = tokens
        self._cur = None
        if self._expected_grads == 0:
            self._expected_grads = self._grads_this_step  # learnt from the first step
        self._steps.append(s)
        self._count += 1
        self._guarded(self._after_step)

    def close(self) -> list:
        """Stops timing; rank 0 judges what it has and writes the report. Returns the findings (rank 0)."""
        if self._closed:
            return []
        self._closed = True
        for h in self._handles:
            h.remove()
        findings: list = []
        if not self._broken:
            if self._exchange is not None:
                self._guarded(lambda: self._finish_exchange(wait=True))
            elif self._world == 1 and len(self._steps) >= MIN_WINDOW_STEPS:
                self._guarded(self._end_window)
            if self._rank == 0:
                findings = self._guarded(lambda: self._judge(final=True)) or []
            self._guarded(self._write_heartbeat)
        return findings

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def windows(self) -> list[Window]:
        return list(self._windows)

    # ------------------------------------------------------------ hooks on the model

    def attach(self, model) -> None:
        """Time forward, backward and the all-reduce of a model given after the monitor was made (callbacks)."""
        if not self._handles:
            self._clock = _Clock(self._torch, _device_of(model))
            self._attach(model)

    def _attach(self, model) -> None:
        self._handles.append(model.register_forward_pre_hook(self._on_forward))
        for p in model.parameters():
            if p.requires_grad and hasattr(p, "register_post_accumulate_grad_hook"):
                self._handles.append(p.register_post_accumulate_grad_hook(self._on_grad))
        self._comm_timed = _is_ddp(model) and (not self._use_comm_hook or _time_allreduce(model, self._on_launch))
        if self._comm_timed:
            from torch.optim.optimizer import register_optimizer_step_pre_hook

            self._handles.append(register_optimizer_step_pre_hook(self._on_optimizer))

    def _on_forward(self, module, args) -> None:
        s = self._cur
        if s is not None and s.fwd is None:
            s.fwd = self._clock.mark()

    def _on_grad(self, param) -> None:
        s = self._cur
        if s is None:
            return
        self._grads_this_step += 1
        # host time: every call (the last one stands); a CUDA event only at the last expected one
        if not self._clock.cuda:
            s.bwd = time.perf_counter()
        elif self._grads_this_step == self._expected_grads or self._expected_grads == 0:
            s.bwd = self._clock.mark()

    def _on_launch(self) -> None:
        s = self._cur
        if s is not None:
            s.launch = self._clock.mark()

    def _on_optimizer(self, optimizer, args, kwargs) -> None:
        """The optimizer starts once backward has returned: DDP has waited for every bucket's all-reduce."""
        s = self._cur
        if s is not None and s.done is None:
            s.done = self._clock.mark()

    # ------------------------------------------------------------ windows

    def _after_step(self) -> None:
        if self._exchange is not None and self._exchange.ready():
            self._finish_exchange(wait=False)
        if self._count >= self._next_window_at:
            self._end_window()

    def _end_window(self) -> None:
        mine = self._medians()
        self._steps = []
        self._write_heartbeat(mine)
        if self._group is None:
            self._add_window((mine,))
            self._next_window_at = self._count + self._window_steps(mine.step_s)
            if self._rank == 0:
                self._judge()
            return
        if self._exchange is not None:
            self._finish_exchange(wait=True)
        latest = self._windows[-1] if self._windows else None
        # every rank computes the same count from the same gathered window: the next exchange pairs up
        slowest = max((r.step_s for r in latest.ranks), default=0.0) if latest else 0.0
        self._next_window_at = self._count + (self._window_steps(slowest) if latest else FIRST_WINDOW_STEPS)
        self._exchange = _Exchange(self._torch, self._group, self._world, mine)

    def _window_steps(self, step_s: float) -> int:
        if step_s <= 0:
            return FIRST_WINDOW_STEPS
        return max(MIN_WINDOW_STEPS, int(round(self.window_s / step_s)))

    def _finish_exchange(self, wait: bool) -> None:
        ex, self._exchange = self._exchange, None
        if ex is None:
            return
        rows = ex.result(wait)
        ranks = tuple(_unpack(row, self._identities) for row in rows)
        self._add_window(ranks)
        if self._rank == 0:
            self._judge()

    def _add_window(self, ranks: tuple[RankWindow, ...]) -> None:
        self._windows.append(Window(len(self._windows), time.perf_counter() - self._t0, ranks))
        if len(self._windows) > MAX_WINDOWS_KEPT:  # keep the first ones: the job's own reference
            del self._windows[8]

    def _medians(self) -> RankWindow:
        steps = self._steps
        if steps:
            self._clock.settle(steps[-1].exit)
        c = self._clock.seconds
        inside = [c(s.enter, s.exit) or (s.host_exit - s.host_enter) for s in steps]
        compute = [c(s.fwd, s.bwd) for s in steps]
        # without the communication hook the last bucket is launched when the last gradient is accumulated
        comm = [c(s.launch or s.bwd, s.done if s.done is not None else s.exit) for s in steps]
        other = [max(0.0, i - (a or 0.0) - (b or 0.0)) for i, a, b in zip(inside, compute, comm, strict=True)]
        walls = [s.data_s + i for s, i in zip(steps, inside, strict=True)]
        tokens = [s.tokens for s in steps]
        rate = sum(t for t in tokens if t) / sum(walls) if all(tokens) and sum(walls) > 0 else None
        ident = self._identity
        return RankWindow(
            rank=self._rank,
            steps=len(steps),
            step_s=median_known(walls) or 0.0,
            data_s=median_known([s.data_s for s in steps]) or 0.0,
            other_s=median_known(other) or 0.0,
            compute_s=median_known(compute),
            comm_s=median_known(comm) if self._comm_timed else None,
            tokens_per_s=rate,
            host=ident["host"],
            local_rank=ident["local_rank"],
            device=ident["device"],
        )

    # ------------------------------------------------------------ rank 0: judge, print, report

    def _judge(self, final: bool = False) -> list:
        from gpudoctor.model import Severity

        if not self._windows:
            return []
        findings = judge_windows(self._windows, self._loader_advice(), self._loader_settings())
        for f in findings:
            key = (f.id, f.evidence.get("rank"))
            if f.severity in (Severity.WARN, Severity.FAIL) and key not in self._printed:
                self._printed.add(key)
                print(f"gpudoctor watch: {f.id} {f.severity.value}: {f.message}", file=self._echo or sys.stderr)
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

        watch = {
            "inside": True,
            "world_size": self._world,
            "window_s": self.window_s,
            "windows": [w.to_dict() for w in self._windows[-20:]],
            "windows_total": len(self._windows),
            "steps": self._count,
            "closed": final,
            "allreduce_timed": self._comm_timed,
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
        """Runs a piece of the monitor; an error turns the monitor off (said once), never into the job."""
        try:
            return fn()
        except Exception as e:  # report-only: the training loop must not see the monitor's errors
            if not self._broken:
                self._broken = True
                print(f"gpudoctor watch: monitor off after an error: {type(e).__name__}: {e}", file=sys.stderr)
            return None


# ---------------------------------------------------------------- the gather


class _Exchange:
    """One asynchronous all_gather of every rank's medians (PACKED, float64) on the monitor's gloo group."""

    def __init__(self, torch, group, world: int, mine: RankWindow) -> None:
        import torch.distributed as dist

        row = [getattr(mine, k) for k in PACKED]
        self.mine = torch.tensor([math.nan if v is None else float(v) for v in row], dtype=torch.float64)
        self.rows = [torch.empty_like(self.mine) for _ in range(world)]
        self.work = dist.all_gather(self.rows, self.mine, group=group, async_op=True)

    def ready(self) -> bool:
        return bool(self.work.is_completed())

    def result(self, wait: bool) -> list[list[float]]:
        if wait or not self.ready():
            self.work.wait()
        return [t.tolist() for t in self.rows]


def _unpack(row: list[float], identities: list[dict]) -> RankWindow:
    d: dict = {k: (None if math.isnan(v) else v) for k, v in zip(PACKED, row, strict=True)}
    rank = int(d["rank"])
    ident = identities[rank] if rank < len(identities) else {}
    return RankWindow(
        rank=rank,
        steps=int(d["steps"]),
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


def _make_group(torch, identity: dict) -> tuple[list[dict], object]:
    """The monitor's own gloo group (created once: a collective of every rank) and every rank's identity."""
    import datetime

    import torch.distributed as dist

    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    identities: list = [None] * dist.get_world_size()
    dist.all_gather_object(identities, identity, group=group)
    return [dict(i) for i in identities], group


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


def _identity(torch, model, rank: int) -> dict:
    local = os.environ.get("LOCAL_RANK") or os.environ.get("SLURM_LOCALID")
    device = _device_of(model)
    return {
        "rank": rank,
        "host": socket.gethostname(),
        "local_rank": int(local) if local and local.isdigit() else None,
        "device": str(device) if device is not None else None,
        "pid": os.getpid(),
    }


def _is_ddp(model) -> bool:
    from torch.nn.parallel import DistributedDataParallel

    return isinstance(model, DistributedDataParallel)


def _time_allreduce(model, on_launch) -> bool:
    """Monitor(comm_hook=True): a communication hook that marks each bucket's launch and reduces it with torch's
    own default_hooks.allreduce_hook (divide by the world size, all_reduce), so what is reduced does not change.
    Its Python completion callback costs a thread hand-off per bucket (benchmarks/bench_monitor_overhead.py), hence
    not the default. False when the job registered a communication hook of its own (a DDP model takes one: the
    job's stays)."""
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        return False
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def timed(group, bucket):
        on_launch()
        return allreduce_hook(group, bucket)

    try:
        model.register_comm_hook(None, timed)
    except RuntimeError:  # the job registered its own: it stays; the all-reduce is not timed apart
        return False
    return True


def _input_bound(windows: list[Window]) -> bool:
    from gpudoctor.watch.steps import input_bound

    return bool(input_bound(windows))
