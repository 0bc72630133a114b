"""check --job for real: torchrun agents as two nodes on this host, env-launched ranks, a real TCPStore.

Drift is injected by giving one node another environment (never by editing facts); a rank that never
starts and a refused store connection must be named within the timeout.
"""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cliutil import clean_env, flat

pytest.importorskip("torch.distributed")

GD = [sys.executable, "-m", "gpudoctor", "check", "--job", "--expect-gpus", "0"]
HOST = socket.gethostname()
# torchrun of this interpreter: a `torchrun` on PATH may belong to another Python (a pyenv shim) and run
# another gpudoctor than the one under test.
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(extra: dict | None = None) -> dict:
    return clean_env(extra)


def _package_dir(tmp_path: Path, name: str, version: str) -> Path:
    """A directory that, on PYTHONPATH, exposes another installed version of a package (its metadata)."""
    root = tmp_path / "site"
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root


@pytest.mark.world
def test_two_torchrun_nodes_the_drifting_node_is_named(tmp_path):
    port = _free_port()
    drift = {
        "NCCL_SOCKET_IFNAME": "gd-no-such-if0",
        "OMP_NUM_THREADS": "3",
        "PYTHONPATH": str(_package_dir(tmp_path, "accelerate", "0.99.0")),
    }
    agents = []
    started = time.monotonic()
    for node in (0, 1):
        cmd = [
            *TORCHRUN,
            "--nnodes",
            "2",
            "--node-rank",
            str(node),
            "--nproc-per-node",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            f"gd-{port}",
            "--max-restarts",
            "0",
            "-m",
            "gpudoctor",
            *GD[3:],
            "--timeout",
            "40",
        ]
        env = _env({"OMP_NUM_THREADS": "1", **(drift if node == 1 else {})})
        agents.append(
            subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
        )
    outs = [a.communicate(timeout=120) for a in agents]
    elapsed = time.monotonic() - started
    # the c10d rendezvous, not --node-rank, decides which agent's workers get GROUP_RANK 0 and rank 0
    reports = [out for out, _ in outs if out]
    assert len(reports) == 1, f"only rank 0 prints the report: {outs}"
    report = flat(reports[0])
    assert "4 rank(s) on 2 node(s)" in report, outs
    # the node identity is torchrun's GROUP_RANK: one host name, two nodes
    m = re.search(
        rf"on {re.escape(HOST)}#(\d) \(ranks (\d)–(\d)\): NCCL_SOCKET_IFNAME=gd-no-such-if0 where "
        rf"{re.escape(HOST)}#(\d) \(ranks (\d)–(\d)\) has unset",
        report,
    )
    assert m, report
    drifting, other = int(m.group(1)), int(m.group(4))
    assert {drifting, other} == {0, 1}
    assert (int(m.group(2)), int(m.group(3))) == (2 * drifting, 2 * drifting + 1)
    drifter = f"{HOST}#{drifting} (ranks {2 * drifting}–{2 * drifting + 1})"
    assert f"on {drifter}: " in report and "OMP_NUM_THREADS=3 where" in report
    accelerate = rf"on {re.escape(drifter)}: .*accelerate=0\.99\.0 where {re.escape(HOST)}#{other} "
    assert re.search(accelerate, report), report
    # every rank exits with the job's verdict: the drift is a warn, and the store at 127.0.0.1 is fine because
    # both "nodes" run on this host (issue 18: it used to fail as a loopback MASTER_ADDR on a 2-node job)
    assert "GD-DIST-003" not in report.split("pass on")[0], report
    assert [a.returncode for a in agents] == [0, 0], outs
    assert elapsed < 90


