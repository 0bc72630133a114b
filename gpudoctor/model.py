"""The data every part of gpudoctor passes around: severities, fixes, findings, context."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpudoctor.readers.sbatch.script import BatchScript

CATEGORIES = (
    "driver",
    "cuda",
    "nccl",
    "devices",
    "slurm",
    "distributed",
    "allocator",
    "dataloader",
    "host",
    "hardware",
    "precision",
    "job",  # cross-rank agreement: every rank's view of one job compared (check --job, compare)
    "smoke",  # verdicts of the smoke training run (gpudoctor smoke)
)


class Severity(str, enum.Enum):
    PASS = "pass"
    INFO = "info"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    ERROR = "error"

    @property
    def rank(self) -> int:
        """Worse is higher; used to pick the worst of several outcomes."""
        return _RANK[self]


_RANK = {
    Severity.SKIP: 0,
    Severity.PASS: 1,
    Severity.INFO: 2,
    Severity.WARN: 3,
    Severity.ERROR: 4,
    Severity.FAIL: 5,
}


class ExitCode(enum.IntEnum):
    """The process exit status of every command (docs/architecture.md: contracts)."""

    OK = 0  # no fail
    FAIL = 1  # at least one fail (or warn with --strict); for smoke: the run failed; fix --diff: changes pending
    USAGE = 2  # usage or bad input: one clear line, no traceback
    INTERNAL = 3  # gpudoctor itself crashed


class ActionKind(str, enum.Enum):
    """What one step of a fix does; fixes/ turns each kind into an edit or a printed command."""

    SET_ENV = "set_env"  # target: variable name; value: its value (key ENV_REFERENCE: `$NAME`, expanded where run)
    UNSET_ENV = "unset_env"  # target: variable name
    COMMAND = "command"  # target: a command line for the user to run (never run by gpudoctor)
    YAML_SET = "yaml_set"  # target: config file; key: dotted key path; value: the new value
    SBATCH_SET = "sbatch_set"  # target: batch script; key: long #SBATCH option; value: its value (None: remove)
    SBATCH_REMOVE = "sbatch_remove"  # target: batch script; key: long #SBATCH option to drop
    SBATCH_RENAME = "sbatch_rename"  # target: batch script; key: an unknown option as written; value: the one meant
    SBATCH_HOIST = "sbatch_hoist"  # target: batch script; value: the text of an #SBATCH line below the first command
    DIRECTIVE_REPAIR = "directive_repair"  # target: batch script; value: a header line like #SBATCH that sbatch skips
    CONTINUATION_REPAIR = "continuation_repair"  # target: batch script; value: a line ending `\    # note`, as written
    SRUN_PREFIX = "srun_prefix"  # target: batch script; value: srun options ("" for none) put before the launch
    EXPORT_SET = "export_set"  # target: batch script; key: variable; value: its value (before the launch line)
    EXPORT_REMOVE = "export_remove"  # target: batch script; key: variable whose export/assignment is dropped
    OVERRIDE_SET = "override_set"  # target: batch script; key: dotted key or --flag on the launch line; value


# SET_ENV's key when its value is `$NAME`: a variable of the shell where the fix runs, which that shell expands
# (SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK). Any other value, above all one copied from the user's
# environment or files, is a literal and is printed quoted so that the shell keeps its bytes.
ENV_REFERENCE = "reference"


class Safety(str, enum.Enum):
    SAFE = "safe"  # reversible; touches only the job's environment or a backed-up file
    UNSAFE = "unsafe"  # changes what the job does (batch size, workers, ...)
    MANUAL = "manual"  # a command for the user to run (driver upgrade, nvidia-smi -pm 1)


@dataclass(frozen=True)
class Action:
    """One step of a fix (see ActionKind for what target, key and value mean)."""

    kind: ActionKind
    target: str  # env var name, command line, file path
    value: Any = None
    key: str | None = None  # yaml key path or #SBATCH option

    @property
    def env_value(self) -> str:
        """A SET_ENV value as the shell gets it (gpudoctor.shellquote): a Reference only where the fix marked
        the value as one (key ENV_REFERENCE, value `$NAME`), else the literal text."""
        from gpudoctor.shellquote import Reference, is_name

        text = "" if self.value is None else str(self.value)
        if self.key == ENV_REFERENCE and text.startswith("$") and is_name(text[1:]):
            return Reference(text[1:])
        return text

    def to_dict(self) -> dict:
        d = {"kind": ActionKind(self.kind).value, "target": self.target}
        if self.value is not None:
            d["value"] = self.value
        if self.key is not None:
            d["key"] = self.key
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Action:
        return cls(kind=ActionKind(d["kind"]), target=d["target"], value=d.get("value"), key=d.get("key"))


@dataclass(frozen=True)
class Fix:
    title: str
    safety: Safety
    actions: tuple[Action, ...] = ()

    def to_dict(self) -> dict:
        return {
            "title": self.title,
            "safety": self.safety.value,
            "actions": [a.to_dict() for a in self.actions],
        }

    @classmethod
    def from_dict(cls, d: dict | None) -> Fix | None:
        if d is None:
            return None
        return cls(
            title=d["title"],
            safety=Safety(d["safety"]),
            actions=tuple(Action.from_dict(a) for a in d.get("actions", [])),
        )


def export_title(name: str, value: str) -> str:
    """`export NAME=VALUE` for a fix's title, the value quoted as the shell line that applies it."""
    from gpudoctor.shellquote import quote, shown

    value = value if isinstance(value, str) else str(value)
    try:
        return f"export {name}={quote(value)}"
    except ValueError:
        return f"export {name}={shown(value)}"


