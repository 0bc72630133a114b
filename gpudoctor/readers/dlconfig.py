"""Dataloader settings found in a parsed training config, with the dotted path each came from.

Training configs spell the same DataLoader arguments many ways:
- plain keys (`num_workers: 8`) or nested ones: `dataloader.num_workers`, Hydra/navsim
  `dataloader.params.num_workers`, Lightning CLI `data.init_args.num_workers`,
  `train_dataloader.num_workers`, `data.train.loader.num_workers`;
- Hugging Face TrainingArguments: `dataloader_num_workers`, `dataloader_pin_memory`,
  `dataloader_persistent_workers`, `dataloader_prefetch_factor`, `dataloader_drop_last`,
  `per_device_train_batch_size`;
- DeepSpeed: `train_micro_batch_size_per_gpu` (per rank) and `train_batch_size` (global);
  Megatron/NeMo: `micro_batch_size` and `global_batch_size`; `batch_size_per_gpu`, ...
- MMDetection 2.x `data.samples_per_gpu` / `data.workers_per_gpu`; detectron2's upper-case
  `DATALOADER.NUM_WORKERS` and `SOLVER.IMS_PER_BATCH` (the batch across all machines);
  llm-foundry's `global_train_batch_size`;
- loaders in a list, their role given by a value (`- {split: val, num_workers: 0}`).

Every DataLoader argument in a config is per rank: each training process builds its own
DataLoader, so `num_workers: 16` on 8 GPUs is 128 worker processes.

Where a setting appears several times, a loader section's wins over a loose key, and
validation/test loaders never count (a setting only they state stays unknown). Simple interpolations are resolved:
`${data.workers}`, `${.workers}` and `${oc.env:NAME,default}` (from the environment given).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from gpudoctor.readers.ints import whole_number

INT_SETTINGS = {
    "num_workers": (
        "num_workers",
        "dataloader_num_workers",
        "workers",
        "n_workers",
        "num_data_workers",
        "loader_workers",
        "workers_per_gpu",
    ),
    "prefetch_factor": ("prefetch_factor", "dataloader_prefetch_factor"),
    "batch_size": (
        "batch_size",
        "per_device_train_batch_size",
        "train_micro_batch_size_per_gpu",
        "micro_batch_size",
        "batch_size_per_gpu",
        "batch_size_per_device",
        "per_gpu_train_batch_size",
        "train_batch_size_per_gpu",
        "samples_per_gpu",
    ),
    # ims_per_batch: detectron2's SOLVER.IMS_PER_BATCH, images per step across all machines
    "global_batch_size": (
        "global_batch_size",
        "effective_batch_size",
        "total_batch_size",
        "total_train_batch_size",
        "global_train_batch_size",
        "ims_per_batch",
    ),
    "gradient_accumulation_steps": (
        "gradient_accumulation_steps",
        "accumulate_grad_batches",
        "grad_accum_steps",
        "gradient_accumulation",
    ),
    "tensor_parallel": ("tensor_model_parallel_size", "tensor_parallel_size"),
    "pipeline_parallel": ("pipeline_model_parallel_size", "pipeline_parallel_size"),
    "context_parallel": ("context_parallel_size",),
}
BOOL_SETTINGS = {
    "pin_memory": ("pin_memory", "dataloader_pin_memory", "pin_mem"),
    "persistent_workers": ("persistent_workers", "dataloader_persistent_workers"),
    "drop_last": ("drop_last", "dataloader_drop_last"),
}
TEXT_SETTINGS = {"sampler": ("sampler", "sampler_class")}

# DeepSpeed's train_batch_size is the global batch; elsewhere (diffusers scripts) it is per device.
DEEPSPEED_MARKERS = ("train_micro_batch_size_per_gpu", "zero_optimization", "gradient_accumulation_steps")

# Sections whose num_workers/batch_size are not the training DataLoader's: Ray's ScalingConfig
# (num_workers = training processes), web servers, hyper-parameter search spaces.
_OTHER_WORKERS = re.compile(r"scaling|(^|_)ray(_|$)|server|serving|deploy|uvicorn|gunicorn|optuna|sweep|search_space")
# Aliases too generic to trust outside the top level or a data/loader/train section.
_AMBIGUOUS = ("workers", "n_workers")

_EVAL = re.compile(
    r"(^|[_\-.])(val|valid|validation|dev|test|testing|eval|evaluation|predict|prediction|inference|infer)([_\-.]|$)"
)
_INTERP = re.compile(r"^\$\{\s*([^{}]+?)\s*\}$")
# Values the framework fills in itself: DeepSpeed's "auto" (from the HF Trainer / accelerate).
AUTO = "auto"


@dataclass(frozen=True)
class Found:
    """One setting: its value (None when it cannot be read) and where it was found."""

    name: str
    value: Any
    path: str
    raw: Any = None
    problem: str | None = None  # why value is None although the key is there
    also: tuple[str, ...] = ()  # other places that set it
    set_by: str | None = None  # the launch-line override that gives the value ("launch line 6: data.num_workers=2")


@dataclass
class LoaderSettings:
    source: str  # the config file, or 'DataLoader object'
    found: dict[str, Found] = field(default_factory=dict)
    live: bool = False  # read from a DataLoader object: every argument, defaults included
    frameworks: frozenset[str] = frozenset()  # what the config's shape shows: see detect_frameworks
    # What the framework uses when the config leaves a key out (HF TrainingArguments' defaults):
    # only for rules that hold whatever the user meant, never to judge a setting they did not write.
    defaults: dict[str, Found] = field(default_factory=dict)

    def value(self, name: str):
        f = self.found.get(name)
        return None if f is None else f.value

    def effective(self, name: str) -> Found | None:
        """The stated setting, else the framework's default for it (None when neither is known)."""
        f = self.found.get(name)
        if f is not None and (f.value is not None or f.problem):
            return f
        return self.defaults.get(name) or f

    def is_auto(self, name: str) -> bool:
        f = self.found.get(name)
        return f is not None and isinstance(f.raw, str) and f.raw.strip().lower() == AUTO

    def unknown(self, name: str) -> str:
        """Why the setting has no usable value, for a skip message."""
        f = self.found.get(name)
        if f is None:
            return f"{name} is not stated in {self.source}"
        if f.problem:
            return f"{f.path}={f.raw!r} cannot be judged here: {f.problem}"
        return f"{f.path} is null in {self.source}: the framework's default applies"

    def workers_unknown(self) -> str | None:
        """Why num_workers is no count to judge (not stated, or negative), for a skip message; None when it is."""
        workers = self.value("num_workers")
        if workers is None:
            return self.unknown("num_workers")
        if workers < 0:
            return (
                f"{self.describe('num_workers')} is negative: torch.utils.data.DataLoader rejects it (see GD-DL-008); "
                "code that reads it as 'all CPUs' picks the count itself, which is known only when the job runs"
            )
        return None

    def where(self, name: str) -> str | None:
        f = self.found.get(name)
        return None if f is None else f.path

    def describe(self, name: str) -> str:
        """The setting as the config writes it: 'num_workers=16 (dataloader.params.num_workers)'."""
        f = self.found.get(name)
        if f is None:
            return f"{name} not set"
        shown = f.value if f.problem is None else f.raw
        key = f.path.rsplit(".", 1)[-1]
        if f.set_by:
            return f"{key}={shown} ({f.set_by}, over {self.source})"
        return f"{key}={shown}" if key == f.path else f"{key}={shown} ({f.path})"

    def evidence(self) -> dict:
        out: dict[str, Any] = {"source": self.source}
        for name, f in sorted(self.found.items()):
            out[name] = {"value": f.value if f.problem is None else f.raw, "path": f.path}
            if f.problem:
                out[name]["problem"] = f.problem
            if f.also:
                out[name]["also_at"] = list(f.also)
            if f.set_by:
                out[name]["set_by"] = f.set_by
        return out


