"""Environment changes as shell lines: for `eval "$(gpudoctor fix --shell)"` or a --env-file to `source`.

Each value reaches the shell as exactly its bytes (gpudoctor.shellquote: bare, single-quoted, or `$'...'`
for control characters and bytes that are not UTF-8); only a Reference that gpudoctor's own fix made
(`$SLURM_CPUS_PER_TASK`) stays live. A name that is not a shell name is never printed as an assignment.
Shell start-up files (~/.bashrc, ...) are never touched.
"""

from __future__ import annotations

from gpudoctor import shellquote


def line(name: str, value: str | None) -> str | None:
    """`export NAME=VALUE` or `unset NAME`; None when no shell line can do it (a name that is not a shell
    name, a value with a NUL byte): never a line that could do something else."""
    try:
        return shellquote.unset(name) if value is None else shellquote.export(name, value)
    except ValueError:
        return None


def lines(changes: dict[str, str | None]) -> list[str]:
    """The exports first, then the unsets (each sorted by name): a Reference reads the environment that was
    judged, before any variable the same plan unsets is gone."""
    out = []
    for name, value in sorted(changes.items(), key=lambda kv: (kv[1] is None, kv[0])):
        text = line(name, value)
        if text is not None:
            out.append(text)
    return out


def left_out(changes: dict[str, str | None]) -> list[str]:
    """One line per change no shell line can make, saying why (names and values shown quoted)."""
    out = []
    for name, value in sorted(changes.items()):
        if line(name, value) is None:
            why = "not a shell variable name" if not shellquote.is_name(name) else "its value holds a NUL byte"
            out.append(f"{shellquote.shown(name)}: {why}; no shell line can set it, so none is printed")
    return out


def render(changes: dict[str, str | None]) -> str:
    body = lines(changes)
    if not body:
        return ""
    return '# written by gpudoctor fix: source this file, or eval "$(gpudoctor fix --shell)"\n' + "\n".join(body) + "\n"
