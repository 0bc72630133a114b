"""`gpudoctor health`'s text: one line for the node's verdict, one per problem, what SLURM was told. The text
format's layout for a Result of kind "health" (gpudoctor/health.py builds it: its "health" JSON object)."""

from __future__ import annotations

from gpudoctor.model import Severity
from gpudoctor.report.result import Result
from gpudoctor.sanitize import clean


def render(result: Result) -> str:
    health = result.extra["health"]
    where = clean(result.hostname or "this node")
    timing = f"{result.seconds or 0.0:.2f} s of a {health['budget_seconds']:g} s budget"
    fails = result.verdict  # what makes the node unhealthy (a fail, or a check that could not run)
    warns = [f for f in result.findings if f.severity is Severity.WARN]
    if health["healthy"]:
        lines = [f"gpudoctor health: {where} healthy ({timing}; {len(warns)} warn)"]
    else:
        problems = [f.id for f in fails] + [f"{s} probe over budget" for s in health["overrun"]]
        lines = [f"gpudoctor health: {where} UNHEALTHY: {', '.join(problems)} ({timing})"]
    for f in fails:
        lines.append(f"  {f.severity.value} {f.id} {f.name}: {clean(f.message)}")
    for f in warns:
        lines.append(f"  warn {f.id} {f.name}: {clean(f.message)}")
    action = health.get("slurm")
    if action:
        lines.append(f"  slurm: {action['action']} {clean(action.get('node') or '?')}: {clean(action['detail'])}")
    return "\n".join(lines) + "\n"