def _walk(root):
    """Every key of the config, depth first in the file's order: (path, key, value, the mapping holding it). A
    stack of iterators, not nested generators: through `yield from` each key passed up every level above it,
    so a config nested n deep cost n^2 steps."""
    stack: list[tuple[tuple[str, ...], Any]] = [((), _entries(root))]
    while stack:
        path, entries = stack[-1]
        for key, value, parent in entries:
            here = path + (str(key),)
            if parent is not None:
                yield here, key, value, parent
            stack.append((here, _entries(value)))
            break
        else:
            stack.pop()


def _entries(node):
    """(key, value, the mapping) for a mapping's items; (index, item, None) for a list's; nothing for a scalar."""
    if isinstance(node, dict):
        return ((k, v, node) for k, v in node.items())
    if isinstance(node, list):
        return ((i, v, None) for i, v in enumerate(node))
    return iter(())


def _lookup(config: dict, dotted: str):
    node: Any = config
    for part in dotted.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise KeyError(dotted)
    return node


def _resolve(value, path: tuple, config: dict, env: dict, depth: int = 0):
    """Resolve a whole-value ${...} interpolation; returns (value, problem)."""
    if not isinstance(value, str) or depth > 5:
        return value, None
    m = _INTERP.match(value.strip())
    if not m:
        return value, None
    expr = m.group(1)
    if expr.startswith(("oc.env:", "env:")):
        name, _, default = expr.split(":", 1)[1].partition(",")
        name, default = name.strip(), default.strip().strip("'\"")
        from gpudoctor.redact import is_credential_name

        if is_credential_name(name):  # a secret is never a loader setting, and never read into a report
            return None, f"{value[:200]} reads a credential from the environment; gpudoctor does not evaluate it"
        if name in env:
            return env[name], None
        return (default, None) if default else (None, f"{value} is unset in this environment")
    if ":" in expr:
        return None, f"{value} is a resolver gpudoctor does not evaluate (its value is known only when the job runs)"
    if expr.startswith("."):
        base = list(path[:-1])
        rel = expr[1:]
        while rel.startswith("."):
            base, rel = base[:-1], rel[1:]
        expr = ".".join(base + [rel])
    try:
        target = _lookup(config, expr)
    except KeyError:
        return None, f"{value} points at a key that is not in the config"
    return _resolve(target, tuple(expr.split(".")), config, env, depth + 1)


