"""The smoke run's optimizer, and torch._dynamo's import kept off the rank's critical path.

torch.optim's optimizers import torch._dynamo on first use (their methods are wrapped in torch._disable_dynamo):
4.4 s of wall on an H200 VM, 3 CPU-s on the 2-core CI kind. The default run trains with torch's fused AdamW, what
users train with, and has that import overlap the rank's first device-timed phases (import_dynamo_in_background).
--quick trains with the same AdamW update written out with torch._foreach ops (ForeachAdamW), which imports nothing:
a prolog's budget is a few seconds.
"""

from __future__ import annotations

import importlib
import math
import sys
import threading

import torch

BETAS, WEIGHT_DECAY = (0.9, 0.95), 0.1


def build(params, lr: float, quick: bool) -> tuple[object, str]:
    """(the optimizer, its name for the report)."""
    params = [p for p in params if p.requires_grad]
    if quick:
        return ForeachAdamW(params, lr), "AdamW (foreach ops, written out: --quick)"
    try:
        return torch.optim.AdamW(params, lr=lr, betas=BETAS, weight_decay=WEIGHT_DECAY, fused=True), "AdamW (fused)"
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(params, lr=lr, betas=BETAS, weight_decay=WEIGHT_DECAY), "AdamW (foreach)"


class ForeachAdamW:
    """AdamW (decoupled weight decay, bias-corrected moments: Loshchilov & Hutter; torch.optim.AdamW's update) with
    torch._foreach ops. As much of the torch.optim interface as the run and GradScaler use: param_groups (lr,
    params), step(), zero_grad()."""

    def __init__(self, params: list[torch.Tensor], lr: float, eps: float = 1e-8):
        self.params = params
        self.param_groups: list[dict] = [{"params": params, "lr": lr}]
        self.eps, self.steps = eps, 0
        self.exp_avg = [torch.zeros_like(p) for p in params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self) -> None:
        have = [i for i, p in enumerate(self.params) if p.grad is not None]
        params = [self.params[i] for i in have]
        grads = [g for g in (self.params[i].grad for i in have) if g is not None]
        exp_avg = [self.exp_avg[i] for i in have]
        exp_avg_sq = [self.exp_avg_sq[i] for i in have]
        self.steps += 1
        lr: float = self.param_groups[0]["lr"]
        beta1, beta2 = BETAS
        torch._foreach_mul_(params, 1 - lr * WEIGHT_DECAY)
        torch._foreach_lerp_(exp_avg, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sq, beta2)
        torch._foreach_addcmul_(exp_avg_sq, grads, grads, 1 - beta2)
        denom = torch._foreach_sqrt(exp_avg_sq)
        torch._foreach_div_(denom, math.sqrt(1 - beta2**self.steps))
        torch._foreach_add_(denom, self.eps)
        torch._foreach_addcdiv_(params, exp_avg, denom, -lr / (1 - beta1**self.steps))

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None


def import_dynamo_in_background() -> threading.Thread | None:
    """Start importing torch._dynamo in a thread (None: already imported). For GPU ranks: their first phases are
    timed on the device with calls queued well ahead, which a thread holding the GIL for a moment does not starve;
    join it before anything timed on the host. CPU ranks are timed on the CPU: the spawning launcher imports it
    once before forking them (ranks.fork_ranks)."""
    if "torch._dynamo" in sys.modules:
        return None
    thread = threading.Thread(target=importlib.import_module, args=("torch._dynamo",), daemon=True)
    thread.start()
    return thread
