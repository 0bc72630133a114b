"""The training program's own process model, read from its source with Python's `ast` -- never run.

A launch line says how many processes SLURM or a launcher starts; what each of them does with the GPUs
is the program's business. `srun python train.py` with one task on 2 GPUs is right when train.py calls
`torch.multiprocessing.spawn` over the visible GPUs and wrong when it is a single-GPU script, so the
checks ask this reader before they judge (or fix) the number of processes.

    model = read_program(text, "train.py", argv=("--gpu_devices", "0", "1"))
    model.kind        "spawn" | "lightning" | "rank_per_process" | "one_process_many_gpus" | "single" | None
    model.facts       ProgramFact(what, detail, path, line), each construct seen and where
    model.lightning   {"devices": (8, "train.py:40: Trainer(devices=8)"), ...}  literal values only
    model.unknown     why the process model is not known (file absent, unparsable, dynamic)

What is recognised (the APIs' own documentation): torch.multiprocessing.spawn(fn, args, nprocs) and
start_processes start nprocs processes from one (torch.multiprocessing docs); init_process_group and
DistributedDataParallel run one rank per process, the rank coming from the environment (env://: RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT, set by torchrun, not by srun) or from what the program reads
(SLURM_PROCID); nn.DataParallel drives every visible GPU from one process; Lightning's Trainer/Fabric
take devices/num_nodes (defaults "auto" and 1) and read SLURM's task variables themselves
(lightning.fabric.plugins.environments.slurm); accelerate's Accelerator takes its rank from the
launcher's environment (accelerate.state: LOCAL_RANK). Values are taken only when they are literals;
a variable is unknown. Reading is bounded (MAX_PROGRAM_BYTES, local imports one level deep), and a
file that does not parse is "unknown", never an error.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING

from gpudoctor.facts import is_credential_name
from gpudoctor.redact import redact, redact_value

if TYPE_CHECKING:
    from gpudoctor.readers.sbatch.script import BatchScript

MAX_PROGRAM_BYTES = 2 * 2**20  # a training script is kilobytes; a generated 2 MiB file is not read
# Packages that decide the process model themselves (launch ranks, wrap models in DataParallel, spread a
# model over the GPUs): a program that imports one and shows none of the constructs below is not known.
SELF_DRIVING_PACKAGES = frozenset(
    {
        "accelerate",
        "colossalai",
        "composer",
        "deepspeed",
        "detectron2",
        "fairseq",
        "horovod",
        "hydra",  # the real entry point is a config-selected function
        "jax",
        "keras",
        "lightning",
        "megatron",
        "mmengine",
        "nemo",
        "pytorch_lightning",
        "ray",
        "tensorflow",
        "transformers",
        "trl",
    }
)
RANK_FROM_SLURM = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NODEID")
RANK_FROM_LAUNCHER = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
_LIGHTNING_MODULES = ("lightning", "pytorch_lightning", "lightning.pytorch", "lightning.fabric")
_LIGHTNING_KEYS = ("devices", "num_nodes", "strategy", "accelerator", "gpus")
# DataLoader(...) arguments the dataloader checks judge, read where the program writes them as literals
_LOADER_KEYS = ("num_workers", "batch_size", "pin_memory", "persistent_workers", "prefetch_factor")
# Script options that name GPUs: `--gpu_devices 0 1`, `--gpus 0,1`, `--gpu-ids 0 1 2 3`, `--world_size 2`.
_DEVICE_OPTION = re.compile(r"--?(gpu[_-]?devices|gpu[_-]?ids|gpus|devices|n[_-]?gpus|num[_-]?gpus|world[_-]?size)$")


@dataclass(frozen=True)
class ProgramFact:
    """One construct of the program that says how it uses processes and GPUs, and where it is."""

    what: str  # spawn | init_process_group | ddp | data_parallel | lightning | accelerator | device_count | ...
    detail: str  # as written (shortened)
    path: str
    line: int

    def __str__(self) -> str:
        return f"{os.path.basename(self.path)}:{self.line}: {self.detail}"


@dataclass(frozen=True)
class Argparse:
    """The options the program's argparse parser accepts, read from its add_argument calls (argparse docs:
    parse_args exits with 'unrecognized arguments' for any other; a unique prefix of a long option is accepted
    unless allow_abbrev=False). complete False: the parser may accept options not read here."""

    options: frozenset[str]
    abbrev: bool = True
    complete: bool = False
    why_incomplete: str = ""
    where: str = ""  # 'train.py:12' of parse_args


class _CliReading:
    """argparse as one module builds it: ArgumentParser(...), add_argument(*flags), parse_args()."""

    def __init__(self) -> None:
        self.options: set[str] = set()
        self.parsers: set[str] = set()  # names bound to ArgumentParser(...)
        self.abbrev = True
        self.parses = ""  # where parse_args() is called
        self.incomplete: list[str] = []

    def read(self, reader: _Reader, node: ast.Call, name: str, last: str, kwargs: dict) -> None:
        if name == "argparse.ArgumentParser":
            if "parents" in kwargs:
                self.incomplete.append("its parser takes parents= parsers")
            if _literal(kwargs["allow_abbrev"]) is False if "allow_abbrev" in kwargs else False:
                self.abbrev = False
            return
        if not isinstance(node.func, ast.Attribute):
            if (
                any(isinstance(a, ast.Name) and a.id in self.parsers for a in node.args)
                and last not in reader.functions
            ):
                self.incomplete.append(f"its parser is given to {name or 'a function'}, which may add options")
            return
        method = node.func.attr
        if method == "add_argument":
            flags = [_literal(a) for a in node.args]
            if any(not isinstance(f, str) for f in flags):
                self.incomplete.append(f"an add_argument() call names its options at run time (line {node.lineno})")
            self.options.update(f for f in flags if isinstance(f, str) and f.startswith("-"))
        elif method in ("add_subparsers", "parse_known_args", "parse_intermixed_args"):
            self.incomplete.append(f"it calls {method}()")
            if method != "add_subparsers":
                self.parses = self.parses or f"{os.path.basename(reader.path)}:{node.lineno}"
        elif method == "parse_args" and not node.args and "args" not in kwargs:
            self.parses = self.parses or f"{os.path.basename(reader.path)}:{node.lineno}"
        elif method == "parse_args":
            self.incomplete.append("parse_args() is given its own argument list")
        if any(isinstance(a, ast.Name) and a.id in self.parsers for a in node.args) and method not in _PARSER_METHODS:
            self.incomplete.append(f"its parser is given to .{method}(), which may add options")


_PARSER_METHODS = frozenset({"add_argument", "parse_args", "add_argument_group", "add_mutually_exclusive_group"})
# Command-line libraries whose options are not argparse's add_argument calls in the program's own source.
_OTHER_CLIS = frozenset(
    {"click", "typer", "fire", "hydra", "jsonargparse", "simple_parsing", "tyro", "absl", "omegaconf"}
)


@dataclass(frozen=True)
class ProgramModel:
    path: str | None  # the file read; None when none was found
    kind: str | None = None  # see the module docstring; None: not known
    facts: tuple[ProgramFact, ...] = ()
    unknown: str | None = None  # why kind is None
    processes: int | str | None = None  # spawn: processes one launch starts (an int, "visible GPUs", or None)
    rank_source: str | None = None  # rank_per_process: "SLURM" | "launcher" (torchrun/accelerate env)
    lightning: Mapping[str, tuple] = field(default_factory=lambda: MappingProxyType({}))
    lightning_cli: bool = False  # LightningCLI: Trainer arguments come from the command line / config
    # DataLoader(...) literals: {"num_workers": (10, "train.py:30: DataLoader(num_workers=10)")}, first call's
    dataloader: Mapping[str, tuple] = field(default_factory=lambda: MappingProxyType({}))
    imports: frozenset[str] = frozenset()  # top-level packages imported
    env_sets: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # os.environ[K] = "v"
    env_reads: frozenset[str] = frozenset()  # variables it reads (os.environ[K], .get, os.getenv)
    device_args: tuple[str, ...] = ()  # GPU-naming options on its argv, as written
    env_order: tuple[str, ...] = ()  # the variables it reads, in the order they first appear in its source
    passes_rank: bool = False  # init_process_group(rank=...) or RANK set from SLURM's: not torchrun's RANK
    init_method: str | None = None  # a literal init_process_group(init_method="tcp://HOST:PORT")
    argparse: Argparse | None = None  # the options its argparse parser accepts; None: it parses none we read

    def prefers(self, *names: str) -> str | None:
        """Of these variables, the one the program reads first (`os.environ.get("SLURM_PROCID",
        os.environ.get("RANK"))` prefers SLURM_PROCID); None when it reads none of them."""
        return next((n for n in self.env_order if n in names), None)

    @property
    def known(self) -> bool:
        return self.kind is not None

    @property
    def reads_task_variables(self) -> bool:
        """It reads which SLURM task (or array task) it is: copies under srun can differ on purpose."""
        return any(v in self.env_reads for v in (*RANK_FROM_SLURM, "SLURM_ARRAY_TASK_ID", *RANK_FROM_LAUNCHER))

    def where(self, *whats: str) -> str:
        """'train.py:12: mp.spawn(...)' for the first fact of these kinds ('' when none)."""
        fact = next((f for f in self.facts if f.what in whats), None)
        return str(fact) if fact else ""

    def describe(self) -> str:
        """One phrase for messages and evidence."""
        name = os.path.basename(self.path) if self.path else "the program"
        if not self.known:
            return f"{name}: process model not known ({self.unknown})" if self.path else str(self.unknown)
        if self.kind == "spawn":
            count = {None: "an unknown number of process(es)", "visible GPUs": "one process per visible GPU"}.get(
                self.processes if isinstance(self.processes, str | None) else "", f"{self.processes} process(es)"
            )
            return f"{name} starts {count} itself ({self.where('spawn')})"
        if self.kind == "lightning":
            return f"{name} is a Lightning program ({self.where('lightning')})"
        if self.kind == "rank_per_process":
            src = "SLURM's task variables" if self.rank_source == "SLURM" else "the launcher's RANK/LOCAL_RANK"
            return (
                f"{name} runs one rank per process, its rank from {src} "
                f"({self.where('init_process_group', 'ddp', 'accelerator')})"
            )
        if self.kind == "one_process_many_gpus":
            return f"{name} drives every visible GPU from one process ({self.where('data_parallel', 'hf_trainer')})"
        return f"{name} is a one-process program: no process spawning, distributed or multi-GPU construct in it"

    def evidence(self) -> dict:
        out: dict = {"program": self.describe()}
        if self.facts:
            out["program facts"] = [str(f) for f in self.facts[:8]]
        if self.device_args:
            out["program GPU arguments"] = " ".join(self.device_args)
        return out


def unknown_program(path: str | None, why: str) -> ProgramModel:
    return ProgramModel(path, None, unknown=why)


# ---------------------------------------------------------------- reading one file


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _literal(node: ast.AST):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _UNKNOWN


class _Unknown:
    def __repr__(self) -> str:
        return "<not a literal>"


_UNKNOWN = _Unknown()


def _short(node: ast.AST, limit: int = 90) -> str:
    """The construct as written, as gpudoctor may quote it: the one redaction rule (gpudoctor/redact.redact:
    `api_key='...'`, URL userinfo `tcp://u:pw@h`, `hf_...`/`AKIA...` tokens) applied to the whole text before
    it is shortened, so a cut can never leave half a secret that the rule no longer recognises."""
    try:
        text = ast.unparse(node)
    except (ValueError, RecursionError):  # pragma: no cover - unparse of a parsed tree
        text = type(node).__name__
    text = redact(re.sub(r"\s+", " ", text))
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Reader(ast.NodeVisitor):
    """Collects the constructs of one module; names resolved through its imports."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.aliases: dict[str, str] = {}  # local name -> dotted origin
        self.facts: list[ProgramFact] = []
        self.imports: set[str] = set()
        self.local_imports: list[tuple[str, int]] = []  # (module as written, level)
        self.env_reads: set[str] = set()
        self.env_first: dict[str, tuple[int, int]] = {}  # name -> (line, column) where it is first read
        self.env_sets: dict[str, str] = {}
        self.assigned: dict[str, ast.AST] = {}  # simple `name = expr` at any level (last wins)
        self.spawn_counts: list[ast.AST | None] = []
        self.lightning: dict[str, tuple] = {}
        self.lightning_args: dict[str, str] = {}  # Trainer key -> the argparse dest it is given (args.nodes)
        self.dataloader: dict[str, tuple] = {}  # DataLoader(...) literal arguments of the first call
        self.arg_defaults: dict[str, object] = {}  # argparse dest -> its literal default (add_argument)
        self.lightning_cli = False
        self.passes_rank = False
        self.init_method: str | None = None
        self.cli = _CliReading()
        self.functions: set[str] = set()

    def fact(self, what: str, node: ast.AST) -> None:
        # shown as evidence: a literal api_key=... in the call is never echoed
        self.facts.append(ProgramFact(what, _short(node), self.path, getattr(node, "lineno", 0)))

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self.imports.add(a.name.split(".")[0])
            self.local_imports.append((a.name, 0))
            if a.asname:
                self.aliases[a.asname] = a.name
            else:
                self.aliases.setdefault(a.name.split(".")[0], a.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level == 0 and module:
            self.imports.add(module.split(".")[0])
        self.local_imports.append((module, node.level))
        for a in node.names:
            self.aliases[a.asname or a.name] = f"{module}.{a.name}" if module else a.name

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            if isinstance(target, ast.Name):
                self.assigned[target.id] = node.value
                if isinstance(node.value, ast.Call) and self.resolve(node.value.func) == "argparse.ArgumentParser":
                    self.cli.parsers.add(target.id)
            elif isinstance(target, ast.Subscript) and self._environ(target.value):
                key, value = _literal(target.slice), _literal(node.value)
                if key in ("RANK", "WORLD_SIZE", "LOCAL_RANK") and any(
                    isinstance(n, ast.Constant) and n.value in RANK_FROM_SLURM for n in ast.walk(node.value)
                ):  # os.environ["RANK"] = os.environ["SLURM_PROCID"]: env:// then reads SLURM's value
                    self.passes_rank = True
                if isinstance(key, str) and isinstance(value, str) and not is_credential_name(key):
                    self.env_sets[key] = redact_value(value)
        self.generic_visit(node)

    def read_env(self, key: str, node: ast.AST) -> None:
        self.env_reads.add(key)
        where = (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))
        self.env_first[key] = min(self.env_first.get(key, where), where)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if self._environ(node.value):
            key = _literal(node.slice)
            if isinstance(key, str):
                self.read_env(key, node)
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        """`"SLURM_PROCID" in os.environ`: the program asks for the variable (and reads it where it is there)."""
        key = _literal(node.left)
        if isinstance(key, str) and any(self._environ(c) for c in node.comparators):
            self.read_env(key, node)
        self.generic_visit(node)

    def _environ(self, node: ast.AST) -> bool:
        name = self.resolve(node)
        return name in ("os.environ",)

    def resolve(self, node: ast.AST) -> str | None:
        dotted = _dotted(node)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        origin = self.aliases.get(head, head)
        return f"{origin}.{rest}" if rest else origin

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.functions.add(node.name)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Call(self, node: ast.Call) -> None:
        name = self.resolve(node.func) or ""
        last = name.rsplit(".", 1)[-1]
        kwargs = {k.arg: k.value for k in node.keywords if k.arg}
        self.cli.read(self, node, name, last, kwargs)
        if name in ("os.environ.get", "os.getenv", "os.environ.setdefault") and node.args:
            key = _literal(node.args[0])
            if isinstance(key, str):
                self.read_env(key, node)
                if name.endswith("setdefault") and len(node.args) > 1:
                    value = _literal(node.args[1])
                    if isinstance(value, str) and not is_credential_name(key):
                        self.env_sets.setdefault(key, redact_value(value))
        if name.endswith(("multiprocessing.spawn", "multiprocessing.start_processes")) and name.startswith("torch"):
            self.fact("spawn", node)
            self.spawn_counts.append(kwargs.get("nprocs") or (node.args[2] if len(node.args) > 2 else None))
        elif name.endswith("init_process_group") and name.startswith("torch"):
            self.fact("init_process_group", node)
            # init_process_group(backend, init_method, timeout, world_size, rank, ...): a rank given here is the
            # program's own arithmetic; without one, env:// takes RANK (torch.distributed.rendezvous)
            self.passes_rank = self.passes_rank or "rank" in kwargs or len(node.args) > 4
            method = kwargs.get("init_method") or (node.args[1] if len(node.args) > 1 else None)
            url = _literal(method) if method is not None else None
            if isinstance(url, str) and url.startswith("tcp://"):
                self.init_method = self.init_method or url
        elif last == "DistributedDataParallel" and name.startswith("torch"):
            self.fact("ddp", node)
        elif last == "DataParallel" and name.startswith("torch"):
            self.fact("data_parallel", node)
        elif name.endswith("cuda.device_count") and name.startswith("torch"):
            self.fact("device_count", node)
        elif last in ("Trainer", "Fabric") and name.startswith(_LIGHTNING_MODULES):
            self.fact("lightning", node)
            for key in _LIGHTNING_KEYS:
                if key in kwargs:
                    value = _literal(kwargs[key])
                    where = f"{os.path.basename(self.path)}:{node.lineno}: {last}({key}={_short(kwargs[key], 40)})"
                    self.lightning.setdefault(key, (None if value is _UNKNOWN else value, where))
                    given = kwargs[key]
                    if value is _UNKNOWN and isinstance(given, ast.Attribute):  # Trainer(num_nodes=args.nodes)
                        self.lightning_args.setdefault(key, given.attr)
            if any(k.arg is None for k in node.keywords):  # Trainer(**cfg): every argument may be set there
                self.lightning.setdefault("**", (None, f"{os.path.basename(self.path)}:{node.lineno}: {last}(**...)"))
            self.lightning.setdefault("_call", (None, f"{os.path.basename(self.path)}:{node.lineno}"))
        elif last == "DataLoader" and name.startswith("torch") and not self.dataloader:
            for key in _LOADER_KEYS:
                value = _literal(kwargs[key]) if key in kwargs else _UNKNOWN
                if value is not _UNKNOWN:
                    where = f"{os.path.basename(self.path)}:{node.lineno}: DataLoader({key}={_short(kwargs[key], 20)})"
                    self.dataloader[key] = (value, where)
        elif last == "add_argument" and node.args:  # argparse: the dest and literal default of an option
            flags = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            long = next((f for f in flags if f.startswith("--")), flags[0] if flags else "")
            named = kwargs.get("dest")
            dest = named.value if isinstance(named, ast.Constant) else long.lstrip("-")
            default = _literal(kwargs["default"]) if "default" in kwargs else _UNKNOWN
            if dest and default is not _UNKNOWN:
                self.arg_defaults.setdefault(str(dest).replace("-", "_"), default)
        elif last == "LightningCLI" and name.startswith(_LIGHTNING_MODULES):
            self.fact("lightning", node)
            self.lightning_cli = True
        elif last == "Accelerator" and name.startswith("accelerate"):
            self.fact("accelerator", node)
        elif name.startswith("deepspeed") and last == "initialize":
            self.fact("deepspeed_initialize", node)
        elif last in ("Trainer", "SFTTrainer", "Seq2SeqTrainer") and name.startswith(("transformers", "trl")):
            self.fact("hf_trainer", node)
        device_map = kwargs.get("device_map")
        if device_map is not None and _literal(device_map) in ("auto", "balanced", "sequential"):
            self.fact("device_map", node)
        self.generic_visit(node)


