"""The text report, in the spirit of `flutter doctor` and ruff: one screen that says what is wrong, where, and
what to do. A job with up to four problems fits 24 lines of an 80-column terminal (issue 38;
tests/report/test_one_screen.py holds it on every fixture script).

Three levels (`gpudoctor check`, `-q`, `-v`):
- default: the header; one line per problem, what stops the job first (fail, error, warn; then by line):
  `mark file:line: message  ID`, its fix on the next line(s) (the commands to run verbatim; file edits are
  `gpudoctor fix`'s); the notes while the screen has room; one summary line (passed, not applicable, notes
  left out, the machine gpudoctor runs on when it is not where the job runs); the safety legend, once; the
  `gpudoctor fix` command; the verdict. Evidence is -v's.
- `-q`: the problems and their fixes only.
- `-v`: every check by category with its full evidence and every edit of its fix, and the machine section.
Every line is wrapped to the terminal with a hanging indent under its finding (report/screen.py); a shell
command is broken only where the shell reads the same command back.

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
from gpudoctor.report.screen import SCREEN_LINES, Screen, finding_head, terminal_width
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
# {fix}: the view's `gpudoctor fix` command when short (watch: the job's batch script), so the legend names the
# command that writes these fixes, never a bare one that would fix this machine instead; else the `next:` line.
SAFETY_MEANING = {  # the legend, said once under the findings (one line at 80 columns with all three)
    Safety.SAFE: "safe: {fix} writes it",
    Safety.UNSAFE: "unsafe: needs --unsafe-fixes",
    Safety.MANUAL: "manual: you run it",
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


def _rank(f: Finding) -> tuple:
    """What stops the job first: fail, error, warn, note; then by file and line."""
    loc = f.location
    return (-f.severity.rank, (loc.file if loc else ""), (loc.line or 0) if loc else 0, f.id)


class _Renderer:
    def __init__(self, screen: Screen, detail: str, fix_command: str | None = None):
        self.screen = screen
        self.detail = detail  # "default" | "all" | "problems" | "notes"
        self.safeties: set[Safety] = set()  # the kinds of fix shown: the legend says each once
        # the command the legend names: this run's `gpudoctor fix` when it is short, else the `next:` line's
        command = fix_command or "gpudoctor fix --apply"
        self.fix_command = f"`{command}`" if len(command) <= 30 else "`next:`"

    def finding(self, f: Finding, indent: int = 0) -> None:
        style = MARKS[f.severity][1] if f.severity in PROBLEMS else None
        self.screen.add(finding_head(f), indent, indent + 4, style)
        if self.detail == "all":
            for ev in evidence_lines(f.evidence, None):
                self.screen.add(ev, indent + 4, indent + 6, "dim")
        if f.fix is not None:
            self.fix(f.fix, indent + 2, compact=f.severity is Severity.INFO and self.detail == "default")

    def fix(self, fix: Fix, indent: int, compact: bool = False) -> None:
        """`fix (safety): title`, then the commands to run (all the edits too with -v); the meaning of the
        safety is said once, in the legend under the findings. compact (a note's advice in the default view):
        the commands stand for the title, the first on the `fix (...)` line; -v shows the title."""
        self.safeties.add(fix.safety)
        lines = action_lines(fix) if self.detail == "all" else shell_commands(fix)
        if compact and lines:
            self.screen.command(f"fix ({fix.safety.value}): {lines[0]}", indent)
            lines = lines[1:]
        else:
            self.screen.add(f"fix ({fix.safety.value}): {fix.title}", indent, indent + 4)
        for line in lines:
            self.screen.command(line, indent + 2)

    def category(self, category: str, items: list[Finding]) -> None:
        mark, style = MARKS[worst(items)]
        self.screen.add(f"[{mark}] {category:<12} {_counts(items, self.detail)}", 0, 17, style)
        for f in items:
            self.finding(f, 4)

    def legend(self) -> str | None:
        shown = [
            SAFETY_MEANING[s].format(fix=self.fix_command)
            for s in (Safety.SAFE, Safety.UNSAFE, Safety.MANUAL)
            if s in self.safeties
        ]
        return " · ".join(shown) if shown else None


def next_steps(findings: list[Finding], fix_command: str | None) -> list[str]:
    """The one `gpudoctor fix` command that writes the problems' file edits (with --unsafe-fixes when one of
    them is unsafe); the commands a person runs are printed under their finding."""
    edits_unsafe = None
    for f in findings:
        if f.severity not in PROBLEMS or f.fix is None:
            continue
        if any(ActionKind(a.kind) in FILE_EDITS for a in f.fix.actions):
            edits_unsafe = bool(edits_unsafe) or f.fix.safety is Safety.UNSAFE
    if edits_unsafe is None:
        return []
    cmd = fix_command or "gpudoctor fix --apply"
    if edits_unsafe and "--unsafe-fixes" not in cmd:
        cmd += " --unsafe-fixes"
    return [cmd]


def _machine_line(findings: list[Finding], target) -> str | None:
    """The machine gpudoctor runs on, when it is not where the job runs: a few words on the summary line,
    and only when it has something to say (its findings are with -v, outside the verdict)."""
    c = Counter(f.severity for f in findings if f.severity in PROBLEMS)
    if not c:
        return None
    host = getattr(target, "hostname", None) or "this machine"
    parts = ", ".join(f"{c[s]} {s.value}" for s in (Severity.FAIL, Severity.ERROR, Severity.WARN) if c[s])
    return f"{host}, not the job's node: {parts}, not counted"


def _machine_section(r: _Renderer, findings: list[Finding], target) -> None:
    """-v: the machine gpudoctor runs on, every check, apart from the job's."""
    host = getattr(target, "hostname", "this machine")
    r.screen.blank()
    r.screen.add(f"this machine: {host} (not where the job runs; not in the verdict)", 0, 2, "bold")
    for category, items in _by_category(findings):
        r.category(category, items)
    r.screen.add(
        "run `srun gpudoctor check` inside the job (or give --node-snapshot F recorded on a compute node) "
        "to judge the node itself",
        4,
        6,
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


def _summary(verdict: list[Finding], shown: set[int]) -> str | None:
    """One line for what the default report does not detail: passed, not applicable, notes left out."""
    rest = [f for f in verdict if id(f) not in shown]
    c = Counter(f.severity for f in rest)
    parts = []
    if c[Severity.PASS]:
        parts.append(f"{c[Severity.PASS]} passed")
    if c[Severity.SKIP]:
        parts.append(f"{c[Severity.SKIP]} not applicable")
    if c[Severity.INFO]:
        parts.append(f"{c[Severity.INFO]} note{'s' if c[Severity.INFO] > 1 else ''}")
    return " · ".join(parts) if parts else None


def _check_text(result: Result) -> str:
    """The check layout. Default: header, one line per problem (`mark file:line: message  ID`) with its fix
    on the next line(s), the notes that bring something to do while the screen allows, one summary line,
    the safety legend once, the `gpudoctor fix` command, the verdict; every line wrapped to the terminal
    with a hanging indent. -q: the problems and their fixes only. -v: every check by category, with its
    evidence, the machine gpudoctor runs on, and the fix's every edit."""
    view = result.view
    detail = result.detail
    if view.notes and detail == "default":
        detail = "notes"
    prefix = f"[{clean(view.label)}] " if view.label else ""
    width = max(40, (result.width or terminal_width()) - len(prefix))
    screen = Screen(width)
    r = _Renderer(screen, detail, view.fix_command)
    target = result.target if result.target is not None else view.target
    verdict, machine = result.verdict, result.outside
    quiet = detail == "problems"
    if not quiet:
        if view.header:
            screen.add(view.header, 0, 2, "bold")
        for line in [*view.lines, *(view.more_lines if detail == "all" else [])]:
            screen.add(line, 2, 4)
    shown: set[int] = set()
    if detail == "all":
        for category, items in _by_category(verdict):
            r.category(category, items)
        if machine:
            _machine_section(r, machine, target)
    else:
        for f in sorted((f for f in verdict if f.severity in PROBLEMS), key=_rank):
            r.finding(f)
            shown.add(id(f))
        # the notes, those with something to do first, while the screen has room (the rest: counted, -v)
        notes = sorted((f for f in verdict if f.severity is Severity.INFO), key=lambda f: (f.fix is None, _rank(f)))
        tail = 6  # blank, summary, machine, legend, next step, verdict (their most)
        for f in notes if not quiet else []:
            before, safeties = len(screen.rows), set(r.safeties)
            r.finding(f)
            if detail != "notes" and len(screen.rows) + tail > SCREEN_LINES:
                del screen.rows[before:]  # no room: the note is counted in the summary (-v)
                r.safeties = safeties
                continue
            shown.add(id(f))
    steps = next_steps(verdict, view.fix_command)
    if not quiet:
        screen.blank()
        summary = _summary(verdict, shown) if detail != "all" else None
        machine_said = _machine_line(machine, target) if machine and detail != "all" else None
        parts = [p for p in (summary, machine_said) if p]
        if parts:
            screen.add(" · ".join(parts) + " (-v)", 0, 2, "dim")
    legend = r.legend()
    if legend and not quiet:
        screen.add(legend, 0, 2, "dim")
    for i, step in enumerate(steps):
        screen.command(("next: " if i == 0 else "      ") + step, 0)
    if not quiet:
        text, style = _verdict(verdict, target, view.subject, view.fails_mean, view.warns_mean)
        screen.add(text, 0, 2, style)
    out = _Out(result.color)
    for row, row_style in screen.rows:
        out.text(0, row, row_style)
    body = out.buf.getvalue()
    if prefix:
        body = "".join(prefix + line for line in body.splitlines(keepends=True))
    return body
