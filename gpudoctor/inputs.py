"""What `check` and `fix` judge, read from the same options: the checks selected, the facts (probed or
replayed), the context (batch script, training config, launcher) and the target (gpudoctor.job.target).

Below the command line: gpudoctor.cli and the commands above the core (gpudoctor.fixes) both read their
inputs here, so a new input is one change, and bad input is one UsageError (one line, exit 2).
"""

from __future__ import annotations

import os

from gpudoctor.registry import RegistryError


class UsageError(Exception):
    """Bad input from the user: one clear line, exit 2."""


def specs_for(args):
    from gpudoctor.registry import load_all, select

    try:
        return select(load_all(), getattr(args, "select", None), getattr(args, "ignore", None))
    except RegistryError as e:
        raise UsageError(str(e)) from None


def probe_kwargs(args) -> dict:
    kw = {}
    if args.python:
        if not (os.path.isfile(args.python) and os.access(args.python, os.X_OK)):
            raise UsageError(f"--python {args.python}: not an executable file")
        kw["python"] = args.python
    if args.torch_timeout is not None:
        if not 0 < args.torch_timeout < float("inf"):  # also refuses nan, which float() accepts
            raise UsageError(
                f"--torch-timeout must be a finite number of seconds, more than 0 (got {args.torch_timeout})"
            )
        kw["torch_timeout"] = args.torch_timeout
    return kw


def probes_torch(args) -> bool:
    """Whether this run imports torch (in a child of the target interpreter) and reads its version.

    Before submission (--sbatch or --config, outside any job) the job's torch is the training
    environment's, not this interpreter's: judging this one would give verdicts about the wrong torch,
    and importing it costs ~1 s and ~200 MB in a pre-commit hook or CI step that needs neither. So it
    is probed only when asked: --python PATH (the training environment) or --local-torch. Inside a job
    (SLURM allocation or launcher variables) this interpreter is the job's, as it is for a plain check."""
    from gpudoctor.job.target import in_job_environment

    if args.python or getattr(args, "local_torch", False):
        return True
    if not (args.sbatch or args.config):
        return True
    return in_job_environment(dict(os.environ))


def context_for(args):
    from gpudoctor.model import Context

    config = sbatch = None
    if args.config:
        from gpudoctor.readers.trainconfig import ConfigError, load_config

        try:
            config = load_config(args.config)
        except ConfigError as e:
            raise UsageError(str(e)) from None
    arguments = getattr(args, "script_args", None)
    if arguments and not args.sbatch:
        raise UsageError(
            f"unexpected argument {arguments[0]!r}: script arguments (after --) need --sbatch FILE, whose $1, $2, ... "
            "they are"
        )
    if args.sbatch:
        from gpudoctor.probe.bash import bash_syntax
        from gpudoctor.readers.sbatch import SbatchError, load_sbatch

        try:
            # `check --sbatch F` without `--`: the script's arguments are not known (None), not absent
            known = tuple(arguments or ()) if _gave_arguments(args) else None
            sbatch = load_sbatch(args.sbatch, check_syntax=bash_syntax, arguments=known)
        except SbatchError as e:
            raise UsageError(str(e)) from None
    from gpudoctor.readers.overrides import job_config

    config, overrides = job_config(config, sbatch)
    return Context(
        expect_gpus=args.expect_gpus,
        launcher=args.launcher,
        config=config,
        config_path=args.config,
        sbatch=sbatch,
        sbatch_path=args.sbatch,
        before_submission=bool(getattr(args, "before_submission", False)),
        config_lines=_config_lines(args.config) if config is not None else None,
        overrides=overrides,
    )


def _gave_arguments(args) -> bool:
    """`--` on the command line after --sbatch: the script's arguments are given (maybe none at all)."""
    argv = getattr(args, "argv", None) or []
    return bool(getattr(args, "script_args", None)) or "--" in argv


def _config_lines(path: str) -> dict:
    from gpudoctor.readers.trainconfig import key_lines

    return key_lines(path)


def judged_inputs(args, progress: bool):
    """What check and fix judge, from the same options: (facts, context, checks, target).

    Facts come from --snapshot or a fresh probe (torch's slow import started first, so loading
    the checks overlaps it); --node-snapshot stands in for the node the job will get; the target
    says whether the verdict is about the job or about this machine (gpudoctor.job.target)."""
    from dataclasses import replace

    from gpudoctor.facts import Facts, SnapshotError
    from gpudoctor.job.target import decide, merge_node_snapshot, partition_of

    if args.snapshot and args.python:
        raise UsageError("--snapshot replays recorded facts; it cannot be combined with --python")
    torch_probe = None
    probe_torch = probes_torch(args)
    if not args.snapshot and not args.select and probe_torch:
        from gpudoctor.probe import start_torch_probe

        torch_probe = start_torch_probe(**probe_kwargs(args))
    specs = specs_for(args)
    ctx = context_for(args)
    if args.snapshot:
        try:
            facts = Facts.load(args.snapshot)
        except SnapshotError as e:
            raise UsageError(str(e)) from None
    else:
        from gpudoctor.probe import collect
        from gpudoctor.report.progress import spinner

        needed = {n for s in specs for n in s.needs}
        if progress:
            import rich.console  # noqa: F401  (the report's import, done while torch loads in the child)
        what = "probing this machine" + (" and importing torch" if "torch" in needed and probe_torch else "")
        with spinner(what, enabled=progress):
            partition = partition_of(ctx)
            facts = collect(
                needed, torch_probe=torch_probe, partition=partition, probe_torch=probe_torch, **probe_kwargs(args)
            )
    local_host = facts.host.get("hostname") or (None if args.snapshot else os.uname().nodename)
    node_snapshot = getattr(args, "node_snapshot", None)
    if node_snapshot:
        try:
            facts = merge_node_snapshot(facts, Facts.load(node_snapshot, what=""))
        except SnapshotError as e:
            raise UsageError(f"--node-snapshot {e}") from None
        ctx = replace(ctx, node_facts=node_snapshot)
    specs = [s for s in specs if s.category != "job" or facts.has("job")]  # job checks judge check --job
    return facts, ctx, specs, decide(facts, ctx, node_snapshot, local_host)
