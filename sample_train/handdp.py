"""--quick's few training steps without DDP or torch.optim, which import torch._dynamo on first use (optim.py):
4.4 s of wall on an H200 VM (more than half of the 8 s a quick run is meant to take) and about 2 CPU-s here.

The same data-parallel step, done by the rank itself: rank 0's parameters broadcast once (what DDP's
constructor does), then after each backward every gradient summed by one all-reduce of a flat buffer and
divided by the world size (DDP's average, without its overlap of buckets with the backward), then AdamW's
update with torch's defaults for the rest (Loshchilov & Hutter, decoupled weight decay; torch.optim.AdamW's
algorithm, amsgrad off). Every rank then holds the same bits, as under DDP. Used only where nothing else
needs torch._dynamo and no figure depends on DDP: no --compile, no fp16 (GradScaler steps a torch.optim
optimizer), no --min-scaling (the all-reduce no longer overlaps the backward, so the step's efficiency reads
lower than under DDP; the parts and each rank's own forward+backward, which a baseline compares, do not).
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from gpudoctor.sample_train.optim import BETAS, WEIGHT_DECAY

EPS = 1e-8  # torch.optim.AdamW's default
NAME = "AdamW (hand-written, gradients all-reduced after the backward: --quick, no DDP)"


def usable(opts, precision: str) -> bool:
    """Whether the run (SmokeOptions) trains this way: --quick, and none of the exceptions above."""
    return opts.measure.quick and not opts.train.compile and precision != "fp16" and opts.floors.min_scaling is None


class Replicated(torch.nn.Module):
    """The model with rank 0's parameters; DDP's interface as the training loop uses it (call, no_sync)."""

    def __init__(self, module: torch.nn.Module, world_size: int):
        super().__init__()
        self.module = module
        if world_size > 1:
            for p in module.parameters():
                dist.broadcast(p.data, src=0)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Nothing is synchronised during the backward here: the optimizer's step all-reduces."""
        yield


class AdamW:
    """torch.optim.AdamW's update (param_groups, step, zero_grad as the loop uses them) after averaging the
    gradients over the world."""

    def __init__(self, params, lr: float, world_size: int):
        self.params = [p for p in params if p.requires_grad]
        self.param_groups = [{"lr": lr}]
        self.world_size = world_size
        self.steps = 0
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        self._reduced = False

    def _average_gradients(self, grads: list[torch.Tensor]) -> None:
        if self.world_size < 2:
            return
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        flat.div_(self.world_size)
        for grad, summed in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
            grad.copy_(summed)

    @torch.no_grad()
    def reduce_gradients(self) -> None:
        """The gradient all-reduce on its own. The rank's loop calls it in its "backward + gradient all-reduce"
        phase, where DDP's reduction runs (inside backward), so that a rank stuck in it is named there, not in the
        optimizer; step() does it itself when it was not called."""
        for p in self.params:
            if p.grad is None:  # every rank all-reduces the same flat buffer, whatever its graph left unused
                p.grad = torch.zeros_like(p)
        self._average_gradients([p.grad for p in self.params])
        self._reduced = True

    @torch.no_grad()
    def step(self) -> None:
        if not self._reduced:
            self.reduce_gradients()
        self._reduced = False
        grads = [p.grad for p in self.params]
        self.steps += 1
        lr, (beta1, beta2) = self.param_groups[0]["lr"], BETAS
        bias1, bias2 = 1 - beta1**self.steps, 1 - beta2**self.steps
        for p, g, m, v in zip(self.params, grads, self.exp_avg, self.exp_avg_sq, strict=True):
            p.mul_(1 - lr * WEIGHT_DECAY)
            m.lerp_(g, 1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (v.sqrt() / math.sqrt(bias2)).add_(EPS)
            p.addcdiv_(m, denom, value=-lr / bias1)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None
