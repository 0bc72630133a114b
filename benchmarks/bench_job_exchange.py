"""A simulated check --job exchange of NODES x RANKS_PER_NODE ranks through a real TCPStore.

What is real: the TCPStore (torch.distributed, libuv server) and one client connection per simulated
rank; the rank payloads (Member.to_wire of this machine's probed facts, every rank with its own rank,
node and host name); the protocol (m/<rank>, arrived, request, c/<rank>, verdict, done); rank 0's side
is check_job.Gatherer.judge itself (it reads every member, builds the job view, runs the job checks and
renders the report). One node (the one after the middle) carries another NCCL_SOCKET_IFNAME, so rank 0 fetches one
content.

What is simulated: the ranks are not separate hosts; WORKERS processes on this machine each drive
their share of the ranks on THREADS threads (each thread: its ranks one after another: connect, set,
add; then wait for the request and the verdict), so arrival is only THREADS x WORKERS-way parallel,
not simultaneous as on a real cluster, and all 8,192 connections end on one machine's loopback. No probing
is timed: every rank reuses one probe of this machine.

Resolver: c10d names each new connection with getnameinfo() (a reverse lookup of ::ffff:127.0.0.1). On a
machine whose resolver does not answer, every such lookup that misses glibc's cache waits the resolver
timeout (5 s): a property of that machine, not of the exchange. Run with RES_OPTIONS="timeout:1 attempts:1"
there (glibc reads it per process) and say so with the figures.

    python benchmarks/bench_job_exchange.py [--nodes 1024] [--ranks-per-node 8] [--workers 8] [--threads 128]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing as mp
import os
import platform
import socket
import sys
import time
from datetime import timedelta

from gpudoctor.job import exchange


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _payloads(parts: dict) -> tuple[dict, dict]:
    from gpudoctor.job.compare import digest

    digests = {a: digest(c) for a, c in parts.items()}
    drift = dict(parts, env={**parts["env"], "NCCL_SOCKET_IFNAME": "eth9"})
    return digests, {a: digest(c) for a, c in drift.items()}


def _member_wire(rank: int, rpn: int, digests: dict) -> dict:
    node = rank // rpn
    return {
        "rank": rank,
        "node": f"gpu-{node:04d}",
        "hostname": f"gpu-{node:04d}",
        "node_index": node,
        "local_rank": rank % rpn,
        "leader": rank % rpn == 0,
        "gpu": f"GPU-{rank:08x}-sim",
        "digests": digests,
    }


def worker(
    ranks: list[int], port: int, ns: str, rpn: int, drift_node: int, parts: dict, threads: int, out: mp.Queue
) -> None:
    """Drives its ranks on `threads` threads, each rank with its own client connection."""
    import threading

    stats = {"bytes_sent": 0, "answered": 0, "connect_s": 0.0}
    lock = threading.Lock()
    t0 = time.monotonic()
    pool = [
        threading.Thread(target=_drive, args=(ranks[k::threads], port, ns, rpn, drift_node, parts, stats, lock))
        for k in range(threads)
    ]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    out.put({"ranks": len(ranks), **stats, "total_s": time.monotonic() - t0})


def _arrived_at(stats: dict, lock) -> None:
    with lock:
        stats["arrived_at"] = max(stats.get("arrived_at", 0.0), time.monotonic())


def _drive(ranks: list[int], port: int, ns: str, rpn: int, drift_node: int, parts: dict, stats: dict, lock) -> None:
    import torch.distributed as dist

    digests, drift_digests = _payloads(parts)
    drift_parts = dict(parts, env={**parts["env"], "NCCL_SOCKET_IFNAME": "eth9"})
    stores, sent, answered, connect_s = {}, 0, 0, 0.0
    for r in ranks:  # arrival: connect, publish the digests, count in
        c0 = time.monotonic()
        st = dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=600))
        connect_s = max(connect_s, time.monotonic() - c0)
        digs = drift_digests if r // rpn == drift_node else digests
        wire = exchange.encode(_member_wire(r, rpn, digs))
        st.set(f"{ns}/m/{r}", wire)
        st.add(f"{ns}/arrived", 1)
        stores[r] = st
        sent += len(wire)
    _arrived_at(stats, lock)  # CLOCK_MONOTONIC is one clock for every process of this machine
    for r, st in stores.items():  # the request, then the verdict; every rank reads both (blocking waits)
        st.wait([f"{ns}/request"], timedelta(seconds=600))
        wanted = exchange.request(st.get(f"{ns}/request")).get(str(r))
        if wanted:
            body = drift_parts if r // rpn == drift_node else parts
            blob = exchange.encode({a: body.get(a) for a in wanted})
            st.set(f"{ns}/c/{r}", blob)
            sent += len(blob)
            answered += 1
    for st in stores.values():
        st.wait([f"{ns}/verdict"], timedelta(seconds=600))
        exchange.verdict(st.get(f"{ns}/verdict"))
        st.add(f"{ns}/done", 1)
    with lock:
        stats["bytes_sent"] += sent
        stats["answered"] += answered
        stats["connect_s"] = max(stats["connect_s"], connect_s)


def _options() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, default=1024)
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--workers", type=int, default=8, help="processes driving the simulated ranks")
    p.add_argument("--threads", type=int, default=128, help="threads per worker, each driving its share of ranks")
    return p.parse_args()


def _rank0(a: argparse.Namespace, n: int, port: int):
    """Rank 0 as `check --job` runs it: one real probe of this machine (its parts reused by every simulated
    rank), the Gatherer serving the TCPStore, and its own member. Returns (gatherer, member, parts)."""
    import torch.distributed as dist

    from gpudoctor.commands import check_job as gather
    from gpudoctor.inputs import specs_for
    from gpudoctor.job.compare import aspects
    from gpudoctor.job.world import World
    from gpudoctor.model import Context
    from gpudoctor.probe import collect
    from gpudoctor.runner import run_checks

    args = argparse.Namespace(
        select=None, ignore=None, json=False, verbose=False, strict=False, junit=None, snapshot=None, job=True
    )
    specs = specs_for(args)
    facts = collect()
    findings = run_checks([s for s in specs if s.category != "job"], facts, Context())
    parts = aspects(facts, findings, ranks_here=a.ranks_per_node, leader=True)
    world = World("env", 0, n, 0, a.ranks_per_node, "127.0.0.1", port, False, "gpudoctor-smoke/bench")
    g = gather.Gatherer(world, dist, args, specs, Context(), {}, timeout=600)
    g.store = dist.TCPStore("127.0.0.1", port, None, True, timeout=timedelta(seconds=600), wait_for_workers=False)
    me = exchange.member(exchange.encode(_member_wire(0, a.ranks_per_node, _payloads(parts)[0])), 0)
    me.contents = parts
    return g, me, parts


def _run_exchange(a: argparse.Namespace, n: int, port: int, ns: str, drift_node: int, g, me, parts: dict) -> dict:
    """Spawn the workers, let rank 0 judge, and wait for every rank: the verdict, the report and the timings."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    shares = [list(range(1 + i, n, a.workers)) for i in range(a.workers)]
    t0 = time.monotonic()
    procs = [
        ctx.Process(target=worker, args=(s, port, ns, a.ranks_per_node, drift_node, parts, a.threads, q))
        for s in shares
    ]
    for pr in procs:
        pr.start()
    g.store.set(f"{ns}/m/0", exchange.encode(me.to_wire()))
    g.store.add(f"{ns}/arrived", 1)
    report = io.StringIO()
    with contextlib.redirect_stdout(report):
        g.started = time.monotonic()
        code = g.judge(me)
    verdict_at = time.monotonic()
    stats = [q.get(timeout=600) for _ in procs]
    for pr in procs:
        pr.join(60)
    return {
        "code": code,
        "report": report.getvalue(),
        "stats": stats,
        "verdict_at": verdict_at,
        "t_verdict": verdict_at - t0,
        "t_all": time.monotonic() - t0,
    }


