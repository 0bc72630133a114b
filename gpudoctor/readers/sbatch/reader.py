"""Reading a SLURM batch script without running it: #SBATCH directives as sbatch reads them, the
body as bash reads it, into a typed BatchScript whose values keep their spans.

Directives are read as sbatch reads them (sbatch man page, "DESCRIPTION": options "may be
specified ... in the script as lines beginning with #SBATCH ... before any executable commands"):
`#SBATCH` at the very start of a line, short and long forms, `--opt=value` and `--opt value`, a
trailing `# comment` allowed; #SBATCH lines below the first command are ignored by sbatch and
reported as late_directives.

The body is read with the bash lexer of shell.py. The batch shell is task 0 on node 0, so
`$SLURM_PROCID` there expands to 0. Credential-named variables (gpudoctor.redact.is_credential_name)
are never expanded and their values never kept: evidence shows `$WANDB_API_KEY` or <redacted>.

A script that cannot be read, or whose directive values sbatch itself would reject, raises
SbatchError (cli.py prints it as one line and exits 2).
"""

from __future__ import annotations

import functools
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import replace
from types import MappingProxyType

from gpudoctor.readers import slurmfmt
from gpudoctor.readers.program import launched_program
from gpudoctor.readers.sbatch import names
from gpudoctor.readers.sbatch.launch import command_environment, describe_launch, side_step, trains
from gpudoctor.readers.sbatch.lookalike import find_lookalikes
from gpudoctor.readers.sbatch.options import INTEGER_OPTIONS, directive_marker, directive_words, read_options
from gpudoctor.readers.sbatch.script import (
    UNKNOWN_DIRECTORY,
    Assignment,
    BashSyntax,
    BatchScript,
    BrokenContinuation,
    Directive,
    Launch,
    SbatchError,
    ScriptLine,
    SrunStep,
    StrayArgument,
)
from gpudoctor.readers.sbatch.shell import (
    MAX_VALUE,
    POSITIONAL,
    Branches,
    Command,
    Expander,
    Source,
    Token,
    commands,
    split_commands,
    tokenize,
    unquote,
)
from gpudoctor.redact import REDACTED, is_credential_name, redact, redact_words

MAX_SCRIPT_BYTES = 8 * 1024 * 1024  # real batch scripts are kilobytes; this bounds memory and time
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
_MAX_DIGITS = 9  # sbatch reads counts as 32-bit integers; longer numbers are out of its range
# A directive number this long is refused outright (exit 2) rather than judged: Python's int() refuses
# over 4300 digits, and no SLURM value comes near. Shorter out-of-range counts are left to the checks.
_REFUSED_DIGITS = 100


def expand_vars(text: str, known: dict[str, str]) -> str:
    """$X, ${X}, ${X:-default} and integer $((...)) from the variables known; unknown ones stay as written.

    In single quotes and after a backslash the per-task SLURM variables stay as written: each task's
    shell expands them to its own values.
    """
    return Expander().expand(text, known, DEFERRED)


def _one_line(text: str) -> str:
    """A command as written, its line continuations joined."""
    if "\\\n" not in text:
        return text.strip()
    return re.sub(r"[ \t]*\\\n[ \t]*", " ", text).strip()


# ---------------------------------------------------------------- the job SLURM will create


def implied_slurm_env(directives: dict, job_name: str) -> dict[str, str]:
    """The SLURM_* values the directives give the batch shell (as far as they follow from them)."""
    env = {"SLURM_JOB_NAME": job_name}
    nodes = directives.get("nodes")
    if nodes and re.fullmatch(r"\d+", str(nodes)):
        env["SLURM_NNODES"] = env["SLURM_JOB_NUM_NODES"] = str(nodes)
    for opt, var in (
        ("ntasks", "SLURM_NTASKS"),
        ("ntasks-per-node", "SLURM_NTASKS_PER_NODE"),
        ("cpus-per-task", "SLURM_CPUS_PER_TASK"),
        ("gpus-per-node", "SLURM_GPUS_PER_NODE"),
        ("gpus-per-task", "SLURM_GPUS_PER_TASK"),
        ("gpus", "SLURM_GPUS"),
    ):
        if opt in directives and directives[opt] is not True:
            env[var] = str(directives[opt])
    if "ntasks" not in directives and "ntasks-per-node" in directives and "SLURM_NNODES" in env:
        try:
            env["SLURM_NTASKS"] = str(int(directives["ntasks-per-node"]) * int(env["SLURM_NNODES"]))
        except ValueError:
            pass
    gpn = gpus_per_node_requested(directives)
    if gpn is not None:
        env["SLURM_GPUS_ON_NODE"] = str(gpn.count)
    return env


