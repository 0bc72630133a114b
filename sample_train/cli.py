"""`gpudoctor smoke`: flags and entry. Imports no torch: gpudoctor's parser is built from this."""

from __future__ import annotations

import argparse
import os
import sys

from gpudoctor.model import ExitCode
from gpudoctor.sample_train.judge import baseline
from gpudoctor.sample_train.options import OptionsError, add_flags, from_args
from gpudoctor.sanitize import clean

HELP = "a short bf16 DDP training run that proves the set-up and measures it"


def add_arguments(p: argparse.ArgumentParser, check_parser: argparse.ArgumentParser | None = None) -> None:
    """The options' flags (options.py declares them) and the interpreter to train in."""
    add_flags(p)
    p.add_argument(
        "--python",
        metavar="PATH",
        help="train in another interpreter (the training env's; it needs torch and gpudoctor)",
    )


def run(args) -> int:

    from gpudoctor.job import world
    from gpudoctor.sample_train import faults

    try:
        opts = from_args(args)
        if opts.measure.baseline_path:
            opts.measure.baseline = baseline.load(opts.measure.baseline_path)
        faults.parse(os.environ.get(faults.ENV))
        here = world.detect()
    except (OptionsError, world.WorldError, faults.FaultSpecError) as e:
        print(clean(f"gpudoctor smoke: {e}"), file=sys.stderr)
        return ExitCode.USAGE
    from gpudoctor.sample_train import interpreter, launch

    interpreter.hold_warnings()
    if getattr(args, "python", None):
        return interpreter.rerun_in(args.python, getattr(args, "argv", None) or sys.argv[1:], opts)
    if not interpreter.torch_here():
        return interpreter.no_torch(opts, sys.executable)
    if here is None:
        try:
            return launch.run_spawn(opts)
        except launch.TooManyRanks as e:
            print(clean(f"gpudoctor smoke: {e}"), file=sys.stderr)
            return ExitCode.USAGE
    if opts.train.nprocs is not None and opts.train.nprocs != here.local_world_size:
        print(
            f"gpudoctor smoke: --gpus {opts.train.nprocs}, but {here.launcher} already started {here.local_world_size} "
            f"rank(s) on this node (this is rank {here.rank} of {here.world_size}); drop --gpus",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    return launch.run_in_world(here, opts)
