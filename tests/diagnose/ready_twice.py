import os, datetime
import torch, torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        x = checkpoint(self.a, x, use_reentrant=True)
        return checkpoint(self.a, x, use_reentrant=True) + self.b(x)


m = nn.parallel.DistributedDataParallel(Net(), find_unused_parameters=True)
x = torch.randn(4, 8, requires_grad=True)
m(x).sum().backward()
