"""`gpudoctor fix`: plan the fixes, show them (diff, environment, manual steps), and with --apply write them.

Exit codes (as `ruff check --fix`): with --apply, 0 only when no fail is left in the verdict after the fixes
were written, 1 when one is (the text's "Remaining:" names it); without --apply, 0 once the plan is shown, 1
with --diff when changes are pending; 1 when --validate's smoke run fails; 2 bad input or a file that must
not be written (one line, every file left byte-identical); 3 internal error.
"""

from __future__ import annotations

import argparse
import sys

from gpudoctor.model import BLOCKING, ExitCode, Safety

# The redaction, sanitiser, difflib and shellquote are imported by the functions that write the plan:
# `gpudoctor fix --help` (and the parser of every `gpudoctor fix`) needs only the options.

SCHEMA = "gpudoctor.fix/1"
# check's options that are about the report, not the inputs; fix has its own outputs.
HELP = "show the fixes as diffs; --apply writes the safe ones (backup kept)"
_REPORT_ONLY = {"json", "format", "junit", "prometheus", "verbose", "quiet", "strict", "help", "job", "timeout"}


def add_arguments(p: argparse.ArgumentParser, check_parser: argparse.ArgumentParser) -> None:
    """fix takes check's inputs (shared argparse actions, so a new check input is a fix input too)."""
    for action in check_parser._actions:
        if action.dest not in _REPORT_ONLY:
            p._add_action(action)
    p.add_argument("--apply", action="store_true", help="write the safe fixes (a backup NAME.gpudoctor.bak is kept)")
    p.add_argument(
        "--unsafe-fixes",
        action="store_true",
        help="also fixes that change what the job does (GPUs, tasks, batch size, workers, launch)",
    )
    p.add_argument("--diff", action="store_true", help="print the plan; exit 1 when changes are pending (CI gate)")
    p.add_argument("--json", action="store_true", help=f"print the plan and outcome as {SCHEMA} (docs/fix.schema.json)")
    p.add_argument("--shell", action="store_true", help='print export/unset lines for eval "$(gpudoctor fix --shell)"')
    p.add_argument("--env-file", metavar="FILE", help="write the environment changes to FILE to source")
    p.add_argument(
        "--validate",
        action="store_true",
        help="then run `gpudoctor smoke` with the fixed environment where the job runs here (exit 1 if it fails); "
        "before submission, print the command to run inside the allocation",
    )


def run(args) -> int:
    from gpudoctor.fixes import apply as writer
    from gpudoctor.fixes import envfile
    from gpudoctor.fixes.plan import InputError, make_plan
    from gpudoctor.inputs import judged_inputs
    from gpudoctor.redact import redact_strings
    from gpudoctor.runner import run_checks as run_specs
    from gpudoctor.sanitize import clean, json_text
    from gpudoctor.verdict import split

    if sum(bool(x) for x in (args.json, args.shell, args.diff)) > 1:
        raise _usage("choose one of --json, --shell, --diff")
    if getattr(args, "sbatch", None) and _dos_line_breaks(args):
        return ExitCode.FAIL
    # The facts, context and checks exactly as `gpudoctor check` gets them; fix keeps only what check's
    # verdict is about (before submission, this login host's driver or torch is not the job's to fix).
    facts, ctx, specs, target = judged_inputs(args, progress=False)

    def run_checks(f, c):
        return split(run_specs(specs, f, c), target)[0]

    allowed = frozenset({Safety.SAFE, Safety.UNSAFE} if args.unsafe_fixes else {Safety.SAFE})
    try:
        plan = make_plan(run_checks, facts, ctx, allowed)
    except InputError as e:
        raise _usage(str(e)) from None
    planned = [
        writer.Planned(p, plan.original.texts[p].encode("utf-8", errors="surrogateescape"), plan.final.texts[p])
        for p in plan.changed_files
    ]
    backups: dict[str, str] = {}
    env_file_backup = None
    try:
        if args.apply and planned:
            backups = writer.write_all(planned)
        if args.env_file:
            env_file_backup = writer.write_env_file(args.env_file, envfile.render(plan.env_changes))
    except writer.WriteRefused as e:
        raise _usage(str(e)) from None
    except OSError as e:
        raise _usage(f"cannot write: {e.strerror or e} ({getattr(e, 'filename', '')})") from None
    validation = None
    if args.validate:
        from gpudoctor.fixes.validate import validate

        validation = validate(plan.env_changes, target.kind == "machine", ctx.expect_gpus)
    if args.shell:
        text = "\n".join(envfile.lines(plan.env_changes))
        sys.stdout.write(text + ("\n" if text else ""))
        for note in envfile.left_out(plan.env_changes):
            print(f"gpudoctor fix: {note}", file=sys.stderr)
        _summary_line(plan, args, backups, sys.stderr, first=True)
    elif args.json:
        report = redact_strings(to_json(plan, args, backups, env_file_backup, validation))
        sys.stdout.write(json_text(report, indent=2) + "\n")
    else:
        render_text(plan, args, backups, env_file_backup, sys.stdout)
        if validation:
            sys.stdout.write(clean(f"\nValidation ({validation.command}): {validation.summary}\n"))
    if validation and validation.ran and not validation.ok:
        return ExitCode.FAIL
    if args.diff and plan.pending and not args.apply:
        return ExitCode.FAIL
    if args.apply and any(f.severity in BLOCKING for f in plan.after):
        return ExitCode.FAIL  # as `ruff check --fix`: 0 only when nothing the verdict counts is left
    return ExitCode.OK