def _summary(a: argparse.Namespace, n: int, drift_node: int, me, run: dict) -> dict:
    import torch

    stats = run["stats"]
    sent = sum(s["bytes_sent"] for s in stats)
    wire0 = len(exchange.encode(me.to_wire()))
    drift_lines = [line.strip() for line in run["report"].splitlines() if "NCCL_SOCKET_IFNAME" in line]
    return {
        "res_options": os.environ.get("RES_OPTIONS"),
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs, {platform.processor() or platform.machine()})",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "nodes": a.nodes,
        "ranks_per_node": a.ranks_per_node,
        "ranks": n,
        "workers": a.workers,
        "member_bytes_rank0": wire0,
        "bytes_sent_by_other_ranks": sent,
        "bytes_per_rank": round((sent + wire0) / n, 1),
        "threads_per_worker": a.threads,
        "contents_fetched": sum(s["answered"] for s in stats),
        "spawn_to_verdict_s": round(run["t_verdict"], 2),
        "spawn_to_all_ranks_done_s": round(run["t_all"], 2),
        "last_arrival_to_verdict_s": round(run["verdict_at"] - max(s["arrived_at"] for s in stats), 3),
        "slowest_client_connect_s": round(max(s["connect_s"] for s in stats), 2),
        "drift_node": f"gpu-{drift_node:04d}",
        "exit": int(run["code"]),
        "report_drift_line": drift_lines[:1],
    }


def main() -> int:
    a = _options()
    n = a.nodes * a.ranks_per_node
    port, ns = _free_port(), "gpudoctor-job/bench"
    g, me, parts = _rank0(a, n, port)
    drift_node = a.nodes // 2 + 1 if a.nodes > 1 else 0
    run = _run_exchange(a, n, port, ns, drift_node, g, me, parts)
    print(json.dumps(_summary(a, n, drift_node, me, run), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
