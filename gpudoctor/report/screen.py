"""One screen: the text report's lines wrapped to the terminal with a hanging indent, a shell command broken
only where the shell would read the same command, and a finding's one line (`mark file:line: message  ID`,
in the manner of ruff's `path:line:col: CODE message`). Shared by the check, job and health layouts."""

from __future__ import annotations

import os

from gpudoctor.model import Finding, Severity
from gpudoctor.sanitize import clean

MARK = {
    Severity.PASS: "✓",
    Severity.INFO: "i",
    Severity.WARN: "!",
    Severity.FAIL: "✗",
    Severity.SKIP: "-",
    Severity.ERROR: "E",
}
SCREEN_LINES = 24  # the default report of a job with up to four problems fits a 24-line terminal


def terminal_width() -> int:
    """The terminal's columns ($COLUMNS first, as shutil reads it), 80 when there is no terminal."""
    import shutil

    return max(40, shutil.get_terminal_size((80, SCREEN_LINES)).columns)


def wrap(text: str, width: int, indent: int = 0, hang: int | None = None) -> list[str]:
    """`text` on lines of at most `width` columns: the first at `indent`, the others under it at `hang`
    (a hanging indent, so a wrapped finding stays visibly one finding)."""
    import textwrap

    hang = indent + 2 if hang is None else hang
    lines = textwrap.wrap(
        clean(text),
        width=width,
        initial_indent=" " * indent,
        subsequent_indent=" " * hang,
        break_long_words=True,
        break_on_hyphens=False,
    )
    return lines or [" " * indent]


def _shell_words(command: str) -> list[str]:
    """The command split at the blanks a shell splits at (outside quotes), each word kept verbatim."""
    words, word, quote, escaped = [], "", None, False
    for ch in command:
        if escaped:
            word, escaped = word + ch, False
        elif ch == "\\" and quote != "'":
            word, escaped = word + ch, True
        elif quote:
            word += ch
            quote = None if ch == quote else quote
        elif ch in "'\"":
            word, quote = word + ch, ch
        elif ch == " ":
            if word:
                words.append(word)
            word = ""
        else:
            word += ch
    return [*words, word] if word else words


def _split_word(word: str, first: int, room: int) -> list[str]:
    """A word longer than a line, cut where the shell reads the same word back: a backslash-newline, which
    the shell removes outside single quotes and inside double quotes; inside single quotes the quote is
    closed first and reopened on the next line ('ab'\\<newline>'cd' is abcd). The pieces after the first start
    at column 0, since a blank there would become part of the word."""
    pieces: list[str] = []
    piece, quote, escaped, opened = "", None, False, 0
    limit = first
    for ch in word:
        tail = "'\\" if quote == "'" else "\\"
        if len(piece) + len(tail) >= limit and not escaped and piece:
            # inside quotes, after a blank of the quoted text where there is one: `'a b'\` + `' c'`
            blank = piece.rfind(" ", opened + 1)
            cut = blank + 1 if quote and blank > opened and blank + 1 < len(piece) else len(piece)
            pieces.append(piece[:cut] + tail)
            piece, limit = ("'" if quote == "'" else "") + piece[cut:], room
            opened = 0
        piece += ch
        if escaped:
            escaped = False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif quote and ch == quote:
            quote = None
        elif not quote and ch in "'\"":
            quote, opened = ch, len(piece) - 1
    return [*pieces, piece]


def wrap_command(command: str, width: int, indent: int) -> list[str]:
    """A shell command on lines of at most `width` columns, broken between words outside quotes and continued
    with ` \\` (a backslash-newline the shell removes), so the lines pasted run the same command; a word
    longer than a line is cut as _split_word says."""
    command = clean(command)
    if indent + len(command) <= width or "#" in command:
        return [" " * indent + command]
    lines: list[str] = []
    line, pad = "", indent
    for word in _shell_words(command):
        if line and pad + len(line) + 1 + len(word) + 2 > width:
            lines.append(" " * pad + line + " \\")
            line, pad = "", indent + 2
        if pad + len(line) + len(word) + 2 > width:  # too long even for a line of its own
            pieces = _split_word(word, width - pad - len(line) - (1 if line else 0), width - 2)
            lines.append(" " * pad + (f"{line} " if line else "") + pieces[0])
            lines.extend(pieces[1:-1])
            line, pad = pieces[-1], 0
            continue
        line = f"{line} {word}" if line else word
    lines.append(" " * pad + line)
    return lines


class Screen:
    """The report's rows, each (text, style), wrapped to the width before anything is printed."""

    def __init__(self, width: int):
        self.width = width
        self.rows: list[tuple[str, str | None]] = []

    def add(self, text: str, indent: int = 0, hang: int | None = None, style: str | None = None) -> None:
        self.rows.extend((line, style) for line in wrap(text, self.width, indent, hang))

    def command(self, command: str, indent: int, style: str | None = None) -> None:
        self.rows.extend((line, style) for line in wrap_command(command, self.width, indent))

    def blank(self) -> None:
        self.rows.append(("", None))


def _path(path: str) -> str:
    """A file as the report names it: as given when short, else its base name (the header names the job)."""
    return path if len(path) <= 32 else os.path.basename(path) or path


def finding_head(f: Finding) -> str:
    """`✗ job.slurm:12: message  GD-ID` (ruff's `path:line: CODE message`, the id last as flutter doctor's
    detail): the mark, where, the one-sentence message and the check to `explain`."""
    mark = MARK[f.severity]
    loc = f.location
    where = ""
    message = " ".join(f.message.split())
    if loc is not None and loc.file:
        where = f"{_path(loc.file)}:{loc.line}: " if loc.line else f"{_path(loc.file)}: "
        if loc.line:  # "job.slurm:28: line 28: ..." says the line twice
            message = message.removeprefix(f"line {loc.line}: ")
    return f"{mark} {where}{message}  {f.id}"
