"""The smoke run's settings, in sections (train, floors, measure, output), and `gpudoctor smoke`'s flags
generated from them: each field's metadata is its flag (as torchtitan's config does), so a setting and its flag
are declared once, in the order `--help` shows them. The per-rank floors come from the figure table
(judge/figures.py): a figure row with a floor is a `--min-...` flag. No torch.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from gpudoctor.sample_train import flagtypes as types
from gpudoctor.sample_train.judge import figures
from gpudoctor.sample_train.sizes import QUICK_STEPS

LOADER_SETTINGS = ("num_workers", "batch_size", "pin_memory", "persistent_workers", "prefetch_factor", "drop_last")


class OptionsError(ValueError):
    """Bad flag values or config contents: one line, exit 2."""


def flag(spelling: str, help: str, default: Any = None, **argparse_kwargs: Any) -> Any:
    """A setting given by a flag: its spelling, help and argparse arguments travel in the field's metadata."""
    return field(default=default, metadata={"flag": spelling, "help": help, **argparse_kwargs})


@dataclass
class LoaderSettings:
    batch_size: int | None = flag("--batch-size", "samples per rank per step", type=types.positive_int, metavar="N")
    num_workers: int | None = flag(
        "--num-workers", "DataLoader worker processes per rank", type=types.non_negative_int, metavar="N"
    )
    pin_memory: bool | None = flag("--pin-memory", "DataLoader pin_memory", type=types.boolean, metavar="BOOL")
    persistent_workers: bool | None = flag(
        "--persistent-workers", "DataLoader persistent_workers", type=types.boolean, metavar="BOOL"
    )
    prefetch_factor: int | None = flag(
        "--prefetch-factor", "DataLoader prefetch_factor", type=types.positive_int, metavar="N"
    )
    drop_last: bool | None = None
    source: dict = field(default_factory=dict)  # setting -> "--flag" | "config:<path>" | "default"


@dataclass
class TrainOptions:
    """What trains: the ranks, the model, the data."""

    nprocs: int | None = flag(
        "--gpus",
        "local ranks to spawn, one per GPU (default: every visible GPU; 2 with --device cpu). "
        "Under torchrun or srun each process is one rank and this is not needed",
        type=types.positive_int,
        metavar="N",
    )
    device: str = flag(
        "--device",
        "cuda (NCCL) or cpu (gloo); auto: cuda, failing when torch sees no GPU",
        "auto",
        choices=("auto", "cuda", "cpu"),
    )
    size: str = flag(
        "--size",
        "model size (default: from the device: tiny on CPU, large on 80 GB GPUs)",
        "auto",
        choices=("auto", "tiny", "small", "medium", "large"),
    )
    precision: str = flag(
        "--precision",
        "autocast dtype (default: bf16; fp16 + GradScaler on GPUs without bf16)",
        "auto",
        choices=("auto", "bf16", "fp16", "fp32"),
    )
    steps: int | None = flag(
        "--steps", f"training steps, at least {types.MIN_STEPS} (default: from the size)", type=types.steps, metavar="N"
    )
    warmup: int | None = flag("--warmup", "steps left out of the timings", type=types.non_negative_int, metavar="N")
    seq_len: int | None = flag("--seq-len", "tokens per sample", type=types.positive_int, metavar="N")
    compile: bool = flag(
        "--compile", "torch.compile the model (slower start, faster steps)", False, action="store_true"
    )
    timeout: float | None = flag(
        "--timeout",
        "bound on the whole run; a rank that never joins, dies or hangs ends it (default 120 s on CPU, "
        "180 s on GPU, +300 s with --compile)",
        type=types.timeout,
        metavar="S",
    )
    config_path: str | None = flag(
        "--config", "training config (YAML/JSON) whose dataloader settings to use", metavar="FILE"
    )
    loader: LoaderSettings = field(default_factory=LoaderSettings, metadata={"flags_of": LoaderSettings})
    seed: int = flag("--seed", argparse.SUPPRESS, 1234, type=types.seed)