def gpus_per_node_requested(directives: dict) -> slurmfmt.GpuRequest | None:
    """GPUs per node the directives ask for (--gres, --gpus-per-node, --gpus over --nodes); None if none named."""
    try:
        if directives.get("gres"):
            req = slurmfmt.parse_gres(directives["gres"])
            if req is not None:
                return req
        if directives.get("gpus-per-node"):
            return slurmfmt.parse_gpus(directives["gpus-per-node"])
        if directives.get("gpus"):
            total = slurmfmt.parse_gpus(directives["gpus"])
            nodes = directives.get("nodes")
            if nodes is None or str(nodes) == "1":
                return total
            if re.fullmatch(r"\d+", str(nodes)) and int(nodes) > 0 and total.count % int(nodes) == 0:
                return slurmfmt.GpuRequest(total.count // int(nodes), total.type)
    except slurmfmt.SlurmFormatError:
        return None
    return None


def _validate(directives: dict, lines: dict, path: str) -> None:
    """Values sbatch itself would refuse: one clear line instead of a wrong verdict."""
    for opt in INTEGER_OPTIONS:
        if opt in directives:
            value = directives[opt]
            if value is True or not re.fullmatch(r"\s*\d+\s*", str(value)):
                raise SbatchError(f"{path}:{lines.get(opt, '?')}: #SBATCH --{opt}={value}: expected a whole number")
    nodes = directives.get("nodes")
    if nodes is not None and not re.fullmatch(r"\d+(-\d+)?", str(nodes)):
        raise SbatchError(f"{path}:{lines.get('nodes', '?')}: #SBATCH --nodes={nodes}: expected N or MIN-MAX")
    for opt, parse in (
        ("gres", slurmfmt.parse_gres),
        ("gpus", slurmfmt.parse_gpus),
        ("gpus-per-node", slurmfmt.parse_gpus),
        ("gpus-per-task", slurmfmt.parse_gpus),
    ):
        if opt in directives:
            try:
                parse(str(directives[opt]))
            except slurmfmt.SlurmFormatError as e:
                raise SbatchError(f"{path}:{lines.get(opt, '?')}: #SBATCH --{opt}={directives[opt]}: {e}") from None


def _check_ranges(directives: dict, lines: dict, path: str) -> None:
    """Numbers of over _REFUSED_DIGITS digits refused before any int() can meet them."""
    for opt, value in directives.items():
        if value is True:
            continue
        for digits in re.findall(r"\d+", str(value)):
            if len(digits) > _REFUSED_DIGITS:
                shown = f"{digits[:12]}... ({len(digits)} digits)"
                raise SbatchError(f"{path}:{lines.get(opt, '?')}: #SBATCH --{opt}: the number {shown} is out of range")


# ---------------------------------------------------------------- the header (sbatch's reading)


def _header(src: Source, path: str):
    """(components [(directives, lines)], unknown, late, commented, first command offset)."""
    components: list[list[Directive]] = [[]]
    unknown: list[ScriptLine] = []
    late: list[ScriptLine] = []
    commented: list[ScriptLine] = []
    first_command: int | None = None
    offset = 0
    text = src.text
    for lineno, raw in enumerate(text.split("\n"), 1):
        start, offset = offset, offset + len(raw) + 1
        marker = directive_marker(raw)
        if first_command is not None and marker is None:
            continue  # below the first command only #SBATCH lines matter (sbatch ignores them)
        stripped = redact(raw.strip())  # shown in findings: a credential in `--export=...,TOKEN=x` never is
        line_span = src.span(start, start + len(raw))
        if marker is not None:
            entry = ScriptLine(lineno, stripped, line_span)
            if first_command is not None:
                late.append(entry)
                continue
            rest = raw[len(marker) :]
            # sbatch splits what follows the marker into words whether or not a blank comes first:
            # `#SBATCH--time=1:00` is read, `#SBATCHx` makes it refuse the script ("Invalid directive ... x")
            if rest.split()[:1] in (["hetjob"], ["packjob"]):  # the next component of a heterogeneous job
                components.append([])
                continue
            directives, bad = _directive_line(src, lineno, start + len(marker), rest, raw, line_span, path)
            components[-1].extend(directives)
            if bad:
                unknown.append(ScriptLine(lineno, stripped, line_span, tuple(bad)))
            continue
        if first_command is None and re.match(r"\s*#+\s*SBATCH\s", raw):
            commented.append(ScriptLine(lineno, stripped, line_span))  # '##SBATCH' / '# SBATCH' / '  #SBATCH'
        if not stripped or stripped.startswith("#"):
            continue
        if first_command is None:
            first_command = start
    return components, unknown, late, commented, first_command


# The words sbatch takes as directives at the very start of a line (src/sbatch/opt.c, _opt_batch_script,
# case-sensitive xstrncmp); #SLURM is still read in 22.05 and later, with "error: Change from #SLURM to #SBATCH".
def _directive_line(src: Source, lineno: int, base: int, rest: str, raw: str, line_span, path: str):
    tokens = directive_words(rest)
    if any(t.unterminated for t in tokens):
        raise SbatchError(f"{path}:{lineno}: cannot split {raw.strip()!r} into words (No closing quotation)")
    words = [unquote(t.text) for t in tokens]
    try:
        hits, bad, _ = read_options(words, stop_at_command=False)
    except SbatchError as e:
        raise SbatchError(f"{path}:{lineno}: #SBATCH: {e}") from None
    out = []
    for h in hits:
        opt_tok = tokens[h.word]
        end_tok = tokens[h.value_word] if h.value_word is not None else opt_tok
        value_span = None
        if h.value_word is not None:
            vt = tokens[h.value_word]
            value_span = src.span(base + vt.start + h.value_offset, base + vt.end)
        value = h.value if isinstance(h.value, bool) else redact(h.value)
        out.append(
            Directive(
                h.option,
                value,
                h.written,
                lineno,
                redact(raw.strip()),
                src.span(base + opt_tok.start, base + end_tok.end),
                value_span,
                line_span,
            )
        )
    return out, bad


_SRUN_WORD = re.compile(r"(?<![\w.-])srun(?![\w.-])")


def _srun_lines(text: str) -> tuple[int, ...]:
    """Lines that name srun outside a comment: in a command, a variable's value, an alias or a heredoc alike
    (where it is named, a step may be started; where it is nowhere, none is)."""
    if "srun" not in text:
        return ()
    code = names.code_text(text)
    return names.line_numbers(code, [m.start() for m in _SRUN_WORD.finditer(code)])


def _until_comment(tokens: list[Token]) -> list[Token]:
    out = []
    for t in tokens:
        if t.kind in ("comment", "newline"):
            break
        out.append(t)
    return out


# ---------------------------------------------------------------- the body (bash's reading)

_ESCAPED_BLANK_END = re.compile(r"(?<!\\)(?:\\\\)*\\[ \t]$")


def _broken_continuations(src: Source, tokens: list[Token]) -> list[BrokenContinuation]:
    """Words that end in backslash-blank as the last thing on their line (before an optional comment)."""
    found = []
    for i, tok in enumerate(tokens):
        if tok.kind != "word" or tok.text[-1:] not in (" ", "\t") or not _ESCAPED_BLANK_END.search(tok.text):
            continue
        j = i + 1
        if j < len(tokens) and tokens[j].kind == "comment":
            j += 1
        if j >= len(tokens) or tokens[j].kind != "newline":
            continue
        after = text_after = src.text[tok.end : tokens[j].start]
        if after.strip() and not after.strip().startswith("#"):
            continue
        nxt = next((t for t in tokens[j + 1 :] if t.kind != "newline"), None)
        if nxt is None or nxt.kind != "word":
            continue
        next_cmd = next((c for c in commands(tokens[j + 1 :]) if c.start == nxt.start), None)
        line, _ = src.position(tok.start)
        next_line, _ = src.position(nxt.start)
        next_text = _one_line(src.text[next_cmd.start : next_cmd.end]) if next_cmd else nxt.text
        backslash_at = tok.end - len(tok.text) + tok.text.rstrip(" \t").rfind("\\")
        found.append(
            BrokenContinuation(
                line,
                redact(src.line_text(line).strip()),
                src.span(backslash_at, tok.end + len(text_after) - len(text_after.lstrip(" \t"))),
                next_line,
                redact(next_text),
                unquote(nxt.text),
            )
        )
    return found


# A first word that names no command: an option (`--lr`), a Hydra/OmegaConf override (`trainer.devices=8`,
# `+model.x=1`, `~key`) -- not a shell assignment, whose name has no dots.
_ARGUMENT_WORD = re.compile(r"--?[A-Za-z][\w.-]*(=.*)?|[+~]{0,2}[A-Za-z_]\w*(\.[\w-]+)+=.*", re.S)


def _stray_arguments(src: Source, cmds: list[Command], reported: set[int]) -> list[StrayArgument]:
    """Commands whose first word is an argument, not a command, outside the lines a broken continuation reported."""
    found = []
    previous_end: int | None = None  # offset where the command before ends
    case_depth = 0  # `case ... in --help) ...;; esac`: a pattern is not a command
    for cmd in cmds:
        first = unquote(cmd.words[0].text)
        case_depth += (first == "case") - (first == "esac")
        if case_depth <= 0 and _ARGUMENT_WORD.fullmatch(first):
            line = src.position(cmd.start)[0]
            if line not in reported:
                end_above = src.position(previous_end)[0] if previous_end is not None else None
                found.append(
                    StrayArgument(
                        line,
                        redact(_one_line(src.text[cmd.start : cmd.end])),
                        src.span(cmd.start, cmd.end),
                        redact(first),
                        end_above if end_above == line - 1 else None,
                    )
                )
        previous_end = cmd.end
    return found


class _Body:
    """The body's commands in order, with the variables known so far."""

    def __init__(self, src: Source, path: str, known: dict[str, str], arguments: tuple[str, ...] | None = None) -> None:
        self.src, self.path, self.known, self.arguments = src, path, known, arguments
        self.expander = Expander()
        self.assignments: list[Assignment] = []
        self.launches: list[tuple[Launch, dict]] = []
        self.arrays: set[str] = set()
        self.branches = Branches()
        self.chdirs: list[tuple[int, str]] = []
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
        as_written = _one_line(self.src.text[cmd.start : cmd.end])
        subs = [cmd] if expanded == original else commands(tokenize(expanded))  # re-read only what expansion changed
        for sub in subs:
            tokens = self.branches.feed([unquote(w.text) for w in sub.words])
            if not tokens or not self.branches.may_run:
                continue
            if tokens[0] == "export":
                for tok in tokens[1:]:
                    self._assign(tok, cmd, line, as_written, exported=True)
                continue
            if tokens[0] in ("shift", "set") and self.arguments is not None and self._positional(tokens):
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
        self.known.update(_positional(self.arguments))
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
    from gpudoctor.readers.sbatch.launch import describe_command

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
    )


