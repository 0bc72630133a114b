"""The smoke run's optimizer, and torch._dynamo's import kept off the rank's critical path.

torch.optim's optimizers and DDP's constructor import torch._dynamo on first use (the optimizers' methods are
wrapped in torch._disable_dynamo; DDP reads torch._dynamo.utils' optimize-DDP mode): 4.4 s of wall on an H200 VM,
3 CPU-s on the 2-core CI kind. GPU ranks import it in a thread beside their first device-timed phases
(import_dynamo_in_background); CPU ranks, whose phases are timed on the CPU, get it from the spawning launcher,
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


def import_dynamo_in_background() -> threading.Thread | None:
    """Start importing torch._dynamo in a thread (None: already imported). For GPU ranks: their first phases are
    timed on the device with calls queued well ahead, which a thread holding the GIL for a moment does not starve;
    join it before anything timed on the host."""
    if "torch._dynamo" in sys.modules:
        return None
    thread = threading.Thread(target=importlib.import_module, args=("torch._dynamo",), daemon=True)
    thread.start()
    return thread
