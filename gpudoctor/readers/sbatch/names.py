"""Which variables a batch script can set, read from its text: every way bash(1) gives a variable a value.

A variable that no line of the script assigns, and that no sourced file, `eval` or environment module could
set, is set in the job only if the job inherits it: sbatch passes the submitting shell's environment by
default (--export=ALL, sbatch(1) "--export"), nothing of it with --export=NONE (or NIL).

Over-reading is the safe side: a name read here as assigned is never called unset.
"""

from __future__ import annotations

import re

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
# bash(1): `NAME=value` / `NAME+=value` (also as a prefix or after export/declare/local/readonly/typeset)
_ASSIGNED = re.compile(rf"(?<![\w$-])({_NAME})(?:\[[^\]]*\])?\+?=")
# `for NAME in`, `select NAME in`, `getopts optstring NAME`, `printf -v NAME`
_LOOP = re.compile(rf"\b(?:for|select)\s+({_NAME})\b|\bgetopts\s+\S+\s+({_NAME})|\bprintf\s+-v\s+({_NAME})")
# `${NAME:=default}` / `${NAME=default}` assign as they expand
_DEFAULT_ASSIGN = re.compile(rf"\$\{{({_NAME}):?=")
# `read [-r ...] NAME...`, `mapfile/readarray [opts] NAME`, `declare/export/local/readonly/typeset NAME ...`
_LIST = re.compile(r"\b(read|mapfile|readarray|declare|typeset|local|readonly|export)\b([^;&|\n]*)")
# Lines that may set any variable: a sourced file, eval, an environment module, conda/virtualenv activation
_OTHER_SOURCE = re.compile(
    r"(?:^|[;&|(]|\bthen\b|\bdo\b|\belse\b)\s*(?:source|\.|eval|module|ml|conda\s+activate)\s+\S", re.M
)


def _code_lines(text: str) -> list[tuple[int, str]]:
    return [(n, line) for n, line in enumerate(text.split("\n"), 1) if not line.lstrip().startswith("#")]


def assigned_names(text: str) -> frozenset[str]:
    """Every name some line of the script may give a value (whatever branch it is in)."""
    names: set[str] = set()
    for _, line in _code_lines(text):
        names.update(_ASSIGNED.findall(line))
        names.update(n for groups in _LOOP.findall(line) for n in groups if n)
        names.update(_DEFAULT_ASSIGN.findall(line))
        for _, rest in _LIST.findall(line):
            names.update(w for w in re.findall(rf"(?<![\w$-]){_NAME}", rest))
    return frozenset(names)


def other_sources(text: str) -> tuple[int, ...]:
    """Lines that may set variables the script does not name: `source f`, `. f`, `eval`, `module load`, ..."""
    return tuple(n for n, line in _code_lines(text) if _OTHER_SOURCE.search(line))