def set_env(name: str, value: str, title: str | None = None) -> Fix:
    """Set NAME to value, taken literally (a value read from the user's environment or files is never
    expanded by the shell that applies it)."""
    return Fix(title or export_title(name, value), Safety.SAFE, (Action(ActionKind.SET_ENV, name, value),))


def set_env_reference(name: str, variable: str, title: str | None = None) -> Fix:
    """Set NAME to `$variable`, expanded by the shell where the fix runs (the job's own SLURM variables)."""
    from gpudoctor.shellquote import Reference

    value = Reference(variable)
    return Fix(
        title or export_title(name, value),
        Safety.SAFE,
        (Action(ActionKind.SET_ENV, name, str(value), key=ENV_REFERENCE),),
    )


def unset_env(name: str, title: str | None = None) -> Fix:
    return Fix(title or f"unset {name}", Safety.SAFE, (Action(ActionKind.UNSET_ENV, name),))


def manual(title: str, *commands: str) -> Fix:
    return Fix(title, Safety.MANUAL, tuple(Action(ActionKind.COMMAND, c) for c in commands))


@dataclass(frozen=True)
class Location:
    """Where in a file a finding points: a batch script's or training config's line. Lines and columns are
    1-based, as editors, GitHub annotations and ruff/flake8 output count them; the end is inclusive of the
    line and exclusive of the column. line None: the file as a whole."""

    file: str
    line: int | None = None
    column: int | None = None
    end_line: int | None = None
    end_column: int | None = None

    def to_dict(self) -> dict:
        fields = ("file", "line", "column", "end_line", "end_column")
        return {k: getattr(self, k) for k in fields if getattr(self, k) is not None}

    @classmethod
    def from_dict(cls, d: dict | None) -> Location | None:
        if not d:
            return None
        return cls(d["file"], d.get("line"), d.get("column"), d.get("end_line"), d.get("end_column"))


@dataclass(frozen=True)
class Outcome:
    """What a check function returns: the verdict without the check's identity."""

    severity: Severity
    message: str
    evidence: dict = field(default_factory=dict)
    fix: Fix | None = None
    location: Location | None = None  # None: the runner derives it from the fix and evidence (job/locate.py)


def passed(message: str, **evidence) -> Outcome:
    return Outcome(Severity.PASS, message, evidence)


def info(message: str, fix: Fix | None = None, **evidence) -> Outcome:
    return Outcome(Severity.INFO, message, evidence, fix)


def warn(message: str, fix: Fix | None = None, **evidence) -> Outcome:
    return Outcome(Severity.WARN, message, evidence, fix)


def fail(message: str, fix: Fix | None = None, **evidence) -> Outcome:
    return Outcome(Severity.FAIL, message, evidence, fix)


def skip(reason: str, **evidence) -> Outcome:
    return Outcome(Severity.SKIP, reason, evidence)


@dataclass(frozen=True)
class Finding:
    id: str
    name: str
    category: str
    severity: Severity
    title: str
    message: str
    evidence: dict = field(default_factory=dict)
    fix: Fix | None = None
    location: Location | None = None  # the line of the batch script or config the finding is about

    def to_dict(self) -> dict:
        d = {
            "id": self.id,
            "name": self.name,
            "category": self.category,
            "severity": self.severity.value,
            "title": self.title,
            "message": self.message,
            "evidence": self.evidence,
            "fix": self.fix.to_dict() if self.fix else None,
        }
        if self.location is not None:  # optional, so reports without it keep their shape
            d["location"] = self.location.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Finding:
        return cls(
            id=d["id"],
            name=d["name"],
            category=d["category"],
            severity=Severity(d["severity"]),
            title=d["title"],
            message=d["message"],
            evidence=d.get("evidence", {}),
            fix=Fix.from_dict(d.get("fix")),
            location=Location.from_dict(d.get("location")),
        )


def worst(findings: Iterable[Finding], default: Severity = Severity.PASS) -> Severity:
    """The most severe severity among the findings (Severity.rank), default when there are none."""
    return max((f.severity for f in findings), key=lambda s: s.rank, default=default)


