"""The typed result of reading a batch script: every value keeps where it is written.

A `Span` is (line, column) to (end_line, end_column) -- lines 1-based, columns 0-based in
characters, the end exclusive -- plus the same as character offsets into the script text
(`start`, `end`), so a fix can replace `text[span.start:span.end]`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

UNKNOWN_DIRECTORY = "?"  # Launch.cwd after a `cd` only the job's shell can resolve ($(dirname $0), `cd` alone, `cd -`)


class SbatchError(ValueError):
    """A batch script that cannot be used: one clear line, exit 2."""


@dataclass(frozen=True)
class Span:
    line: int
    column: int
    end_line: int
    end_column: int
    start: int
    end: int


@dataclass(frozen=True)
class Directive:
    """One option of an `#SBATCH` line sbatch reads."""

    option: str  # canonical long name: "ntasks-per-node" for -n... / --tasks-per-node
    value: str | bool  # True for a flag
    written: str  # the option as written: "-N", "--tasks-per-node"
    line: int
    text: str  # the whole #SBATCH line
    span: Span  # the option and its value ("--gres=gpu:8", "-N 2")
    value_span: Span | None  # the value alone, as written (quotes included); None for a flag
    line_span: Span  # the whole line


@dataclass(frozen=True)
class ScriptLine:
    """An #SBATCH-like line sbatch does not read as asked: below the first command, commented, unknown."""

    line: int
    text: str
    span: Span
    options: tuple[str, ...] = ()  # unknown options on the line


@dataclass(frozen=True)
class Assignment:
    """`export NAME=value`, `NAME=value` or `unset NAME` in the body."""

    name: str
    value: str | None  # after expansion; None for unset; REDACTED for a credential name
    line: int
    text: str  # the command as written (credential values redacted)
    span: Span  # the whole command
    value_span: Span | None  # the value as written; None for unset
    exported: bool
    unset: bool = False
    redacted: bool = False
    # `NAME=value cmd`, `env NAME=value cmd`, `env -u NAME cmd`: the environment of that one command only (bash(1)
    # SIMPLE COMMAND EXPANSION), not of the shell or the commands after it.
    command_only: bool = False

    def described(self) -> str:
        """What the line does with the variable: 'exports X=v', 'sets X=v for its command', 'unsets X'."""
        what = f"unsets {self.name}" if self.unset else f"{'sets' if self.command_only else 'exports'} {self.name}="
        what += "" if self.unset else str(self.value)
        return f"{what} for its command" if self.command_only else what


@dataclass(frozen=True)
class SrunStep:
    """srun's own options on a launch line."""

    options: Mapping[str, str | bool]
    unknown: tuple[str, ...] = ()


@dataclass(frozen=True)
class LauncherConfig:
    """A launcher's config file named on the launch line (`accelerate launch --config_file F`), as read.

    status: "read"; "missing" (no file where the launch looks); "unreadable" (not a file, too large, broken
    YAML/JSON: `problem` says which); "unresolved" (the path holds a value only the job's shell knows)."""

    written: str  # the path as the launch line gives it
    path: str | None  # where it was found, or the first place looked
    status: str
    values: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))  # top-level keys
    lines: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))  # key -> 1-based line
    problem: str = ""  # why it was not read, or where the relative path was looked for


@dataclass(frozen=True)
class Launch:
    """A command that starts a program under srun or a known launcher, and what it launches."""

    line: int
    text: str  # as written, continuations joined into one line, credential values redacted
    expanded: str  # with the variables known in the batch shell expanded (credentials never)
    span: Span
    srun: SrunStep | None
    program: str | None = None
    launcher: str | None = None  # torchrun | torch.distributed.launch | deepspeed | accelerate | python | lightning
    module: str | None = None
    script: str | None = None
    script_args: tuple[str, ...] = ()
    nproc_per_node: str | None = None
    nnodes: str | None = None
    num_processes: str | None = None  # accelerate: a total over the machines
    node_rank: str | None = None
    standalone: bool = False
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    config_file: str | None = None
    deepspeed_launcher: str | None = None
    hostfile: str | None = None  # deepspeed --hostfile
    master_port: str | None = None  # --master-port (torchrun, torch.distributed.launch, deepspeed), --main_process_port
    rdzv_id: str | None = None  # torchrun --rdzv-id
    lightning: Mapping[str, str | bool] | None = None  # trainer.devices/num_nodes/... on the line
    inline: bool = False  # python -c '...'
    gpudoctor: bool = False  # a gpudoctor preflight
    via_shell: str | None = None  # "bash -c": the launcher was read inside a shell's command string
    launcher_options: Mapping[str, str | bool] | None = None  # the launcher's own options as given (dashed names)
    cwd: str | None = None  # the directory a `cd` before the line moved to (None: where the job started)
    launcher_config: LauncherConfig | None = None  # the config_file read (load_sbatch does the reading)
    # `srun bash -c STRING`: STRING as each task's shell gets it, and the expansions ($(...), `...`, $NAME) the
    # batch shell already did before srun (their text): what is left in STRING, each task's shell does itself
    task_command: str | None = None
    batch_evaluated: frozenset[str] = frozenset()
    env: tuple[Assignment, ...] = ()  # the command's own environment: prefix assignments, env(1) NAME=v / -u NAME
    env_cleared: bool = False  # `env -i`: the command starts from an empty environment
    background: bool = False  # `... &`: the batch shell starts it and goes on without waiting (bash(1) Lists)
    # The command after srun and every wrapper (launch.WRAPPERS, env, exec, ...) as the batch shell expanded it,
    # and the wrappers peeled off it, outermost first ("singularity", "bash -c", ...)
    argv: tuple[str, ...] = ()
    wrappers: tuple[str, ...] = ()
    console_script: bool = False  # a command that is not python, known only by the Trainer overrides it is given

    def python_command(self) -> str | None:
        """The plain python command this line runs (`python3 main.py --lr 1e-3`), for a fix text that names the
        script's own program instead of a placeholder; None when it is not a python script or module."""
        if self.launcher != "python" or not (self.script or self.module):
            return None
        import shlex

        target = self.script if self.script else f"-m {self.module}"
        return " ".join([self.program or "python", shlex.quote(target), *map(shlex.quote, self.script_args)])


