"""How long `gpudoctor check` takes, as ratios to `python -c "import torch"` measured in the same run.

    python benchmarks/bench_check.py [--runs 7] [--markdown]

Runs each command in turn (interleaved, so machine noise hits all of them alike) and
reports the median wall time. The numbers go to docs/benchmarks.md with the machine named.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

from process_timing import interleaved, machine

# -P: run from a source checkout, the cwd's gpudoctor/ folder must not stand in for the installed package.
PY = [sys.executable, "-P"]
COMMANDS = {
    "import torch": [*PY, "-c", "import torch"],
    "gpudoctor check": [*PY, "-m", "gpudoctor", "check"],
    "gpudoctor check --json": [*PY, "-m", "gpudoctor", "check", "--json"],
    "gpudoctor check --select allocator,devices": [*PY, "-m", "gpudoctor", "check", "--select", "allocator,devices"],
    "torch.utils.collect_env": [*PY, "-m", "torch.utils.collect_env"],
}


def torch_imported_by_select() -> bool:
    """Does `check --select allocator,devices` import torch anywhere (this process or a child)?"""
    code = (
        "import sys, gpudoctor.cli as c\n"
        "rc = c.main(['check', '--select', 'allocator,devices', '--json'])\n"
        "sys.stderr.write('TORCH_LOADED=%s\\n' % ('torch' in sys.modules))\n"
    )
    r = subprocess.run([*PY, "-c", code], capture_output=True, text=True)
    return "TORCH_LOADED=True" in r.stderr


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    times = interleaved(COMMANDS, args.runs)
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["import torch"]
    lines = [
        machine(),
        f"runs: {args.runs} each, interleaved; median wall time",
        "",
        "| command | median s | min s | max s | ratio to `import torch` |",
        "|---|---|---|---|---|",
    ]
    for k, v in times.items():
        lines.append(f"| `{k}` | {med[k]:.3f} | {min(v):.3f} | {max(v):.3f} | {med[k] / base:.2f} |")
    lines.append("")
    lines.append(f"`check --select allocator,devices` imports torch: {torch_imported_by_select()}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