def _count(node: ast.AST | None, reader: _Reader, argv: tuple[str, ...], depth: int = 0):
    """spawn's nprocs: an int, 'visible GPUs' (torch.cuda.device_count()), or None (not a literal)."""
    if node is None:
        return 1  # torch.multiprocessing.spawn's default
    value = _literal(node)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(node, ast.Call) and (reader.resolve(node.func) or "").endswith("cuda.device_count"):
        return "visible GPUs"
    if isinstance(node, ast.Name) and depth < 3 and node.id in reader.assigned:
        return _count(reader.assigned[node.id], reader, argv, depth + 1)
    # len(args.gpu_devices) / args.world_size with the option given on the launch line
    inner = node.args[0] if isinstance(node, ast.Call) and _dotted(node.func) == "len" and node.args else None
    attr = inner if inner is not None else node
    if isinstance(attr, ast.Attribute):
        values = _option_values(argv, attr.attr)
        if values is not None:
            if inner is not None:
                return len(values)
            if len(values) == 1 and values[0].isdigit():
                return int(values[0])
    return None


def _resolve_trainer_args(lightning: dict, readers: list, argv: tuple[str, ...]) -> None:
    """A Trainer argument given as `args.X` takes the launch line's --X (argparse's last wins), else the
    add_argument default the program writes; each said with where it came from."""
    defaults: dict = {}
    for r in readers:
        for dest, value in r.arg_defaults.items():
            defaults.setdefault(dest, value)
    for r in readers:
        for key, dest in r.lightning_args.items():
            value, where = lightning.get(key, (None, ""))
            if value is not None:
                continue
            given = _option_values(argv, dest, last=True)
            if given is not None and len(given) == 1 and given[0].isdigit():
                lightning[key] = (int(given[0]), f"{where}, --{dest.replace('_', '-')}={given[0]} on the launch line")
            elif given is None and isinstance(defaults.get(dest), int) and not isinstance(defaults[dest], bool):
                lightning[key] = (defaults[dest], f"{where}, argparse default {defaults[dest]}")


