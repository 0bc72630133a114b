"""Whole numbers read from text the way Python's int() reads them (what torch and most launchers do).

Readers that model another parser keep their own: C's strtoll (readers/ncclenv.c_strtoll, NCCL),
C's stoi (readers/allocconf, torch's allocator settings), SLURM's (readers/slurmfmt.parse_int).
whole_number reads values that may already be numbers (YAML and JSON: training configs, accelerate's
config, the watch probe's samples).

small_int is for numbers that are never large (a count, a port, a node's CPUs): ASCII digits only, at most
MAX_INT_DIGITS of them, so a hostile 5,000-digit value is "not a number" instead of int()'s ValueError past
4,300 digits (and '²', which str.isdigit() accepts, is no number either).

Every number given on gpudoctor's command line (every command's options: check's --gpus and timeouts, watch's
--for and --rate, health's budget, smoke's flags) is read by one parser, `option_int` / `option_number` (argparse
types through `int_option` / `number_option`): ASCII digits as a person types them, nothing around them. Python's
int() and float() would also take digits of other scripts ('١' is 1), '_' separators, blanks and a newline
around the digits, 'nan' and 'inf' -- none of which is a number anyone means on a command line (issue 35 item 6).
"""

from __future__ import annotations

import argparse
import re


def python_int(text: str | None) -> int | None:
    """int(text) -- blanks around it allowed, '_' separators and a sign too -- None when unset or not a number."""
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


MAX_INT_DIGITS = 18  # larger numbers are unknown: no SLURM count, port or CPU count is that big


def whole_number(value: object) -> int | None:
    """A value read from JSON or YAML as a whole number: an int, an integral float (2.0), or text small_int
    reads; None for a boolean, a fraction, anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    return small_int(value) if isinstance(value, str) else None


def small_int(text: str | None) -> int | None:
    """A whole number of at most MAX_INT_DIGITS ASCII digits, an optional sign, blanks around it; else None."""
    if not isinstance(text, str):
        return None
    text = text.strip()
    digits = text[1:] if text[:1] in "+-" else text
    if not digits.isdigit() or not digits.isascii() or len(digits) > MAX_INT_DIGITS:
        return None
    return int(text)


# ---------------------------------------------------------------- numbers on the command line

# ASCII only: `\d` would match any script's digits, and `$` a trailing newline, so neither is used.
_ASCII_INT = re.compile(r"[+-]?[0-9]{1,18}")
_ASCII_DECIMAL = re.compile(r"[+-]?(?:[0-9]{1,18}(?:\.[0-9]{0,18})?|\.[0-9]{1,18})(?:[eE][+-]?[0-9]{1,3})?")


def option_int(text: object) -> int | None:
    """A whole number as typed on a command line: an optional sign and at most 18 ASCII digits, nothing
    else (no blank, no '_', no other script's digits); None otherwise."""
    if not isinstance(text, str) or not _ASCII_INT.fullmatch(text):
        return None
    return int(text)


def option_number(text: object) -> float | None:
    """A finite decimal number as typed on a command line (12, 0.5, .5, 1e3): ASCII only, nothing around it;
    None otherwise (nan, inf, '١', '1_0', ' 5', '5\\n')."""
    if not isinstance(text, str) or not _ASCII_DECIMAL.fullmatch(text):
        return None
    value = float(text)
    return value if value not in (float("inf"), float("-inf")) else None


def shown_option(text: str) -> str:
    """An option's value as a one-line message may show it: repr (control bytes escaped), at most 40 characters."""
    return repr(text) if len(text) <= 40 else f"{text[:40]!r}... ({len(text):,} characters)"


def int_option(low: int | None = None, high: int | None = None, what: str = "a whole number"):
    """An argparse type: option_int's number, low <= n <= high, else one line (exit 2)."""

    def parse(text: str) -> int:
        n = option_int(text)
        if n is None:
            raise argparse.ArgumentTypeError(f"expected {what}, got {shown_option(text)}")
        if low is not None and n < low:
            raise argparse.ArgumentTypeError(f"expected {low} or more, got {n}")
        if high is not None and n > high:
            raise argparse.ArgumentTypeError(f"expected at most {high:,}, got {n:,}")
        return n

    return parse


def number_option(low: float, high: float | None = None, what: str = "a number", low_open: bool = True):
    """An argparse type: option_number's number, more than low (or at least low when not low_open) and at most
    high, else one line (exit 2)."""

    def parse(text: str) -> float:
        x = option_number(text)
        if x is None:
            raise argparse.ArgumentTypeError(f"expected {what}, got {shown_option(text)}")
        if x < low or (low_open and x == low) or (high is not None and x > high):
            above = f"more than {low:g}" if low_open else f"at least {low:g}"
            upto = "" if high is None else f" and at most {high:g}"
            raise argparse.ArgumentTypeError(f"expected {what} {above}{upto}, got {shown_option(text)}")
        return x

    return parse
