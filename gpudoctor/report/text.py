"""The text report, in the spirit of `flutter doctor`: one screen that says what is judged, one line per
category with its worst verdict, details only where something is wrong, and the exact commands to run.

Three levels (`gpudoctor check`, `-q`, `-v`):
- default: one line per category; warn/fail/error findings with their message, a little evidence and the fix;
  passes and skips folded into counts (the reason a category does not apply said once); the machine
  gpudoctor runs on in a short section of its own when it is not the target (gpudoctor.job.target);
  a closing "next steps" list of copy-pasteable commands; the verdict.
- `-q`: only the problems, the next steps and the verdict.
- `-v`: every finding with its full evidence.

Everything printed that came from outside (hostnames, GPU names, messages quoting env values) goes through
`clean()`: terminal escape sequences are removed and other control characters shown as \\xNN, so a replayed
snapshot cannot move the cursor or retitle the terminal. Colour only on a terminal, never with NO_COLOR.
"""

from __future__ import annotations

import io
import json
import os
import sys
from collections import Counter

from gpudoctor.edit import FILE_EDITS  # the kinds that edit a file (the kinds table)
from gpudoctor.model import CATEGORIES, ActionKind, Finding, Fix, Safety, Severity, worst
from gpudoctor.report.result import Result, View
from gpudoctor.sanitize import clean

MARKS = {
    Severity.PASS: ("✓", "green"),
    Severity.INFO: ("i", "cyan"),
    Severity.WARN: ("!", "yellow"),
    Severity.FAIL: ("✗", "red"),
    Severity.SKIP: ("-", "dim"),
    Severity.ERROR: ("E", "magenta"),
}
ORDER = {c: i for i, c in enumerate(CATEGORIES)}
PROBLEMS = (Severity.FAIL, Severity.ERROR, Severity.WARN)
# {fix}: the view's `gpudoctor fix` line with this run's inputs (watch: the job's batch script), so the legend
# names the command that writes these fixes, never a bare one that would fix this machine instead.
SAFETY_MEANING = {
    Safety.SAFE: "safe: reversible, changes only the job's environment or a file gpudoctor backs up; `{fix}` writes it",
    Safety.UNSAFE: "unsafe: changes what the job does (GPUs, tasks, batch size, workers); "
    "written only with `{fix} --unsafe-fixes`",
    Safety.MANUAL: "manual: a command for you to run; gpudoctor never runs it",
}
DEFAULT_EVIDENCE_LINES = 2
VALUE_LIMIT = 120


def human(value) -> str:
    """A value as a person reads it: rounded numbers, no None/null, short lists."""
    if value is None:
        return "not known"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return "not a number"
        return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, (list, tuple)):
        return ", ".join(human(v) for v in value) if value else "none"
    if isinstance(value, dict) and "value" in value and set(value) <= {"value", "path", "source", "line"}:
        where = value.get("path") or value.get("source")
        return f"{human(value['value'])}" + (f" ({where})" if where else "")
    if isinstance(value, dict):
        return json.dumps({k: v for k, v in value.items() if v is not None}, default=str)
    return str(value)


_SHARE_KEYS = ("mfu", "fraction", "share", "utilization", "utilisation")


def _value(key: str, value) -> str:
    """An evidence value for people: shares of 1 as percentages (mfu 0.059 -> 5.9 %)."""
    if isinstance(value, float) and 0 <= value <= 1.5 and any(k in key.lower() for k in _SHARE_KEYS):
        return f"{value * 100:.1f} %"
    return human(value)


