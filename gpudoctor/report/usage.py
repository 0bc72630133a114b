"""Small kindnesses of the command line: "did you mean" for a mistyped command or choice, and SIGTERM
reported as the shell does (128 + 15 = 143) rather than as an internal error or Ctrl-C."""

from __future__ import annotations

import re
import signal

SIGTERM_EXIT = 128 + signal.SIGTERM  # 143, what a shell reports for a process ended by SIGTERM

_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<given>[^']*)' \(choose from (?P<choices>.*)\)")


def did_you_mean(message: str) -> str:
    """argparse's 'invalid choice' message with the closest choice suggested."""
    import difflib  # here, not at the top: every command imports this module, only a mistyped one needs difflib

    m = _INVALID_CHOICE.search(message)
    if not m:
        return message
    choices = [c.strip().strip("'\"") for c in m.group("choices").split(",")]
    close = difflib.get_close_matches(m.group("given").lower(), choices, n=1, cutoff=0.5)
    return f"{message}; did you mean '{close[0]}'?" if close else message


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: unwound like Ctrl-C (children stopped, files closed), exit 143."""


def raise_on_sigterm() -> None:
    def handler(signum, frame):
        raise Terminated

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (an embedding program): leave its handlers alone
        pass