def _het_group(launch: Launch | None, components: int) -> int:
    """The heterogeneous-job component the training step runs in (srun --het-group=N; 0 by default)."""
    if components <= 1 or launch is None or launch.srun is None:
        return 0
    first = re.match(r"\d+", str(launch.srun.options.get("het-group", "0")))
    n = int(first.group(0)) if first and len(first.group(0)) <= _MAX_DIGITS else 0
    return n if n < components else 0


# ---------------------------------------------------------------- entry points


# `fix` reads the same text several times (check's inputs, each fix's anchors, the verification of an edit):
# the last few parses are kept, so its cost stays a small multiple of check's. BatchScript is frozen.
_PARSE_CACHE = 4


def _positional(arguments: tuple[str, ...] | None) -> dict[str, str]:
    """$1 ... and "$@"/"$*"/"$#" from the arguments given to the script; none when they are not known."""
    if arguments is None:
        return {}
    known = {str(i): "" for i in range(1, 100)}  # bash: a parameter past the last argument is empty
    known.update({str(i): a for i, a in enumerate(arguments, 1)})
    known.update({"@": " ".join(arguments), "*": " ".join(arguments), "#": str(len(arguments))})
    return known


def parse_sbatch(text: str, path: str = "<script>", arguments: tuple[str, ...] | None = None) -> BatchScript:
    """The script read as sbatch (directives) and bash (body) read it; raises SbatchError.

    arguments: what `sbatch FILE ARGS` passes the script ($1, $2, ...); None when not known, and then every
    reference to one stays as written (unknown), never read as empty."""
    return _parse_sbatch_cached(text, path, None if arguments is None else tuple(arguments))