def _option_values(argv: tuple[str, ...], dest: str, last: bool = False) -> list[str] | None:
    """The values of `--dest v1 v2` / `--dest=v` on argv (argparse's dest: '-' read as '_'); last: the last
    time the option is given, as argparse keeps it (default: the first, for a list option's values)."""
    order = list(enumerate(argv))
    for i, word in reversed(order) if last else order:
        name, eq, value = word.partition("=")
        if name.lstrip("-").replace("-", "_") != dest or not name.startswith("-"):
            continue
        if eq:
            return [v for v in value.split(",") if v]
        values = []
        for nxt in argv[i + 1 :]:
            if nxt.startswith("-"):
                break
            values.append(nxt)
        return values
    return None


def _argparse(readers: list[_Reader], imports: frozenset[str]) -> Argparse | None:
    """The argparse parser of the main file, with the options every module read adds to it."""
    main = readers[0].cli
    if not main.parses:
        return None
    incomplete = [w for r in readers for w in r.cli.incomplete]
    other = sorted(imports & (_OTHER_CLIS | SELF_DRIVING_PACKAGES))
    if other:
        incomplete.append(f"it imports {', '.join(other)}, which may parse the command line too")
    return Argparse(
        frozenset(o for r in readers for o in r.cli.options) | {"-h", "--help"},
        abbrev=main.abbrev,
        complete=not incomplete,
        why_incomplete=incomplete[0] if incomplete else "",
        where=main.parses,
    )


