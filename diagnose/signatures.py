"""The signature table: every row of gpudoctor.checks.diagnose's topic modules, in id order."""

from __future__ import annotations

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
