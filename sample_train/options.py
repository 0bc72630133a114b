"""The smoke run's settings: flags, the user's training config, and defaults (no torch)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

LOADER_SETTINGS = ("num_workers", "batch_size", "pin_memory", "persistent_workers", "prefetch_factor", "drop_last")


class OptionsError(ValueError):
    """Bad flag values or config contents: one line, exit 2."""


@dataclass
class LoaderSettings:
    num_workers: int | None = None
    batch_size: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    prefetch_factor: int | None = None
    drop_last: bool | None = None
    source: dict = field(default_factory=dict)  # setting -> "--flag" | "config:<path>" | "default"


@dataclass
class SmokeOptions:
    device: str = "auto"  # auto | cuda | cpu
    nprocs: int | None = None  # --gpus: local ranks to spawn
    size: str = "auto"  # auto | tiny | small | medium | large
    precision: str = "auto"  # auto | bf16 | fp16 | fp32
    steps: int | None = None
    warmup: int | None = None
    seq_len: int | None = None
    compile: bool = False
    timeout: float | None = None
    min_mfu: float | None = None
    min_tokens_per_s: float | None = None
    min_busbw_gbps: float | None = None  # --min-busbw: all-reduce bus bandwidth floor, GB/s
    peak_tflops: float | None = None
    min_scaling: float | None = None  # --min-scaling: own compute time / synchronised step time
    min_matmul_tflops: float | None = None  # per rank, the square matmul
    min_membw_gbps: float | None = None  # per rank, device memory copy
    min_hostbw_gbps: float | None = None  # per rank, pinned host<->device, each direction
    min_linkbw_gbps: float | None = None  # per node pair, send/recv each direction
    deep: bool = False  # every node pair, and the GPU pairs inside each node
    quick: bool = False  # node qualification in seconds: a small model, few steps, shorter benchmarks
    soak: float | None = None  # --soak: seconds of repeated part measurements after training (sustained speed)
    save_baseline: str | None = None
    baseline: dict | None = None  # the loaded --baseline file (sample_train/judge/baseline.py)
    baseline_path: str | None = None
    prometheus: str | None = None  # node_exporter textfile to write the figures to
    seed: int = 1234
    json: bool = False
    loader: LoaderSettings = field(default_factory=LoaderSettings)
    config_path: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> SmokeOptions:
        data = json.loads(text)
        data["loader"] = LoaderSettings(**data.get("loader", {}))
        return cls(**data)


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
