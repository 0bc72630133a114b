"""Whole numbers read from text the way Python's int() reads them (what torch and most launchers do).

Readers that model another parser keep their own: C's strtoll (readers/ncclenv.c_strtoll, NCCL),
C's stoi (readers/allocconf, torch's allocator settings), SLURM's (readers/slurmfmt.parse_int), and
config values that may be YAML numbers (readers/dlconfig).
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