@dataclass
class FloorOptions:
    """The floors a CI run sets: below one, the run fails. `parts`: the figure table's floors, by option name."""

    min_mfu: float | None = flag(
        "--min-mfu",
        "fail below this MFU (0.45 or 45%%) against the spec peak, or the measured matmul peak without one",
        type=types.fraction,
        metavar="F",
    )
    min_tokens_per_s: float | None = flag(
        "--min-tokens-per-s", "fail below this many tokens/s over all ranks", type=types.positive_float, metavar="X"
    )
    min_busbw_gbps: float | None = flag(
        "--min-busbw",
        "fail below this all-reduce bus bandwidth in GB/s (nccl-tests' busbw)",
        type=types.positive_float,
        metavar="GBPS",
    )
    min_scaling: float | None = flag(
        "--min-scaling",
        "fail below this scaling efficiency (0.8 or 80%%): each rank's own compute time over the synchronised "
        "step time",
        type=types.fraction,
        metavar="F",
    )
    parts: dict[str, float | None] = field(default_factory=dict, metadata={"figure_floors": True})
    min_linkbw_gbps: float | None = flag(
        "--min-linkbw",
        "fail a node pair whose send/recv (each direction) is below GB/s",
        type=types.positive_float,
        metavar="GBPS",
    )

    def as_report(self) -> dict:
        """The report's `floors` section: every floor by its option name, in the flags' order."""
        named = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "parts"}
        linkbw = named.pop("min_linkbw_gbps")
        return {**named, **{f.option: self.parts.get(f.option) for f in figures.floors()}, "min_linkbw_gbps": linkbw}


@dataclass
class MeasureOptions:
    """What else is measured, and what it is judged against."""

    quick: bool = flag(
        "--quick",
        "node qualification in seconds (a prolog, an init container): the part benchmarks, the correctness "
        f"tests and {QUICK_STEPS} training steps of a small model (tiny on CPU), with shorter benchmarks; the "
        "steps all-reduce the gradients after the backward instead of through DDP (not with --compile, fp16 "
        "or --min-scaling), which spares the import of torch._dynamo",
        False,
        action="store_true",
    )
    soak: float | None = flag(
        "--soak",
        "after training, measure each rank's matmul and memory copy again and again for DURATION (90s, 10m, 1h) "
        "and judge them over time against the rank's own first minute and the other ranks: a GPU that slows once "
        "hot is named with its clocks, temperature and throttle reasons",
        type=types.duration,
        metavar="DURATION",
    )
    deep: bool = flag(
        "--deep",
        "also measure every node pair and every GPU pair inside each node (send/recv)",
        False,
        action="store_true",
    )
    save_baseline: str | None = flag(
        "--save-baseline",
        "write this run's per-part figures as a fleet baseline (run it on a known-good node)",
        metavar="FILE",
    )
    baseline_path: str | None = flag(
        "--baseline",
        "judge each part against a baseline saved with --save-baseline (same GPU model and world size)",
        metavar="FILE",
    )
    baseline: dict | None = None  # the loaded --baseline file (judge/baseline.py)
    peak_tflops: float | None = flag(
        "--peak-tflops",
        "dense peak TFLOP/s per GPU for MFU, for a GPU the built-in table lacks",
        type=types.positive_float,
        metavar="X",
    )


@dataclass
class OutputOptions:
    json: bool = flag("--json", "print the gpudoctor.smoke/3 JSON report", False, action="store_true")
    prometheus: str | None = flag(
        "--prometheus",
        "also write the figures and verdicts in node_exporter's textfile format (atomically)",
        metavar="FILE",
    )


SECTIONS = {"train": TrainOptions, "floors": FloorOptions, "measure": MeasureOptions, "output": OutputOptions}


@dataclass
class SmokeOptions:
    train: TrainOptions = field(default_factory=TrainOptions)
    floors: FloorOptions = field(default_factory=FloorOptions)
    measure: MeasureOptions = field(default_factory=MeasureOptions)
    output: OutputOptions = field(default_factory=OutputOptions)

    @classmethod
    def of(cls, **settings: Any) -> SmokeOptions:
        """Options from settings by field name, whatever their section (a figure's floor by its option name)."""
        opts = cls()
        floor_names = {f.option for f in figures.floors()}
        for name, value in settings.items():
            if name in floor_names:
                opts.floors.parts[name] = value
                continue
            section = next((s for s in SECTIONS if name in {f.name for f in fields(SECTIONS[s])}), None)
            if section is None:
                raise TypeError(f"no smoke option {name!r}")
            setattr(getattr(opts, section), name, value)
        return opts

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> SmokeOptions:
        data = json.loads(text)
        data["train"]["loader"] = LoaderSettings(**data["train"].get("loader", {}))
        return cls(**{name: SECTIONS[name](**data[name]) for name in SECTIONS})


def add_flags(p: argparse.ArgumentParser) -> None:
    """Every section's flags, in the sections' and fields' order; a figure's floor where `parts` stands."""
    for section in SECTIONS.values():
        _add_fields(p, section)


def _add_fields(p: argparse.ArgumentParser, section: type) -> None:
    for f in fields(section):
        meta: dict[str, Any] = dict(f.metadata)
        if "flags_of" in meta:
            _add_fields(p, meta["flags_of"])
        elif "figure_floors" in meta:
            for floor in figures.floors():
                p.add_argument(
                    floor.flag, dest=floor.option, type=types.positive_float, metavar=floor.metavar, help=floor.help
                )
        elif "flag" in meta:
            spelling = meta.pop("flag")
            if f.default is not None and not meta.get("action"):  # store_true's own default is False
                meta["default"] = f.default
            p.add_argument(spelling, dest=f.name, **meta)


