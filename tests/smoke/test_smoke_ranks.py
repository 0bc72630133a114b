"""How a spawned run starts its ranks (sample_train/ranks.py): forked from the launcher after its imports, or, with
GPUDOCTOR_SMOKE_NO_FORK, as new interpreters; and a forked rank's exit as the launcher reads it."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from gpudoctor.sample_train.ranks import ForkedRank
from tests.cliutil import run_gpudoctor


def _fork(status: int | None) -> ForkedRank:
    """A child that waits on the pipe, then exits with status (None: stays until killed)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(write)
        while os.read(read, 1 << 16):
            pass
        if status is None:
            signal.pause()
        os._exit(status)
    os.close(read)
    return ForkedRank(pid, write)


def test_a_forked_ranks_exit_reads_as_popens_would():
    ok, failing = _fork(0), _fork(3)
    assert ok.poll() is None  # still waiting for its world
    ok.send({"env": {}, "log": "/dev/null"})
    failing.abandon()  # never given its world
    assert ok.wait(timeout=10) == 0 and failing.wait(timeout=10) == 3
    hung = _fork(None)
    hung.send({})
    with pytest.raises(subprocess.TimeoutExpired):
        hung.wait(timeout=0.2)
    os.kill(hung.pid, signal.SIGKILL)
    assert hung.wait(timeout=10) == -signal.SIGKILL  # as Popen.returncode says a signal


def test_a_rank_gone_before_its_world_arrives_is_an_exit_not_a_launcher_crash():
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    read, write = os.pipe()
    os.close(read)  # as a rank that died before reading: no reader left
    gone = ForkedRank(pid, write)
    gone.send({"env": {"X": "y" * 200_000}, "log": "/dev/null"})  # more than a pipe holds: BrokenPipeError inside
    assert gone.wait(timeout=10) == 7 and gone.pipe == -1


@pytest.mark.world
def test_one_rank_started_as_a_new_interpreter_trains_and_reports():
    """GPUDOCTOR_SMOKE_NO_FORK: the way back to one interpreter a rank; one rank also runs no straggler probe."""
    r = run_gpudoctor(
        "smoke", "--device", "cpu", "--gpus", "1", "--json", env={"GPUDOCTOR_SMOKE_NO_FORK": "1"}, timeout=180
    )
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["ok"], r.stderr
    assert report["launch"]["ranks_forked"] is False and report["stragglers"] is None
    assert "straggler probe" not in report["ranks"][0]["stage_seconds"]
