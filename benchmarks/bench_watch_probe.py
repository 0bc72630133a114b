"""The CPU the `gpudoctor watch` node probe costs on a node, per window.

    python benchmarks/bench_watch_probe.py [--window 30] [--processes 8] [--runs 3]

Starts --processes sleeping processes that carry a job's SLURM_JOB_ID (the probe's /proc scan finds them as it
finds a job's ranks), runs `python -m gpudoctor.watch.node --job J --for WINDOW` --runs times, and reports the
probe's user+system CPU seconds (the children's rusage) and that as a share of one core over the window; the
same with no window gives the fixed part (the interpreter's start, the /proc scan). NVML is sampled where
nvidia-ml-py finds a driver, so on a GPU node the figure includes the sampling (--rate, default 1 Hz).
The numbers go to docs/benchmarks.md with the machine named.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys

JOB = "900000001"


def cpu_of(cmd: list[str], env: dict) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"the probe exited {r.returncode}: {r.stderr.decode(errors='replace')[-500:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--window", type=float, default=30.0)
    p.add_argument("--processes", type=int, default=8)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rate", type=float, default=1.0)
    args = p.parse_args()
    env = dict(os.environ, SLURM_JOB_ID=JOB, SLURM_CONF=os.devnull)  # scontrol listpids fails at once here
    ranks = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], env=env, stdin=subprocess.DEVNULL)
        for _ in range(args.processes)
    ]
    probe_env = {k: v for k, v in env.items() if k != "SLURM_JOB_ID"}
    try:
        probe = [sys.executable, "-P", "-m", "gpudoctor.watch.node", "--job", JOB, "--rate", str(args.rate)]
        fixed = [cpu_of([*probe, "--for", "0"], probe_env) for _ in range(args.runs)]
        windowed = [cpu_of([*probe, "--for", str(args.window)], probe_env) for _ in range(args.runs)]
    finally:
        for r in ranks:
            r.kill()
            r.wait()
    machine = f"{platform.node()} · {os.cpu_count()} CPUs · {platform.platform()}"
    print(f"machine: {machine} · Python {platform.python_version()}")
    print(f"{args.processes} job processes, window {args.window:g} s, rate {args.rate:g} Hz, {args.runs} runs")
    print(f"no window:   median {statistics.median(fixed):.3f} s CPU (min {min(fixed):.3f}, max {max(fixed):.3f})")
    med = statistics.median(windowed)
    print(
        f"{args.window:g} s window: median {med:.3f} s CPU = {100 * med / args.window:.2f} % of one core "
        f"(min {min(windowed):.3f}, max {max(windowed):.3f})"
    )


if __name__ == "__main__":
    main()
