"""Which findings make a verdict, and its exit code: decided once, before anything is rendered.

Before submission (gpudoctor.job.target), the submit host's own machine and node findings are shown apart
and do not count; everywhere else every finding counts. The scope of a check comes from its registry
metadata (`@check(scope=...)`), nowhere else.
"""

from __future__ import annotations

from gpudoctor.job.target import JOB_RESOURCES, JUDGED_FOR, Target
from gpudoctor.model import Finding
from gpudoctor.model import exit_code as verdict_exit


def scope_of(check_id: str) -> str:
    """'job', 'node' or 'machine' (registry.SCOPES) for a finding's check; an unregistered id is 'machine'."""
    from gpudoctor.registry import registered

    spec = registered(check_id)
    return spec.scope if spec is not None else "machine"


def about_this_machine(finding: Finding, target: Target) -> bool:
    """A finding that describes the submit host, not the job (shown apart, outside the verdict)."""
    if target.machine_in_verdict:
        return False
    if finding.evidence.get(JUDGED_FOR) == JOB_RESOURCES:
        return False
    return scope_of(finding.id) != "job"


def split(findings: list[Finding], target: Target) -> tuple[list[Finding], list[Finding]]:
    """(the verdict's findings, this machine's findings outside the verdict)."""
    job: list[Finding] = []
    machine: list[Finding] = []
    for f in findings:
        (machine if about_this_machine(f, target) else job).append(f)
    return job, machine


def exit_code(findings: list[Finding], target: Target, strict: bool = False) -> int:
    return int(verdict_exit(split(findings, target)[0], strict=strict))
