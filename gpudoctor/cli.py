"""Command line: thin glue over probe -> checks -> report. Exit codes as in docs/architecture.md."""

from __future__ import annotations

import argparse
import errno
import functools
import io
import os
import sys

from gpudoctor import __version__
from gpudoctor.fileio import FileIOError
from gpudoctor.inputs import UsageError, context_for, judged_inputs, probe_kwargs, specs_for
from gpudoctor.model import CLI_LAUNCHERS, ExitCode
from gpudoctor.registry import RegistryError
from gpudoctor.sanitize import clean, json_text


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not a usage dump
        from gpudoctor.report.usage import did_you_mean

        raise UsageError(f"{self.prog}: {did_you_mean(message)} (see --help)")

    def _print_message(self, message, file=None):
        # argparse drops a failed write of --help or --version (exit 0, no text); let main() report it
        if message:
            (file or sys.stderr).write(message)
            (file or sys.stderr).flush()


def _non_negative_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {n}")
    return n


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


LAUNCHERS = CLI_LAUNCHERS  # model.LAUNCHER_TABLE, the one launcher table
REPORT_FORMATS = ("text", "json", "github", "concise")


def _check_inputs(c: argparse.ArgumentParser) -> None:
    """What `check` judges: this machine or a snapshot, which checks, and the job's script, config and launcher."""
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
    c.add_argument("--launcher", choices=LAUNCHERS, help="how the job will be launched")
    c.add_argument("--config", metavar="FILE", help="training config (YAML or JSON) to audit dataloader settings")
    c.add_argument("--sbatch", metavar="FILE", help="audit a SLURM batch script before submitting it")
    c.add_argument(
        "script_args",
        nargs="*",
        metavar="-- ARG",
        help="with --sbatch, after `--`: the arguments you give the script (`sbatch FILE ARG...`), its $1, $2, ...; "
        "without them each is judged unknown",
    )


def _check_outputs(c: argparse.ArgumentParser) -> None:
    """How `check` reports: the format, the files written beside it, how much it shows."""
    c.add_argument("--json", action="store_true", help="print the gpudoctor.report/1 JSON object (--format json)")
    c.add_argument(
        "--format",
        choices=REPORT_FORMATS,
        default="text",
        help="text (default); json; github: workflow commands (::error file=F,line=N::...) that annotate a pull "
        "request; concise: one `path:line: GD-ID message` line per problem (ruff/flake8 style). github and "
        "concise write the verdict's findings; one with no line of its own goes on line 1 of the script "
        "(or config), one about no file has none",
    )
    c.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report")
    c.add_argument(
        "--prometheus",
        metavar="FILE",
        help="also write the verdict as Prometheus metrics (node_exporter textfile collector), atomically",
    )
    c.add_argument("-v", "--verbose", action="store_true", help="show every check with its full evidence")
    c.add_argument("-q", "--quiet", action="store_true", help="only the problems, the next steps and the verdict")


