"""`fix --apply` with other writers about (issue 35 item 10): real processes, real locks, real SIGKILLs.

- a second writer of the same script finds the first one's lock and backs off: one line, exit 2, nothing written;
- concurrent `fix --apply` pairs of one script: the change is made once, with one backup, and the script is
  always whole (the original or the fixed text);
- a writer killed between its temporary file and its rename leaves `.gpudoctor-HOST.PID.*.tmp`; the next
  write in that directory removes it (its pid is gone), and leaves a live writer's alone;
- a writer killed between its backup and its rename leaves a backup of a change never made: the next run's
  (same) change keeps it as its backup, so one change has one backup.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.cliutil import clean_env

FIXTURES = Path(__file__).parents[1] / "fixtures"
SNAPSHOT = str(FIXTURES / "facts" / "recorded-cpu-debian12-torch2.13-nogpu.json")
SEED_BROKEN = FIXTURES / "sbatch" / "seed-broken-gres1-ntasks8.slurm"
FIX = [sys.executable, "-m", "gpudoctor", "fix", "--snapshot", SNAPSHOT, "--launcher", "lightning"]
ONE_LINE_REFUSALS = ("another gpudoctor is writing it now", "changed since gpudoctor read it")


def _fix(script: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [*FIX, "--sbatch", str(script), "--apply", "--unsafe-fixes"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=clean_env(),
    )


def _holder(code: str, *args: str) -> subprocess.Popen:
    """A python process that runs `code` and says 'ready' once it holds what it took (a lock, a file)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True, env=clean_env()
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _fixed_text(tmp_path: Path) -> bytes:
    alone = tmp_path / "alone" / "job.slurm"
    alone.parent.mkdir()
    shutil.copyfile(SEED_BROKEN, alone)
    r = _fix(alone)
    _, err = r.communicate(timeout=120)
    assert r.returncode in (0, 1), err
    assert alone.read_bytes() != SEED_BROKEN.read_bytes()
    return alone.read_bytes()


def _backups(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if ".gpudoctor.bak" in n)


def _temporaries(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith(".gpudoctor-"))


def test_a_second_writer_backs_off_while_the_first_holds_the_script(tmp_path):
    script = tmp_path / "job.slurm"
    shutil.copyfile(SEED_BROKEN, script)
    holder = _holder(
        "import sys\nfrom gpudoctor.fileio import exclusive\n"
        "with exclusive([sys.argv[1]]):\n    print('ready', flush=True)\n    sys.stdin.readline()\n",
        str(script),
    )
    try:
        r = _fix(script)
        _, err = r.communicate(timeout=120)
    finally:
        holder.communicate("done\n", timeout=30)
    assert r.returncode == 2, err
    assert "another gpudoctor is writing it now" in err and len(err.strip().splitlines()) == 1, err
    assert script.read_bytes() == SEED_BROKEN.read_bytes() and _backups(tmp_path) == []
    assert _temporaries(tmp_path) == []


def test_concurrent_pairs_make_one_change_with_one_backup(tmp_path):
    fixed = _fixed_text(tmp_path)
    for n in range(4):
        pair = tmp_path / f"pair{n}"
        pair.mkdir()
        script = pair / "job.slurm"
        shutil.copyfile(SEED_BROKEN, script)
        runs = [_fix(script), _fix(script)]
        results = [(r, r.communicate(timeout=180)[1]) for r in runs]
        assert script.read_bytes() == fixed  # whole, and fixed by one of them
        assert _backups(pair) == ["job.slurm.gpudoctor.bak"], results
        assert (pair / "job.slurm.gpudoctor.bak").read_bytes() == SEED_BROKEN.read_bytes()
        assert _temporaries(pair) == []
        wrote = [r for r, err in results if r.returncode in (0, 1)]
        for r, err in results:
            if r.returncode == 2:  # the one that came second: one line saying why
                assert any(s in err for s in ONE_LINE_REFUSALS) and len(err.strip().splitlines()) == 1, err
        assert len(wrote) >= 1, results


def test_a_killed_writers_temporary_is_swept_by_the_next_write_and_a_live_ones_kept(tmp_path):
    script = tmp_path / "job.slurm"
    shutil.copyfile(SEED_BROKEN, script)
    make_temporary = (
        "import sys, tempfile\nfrom gpudoctor.fileio import temporary_prefix\n"
        "fd, path = tempfile.mkstemp(prefix=temporary_prefix(), suffix='.tmp', dir=sys.argv[1])\n"
        "print('ready', flush=True)\nsys.stdin.readline()\n"
    )
    killed = _holder(make_temporary, str(tmp_path))
    live = _holder(make_temporary, str(tmp_path))
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        left = _temporaries(tmp_path)
        assert len(left) == 2 and any(f".{killed.pid}." in n for n in left), left
        (tmp_path / "stranger.tmp").write_text("not ours")  # another name: never touched
        (tmp_path / ".gpudoctor-old").write_text("another pattern: never touched")
        r = _fix(script)
        _, err = r.communicate(timeout=120)
        assert r.returncode in (0, 1), err
        kept = [n for n in left if f".{live.pid}." in n] + [".gpudoctor-old"]
        assert _temporaries(tmp_path) == sorted(kept)
    finally:
        live.communicate("done\n", timeout=30)
    assert (tmp_path / "stranger.tmp").exists() and (tmp_path / ".gpudoctor-old").exists()


def test_sigkills_during_apply_leave_the_script_whole_and_the_next_run_sweeps(tmp_path):
    fixed = _fixed_text(tmp_path)
    work = tmp_path / "killed"
    work.mkdir()
    script = work / "job.slurm"
    for n in range(6):
        shutil.copyfile(SEED_BROKEN, script)
        r = _fix(script)
        # killed at a different point of its run each time: its start, its planning, its writing
        time.sleep(0.3 * n)
        r.send_signal(signal.SIGKILL)
        r.communicate(timeout=60)
        assert script.read_bytes() in (SEED_BROKEN.read_bytes(), fixed)
    shutil.copyfile(SEED_BROKEN, script)
    r = _fix(script)
    _, err = r.communicate(timeout=120)
    assert r.returncode in (0, 1), err
    assert script.read_bytes() == fixed and _temporaries(work) == []
    # every change backed up the same original: one backup, whichever runs got how far
    assert _backups(work) == ["job.slurm.gpudoctor.bak"], _backups(work)


def test_a_backup_left_by_a_writer_killed_before_its_rename_is_the_backup(tmp_path):
    """What a writer SIGKILLed between its backup and its rename leaves: the script as it was and its backup. The
    next run's change is that same change: it keeps that backup instead of a second one."""
    fixed = _fixed_text(tmp_path)
    script = tmp_path / "job.slurm"
    shutil.copyfile(SEED_BROKEN, script)
    shutil.copyfile(SEED_BROKEN, tmp_path / "job.slurm.gpudoctor.bak")
    r = _fix(script)
    _, err = r.communicate(timeout=120)
    assert r.returncode in (0, 1), err
    assert script.read_bytes() == fixed and _backups(tmp_path) == ["job.slurm.gpudoctor.bak"]
    # a backup of other bytes is never taken for this one: a new one beside it
    script.write_bytes(SEED_BROKEN.read_bytes() + b"# edited\n")
    r = _fix(script)
    _, err = r.communicate(timeout=120)
    assert r.returncode in (0, 1), err
    assert _backups(tmp_path) == ["job.slurm.gpudoctor.bak", "job.slurm.gpudoctor.bak.1"]
    assert (tmp_path / "job.slurm.gpudoctor.bak.1").read_bytes().endswith(b"# edited\n")
