"""Issue 20: what other machines send is untrusted. A real `gpudoctor check --job` rank 0 hosting the job's
real TCPStore; a second real process, standing in for rank 1 (another gpudoctor version, another program
on the port), writes a malformed entry. Rank 0 must judge it (GD-JOB-001 names the rank), exit 1, never 3,
within its timeout, with no control byte in any output."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpudoctor.job import exchange
from tests.cliutil import clean_env

HOST = socket.gethostname()
TIMEOUT = 8
CONTROL = [chr(c) for c in range(0x20) if c not in (0x09, 0x0A, 0x0D)] + ["\x7f", "\x9b"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The impostor: connects to rank 0's store as a client and writes rank 1's entry, then counts itself arrived.
IMPOSTOR = textwrap.dedent(
    """
    import sys, time, socket
    from datetime import timedelta
    from torch.distributed import TCPStore
    port, path = int(sys.argv[1]), sys.argv[2]
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    store = TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=60))
    store.set("gpudoctor-job/env/0/m/1", open(path, "rb").read())
    store.add("gpudoctor-job/env/0/arrived", 1)
    try:  # answer rank 0's request and count itself done, as a rank does (rank 0 may be gone already)
        if len(sys.argv) > 3:
            store.wait(["gpudoctor-job/env/0/request"])
            store.set("gpudoctor-job/env/0/c/1", open(sys.argv[3], "rb").read())
        store.wait(["gpudoctor-job/env/0/verdict"])
        store.add("gpudoctor-job/env/0/done", 1)
    except Exception:
        pass
    """
)


def _rank0(tmp_path: Path, port: int, *extra: str) -> subprocess.Popen:
    env = clean_env(
        {
            "RANK": "0",
            "WORLD_SIZE": "2",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    cmd = [sys.executable, "-m", "gpudoctor", "check", "--job", "--timeout", str(TIMEOUT), "--select", "distributed"]
    return subprocess.Popen(
        [*cmd, *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path
    )


def _good_entry(**changes) -> dict:
    entry = {
        "rank": 1,
        "node": HOST,
        "hostname": HOST,
        "node_index": None,
        "local_rank": 1,
        "leader": False,
        "gpu": None,
        "digests": {},
        "format": exchange.FORMAT,
        "gpudoctor": "0.1.0",
    }
    entry.update(changes)
    return entry


MALFORMED = {
    "not UTF-8": (b"\xff\xfe\x00garbage", "not UTF-8 text"),
    "a JSON list": (b"[1, 2, 3]", "a JSON list where an object belongs"),
    "wrong field types": (json.dumps(_good_entry(node_index="0", leader="yes")).encode(), "field node_index is a str"),
    "oversized": (json.dumps(_good_entry(node="x" * 200_000)).encode(), "more than the 65,536 this format allows"),
    "a future format": (
        json.dumps(_good_entry(format=2, gpudoctor="0.9.0")).encode(),
        "exchange format 2 written by gpudoctor 0.9.0, not 1",
    ),
    "another program's bytes": (b"HTTP/1.1 400 Bad Request\r\n\r\n", "not JSON"),
}


@pytest.mark.parametrize("entry, reason", MALFORMED.values(), ids=list(MALFORMED))
def test_rank_0_judges_an_entry_it_cannot_read(tmp_path, entry, reason):
    port = _free_port()
    (tmp_path / "entry").write_bytes(entry)
    started = time.monotonic()
    rank0 = _rank0(tmp_path, port, "--json", "--junit", str(tmp_path / "junit.xml"))
    impostor = subprocess.run(
        [sys.executable, "-c", IMPOSTOR, str(port), str(tmp_path / "entry")],
        capture_output=True,
        text=True,
        timeout=90,
        env=clean_env(),
    )
    out, err = rank0.communicate(timeout=90)
    elapsed = time.monotonic() - started
    assert impostor.returncode == 0, impostor.stderr
    assert rank0.returncode == 1, (out, err)
    assert "internal error" not in err and "Traceback" not in err
    (f,) = [f for f in json.loads(out)["findings"] if f["id"] == "GD-JOB-001"]
    assert f["severity"] == "fail"
    assert "rank 1 on " in f["message"] and "sent an entry this gpudoctor" in f["message"] and reason in f["message"]
    assert f"another program on the job's store 127.0.0.1:{port}" in f["message"]
    assert "never reported" not in f["message"]  # it did report; what it sent is unreadable
    assert elapsed < TIMEOUT + 30, "bounded: rank 0 waits only for the ranks that can still arrive"
    junit = (tmp_path / "junit.xml").read_text()
    for text in (out, err, junit):
        assert not any(c in text for c in CONTROL)


def test_text_from_another_rank_is_cleaned_in_every_output(tmp_path):
    port = _free_port()
    evil = "gpu\x1b]0;pwned\x07node\x1b[31m"
    entry = _good_entry(node=evil, hostname=evil, gpu="GPU-\x1b[2J", digests={"env": "differs"})
    (tmp_path / "entry").write_bytes(json.dumps(entry).encode())
    contents = {"env": {"OMP_NUM_THREADS": "7\x1b[2J", "NCCL_SOCKET_IFNAME": "\x1b]0;x\x07eth0"}}
    (tmp_path / "contents").write_text(exchange.encode(contents))
    rank0 = _rank0(tmp_path, port, "-v")
    cmd = [sys.executable, "-c", IMPOSTOR, str(port), str(tmp_path / "entry"), str(tmp_path / "contents")]
    subprocess.run(cmd, timeout=90, env=clean_env())
    out, err = rank0.communicate(timeout=90)
    assert rank0.returncode in (0, 1) and "Traceback" not in err, err
    assert not any(c in out + err for c in CONTROL)
    assert "gpunode" in out  # the host is named, without its escape sequences
    assert "OMP_NUM_THREADS" in out and "7[2J" not in out  # its contents were read, cleaned (ESC [2J dropped)


@pytest.mark.parametrize(
    "raw, words",
    [
        (b'{"format": 1, "ranks": {"1": "env"}}', "field ranks is not a map"),
        (b'{"format": 1, "exit": "0"}', "field exit is '0', not 0 or 1"),
    ],
)
def test_rank_0s_answers_are_validated_too(raw, words):
    with pytest.raises(exchange.EntryError, match=words):
        exchange.request(raw) if b"ranks" in raw else exchange.verdict(raw)


def test_a_readable_entry_round_trips():
    from gpudoctor.job.compare import Member

    me = Member(rank=3, node="gpu-1", hostname="gpu-1", node_index=0, local_rank=1, leader=False, digests={"a": "b"})
    back = exchange.member(exchange.encode(me.to_wire()), 3)
    assert back == me
    with pytest.raises(exchange.EntryError, match="field rank is 3, not 4"):
        exchange.member(exchange.encode(me.to_wire()), 4)


# ---------------------------------------------------------------- compare: snapshots recorded elsewhere

RECORDED = Path(__file__).parents[1] / "fixtures" / "facts" / "recorded-cpu-debian12-torch2.13-nogpu.json"


@pytest.fixture
def hostile_pair(tmp_path) -> tuple[Path, Path]:
    good = json.loads(RECORDED.read_text())
    bad = json.loads(RECORDED.read_text())
    bad["host"]["hostname"] = "\x1b]0;pwned\x07gpu\x1b[31m-002"
    bad["env"]["OMP_NUM_THREADS"] = "7\x1b[2J\x9b31m"
    bad["nvidia"]["error"] = "no driver\x1b[0m\x00"
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(good))
    b.write_text(json.dumps(bad))
    return a, b


@pytest.mark.parametrize("extra", [[], ["-v"], ["--json"]])
def test_compare_shows_another_machines_text_cleaned(hostile_pair, extra):
    from tests.cliutil import run_gpudoctor

    a, b = hostile_pair
    r = run_gpudoctor("compare", str(a), str(b), *extra)
    assert r.returncode == 1, r.stderr
    assert not any(c in r.stdout + r.stderr for c in CONTROL)
    if not extra:
        assert "gpu-002 (" in r.stdout  # the node is still named, without the sequences


@pytest.mark.parametrize(
    "content, words",
    [
        ('{"schema": "gpudoctor.facts/9"}', "schema is 'gpudoctor.facts/9', expected 'gpudoctor.facts/1'"),
        ("[1, 2]", ""),
        (b"\xff\xfe not text", ""),
    ],
)
def test_compare_names_the_snapshot_it_cannot_read(hostile_pair, tmp_path, content, words):
    from tests.cliutil import run_gpudoctor

    a, _ = hostile_pair
    bad = tmp_path / "bad.json"
    bad.write_bytes(content if isinstance(content, bytes) else content.encode())
    r = run_gpudoctor("compare", str(a), str(bad))
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert str(bad) in r.stderr and words in r.stderr and "Traceback" not in r.stderr
