"""Time to build the job model (gpudoctor/job/model.py) of large jobs: `python benchmarks/bench_jobmodel.py`.

Prints, for each shape, the median wall time of build() over --runs runs (the script parsed once, outside the
timing), with this process's environment as the submit environment.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

from gpudoctor.job.model import build
from gpudoctor.readers.sbatch import parse_sbatch

SHAPES = (
    ("srun bash -c 'python t.py --rank=$SLURM_PROCID'", 8),
    ("srun torchrun --nnodes={n} --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=h:1 t.py", 1),
    ("srun bash -c 'torchrun --nnodes={n} --node_rank=$SLURM_NODEID --nproc_per_node=8 --master_addr=h t.py'", 1),
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nodes", type=int, nargs="+", default=[16, 512, 4096])
    args = parser.parse_args()
    env = dict(os.environ)
    print(f"- machine: {platform.node()} · {os.cpu_count()} CPUs · Python {platform.python_version()}")
    print("\n| nodes | launch line | processes | median s |\n|---|---|---|---|")
    for n in args.nodes:
        for line, per_node in SHAPES:
            text = f"#!/bin/bash\n#SBATCH --nodes={n}\n#SBATCH --ntasks-per-node={per_node}\n#SBATCH --gres=gpu:8\n"
            script = parse_sbatch(text + line.format(n=n) + "\n", "bench.slurm")
            times, count = [], 0
            for _ in range(args.runs):
                start = time.perf_counter()
                count = len(list(build(script, env).processes()))
                times.append(time.perf_counter() - start)
            print(f"| {n} | `{line.format(n=n)[:60]}` | {count} | {statistics.median(times):.2f} |")


if __name__ == "__main__":
    main()
