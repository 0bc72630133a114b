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
_VALUE_OR_QUOTED = re.compile(r"""=(?:"[^"]*"|'[^']*'|\S*)|"[^"]*"|'[^']*'""")
_LIST = re.compile(r"\b(read|mapfile|readarray|declare|typeset|local|readonly|export)\b([^;&|\n]*)")
# Lines that may set any variable: a sourced file, eval, an environment module, conda/virtualenv activation (read
# wherever the word stands: a false hit only turns a fail into a warn)
_OTHER_SOURCE = re.compile(r"(?<![\w./$-])(?:source|\.|eval|module|ml|conda[ \t]+activate)[ \t]+[^\s&|;]")


_COMMENT_LINE = re.compile(r"^[ \t]*#.*$", re.M)


def code_text(text: str) -> str:
    """The text with comment lines blanked (line numbers kept): one pass over the whole script."""
    return _COMMENT_LINE.sub("", text) if "#" in text else text


def assigned_names(text: str) -> frozenset[str]:
    """Every name some line of the script may give a value (whatever branch it is in)."""
    code = code_text(text)
    names: set[str] = set(_ASSIGNED.findall(code))
    names.update(n for groups in _LOOP.findall(code) for n in groups if n)
    names.update(_DEFAULT_ASSIGN.findall(code))
    for _, rest in _LIST.findall(code):
        # the names only: a value (`export A=hf_...`) is never kept, and quoted text is no name
        rest = _VALUE_OR_QUOTED.sub(" ", rest)
        names.update(re.findall(rf"(?<![\w$-]){_NAME}", rest))
    return frozenset(names)


def line_numbers(text: str, offsets: list[int]) -> tuple[int, ...]:
    """1-based line numbers of sorted offsets, in one pass."""
    out, line, at = [], 1, 0
    for offset in offsets:
        line += text.count("\n", at, offset)
        at = offset
        out.append(line)
    return tuple(dict.fromkeys(out))


def other_sources(text: str) -> tuple[int, ...]:
    """Lines that may set variables the script does not name: `source f`, `. f`, `eval`, `module load`, ..."""
    code = code_text(text)
    return line_numbers(code, [m.start() for m in _OTHER_SOURCE.finditer(code)])
