"""`gpudoctor smoke`: flags and entry. Imports no torch: gpudoctor's parser is built from this."""

from __future__ import annotations

import argparse
import os
import re
import sys

from gpudoctor.model import ExitCode
from gpudoctor.sample_train.judge import baseline
from gpudoctor.sample_train.options import LoaderSettings, OptionsError, SmokeOptions, loader_from_config, merge_loader
from gpudoctor.sample_train.sizes import QUICK_STEPS
from gpudoctor.sanitize import clean


def _whole(text: str, low: int) -> int:
    try:
        n = int(text)
    except ValueError:  # also past the int-digit limit (thousands of digits)
        raise argparse.ArgumentTypeError(f"expected a whole number, got {_short(text)}") from None
    if n < low:
        raise argparse.ArgumentTypeError(f"expected {low} or more, got {n}")
    return n


def _positive_int(text: str) -> int:
    return _whole(text, 1)


def _non_negative_int(text: str) -> int:
    return _whole(text, 0)


MIN_STEPS = 10  # enough for the loss to fall measurably and for timings after warm-up
MAX_STEPS = 10**9  # far past any deadline; keeps sample counts (steps x batch x ranks) inside int64
MIN_SOAK_S, MAX_SOAK_S = 10.0, 24 * 3600.0
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # a week: past that a bound bounds nothing (and 1e300 s overflows timedelta)
MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed takes a 64-bit integer


def _steps(text: str) -> int:
    n = _whole(text, MIN_STEPS)
    if n > MAX_STEPS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_STEPS:,} steps, got {_short(text)}")
    return n


def _timeout(text: str) -> float:
    x = _positive_float(text)
    if not x <= MAX_TIMEOUT_S:  # also inf
        raise argparse.ArgumentTypeError(
            f"expected a finite number of seconds up to {MAX_TIMEOUT_S:g}, got {_short(text)}"
        )
    return x


def _duration(text: str) -> float:
    """90, 90s, 10m, 1h: seconds, from 10 s to a day."""
    m = re.fullmatch(r"\s*(\d{1,6}(?:\.\d{1,3})?)\s*([smh]?)\s*", text)
    seconds = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)] if m else None
    if seconds is None or not MIN_SOAK_S <= seconds <= MAX_SOAK_S:
        raise argparse.ArgumentTypeError(
            f"expected a duration from {MIN_SOAK_S:g}s to {MAX_SOAK_S / 3600:g}h (90s, 10m, 1h), got {_short(text)}"
        )
    return seconds


def _seed(text: str) -> int:
    n = _whole(text, 0)
    if n > MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected a seed up to {MAX_SEED}, got {_short(text)}")
    return n


def _short(text: str) -> str:
    return repr(text) if len(text) <= 40 else f"{text[:40]!r}... ({len(text):,} characters)"


def _positive_float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {_short(text)}") from None
    if not 0 < x < float("inf"):  # nan and inf too
        raise argparse.ArgumentTypeError(f"expected a finite number more than 0, got {_short(text)}")
    return x


def _fraction(text: str) -> float:
    """0.45 or 45%: a share of the peak."""
    percent = text.endswith("%")
    try:
        x = float(text.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction like 0.45 or 45%, got {text!r}") from None
    x = x / 100 if percent else x
    if not 0 < x <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1] or a percentage, got {text!r}")
    return x


def _bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


HELP = "a short bf16 DDP training run that proves the set-up and measures it"


