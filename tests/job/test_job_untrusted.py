"""Issue 20: what other machines send is untrusted. A real `gpudoctor check --job` rank 0 hosting the job's
real TCPStore; a second real process, standing in for ranks 1..7 (another gpudoctor version, another program
on the port, a hostile node), writes one malformed entry per rank and one readable entry full of escape
sequences. Rank 0 must judge each unreadable entry (GD-JOB-001 names the rank and its own reason), read the
hostile one cleaned, exit 1, never 3, within its timeout, with no control byte in any output. One world
proves every case: each rank's entry is judged on its own (checks/job.py lists one error per rank)."""

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
from tests.factsutil import said

HOST = socket.gethostname()
TIMEOUT = 8
CONTROL = [chr(c) for c in range(0x20) if c not in (0x09, 0x0A, 0x0D)] + ["\x7f", "\x9b"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The impostor: connects to rank 0's store as a client and writes the entries m/<rank> read from the files
# entries/<rank>, counting each rank arrived; then answers rank 0's request for c/<rank> from contents/<rank>
# and counts the ranks rank 0 could read as done, as real ranks do.
IMPOSTOR = textwrap.dedent(
    """
    import json, sys, time, socket
    from datetime import timedelta
    from pathlib import Path
    from torch.distributed import TCPStore
    port, root, readable = int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
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
    ranks = sorted(int(p.name) for p in (root / "entries").iterdir())
    for rank in ranks:
        store.set(f"gpudoctor-job/env/0/m/{rank}", (root / "entries" / str(rank)).read_bytes())
    store.add("gpudoctor-job/env/0/arrived", len(ranks))
    try:  # answer rank 0's request and count the readable ranks done (rank 0 may be gone already)
        store.wait(["gpudoctor-job/env/0/request"])
        asked = json.loads(store.get("gpudoctor-job/env/0/request"))["ranks"]
        for rank in asked:
            store.set(f"gpudoctor-job/env/0/c/{rank}", (root / "contents" / rank).read_bytes())
        store.wait(["gpudoctor-job/env/0/verdict"])
        store.add("gpudoctor-job/env/0/done", readable)
    except Exception:
        pass
    """
)


def _rank0(tmp_path: Path, port: int, world: int, *extra: str) -> subprocess.Popen:
    env = clean_env(
        {
            "RANK": "0",
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    cmd = [sys.executable, "-m", "gpudoctor", "check", "--job", "--timeout", str(TIMEOUT), "--select", "distributed"]
    return subprocess.Popen(
        [*cmd, *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path
    )


def _good_entry(rank: int = 1, **changes) -> dict:
    entry = {
        "rank": rank,
        "node": HOST,
        "hostname": HOST,
        "node_index": None,
        "local_rank": rank,
        "leader": False,
        "gpu": None,
        "digests": {},
        "format": exchange.FORMAT,
        "gpudoctor": "0.1.0",
    }
    entry.update(changes)
    return entry


# rank -> (what it sends as m/<rank>, the reason rank 0 must give for it)
MALFORMED = {
    1: (b"\xff\xfe\x00garbage", "not UTF-8 text"),
    2: (b"[1, 2, 3]", "a JSON list where an object belongs"),
    3: (json.dumps(_good_entry(3, node_index="0", leader="yes")).encode(), "field node_index is a str"),
    4: (json.dumps(_good_entry(4, node="x" * 200_000)).encode(), "more than the 65,536 this format allows"),
    5: (
        json.dumps(_good_entry(5, format=2, gpudoctor="0.9.0")).encode(),
        "exchange format 2 written by gpudoctor 0.9.0, not 1",
    ),
    6: (b"HTTP/1.1 400 Bad Request\r\n\r\n", "not JSON"),  # another program's bytes
}
HOSTILE = 7  # a readable entry whose node name, GPU and environment carry escape sequences
EVIL = "gpu\x1b]0;pwned\x07node\x1b[31m"


def _strings(value):
    """Every string in a parsed JSON document (keys too)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, str):
        yield value


# The tests reading the one world share a worker, so it runs once (pyproject.toml: --dist loadgroup).
shares_the_untrusted_world = pytest.mark.xdist_group("untrusted-job-world")


@pytest.fixture(scope="module")
def untrusted_world(tmp_path_factory):
    """One real rank 0 (JSON on stdout, JUnit to a file) and one impostor process for ranks 1..7."""
    tmp_path = tmp_path_factory.mktemp("untrusted")
    (tmp_path / "entries").mkdir()
    (tmp_path / "contents").mkdir()
    for rank, (entry, _) in MALFORMED.items():
        (tmp_path / "entries" / str(rank)).write_bytes(entry)
    hostile = _good_entry(HOSTILE, node=EVIL, hostname=EVIL, gpu="GPU-\x1b[2J", digests={"env": "differs"})
    (tmp_path / "entries" / str(HOSTILE)).write_bytes(json.dumps(hostile).encode())
    contents = {"env": {"OMP_NUM_THREADS": "7\x1b[2J", "NCCL_SOCKET_IFNAME": "\x1b]0;x\x07eth0"}}
    (tmp_path / "contents" / str(HOSTILE)).write_text(exchange.encode(contents))
    port = _free_port()
    started = time.monotonic()
    rank0 = _rank0(tmp_path, port, HOSTILE + 1, "--json", "--junit", str(tmp_path / "junit.xml"))
    impostor = subprocess.run(
        [sys.executable, "-c", IMPOSTOR, str(port), str(tmp_path), "1"],
        capture_output=True,
        text=True,
        timeout=90,
        env=clean_env(),
    )
    out, err = rank0.communicate(timeout=90)
    elapsed = time.monotonic() - started
    assert impostor.returncode == 0, impostor.stderr
    return {
        "port": port,
        "code": rank0.returncode,
        "out": out,
        "err": err,
        "junit": (tmp_path / "junit.xml").read_text(),
        "elapsed": elapsed,
    }


@shares_the_untrusted_world
def test_rank_0_judges_each_entry_it_cannot_read(untrusted_world):
    w = untrusted_world
    out, err = w["out"], w["err"]
    assert w["code"] == 1, (out, err)
    assert "internal error" not in err and "Traceback" not in err
    (f,) = [f for f in json.loads(out)["findings"] if f["id"] == "GD-JOB-001"]
    assert f["severity"] == "fail"
    assert "never reported" not in said(f)  # every rank reported; what six of them sent is unreadable
    assert f["evidence"]["missing_ranks"] == []
    errors = {e["rank"]: e["error"] for e in f["evidence"]["errors"]}
    assert sorted(errors) == sorted(MALFORMED), errors  # the readable hostile rank is no error
    foreign = f"another program on the job's store 127.0.0.1:{w['port']}"
    for rank, (_, reason) in MALFORMED.items():
        # each rank is named in the message with its own reason (the message lists one part per rank)
        assert reason in errors[rank] and "sent an entry this gpudoctor" in errors[rank] and foreign in errors[rank]
        assert f"rank {rank} on " in said(f) and reason in said(f)
    assert w["elapsed"] < TIMEOUT + 30, "bounded: rank 0 waits only for the ranks that can still arrive"


@shares_the_untrusted_world
def test_text_from_another_rank_is_cleaned_in_every_output(untrusted_world):
    w = untrusted_world
    for text in (w["out"], w["err"], w["junit"]):
        assert not any(c in text for c in CONTROL)
    # JSON escapes a control byte as \u001b: look at the decoded strings too
    strings = list(_strings(json.loads(w["out"])))
    assert not any(c in s for s in strings for c in CONTROL)
    assert any("gpunode" in s for s in strings)  # the host is named, without its escape sequences
    # its contents were read (the environment differs from rank 0's), cleaned (ESC [2J dropped)
    assert any("OMP_NUM_THREADS" in s for s in strings) and not any("7[2J" in s for s in strings)


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