@pytest.mark.world
def test_a_node_whose_ranks_never_reach_the_store_is_named_by_rank_0(tmp_path):
    """Two torchrun agents; every worker of group rank 1 is started with a MASTER_PORT nothing listens on
    (a firewall or a wrong port for that node), so none of its ranks report. Rank 0 names that node from
    torchrun's own rank layout, within --timeout."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    port, refused = _free_port(), _free_port()
    # The test hosts the rendezvous store (is_host=false on both agents), so the agent of the failing node
    # exiting early cannot take the store rank 0 still uses with it.
    store = TCPStore("127.0.0.1", port, None, True, timeout=timedelta(seconds=120), wait_for_workers=False)
    timeout = 12  # the arriving node must still reach the store in time on a busy 2-core machine
    worker = (
        f'[ "$GROUP_RANK" = 1 ] && export MASTER_PORT={refused}; '
        f"exec {shlex.quote(sys.executable)} -m gpudoctor check --job --expect-gpus 0 --select distributed "
        f"--timeout {timeout}"
    )
    agents = []
    started = time.monotonic()
    for node in (0, 1):
        cmd = [
            *TORCHRUN,
            "--nnodes=2",
            f"--node-rank={node}",
            "--nproc-per-node=2",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            "--rdzv-conf=is_host=false",
            f"--rdzv-id=gd-{port}",
            "--max-restarts=0",
            "--no-python",
            "bash",
            "-c",
            worker,
        ]
        agents.append(
            subprocess.Popen(
                cmd,
                env=_env({"OMP_NUM_THREADS": "1"}),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=tmp_path,
            )
        )
    try:
        outs = [a.communicate(timeout=150) for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
        del store
    elapsed = time.monotonic() - started
    reports = [out for out, _ in outs if "gpudoctor check --job" in out]
    assert len(reports) == 1, outs
    report = flat(reports[0])
    # the finding's sentence, then where the missing ranks are (its detail, under it)
    assert f"ranks 2–3 of a world of 4 never reported within {timeout} s (2 arrived)" in report, outs
    assert (
        "node 1 (torchrun's group rank 1) missing entirely (ranks 2–3), by torchrun's rank order (2 per agent)"
    ) in report, outs
    # the failing node's ranks say so on their own stderr, naming the port that refused them
    errs = "".join(err for _, err in outs)
    # Both of node 1's ranks give up at the same moment; torchrun SIGTERMs the other as soon as one exits, so
    # the second may be stopped before it says so itself (then it says it was terminated).
    said = [r for r in (2, 3) if re.search(rf"rank {r} on \S+ \(node 1\) could not reach the job's store", errs)]
    assert said and (len(said) == 2 or "gpudoctor: terminated (SIGTERM)" in errs), errs
    assert re.search(rf"store at \S+:{refused} did not accept a connection within {timeout} s", errs), errs
    assert all(a.returncode != 0 for a in agents)
    assert elapsed < timeout + 60, "bounded: the timeout plus startup and the fixed margins"


def _env_ranks(
    tmp_path: Path,
    world: int,
    ranks: list[int],
    port: int,
    timeout: float,
    port_of: dict | None = None,
    extra: tuple[str, ...] = (),
) -> list[subprocess.Popen]:
    procs = []
    for r in ranks:
        env = _env(
            {
                "RANK": str(r),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(r),
                "LOCAL_WORLD_SIZE": str(world),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str((port_of or {}).get(r, port)),
            }
        )
        procs.append(
            subprocess.Popen(
                [*GD, "--timeout", str(timeout), "--select", "distributed", *extra],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=tmp_path,
            )
        )
    return procs


@pytest.mark.world
def test_a_rank_that_never_starts_is_named_within_the_timeout(tmp_path):
    started = time.monotonic()
    procs = _env_ranks(tmp_path, 3, [0, 1], _free_port(), timeout=6, extra=("--prometheus", "job.prom"))
    outs = [p.communicate(timeout=90) for p in procs]
    elapsed = time.monotonic() - started
    assert "rank 2 of a world of 3 never reported within 6 s (2 arrived)" in flat(outs[0][0]), outs
    assert [p.returncode for p in procs] == [1, 1]
    assert elapsed < 6 + 40, "bounded: the timeout plus the fixed margins, never a hang"
    # rank 0 writes the job's verdict for node_exporter (issue 19)
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families((tmp_path / "job.prom").read_text())}
    assert families["gpudoctor_exit_code"].samples[0].value == 1
    problems = {s.labels["id"] for s in families["gpudoctor_check_problem"].samples if s.value == 1}
    assert problems and all(p.startswith("GD-JOB-") for p in problems)


@pytest.mark.world
def test_a_refused_store_connection_is_named_bounded(tmp_path):
    port, wrong = _free_port(), _free_port()  # nothing listens on `wrong`: connections are refused
    started = time.monotonic()
    procs = _env_ranks(tmp_path, 2, [0, 1], port, timeout=5, port_of={1: wrong})
    outs = [p.communicate(timeout=90) for p in procs]
    elapsed = time.monotonic() - started
    assert "rank 1 of a world of 2 never reported within 5 s" in flat(outs[0][0]), outs
    assert f"rank 1 on {HOST} could not reach the job's store" in outs[1][1]
    assert f"127.0.0.1:{wrong}" in outs[1][1] and "refused" in outs[1][1].lower()
    assert [p.returncode for p in procs] == [1, 1]
    assert elapsed < 5 + 40


def test_agreeing_ranks_pass_and_every_rank_exits_0(tmp_path):
    procs = _env_ranks(tmp_path, 2, [0, 1], _free_port(), timeout=30)
    outs = [p.communicate(timeout=90) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "no problems found" in outs[0][0] and "pass on 1 of 1 node(s)" in outs[0][0]
    assert outs[1][0] == ""


def test_job_outside_a_launcher_is_a_usage_error(tmp_path):
    r = subprocess.run([*GD, "--timeout", "5"], env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--job" in r.stderr


@pytest.mark.world
def test_a_loopback_rendezvous_of_two_nodes_on_one_host_is_not_flagged(tmp_path):
    """Issue 18: torchrun's static rendezvous at 127.0.0.1 with NCCL_SOCKET_IFNAME=lo, two agents (two
    "nodes" by GROUP_WORLD_SIZE) on this one host. Each node alone would call the loopback a multi-node
    problem; the gather sees every rank on one host and keeps the verdict clean."""
    port = _free_port()
    agents = []
    for node in (0, 1):
        cmd = [
            *TORCHRUN,
            "--nnodes=2",
            f"--node-rank={node}",
            "--nproc-per-node=1",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
            "--max-restarts=0",
            "-m",
            "gpudoctor",
            *GD[3:],
            "--select",
            "distributed,nccl",
            "--timeout",
            "40",
            "--json",
        ]
        env = _env({"OMP_NUM_THREADS": "1", "NCCL_SOCKET_IFNAME": "lo"})
        agents.append(
            subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
        )
    outs = [a.communicate(timeout=120) for a in agents]
    reports = [out for out, _ in outs if out.strip().startswith("{")]
    assert len(reports) == 1, outs
    report = json.loads(reports[0])
    node_checks = [f for f in report["findings"] if f["id"] == "GD-JOB-009"]
    assert [f["severity"] for f in node_checks] == ["pass"], [f["message"] for f in node_checks]
    assert f"every rank runs on {HOST}" in node_checks[0]["message"], node_checks  # the local verdicts did fire
    assert "GD-DIST-003" in node_checks[0]["message"] and "GD-NCCL-002" in node_checks[0]["message"]
    assert [a.returncode for a in agents] == [0, 0], outs
