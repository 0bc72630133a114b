"""Lines bash reads apart from what their author meant: a backslash followed by a blank ends the line
instead of continuing it, and the next line then runs as a command of its own (`--lr 0.1` alone).
"""

from __future__ import annotations

import re

from gpudoctor.readers.sbatch.script import BrokenContinuation, StrayArgument
from gpudoctor.readers.sbatch.shell import Command, Source, Token, commands, unquote
from gpudoctor.redact import redact


def one_line(text: str) -> str:
    """A command as written, its line continuations joined."""
    if "\\\n" not in text:
        return text.strip()
    return re.sub(r"[ \t]*\\\n[ \t]*", " ", text).strip()


_ESCAPED_BLANK_END = re.compile(r"(?<!\\)(?:\\\\)*\\[ \t]$")


def broken_continuations(src: Source, tokens: list[Token]) -> list[BrokenContinuation]:
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
        next_text = one_line(src.text[next_cmd.start : next_cmd.end]) if next_cmd else nxt.text
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


def stray_arguments(src: Source, cmds: list[Command], reported: set[int]) -> list[StrayArgument]:
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
                        redact(one_line(src.text[cmd.start : cmd.end])),
                        src.span(cmd.start, cmd.end),
                        redact(first),
                        end_above if end_above == line - 1 else None,
                    )
                )
        previous_end = cmd.end
    return found
