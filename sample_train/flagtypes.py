"""The value types of `gpudoctor smoke`'s flags: each parses one flag's text or says why not, in one line
(argparse.ArgumentTypeError: exit 2). No torch."""

from __future__ import annotations

import argparse
import re

from gpudoctor.readers.ints import int_option, number_option, option_number, shown_option


def whole(text: str, low: int) -> int:
    """Every command line's number through the one parser (gpudoctor/readers/ints: ASCII digits only)."""
    return int_option(low=low)(text)


def positive_int(text: str) -> int:
    return whole(text, 1)


def non_negative_int(text: str) -> int:
    return whole(text, 0)


MIN_STEPS = 10  # enough for the loss to fall measurably and for timings after warm-up
MAX_STEPS = 10**9  # far past any deadline; keeps sample counts (steps x batch x ranks) inside int64
MIN_SOAK_S, MAX_SOAK_S = 10.0, 24 * 3600.0
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # a week: past that a bound bounds nothing (and 1e300 s overflows timedelta)
MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed takes a 64-bit integer


def steps(text: str) -> int:
    n = whole(text, MIN_STEPS)
    if n > MAX_STEPS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_STEPS:,} steps, got {short(text)}")
    return n


def timeout(text: str) -> float:
    x = positive_float(text)
    if not x <= MAX_TIMEOUT_S:  # also inf
        raise argparse.ArgumentTypeError(
            f"expected a finite number of seconds up to {MAX_TIMEOUT_S:g}, got {short(text)}"
        )
    return x


def duration(text: str) -> float:
    """90, 90s, 10m, 1h: seconds, from 10 s to a day."""
    m = re.fullmatch(r"([0-9]{1,6}(?:\.[0-9]{1,3})?)([smh]?)", text)  # ASCII: \d takes any script's digits
    seconds = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)] if m else None
    if seconds is None or not MIN_SOAK_S <= seconds <= MAX_SOAK_S:
        raise argparse.ArgumentTypeError(
            f"expected a duration from {MIN_SOAK_S:g}s to {MAX_SOAK_S / 3600:g}h (90s, 10m, 1h), got {short(text)}"
        )
    return seconds


def seed(text: str) -> int:
    n = whole(text, 0)
    if n > MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected a seed up to {MAX_SEED}, got {short(text)}")
    return n


short = shown_option


def positive_float(text: str) -> float:
    return number_option(0.0, what="a finite number")(text)


def fraction(text: str) -> float:
    """0.45 or 45%: a share of the peak."""
    percent = text.endswith("%")
    x = option_number(text[:-1] if percent else text)
    if x is None:
        raise argparse.ArgumentTypeError(f"expected a fraction like 0.45 or 45%, got {short(text)}")
    x = x / 100 if percent else x
    if not 0 < x <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1] or a percentage, got {short(text)}")
    return x


def boolean(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
