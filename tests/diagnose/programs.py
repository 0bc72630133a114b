"""Small gloo programs that fail the way real jobs fail, for tests/fixtures/logs/ (README there) and the
`world` tests that produce the logs again: `python -m tests.diagnose.programs SCENARIO` under torchrun."""

from __future__ import annotations

import os
import sys
import time


def _init():
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=float(os.environ.get("T", "20"))))
    return dist, dist.get_rank(), dist.get_world_size()


def raises_first() -> None:
    """Rank 1 raises before the second all-reduce; the others wait in it and time out."""
    import torch

    dist, rank, _ = _init()
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 1:
        raise ValueError(f"bad batch shape on rank {rank}: expected (8, 128), got (8, 127)")
    dist.all_reduce(t)
    dist.all_reduce(t)


def unused_parameters() -> None:
    """A DDP model with a branch that is never used in the loss (find_unused_parameters=False)."""
    import torch
    from torch import nn

    dist, rank, _ = _init()

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.used = nn.Linear(8, 8)
            self.unused = nn.Linear(8, 8)

        def forward(self, x):
            return self.used(x)

    model = nn.parallel.DistributedDataParallel(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()


def ready_twice() -> None:
    """One Linear wrapped twice in reentrant checkpoints under DDP(find_unused_parameters=True)."""
    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    _init()

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(8, 8)
            self.b = nn.Linear(8, 8)

        def forward(self, x):
            x = checkpoint(self.a, x, use_reentrant=True)
            return checkpoint(self.a, x, use_reentrant=True) + self.b(x)

    model = nn.parallel.DistributedDataParallel(Net(), find_unused_parameters=True)
    model(torch.randn(4, 8, requires_grad=True)).sum().backward()


def collective_mismatch() -> None:
    """Rank 0 all-reduces where rank 1 broadcasts (TORCH_DISTRIBUTED_DEBUG=DETAIL checks the fingerprints)."""
    import torch

    dist, rank, _ = _init()
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)


def sleep_then_ok() -> None:
    """Holds the rendezvous port (a first torchrun) while a second one starts on the same port."""
    _init()
    time.sleep(float(os.environ.get("HOLD", "15")))


def loader_bus_error() -> None:
    """DataLoader workers handing over batches larger than /dev/shm (run under a tiny /dev/shm)."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Big(Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            return torch.ones(4 * 2**20)  # 16 MiB per item

    for _ in DataLoader(Big(), batch_size=4, num_workers=2):
        pass


SCENARIOS = {
    f.__name__: f
    for f in (raises_first, unused_parameters, ready_twice, collective_mismatch, sleep_then_ok, loader_bus_error)
}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]]()
