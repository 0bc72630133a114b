"""Wall times of gpudoctor commands run as fresh processes (interpreter start included), interleaved so that
machine noise hits all of them alike: the shared part of bench_check.py and bench_health.py."""

from __future__ import annotations

import os
import platform
import subprocess
import time

VERDICT_EXITS = (0, 1)  # gpudoctor's "no fail" and "a fail": anything else means the timing measured a crash


def wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    elapsed = time.perf_counter() - t0
    if r.returncode not in VERDICT_EXITS or b"Traceback" in r.stderr:
        raise SystemExit(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.decode(errors='replace')[-500:]}")
    return elapsed


def interleaved(commands: dict[str, list[str]], runs: int) -> dict[str, list[float]]:
    """Each command's wall times over `runs` rounds of all of them in turn, after one round to warm the page cache."""
    for cmd in commands.values():
        wall(cmd)
    times: dict[str, list[float]] = {k: [] for k in commands}
    for _ in range(runs):
        for name, cmd in commands.items():
            times[name].append(wall(cmd))
    return times


def machine() -> str:
    """The machine the figures were taken on, as docs/benchmarks.md names it."""
    import torch

    return (
        f"machine: {platform.node()} · {os.cpu_count()} CPUs · {platform.platform()} · "
        f"Python {platform.python_version()} · torch {torch.__version__}"
    )