def _short(v, limit: int = 80) -> str:
    """repr(v), cut short: a pasted blob must not flood the report."""
    text = repr(v)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def _as_bool(v):
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
        return v.strip().lower() in ("true", "yes", "on", "1")
    return None


def _as_text(v):
    if isinstance(v, dict):
        for key in ("_target_", "class_path", "type", "name"):
            if isinstance(v.get(key), str):
                return v[key]
        return None
    return v if isinstance(v, str) else None


def _score(path: tuple) -> tuple:
    """Higher is a better match for the training DataLoader; shorter paths win ties.

    A train section beats a shared one (`train: {<<: *defaults, num_workers: 12}` over the
    anchor's `loader_defaults.num_workers`); then loader/data sections beat loose keys.
    """
    parents = [p.lower() for p in path[:-1]]
    train = any("train" in p for p in parents)
    loader = any("loader" in p for p in parents)
    data = any("data" in p for p in parents)
    canonical = 1 if path[-1] in (*INT_SETTINGS, *BOOL_SETTINGS, *TEXT_SETTINGS) else 0
    return (train, 2 * loader + data, canonical, -len(path))


def _is_eval(path: tuple) -> bool:
    return any(_EVAL.search(p.lower()) for p in path[:-1])


def _not_a_loader(path: tuple) -> bool:
    parents = [p.lower() for p in path[:-1]]
    if any(_OTHER_WORKERS.search(p) for p in parents):
        return True
    if path[-1] in _AMBIGUOUS and parents:
        return not any(w in p for p in parents for w in ("data", "loader", "train"))
    return False


_SPLIT_KEYS = ("split", "phase", "stage", "mode")


