"""NCCL's INFO log of a one-rank communicator on this GPU, as the smoke run captures it (sample_train/nccllog.py):
`python benchmarks/nccl_log_one_rank.py OUT.log` — a real log to test the transport reader against."""

from __future__ import annotations

import os
import sys

os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET", NCCL_DEBUG_FILE=sys.argv[1])
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

torch.cuda.set_device(0)
store = dist.HashStore()
dist.init_process_group("nccl", store=store, rank=0, world_size=1)
t = torch.ones(1, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
dist.destroy_process_group()
print("all-reduce", t.item())
