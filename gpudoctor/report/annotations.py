"""Findings on their file and line, as CI and editors read them: `--format github` and `--format concise`.

Only the verdict's findings are written (Result.verdict, gpudoctor.verdict.split: those about the submit
host, outside the verdict, would annotate a pull request with the CI runner's missing GPU). A finding with
no line of its own (Finding.location, job/locate.py) that is about the job a script or config describes goes on line 1
of that file (the batch script first): it is about the file as a whole. Any other finding has no file.
Every text from outside (a file name, a message quoting a script) goes through the one sanitiser
(gpudoctor.sanitize.clean) first: no escape sequence or control byte reaches the CI log or terminal.
"""

from __future__ import annotations

from gpudoctor.model import Context, Finding, Location, Severity
from gpudoctor.report.result import Result
from gpudoctor.sanitize import clean

# GitHub workflow commands per severity (docs.github.com: workflow-commands-for-github-actions).
GITHUB_COMMAND = {Severity.FAIL: "error", Severity.ERROR: "error", Severity.WARN: "warning", Severity.INFO: "notice"}
PROBLEMS = (Severity.FAIL, Severity.ERROR, Severity.WARN)


def where(finding: Finding, ctx: Context) -> Location | None:
    """The finding's location, else line 1 of the job's batch script (or config), else None."""
    if finding.location is not None:
        return finding.location
    path = ctx.sbatch_path or ctx.config_path
    return Location(path, 1) if path else None


def _one_line(text: str) -> str:
    return " ".join(clean(text).split())


def escape_data(text: str) -> str:
    """A workflow command's message, escaped as actions/toolkit's command.ts escapeData does, after the
    sanitiser (gpudoctor.sanitize.clean) has dropped escape sequences and written other control characters
    as \\xNN: CR and LF are left to GitHub's own escaping (%0D, %0A), which the runner turns back into line
    breaks of the annotation."""
    return clean(text, keep="\r").replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A workflow command's property value (command.ts escapeProperty): also ':' and ',', its separators."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_line(finding: Finding, ctx: Context) -> str:
    """`::error file=F,line=N,col=C,endLine=M,endColumn=E,title=GD-ID name::message`."""
    loc = where(finding, ctx)
    props = []
    if loc is not None:
        props.append(("file", loc.file))
        for key, value in (
            ("line", loc.line),
            ("col", loc.column),
            ("endLine", loc.end_line),
            ("endColumn", loc.end_column),
        ):
            if value is not None:
                props.append((key, str(value)))
    props.append(("title", f"{finding.id} {finding.name}"))
    shown = ",".join(f"{k}={escape_property(v)}" for k, v in props)
    return f"::{GITHUB_COMMAND[finding.severity]} {shown}::{escape_data(finding.message)}"


def _by_place(findings: list[Finding], ctx: Context) -> list[Finding]:
    """In the order of the file, as ruff and compilers list them: by file, then line (no line: first)."""

    def place(f: Finding) -> tuple:
        loc = where(f, ctx)
        return (loc.file, loc.line or 0) if loc is not None else ("", 0)

    return sorted(findings, key=place)


def github(findings: list[Finding], ctx: Context) -> str:
    return "".join(github_line(f, ctx) + "\n" for f in _by_place(findings, ctx) if f.severity in GITHUB_COMMAND)


def concise_line(finding: Finding, ctx: Context) -> str:
    """`path:line: GD-ID message` (ruff/flake8 style; `gpudoctor: GD-ID ...` for a finding with no file)."""
    loc = where(finding, ctx)
    head = f"{_one_line(loc.file)}:{loc.line or 1}" if loc is not None else "gpudoctor"
    kind = "" if finding.severity is not Severity.WARN else "warning: "
    return f"{head}: {finding.id} {kind}{_one_line(finding.message)}"


def concise(findings: list[Finding], ctx: Context) -> str:
    return "".join(concise_line(f, ctx) + "\n" for f in _by_place(findings, ctx) if f.severity in PROBLEMS)


def render_github(result: Result) -> str:
    return github(result.verdict, result.ctx)


def render_concise(result: Result) -> str:
    return concise(result.verdict, result.ctx)
