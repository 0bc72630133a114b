"""Small kindnesses of the command line: "did you mean" for a mistyped command or choice, and SIGTERM
reported as the shell does (128 + 15 = 143) rather than as an internal error or Ctrl-C."""

from __future__ import annotations

import re
import signal

SIGTERM_EXIT = 128 + signal.SIGTERM  # 143, what a shell reports for a process ended by SIGTERM

_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<given>[^']*)' \(choose from (?P<choices>.*)\)")
_UNRECOGNIZED = re.compile(r"unrecognized arguments: (?P<given>.*)")
# What people write for a choice that is spelled otherwise: the meaning, not the letters (`--device gpu` is cuda,
# though 'cpu' is one letter away).
SYNONYMS = {"gpu": "cuda", "gpus": "cuda", "nvidia": "cuda", "cuda:0": "cuda", "host": "cpu"}


def did_you_mean(message: str, options: list[str] | tuple[str, ...] = ()) -> str:
    """argparse's 'invalid choice' message with the choice meant (a synonym, else the closest by edit
    distance), and its 'unrecognized arguments' with the closest of the command's options (`--sbtach`)."""
    import difflib  # here, not at the top: every command imports this module, only a mistyped one needs difflib

    m = _INVALID_CHOICE.search(message)
    if m:
        choices = [c.strip().strip("'\"") for c in m.group("choices").split(",")]
        given = m.group("given").lower()
        meant = SYNONYMS.get(given)
        close = [meant] if meant in choices else difflib.get_close_matches(given, choices, n=1, cutoff=0.5)
        return f"{message}; did you mean '{close[0]}'?" if close else message
    m = _UNRECOGNIZED.search(message)
    if m and options:
        hints = []
        for word in m.group("given").split():
            name = word.split("=", 1)[0]
            if name.startswith("-") and name not in options:
                close = difflib.get_close_matches(name, options, n=1, cutoff=0.7)
                if close:
                    hints.append(f"'{close[0]}'" + (f" for '{name}'" if len(m.group("given").split()) > 1 else ""))
        if hints:
            return f"{message}; did you mean {', '.join(hints)}?"
    return message


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: unwound like Ctrl-C (children stopped, files closed), exit 143."""


def raise_on_sigterm() -> None:
    def handler(signum, frame):
        raise Terminated

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (an embedding program): leave its handlers alone
        pass
