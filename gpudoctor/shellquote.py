"""Text gpudoctor prints for a shell to read (`eval "$(gpudoctor fix --shell)"`, a sourced --env-file, an
`export` line written into a batch script, a command in the report's next steps): every value reaches the
shell as exactly its bytes, whatever they are, and never as a command.

The one rule, for every writer of shell text (fixes/envfile.py, fixes/sbatch_edit.py, report/text.py,
report/preflight.py):
- a value made only of `[A-Za-z0-9_@%+=:,./-]` (shlex's safe set; not starting with `=`, which zsh's EQUALS
  option expands) is printed bare;
- a value with a character a terminal would act on (C0 and C1 controls, DEL, newline, tab, Unicode format
  and line/paragraph separators) or a byte that is not UTF-8 (os.environ keeps those as surrogate escapes)
  is printed ANSI-C quoted, `$'...'`, every byte outside printable ASCII as a three-digit octal escape
  `\\NNN` (hex escapes may swallow a following hex digit in ksh93; POSIX leaves over two digits
  unspecified). bash, zsh, ksh93, mksh and busybox sh read `$'...'`, and POSIX.1-2024 (XCU 2.2.4,
  Dollar-Single-Quotes) made it standard; a shell without it (dash 0.5.12) reads a `$` and a quoted string,
  so a wrong value, never a command. Single quotes would keep these bytes exact too, but would put them
  raw on the user's terminal (an OSC 52 clipboard write, a cursor move) and break the one-line-per-variable
  output;
- any other value is single-quoted as shlex.quote does (POSIX XCU 2.2.2: inside single quotes no character
  is special, so `$(...)`, backticks, `${X@P}`, `${PATH:$(cmd)}` stay text); a `'` is written `'"'"'`.
A value that gpudoctor itself means as a reference to a variable of the shell where it runs
(`SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK`) is a `Reference`, never a value read from the user's
environment or files, and is printed as `"$NAME"`: a plain parameter expansion, which the shell does not
evaluate further.

A variable name must be a shell name (POSIX XBD 3.216: `[A-Za-z_][A-Za-z0-9_]*`); anything else is never
printed as an assignment or unset (`is_name`).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BARE = re.compile(r"[A-Za-z0-9_@%+:,./-][A-Za-z0-9_@%+=:,./-]*")
# Characters a terminal acts on or that break a line: controls (Cc), format characters such as bidi
# overrides (Cf), surrogates (Cs: os.environ's escapes of non-UTF-8 bytes), private-use and unassigned code
# points (Co, Cn), and the Unicode line and paragraph separators (Zl, Zp).
_UNPRINTABLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


class Reference(str):
    """`$NAME`: a value gpudoctor means to be expanded by the shell where the fix runs. Only gpudoctor's
    own fixes make one; a value read from anywhere else is a plain str and printed literally."""

    name: str

    def __new__(cls, name: str) -> Reference:
        if not is_name(name):
            raise ValueError(f"not a shell variable name: {name!r}")
        self = super().__new__(cls, "$" + name)
        self.name = name
        return self


def is_name(name: object) -> bool:
    """A name a POSIX shell can assign, export or unset."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def unprintable(ch: str) -> bool:
    """A character a terminal acts on, that breaks a line, or that stands for a byte that is not UTF-8."""
    return unicodedata.category(ch) in _UNPRINTABLE_CATEGORIES


def _raw_bytes(value: str) -> bytes:
    """The bytes a str from os.environ (or a file read with surrogateescape) stands for."""
    return value.encode("utf-8", "surrogateescape")


def quote(value: str) -> str:
    """One shell word that the shell reads back as exactly the bytes of value (see the module's rule).

    A Reference becomes `"$NAME"`. A NUL byte, which no shell variable or argument can hold, raises
    ValueError."""
    if isinstance(value, Reference):
        return f'"${value.name}"'
    value = str(value)
    if "\0" in value:
        raise ValueError("a NUL byte, which no shell word can hold")
    if _BARE.fullmatch(value):
        return value
    if any(unprintable(ch) for ch in value):
        return _ansi_c(value)
    return "'" + value.replace("'", "'\"'\"'") + "'"


def _ansi_c(value: str) -> str:
    """`$'...'` with every byte outside printable ASCII as \\NNN, and `\\` and `'` escaped."""
    out = []
    for byte in _raw_bytes(value):
        if byte in (0x5C, 0x27):  # \ and '
            out.append("\\" + chr(byte))
        elif 0x20 <= byte < 0x7F:
            out.append(chr(byte))
        else:
            out.append(f"\\{byte:03o}")
    return "$'" + "".join(out) + "'"


def command(words: Iterable[str]) -> str:
    """A command line that runs words as they are (each one quoted)."""
    return " ".join(quote(w) for w in words)


def export(name: str, value: str) -> str:
    """`export NAME=VALUE`; ValueError for a name that is not a shell name or a value with a NUL byte."""
    if not is_name(name):
        raise ValueError(f"not a shell variable name: {shown(name)}")
    return f"export {name}={quote(value)}"


def unset(name: str) -> str:
    """`unset NAME`; ValueError for a name that is not a shell name."""
    if not is_name(name):
        raise ValueError(f"not a shell variable name: {shown(name)}")
    return f"unset {name}"


def shown(text: str) -> str:
    """text for a message, quoted as the shell would need it (so a control byte in a name is never raw)."""
    return quote(text.replace("\0", "\\0"))