@functools.lru_cache(maxsize=_PARSE_CACHE)
def _parse_sbatch_cached(text: str, path: str, arguments: tuple[str, ...] | None) -> BatchScript:
    src = Source(text)
    components, unknown, late, commented, first_command = _header(src, path)
    values = []
    for directives in components:
        opts = {d.option: d.value for d in directives}
        lines = {d.option: d.line for d in directives}
        _check_ranges(opts, lines, path)
        _validate(opts, lines, path)
        values.append(opts)
    job_name = str(values[0].get("job-name") or os.path.basename(path))
    known = implied_slurm_env(values[0], job_name)
    # The batch shell is task 0 on node 0: `export RANK=$SLURM_PROCID` there gives every srun task RANK=0.
    batch_shell = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
    known.update(batch_shell)
    known.update(_positional(arguments))
    tokens = tokenize(text)
    body = _Body(src, path, known, tuple(arguments) if arguments is not None else None)
    cmds = commands(tokens)
    body.read(cmds)
    descs = [d for _, d in body.launches]
    launches = [launch for launch, _ in body.launches]
    training = [i for i, d in enumerate(descs) if trains(d)]
    main = next(
        (i for i in reversed(training) if not side_step(descs[i], descs[:i])), training[-1] if training else None
    )
    launch = launches[main] if main is not None else None
    broken = _broken_continuations(src, tokens)
    group = _het_group(launch, len(components))
    chosen = list(components[group])
    if group and values[0].get("job-name") and "job-name" not in values[group]:
        chosen.insert(0, next(d for d in reversed(components[0]) if d.option == "job-name"))
    return BatchScript(
        path=path,
        job_name=job_name,
        directives=tuple(chosen),
        het_components=len(components),
        het_group=group,
        unknown_directives=tuple(unknown),
        late_directives=tuple(late),
        commented_directives=tuple(commented),
        lookalike_directives=tuple(find_lookalikes(src)),
        assignments=tuple(body.assignments),
        launches=tuple(launches),
        launch=launch,
        broken_continuations=tuple(broken),
        stray_arguments=tuple(_stray_arguments(src, cmds, {b.next_line for b in broken})),
        first_command_line=src.position(first_command)[0] if first_command is not None else None,
        srun_lines=_srun_lines(text),
        arguments=tuple(arguments) if arguments is not None else None,
        assigned_names=names.assigned_names(text),
        other_sources=names.other_sources(text),
        chdirs=tuple(body.chdirs),
        variables=MappingProxyType(
            {
                k: redact(v)
                for k, v in known.items()
                if not k.startswith("SLURM_") and k not in batch_shell and k not in POSITIONAL
            }
        ),
    )


