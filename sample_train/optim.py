"""The smoke run's optimizer, and torch._dynamo's import kept off the rank's critical path.

torch.optim's optimizers and DDP's constructor import torch._dynamo on first use (the optimizers' methods are
wrapped in torch._disable_dynamo; DDP reads torch._dynamo.utils' optimize-DDP mode): 4.4 s of wall on an H200 VM,
3 CPU-s on the 2-core CI kind. GPU ranks import it in a thread beside their first device-timed phases
(DynamoImport); CPU ranks, whose phases are timed on the CPU, get it from the spawning launcher,
which imports it once before forking them (ranks.fork_ranks).
"""

from __future__ import annotations

import importlib
import sys
import threading

import torch

BETAS, WEIGHT_DECAY = (0.9, 0.95), 0.1


def build(params, lr: float) -> tuple[torch.optim.Optimizer, str]:
    """(torch's AdamW, fused where the device has it; its name for the report)."""
    params = [p for p in params if p.requires_grad]
    try:
        return torch.optim.AdamW(params, lr=lr, betas=BETAS, weight_decay=WEIGHT_DECAY, fused=True), "AdamW (fused)"
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(params, lr=lr, betas=BETAS, weight_decay=WEIGHT_DECAY), "AdamW (foreach)"


class DynamoImport:
    """torch._dynamo imported in a thread while this GPU rank runs its device-timed benchmarks; wait() before
    anything timed on the host. Started after the first all-reduce: NCCL's set-up makes many short blocking calls
    (store reads), each of which would wait for the importing thread to give the GIL back (a switch interval, 5 ms
    by default: seconds in all, measured on an H200). While it runs the switch interval is 0.5 ms, so a thread that
    blocked briefly gets the GIL back quickly; the benchmarks' windows are timed on the device with calls queued well
    ahead, which such a pause does not starve."""

    SWITCH_INTERVAL_S = 0.0005

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.switch_interval = sys.getswitchinterval()

    def start(self) -> None:
        if "torch._dynamo" in sys.modules or self.thread is not None:
            return
        sys.setswitchinterval(self.SWITCH_INTERVAL_S)
        self.thread = threading.Thread(target=importlib.import_module, args=("torch._dynamo",), daemon=True)
        self.thread.start()

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None
            sys.setswitchinterval(self.switch_interval)
