"""Shared pytest fixtures.

slurm_cluster: a real single-node SLURM (munged, slurmctld, slurmd) for the whole session,
started on first use and torn down at the end. Tests that use it are skipped, with the
reason, when this is not root or SLURM cannot be installed or started here.
Set GPUDOCTOR_NO_SLURM=1 to skip them on purpose.
"""

from __future__ import annotations

import compileall
import os
from pathlib import Path

import pytest

from tests.slurmcluster import ClusterUnavailable, start_cluster

SOURCES = ("gpudoctor", "checks", "fixes", "sample_train", "watch", "tests")


def pytest_configure(config):
    """Byte-compile the source tree once, in the controller, before any test. With PYTHONDONTWRITEBYTECODE set (as
    on the CI kind) no process writes __pycache__, so every gpudoctor child process of the suite (a few thousand)
    would compile the whole source anew: about 0.3 s of CPU each, measured (docs/benchmarks.md). compileall writes
    the caches whatever that variable says; Python reads them either way."""
    if hasattr(config, "workerinput"):  # an xdist worker: the controller has done it
        return
    root = Path(__file__).resolve().parents[1]
    for name in SOURCES:
        compileall.compile_dir(str(root / name), quiet=2, workers=1)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    if os.environ.get("GPUDOCTOR_NO_SLURM"):
        pytest.skip("SLURM tests disabled (GPUDOCTOR_NO_SLURM is set)")
    root = tmp_path_factory.mktemp("slurm")
    try:
        cluster = start_cluster(root)
    except ClusterUnavailable as e:
        pytest.skip(f"no SLURM cluster for this test: {e}")
    try:
        yield cluster
    finally:
        cluster.stop()
