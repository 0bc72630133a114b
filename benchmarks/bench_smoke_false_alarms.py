"""How often a healthy smoke run names somebody slow, and how far its figures spread: the false-alarm rate.

    python benchmarks/bench_smoke_false_alarms.py [--runs 20] [--gpus 2] [--device cpu] [--markdown]
    python benchmarks/bench_smoke_false_alarms.py --nodes 4 --runs 8 --markdown   # root: healthy netns worlds

Runs `gpudoctor smoke --json` again and again on one healthy machine and counts the runs in which a speed
verdict (GD-SMOKE-010/015/016/017/018) warned or failed, i.e. named a rank, node or link; and, per figure,
the worst shortfall below the job's median seen in any run (what the minimum gaps of sample_train/judge/slowness.py
must stay above). Also the wall time of the part benchmarks and node pairs per run (their cost).
The numbers go to docs/benchmarks.md with the machine named.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

SPEED = ("GD-SMOKE-010", "GD-SMOKE-015", "GD-SMOKE-016", "GD-SMOKE-017", "GD-SMOKE-018")
NEW_STAGES = ("part benchmarks", "node pairs", "GPU pairs inside nodes")


def one_run(device: str, gpus: int, extra: list[str], nodes: int = 0, number: int = 0) -> dict:
    if nodes:  # a healthy world of nodes in network namespaces (tests/smoke/networld.py), one rank each
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
        from tests.smoke.networld import NetWorld
        from tests.smoke.test_smoke_slowness import run_world

        with NetWorld(nodes, prefix=f"gfa{number}") as world:
            rep, _ = run_world(world, *extra)
    else:
        cmd = [sys.executable, "-P", "-m", "gpudoctor", "smoke", "--device", device, "--gpus", str(gpus), "--json"]
        r = subprocess.run([*cmd, *extra], capture_output=True, text=True, timeout=600)
        rep = json.loads(r.stdout)
    named = [f["id"] for f in rep["findings"] if f["id"] in SPEED and f["severity"] in ("warn", "fail")]
    worst = {}
    for f in (rep.get("parts") or {}).get("figures", []):
        values = [row[f["key"]] for row in rep["ranks"] if row.get(f["key"]) is not None]
        if len(values) >= 2:
            reference = statistics.median(values) if len(values) > 2 else max(values)
            worst[f["key"]] = max(0.0, 1 - min(values) / reference)
    stage = [row.get("stage_seconds") or {} for row in rep["ranks"]]
    cost = max(sum(s.get(name, 0.0) for name in NEW_STAGES) for s in stage) if stage else None
    return {"ok": rep["ok"], "named": named, "worst": worst, "cost_s": cost, "wall_s": rep["wall_s"]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--nodes", type=int, default=0, help="healthy worlds of this many netns nodes instead (root)")
    ap.add_argument("extra", nargs="*", help="more smoke flags")
    args = ap.parse_args()
    runs = [one_run(args.device, args.gpus, args.extra, args.nodes, k) for k in range(args.runs)]
    alarms = [r for r in runs if r["named"]]
    keys = sorted({k for r in runs for k in r["worst"]})
    worst = {k: max(r["worst"].get(k, 0.0) for r in runs) for k in keys}
    costs = [r["cost_s"] for r in runs if r["cost_s"] is not None]
    walls = [r["wall_s"] for r in runs]
    shape = f"{args.nodes} netns nodes x 1 rank" if args.nodes else f"{args.gpus} ranks"
    where = f"{platform.node()} ({os.cpu_count()} CPUs), {args.device}, {shape}"
    if args.markdown:
        header = "runs | runs naming somebody | worst shortfall per figure | new phases s (median) | wall s"
        print(f"| {where} | {header} |")
        print("|---|---:|---:|---|---:|---:|")
        shown = ", ".join(f"{k} {v:.0%}" for k, v in worst.items())
        print(
            f"| | {len(runs)} | {len(alarms)} | {shown} | {statistics.median(costs):.2f} | "
            f"{statistics.median(walls):.1f} |"
        )
    else:
        print(json.dumps({"where": where, "runs": runs, "worst": worst}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
