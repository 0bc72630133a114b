"""Runs checks over facts. A check that raises becomes an `error` finding, never a crash."""

from __future__ import annotations

import traceback
from typing import Iterable

from gpudoctor.facts import Facts
from gpudoctor.model import Context, ExitCode, Finding, Outcome, Severity
from gpudoctor.registry import CheckSpec


def run_check(spec: CheckSpec, facts: Facts, ctx: Context) -> list[Finding]:
    missing = [s for s in spec.needs if not facts.has(s)]
    if missing:
        return [_finding(spec, Outcome(Severity.SKIP, f"not probed: {', '.join(missing)}", {"missing_facts": missing}))]
    try:
        result = spec.func(facts, ctx)
        outcomes = result if isinstance(result, list) else [result]
        if not outcomes or not all(isinstance(o, Outcome) for o in outcomes):
            raise TypeError(f"check returned {result!r}, expected Outcome or a list of them")
    except Exception as e:
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return [
            _finding(
                spec,
                Outcome(
                    Severity.ERROR,
                    f"the check itself failed: {type(e).__name__}: {e}",
                    {"exception": type(e).__name__, "where": f"{tb.filename}:{tb.lineno}"},
                ),
            )
        ]
    return [_finding(spec, o) for o in outcomes]


def _finding(spec: CheckSpec, o: Outcome) -> Finding:
    return Finding(
        id=spec.id,
        name=spec.name,
        category=spec.category,
        severity=o.severity,
        title=spec.title,
        message=o.message,
        evidence=o.evidence,
        fix=o.fix,
    )


def run_checks(specs: Iterable[CheckSpec], facts: Facts, ctx: Context) -> list[Finding]:
    specs = list(specs)
    if ctx.running is None:
        from dataclasses import replace

        ctx = replace(ctx, running=frozenset(s.id for s in specs))
    findings: list[Finding] = []
    for spec in specs:
        findings.extend(run_check(spec, facts, ctx))
    return findings


def summarize(findings: list[Finding]) -> dict[str, int]:
    counts = {s.value: 0 for s in Severity}
    for f in findings:
        counts[f.severity.value] += 1
    return counts


def exit_code(findings: list[Finding], strict: bool = False) -> ExitCode:
    """OK: no fail; FAIL: at least one fail (or warn with --strict)."""
    bad = {Severity.FAIL, Severity.WARN} if strict else {Severity.FAIL}
    return ExitCode.FAIL if any(f.severity in bad for f in findings) else ExitCode.OK