def _short(text: str, limit: int = VALUE_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def evidence_lines(
    evidence: dict, limit: int | None = DEFAULT_EVIDENCE_LINES, message: str = "", seen: set | None = None
) -> list[str]:
    """'key: value' lines; None values left out (they say nothing), long values cut unless limit is None.
    With a limit, values the message already quotes come last, and items in `seen` (shown for an earlier
    finding) are left out: the lines shown add to what the report already says."""
    items = [(k, v) for k, v in evidence.items() if v is not None and k != "judged_for"]
    if limit is not None and seen is not None:
        items = [(k, v) for k, v in items if (k, human(v)) not in seen]
    if limit is not None and message:
        items.sort(key=lambda kv: human(kv[1]) in message or kv[0] in ("#SBATCH --job-name",))
    shown = items if limit is None else items[:limit]
    if seen is not None:
        seen.update((k, human(v)) for k, v in shown)
    lines = [f"{k}: {_value(k, v) if limit is None else _short(_value(k, v))}" for k, v in shown]
    if limit is not None and len(items) > limit:
        lines.append(f"... {len(items) - limit} more (-v)")
    return lines


def export_line(name: str, value) -> str:
    """`export NAME=value` as the shell must read it (gpudoctor.shellquote: the value's bytes exactly, a
    Reference kept live); a name no shell can set is a comment saying so, never an assignment."""
    from gpudoctor import edit  # one definition, with the renderer of fix actions

    return edit.export_line(name, value)


def unset_line(name: str) -> str:
    from gpudoctor import edit

    return edit.unset_line(name)


def action_lines(fix: Fix) -> list[str]:
    """Each action of a fix as one line: a shell command where it is one (verbatim, copy-pasteable),
    else the edit it makes."""
    from gpudoctor.edit import Edit  # the one renderer of fix actions (gpudoctor/edit.py)

    return [Edit.of(a).advice() for a in fix.actions]


def shell_commands(fix: Fix) -> list[str]:
    """The commands a person runs for this fix (not the file edits `gpudoctor fix --apply` makes)."""
    pairs = zip(fix.actions, action_lines(fix), strict=True)
    return [line for a, line in pairs if ActionKind(a.kind) not in FILE_EDITS]


def wants_color(file) -> bool:
    """Colour only on a terminal, never with NO_COLOR or TERM=dumb."""
    if os.environ.get("NO_COLOR") is not None or os.environ.get("TERM") == "dumb":
        return False
    try:
        return file.isatty()
    except (AttributeError, ValueError):
        return False


class _Out:
    def __init__(self, color: bool):
        from rich.console import Console

        self.buf = io.StringIO()
        self.console = Console(
            file=self.buf,
            force_terminal=color,
            no_color=not color,
            color_system="standard" if color else None,
            highlight=False,
            soft_wrap=True,
            emoji=False,
            markup=True,
        )
        self.count = 0

    def line(self, *parts: tuple[str, str | None]) -> None:
        """One line from (text, style) parts; text is never read as markup, so commands print verbatim."""
        from rich.text import Text

        line = Text()
        for text, style in parts:
            line.append(clean(text), style=style or "")
        self.console.print(line)

    def text(self, indent: int, text: str, style: str | None = None) -> None:
        self.line((" " * indent + text, style))


def _advice(f: Finding) -> bool:
    """A finding the default report details: a problem, or a note that comes with something to do."""
    return f.severity in PROBLEMS or (f.fix is not None and bool(f.fix.actions))


def _by_category(findings: list[Finding]) -> list[tuple[str, list[Finding]]]:
    groups: dict[str, list[Finding]] = {}
    for f in sorted(findings, key=lambda f: (ORDER.get(f.category, 99), f.id)):
        groups.setdefault(f.category, []).append(f)
    return list(groups.items())


def _skip_reason(skips: list[Finding]) -> str:
    reasons = Counter(f.message for f in skips)
    reason, n = reasons.most_common(1)[0]
    return reason if n == len(skips) else f"{reason}; {len(reasons) - 1} other reason(s) (-v)"


def _counts(items: list[Finding], detail: str) -> str:
    c = Counter(f.severity for f in items)
    parts = [
        f"{c[s]} {word}"
        for s, word in ((Severity.FAIL, "fail"), (Severity.ERROR, "error"), (Severity.WARN, "warn"))
        if c[s]
    ]
    if c[Severity.INFO]:
        hint = "" if detail in ("all", "notes") else " (-v)"
        parts.append(f"{c[Severity.INFO]} note{'s' if c[Severity.INFO] > 1 else ''}{hint}")
    if c[Severity.PASS]:
        parts.append(f"{c[Severity.PASS]} passed")
    skips = [f for f in items if f.severity is Severity.SKIP]
    if skips:
        parts.append(f"{len(skips)} not applicable" + ("" if detail == "all" else f": {_skip_reason(skips)}"))
    return " · ".join(parts)


class _Renderer:
    def __init__(self, out: _Out, detail: str, fix_command: str | None = None):
        self.out = out
        self.detail = detail  # "default" | "all" | "problems"
        self.fix_command = fix_command or "gpudoctor fix --apply"
        self.explained: set[Safety] = set()
        self.seen: set[tuple[str, str]] = set()  # evidence already shown (the same #SBATCH lines under every finding)

    def finding(self, f: Finding, indent: int = 4) -> None:
        mark, style = MARKS[f.severity]
        where = f"  {f.location.file}:{f.location.line}" if f.location and f.location.line else ""
        self.out.text(indent, f"{mark} {f.title}  {f.id}{where}", style if f.severity in PROBLEMS else None)
        self.out.text(indent + 4, f.message)
        limit = None if self.detail == "all" else DEFAULT_EVIDENCE_LINES
        if f.severity in PROBLEMS or self.detail == "all":  # a note with advice: its message and fix suffice
            for ev in evidence_lines(f.evidence, limit, f.message, self.seen):
                self.out.text(indent + 4, ev, "dim")
        if f.fix is not None:
            self.fix(f.fix, indent + 4, compact=f.severity is Severity.INFO and self.detail == "default")

    def fix(self, fix: Fix, indent: int, compact: bool = False) -> None:
        """compact (a note's advice in the default view, which must keep a healthy job on one screen): the
        commands stand for the fix's title, the first on the `fix (...)` line; -v shows the title."""
        label = fix.safety.value
        if fix.safety not in self.explained:
            label = SAFETY_MEANING[fix.safety].format(fix=self.fix_command)
            self.explained.add(fix.safety)
        lines = action_lines(fix)
        if compact and lines:
            self.out.text(indent, f"fix ({label}): {lines[0]}")
            lines = lines[1:]
        else:
            self.out.text(indent, f"fix ({label}): {fix.title}")
        for line in lines:
            self.out.text(indent + 2, line)

    def category(self, category: str, items: list[Finding]) -> None:
        mark, style = MARKS[worst(items)]
        self.out.line(
            (f"[{mark}]", style), (" ", None), (f"{category:<12}", "bold"), (" " + _counts(items, self.detail), "dim")
        )
        for f in items:
            if _advice(f) or self.detail == "all" or (self.detail == "notes" and f.severity is Severity.INFO):
                self.finding(f)


def next_steps(findings: list[Finding], fix_command: str | None) -> list[str]:
    """The commands that fix the problems, in order (fail first), each once; file edits as one `gpudoctor fix` line."""
    steps: list[str] = []
    edits_unsafe = None
    for f in sorted(findings, key=lambda f: -f.severity.rank):
        if f.severity not in PROBLEMS or f.fix is None:
            continue
        for cmd in shell_commands(f.fix):
            if cmd not in steps:
                steps.append(cmd)
        if any(ActionKind(a.kind) in FILE_EDITS for a in f.fix.actions):
            edits_unsafe = bool(edits_unsafe) or f.fix.safety is Safety.UNSAFE
    if edits_unsafe is not None:
        cmd = fix_command or "gpudoctor fix --apply"
        if edits_unsafe and "--unsafe-fixes" not in cmd:
            cmd += " --unsafe-fixes"
        steps.insert(0, f"{cmd}   # writes the file edits above (backup kept); run without --apply to see the diff")
    return steps


def _machine_section(r: _Renderer, out: _Out, findings: list[Finding], target) -> None:
    host = getattr(target, "hostname", "this machine")
    out.line()
    out.text(0, f"this machine: {host} (not where the job runs; not in the verdict)", "bold")
    groups = _by_category(findings)
    quiet = []
    for category, items in groups:
        if r.detail == "all":
            r.category(category, items)
            continue
        advice = [f for f in items if _advice(f)]
        if not advice:
            quiet.append(category)
            continue
        first = max(advice, key=lambda f: f.severity.rank)
        mark, style = MARKS[first.severity]
        more = len(advice) - 1
        out.text(
            4,
            f"{mark} {category}: {_short(first.message, 140)}" + (f" (+{more} more, -v)" if more > 0 else ""),
            style if first.severity in PROBLEMS else None,
        )
        for f in advice:
            if f.fix is not None:
                for cmd in action_lines(f.fix):
                    out.text(8, cmd)
    if quiet:
        out.text(4, f"{', '.join(quiet)}: fine or not applicable here", "dim")
    out.text(
        4,
        "run `srun gpudoctor check` inside the job (or give --node-snapshot F recorded on a compute node) "
        "to judge the node itself",
        "dim",
    )


def _verdict(
    findings: list[Finding],
    target,
    subject: str | None = None,
    fails_mean: str = View.fails_mean,
    warns_mean: str = View.warns_mean,
) -> tuple[str, str]:
    c = Counter(f.severity for f in findings)
    what = subject or ("the job" if getattr(target, "kind", None) == "job" else "this machine")
    parts = [f"{c[s]} {s.value}" for s in (Severity.FAIL, Severity.ERROR, Severity.WARN) if c[s]]
    if c[Severity.FAIL]:
        return f"✗ {what}: {', '.join(parts)} — {fails_mean}" + (" (exit 1)" if target else ""), "bold red"
    if c[Severity.ERROR]:  # a check that could not run judged nothing: never a pass (model.exit_code)
        failed = sorted({f.id for f in findings if f.severity is Severity.ERROR})
        shown = ", ".join(failed[:5]) + (f" and {len(failed) - 5} more" if len(failed) > 5 else "")
        return f"✗ {what}: {', '.join(parts)} — could not run: {shown}" + (" (exit 1)" if target else ""), "bold red"
    if c[Severity.WARN]:
        return f"! {what}: {', '.join(parts)} — {warns_mean}", "bold yellow"
    if not findings:
        return "no checks ran", "dim"
    return f"✓ {what}: no problems found ({c[Severity.PASS]} passed)", "bold green"


def render(result: Result) -> str:
    """The text format (report/emit.py): check's layout, or the job's (compare, check --job), or health's."""
    if result.kind == "job":
        from gpudoctor.report.jobtext import render as job_text

        return job_text(result)
    if result.kind == "health":
        from gpudoctor.report.healthtext import render as health_text

        return health_text(result)
    return _check_text(result)


def write(findings: list[Finding], header: str = "", verbose=False, file=None, view: View | None = None) -> None:
    """A report of findings that all count (smoke): verbose False/"default", True/"all" or "problems" (-q)."""
    from gpudoctor.model import exit_code

    file = file or sys.stdout
    view = view or View(header=header, subject="the run", notes=True)  # without a view: the smoke report
    detail = {True: "all", False: "default", None: "default"}.get(verbose, verbose)
    code = int(exit_code(findings))
    file.write(_check_text(Result(findings, findings, code, view=view, detail=detail, color=wants_color(file))))
    file.flush()


def _check_text(result: Result) -> str:
    view = result.view
    detail = result.detail
    if view.notes and detail == "default":
        detail = "notes"
    out = _Out(result.color)
    r = _Renderer(out, detail, view.fix_command)
    target = result.target if result.target is not None else view.target
    verdict, machine = result.verdict, result.outside
    if view.header:
        out.text(0, view.header, "bold")
    for line in view.lines:
        out.text(2, line)
    groups = _by_category(verdict)
    if detail == "problems":
        for _category, items in groups:
            for f in items:
                if f.severity in PROBLEMS:
                    r.finding(f, indent=0)
    else:
        for category, items in groups:
            r.category(category, items)
        if machine:
            _machine_section(r, out, machine, target)
    steps = next_steps(verdict, view.fix_command)
    if steps:
        out.line()
        out.text(0, "next steps", "bold")
        for i, step in enumerate(steps, 1):
            out.text(2, f"{i}. {step}")
    if detail != "problems" or any(f.severity in PROBLEMS for f in verdict):
        out.line()
    text, style = _verdict(verdict, target, view.subject, view.fails_mean, view.warns_mean)
    out.text(0, text, style)
    body = out.buf.getvalue()
    if view.label:
        prefix = f"[{clean(view.label)}] "
        body = "".join(prefix + line for line in body.splitlines(keepends=True))
    return body
