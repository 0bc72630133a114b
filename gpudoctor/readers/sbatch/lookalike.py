"""Lines of a batch script's header that look like #SBATCH directives but that sbatch does not read.

sbatch's rule (src/sbatch/opt.c, _opt_batch_script, 22.05 and later): a line is a directive only when
it starts, at its very first character and case-sensitively, with `#SBATCH` (or the old `#SLURM`);
a line whose first non-blank character is `#` is a comment and reading goes on; any other line is a
command and reading stops there. Verified with sbatch 22.05.8 on the test cluster (`sbatch -H` and
`scontrol show job`): `#SBATCh`, `#SBTACH`, `# SBATCH`, `#  SBATCH`, `##SBATCH` and `  #SBATCH`
lines set nothing; `!#SBATCH --x` is a command (bash: "!#SBATCH: command not found") and every
#SBATCH line below it is ignored as well.

A look-alike is such a comment or first command whose marker is `#SBATCH` give or take one slip
(indentation, a blank after `#`, one letter changed, dropped, added or two swapped, letter case, a
stray character before it) and whose remaining words are all sbatch options: prose ("# SBATCH
options below") and usage notes ("# sbatch --array=0-9 job.sh") name words that are no option.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpudoctor.readers.sbatch.options import directive_marker, directive_words, read_options
from gpudoctor.readers.sbatch.script import SbatchError, Span
from gpudoctor.redact import redact

MAGIC = "#SBATCH"
# blanks, one or more '#' (blanks between them: `# #SBATCH`), blanks, the word
_COMMENT_MARKER = re.compile(
    r"(?P<indent>[ \t]*)(?P<hashes>#(?:[ \t]*#)*)(?P<gap>[ \t]*)(?P<word>[A-Za-z]+)(?=[ \t-]|$)"
)
# a command whose first word is #SBATCH behind one or two stray characters: `!#SBATCH`, `\#SBATCH`
_COMMAND_MARKER = re.compile(r"(?P<indent>[ \t]*)(?P<stray>[^\s#]{1,2})#SBATCH(?=[ \t-]|$)")

FORMS = {
    "indented": "is indented: sbatch reads only lines that begin with #SBATCH at their first character",
    "spaced": "has a blank between # and SBATCH: to sbatch it is a comment",
    "misspelt": "is not spelt #SBATCH (sbatch matches the word exactly, upper case): to sbatch it is a comment",
    "disabled": "is disabled with a second '#': a comment to sbatch",
    "command": "is a command to bash, not a comment: bash fails on it and sbatch stops reading directives there",
}


@dataclass(frozen=True)
class LookalikeDirective:
    """A header line that looks like an #SBATCH directive and is not read as one."""

    line: int
    text: str  # the line as written, its indentation kept (credential values redacted)
    span: Span  # the whole line
    form: str  # a key of FORMS
    written: str  # the marker as written: "  #SBATCH", "# SBATCH", "#SBATCh", "##SBATCH", "!#SBATCH"
    marker: Span  # the marker, which a repair replaces with "#SBATCH"
    options: tuple[tuple[str, str | bool], ...]  # (canonical sbatch option, value) on the line
    rest: str = ""  # what follows the marker, as written (redacted)
    hides: tuple[int, ...] = ()  # a command form: the #SBATCH lines below it, up to the next command, sbatch skips

    @property
    def repaired(self) -> str:
        """The line as sbatch would read it: `#SBATCH` and the rest as written."""
        return MAGIC + self.rest

    @property
    def repairable(self) -> bool:
        """A slip, not a line disabled on purpose (`##SBATCH` is the usual way to switch a directive off)."""
        return self.form != "disabled"


def one_slip(word: str, target: str = "SBATCH") -> bool:
    """word is target after at most one changed, dropped, added or swapped-neighbour letter (letter case aside)."""
    a, b = word.upper(), target
    if a == b:
        return True
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        if len(diff) == 1:
            return True
        return len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]]
    if abs(len(a) - len(b)) != 1:
        return False
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    return any(long_[:i] + long_[i + 1 :] == short for i in range(len(long_)))


def options_after_marker(rest: str) -> tuple[tuple[str, str | bool], ...]:
    """The sbatch options of the words after a marker; () when any word is not an option or its value."""
    from gpudoctor.readers.sbatch.shell import unquote

    tokens = directive_words(rest)  # the words exactly as sbatch splits them
    if not tokens or any(t.unterminated for t in tokens):
        return ()
    try:
        hits, bad, _ = read_options([unquote(t.text) for t in tokens], stop_at_command=False)
    except SbatchError:
        return ()
    return () if bad or not hits else tuple((h.option, h.value) for h in hits)


def _classify(raw: str, is_command: bool) -> tuple[str, int] | None:
    """(form, end of the marker) for a look-alike line; None otherwise."""
    if is_command:
        m = _COMMAND_MARKER.match(raw)
        return ("command", m.end()) if m else None
    m = _COMMENT_MARKER.match(raw)
    if m is None or len(m.group("word")) < 5 or not one_slip(m.group("word")):
        return None
    word, gap = m.group("word"), m.group("gap")
    if word == "sbatch" and gap:  # `# sbatch --array=0-9`: the command's name in a usage note
        return None
    if m.group("hashes").count("#") > 1:
        return "disabled", m.end()
    if word != "SBATCH":
        return "misspelt", m.end()
    return ("spaced" if gap else "indented"), m.end()


def find_lookalikes(src) -> list[LookalikeDirective]:
    """Look-alike lines of the header: from the top down to the first command that is not itself a look-alike.

    A `!#SBATCH` command ends sbatch's reading, but once it is repaired the header runs on to the next command:
    the lines in between are scanned too, so that one repair does not uncover another slip, and the #SBATCH
    lines there are the ones the command hides.
    """
    from dataclasses import replace

    found: list[LookalikeDirective] = []
    hidden: dict[int, list[int]] = {}  # index in found of the last command form -> directive lines below it
    last_command: int | None = None
    offset = 0
    for lineno, raw in enumerate(src.text.split("\n"), 1):
        start, offset = offset, offset + len(raw) + 1
        if directive_marker(raw) is not None:
            if last_command is not None:
                hidden.setdefault(last_command, []).append(lineno)
            continue
        if not raw.strip():
            continue
        is_command = not raw.lstrip().startswith("#")
        hit = _classify(raw, is_command)
        options = options_after_marker(raw[hit[1] :]) if hit else ()
        if hit is None or not options:
            if is_command:
                break  # the first real command: sbatch reads nothing below it
            continue
        form, end = hit
        if form == "command":
            last_command = len(found)
        found.append(
            LookalikeDirective(
                lineno,
                redact(raw.rstrip()),
                src.span(start, start + len(raw)),
                form,
                raw[:end],
                src.span(start, start + end),
                tuple((k, v if isinstance(v, bool) else redact(v)) for k, v in options),
                redact(raw[end:].rstrip()),
            )
        )
    return [replace(la, hides=tuple(hidden.get(i, ()))) for i, la in enumerate(found)]
