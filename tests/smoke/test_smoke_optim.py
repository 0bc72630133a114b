"""--quick's AdamW written out (sample_train/optim.ForeachAdamW) is torch.optim.AdamW's update, bit for bit, without
importing torch._dynamo (what torch.optim's first use imports: 4.4 s on an H200 VM)."""

from __future__ import annotations

import copy
import subprocess
import sys

import torch

from gpudoctor.sample_train.optim import BETAS, WEIGHT_DECAY, ForeachAdamW


def test_foreach_adamw_is_torchs_adamw_bit_for_bit():
    torch.manual_seed(0)
    ours = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    theirs = copy.deepcopy(ours)
    reference = torch.optim.AdamW(theirs.parameters(), lr=1e-2, betas=BETAS, weight_decay=WEIGHT_DECAY, foreach=True)
    optimizer = ForeachAdamW(list(ours.parameters()), lr=1e-2)
    for _ in range(12):
        x = torch.randn(8, 16)
        for model, opt in ((ours, optimizer), (theirs, reference)):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(a, b)


def test_training_with_it_imports_no_dynamo():
    code = (
        "import sys, torch\n"
        "from gpudoctor.sample_train.optim import build\n"
        "m = torch.nn.Linear(4, 4)\n"
        "opt, name = build(m.parameters(), 1e-3, quick=True)\n"
        "m(torch.ones(2, 4)).sum().backward(); opt.step(); opt.zero_grad()\n"
        "print(name, 'torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().endswith("False") and "foreach" in out.stdout
