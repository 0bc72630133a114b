"""How long `gpudoctor health` (the SLURM HealthCheckProgram/Prolog mode) takes on this machine.

    python benchmarks/bench_health.py [--runs 9]

Runs each command as a fresh process, interleaved (machine noise hits all alike), and reports the median
wall time, which includes the interpreter's start; `import torch` is the yardstick. The numbers go to
docs/benchmarks.md with the machine named.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from process_timing import interleaved, machine

PY = [sys.executable, "-P"]  # -P: the installed gpudoctor, not a source folder in the cwd
SNAPSHOT = Path(__file__).parents[1] / "tests" / "fixtures" / "facts" / "synthetic-h100x8-healthy.json"
COMMANDS = {
    "import torch": [*PY, "-c", "import torch"],
    "gpudoctor health --expect-gpus 0": [*PY, "-m", "gpudoctor", "health", "--expect-gpus", "0"],
    "gpudoctor health": [*PY, "-m", "gpudoctor", "health"],
    "gpudoctor health --snapshot (replay)": [*PY, "-m", "gpudoctor", "health", "--snapshot", str(SNAPSHOT)],
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=9)
    args = ap.parse_args()
    times = interleaved(COMMANDS, args.runs)
    print(
        f"{machine()}\n"
        f"runs: {args.runs} each, interleaved; median wall time (interpreter start included)\n\n"
        "| command | median s | min s | max s |\n|---|---|---|---|"
    )
    for k, v in times.items():
        print(f"| `{k}` | {statistics.median(v):.3f} | {min(v):.3f} | {max(v):.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