def _parse(text: str, path: str) -> tuple[_Reader | None, str | None]:
    if len(text.encode("utf-8", errors="replace")) > MAX_PROGRAM_BYTES:
        return None, f"{os.path.basename(path)} is larger than {MAX_PROGRAM_BYTES // 2**20} MiB: not read"
    try:
        tree = ast.parse(text, filename=path)
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        line = getattr(e, "lineno", None)
        return None, f"{os.path.basename(path)} does not parse as Python" + (f" (line {line})" if line else "")
    reader = _Reader(path)
    try:
        reader.visit(tree)
    except RecursionError:
        return None, f"{os.path.basename(path)} is nested too deeply to read"
    return reader, None


def read_program(
    text: str,
    path: str,
    argv: tuple[str, ...] = (),
    read_local: Callable[[str, int], tuple[str, str] | None] | None = None,
) -> ProgramModel:
    """The process model of the program whose source is text (pure: read_local gives a local module's
    (path, text) for an import (module, level), or None; it is asked one level deep only)."""
    main, why = _parse(text, path)
    if main is None:
        return unknown_program(path, why or "not read")
    readers = [main]
    unread_local = []
    if read_local is not None:
        for module, level in main.local_imports:
            found = read_local(module, level)
            if found is None:
                continue
            sub, sub_why = _parse(found[1], found[0])
            if sub is None:
                unread_local.append(sub_why or found[0])
                continue
            readers.append(sub)
            unread_local.extend(
                m
                for m, lvl in sub.local_imports
                if lvl and m  # relative imports below the first level
            )
    facts = tuple(f for r in readers for f in r.facts)
    imports = frozenset(i for r in readers for i in r.imports)
    env_reads = set().union(*(r.env_reads for r in readers))
    # the main file's reads first, in source order, then each local module's
    env_order = tuple(dict.fromkeys(k for r in readers for k in sorted(r.env_first, key=r.env_first.__getitem__)))
    env_sets = {k: v for r in reversed(readers) for k, v in r.env_sets.items()}
    lightning: dict = {}
    for r in readers:
        for k, v in r.lightning.items():
            lightning.setdefault(k, v)
    _resolve_trainer_args(lightning, readers, argv)
    device_args = tuple(
        f"{w} {' '.join(_option_values(argv, w.lstrip('-').replace('-', '_')) or [])}".strip()
        for w in argv
        if _DEVICE_OPTION.match(w.partition("=")[0]) and "=" not in w
    ) + tuple(w for w in argv if "=" in w and _DEVICE_OPTION.match(w.partition("=")[0]))
    loader = next((r.dataloader for r in readers if r.dataloader), {})
    base = ProgramModel(
        path,
        dataloader=MappingProxyType(dict(loader)),
        facts=facts,
        imports=imports,
        env_sets=MappingProxyType(env_sets),
        env_reads=frozenset(env_reads),
        device_args=device_args,
        env_order=env_order,
        passes_rank=any(r.passes_rank for r in readers),
        init_method=next((r.init_method for r in readers if r.init_method), None),
        argparse=_argparse(readers, imports),
    )
    whats = {f.what for f in facts}
    if "spawn" in whats:
        counts = [_count(n, r, argv) for r in readers for n in r.spawn_counts]
        processes = counts[0] if len(set(map(str, counts))) == 1 else None
        return replace(base, kind="spawn", processes=processes)
    if "lightning" in whats:
        return replace(
            base,
            kind="lightning",
            lightning=MappingProxyType(lightning),
            lightning_cli=any(r.lightning_cli for r in readers),
        )
    if whats & {"init_process_group", "ddp", "accelerator", "deepspeed_initialize"}:
        from_slurm = any(n in env_reads for n in RANK_FROM_SLURM[:2])
        return replace(base, kind="rank_per_process", rank_source="SLURM" if from_slurm else "launcher")
    if whats & {"data_parallel", "hf_trainer", "device_map"}:
        return replace(base, kind="one_process_many_gpus")
    driving = sorted(imports & SELF_DRIVING_PACKAGES)
    if driving:
        return replace(
            base, unknown=f"it imports {', '.join(driving)}, which may start processes or use several GPUs itself"
        )
    if unread_local:
        return replace(base, unknown=f"its local imports go deeper than one level ({unread_local[0]})")
    return replace(base, kind="single")


