"""The suite's two tiers (tests/conftest.py, README "Tests"): a plain run leaves out the tests marked `world`,
`-m world` runs only those, `--worlds` both, and a test named by its node id runs whatever its mark."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILE = "tests/fixes/test_fix_cli.py"  # one world test among plain ones; collected without torch
WORLD_TEST = f"{FILE}::test_validate_runs_a_real_smoke_with_the_fixed_environment"
PLAIN_TEST = f"{FILE}::test_dry_run_writes_nothing_and_shows_a_diff"
pytestmark = pytest.mark.xdist_group("suite-tiers")  # one worker, so that _run's cache serves all three


@functools.cache  # each command line once per worker: the tests read the same runs
def _run(*args: str) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def _collected(*args: str) -> set[str]:
    return {line for line in _run(*args).splitlines() if "::" in line}


def test_a_plain_run_leaves_out_the_world_tier_and_m_world_runs_just_it():
    plain, worlds, both = _collected(FILE), _collected(FILE, "-m", "world"), _collected(FILE, "--worlds")
    assert WORLD_TEST in worlds and WORLD_TEST not in plain
    assert PLAIN_TEST in plain and PLAIN_TEST not in worlds
    assert plain | worlds == both and not plain & worlds


def test_a_plain_run_says_what_it_left_out_and_how_to_run_it():
    assert "1 test(s) of the world tier left out: `python -m pytest -n 3 -m world` runs them" in _run(FILE)
    assert "world tier left out" not in _run(FILE, "-m", "world")


def test_a_world_test_named_by_its_node_id_runs():
    assert _collected(WORLD_TEST, PLAIN_TEST) == {WORLD_TEST, PLAIN_TEST}