def from_args(args: argparse.Namespace) -> SmokeOptions:
    """The options the parsed flags give (the loader's settings merged with --config's); cli.run loads --baseline."""
    _refuse_opposites(args)
    opts = SmokeOptions(
        train=_section(TrainOptions, args),
        floors=_section(FloorOptions, args, parts={f.option: getattr(args, f.option) for f in figures.floors()}),
        measure=_section(MeasureOptions, args),
        output=_section(OutputOptions, args),
    )
    opts.train.loader = _loader(args)
    _refuse_unwritable(opts)
    return opts


def _section(section: type, args: argparse.Namespace, **more: Any) -> Any:
    return section(**{name: getattr(args, name) for name in _flag_names(section)}, **more)


def _flag_names(section: type) -> list[str]:
    return [f.name for f in fields(section) if "flag" in f.metadata]


def _refuse_opposites(args: argparse.Namespace) -> None:
    if args.quick and args.deep:
        raise OptionsError("--quick and --deep ask for opposite things: a short run, and every pair of ranks")
    if args.quick and args.soak:
        raise OptionsError("--quick and --soak ask for opposite things: a short run, and minutes of measurements")
    if args.soak and args.timeout is not None and args.timeout <= args.soak:
        raise OptionsError(f"--timeout {args.timeout:g} s leaves no time for --soak {args.soak:g} s and the run itself")
    if args.warmup is not None and args.steps is not None and args.warmup > args.steps - 3:
        raise OptionsError(f"--warmup {args.warmup} leaves fewer than 3 of --steps {args.steps} to measure")


def _loader(args: argparse.Namespace) -> LoaderSettings:
    """The DataLoader settings: the flags, over --config's."""
    flags = {name: getattr(args, name) for name in _flag_names(LoaderSettings)}
    loader_config = None
    if args.config_path:
        from gpudoctor.readers.trainconfig import ConfigError, load_config

        given = frozenset(name for name, value in flags.items() if value is not None)
        try:
            loader_config = loader_from_config(load_config(args.config_path), args.config_path, given)
        except ConfigError as e:
            raise OptionsError(str(e)) from None
    return merge_loader(loader_config or LoaderSettings(), flags)


def _refuse_unwritable(opts: SmokeOptions) -> None:
    import os

    for spelling, path in (("--save-baseline", opts.measure.save_baseline), ("--prometheus", opts.output.prometheus)):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise OptionsError(f"{spelling} {path}: no such directory")
        if path and os.path.isdir(path):
            raise OptionsError(f"{spelling} {path}: a directory, not a file")


def loader_from_config(config: dict, path: str, overridden: frozenset = frozenset()) -> LoaderSettings:
    """The training dataloader's settings, wherever the config keeps them (gpudoctor.readers.dlconfig finds them).
    overridden: settings a flag gives, whose config value (even an unreadable one) does not matter."""
    import os

    from gpudoctor.readers import dlconfig

    found = dlconfig.find_settings(config, path, env=dict(os.environ))
    loader = LoaderSettings()
    for name in LOADER_SETTINGS:
        f = found.found.get(name)
        if f is None or name in overridden:
            continue
        if f.problem:
            flag = f" (pass --{name.replace('_', '-')} to choose it)" if name != "drop_last" else ""
            raise OptionsError(f"--config {path}: {f.path}: {f.problem}{flag}")
        low = 0 if name == "num_workers" else 1
        if isinstance(f.value, int) and not isinstance(f.value, bool) and f.value < low:
            raise OptionsError(f"--config {path}: {f.path}: {name} must be at least {low}, got {f.value}")
        setattr(loader, name, f.value)
        loader.source[name] = f"config:{f.path}"
    return loader


def merge_loader(from_config: LoaderSettings, flags: dict) -> LoaderSettings:
    """Flags win over the config; what neither sets stays None (the worker picks a default)."""
    merged = LoaderSettings(**{k: v for k, v in asdict(from_config).items()})
    for setting, value in flags.items():
        if value is not None:
            setattr(merged, setting, value)
            merged.source[setting] = "--" + setting.replace("_", "-")
    if merged.num_workers == 0:
        # torch's DataLoader raises ValueError for these without worker processes.
        if merged.prefetch_factor is not None:
            raise OptionsError(f"prefetch_factor={merged.prefetch_factor} needs num_workers > 0 ({_origin(merged)})")
        if merged.persistent_workers:
            raise OptionsError(f"persistent_workers=true needs num_workers > 0 ({_origin(merged)})")
    return merged


def _origin(loader: LoaderSettings) -> str:
    return "num_workers from " + loader.source.get("num_workers", "default")
