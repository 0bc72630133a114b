"""Command line: thin glue over probe -> checks -> report. Exit codes as in docs/architecture.md.

Every `gpudoctor` run starts here (a pre-commit hook, a node's health check, the test suite's hundreds), so
at its top this module imports the standard library alone: a command's options are added, and its modules
imported, when that command is the one parsed (_Commands); a core command never reads the plugged commands'
entry points (plugged_for).
"""

from __future__ import annotations

import argparse
import errno
import functools
import io
import os
import sys

from gpudoctor import __version__


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every option of the parser and of the commands built under it (a misspelled option of `check` is
    reported by the top parser, which parses what its command left)."""
    found = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _option_strings(sub)
    return sorted(set(found))


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not a usage dump
        from gpudoctor.inputs import UsageError
        from gpudoctor.report.usage import did_you_mean

        raise UsageError(f"{self.prog}: {did_you_mean(message, _option_strings(self))} (see --help)")

    def _print_message(self, message, file=None):
        # argparse drops a failed write of --help or --version (exit 0, no text); let main() report it
        if message:
            (file or sys.stderr).write(message)
            (file or sys.stderr).flush()


def _non_negative_int(text: str) -> int:
    """Every command line's number through the one parser (readers/ints: ASCII digits, nothing around them)."""
    from gpudoctor.readers.ints import int_option

    return int_option(low=0)(text)


def _seconds(text: str) -> float:
    """A limit in seconds: a finite number more than 0 (readers/ints.number_option)."""
    from gpudoctor.readers.ints import number_option

    return number_option(0.0, what="seconds")(text)


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


REPORT_FORMATS = ("text", "json", "github", "concise", "sarif")


class _Commands(argparse._SubParsersAction):
    """The COMMAND argument. Each command's parser is listed (name, help) up front but gets its options only
    when it is the command parsed (or asked for): building one imports what its options need (the launcher
    table, a plugged command's option table), which no other command should pay for."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._add_options: dict = {}  # name -> function(parser) that adds the command's options, run once

    def add_command(self, name: str, help: str, add_options) -> None:
        # `gpudoctor NAME --help` opens with the line `gpudoctor --help` lists for it.
        self.add_parser(name, help=help, description=help[:1].upper() + help[1:] + ".")
        self._add_options[name] = add_options

    def parser_of(self, name: str) -> argparse.ArgumentParser:
        parser = self._name_parser_map[name]
        add_options = self._add_options.pop(name, None)
        if add_options is not None:
            add_options(parser)
        return parser

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if values and values[0] in self._add_options:
            self.parser_of(values[0])
        super().__call__(parser, namespace, values, option_string)


def build_parser(plugged: dict | None = None) -> argparse.ArgumentParser:
    """The command line; `plugged` ({name: module}, default: every installed one) the plugged commands in it."""
    p = _Parser(prog="gpudoctor", description="Preflight doctor for PyTorch GPU training.")
    p.add_argument("--version", action="version", version=f"gpudoctor {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser, action=_Commands)
    assert isinstance(sub, _Commands)  # for mypy: typeshed's add_subparsers returns the base class
    commands = plugged_commands() if plugged is None else plugged
    sub.add_command("check", "audit this machine and job set-up; a verdict per check", _add_check)
    _add_plugged(sub, commands, "fix")  # `fix` is listed right after `check`, whose options it shares
    _add_core_commands(sub)
    for name in sorted(set(commands) - {"fix"}):  # smoke, and any a plug-in adds
        _add_plugged(sub, commands, name)
    return p


def _add_check(c) -> None:
    _add_check_inputs(c)
    _add_check_outputs(c)
    _add_check_where(c)


def _add_check_inputs(c) -> None:
    """What is judged: the facts, the job's files, which checks."""
    from gpudoctor.model import CLI_LAUNCHERS  # model.LAUNCHER_TABLE, the one launcher table

    c.add_argument("--snapshot", metavar="FILE", help="replay facts from a snapshot instead of probing")
    c.add_argument("--python", metavar="PATH", help="audit the torch of another interpreter (default: this one)")
    c.add_argument(
        "--local-torch",
        action="store_true",
        help="with --sbatch/--config: also judge this interpreter's torch (before submission torch is judged only "
        "with --python, the training environment's interpreter; without either it is not imported)",
    )
    c.add_argument(
        "--before-submission",
        action="store_true",
        help="with --config and --expect-gpus/--launcher: judge the job before submission even on a machine with "
        "GPUs (without it, a config on a GPU machine is judged as this machine's job)",
    )
    c.add_argument("--select", type=_csv, metavar="LIST", help="only these categories or check ids (comma-separated)")
    c.add_argument("--ignore", type=_csv, metavar="LIST", help="skip these categories or check ids")
    c.add_argument("--strict", action="store_true", help="warnings fail too (exit 1)")
    c.add_argument(
        "--expect-gpus",
        type=_non_negative_int,
        metavar="N",
        help="GPUs the job needs (0: CPU-only is fine; default: at least one)",
    )
    c.add_argument("--launcher", choices=CLI_LAUNCHERS, help="how the job will be launched")
    c.add_argument("--config", metavar="FILE", help="training config (YAML or JSON) to audit dataloader settings")
    c.add_argument("--sbatch", metavar="FILE", help="audit a SLURM batch script before submitting it")
    c.add_argument(
        "--show-job",
        action="store_true",
        help="with --sbatch: print the job as it will run (per node: processes, ranks, GPUs, rendezvous, unknowns)",
    )
    c.add_argument(
        "script_args",
        nargs="*",
        metavar="-- ARG",
        help="with --sbatch, after `--`: the arguments you give the script (`sbatch FILE ARG...`), its $1, $2, ...; "
        "without them each is judged unknown",
    )


