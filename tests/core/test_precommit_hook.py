"""The pre-commit hooks (.pre-commit-hooks.yaml, gpudoctor/hook.py) run by the real pre-commit in a throw-away
git repository: a broken batch script blocks the commit with its finding on its line, a good one passes.

The `language: python` hook is run once through `pre-commit try-repo` (pre-commit builds its venv and pip
installs this working tree, uncommitted changes included: ~13 s here, from the pip index pip.conf names).
The commit test uses the `language: system` twin (the gpudoctor-hook of this venv, on PATH), from a file://
repository holding this manifest at a commit, so that it needs no hook venv and no index.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpudoctor.hook import is_batch_script, main
from tests.cliutil import clean_env
from tests.factsutil import FIXTURES

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / ".pre-commit-hooks.yaml"
BROKEN = FIXTURES / "sbatch" / "seed-broken-gres1-ntasks8.slurm"  # GD-SLURM-002 on line 6
GOOD = FIXTURES / "sbatch" / "correct-srun-ntasks8-gres8.slurm"
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _env(tmp_path: Path) -> dict[str, str]:
    env = clean_env(
        {
            "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@example.org",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@example.org",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_CONFIG_NOSYSTEM": "1",
        }
    )
    env.pop("VIRTUAL_ENV", None)
    return env


def _run(args: list, cwd: Path, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def _git_repo(path: Path, env: dict) -> Path:
    path.mkdir()
    _run(["git", "init", "-q", "-b", "main"], path, env).check_returncode()
    return path


def test_the_manifest_validates():
    r = _run([BIN / "pre-commit", "validate-manifest", MANIFEST], ROOT, dict(os.environ))
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_python_hook_through_try_repo(tmp_path):
    env = _env(tmp_path)
    repo = _git_repo(tmp_path / "user", env)
    shutil.copy(BROKEN, repo / "job.slurm")
    shutil.copy(GOOD, repo / "good.slurm")
    _run(["git", "add", "."], repo, env).check_returncode()
    try_repo = [BIN / "pre-commit", "try-repo", ROOT, "gpudoctor-sbatch", "--files", "job.slurm", "good.slurm"]
    r = _run(try_repo, repo, env, timeout=300)  # one call: each try-repo builds its hook venv anew
    assert r.returncode == 1, r.stdout + r.stderr
    assert "job.slurm:6: GD-SLURM-002 8 tasks per node" in r.stdout
    assert "good.slurm" not in r.stdout  # judged and clean (the commit test shows a good script passing alone)


def test_a_broken_script_blocks_the_commit_and_a_good_one_passes(tmp_path):
    env = _env(tmp_path)
    hooks = _git_repo(tmp_path / "hooks", env)
    shutil.copy(MANIFEST, hooks / ".pre-commit-hooks.yaml")
    _run(["git", "add", "."], hooks, env).check_returncode()
    _run(["git", "commit", "-q", "-m", "hooks"], hooks, env).check_returncode()
    rev = _run(["git", "rev-parse", "HEAD"], hooks, env).stdout.strip()

    repo = _git_repo(tmp_path / "user", env)
    (repo / ".pre-commit-config.yaml").write_text(
        f"repos:\n- repo: file://{hooks}\n  rev: {rev}\n  hooks:\n  - id: gpudoctor-sbatch-system\n"
    )
    _run([BIN / "pre-commit", "install"], repo, env).check_returncode()
    (repo / "notes.txt").write_text("#!/bin/bash\necho not a batch script\n")  # passed over
    shutil.copy(GOOD, repo / "train.sh")  # a batch script by its #SBATCH lines, not its name
    _run(["git", "add", "."], repo, env).check_returncode()
    ok = _run(["git", "commit", "-m", "good"], repo, env)
    assert ok.returncode == 0, ok.stdout + ok.stderr

    shutil.copy(BROKEN, repo / "train.sh")
    _run(["git", "add", "."], repo, env).check_returncode()
    blocked = _run(["git", "commit", "-m", "broken"], repo, env)
    assert blocked.returncode == 1
    assert "train.sh:6: GD-SLURM-002" in blocked.stdout + blocked.stderr
    assert _run(["git", "log", "--oneline"], repo, env).stdout.count("\n") == 1  # only the good commit


def test_many_files_in_one_call_exit_with_the_worst(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", os.devnull)
    dos = tmp_path / "dos.slurm"
    dos.write_bytes(b"#!/bin/bash\r\n#SBATCH --nodes=1\r\nsrun python train.py\r\n")
    plain = tmp_path / "README.md"
    plain.write_text("# not a script\n")
    assert not is_batch_script(str(plain)) and is_batch_script(str(dos))
    assert main(["sbatch", str(GOOD), str(plain)]) == 0
    assert main(["sbatch", str(GOOD), str(BROKEN), str(plain)]) == 1
    assert main(["sbatch", str(BROKEN), str(dos)]) == 2  # sbatch refuses DOS line breaks: bad input
    out = capsys.readouterr()
    assert f"{BROKEN}:6: GD-SLURM-002" in out.out and "DOS line breaks" in out.err


def test_the_config_hook_judges_the_job_not_this_machine(tmp_path, capsys, monkeypatch):
    """A config alone would judge this machine (no driver here: GD-DRV-001 fails); the hook judges the job."""
    monkeypatch.setenv("SLURM_CONF", os.devnull)
    plain = tmp_path / "other.yaml"
    plain.write_text("repos: []\n")
    assert main(["config", str(plain), str(FIXTURES / "configs" / "synthetic-good-dataloader.yaml")]) == 0
    assert "GD-DRV-001" not in capsys.readouterr().out
    broken = tmp_path / "broken.yaml"
    broken.write_text("a: b: c\n")
    assert main(["config", str(broken)]) == 2


def test_an_unreachable_controller_is_asked_once_per_hook_run(tmp_path, capsys, monkeypatch):
    """Issue 38: the SLURM client installed, its controller not listening (SLURM_CONF names a closed port).
    The hook judges many scripts in one process: the first asks the controller and waits at most
    probe/cluster.FIRST_TIMEOUT, the others reuse its silence. The real scontrol, wrapped to count its calls.
    Measured here (2 loaded cores): 2.8 s for three scripts, against 15.5 s with a 5 s wait per script."""
    import socket
    import time

    from gpudoctor.probe import cluster

    scontrol = shutil.which("scontrol")
    if scontrol is None:
        pytest.skip("no SLURM client (scontrol) here")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        f"ClusterName=closed\nSlurmctldHost=localhost\nSlurmctldPort={port}\n"
        "NodeName=n1 CPUs=4 State=UNKNOWN\nPartitionName=p Nodes=n1 Default=YES\n"
    )
    calls = tmp_path / "calls"
    wrapper = tmp_path / "bin" / "scontrol"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {scontrol} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    monkeypatch.setattr(cluster, "_unreachable", {})
    scripts = []
    for i in range(3):
        scripts.append(tmp_path / f"job{i}.slurm")
        scripts[-1].write_text(GOOD.read_text())
    start = time.monotonic()
    assert main(["sbatch", *map(str, scripts)]) == 0
    took = time.monotonic() - start
    asked = calls.read_text().splitlines()
    assert len([c for c in asked if c.startswith("show partition")]) == 1, asked
    assert took < 3 * cluster.COMMAND_TIMEOUT, took  # loosely: before, each script waited COMMAND_TIMEOUT
    assert capsys.readouterr().out == ""  # a good script: nothing to say, not even the controller's silence
