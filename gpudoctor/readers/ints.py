"""Whole numbers read from text the way Python's int() reads them (what torch and most launchers do).

Readers that model another parser keep their own: C's strtoll (readers/ncclenv.c_strtoll, NCCL),
C's stoi (readers/allocconf, torch's allocator settings), SLURM's (readers/slurmfmt.parse_int).
whole_number reads values that may already be numbers (YAML and JSON: training configs, accelerate's
config, the watch probe's samples).

small_int is for numbers that are never large (a count, a port, a node's CPUs): ASCII digits only, at most
MAX_INT_DIGITS of them, so a hostile 5,000-digit value is "not a number" instead of int()'s ValueError past
4,300 digits (and '²', which str.isdigit() accepts, is no number either).
"""

from __future__ import annotations


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
