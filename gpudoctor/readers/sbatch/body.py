"""The body of a batch script as the batch shell runs it: its commands in order, the variables they set
(expanded as far as the script tells), the directories it changes to, and the launch commands it runs.

The batch shell is task 0 on node 0, so `$SLURM_PROCID` there expands to 0. Credential-named variables
(gpudoctor.redact.is_credential_name) are never expanded and their values never kept: evidence shows
`$WANDB_API_KEY` or <redacted>.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import replace
from types import MappingProxyType

from gpudoctor.readers.sbatch.continuations import one_line
from gpudoctor.readers.sbatch.launch import command_environment, describe_command, describe_launch
from gpudoctor.readers.sbatch.script import UNKNOWN_DIRECTORY, Assignment, Launch, SbatchError, SrunStep
from gpudoctor.readers.sbatch.shell import (
    MAX_VALUE,
    POSITIONAL,
    Branches,
    Command,
    Expander,
    Source,
    commands,
    split_commands,
    tokenize,
    unquote,
)
from gpudoctor.redact import REDACTED, is_credential_name, redact, redact_words

# Set per task by srun: the batch shell's value (task 0) is not what a task's own shell sees.
PER_TASK_VARS = frozenset({"SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID"})
# Not expanded where a shell of its own expands them later (single quotes, \$): per-task variables, and the
# positional parameters, which an inner `bash -c '...'` has its own of.
DEFERRED = PER_TASK_VARS | POSITIONAL
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\+?)=(.*)$", re.S)
# A command substitution, or a name srun or the node sets per task ($HOSTNAME, $SLURM_PROCID, $RANDOM ...):
# the expansions readers/pertask.py tells apart (its _VARYING_NAMES); anything else is the same in every task.
_MAY_VARY = re.compile(
    r"\$\(|`|\$\{?(HOSTNAME|HOST|SLURMD_NODENAME|SLURM_NODEID|SLURM_TOPOLOGY_ADDR|SLURM_PROCID|SLURM_TASK_PID|"
    r"BASHPID|SLURM_LOCALID|RANDOM|SRANDOM)\b"
)


def expand_vars(text: str, known: dict[str, str]) -> str:
    """$X, ${X}, ${X:-default} and integer $((...)) from the variables known; unknown ones stay as written.

    In single quotes and after a backslash the per-task SLURM variables stay as written: each task's
    shell expands them to its own values.
    """
    return Expander().expand(text, known, DEFERRED)


def positional_parameters(arguments: tuple[str, ...] | None) -> dict[str, str]:
    """$1 ... and "$@"/"$*"/"$#" from the arguments given to the script; none when they are not known."""
    if arguments is None:
        return {}
    known = {str(i): "" for i in range(1, 100)}  # bash: a parameter past the last argument is empty
    known.update({str(i): a for i, a in enumerate(arguments, 1)})
    known.update({"@": " ".join(arguments), "*": " ".join(arguments), "#": str(len(arguments))})
    return known


def _backgrounded(text: str, end: int) -> bool:
    """The command that ends at `end` is ended by the control operator `&` (not `&&`, `&>` or `>&`): bash runs it
    in the background and goes on (bash(1) Lists: "If a command is terminated by the control operator &, the shell
    executes the command in the background in a subshell")."""
    i = end
    while i < len(text) and text[i] in " \t":
        i += 1
    return text[i : i + 1] == "&" and text[i + 1 : i + 2] not in ("&", ">")


class Body:
    """The body's commands in order, with the variables known so far."""

    def __init__(self, src: Source, path: str, known: dict[str, str], arguments: tuple[str, ...] | None = None) -> None:
        self.src, self.path, self.known, self.arguments = src, path, known, arguments
        self.expander = Expander()
        self.assignments: list[Assignment] = []
        self.launches: list[tuple[Launch, dict]] = []
        self.arrays: set[str] = set()
        self.branches = Branches()
        self.chdirs: list[tuple[int, str]] = []
        self.unread: list[tuple[int, str]] = []  # commands that may start the training, not read (_unread_command)
        self.waits: list[int] = []  # lines of `wait`: the batch shell waits there for what it started with `&`
        self.cwd: str | None = None  # after `cd DIR`: DIR as expanded (None: where the job started)
        # per variable: the $(...), `...` and $NAME its value holds as evaluated by the batch shell (not as text)
        self.evaluated: dict[str, frozenset[str]] = {}

    def read(self, cmds: list[Command]) -> None:
        for cmd in cmds:
            self._command(cmd)

    def _command(self, cmd) -> None:
        raw_words = [w.text for w in cmd.words]
        joined = original = " ".join(raw_words)
        for name in self.arrays:  # "${CMD[@]}" is the array's words, each one word
            joined = joined.replace(f'"${{{name}[@]}}"', f"${{{name}[@]}}")
        if self.arguments is not None and "$" in joined:  # "$@": each argument one word (bash(1) "Special Parameters")
            words = " ".join(shlex.quote(a) for a in self.arguments)
            joined = joined.replace('"$@"', words).replace('"${@}"', words)
        expanded = self.expander.expand(joined, self.known, DEFERRED)
        line = self.src.position(cmd.start)[0]
        as_written = one_line(self.src.text[cmd.start : cmd.end])
        if raw_words[:1] == ["wait"] and self.branches.may_run:
            self.waits.append(line)
        subs = [cmd] if expanded == original else commands(tokenize(expanded))  # re-read only what expansion changed
        for sub in subs:
            tokens = self.branches.feed([unquote(w.text) for w in sub.words])
            if not tokens or not self.branches.may_run:
                continue
            if tokens[0] == "export":
                for tok in tokens[1:]:
                    self._assign(tok, cmd, line, as_written, exported=True)
                continue
            # `set -- ARGS` gives the shell known arguments whether or not the script's own are known
            # (`set -- accelerate launch ... train.py; exec "$@"`); `shift` only moves known ones
            known_args = self.arguments is not None or tokens[:2] == ["set", "--"]
            if tokens[0] in ("shift", "set") and known_args and self._positional(tokens):
                continue
            if tokens[0] == "unset":
                for tok in tokens[1:]:
                    if not tok.startswith("-"):
                        self.assignments.append(
                            Assignment(
                                tok,
                                None,
                                line,
                                redact(as_written),
                                self.src.span(cmd.start, cmd.end),
                                None,
                                exported=False,
                                unset=True,
                            )
                        )
                        self.known.pop(tok, None)
                continue
            if all(_ASSIGN.match(t) for t in tokens):
                for tok in tokens:
                    self._assign(tok, cmd, line, as_written, exported=False)
                continue
            if tokens[0] in ("cd", "pushd"):  # where a relative program or config path is looked up
                self.chdirs.append((line, next((t for t in tokens[1:] if not t.startswith("-")), "~")))
                self.cwd = _changed_directory(self.cwd, tokens[1:])
                continue
            self._launch(tokens, cmd, line, as_written)

    def _positional(self, tokens: list[str]) -> bool:
        """`shift [n]` and `set -- ARGS` change the script's arguments (bash(1) SHELL BUILTIN COMMANDS)."""
        if tokens[0] == "shift":
            n = int(tokens[1]) if len(tokens) > 1 and tokens[1].isdigit() and len(tokens[1]) < 6 else 1
            self.arguments = (self.arguments or ())[n:] if n <= len(self.arguments or ()) else self.arguments
        elif tokens[1:2] == ["--"]:
            self.arguments = tuple(tokens[2:])
        else:
            return False
        for name in POSITIONAL:
            self.known.pop(name, None)
        self.known.update(positional_parameters(self.arguments))
        return True

    def _assign(self, tok: str, cmd, line: int, as_written: str, exported: bool) -> None:
        m = _ASSIGN.match(tok)
        if not m:
            if exported and tok in self.known and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", tok):  # `X=1; export X`
                self.assignments.append(
                    Assignment(
                        tok,
                        self.known[tok],
                        line,
                        redact(as_written),
                        self.src.span(cmd.start, cmd.end),
                        None,
                        exported=True,
                    )
                )
            return
        name, append, value = m.groups()
        if append:
            value = self.known.get(name, "") + value
        raw = next((w for w in cmd.words if w.text.startswith(f"{name}=") or w.text.startswith(f"{name}+=")), None)
        value_span = self.src.span(raw.start + raw.text.index("=") + 1, raw.end) if raw else None
        if value.startswith("(") and value.endswith(")") and raw is not None and "=(" in raw.text:
            value = value[1:-1].strip()
            self.arrays.add(name)
        span = self.src.span(cmd.start, cmd.end)
        if raw is not None:
            evaluated = self._batch_evaluated(raw.text[raw.text.index("=") + 1 :])
            if evaluated:
                self.evaluated[name] = evaluated
            else:
                self.evaluated.pop(name, None)
        if is_credential_name(name):
            self.known.pop(name, None)  # never expanded into a launch line or evidence
            self.assignments.append(
                Assignment(name, REDACTED, line, redact(as_written), span, value_span, exported, redacted=True)
            )
            return
        if len(value) > MAX_VALUE:
            self.known.pop(name, None)  # too long to be a setting: unknown rather than growing without bound
        else:
            self.known[name] = value
        self.assignments.append(
            Assignment(
                name,
                None if len(value) > MAX_VALUE else redact(value),
                line,
                redact(as_written),
                span,
                value_span,
                exported,
            )
        )

    def _launch(self, tokens: list[str], cmd, line: int, as_written: str) -> None:
        try:
            desc = describe_launch(tokens)
        except SbatchError as e:
            raise SbatchError(f"{self.path}:{line}: srun: {e}") from None
        if desc is None:
            if _unread_command(tokens):  # `./run.sh`, `bash train.sh`, `$CMD`: what it starts is not read here
                self.unread.append((line, redact(as_written)))
            return
        cwd = self.cwd
        if desc.get("task_command"):
            desc["batch_evaluated"] = self._batch_evaluated(" ".join(w.text for w in cmd.words))
            cwd = _task_directory(cwd, desc["task_command"])
        launch = _to_launch(
            desc, line, redact(as_written), " ".join(redact_words(tokens)), self.src.span(cmd.start, cmd.end), cwd
        )
        env, cleared = self._command_env(tokens, cmd, line, as_written)
        if env or cleared:
            launch = replace(launch, env=env, env_cleared=cleared)
        if _backgrounded(self.src.text, cmd.end):
            launch = replace(launch, background=True)
        self.launches.append((launch, desc))

    def _command_env(self, tokens: list[str], cmd, line: int, as_written: str) -> tuple[tuple[Assignment, ...], bool]:
        """The launch command's own environment (launch.command_environment), as Assignments on its line; values
        expanded by the batch shell, credentials redacted, never added to the variables the script knows."""
        found, cleared = command_environment(tokens)
        span = self.src.span(cmd.start, cmd.end)
        out = []
        used: set[int] = set()
        for _, name, value in found:
            # the k-th `NAME=` word written is the k-th found (`A=1 srun env A=2 ...`: two words, two spans)
            raw = next((w for w in cmd.words if w.text.startswith(f"{name}=") and w.start not in used), None)
            if raw is not None:
                used.add(raw.start)
            value_span = self.src.span(raw.start + len(name) + 1, raw.end) if raw is not None else None
            secret = is_credential_name(name) and value is not None
            shown = REDACTED if secret else None if value is None or len(value) > MAX_VALUE else redact(value)
            out.append(
                Assignment(
                    name,
                    shown,
                    line,
                    redact(as_written),
                    span,
                    value_span,
                    exported=False,
                    unset=value is None,
                    redacted=secret,
                    command_only=True,
                )
            )
        return tuple(out), cleared

    def _batch_evaluated(self, raw: str) -> frozenset[str]:
        """What the batch shell evaluates in raw text (as written) that a task's shell would evaluate differently:
        its own live $(...), `...` (also as the reader expands them) and per-node/per-task $NAMEs, and what the
        variables named there hold already evaluated. Only variables that hold some are remembered, and the
        common case (no substitution, no such name) costs one regex search: 100k assignments stay fast."""
        if not self.evaluated and not _MAY_VARY.search(raw):
            return frozenset()
        from gpudoctor.readers.pertask import MAX_EVALUATED, evaluated_parts, referenced_names, varies

        parts = [p for p in evaluated_parts(raw) if varies(p)] if _MAY_VARY.search(raw) else []
        out = set(parts) | {
            self.expander.expand(p, self.known, PER_TASK_VARS) for p in parts if p.startswith(("$(", "`"))
        }
        for name in referenced_names(raw) if self.evaluated else ():
            if len(out) >= MAX_EVALUATED:
                break
            out |= self.evaluated.get(name, frozenset())
        return frozenset(out)


_SCRIPT_FILE = re.compile(r"(^\.{0,2}/|\.(sh|bash)$)")


def _unread_command(tokens: list[str]) -> bool:
    """A command run by the batch shell itself that may start the training but is no launch line gpudoctor reads:
    a shell script (`./run.sh`, `bash train.sh ARGS`, `sh x.sh`) or a command only known at run time (`$CMD`)."""
    from gpudoctor.readers.sbatch.launch import _strip_prefixes

    words = _strip_prefixes(tokens)
    if not words:
        return False
    first = words[0]
    if first in ("bash", "sh", "zsh") and len(words) > 1 and not words[1].startswith("-"):
        return True
    return first.startswith("$") or bool(_SCRIPT_FILE.search(first))


def _changed_directory(cwd: str | None, args: list[str]) -> str | None:
    """The working directory after `cd ARGS` (bash(1) cd: `cd` alone goes to $HOME; -L/-P/-e/-@ are options)."""
    args = [a for a in args if a not in ("-L", "-P", "-e", "-@", "--")]
    if not args or args[0] == "-" or "`" in args[0] or "$(" in args[0]:
        return UNKNOWN_DIRECTORY
    target = args[0]
    if re.fullmatch(r"\$\{?SLURM_SUBMIT_DIR\}?/?", target):
        return None  # where sbatch was run: where the job starts anyway
    if "$" in target or target.startswith("~") or cwd == UNKNOWN_DIRECTORY:
        return UNKNOWN_DIRECTORY
    if os.path.isabs(target) or cwd is None:
        return os.path.normpath(target) if os.path.isabs(target) else target
    return os.path.normpath(os.path.join(cwd, target))


def _task_directory(cwd: str | None, task_command: str) -> str | None:
    """The directory the launcher in `srun bash -c 'cd DIR && accelerate launch ...'` runs in."""
    cmds = split_commands(task_command)
    last = max((i for i, c in enumerate(cmds) if c and describe_command(c).get("launcher")), default=-1)
    for words in cmds[:last]:
        if words and words[0] in ("cd", "pushd"):
            cwd = _changed_directory(cwd, words[1:])
    return cwd


def _to_launch(desc: dict, line: int, text: str, expanded: str, span, cwd: str | None = None) -> Launch:
    srun = desc.get("srun")
    light = desc.get("lightning")

    def opt(key: str) -> str | None:
        value = desc.get(key)
        return None if value is None else str(value)

    return Launch(
        line=line,
        text=text,
        expanded=expanded,
        span=span,
        srun=SrunStep(
            MappingProxyType({k: v if v is True else redact(str(v)) for k, v in srun["options"].items()}),
            redact_words(srun["unknown"]),
        )
        if srun
        else None,
        program=desc.get("program"),
        launcher=desc.get("launcher"),
        module=desc.get("module"),
        script=desc.get("script"),
        script_args=redact_words(desc.get("script_args") or ()),
        nproc_per_node=opt("nproc_per_node"),
        nnodes=opt("nnodes"),
        num_processes=opt("num_processes"),
        node_rank=opt("node_rank"),
        standalone=bool(desc.get("standalone")),
        rdzv_backend=desc.get("rdzv_backend"),
        rdzv_endpoint=desc.get("rdzv_endpoint"),
        config_file=desc.get("config_file"),
        deepspeed_launcher=desc.get("deepspeed_launcher"),
        hostfile=opt("hostfile"),
        master_port=opt("master_port"),
        rdzv_id=opt("rdzv_id"),
        lightning=MappingProxyType(dict(light)) if light else None,
        inline=bool(desc.get("inline")),
        gpudoctor=bool(desc.get("gpudoctor")),
        via_shell=desc.get("via_shell"),
        launcher_options=MappingProxyType(
            {k: v if v is True else redact(str(v)) for k, v in desc["launcher_options"].items()}
        )
        if desc.get("launcher_options") is not None
        else None,
        cwd=cwd,
        task_command=desc.get("task_command"),
        batch_evaluated=desc.get("batch_evaluated") or frozenset(),
        argv=redact_words(desc.get("argv") or ()),
        wrappers=tuple(desc.get("wrappers") or ()),
        console_script=bool(desc.get("console_script")),
    )
