"""What a command judged and everything its outputs show, in one object built before any rendering.

Each format is a `render(result) -> str` (gpudoctor.report.emit.FORMATS); none decides anything: which
findings count and the exit code (gpudoctor.verdict), the rank label and the host (from the facts, or a
replayed snapshot's) are all set here by the command.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpudoctor.job.target import Target
from gpudoctor.model import Context, Finding


@dataclass
class View:
    """The text report's header facts besides the findings (all optional: a smoke report passes none)."""

    header: str = ""
    lines: list[str] = field(default_factory=list)  # under the header: what is judged, where the node facts come from
    more_lines: list[str] = field(default_factory=list)  # under the header with -v only (what is not known)
    target: Target | None = None
    fix_command: str | None = None  # `gpudoctor fix ...` with this run's inputs, for file edits
    label: str | None = None  # "rank 3/8 on gpu07": prefixed to every line under a launcher
    subject: str | None = None  # what the verdict line names ("the run"); default: the job or this machine
    notes: bool = False  # show every note in full (a command without -v, such as smoke)
    fails_mean: str = "it will not run as intended"  # what a fail says of the subject (watch: of a running job)
    warns_mean: str = "it runs, with the problems above"  # what a warn says (diagnose: of a job that failed)


@dataclass(frozen=True)
class Result:
    findings: list[Finding]
    verdict: list[Finding]  # the findings the exit code counts
    exit_code: int
    outside: list[Finding] = field(default_factory=list)  # the submit host's own, shown apart, not counted
    strict: bool = False  # a warn fails too (JUnit)
    kind: str = "check"  # the text report's layout: "check", "job" (compare, check --job) or "health"
    target: Target | None = None
    ctx: Context = field(default_factory=Context)  # where a finding without a line of its own is annotated
    view: View = field(default_factory=View)  # text: header, rank label, next steps
    detail: str = "default"  # text: "default", "all" (-v), "problems" (-q), "notes"
    source: dict[str, Any] | None = None  # JSON: "source"
    extra: dict[str, Any] = field(default_factory=dict)  # JSON: the command's own top-level objects
    job: dict[str, Any] | None = None  # compare and check --job: the job's view across its ranks
    hostname: str | None = None  # Prometheus: the host label
    judged_at: float = 0.0  # Prometheus: the samples' time
    seconds: float | None = None  # health's text: how long the run took
    metric_prefix: str = "gpudoctor"  # Prometheus: gpudoctor_watch for a watch
    color: bool = False  # text: set by emit for a terminal
    width: int | None = None  # text: the terminal's columns (None: $COLUMNS, else 80)