def _add_check_outputs(c) -> None:
    """How the verdict is written."""
    c.add_argument("--json", action="store_true", help="print the gpudoctor.report/1 JSON object (--format json)")
    c.add_argument(
        "--format",
        choices=REPORT_FORMATS,
        default="text",
        help="text (default); json; github: workflow commands (::error file=F,line=N::...) that annotate a pull "
        "request; concise: one `path:line: GD-ID message` line per problem (ruff/flake8 style). github and "
        "concise write the verdict's findings; one with no line of its own goes on line 1 of the script "
        "(or config), one about no file has none; sarif: a SARIF 2.1.0 log for code scanning",
    )
    c.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report")
    c.add_argument(
        "--prometheus",
        metavar="FILE",
        help="also write the verdict as Prometheus metrics (node_exporter textfile collector), atomically",
    )
    c.add_argument(
        "-v", "--verbose", action="store_true", help="every check with its evidence, and the machine gpudoctor runs on"
    )
    c.add_argument("-q", "--quiet", action="store_true", help="only the problems and their fixes")


def _add_check_where(c) -> None:
    """Where the job's node facts come from: a recorded node, or every rank of a running job (--job)."""
    c.add_argument(
        "--node-snapshot",
        metavar="FILE",
        help="facts recorded on a compute node (gpudoctor snapshot -o FILE there): judge the job there",
    )
    c.add_argument(
        "--torch-timeout", type=_seconds, default=None, metavar="S", help="limit for importing torch (default 60)"
    )
    c.add_argument(
        "--job",
        action="store_true",
        help="inside srun/torchrun: gather every rank's view, rank 0 prints one report for the job",
    )
    c.add_argument(
        "--timeout",
        type=_seconds,
        default=None,
        metavar="S",
        help="with --job: how long rank 0 waits for the other ranks (default 60)",
    )


def _add_core_commands(sub) -> None:
    """snapshot, compare, list, explain, docs."""
    sub.add_command("snapshot", "write the probed facts as JSON (secrets excluded)", _add_snapshot)
    sub.add_command(
        "compare", "compare snapshots of several nodes (or days): the differences that matter", _add_compare
    )
    sub.add_command("list", "list the checks", _add_list)
    sub.add_command("explain", "what a check checks, why it matters, how to fix it", _add_explain)
    sub.add_command("docs", "write the check reference (docs/checks.md) from the registry", _add_docs)


def _add_snapshot(s) -> None:
    s.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    s.add_argument("--python", metavar="PATH", help="probe the torch of another interpreter")
    s.add_argument("--torch-timeout", type=_seconds, default=None, metavar="S")