def _candidates(config: dict):
    aliases: dict[str, str] = {}  # a config key -> the setting it spells
    for table in (INT_SETTINGS, BOOL_SETTINGS, TEXT_SETTINGS):
        for setting, keys in table.items():
            for key in keys:
                aliases[key] = setting
    for path, key, value, parent in _walk(config):
        if not isinstance(key, str):
            continue
        name = aliases.get(key) or aliases.get(key.lower())  # detectron2's CfgNode keys are upper case
        if key == "train_batch_size" and any(m in parent for m in DEEPSPEED_MARKERS):
            name = "global_batch_size"
        if name is not None:
            yield name, path, value, _role_path(path, parent)


def _role_path(path: tuple, parent: dict) -> tuple:
    """The path to judge a key by: `- {split: val, num_workers: 0}` names the loader's role in a value."""
    split = next((parent[k] for k in _SPLIT_KEYS if isinstance(parent.get(k), str)), None)
    return path if split is None else path[:-1] + (split, path[-1])


def _read(name: str, path: tuple, raw, config: dict, env: dict) -> Found:
    value, problem = _resolve(raw, path, config, env)
    if problem is None and isinstance(value, str) and "${" in value:
        shown = raw if value is not raw and isinstance(raw, str) else value  # not what an ${oc.env:...} gave
        problem = (
            f"{shown[:200]} is an interpolation gpudoctor does not evaluate (its value is known only when the job runs)"
        )
        value = None
    if problem is None and isinstance(value, str) and value.strip().lower() == AUTO:
        problem = "'auto': the framework chooses the value when the job starts"
        value = None
    if problem is None:
        if name in BOOL_SETTINGS:
            conv = _as_bool(value)
        elif name in TEXT_SETTINGS:
            conv = _as_text(value)
        else:
            conv = whole_number(value)
        if conv is None and value is not None:
            kind = "boolean" if name in BOOL_SETTINGS else "number" if name in INT_SETTINGS else "class name"
            if value is not raw:  # resolved from an interpolation (${oc.env:HF_TOKEN}): never quote what it gave
                problem = f"{_short(raw)} does not give a {kind}"
            else:
                problem = f"{_short(value)} is not a {kind}"
        value = conv
    return Found(name, value, ".".join(path), raw=raw, problem=problem)


# Hugging Face TrainingArguments' defaults for what the Trainer passes to DataLoader.
HF_DEFAULTS = {
    "num_workers": ("dataloader_num_workers", 0),
    "pin_memory": ("dataloader_pin_memory", True),
    "persistent_workers": ("dataloader_persistent_workers", False),
}
_HF_KEYS = (
    "per_device_train_batch_size",
    "dataloader_num_workers",
    "dataloader_pin_memory",
    "dataloader_persistent_workers",
    "dataloader_prefetch_factor",
    "dataloader_drop_last",
)
_LIGHTNING_TRAINER_KEYS = ("devices", "strategy", "accelerator", "num_nodes", "max_epochs", "precision")


def detect_frameworks(config: dict) -> frozenset[str]:
    """Frameworks whose config shape this is: huggingface, deepspeed, megatron, lightning, mmengine."""
    found = set()
    keys = {path[-1] for path, _, _, _ in _walk(config)}
    if keys & set(_HF_KEYS):
        found.add("huggingface")
    if "train_micro_batch_size_per_gpu" in keys or "zero_optimization" in keys:
        found.add("deepspeed")
    if {"micro_batch_size", "global_batch_size"} <= keys:
        found.add("megatron")
    trainer = config.get("trainer")
    if (isinstance(trainer, dict) and any(k in trainer for k in _LIGHTNING_TRAINER_KEYS)) or "class_path" in keys:
        found.add("lightning")
    loader = config.get("train_dataloader")
    sampler = loader.get("sampler") if isinstance(loader, dict) else None
    if "default_scope" in config or (isinstance(sampler, dict) and "type" in sampler):
        found.add("mmengine")
    return frozenset(found)


def _framework_defaults(frameworks: frozenset[str]) -> dict[str, Found]:
    if "huggingface" not in frameworks:
        return {}
    return {name: Found(name, value, key, raw=value) for name, (key, value) in HF_DEFAULTS.items()}


