"""Shared pytest fixtures.

The two tiers (README "Tests"): a plain run leaves out the tests marked `world`, the further real multi-process
worlds (fault, drift and slowness scenarios; ~3 CPU-s of `import torch` per rank, agent or node on the CI kind);
`-m world` runs just those, `--worlds` both tiers, any other `-m` expression all it selects, and a test named by
its node id (or its class's) always runs. CI runs both tiers.

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

SOURCES = ("gpudoctor", "checks", "fixes", "sample_train", "watch", "diagnose", "tests")


WORLD = "world"


def pytest_addoption(parser):
    parser.addoption("--worlds", action="store_true", help="also run the tests marked world (README: Tests)")


def pytest_collection_modifyitems(config, items):
    """Leave out the world tier unless asked: `-m EXPR` (the user's own selection), --worlds, or a node id."""
    if config.option.markexpr or config.getoption("--worlds"):
        return
    named = _node_ids(config)
    kept, left = [], []
    for item in items:
        chosen = item.get_closest_marker(WORLD) is None or any(_names(n, item.nodeid) for n in named)
        (kept if chosen else left).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept
        config.stash[_LEFT_OUT] = len(left)
        if hasattr(config, "workeroutput"):  # an xdist worker: tell the controller, which collects nothing itself
            config.workeroutput[_LEFT_OUT_KEY] = len(left)


def _names(named: str, nodeid: str) -> bool:
    """A node id from the command line names this test, or its parametrized cases, or a class holding it."""
    return nodeid == named or nodeid.startswith((named + "[", named + "::"))


_LEFT_OUT = pytest.StashKey[int]()
_LEFT_OUT_KEY = "gpudoctor_world_tests_left_out"


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist's controller: a worker's count of the world tests it left out."""
    left = getattr(node, "workeroutput", {}).get(_LEFT_OUT_KEY)
    if left:
        node.config.stash[_LEFT_OUT] = left


def pytest_terminal_summary(terminalreporter, config):
    """Say what a plain run left out, and how to run it."""
    left = config.stash.get(_LEFT_OUT, 0)
    if left:
        terminalreporter.write_line(
            f"{left} test(s) of the world tier left out: `python -m pytest -n 3 -m world` runs them (README: Tests)"
        )


def _node_ids(config) -> set[str]:
    """The command line's node ids (FILE::NAME...) relative to the root dir, as item.nodeid spells them."""
    root = Path(config.rootpath)
    out = set()
    for arg in config.args:
        path, sep, rest = arg.partition("::")
        if not sep:
            continue
        try:
            path = Path(path).resolve().relative_to(root).as_posix()
        except ValueError:
            pass
        out.add(f"{path}::{rest}")
    return out


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
    _cache_rewritten_test_modules(config, root / "tests")


def _cache_rewritten_test_modules(config, tests: Path) -> None:
    """pytest rewrites the asserts of each test module as it imports it, and caches the result only where bytecode
    may be written: under PYTHONDONTWRITEBYTECODE every xdist worker rewrote all ~100 modules anew, 6-7 CPU-s each
    (collection 13-16 CPU-s against 7-8 with the caches, measured). Write those caches once, here; pytest checks
    each against its source's mtime and size before use. This reaches into pytest's private rewrite module: if that
    changes, the workers rewrite as before (time, never a result, is at stake)."""
    try:
        from _pytest.assertion import rewrite

        state = config.stash[rewrite.assertstate_key]
        for source in sorted(tests.rglob("*.py")):
            if not (source.name.startswith("test_") or source.name == "conftest.py"):
                continue
            pyc = rewrite.get_cache_dir(source) / (source.name[:-3] + rewrite.PYC_TAIL)
            if rewrite._read_pyc(source, pyc, state.trace) is not None or not rewrite.try_makedirs(pyc.parent):
                continue
            stat, code = rewrite._rewrite_test(source, config)
            rewrite._write_pyc(state, code, stat, pyc)
    except Exception:
        return


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
