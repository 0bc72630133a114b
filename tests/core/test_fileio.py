"""fileio on the paths that broke tools (issue 13 B1/B2): real FIFOs, symlinks, device nodes, /dev/full.

The command's file handling runs in this process (gpudoctor_here); a real process (gpudoctor) where the test is
about the process: its stdout as /dev/stdout, and an open that would block, bounded by the child's timeout."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpudoctor.fileio import FileIOError, read_input, write_output
from tests.cliutil import run_gpudoctor, run_gpudoctor_here

ROOT = Path(__file__).resolve().parents[2]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")


def gpudoctor(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return run_gpudoctor(*args, timeout=timeout, cwd=ROOT)


def gpudoctor_here(*args: str) -> subprocess.CompletedProcess:
    return run_gpudoctor_here(*args, cwd=ROOT)


def _null_device(tmp_path: Path) -> Path:
    node = tmp_path / "null"
    os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # the same device as /dev/null
    return node


# --- writing -----------------------------------------------------------------------------------------------


@needs_root
def test_write_to_a_character_device_writes_through_and_keeps_the_node(tmp_path):
    node = _null_device(tmp_path)
    write_output(str(node), "x" * 5000, what="-o")
    assert stat.S_ISCHR(os.stat(node).st_mode)


@needs_root
def test_docs_o_a_device_keeps_the_device(tmp_path):
    node = _null_device(tmp_path)
    r = gpudoctor_here("docs", "-o", str(node))
    assert r.returncode == 0, r.stderr
    assert stat.S_ISCHR(os.lstat(node).st_mode), "the device node was replaced by a file"


def test_write_through_a_symlink_writes_the_target_and_keeps_the_link(tmp_path):
    target = tmp_path / "real.md"
    target.write_text("old")
    os.chmod(target, 0o640)
    link = tmp_path / "link.md"
    link.symlink_to(target)
    r = gpudoctor_here("docs", "-o", str(link))
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text().startswith("#") and stat.S_IMODE(target.stat().st_mode) == 0o640


def test_a_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "new.json")
    write_output(str(link), "{}\n")
    assert link.is_symlink() and (tmp_path / "new.json").read_text() == "{}\n"


def test_junit_to_a_fifo_with_a_reader_streams_and_keeps_the_fifo(tmp_path):
    snap = tmp_path / "snap.json"
    snap.write_text('{"schema": "gpudoctor.facts/1"}')
    fifo = tmp_path / "junit.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    reader.start()
    time.sleep(0.2)
    r = gpudoctor_here("check", "--snapshot", str(snap), "--junit", str(fifo), "--select", "host")
    reader.join(10)
    assert r.returncode in (0, 1), r.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and got and got[0].startswith(b"<?xml")


def test_a_fifo_without_a_reader_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    r = gpudoctor("docs", "-o", str(fifo), timeout=30)
    assert r.returncode == 2 and "no reader" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert time.monotonic() - t0 < 30 and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_dev_full_is_one_line_exit_2(tmp_path):
    r = gpudoctor_here("docs", "-o", "/dev/full")
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "No space left" in r.stderr


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(FileIOError, match="directory"):
        write_output(str(tmp_path), "x", what="-o")


def test_a_new_file_follows_the_umask_and_no_temporary_is_left(tmp_path):
    out = tmp_path / "facts.json"
    write_output(str(out), "{}")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir()] == ["facts.json"]


def test_a_hard_linked_file_is_rewritten_in_place(tmp_path):
    a = tmp_path / "a"
    a.write_text("old")
    os.link(a, tmp_path / "b")
    write_output(str(a), "new")
    assert (tmp_path / "b").read_text() == "new"


def test_backup_keeps_the_old_content(tmp_path):
    out = tmp_path / "env.sh"
    out.write_text("old")
    backup = write_output(str(out), "new", backup=True)
    assert backup and Path(backup).read_text() == "old" and out.read_text() == "new"


# --- reading -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["--snapshot", "--config", "--sbatch"])
def test_a_fifo_as_input_is_refused_at_once(tmp_path, option):
    fifo = tmp_path / "input"
    os.mkfifo(fifo)
    args = ["check", option, str(fifo)]
    if option != "--snapshot":
        snap = tmp_path / "snap.json"
        snap.write_text('{"schema": "gpudoctor.facts/1"}')
        args += ["--snapshot", str(snap)]
    r = gpudoctor(*args, timeout=60)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "FIFO" in r.stderr


@pytest.mark.parametrize("option", ["--snapshot", "--config"])
def test_a_symlink_to_dev_zero_is_refused(tmp_path, option):
    link = tmp_path / "zero.json"
    link.symlink_to("/dev/zero")
    args = ["check", option, str(link)]
    if option != "--snapshot":
        snap = tmp_path / "snap.json"
        snap.write_text('{"schema": "gpudoctor.facts/1"}')
        args += ["--snapshot", str(snap)]
    r = gpudoctor_here(*args)
    assert r.returncode == 2 and "character device" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_file_over_the_cap_is_refused(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_bytes(b"a: 1\n" * 1000)
    with pytest.raises(FileIOError, match="limit"):
        read_input(str(big), "--config", max_bytes=1000)
    assert read_input(str(big), "--config", max_bytes=5000).startswith("a: 1")


def test_non_utf8_is_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"{\xff}")
    with pytest.raises(FileIOError, match="not UTF-8"):
        read_input(str(bad), "--snapshot")


def test_dev_stdout_to_a_pipe_writes_through():
    r = gpudoctor("docs", "-o", "/dev/stdout")
    assert r.returncode == 0 and r.stdout.startswith("# gpudoctor check reference"), r.stderr


def test_dev_stdout_appended_to_keeps_what_the_file_held(tmp_path):
    out = tmp_path / "all.md"
    out.write_text("kept line\n")
    with open(out, "ab") as fh:  # the shell's `>> all.md`
        r = subprocess.run(
            [sys.executable, "-m", "gpudoctor", "docs", "-o", "/dev/stdout"],
            stdout=fh,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert text.startswith("kept line\n# gpudoctor check reference")


def test_dev_stdout_into_a_closed_pipe_ends_quietly():
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpudoctor", "docs", "-o", "/dev/stdout"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.read(10)
    proc.stdout.close()  # `| head -c 10`
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and "Traceback" not in err and "Broken pipe" not in err


@needs_root
def test_snapshot_o_a_device_and_a_symlink_keep_what_they_are(tmp_path):
    node = _null_device(tmp_path)
    no_torch = ("--python", "/bin/true")  # what is probed is not the test: an interpreter that answers at once
    r = gpudoctor_here("snapshot", *no_torch, "-o", str(node))
    assert r.returncode == 0 and stat.S_ISCHR(os.lstat(node).st_mode), r.stderr
    target = tmp_path / "facts.json"
    target.write_text("{}")
    link = tmp_path / "latest.json"
    link.symlink_to(target)
    r = gpudoctor_here("snapshot", *no_torch, "-o", str(link))
    assert r.returncode == 0 and link.is_symlink() and '"gpudoctor.facts/1"' in target.read_text(), r.stderr


# --- one symlink rule for every writer (issue 24) -----------------------------------------------------------

SNAPSHOT = str(ROOT / "tests" / "fixtures" / "facts" / "recorded-cpu-debian12-torch2.13-nogpu.json")
SEED_FIXED = ROOT / "tests" / "fixtures" / "sbatch" / "seed-fixed-ntasks1-lightning.slurm"


def _writer_argv(writer: str, out: Path, work: Path) -> list[str]:
    """The command line of one writer, writing to out (for fix --apply, out is the script edited)."""
    return {
        "check --junit": ["check", "--snapshot", SNAPSHOT, "--select", "nccl", "--junit", str(out)],
        "check --prometheus": ["check", "--snapshot", SNAPSHOT, "--select", "nccl", "--prometheus", str(out)],
        "docs -o": ["docs", "-o", str(out)],
        "fix --apply": ["fix", "--snapshot", SNAPSHOT, "--launcher", "lightning", "--sbatch", str(out), "--apply"],
        # facts with NCCL_DEBUG=INFO, replayed: one environment change to write
        "fix --env-file": ["fix", "--snapshot", str(work / "nccl-info.json"), "--env-file", str(out)],
    }[writer]


WRITERS = ["check --junit", "check --prometheus", "docs -o", "snapshot -o", "fix --apply", "fix --env-file"]


def _run_writer(writer: str, out: Path, work: Path, monkeypatch, capsys) -> tuple[int, str]:
    from gpudoctor.cli import main
    from gpudoctor.facts import Facts
    from tests.factsutil import make_facts

    monkeypatch.setenv("SLURM_CONF", os.devnull)
    if writer == "snapshot -o":  # cmd_snapshot's write without its probe (seconds): Facts.dump, the same writer
        try:
            Facts.load(SNAPSHOT).dump(str(out))
        except FileIOError as e:
            print(f"gpudoctor: {e}", file=sys.stderr)
            return 2, capsys.readouterr().err
        return 0, capsys.readouterr().err
    make_facts("recorded-cpu-debian12-torch2.13-nogpu", env={"NCCL_DEBUG": "INFO"}).dump(str(work / "nccl-info.json"))
    code = main(_writer_argv(writer, out, work))
    return code, capsys.readouterr().err


@pytest.mark.parametrize("writer", WRITERS)
def test_every_writer_follows_a_symlink_within_its_directory(tmp_path, writer, monkeypatch, capsys):
    target = tmp_path / "real.out"
    target.write_bytes(SEED_FIXED.read_bytes() if writer == "fix --apply" else b"old\n")
    link = tmp_path / "latest.out"
    link.symlink_to("real.out")
    code, err = _run_writer(writer, link, tmp_path, monkeypatch, capsys)
    assert code in (0, 1), err  # fix --apply: written, an unsafe-only fail remains (exit 1)
    assert link.is_symlink() and os.readlink(link) == "real.out"
    assert target.read_bytes() not in (b"old\n", SEED_FIXED.read_bytes())


@pytest.mark.parametrize("writer", WRITERS)
def test_every_writer_refuses_a_symlink_out_of_its_directory(tmp_path, writer, monkeypatch, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / "victim"
    original = SEED_FIXED.read_bytes() if writer == "fix --apply" else b"keep me\n"
    victim.write_bytes(original)
    here = tmp_path / "checkout"
    here.mkdir()
    link = here / "out.file"
    link.symlink_to(victim)
    code, err = _run_writer(writer, link, tmp_path, monkeypatch, capsys)
    assert code == 2 and "outside its own directory" in err and len(err.strip().splitlines()) == 1, err
    assert victim.read_bytes() == original and os.listdir(elsewhere) == ["victim"]
    assert link.is_symlink() and os.listdir(here) == ["out.file"]


def test_a_symlinked_directory_in_the_path_is_followed(tmp_path):
    """node_exporter's textfile directory is often a link: the path names it, so it is written there."""
    real_dir = tmp_path / "srv-textfile"
    real_dir.mkdir()
    (tmp_path / "textfile").symlink_to(real_dir)
    write_output(str(tmp_path / "textfile" / "gpudoctor.prom"), "x 1\n", what="--prometheus")
    assert (real_dir / "gpudoctor.prom").read_text() == "x 1\n"


def test_smoke_writers_refuse_a_symlink_out_of_its_directory(tmp_path, capsys):
    from gpudoctor.sample_train.launch import _write

    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "base.json").symlink_to(victim)
    assert _write(str(tmp_path / "d" / "base.json"), "{}\n", "--save-baseline") is False
    assert "outside its own directory" in capsys.readouterr().err and victim.read_text() == "keep me\n"
    assert write_output("/dev/stdout", "", what="-o") is None  # a descriptor's magic link is written through