def load_sbatch(
    path: str, check_syntax: Callable[[str], BashSyntax] | None = None, arguments: tuple[str, ...] | None = None
) -> BatchScript:
    """Read and parse a batch script; SbatchError for a missing, unreadable, oversized or malformed one.

    check_syntax: what the script's text is also given to, its answer recorded in BatchScript.bash_syntax
    (gpudoctor.probe.bash.bash_syntax: `bash -n`, bounded; a reader runs nothing itself).
    arguments: the script's own arguments (`sbatch FILE ARGS`), when known.
    """
    text = _read_script(path)
    if "\x00" in text:
        raise SbatchError(f"--sbatch {path}: a binary file, not a batch script")
    _check_sbatch_accepts(text, path)
    from gpudoctor.readers.accelerate import with_config_files

    script = with_config_files(parse_sbatch(text, path, arguments))
    if check_syntax:
        script = replace(script, bash_syntax=check_syntax(text))
    return replace(script, program=launched_program(script))  # readers/program.py: what the launch runs


def _read_script(path: str) -> str:
    """The file's text, read only if it is a regular file of at most MAX_SCRIPT_BYTES (a FIFO would block
    forever, /dev/zero never ends): gpudoctor.fileio's bounded read."""
    from gpudoctor.fileio import FileIOError, read_input

    try:
        # sbatch reads bytes: a stray Latin-1 byte in a comment is no reason to refuse the script; \r\n is kept.
        return read_input(path, "--sbatch", MAX_SCRIPT_BYTES, errors="replace")
    except FileIOError as e:
        raise SbatchError(str(e)) from None


def _check_sbatch_accepts(text: str, path: str) -> None:
    """The whole-file checks sbatch makes before it reads any directive."""
    if not text.strip():
        raise SbatchError(
            f"--sbatch {path}: the script is {'empty' if not text else 'only whitespace'}; sbatch refuses it"
        )
    if not text.startswith("#!"):
        raise SbatchError(
            f"--sbatch {path}: the first line must start with #! and an interpreter (#!/bin/bash); sbatch refuses it"
        )
    if "\r\n" in text:
        raise SbatchError(
            f"--sbatch {path}: DOS line breaks (\\r\\n); sbatch refuses it: "
            f"gpudoctor fix --sbatch {path} --apply converts them (a backup kept), or run dos2unix {path}"
        )
