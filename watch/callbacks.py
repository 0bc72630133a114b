"""The monitor (monitor.Monitor) as a PyTorch Lightning callback and as a Hugging Face Trainer callback.

    trainer = lightning.Trainer(..., callbacks=[gpudoctor.watch.LightningCallback(window_s=30, report="watch.json")])
    trainer = transformers.Trainer(..., callbacks=[gpudoctor.watch.HFCallback(window_s=30, report="watch.json")])

Each subclasses its framework's Callback / TrainerCallback when the framework is installed (imported here, when
gpudoctor.watch.LightningCallback or HFCallback is first used; `import gpudoctor.watch` imports neither), and a
plain class otherwise. The monitor is made when training starts, on every rank at once (its gloo group is a
collective): Lightning's on_train_start, with the model as the strategy wraps it (trainer.model: DDP's
all-reduce is timed); the Trainer's on_train_begin, with the model it passes (unwrapped: forward+backward are
timed, the all-reduce is part of the rest). A step's wait for data is the time since the previous step ended (the
loader runs there, with the framework's own bookkeeping).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpudoctor.watch.monitor import Monitor


def _framework_base(*candidates: tuple[str, str]) -> type:
    for module, name in candidates:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    return object


class _Face:
    """What both callbacks share: the monitor's options, its making, and the wait between two steps."""

    def _setup(self, window_s: float, report: str | None, tokens: Callable | None, heartbeat) -> None:
        self.window_s = window_s
        self.report = report
        self.tokens = tokens
        self.heartbeat = heartbeat
        self.monitor: Monitor | None = None
        self._last_end: float | None = None

    def _start(self, model) -> None:
        from gpudoctor.watch.monitor import Monitor

        self.monitor = Monitor(model=model, window_s=self.window_s, report=self.report, heartbeat=self.heartbeat)
        self._last_end = None

    def _begin(self) -> None:
        if self.monitor is None:
            return
        now = time.perf_counter()
        self.monitor.begin_step(data_s=0.0 if self._last_end is None else now - self._last_end)

    def _end(self, tokens: float | None) -> None:
        if self.monitor is None:
            return
        self.monitor.end_step(tokens)
        self._last_end = time.perf_counter()

    def _close(self) -> list:
        findings: list = self.monitor.close() if self.monitor is not None else []
        self.monitor = None
        return findings


class LightningCallback(_Face, _framework_base(("lightning.pytorch", "Callback"), ("pytorch_lightning", "Callback"))):  # type: ignore[misc]
    """gpudoctor.watch.Monitor as a Lightning callback. tokens: batch -> tokens in it (for tokens/s)."""

    def __init__(
        self, window_s: float = 30.0, report: str | None = None, tokens: Callable | None = None, heartbeat=True
    ) -> None:
        super().__init__()
        self._setup(window_s, report, tokens, heartbeat)

    def on_train_start(self, trainer, pl_module) -> None:
        self._start(getattr(trainer, "model", None) or pl_module)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._begin()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._end(self.tokens(batch) if self.tokens is not None else None)

    def on_train_end(self, trainer, pl_module) -> None:
        self._close()


class HFCallback(_Face, _framework_base(("transformers", "TrainerCallback"))):  # type: ignore[misc]
    """gpudoctor.watch.Monitor as a Hugging Face Trainer callback. Tokens come from the Trainer's own count
    (state.num_input_tokens_seen, with TrainingArguments(include_num_input_tokens_seen=True))."""

    def __init__(self, window_s: float = 30.0, report: str | None = None, heartbeat=True) -> None:
        super().__init__()
        self._setup(window_s, report, None, heartbeat)
        self._seen = 0

    def on_train_begin(self, args, state, control, model=None, **kwargs) -> None:
        self._start(model)
        self._seen = getattr(state, "num_input_tokens_seen", 0) or 0

    def on_step_begin(self, args, state, control, **kwargs) -> None:
        self._begin()

    def on_step_end(self, args, state, control, **kwargs) -> None:
        seen = getattr(state, "num_input_tokens_seen", 0) or 0
        tokens, self._seen = (seen - self._seen if seen > self._seen else None), seen
        self._end(tokens)

    def on_train_end(self, args, state, control, **kwargs) -> None:
        self._close()
