"""`gpudoctor fix --validate`: prove the fixed set-up with a short smoke training run, where one can run.

Where the target is this machine (a plain `fix`, or `fix` inside the job's allocation), the smoke run
is started in a child process whose environment carries the planned environment changes (set and
unset), so it trains the way the fixed job will. Before submission the job's nodes are elsewhere:
nothing is run, and the exact command to validate inside the allocation is returned instead.
The child is bounded (smoke's own --timeout plus a margin) and killed with its process group.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

SMOKE_TIMEOUT_S = 180  # smoke's --timeout; the child gets a margin for start-up and teardown
MARGIN_S = 60


@dataclass(frozen=True)
class Validation:
    ran: bool
    ok: bool | None  # None: not run here
    summary: str
    command: str

    def to_dict(self) -> dict:
        return {"ran": self.ran, "ok": self.ok, "summary": self.summary, "command": self.command}


def smoke_command(expect_gpus: int | None) -> list[str]:
    cmd = [sys.executable, "-m", "gpudoctor", "smoke", "--json", "--timeout", str(SMOKE_TIMEOUT_S)]
    if expect_gpus == 0:
        cmd += ["--device", "cpu"]
    return cmd


def validate(env_changes: dict[str, str | None], target_here: bool, expect_gpus: int | None) -> Validation:
    if not target_here:
        return Validation(
            False,
            None,
            "not run: the job's nodes are not this machine; validate inside the allocation",
            "srun --ntasks-per-node=1 gpudoctor smoke",
        )
    from gpudoctor.probe.proc import run_bounded

    env = dict(os.environ)
    for name, value in env_changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    cmd = smoke_command(expect_gpus)
    shown = "gpudoctor " + " ".join(cmd[3:])
    try:
        result = run_bounded(cmd, SMOKE_TIMEOUT_S + MARGIN_S, env=env, max_output=8 * 2**20)
    except subprocess.TimeoutExpired:
        return Validation(True, False, f"the smoke run did not end within {SMOKE_TIMEOUT_S + MARGIN_S} s", shown)
    except OSError as e:
        return Validation(True, False, f"the smoke run could not start ({e.strerror or e})", shown)
    try:
        report = json.loads(result.stdout)
    except ValueError:
        last = (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1]
        return Validation(True, False, f"the smoke run gave no report: {last[:300]}", shown)
    verdict = "passed" if result.returncode == 0 and report.get("ok") else "failed"
    problems = [f"{f.get('id')}: {f.get('message')}" for f in report.get("findings", []) if f.get("severity") == "fail"]
    detail = "; ".join(problems[:3]) if problems else _figures(report)
    return Validation(True, verdict == "passed", f"smoke {verdict}" + (f": {detail}" if detail else ""), shown)


def _figures(report: dict) -> str:
    tps = (report.get("throughput") or {}).get("tokens_per_s")
    return f"{tps:,.0f} tokens/s" if isinstance(tps, (int, float)) else ""