def add_arguments(p: argparse.ArgumentParser, check_parser: argparse.ArgumentParser | None = None) -> None:
    p.add_argument(
        "--gpus",
        dest="nprocs",
        type=_positive_int,
        metavar="N",
        help="local ranks to spawn, one per GPU (default: every visible GPU; 2 with --device cpu). "
        "Under torchrun or srun each process is one rank and this is not needed",
    )
    p.add_argument(
        "--device",
        choices=("auto", "cuda", "cpu"),
        default="auto",
        help="cuda (NCCL) or cpu (gloo); auto: cuda, failing when torch sees no GPU",
    )
    p.add_argument(
        "--size",
        choices=("auto", "tiny", "small", "medium", "large"),
        default="auto",
        help="model size (default: from the device: tiny on CPU, large on 80 GB GPUs)",
    )
    p.add_argument(
        "--precision",
        choices=("auto", "bf16", "fp16", "fp32"),
        default="auto",
        help="autocast dtype (default: bf16; fp16 + GradScaler on GPUs without bf16)",
    )
    p.add_argument(
        "--steps", type=_steps, metavar="N", help=f"training steps, at least {MIN_STEPS} (default: from the size)"
    )
    p.add_argument("--warmup", type=_non_negative_int, metavar="N", help="steps left out of the timings")
    p.add_argument("--seq-len", type=_positive_int, metavar="N", help="tokens per sample")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (slower start, faster steps)")
    p.add_argument(
        "--timeout",
        type=_timeout,
        metavar="S",
        help="bound on the whole run; a rank that never joins, dies or hangs ends it (default 120 s on CPU, "
        "180 s on GPU, +300 s with --compile)",
    )
    p.add_argument("--config", metavar="FILE", help="training config (YAML/JSON) whose dataloader settings to use")
    p.add_argument("--batch-size", type=_positive_int, metavar="N", help="samples per rank per step")
    p.add_argument("--num-workers", type=_non_negative_int, metavar="N", help="DataLoader worker processes per rank")
    p.add_argument("--pin-memory", type=_bool, metavar="BOOL", help="DataLoader pin_memory")
    p.add_argument("--persistent-workers", type=_bool, metavar="BOOL", help="DataLoader persistent_workers")
    p.add_argument("--prefetch-factor", type=_positive_int, metavar="N", help="DataLoader prefetch_factor")
    p.add_argument(
        "--min-mfu",
        type=_fraction,
        metavar="F",
        help="fail below this MFU (0.45 or 45%%) against the spec peak, or the measured matmul peak without one",
    )
    p.add_argument(
        "--min-tokens-per-s", type=_positive_float, metavar="X", help="fail below this many tokens/s over all ranks"
    )
    p.add_argument(
        "--min-busbw",
        type=_positive_float,
        metavar="GBPS",
        help="fail below this all-reduce bus bandwidth in GB/s (nccl-tests' busbw)",
    )
    p.add_argument(
        "--min-scaling",
        type=_fraction,
        metavar="F",
        help="fail below this scaling efficiency (0.8 or 80%%): each rank's own compute time over the synchronised "
        "step time",
    )
    p.add_argument(
        "--min-matmul-tflops", type=_positive_float, metavar="X", help="fail a rank whose square matmul is below X"
    )
    p.add_argument(
        "--min-membw", type=_positive_float, metavar="GBPS", help="fail a rank whose device memory copy is below GB/s"
    )
    p.add_argument(
        "--min-hostbw",
        type=_positive_float,
        metavar="GBPS",
        help="fail a GPU whose pinned host<->device copy (either direction) is below GB/s",
    )
    p.add_argument(
        "--min-linkbw",
        type=_positive_float,
        metavar="GBPS",
        help="fail a node pair whose send/recv (each direction) is below GB/s",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="node qualification in seconds (a prolog, an init container): the part benchmarks, the correctness "
        f"tests and {QUICK_STEPS} training steps of a small model (tiny on CPU), with shorter benchmarks",
    )
    p.add_argument(
        "--soak",
        type=_duration,
        metavar="DURATION",
        help="after training, measure each rank's matmul and memory copy again and again for DURATION (90s, 10m, 1h) "
        "and judge them over time against the rank's own first minute and the other ranks: a GPU that slows once "
        "hot is named with its clocks, temperature and throttle reasons",
    )
    p.add_argument(
        "--deep",
        action="store_true",
        help="also measure every node pair and every GPU pair inside each node (send/recv)",
    )
    p.add_argument(
        "--save-baseline",
        metavar="FILE",
        help="write this run's per-part figures as a fleet baseline (run it on a known-good node)",
    )
    p.add_argument(
        "--baseline",
        metavar="FILE",
        help="judge each part against a baseline saved with --save-baseline (same GPU model and world size)",
    )
    p.add_argument(
        "--peak-tflops",
        type=_positive_float,
        metavar="X",
        help="dense peak TFLOP/s per GPU for MFU, for a GPU the built-in table lacks",
    )
    p.add_argument("--seed", type=_seed, default=1234, help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true", help="print the gpudoctor.smoke/2 JSON report")
    p.add_argument(
        "--prometheus",
        metavar="FILE",
        help="also write the figures and verdicts in node_exporter's textfile format (atomically)",
    )
    p.add_argument(
        "--python",
        metavar="PATH",
        help="train in another interpreter (the training env's; it needs torch and gpudoctor)",
    )


def options_from_args(args) -> SmokeOptions:
    if args.quick and args.deep:
        raise OptionsError("--quick and --deep ask for opposite things: a short run, and every pair of ranks")
    if args.quick and args.soak:
        raise OptionsError("--quick and --soak ask for opposite things: a short run, and minutes of measurements")
    if args.soak and args.timeout is not None and args.timeout <= args.soak:
        raise OptionsError(f"--timeout {args.timeout:g} s leaves no time for --soak {args.soak:g} s and the run itself")
    if args.warmup is not None and args.steps is not None and args.warmup > args.steps - 3:
        raise OptionsError(f"--warmup {args.warmup} leaves fewer than 3 of --steps {args.steps} to measure")
    flags = {
        "batch_size": args.batch_size,
        "num_workers": args.num_workers,
        "pin_memory": args.pin_memory,
        "persistent_workers": args.persistent_workers,
        "prefetch_factor": args.prefetch_factor,
    }
    loader_config = None
    if args.config:
        from gpudoctor.readers.trainconfig import ConfigError, load_config

        given = frozenset(name for name, value in flags.items() if value is not None)
        try:
            loader_config = loader_from_config(load_config(args.config), args.config, given)
        except ConfigError as e:
            raise OptionsError(str(e)) from None
    loader = merge_loader(loader_config or LoaderSettings(), flags)
    for flag, path in (("--save-baseline", args.save_baseline), ("--prometheus", args.prometheus)):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise OptionsError(f"{flag} {path}: no such directory")
        if path and os.path.isdir(path):
            raise OptionsError(f"{flag} {path}: a directory, not a file")
    return SmokeOptions(
        device=args.device,
        nprocs=args.nprocs,
        size=args.size,
        precision=args.precision,
        steps=args.steps,
        warmup=args.warmup,
        seq_len=args.seq_len,
        compile=args.compile,
        timeout=args.timeout,
        min_mfu=args.min_mfu,
        min_tokens_per_s=args.min_tokens_per_s,
        min_busbw_gbps=args.min_busbw,
        peak_tflops=args.peak_tflops,
        min_scaling=args.min_scaling,
        min_matmul_tflops=args.min_matmul_tflops,
        min_membw_gbps=args.min_membw,
        min_hostbw_gbps=args.min_hostbw,
        min_linkbw_gbps=args.min_linkbw,
        deep=args.deep,
        quick=args.quick,
        soak=args.soak,
        save_baseline=args.save_baseline,
        baseline=baseline.load(args.baseline) if args.baseline else None,
        baseline_path=args.baseline,
        prometheus=args.prometheus,
        seed=args.seed,
        json=args.json,
        loader=loader,
        config_path=args.config,
    )


def run(args) -> int:
    import os

    from gpudoctor.job import world
    from gpudoctor.sample_train import faults

    try:
        opts = options_from_args(args)
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
    if opts.nprocs is not None and opts.nprocs != here.local_world_size:
        print(
            f"gpudoctor smoke: --gpus {opts.nprocs}, but {here.launcher} already started {here.local_world_size} "
            f"rank(s) on this node (this is rank {here.rank} of {here.world_size}); drop --gpus",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    return launch.run_in_world(here, opts)