def _add_compare(cmp) -> None:
    cmp.add_argument("snapshots", nargs="+", metavar="FILE", help="facts files from 'gpudoctor snapshot -o'")
    cmp.add_argument("--select", type=_csv, metavar="LIST", help="only these categories or check ids")
    cmp.add_argument("--ignore", type=_csv, metavar="LIST", help="skip these categories or check ids")
    cmp.add_argument("--strict", action="store_true", help="warnings fail too (exit 1)")
    cmp.add_argument("--json", action="store_true", help="print the gpudoctor.report/1 JSON object")
    cmp.add_argument("-v", "--verbose", action="store_true", help="show the checks that passed too")


def _add_explain(e) -> None:
    e.add_argument("id", help="check id (e.g. GD-DRV-001) or name")


def _add_docs(d) -> None:
    d.add_argument("-o", "--output", metavar="FILE", help="default: stdout")


# Commands the packages above the core contribute (fix, smoke): declared in the entry-point group
# gpudoctor.commands (pyproject.toml), the way checks are, so the core never imports them. Each module has
# HELP, add_arguments(parser, check_parser) and run(args) -> exit code.
COMMAND_GROUP = "gpudoctor.commands"


@functools.cache
def plugged_commands() -> dict:
    """{name: module} for the installed command entry points; one that cannot be imported is left out
    (as the smoke command was before, when its package failed to import)."""
    from importlib.metadata import entry_points

    found = {}
    for ep in entry_points(group=COMMAND_GROUP):
        if ep.name in COMMANDS or ep.name in found:
            continue  # a core command's name, or a second plug-in of the same name: the first one stays
        try:
            found[ep.name] = ep.load()
        except ImportError:
            continue
    return found


def plugged_for(first_word: str | None) -> dict:
    """The plugged commands that parsing a command line whose first word is `first_word` needs, as
    plugged_commands() gives them: none for a core command or --version (which prints before a command is
    looked at); the one named, alone (the first of its name that imports); all of them for anything else
    (--help lists them, a mistyped name is told their names)."""
    if first_word in COMMANDS or first_word == "--version":
        return {}
    if first_word and not first_word.startswith("-"):
        from importlib.metadata import entry_points

        for ep in entry_points(group=COMMAND_GROUP, name=first_word):
            try:
                return {first_word: ep.load()}
            except ImportError:
                continue
    return plugged_commands()


def _add_plugged(sub, commands: dict, name: str) -> None:
    module = commands.get(name)
    if module is not None:
        sub.add_command(name, module.HELP, lambda p: module.add_arguments(p, sub.parser_of("check")))


# argparse's cost grows with the square of the option strings given (each one rescans the list of all of
# them: 20,000 flags took 18 s); no command line of gpudoctor's needs more than a few dozen words.
MAX_ARGV_WORDS = 1000


def entry() -> None:
    """The `gpudoctor` program (console script and `python -m gpudoctor`): main(), then the process ends."""
    code = main()
    if "torch" in sys.modules:
        _end_without_teardown(code)
    raise SystemExit(code)


def _end_without_teardown(code: int) -> None:
    """End the process once our exit handlers ran and the output is out, skipping the interpreter's
    teardown of every module: with torch and torch._dynamo loaded (`smoke`, `check --job`) that teardown
    costs 0.4-1.7 CPU-s and nothing of ours needs it. A live non-daemon thread, or output that cannot be
    flushed, takes the normal path, which reports it as Python does."""
    import atexit
    import threading

    main_thread = threading.main_thread()
    if any(t is not main_thread and not t.daemon and t.is_alive() for t in threading.enumerate()):
        return
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    os._exit(code if isinstance(code, int) and 0 <= code <= 255 else 1)


def _refuse_empty_paths(parser: argparse.ArgumentParser, args) -> None:
    """Every command's options that name a file (metavar FILE or PATH): an empty value is one line and exit 2,
    never taken for "not given" (`watch --log ''` was ignored, issue 35 item 5)."""
    from gpudoctor.inputs import UsageError

    sub = next((a for a in parser._actions if isinstance(a, _Commands)), None)
    if sub is None or args.command is None:
        return
    for action in sub.parser_of(args.command)._actions:
        if action.metavar not in ("FILE", "PATH"):
            continue
        value = getattr(args, action.dest, None)
        if any(isinstance(v, str) and not v.strip() for v in (value if isinstance(value, list) else [value])):
            name = action.option_strings[-1] if action.option_strings else action.metavar
            raise UsageError(f"{name} {value!r}: an empty path; name a file")