def _check_probe_and_job(c: argparse.ArgumentParser) -> None:
    """Where the facts come from and how long they may take, and `check --job` across the ranks of a job."""
    c.add_argument(
        "--node-snapshot",
        metavar="FILE",
        help="facts recorded on a compute node (gpudoctor snapshot -o FILE there): judge the job there",
    )
    c.add_argument(
        "--torch-timeout", type=float, default=None, metavar="S", help="limit for importing torch (default 60)"
    )
    c.add_argument(
        "--job",
        action="store_true",
        help="inside srun/torchrun: gather every rank's view, rank 0 prints one report for the job",
    )
    c.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="with --job: how long rank 0 waits for the other ranks (default 60)",
    )


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="gpudoctor", description="Preflight doctor for PyTorch GPU training.")
    p.add_argument("--version", action="version", version=f"gpudoctor {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    c = sub.add_parser("check", help="audit this machine and job set-up; a verdict per check")
    _check_inputs(c)
    _check_outputs(c)
    _check_probe_and_job(c)

    commands = plugged_commands()
    _add_plugged(sub, commands, "fix", c)

    s = sub.add_parser("snapshot", help="write the probed facts as JSON (secrets excluded)")
    s.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    s.add_argument("--python", metavar="PATH", help="probe the torch of another interpreter")
    s.add_argument("--torch-timeout", type=float, default=None, metavar="S")

    cmp = sub.add_parser("compare", help="compare snapshots of several nodes (or days): the differences that matter")
    cmp.add_argument("snapshots", nargs="+", metavar="FILE", help="facts files from 'gpudoctor snapshot -o'")
    cmp.add_argument("--select", type=_csv, metavar="LIST", help="only these categories or check ids")
    cmp.add_argument("--ignore", type=_csv, metavar="LIST", help="skip these categories or check ids")
    cmp.add_argument("--strict", action="store_true", help="warnings fail too (exit 1)")
    cmp.add_argument("--json", action="store_true", help="print the gpudoctor.report/1 JSON object")
    cmp.add_argument("-v", "--verbose", action="store_true", help="show the checks that passed too")

    ls = sub.add_parser("list", help="list the checks")
    ls.add_argument("--json", action="store_true")

    e = sub.add_parser("explain", help="what a check checks, why it matters, how to fix it")
    e.add_argument("id", help="check id (e.g. GD-DRV-001) or name")

    d = sub.add_parser("docs", help="write the check reference (docs/checks.md) from the registry")
    d.add_argument("-o", "--output", metavar="FILE", help="default: stdout")

    for name in sorted(set(commands) - {"fix"}):  # smoke, and any a plug-in adds
        _add_plugged(sub, commands, name, c)
    return p


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


def _add_plugged(sub, commands: dict, name: str, check_parser) -> None:
    module = commands.get(name)
    if module is not None:
        module.add_arguments(sub.add_parser(name, help=module.HELP), check_parser)


# argparse's cost grows with the square of the option strings given (each one rescans the list of all of
# them: 20,000 flags took 18 s); no command line of gpudoctor's needs more than a few dozen words.
MAX_ARGV_WORDS = 1000


def main(argv: list[str] | None = None) -> int:
    from gpudoctor.report.usage import SIGTERM_EXIT, Terminated, raise_on_sigterm

    raise_on_sigterm()
    if not stdout_usable():
        return ExitCode.USAGE
    words = sys.argv[1:] if argv is None else argv
    if len(words) > MAX_ARGV_WORDS:
        print(
            f"gpudoctor: {len(words)} command-line arguments; gpudoctor takes at most {MAX_ARGV_WORDS} "
            "(every option once is under 100)",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as e:  # --help, --version or argparse's usage error: its text is out, flush it here
            sys.stdout.flush()
            return e.code if isinstance(e.code, int) else ExitCode.USAGE
        args.argv = list(sys.argv[1:] if argv is None else argv)  # as given: `smoke --python` re-runs it there
        if args.command is None:  # as argparse does for a missing required argument: usage error, on stderr
            names = [*COMMANDS, *plugged_commands()]
            print(f"gpudoctor: a command is required ({', '.join(names)}); see gpudoctor --help", file=sys.stderr)
            return ExitCode.USAGE
        command = COMMANDS.get(args.command) or plugged_commands()[args.command].run
        code = command(args)
        sys.stdout.flush()  # a full disk or a closed pipe is reported here, not at interpreter exit (status 120)
        return code
    except (UsageError, RegistryError, FileIOError) as e:  # RegistryError: a check or plug-in that cannot load
        # a message may name a file or quote its content: through the sanitiser, as every output
        print(clean(f"gpudoctor: {e}" if not str(e).startswith("gpudoctor") else str(e)), file=sys.stderr)
        return ExitCode.USAGE
    except Terminated:
        print("gpudoctor: terminated (SIGTERM)", file=sys.stderr)
        return SIGTERM_EXIT
    except KeyboardInterrupt:
        print("gpudoctor: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _discard_stdout()
        return ExitCode.OK
    except OSError as e:
        if e.errno not in _OUTPUT_ERRNOS or not _discard_stdout():
            return _internal_error(e)
        print(f"gpudoctor: cannot write the output: {e.strerror or e}", file=sys.stderr)
        return ExitCode.USAGE
    except Exception as e:
        return _internal_error(e)


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
    if os.environ.get("GPUDOCTOR_DEBUG"):
        raise e
    print(
        clean(f"gpudoctor: internal error: {type(e).__name__}: {e} (set GPUDOCTOR_DEBUG=1 for a traceback)"),
        file=sys.stderr,
    )
    return ExitCode.INTERNAL


def cmd_check(args) -> int:
    from gpudoctor.report import preflight
    from gpudoctor.runner import run_checks

    if args.snapshot and args.python:
        raise UsageError("--snapshot replays recorded facts; it cannot be combined with --python")
    if args.job or args.timeout is not None:
        from gpudoctor.job import gather

        return gather.run(args, specs_for(args), context_for(args), probe_kwargs(args), UsageError)
    if args.json:
        args.format = "json"
    facts, ctx, specs, target = judged_inputs(args, progress=args.format == "text")
    findings = run_checks(specs, facts, ctx)
    from gpudoctor.job.target import exit_code as target_exit_code

    if args.junit:
        from gpudoctor.fileio import write_output
        from gpudoctor.job.target import for_junit
        from gpudoctor.report import junit

        write_output(args.junit, junit.render(for_junit(findings, target), strict=args.strict), what="--junit")
    code = target_exit_code(findings, target, strict=args.strict)
    if getattr(args, "prometheus", None):
        import time

        from gpudoctor.fileio import write_output
        from gpudoctor.job.target import split
        from gpudoctor.report import prometheus
        from gpudoctor.sanitize import clean

        judged = split(findings, target)[0]  # the verdict's findings, as the exit code counts them
        host = clean(facts.host.get("hostname") or "") or None
        write_output(args.prometheus, prometheus.render(judged, code, time.time(), host), what="--prometheus")
    if args.format in ("github", "concise"):
        from gpudoctor.job.target import split
        from gpudoctor.report import annotations

        render = annotations.github if args.format == "github" else annotations.concise
        sys.stdout.write(render(split(findings, target)[0], ctx))
    elif args.format == "json":
        from gpudoctor.report import json_report

        extra = {"target": preflight.json_target(target, findings)}
        sys.stdout.write(json_report.render(findings, _source(facts, args), extra))
    else:
        from gpudoctor.report import text

        detail = "all" if args.verbose else ("problems" if args.quiet else "default")
        view = preflight.view(__version__, facts, ctx, target, args)
        text.render(findings, file=sys.stdout, verbose=detail, view=view)
    return code


def _source(facts, args) -> dict:
    return {
        "snapshot": args.snapshot,
        "collected_at": facts.meta.get("collected_at"),
        "probe_seconds": facts.meta.get("probe_seconds"),
        "hostname": facts.host.get("hostname"),
    }


def _header(facts, args) -> str:
    parts = [f"gpudoctor {__version__}"]
    if facts.host.get("hostname"):
        parts.append(f"on {facts.host['hostname']}")
    if args.snapshot:
        parts.append(f"(replaying {args.snapshot}, recorded {facts.meta.get('collected_at', '?')})")
    gpus = facts.gpus
    if gpus:
        names = sorted({g.get("name") or "?" for g in gpus})
        parts.append(f"· {len(gpus)} GPU(s): {', '.join(names)}, driver {facts.nvidia.get('driver_version')}")
    if facts.torch.get("version"):
        parts.append(f"· torch {facts.torch['version']}")
    return " ".join(parts)


def cmd_snapshot(args) -> int:
    from gpudoctor.probe import collect

    facts = collect(**probe_kwargs(args))
    if args.output:
        facts.dump(args.output)  # fileio.write_output: a FileIOError is one line, exit 2
        print(clean(f"gpudoctor: facts written to {args.output}"), file=sys.stderr)
    else:
        sys.stdout.write(facts.dump())
    return ExitCode.OK


def cmd_list(args) -> int:
    from gpudoctor.registry import load_all

    specs = load_all()
    if args.json:
        rows = [{"id": s.id, "name": s.name, "category": s.category, "title": s.title} for s in specs.values()]
        print(json_text(rows, indent=2))
        return ExitCode.OK
    width = max((len(s.id) for s in specs.values()), default=10)
    for s in sorted(specs.values(), key=lambda s: (s.category, s.id)):
        print(f"{s.id:<{width}}  {s.category:<11}  {s.title}  ({s.name})")
    return ExitCode.OK


def _find_spec(key: str):
    from gpudoctor.registry import load_all

    specs = load_all()
    spec = specs.get(key.upper()) or next((s for s in specs.values() if s.name == key), None)
    if spec is None:
        raise UsageError(f"no check {key!r} (see 'gpudoctor list')")
    return spec


def cmd_explain(args) -> int:
    from gpudoctor.docs import explain_text

    print(explain_text(_find_spec(args.id)))
    return ExitCode.OK


def cmd_docs(args) -> int:
    from gpudoctor.docs import checks_markdown
    from gpudoctor.registry import load_all

    text = checks_markdown(load_all())
    if args.output:
        from gpudoctor.fileio import write_output

        write_output(args.output, text, what="-o")
    else:
        sys.stdout.write(text)
    return ExitCode.OK


def cmd_compare(args) -> int:
    from gpudoctor.facts import SnapshotError
    from gpudoctor.job.compare import compare

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