def find_settings(
    config: dict | None, source: str = "config", env: dict | None = None, overrides=None
) -> LoaderSettings:
    """The dataloader settings a training config states (none are invented: unset stays unset).

    overrides (readers/overrides.LaunchOverrides): config is already the one they make; a setting one of them
    gives says so (set_by), and one a program flag may set (`--num_workers 2`) is unknown."""
    settings = LoaderSettings(source=source)
    if not config:
        return settings
    settings.frameworks = detect_frameworks(config)
    settings.defaults = _framework_defaults(settings.frameworks)
    env = env or {}
    by_name: dict[str, list] = {}
    for name, path, raw, role in _candidates(config):
        if (isinstance(raw, (dict, list)) and name not in TEXT_SETTINGS) or _not_a_loader(role):
            continue
        by_name.setdefault(name, []).append((path, raw, role))
    for name, items in by_name.items():
        train_side = [it for it in items if not _is_eval(it[2])]
        if not train_side:  # only validation/test loaders set it: the training loader's value is unknown
            continue
        best = max(train_side, key=lambda it: _score(it[2]))
        found = _read(name, best[0], best[1], config, env)
        others = tuple(".".join(p) for p, _, _ in items if p != best[0])
        settings.found[name] = _overridden(
            Found(found.name, found.value, found.path, found.raw, found.problem, others), overrides, config
        )
    return settings


def _overridden(found: Found, overrides, config: dict) -> Found:
    """The setting as the launch line leaves it: given by a known override, or unknown under a program flag."""
    if not overrides:
        return found
    from dataclasses import replace

    flag = overrides.opaque(found.path)
    if flag is not None:
        return replace(
            found,
            value=None,
            problem=(
                f"{overrides.where()} passes `{flag.written}` to the program: whether it sets {found.path} from that "
                "option is in the program's code, so the value the job runs with is not known"
            ),
        )
    group = overrides.group_choice(found.path, config)
    if group is not None:
        return replace(
            found,
            value=None,
            problem=(
                f"{overrides.where()} picks the config group `{group.written}`: {found.path} comes from that group's "
                "file, not the config given"
            ),
        )
    override = overrides.setting(found.path, config)
    if override is None:
        return found
    if not override.known:
        return replace(
            found,
            value=None,
            raw=override.raw,
            problem=f"{overrides.where()} sets it to `{override.written}`, known only when the job runs",
            set_by=f"{overrides.where()}: {override.written}",
        )
    return replace(found, set_by=f"{overrides.where()}: {override.written}")


def from_context(ctx, env: dict | None = None) -> LoaderSettings | None:
    """The settings of --config (or of a live DataLoader, see gpudoctor.api); None without either."""
    if ctx.config is None:
        return program_settings(ctx)
    if ctx.config_path == LIVE_SOURCE:
        return live_settings(ctx.config)
    return find_settings(ctx.config, ctx.config_path or "config", env, getattr(ctx, "overrides", None))


def program_settings(ctx) -> LoaderSettings | None:
    """The DataLoader(...) literals of the batch script's launched program (readers/program.py), when no config
    is given: `DataLoader(ds, num_workers=10)` is read, not 'not known' (issue 38)."""
    program = getattr(getattr(ctx, "sbatch", None), "program", None)
    loader = getattr(program, "dataloader", None)
    if not loader:
        return None
    first = next(iter(loader.values()))[1]  # "train.py:30: DataLoader(num_workers=10)"
    settings = LoaderSettings(source=first.split(": ", 1)[0])
    for name, (value, _where) in loader.items():
        settings.found[name] = Found(name, value, f"DataLoader.{name}", raw=value)
    return settings


# A DataLoader object read by gpudoctor.audit_dataloader travels in Context.config under this source.
LIVE_SOURCE = "<DataLoader object>"
LIVE_KEY = "DataLoader"


def live_settings(config: dict) -> LoaderSettings:
    values = config.get(LIVE_KEY) or {}
    settings = LoaderSettings(source=LIVE_SOURCE, live=True)
    for name, value in values.items():
        settings.found[name] = Found(name, value, f"DataLoader.{name}", raw=value)
    return settings