@dataclass(frozen=True)
class BrokenContinuation:
    """`arg \\    # note`: the backslash escapes a space, the comment ends the command, and bash runs
    the next line as a command of its own."""

    line: int
    text: str  # that line as written
    backslash: Span  # the backslash and the blanks after it
    next_line: int
    next_text: str  # the next command, which bash runs on its own
    next_program: str  # its first word


@dataclass(frozen=True)
class StrayArgument:
    """A line whose first word is an argument, not a command (`--lr 1e-4`, `trainer.devices=8`): bash runs it
    as a command that does not exist -- usually the line above lost its continuation backslash."""

    line: int
    text: str  # the command as written
    span: Span
    program: str  # its first word, which bash looks up as a command
    previous_line: int | None  # the line the command above ends on, when it ends on the line just above


@dataclass(frozen=True)
class BashSyntax:
    """`bash -n` on the script: ok True/False, or None with the reason it was not run."""

    ok: bool | None
    message: str = ""


@dataclass(frozen=True)
class BatchScript:
    path: str
    job_name: str
    directives: tuple[Directive, ...]  # of the component the training step runs in, in order
    het_components: int = 1
    het_group: int = 0
    unknown_directives: tuple[ScriptLine, ...] = ()
    late_directives: tuple[ScriptLine, ...] = ()  # #SBATCH below the first command: sbatch ignores them
    commented_directives: tuple[ScriptLine, ...] = ()  # '##SBATCH' / '# SBATCH' / '  #SBATCH'
    lookalike_directives: tuple = ()  # lookalike.LookalikeDirective: header lines like #SBATCH that sbatch skips
    assignments: tuple[Assignment, ...] = ()
    launches: tuple[Launch, ...] = ()
    launch: Launch | None = None  # the training launch
    broken_continuations: tuple[BrokenContinuation, ...] = ()
    stray_arguments: tuple[StrayArgument, ...] = ()  # lines bash runs as a missing command
    first_command_line: int | None = None
    variables: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    bash_syntax: BashSyntax | None = None
    # Lines outside comments where the word `srun` appears (a command, a value, a function, a heredoc): where none
    # is, the script itself starts no srun step.
    srun_lines: tuple[int, ...] = ()
    # The arguments `sbatch FILE ARGS` gives the script ($1, $2, ...: `gpudoctor check --sbatch FILE -- ARGS`);
    # None when not given: each is unknown before submission.
    arguments: tuple[str, ...] | None = None
    # Names some line may assign (readers/sbatch/names.py), and lines that may set others (source, eval, module).
    assigned_names: frozenset[str] = frozenset()
    other_sources: tuple[int, ...] = ()
    chdirs: tuple[tuple[int, str], ...] = ()  # `cd DIR` / `pushd DIR` in the batch shell: (line, DIR expanded)
    program: Any = None  # readers.program.ProgramModel of the launched program (load_sbatch; None: not looked for)
    # A shell script the training launch runs in each task (`srun ./train.sh ARGS`, `srun bash run.sh`): its path and
    # text, read by load_sbatch where it is there; each task's shell runs it with its own SLURM variables (job/model)
    task_script: tuple[str, str] | None = None
    # (line, text) of commands the batch shell runs that may start the training and are not read here (`./run.sh`,
    # `bash train.sh`, `$CMD` without srun): where no launch line is found, what the job starts is unknown
    unread_commands: tuple[tuple[int, str], ...] = ()
    # lines of the batch shell's `wait` builtin: it waits for the commands started in the background (`... &`)
    wait_lines: tuple[int, ...] = ()

    @property
    def options(self) -> dict[str, str | bool]:
        """{canonical option: value}, the last directive winning as in sbatch."""
        return {d.option: d.value for d in self.directives}

    @property
    def directive_lines(self) -> dict[str, int]:
        return {d.option: d.line for d in self.directives}

    def directive(self, option: str) -> Directive | None:
        """The directive sbatch uses for an option (the last one), or None."""
        return next((d for d in reversed(self.directives) if d.option == option), None)

    @property
    def exports(self) -> dict[str, Assignment]:
        """The last `export NAME=...` or `unset NAME` per name, then the training launch's own environment
        (`NAME=value srun ...`, `env -u NAME ...`), which the launched command gets on top: what srun tasks
        and the training processes inherit."""
        out = {a.name: a for a in self.assignments if a.exported or a.unset}
        if self.launch is not None:
            out.update({a.name: a for a in self.launch.env})
        return out