# ---------------------------------------------------------------- finding the file (I/O, bounded)


def _read_text(path: str) -> str | None:
    from gpudoctor.fileio import FileIOError, read_input

    try:
        return read_input(path, "", MAX_PROGRAM_BYTES + 1, errors="replace")
    except (FileIOError, OSError, ValueError):
        return None


def program_candidates(entry: str, bases: list[str]) -> list[str]:
    """Where `python entry` finds its file from each base directory (absolute entries as they are)."""
    if os.path.isabs(entry):
        return [entry]
    return [os.path.normpath(os.path.join(b, entry)) for b in bases]


def module_candidates(module: str, bases: list[str]) -> list[str]:
    """`python -m pkg.mod`: pkg/mod.py or pkg/mod/__main__.py under each base."""
    rel = module.replace(".", os.sep)
    return [os.path.join(b, rel + ".py") for b in bases] + [os.path.join(b, rel, "__main__.py") for b in bases]


def load_program(entry: str | None, module: str | None, bases: list[str], argv: tuple[str, ...] = ()) -> ProgramModel:
    """Find the program among the base directories (first match) and read it; unknown when it is not there."""
    if not entry and not module:
        return unknown_program(None, "the launch line names no program file")
    named = entry or f"-m {module}"
    if re.search(r"[$`]", named):
        return unknown_program(None, f"its path {named} is only known at run time")
    if not bases:
        return unknown_program(None, f"{named}: the directory it runs in is only known at run time")
    candidates = program_candidates(entry, bases) if entry else module_candidates(str(module), bases)
    for path in candidates:
        if not os.path.isfile(path):
            continue
        text = _read_text(path)
        if text is None:
            return unknown_program(path, f"{path} could not be read")
        folder = os.path.dirname(path)

        def read_local(mod: str, level: int, folder: str = folder) -> tuple[str, str] | None:
            if not mod and not level:
                return None
            base = folder
            for _ in range(max(level - 1, 0)):
                base = os.path.dirname(base)
            rel = mod.replace(".", os.sep) if mod else ""
            for cand in (os.path.join(base, rel + ".py"), os.path.join(base, rel, "__init__.py")):
                if rel and os.path.isfile(cand):
                    found = _read_text(cand)
                    return (cand, found) if found is not None else None
            return None

        return read_program(text, path, argv, read_local)
    shown = ", ".join(dict.fromkeys(os.path.dirname(c) or "." for c in candidates))
    return unknown_program(None, f"{named} is not there (looked in {shown})")


