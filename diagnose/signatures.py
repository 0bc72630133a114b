"""The signature table: every row of gpudoctor.checks.diagnose's topic modules, in id order."""

from __future__ import annotations

import re

from gpudoctor.checks.diagnose import (
    followers,
    framework,
    hardware,
    library,
    network,
    ranks,
    rendezvous,
    resources,
    slurm,
)
from gpudoctor.checks.diagnose._signature import Signature

TABLE: tuple[Signature, ...] = tuple(
    sorted(
        (
            *ranks.SIGNATURES,
            *rendezvous.SIGNATURES,
            *network.SIGNATURES,
            *library.SIGNATURES,
            *resources.SIGNATURES,
            *framework.SIGNATURES,
            *slurm.SIGNATURES,
            *hardware.SIGNATURES,
            *followers.SIGNATURES,
        ),
        key=lambda s: s.id,
    )
)
BY_ID = {s.id: s for s in TABLE}


def keys(table: tuple[Signature, ...] = TABLE) -> dict[bytes, tuple[re.Pattern | None, ...]]:
    """Each literal key of the table, with the patterns of the rows that use it (None: a row without one), for
    logread.read_logs: a line is kept for a key only when one of its rows could read it."""
    out: dict[bytes, list[re.Pattern | None]] = {}
    for sig in table:
        for key in sig.keys:
            out.setdefault(key.encode(), []).append(sig.regex)
    return {k: tuple(v) for k, v in out.items()}
