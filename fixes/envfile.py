"""Environment changes as shell lines: for `eval "$(gpudoctor fix --shell)"` or a --env-file to `source`.

Values are quoted for bash; a value that refers to another variable (`$SLURM_CPUS_PER_TASK`) stays
a live reference in double quotes. Shell start-up files (~/.bashrc, ...) are never touched.
"""

from __future__ import annotations

import re
import shlex

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def shell_value(value: str) -> str:
    if re.fullmatch(r"[A-Za-z0-9_:.,/%@+=\-]+", value):
        return value
    if "$" in value and re.fullmatch(r"[^\"\\`]*", value) and "$(" not in value:
        return f'"{value}"'
    return shlex.quote(value)


def lines(changes: dict[str, str | None]) -> list[str]:
    out = []
    for name, value in sorted(changes.items()):
        if not _NAME.match(name):
            continue  # not a variable bash can set; never emit it into an eval'd line
        out.append(f"unset {name}" if value is None else f"export {name}={shell_value(value)}")
    return out


def render(changes: dict[str, str | None]) -> str:
    body = lines(changes)
    if not body:
        return ""
    return '# written by gpudoctor fix: source this file, or eval "$(gpudoctor fix --shell)"\n' + "\n".join(body) + "\n"