# ---------------------------------------------------------------- the program of a batch script's launch


def program_bases(script: BatchScript, submit_dir: str | None = None) -> tuple[list[str], str]:
    """The directories a relative program path of the launch line is looked up in, and how they were chosen.

    A batch job starts in the directory sbatch was run from (sbatch(1): "the batch script is executed in the
    directory from which sbatch was run" unless --chdir), taken here as the current directory; `cd` lines
    before the launch move it (`cd "$SLURM_SUBMIT_DIR"` is the submit directory). A `cd` to a directory only
    known at run time leaves none. Without either, the script's own directory is tried after the current one.
    """
    here = submit_dir or os.getcwd()
    base, how = here, "the submit directory (taken as the current directory)"
    chdir = script.options.get("chdir")
    if isinstance(chdir, str) and chdir:
        base, how = os.path.join(here, os.path.expanduser(chdir)), f"#SBATCH --chdir={chdir}"
    launch_line = script.launch.line if script.launch else None
    moved = False
    for line, target in script.chdirs:
        if launch_line is not None and line >= launch_line:
            break
        target = re.sub(r"\$\{?SLURM_SUBMIT_DIR\}?", lambda _m: here, target)
        target = os.path.expanduser(re.sub(r"^\$\{?HOME\}?(?=/|$)", "~", target))
        if re.search(r"[$`*?]", target) or target == "-":
            return [], f"`cd {target}` (line {line}) goes to a directory only known at run time"
        base, how, moved = os.path.normpath(os.path.join(base, target)), f"`cd {target}` (line {line})", True
    if moved or chdir:
        return [base], how
    script_dir = os.path.dirname(os.path.abspath(script.path)) if script.path else None
    bases = [base] + ([script_dir] if script_dir and script_dir != os.path.abspath(base) else [])
    return bases, how + (" or the script's directory" if len(bases) > 1 else "")


def launched_program(script: BatchScript, submit_dir: str | None = None):
    """The process model of the program the training launch runs (readers/program.py), read from its file."""
    launch = script.launch
    if launch is None:
        return unknown_program(None, "no training launch line")
    if launch.inline:
        return unknown_program(None, "the program is inline (python -c)")
    entry = launch.script
    module = None if entry else launch.module
    if not entry and not module:
        return unknown_program(None, f"the launch line runs {launch.program or 'no program'}, not a Python file")
    if entry and not entry.endswith(".py") and launch.launcher not in ("python", "torchrun", "deepspeed", "accelerate"):
        return unknown_program(None, f"{entry} is not a Python file")
    bases, _how = program_bases(script, submit_dir)
    return load_program(entry, module, bases, tuple(launch.script_args))