def _dos_line_breaks(args) -> bool:
    """sbatch refuses a script with DOS line breaks ("Batch script contains DOS line breaks (\\r\\n) instead of
    expected UNIX line breaks (\\n)", SLURM 22.05 on the test cluster), and so does check: the one whole-file
    problem fix mends before judging. With --apply the script is converted (backup kept, atomic) and then
    judged and fixed as usual; without, the plan says so and the run ends (True: exit 1, the script cannot be
    submitted as it is). False when the script has no \\r\\n (or cannot be read: the usual input error follows)."""
    from gpudoctor import shellquote
    from gpudoctor.fileio import FileIOError, read_input_bytes
    from gpudoctor.fixes import apply as writer
    from gpudoctor.readers.sbatch.reader import MAX_SCRIPT_BYTES
    from gpudoctor.sanitize import clean

    try:
        data = read_input_bytes(args.sbatch, "--sbatch", MAX_SCRIPT_BYTES)
    except FileIOError:
        return False
    count = data.count(b"\r\n")
    if not count:
        return False
    if not args.apply:
        print(
            clean(f"{args.sbatch}: {count} DOS line break(s) (\\r\\n), which sbatch refuses; ")
            + f"`{shellquote.command(['gpudoctor', 'fix', '--sbatch', args.sbatch, '--apply'])}` converts them to "
            "UNIX ones (a backup kept), then judges and fixes the rest",
            file=sys.stderr,
        )
        return True
    fixed = data.replace(b"\r\n", b"\n").decode("utf-8", errors="surrogateescape")
    try:
        backups = writer.write_all([writer.Planned(args.sbatch, data, fixed)])
    except writer.WriteRefused as e:
        raise _usage(str(e)) from None
    print(
        clean(
            f"{args.sbatch}: converted {count} DOS line break(s) to UNIX ones (sbatch refuses \\r\\n); "
            f"original kept as {backups.get(args.sbatch)}"
        ),
        file=sys.stderr,
    )
    return False


def _usage(message: str) -> Exception:
    from gpudoctor.inputs import UsageError

    return UsageError(message)


def diff(plan, path: str) -> str:
    import difflib

    from gpudoctor.redact import redact_text

    a = plan.original.texts[path].splitlines(keepends=True)
    b = plan.final.texts[path].splitlines(keepends=True)
    out = "".join(difflib.unified_diff(a, b, fromfile=f"a/{path}", tofile=f"b/{path}"))
    out = out if out.endswith("\n") or not out else out + "\n\\ No newline at end of file\n"
    return redact_text(out)  # the diff quotes the user's file: shown as check shows it, written unredacted


def _status(plan) -> dict:
    """Per check id that was not clean before: its severity before and after, and what decided it."""

    def worst(findings, cid):
        sev = [f for f in findings if f.id == cid]
        return max(sev, key=lambda f: f.severity.rank) if sev else None

    ids = []
    for f in plan.before:
        if f.severity.value in ("info", "warn", "fail", "error") and f.id not in ids:
            ids.append(f.id)
    for f in plan.after:
        if f.severity.value in ("info", "warn", "fail", "error") and f.id not in ids:
            ids.append(f.id)
    fixed, remaining = [], []
    for cid in ids:
        b, a = worst(plan.before, cid), worst(plan.after, cid)
        kept = [d for d in plan.decisions if d.kept and d.finding.id == cid]
        if a is None or a.severity.value in ("pass", "skip") or (b and a.severity.rank < b.severity.rank):
            fixed.append(
                {
                    "id": cid,
                    "before": b.severity.value if b else "pass",
                    "after": a.severity.value if a else "pass",
                    "by": [d.fix.title for d in kept] or ["another fix in this plan"],
                }
            )
        if a is not None and a.severity.value in ("info", "warn", "fail", "error"):
            remaining.append(
                {"id": cid, "severity": a.severity.value, "message": a.message, "reason": _why_left(plan, a)}
            )
    return {"fixed": fixed, "remaining": remaining}


def _why_left(plan, finding) -> str:
    refused = [d for d in plan.decisions if not d.kept and d.finding.id == finding.id]
    if refused:
        return "fix refused: " + refused[-1].reason
    if any(f.id == finding.id for f, _ in plan.unsafe_available):
        return "its fix is unsafe (changes what the job does): add --unsafe-fixes"
    if any(f.id == finding.id for f, _ in plan.manual):
        return "a manual step (listed under Manual steps)"
    if finding.fix is None:
        return "no automatic fix"
    return "its fix was not tried (another fix changed the finding)"