@dataclass(frozen=True)
class Context:
    """What the user intends, as opposed to what the machine is (Facts).

    Kept out of snapshots so a replay can ask a different question of the same facts.
    """

    expect_gpus: int | None = None  # None: at least one GPU; 0: a CPU-only machine is fine
    launcher: str | None = None  # torchrun | lightning | srun | accelerate | deepspeed
    config: dict | None = None  # parsed training config (--config)
    config_path: str | None = None
    sbatch: BatchScript | None = None  # parsed batch script (--sbatch)
    sbatch_path: str | None = None
    # Ids of the checks in this run (set by runner.run_checks; None when a check runs on its own),
    # so a check can leave a finding to another check that reports it in the same run.
    running: frozenset[str] | None = None
    # Outcomes of the checks named in this check's defers_to that are in this run (set by the runner).
    deferred: dict[str, tuple[Outcome, ...]] = field(default_factory=dict)
    # --node-snapshot F: the machine/node facts were recorded on a node the job runs on, so node-scope
    # verdicts are about the job's node even before submission (gpudoctor/job/target.py).
    node_facts: str | None = None
    # --before-submission: the job described by --sbatch/--config, judged before it is submitted even where this
    # machine has GPUs (a pre-commit hook on a GPU workstation must not judge the committer's machine).
    before_submission: bool = False
    # --config's keys and their lines (dotted path -> 1-based line; readers/trainconfig.key_lines), for findings'
    # locations
    config_lines: dict | None = None
    # The launch line's overrides of the config (readers/overrides.LaunchOverrides): `config` above is already the
    # config they make; kept to say where a value comes from and which settings a program flag makes unknown.
    overrides: Any = None
    # The model of the job as it will run (gpudoctor.job.model.JobModel), built once per run of the checks by the
    # runner for `sbatch` above (job.model.job_model hands it out, or builds one when it belongs to another script).
    job: Any = None

    @property
    def gpus_expected(self) -> bool:
        return self.expect_gpus is None or self.expect_gpus > 0


@dataclass(frozen=True)
class Launcher:
    """How a launcher starts training processes: the one table every part of gpudoctor reads.

    Sources: torchrun (torch/distributed/run.py: --nproc-per-node, 'gpu' = one per GPU), DeepSpeed
    (deepspeed launcher: --num_gpus, all visible GPUs by default), Accelerate (accelerate launch:
    --num_processes), Lightning (Trainer(devices=...) starts one process per device itself, or uses
    the SLURM tasks under srun), srun (one process per task).
    """

    name: str
    per_gpu: bool  # left to its defaults, it starts one rank per GPU this process sees
    multi_process: bool  # it runs several training processes (a distributed job)
    process_count_flag: str | None  # it spawns worker processes per task; this flag says how many
    cli: bool  # offered by `gpudoctor check --launcher`
    on_launch_line: bool  # recognised as the program on a batch script's launch line

    @property
    def spawns_workers(self) -> bool:
        """A second launcher inside each srun task: it starts the ranks itself."""
        return self.process_count_flag is not None


LAUNCHER_TABLE: dict[str, Launcher] = {
    launcher.name: launcher
    for launcher in (
        Launcher("torchrun", True, True, "--nproc-per-node", cli=True, on_launch_line=True),
        Launcher("torch.distributed.launch", True, True, "--nproc-per-node", cli=False, on_launch_line=True),
        Launcher("lightning", True, True, None, cli=True, on_launch_line=True),
        Launcher("srun", False, True, None, cli=True, on_launch_line=False),
        Launcher("accelerate", True, True, "--num_processes", cli=True, on_launch_line=True),
        Launcher("deepspeed", True, True, "--num_gpus", cli=True, on_launch_line=True),
        Launcher("python", False, False, None, cli=True, on_launch_line=True),
    )
}
CLI_LAUNCHERS = tuple(n for n, launcher in LAUNCHER_TABLE.items() if launcher.cli)
SCRIPT_LAUNCHERS = tuple(n for n, launcher in LAUNCHER_TABLE.items() if launcher.on_launch_line)
PER_GPU_LAUNCHERS = tuple(n for n, launcher in LAUNCHER_TABLE.items() if launcher.per_gpu)
MULTI_PROCESS_LAUNCHERS = tuple(n for n, launcher in LAUNCHER_TABLE.items() if launcher.multi_process)
SPAWNING_LAUNCHERS = tuple(n for n, launcher in LAUNCHER_TABLE.items() if launcher.spawns_workers)


# A check that could not run (severity error) judged nothing: it is never a pass, so it fails the verdict as a
# fail does (exit 1, and the report names it); exit 3 stays for gpudoctor itself failing.
BLOCKING = frozenset({Severity.FAIL, Severity.ERROR})


def exit_code(findings: list[Finding], strict: bool = False) -> ExitCode:
    """The verdict's exit status: OK with no fail and no error; FAIL with at least one fail or a check that
    could not run (error), or a warn with --strict."""
    bad = BLOCKING | {Severity.WARN} if strict else BLOCKING
    return ExitCode.FAIL if any(f.severity in bad for f in findings) else ExitCode.OK
