"""Reading a SLURM batch script without running it: #SBATCH directives as sbatch reads them (header.py),
the body as bash reads it (body.py, with the lexer of shell.py), into a typed BatchScript (script.py) whose
values keep their spans.

A script that cannot be read, or whose directive values sbatch itself would reject, raises
SbatchError (cli.py prints it as one line and exits 2).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace
from types import MappingProxyType

from gpudoctor.readers.program import launched_program
from gpudoctor.readers.sbatch import names
from gpudoctor.readers.sbatch.body import Body, positional_parameters
from gpudoctor.readers.sbatch.continuations import broken_continuations, stray_arguments
from gpudoctor.readers.sbatch.header import component_values, implied_slurm_env, read_header
from gpudoctor.readers.sbatch.launch import side_step, trains
from gpudoctor.readers.sbatch.lookalike import find_lookalikes
from gpudoctor.readers.sbatch.script import BashSyntax, BatchScript, Launch, SbatchError
from gpudoctor.readers.sbatch.shell import POSITIONAL, Source, commands, tokenize
from gpudoctor.redact import redact

MAX_SCRIPT_BYTES = 8 * 1024 * 1024  # real batch scripts are kilobytes; this bounds memory and time
_MAX_DIGITS = 9  # sbatch reads counts as 32-bit integers; longer numbers are out of its range


_SRUN_WORD = re.compile(r"(?<![\w.-])srun(?![\w.-])")


def _srun_lines(text: str) -> tuple[int, ...]:
    """Lines that name srun outside a comment: in a command, a variable's value, an alias or a heredoc alike
    (where it is named, a step may be started; where it is nowhere, none is)."""
    if "srun" not in text:
        return ()
    code = names.code_text(text)
    return names.line_numbers(code, [m.start() for m in _SRUN_WORD.finditer(code)])


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


# The file and arguments a script being edited is read as (editing()); outside it, the defaults of parse_sbatch.
_EDITED_AS: ContextVar[tuple[str, tuple[str, ...] | None]] = ContextVar(
    "gpudoctor_sbatch_edited_as", default=("<script>", None)
)


def parse_sbatch(text: str, path: str = "<script>", arguments: tuple[str, ...] | None = None) -> BatchScript:
    """The script read as sbatch (directives) and bash (body) read it; raises SbatchError.

    arguments: what `sbatch FILE ARGS` passes the script ($1, $2, ...); None when not known, and then every
    reference to one stays as written (unknown), never read as empty."""
    return _parse_sbatch_cached(text, path, None if arguments is None else tuple(arguments))


@contextmanager
def editing(path: str, arguments: tuple[str, ...] | None) -> Iterator[None]:
    """Within the block, reparse_sbatch reads text as the file at `path` given `arguments` is read (fix's plan)."""
    token = _EDITED_AS.set((path, None if arguments is None else tuple(arguments)))
    try:
        yield
    finally:
        _EDITED_AS.reset(token)


def reparse_sbatch(text: str) -> BatchScript:
    """text (the script being edited, or an edit of it) read as the script being edited is (editing()): an edit
    anchors on spans, which neither the path nor the arguments change, and its parses then hit the cache that the
    check before it and the verification after it fill (fix read a 16,000-line script 5 times over, 3 of them
    needlessly)."""
    return _parse_sbatch_cached(text, *_EDITED_AS.get())


@functools.lru_cache(maxsize=_PARSE_CACHE)
def _parse_sbatch_cached(text: str, path: str, arguments: tuple[str, ...] | None) -> BatchScript:
    src = Source(text)
    components, unknown, late, commented, first_command = read_header(src, path)
    values = component_values(components, path)
    job_name = str(values[0].get("job-name") or os.path.basename(path))
    known = implied_slurm_env(values[0], job_name)
    # The batch shell is task 0 on node 0: `export RANK=$SLURM_PROCID` there gives every srun task RANK=0.
    batch_shell = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
    known.update(batch_shell)
    known.update(positional_parameters(arguments))
    tokens = tokenize(text)
    body = Body(src, path, known, tuple(arguments) if arguments is not None else None)
    cmds = commands(tokens)
    body.read(cmds)
    descs = [d for _, d in body.launches]
    launches = [launch for launch, _ in body.launches]
    training = [i for i, d in enumerate(descs) if trains(d)]
    main = next(
        (i for i in reversed(training) if not side_step(descs[i], descs[:i])), training[-1] if training else None
    )
    launch = launches[main] if main is not None else None
    broken = broken_continuations(src, tokens)
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
        unread_commands=tuple(body.unread),
        wait_lines=tuple(body.waits),
        launch=launch,
        broken_continuations=tuple(broken),
        stray_arguments=tuple(stray_arguments(src, cmds, {b.next_line for b in broken})),
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
    script = replace(script, program=launched_program(script))  # readers/program.py: what the launch runs
    return replace(script, task_script=_task_script(script))


_SHELL_SCRIPT = re.compile(r"\.(sh|bash)$")


def _task_script(script: BatchScript) -> tuple[str, str] | None:
    """The shell script the training launch runs (`srun ./run.sh`, `srun bash run.sh ARGS`), read where it is there
    (relative paths as the program's: readers/program.program_bases); None otherwise."""
    from gpudoctor.readers.program import MAX_PROGRAM_BYTES, program_bases, program_candidates

    launch = script.launch
    if launch is None or launch.launcher or not launch.argv:
        return None
    argv = list(launch.argv)
    if os.path.basename(argv[0]) in ("bash", "sh") and len(argv) > 1 and not argv[1].startswith("-"):
        argv = argv[1:]
    entry = argv[0]
    if not _SHELL_SCRIPT.search(entry) or re.search(r"[$`]", entry):
        return None
    bases, _ = program_bases(script)
    for path in program_candidates(entry, bases):
        if os.path.isfile(path):
            from gpudoctor.fileio import FileIOError, read_input

            try:
                return path, read_input(path, "", MAX_PROGRAM_BYTES, errors="replace")
            except (FileIOError, OSError, ValueError):
                return None
    return None


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