def to_json(plan, args, backups: dict, env_file_backup: str | None, validation=None) -> dict:
    from gpudoctor import __version__
    from gpudoctor.fixes import envfile

    status = _status(plan)
    return {
        "schema": SCHEMA,
        "tool": {"name": "gpudoctor", "version": __version__},
        "mode": "apply" if args.apply else "plan",
        "unsafe_fixes": bool(args.unsafe_fixes),
        "pending": plan.pending and not args.apply,
        "files": [
            {"path": p, "diff": diff(plan, p), "written": p in backups, "backup": backups.get(p)}
            for p in plan.changed_files
        ],
        "env": [
            {"name": k, "value": v, "action": "unset" if v is None else "set"}
            for k, v in sorted(plan.env_changes.items())
        ],
        "env_file": {"path": args.env_file, "backup": env_file_backup} if args.env_file else None,
        "shell": envfile.lines(plan.env_changes),
        "fixes": [
            {
                "id": d.finding.id,
                "title": d.fix.title,
                "safety": d.fix.safety.value,
                "kept": d.kept,
                "reason": d.reason,
                "edits": [e.describe() for e in d.edits],
            }
            for d in plan.decisions
        ],
        "unsafe_available": [{"id": f.id, "title": fix.title} for f, fix in plan.unsafe_available],
        "manual": [
            {"id": f.id, "title": fix.title, "commands": [a.target for a in fix.actions]} for f, fix in plan.manual
        ],
        "fixed": status["fixed"],
        "remaining": status["remaining"],
        "summary": {
            "files_changed": len(plan.changed_files),
            "env_changes": len(plan.env_changes),
            "fixed": len(status["fixed"]),
            "remaining": len(status["remaining"]),
        },
        "validation": validation.to_dict() if validation else None,
    }


def render_text(plan, args, backups: dict, env_file_backup: str | None, out) -> None:
    from gpudoctor.fixes import envfile
    from gpudoctor.redact import redact_text
    from gpudoctor.sanitize import clean

    written = [False]

    def w(text: str) -> None:  # the plan quotes the user's files and environment: redacted, and no escape
        if not written[0]:  # sequence reaches the terminal raw; the first section starts the output, no blank
            text = text.removeprefix("\n")
        written[0] = written[0] or bool(text)
        out.write(clean(redact_text(text)))

    for p in plan.changed_files:
        w(diff(plan, p))
        if p in backups:
            w(f"wrote {p} (original kept as {backups[p]})\n")
    if plan.env_changes:
        where = f"written to {args.env_file}" if args.env_file else 'apply with: eval "$(gpudoctor fix --shell ...)"'
        w(f"\nEnvironment changes ({where}):\n")
        for line in envfile.lines(plan.env_changes):
            w(f"  {line}\n")
        for note in envfile.left_out(plan.env_changes):
            w(f"  # {note}\n")
    kept = [d for d in plan.decisions if d.kept]
    refused = [d for d in plan.decisions if not d.kept]
    if kept:
        w("\nFixes" + (" applied" if args.apply else " planned (verified by re-running the checks)") + ":\n")
        for d in kept:
            w(f"  {d.finding.id} [{d.fix.safety.value}] {d.fix.title}: {d.reason}\n")
    if refused:
        w("\nFixes not kept:\n")
        for d in refused:
            w(f"  {d.finding.id} {d.fix.title}: {d.reason}\n")
    if plan.unsafe_available:
        count = len(plan.unsafe_available)
        w(f"\n{count} unsafe fix(es) available with --unsafe-fixes (they change what the job does):\n")
        for f, fix in plan.unsafe_available:
            w(f"  {f.id} {fix.title}\n")
    if plan.manual:
        w("\nManual steps (gpudoctor never runs these):\n")
        for f, fix in plan.manual:
            w(f"  {f.id} {fix.title}\n")
            for a in fix.actions:
                w(f"      {a.target}\n")
    status = _status(plan)
    if status["remaining"]:
        w("\nRemaining:\n")
        for r in status["remaining"]:
            w(f"  {r['id']} {r['severity']}: {r['reason']}\n")
    _summary_line(plan, args, backups, out, first=not written[0])


def _summary_line(plan, args, backups: dict, out, first: bool = False) -> None:
    status = _status(plan)
    files = len(plan.changed_files)
    if args.apply:
        head = f"applied: {len(backups)} file(s) written" if backups else "nothing to write"
    else:
        head = f"dry run: {files} file(s) would change (--apply writes them)" if files else "dry run: no file changes"
    blank = "" if first else "\n"  # the output's first line is never a blank one
    out.write(
        f"{blank}gpudoctor fix: {head}; {len(status['fixed'])} check(s) fixed, {len(status['remaining'])} remaining\n"
    )
