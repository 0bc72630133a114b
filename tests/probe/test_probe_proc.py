"""Probe commands leave no orphans (issue 13 B6): real wrapper scripts on PATH whose children sleep."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudoctor.probe import libraries, slurm, torch_probe
from gpudoctor.probe.proc import run_bounded
from tests.cliutil import run_gpudoctor_here


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for init to reap it counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _gone(pid: int, within: float = 3.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def _child_pid(pidfile: Path) -> int:
    end = time.monotonic() + 5
    while time.monotonic() < end:
        if pidfile.exists() and pidfile.read_text().strip():
            return int(pidfile.read_text())
        time.sleep(0.02)
    raise AssertionError("the wrapper never started its child")


def test_a_hanging_ldconfig_with_a_child_is_killed_whole(tmp_path, monkeypatch):
    pidfile = tmp_path / "child.pid"
    _script(tmp_path / "ldconfig", f"sleep 300 &\necho $! > {pidfile}\nsleep 300\n")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    t0 = time.monotonic()
    assert libraries._ldconfig_entries() == []
    took = time.monotonic() - t0
    assert took < 8, took
    assert _gone(_child_pid(pidfile)), "ldconfig's child outlived the probe"


def test_a_hanging_srun_with_a_child_is_killed_whole(tmp_path, monkeypatch):
    pidfile = tmp_path / "child.pid"
    _script(tmp_path / "srun", f"sleep 300 &\necho $! > {pidfile}\nsleep 300\n")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    out = slurm.slurm_version()
    assert out["version"] is None and "did not answer" in out["version_error"]
    assert _gone(_child_pid(pidfile))


def test_a_python_wrapper_whose_child_sleeps_answers_and_leaves_nothing(tmp_path):
    pidfile = tmp_path / "child.pid"
    wrapper = _script(tmp_path / "python", f'sleep 300 &\necho $! > {pidfile}\nexec {sys.executable} "$@"\n')
    t0 = time.monotonic()
    meta = torch_probe.torch_meta(str(wrapper))
    assert time.monotonic() - t0 < 8  # not held until the timeout by the sleeping child's copy of stdout
    assert "installed" in meta and meta["python"] == str(wrapper)
    assert _gone(_child_pid(pidfile))
    pidfile.unlink()
    packages = slurm.launcher_packages(str(wrapper))
    assert "error" not in packages, packages
    assert _gone(_child_pid(pidfile))


def test_a_python_whose_answer_is_a_json_list_is_an_error_fact(tmp_path):
    fake = _script(tmp_path / "python", "echo '[1, 2]'\n")
    meta = torch_probe.torch_meta(str(fake))
    assert "error" in meta and "expected object" in meta["error"]


def test_output_is_capped_and_input_is_fed(tmp_path):
    r = run_bounded(["head", "-c", "50000000", "/dev/zero"], timeout=20, max_output=1000)
    assert len(r.stdout) == 1000 and r.truncated and r.returncode == 0
    r = run_bounded(["wc", "-c"], timeout=20, input=b"x" * 300_000)
    assert r.stdout.split()[0] == "300000"


def test_a_command_that_does_not_exist_raises_oserror():
    with pytest.raises(OSError):
        run_bounded(["/nonexistent/tool"], timeout=5)


def test_timeout_raises_after_killing_the_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    script = _script(tmp_path / "hang", f"sleep 300 &\necho $! > {pidfile}\nwait\n")
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_bounded([str(script)], timeout=1)
    assert time.monotonic() - t0 < 3
    assert _gone(_child_pid(pidfile))


def test_a_python_answering_a_json_list_is_an_error_for_launcher_packages(tmp_path):
    fake = _script(tmp_path / "python", "echo '[\"lightning\", 1]'\n")
    assert "error" in slurm.launcher_packages(str(fake))


def test_check_with_a_python_whose_every_answer_is_a_json_list_is_a_finding_not_exit_3(tmp_path):
    fake = _script(tmp_path / "python", "echo 'GPUDOCTOR-TORCH-FACTS [1, 2]'\necho '[1, 2]'\n")
    r = run_gpudoctor_here("check", "--python", str(fake), "--json")
    assert r.returncode == 1, r.stderr
    cuda = [f for f in json.loads(r.stdout)["findings"] if f["id"] == "GD-CUDA-001"]
    assert cuda and cuda[0]["severity"] == "fail"


def test_a_python_that_floods_its_output_does_not_fill_memory(tmp_path):
    # 384 MiB, half again the bound below, then it exits: a reader that kept it all would be caught, without a
    # flood held until the timeout (seconds of CPU copying /dev/zero). Kept to the 32 MiB cap of each stream the
    # run peaks at about 136 MiB (measured with 256 MiB, 512 MiB and 1 GiB floods alike).
    flood = _script(tmp_path / "python", f"exec head -c {384 * 2**20} /dev/zero\n")
    # a fresh parent, so that RUSAGE_CHILDREN's peak is this run's tree only
    measure = (
        "import resource, subprocess, sys; "
        "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
        "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            measure,
            sys.executable,
            "-m",
            "gpudoctor",
            "check",
            "--python",
            str(flood),
            "--torch-timeout",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    code, peak_kib = map(int, r.stdout.split())
    assert code == 1, r.stderr
    assert peak_kib < 256 * 1024, f"{peak_kib / 1024:.0f} MiB"