def main(argv: list[str] | None = None) -> int:
    from gpudoctor.report.usage import SIGTERM_EXIT, Terminated, raise_on_sigterm

    raise_on_sigterm()
    words = sys.argv[1:] if argv is None else argv
    if not stdout_usable() or not _few_enough(words):
        return _exit_code("USAGE")
    try:
        plugged = plugged_for(words[0] if words else None)
        parser = build_parser(plugged)
        try:
            args = parser.parse_args(words)
        except SystemExit as e:  # --help, --version or argparse's usage error: its text is out, flush it here
            sys.stdout.flush()
            return e.code if isinstance(e.code, int) else _exit_code("USAGE")
        args.argv = list(sys.argv[1:] if argv is None else argv)  # as given: `smoke --python` re-runs it there
        if args.command is None:  # as argparse does for a missing required argument: usage error, on stderr
            names = [*COMMANDS, *plugged_commands()]
            print(f"gpudoctor: a command is required ({', '.join(names)}); see gpudoctor --help", file=sys.stderr)
            return _exit_code("USAGE")
        _refuse_empty_paths(parser, args)
        command = COMMANDS.get(args.command) or plugged[args.command].run
        code = command(args)
        sys.stdout.flush()  # a full disk or a closed pipe is reported here, not at interpreter exit (status 120)
        return code
    except _usage_errors() as e:  # RegistryError: a check or plug-in that cannot load
        from gpudoctor.sanitize import clean

        # a message may name a file or quote its content: through the sanitiser, as every output
        print(clean(f"gpudoctor: {e}" if not str(e).startswith("gpudoctor") else str(e)), file=sys.stderr)
        return _exit_code("USAGE")
    except Terminated:
        print("gpudoctor: terminated (SIGTERM)", file=sys.stderr)
        return SIGTERM_EXIT
    except KeyboardInterrupt:
        print("gpudoctor: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _discard_stdout()
        return _exit_code("OK")
    except OSError as e:
        if e.errno not in _OUTPUT_ERRNOS or not _discard_stdout():
            return _internal_error(e)
        print(f"gpudoctor: cannot write the output: {e.strerror or e}", file=sys.stderr)
        return _exit_code("USAGE")
    except Exception as e:
        return _internal_error(e)


def _few_enough(words: list[str]) -> bool:
    if len(words) <= MAX_ARGV_WORDS:
        return True
    print(
        f"gpudoctor: {len(words)} command-line arguments; gpudoctor takes at most {MAX_ARGV_WORDS} "
        "(every option once is under 100)",
        file=sys.stderr,
    )
    return False


# The errors that are the user's (bad input, a check or plug-in that cannot load, a file that cannot be read
# or written): one line, exit 2. Named by module, as main() catches them: their modules are imported by the
# commands that raise them, and importing them for a command that cannot (`--version`) would double its cost.
_USAGE_ERRORS = (
    ("gpudoctor.inputs", "UsageError"),
    ("gpudoctor.registry", "RegistryError"),
    ("gpudoctor.fileio", "FileIOError"),
)


def _usage_errors() -> tuple[type[Exception], ...]:
    """The classes of _USAGE_ERRORS whose module is imported: one never imported raised nothing."""
    return tuple(getattr(sys.modules[m], name) for m, name in _USAGE_ERRORS if m in sys.modules)


def _exit_code(name: str) -> int:
    """model.ExitCode[name], imported when a command ends without one of its own."""
    from gpudoctor.model import ExitCode

    return ExitCode[name]


# A standard output that cannot take the report: full, over quota, failing, or a descriptor not open for
# writing (`gpudoctor list 1</dev/null`). As `> /dev/full`: one line, exit 2 (coreutils' close_stdout says
# "write error" and fails the same way), never exit 3.
_OUTPUT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG, errno.EBADF)


