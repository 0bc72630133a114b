"""The smoke run's optimizer: torch's AdamW, fused where the device has it.

torch.optim's optimizers and DDP's constructor import torch._dynamo on first use (the optimizers' methods are
wrapped in torch._disable_dynamo; DDP reads torch._dynamo.utils' optimize-DDP mode): 4.4 s of wall on an H200 VM,
3 CPU-s on the 2-core CI kind. The spawning launcher imports it once before forking the ranks (ranks.fork_ranks),
except for a --quick run, which trains without DDP and this optimizer where it can (handdp.py).
Importing it in a thread beside a rank's first phases was tried on an H200 (docs/benchmarks.md): NCCL's set-up
then waited seconds for the GIL, and the device memory copy read 1.0-1.6 TB/s instead of 4 (launches held back
between copies of a quarter of a millisecond): a false alarm. Measurements run alone.
"""

from __future__ import annotations

import torch

BETAS, WEIGHT_DECAY = (0.9, 0.95), 0.1


def build(params, lr: float) -> tuple[torch.optim.Optimizer, str]:
    """(torch's AdamW, fused where the device has it; its name for the report)."""
    params = [p for p in params if p.requires_grad]
    try:
        return torch.optim.AdamW(params, lr=lr, betas=BETAS, weight_decay=WEIGHT_DECAY, fused=True), "AdamW (fused)"
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(params, lr=lr, betas=BETAS, weight_decay=WEIGHT_DECAY), "AdamW (foreach)"