def stdout_usable() -> bool:
    """False (after one line on stderr) when standard output is closed -- Python then sets sys.stdout to None
    (`gpudoctor snapshot >&-`) -- or open only for reading (`1</dev/null`: argparse's --help and --version
    would lose their text silently). Checked before any work, so `fix --apply` writes nothing it cannot report."""
    problem = None
    if sys.stdout is None:
        problem = "standard output is closed"
    else:
        try:
            import fcntl

            if fcntl.fcntl(sys.stdout.fileno(), fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
                problem = "standard output is not open for writing"
        except (OSError, ValueError, AttributeError, ImportError, io.UnsupportedOperation):
            pass  # no descriptor of its own (a caller's StringIO): its writes will say
    if problem is None:
        return True
    if sys.stderr is not None:
        print(f"gpudoctor: cannot write the output: {problem}", file=sys.stderr)
    return False


def _discard_stdout() -> bool:
    """Points stdout at /dev/null so that the interpreter's last flush cannot fail (it would exit 120);
    the recipe of Python's signal docs for SIGPIPE. False when stdout has no descriptor to replace."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return True
    except (OSError, ValueError, AttributeError):
        return False


def _internal_error(e: Exception) -> int:
    """Called from an except clause (a bare raise re-raises e for GPUDOCTOR_DEBUG)."""
    from gpudoctor.model import ExitCode
    from gpudoctor.sanitize import clean

    if os.environ.get("GPUDOCTOR_DEBUG"):
        raise e
    print(
        clean(f"gpudoctor: internal error: {type(e).__name__}: {e} (set GPUDOCTOR_DEBUG=1 for a traceback)"),
        file=sys.stderr,
    )
    return ExitCode.INTERNAL


def cmd_check(args) -> int:
    from gpudoctor.inputs import UsageError, context_for, probe_kwargs, specs_for
    from gpudoctor.report.emit import emit

    if args.snapshot and args.python:
        raise UsageError("--snapshot replays recorded facts; it cannot be combined with --python")
    if args.job or args.timeout is not None:
        from gpudoctor.commands import check_job

        return check_job.run(args, specs_for(args), context_for(args), probe_kwargs(args), UsageError)
    if args.json:
        args.format = "json"
    if getattr(args, "show_job", False) and not args.sbatch:
        raise UsageError("--show-job shows the job of a batch script: give --sbatch FILE")
    result = _judge(args)
    if getattr(args, "show_job", False) and result.ctx is not None and result.ctx.job is not None:
        from gpudoctor.report.jobview import render

        print(render(result.ctx.job))
    emit(result, _outputs(args))
    return result.exit_code


def _judge(args):
    """Everything the check's outputs show, decided before any is rendered."""
    import time

    from gpudoctor.facts import collectable_env
    from gpudoctor.inputs import judged_inputs
    from gpudoctor.model import exit_code
    from gpudoctor.report import preflight
    from gpudoctor.report.result import Result
    from gpudoctor.runner import run_checks
    from gpudoctor.sanitize import clean
    from gpudoctor.verdict import split

    facts, ctx, specs, target = judged_inputs(args, progress=args.format == "text")
    if ctx.sbatch is not None:  # the job as it will run: built once, here, for the checks and --show-job
        from dataclasses import replace

        from gpudoctor.job.env import job_env
        from gpudoctor.job.model import build

        ctx = replace(ctx, job=build(ctx.sbatch, job_env(facts, ctx), ctx))
    findings = run_checks(specs, facts, ctx)
    verdict, outside = split(findings, target)
    code = int(exit_code(verdict, strict=args.strict))
    rank_env = facts.env if args.snapshot else collectable_env()  # a replay is labelled as it was recorded
    return Result(
        findings,
        verdict,
        code,
        outside=outside,
        strict=args.strict,
        target=target,
        ctx=ctx,
        view=preflight.view(__version__, facts, ctx, target, args, rank_env),
        detail="all" if args.verbose else ("problems" if args.quiet else "default"),
        source=_source(facts, args),
        extra={"target": preflight.json_target(target, outside)},
        hostname=clean(facts.host.get("hostname") or "") or None,
        judged_at=time.time(),
    )


def _outputs(args) -> list:
    from gpudoctor.report.emit import Output

    files = [Output("junit", args.junit)] if args.junit else []
    if getattr(args, "prometheus", None):
        files.append(Output("prometheus", args.prometheus))
    return [*files, Output(args.format)]


def _source(facts, args) -> dict:
    return {
        "snapshot": args.snapshot,
        "collected_at": facts.meta.get("collected_at"),
        "probe_seconds": facts.meta.get("probe_seconds"),
        "hostname": facts.host.get("hostname"),
    }


def cmd_snapshot(args) -> int:
    from gpudoctor.inputs import probe_kwargs
    from gpudoctor.model import ExitCode
    from gpudoctor.probe import collect
    from gpudoctor.sanitize import clean

    facts = collect(**probe_kwargs(args))
    if args.output:
        facts.dump(args.output)  # fileio.write_output: a FileIOError is one line, exit 2
        print(clean(f"gpudoctor: facts written to {args.output}"), file=sys.stderr)
    else:
        sys.stdout.write(facts.dump())
    return ExitCode.OK


def _add_list(ls: argparse.ArgumentParser) -> None:
    ls.add_argument("--json", action="store_true")
    ls.add_argument("--next", metavar="AREA", help="the next free check id of an area (SLURM, NCCL, DIAG, ...)")


def _next_id(specs, area: str) -> str:
    """GD-<AREA>-NNN one above the area's highest id (ids are never reused, so gaps stay gaps)."""
    import re

    from gpudoctor.inputs import UsageError
    from gpudoctor.sanitize import clean

    area = area.strip().upper()
    numbers = [int(m.group(1)) for s in specs.values() if (m := re.fullmatch(rf"GD-{re.escape(area)}-(\d+)", s.id))]
    if not numbers:
        areas = sorted({s.id.split("-")[1] for s in specs.values() if s.id.startswith("GD-")})
        raise UsageError(f"no check area {clean(area)!r} (one of {', '.join(areas)})")
    return f"GD-{area}-{max(numbers) + 1:03d}"


def cmd_list(args) -> int:
    from gpudoctor.model import ExitCode
    from gpudoctor.registry import load_all
    from gpudoctor.sanitize import json_text

    specs = load_all()
    if args.next is not None:
        nxt = _next_id(specs, args.next)
        print(json_text({"area": args.next.strip().upper(), "next": nxt}) if args.json else nxt)
        return ExitCode.OK
    if args.json:
        rows = [{"id": s.id, "name": s.name, "category": s.category, "title": s.title} for s in specs.values()]
        print(json_text(rows, indent=2))
        return ExitCode.OK
    width = max((len(s.id) for s in specs.values()), default=10)
    for s in sorted(specs.values(), key=lambda s: (s.category, s.id)):
        print(f"{s.id:<{width}}  {s.category:<11}  {s.title}  ({s.name})")
    return ExitCode.OK


def _find_spec(key: str):
    from gpudoctor.inputs import UsageError
    from gpudoctor.registry import load_all

    specs = load_all()
    spec = specs.get(key.upper()) or next((s for s in specs.values() if s.name == key), None)
    if spec is None:
        raise UsageError(f"no check {key!r} (see 'gpudoctor list')")
    return spec


def cmd_explain(args) -> int:
    from gpudoctor.docs import explain_text
    from gpudoctor.model import ExitCode

    print(explain_text(_find_spec(args.id)))
    return ExitCode.OK


def cmd_docs(args) -> int:
    from gpudoctor.docs import checks_markdown
    from gpudoctor.model import ExitCode
    from gpudoctor.registry import load_all

    text = checks_markdown(load_all())
    if args.output:
        from gpudoctor.fileio import write_output

        write_output(args.output, text, what="-o")
    else:
        sys.stdout.write(text)
    return ExitCode.OK


def cmd_compare(args) -> int:
    from gpudoctor.commands.compare import compare
    from gpudoctor.facts import SnapshotError
    from gpudoctor.inputs import UsageError, specs_for

    try:
        return compare(args.snapshots, specs_for(args), args.json, args.strict, args.verbose, args.ignore)
    except SnapshotError as e:
        raise UsageError(str(e)) from None


COMMANDS = {
    "check": cmd_check,
    "snapshot": cmd_snapshot,
    "compare": cmd_compare,
    "list": cmd_list,
    "explain": cmd_explain,
    "docs": cmd_docs,
}
