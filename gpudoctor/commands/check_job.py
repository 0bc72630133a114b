"""`gpudoctor check --job`: every rank's view meets at rank 0 through torch.distributed's TCPStore.

The store is the job's own rendezvous point (MASTER_ADDR:MASTER_PORT; under srun without them the
first host of the step and a port derived from the job and step, as the smoke run does), hosted
by torchrun's agent or by rank 0: no new server, no shared filesystem. torch is imported only here.

The exchange, under the key prefix gpudoctor-job/<run id>/<restart>:
  m/<rank>    every rank: who it is and the digests of its aspects (a few hundred bytes)
  arrived     a counter every rank increments after writing m/<rank>
  request     rank 0: which ranks must send which aspects (one rank per digest rank 0 lacks)
  c/<rank>    the asked ranks: the contents of those aspects
  verdict     rank 0: the job's exit code, which every rank exits with
  done        a counter the ranks increment after reading the verdict (rank 0 keeps the store up till then)
Every wait is bounded: rank 0 waits --timeout for the ranks, then names the missing ones.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import time
from datetime import timedelta
from typing import Any

from gpudoctor import __version__
from gpudoctor.commands.compare import job_result, job_specs
from gpudoctor.job import exchange, rankmap
from gpudoctor.job.compare import Member, aspects, digest, label_nodes, node_index, view
from gpudoctor.sanitize import clean

DEFAULT_TIMEOUT = 60.0
FETCH_S = 10.0  # rank 0's extra wait for the contents it asked for
MARGIN_S = 15.0  # how much longer than rank 0 the other ranks wait for it
MASTER_CONNECT_S = 3.0
POLL_S = 0.05
RANK_ONLY_SECTIONS = frozenset({"env"})  # a non-leader rank runs the checks that need nothing more


def _say(text: str) -> None:
    print(clean(f"gpudoctor: {text}"), file=sys.stderr, flush=True)


def run(args, specs: list, ctx, probe_kwargs: dict, usage_error) -> int:
    """Entry from cli.cmd_check (`check --job`); usage_error is the CLI's one-line exit-2 exception."""
    from gpudoctor.job.world import WorldError, detect

    if not args.job:
        raise usage_error("--timeout applies to --job")
    if args.snapshot:
        raise usage_error("--job gathers live ranks; it cannot replay a --snapshot (use gpudoctor compare)")
    timeout = DEFAULT_TIMEOUT if args.timeout is None else args.timeout
    if not 0 < timeout < math.inf:
        raise usage_error(f"--timeout must be a finite number of seconds, more than 0 (got {timeout})")
    try:
        world = detect()
    except WorldError as e:
        raise usage_error(f"--job: {e}") from None
    if world is None:
        raise usage_error(
            "--job runs inside a launcher's world (srun -n N, torchrun, RANK/WORLD_SIZE set); none found here"
        )
    try:
        import torch.distributed as dist
    except Exception as e:
        raise usage_error(
            f"--job exchanges views through torch.distributed's TCPStore: torch does not import "
            f"({type(e).__name__}: {e})"
        ) from None
    return Gatherer(world, dist, args, specs, ctx, probe_kwargs, timeout).run()


class Gatherer:
    def __init__(self, world, dist, args, specs, ctx, probe_kwargs: dict, timeout: float):
        self.world, self.dist, self.args, self.specs, self.ctx = world, dist, args, specs, ctx
        self.probe_kwargs, self.timeout = dict(probe_kwargs), timeout
        self.started = time.monotonic()
        self.ns = world.namespace.replace("gpudoctor-smoke/", "gpudoctor-job/", 1)
        self.env = dict(os.environ)
        self.hostname = socket.gethostname()
        self.leader = world.local_rank == 0
        self.store: Any = None  # torch.distributed.TCPStore once connected

    def key(self, name: str) -> str:
        return f"{self.ns}/{name}"

    def who(self) -> str:
        idx = node_index(self.env)
        return f"rank {self.world.rank} on {self.hostname}" + (f" (node {idx})" if idx is not None else "")

    # --- this rank's view ------------------------------------------------------------------------------

    def probe(self) -> Member:
        from gpudoctor.probe import collect, start_torch_probe
        from gpudoctor.runner import run_checks

        # the torch import must end well before rank 0 stops waiting
        self.probe_kwargs["torch_timeout"] = min(self.probe_kwargs.get("torch_timeout", 60.0), 0.5 * self.timeout)
        job_free = [s for s in self.specs if s.category != "job"]
        if self.leader:
            needed = {n for s in job_free for n in s.needs} | {"host", "nvidia", "torch", "env", "slurm"}
            # this process imported torch for the store (run()): the probe forks it rather than import it again
            kw = self.probe_kwargs
            forked = start_torch_probe(kw.get("python"), kw["torch_timeout"], fork=True)
            facts = collect(needed, torch_probe=forked, **kw)
            local = job_free
        else:
            facts = collect({"env", "nvidia"}, **self.probe_kwargs)
            local = [s for s in job_free if set(s.needs) <= RANK_ONLY_SECTIONS]
        findings = run_checks(local, facts, self.ctx)
        parts = aspects(facts, findings, ranks_here=self.world.local_world_size, leader=self.leader)
        member = Member(
            rank=self.world.rank,
            node=self.hostname,
            hostname=self.hostname,
            node_index=node_index(self.env),
            local_rank=self.world.local_rank,
            leader=self.leader,
            gpu=_gpu_of(facts, self.world),
        )
        member.digests = {a: digest(c) for a, c in parts.items()}
        member.contents = parts
        return member

    def _master(self) -> dict | None:
        addr, port = self.env.get("MASTER_ADDR"), self.env.get("MASTER_PORT")
        if not addr:
            return None
        out: dict = {"addr": addr, "port": port}
        try:
            socket.create_connection((addr, int(port or 0)), timeout=MASTER_CONNECT_S).close()
        except (OSError, ValueError) as e:
            out["error"] = f"{type(e).__name__}: {e}"
        return out

    # --- the store -------------------------------------------------------------------------------------------

    def connect(self) -> None:
        w, dist = self.world, self.dist
        op_timeout = timedelta(seconds=self.timeout + FETCH_S + 2 * MARGIN_S)
        if w.rank == 0 and not w.agent_store:
            self.store = dist.TCPStore(
                w.master_addr, w.master_port, None, True, timeout=op_timeout, wait_for_workers=False
            )
            return
        deadline = self.started + self.timeout
        while True:  # TCPStore's own connect retries for about twice its timeout: bound it here
            try:
                socket.create_connection((w.master_addr, w.master_port), timeout=1.0).close()
                break
            except OSError as e:
                if time.monotonic() >= deadline:
                    raise ConnectionError(
                        f"the job's store at {w.master_addr}:{w.master_port} did not accept "
                        f"a connection within {self.timeout:g} s ({e.strerror or e})"
                    ) from None
                time.sleep(0.2)
        self.store = dist.TCPStore(w.master_addr, w.master_port, None, False, timeout=op_timeout)

    def run(self) -> int:
        me = self.probe()
        try:
            self.connect()
        except Exception as e:
            what = "host" if self.world.rank == 0 and not self.world.agent_store else "reach"
            _say(f"{self.who()} could not {what} the job's store: {str(e).splitlines()[0] if str(e) else e}")
            return 1
        if self.leader:  # after connecting: where rank 0 hosts the store, MASTER_PORT is up only now
            me.master = self._master()
        self.store.set(self.key(f"m/{self.world.rank}"), exchange.encode(me.to_wire()))
        self.store.add(self.key("arrived"), 1)
        if self.world.rank == 0:
            return self.judge(me)
        return self.follow(me)

    # --- the other ranks ------------------------------------------------------------------------------------

    def _wait(self, key: str, until: float) -> bool:
        """Block in the store (no polling: 8,192 waiting ranks cost the store nothing) until key is set."""
        left = until - time.monotonic()
        if left <= 0:
            return bool(self.store.check([key]))
        try:
            self.store.wait([key], timedelta(seconds=left))
            return True
        except Exception:  # timed out, or the store is gone (rank 0 ended)
            return False

    def follow(self, me: Member) -> int:
        until = self.started + self.timeout + FETCH_S + MARGIN_S
        if not self._wait(self.key("request"), until):
            _say(f"{self.who()}: rank 0 did not answer within {until - self.started:.0f} s; no job verdict")
            return 1
        try:
            request = exchange.request(self.store.get(self.key("request")))
        except exchange.EntryError as e:
            _say(f"{self.who()}: rank 0's request is unreadable ({e}): {self._foreign()}; no job verdict")
            return 1
        wanted = request.get(str(self.world.rank))
        if wanted:
            self.store.set(self.key(f"c/{self.world.rank}"), exchange.encode({a: me.contents.get(a) for a in wanted}))
        if not self._wait(self.key("verdict"), time.monotonic() + FETCH_S + MARGIN_S):
            _say(f"{self.who()}: rank 0 gave no verdict; no job verdict")
            return 1
        try:
            code = exchange.verdict(self.store.get(self.key("verdict")))
        except exchange.EntryError as e:
            _say(f"{self.who()}: rank 0's verdict is unreadable ({e}): {self._foreign()}; no job verdict")
            code = 1
        try:
            self.store.add(self.key("done"), 1)
        except Exception:
            pass
        return code

    # --- rank 0 -----------------------------------------------------------------------------------------------

    def judge(self, me: Member) -> int:
        n = self.world.world_size
        deadline = self.started + self.timeout
        while self.store.add(self.key("arrived"), 0) < n and time.monotonic() < deadline:
            time.sleep(POLL_S)
        arrived_count = self.store.add(self.key("arrived"), 0)
        keys = [self.key(f"m/{r}") for r in range(n)]
        present = list(range(n)) if arrived_count >= n else [r for r in range(n) if self.store.check([keys[r]])]
        present = [r for r in present if r != 0]
        raw = self.store.multi_get([keys[r] for r in present]) if present else []
        members, errors = [me], []
        for r, entry in zip(present, raw, strict=True):
            try:
                members.append(exchange.member(entry, r))
            except exchange.EntryError as e:  # the rank reported, but not in a form this gpudoctor reads
                errors.append(
                    {
                        "rank": r,
                        "node": exchange.host_of(entry) or "a host not known",
                        "error": self._unreadable(e, entry),
                    }
                )
        missing = sorted(set(range(n)) - {m.rank for m in members} - {e["rank"] for e in errors})
        errors += self._fetch(members, me)
        label_nodes(members)
        job = view(members, source="live", world_size=n, missing=missing, errors=errors)
        job["timeout_s"] = self.timeout
        job["missing_nodes"] = []
        if missing:  # which node each missing rank is on, from the launcher's layout (rankmap.py)
            located = rankmap.locate_missing(
                rankmap.layout_of(self.env, self.world.launcher, n),
                missing,
                {m.rank: m.node_index for m in members},
                hosts={m.node_index: m.node for m in members if m.node_index is not None},
            )
            job["missing_where"] = rankmap.to_facts(located)
            if isinstance(located, rankmap.Located):
                job["missing_nodes"] = [x.index for x in located.nodes if x.whole]
        code = self.report(job, n)
        self.store.set(self.key("verdict"), exchange.encode({"exit": code}))
        # keep the store up until the others have read the verdict (bounded: a dead rank never reads it)
        others = len(members) - 1
        until = time.monotonic() + MARGIN_S
        while others and self.store.add(self.key("done"), 0) < others and time.monotonic() < until:
            time.sleep(POLL_S)
        return code

    def report(self, job: dict, n: int) -> int:
        """Judge the job view and write it (stdout, then --junit and --prometheus: rank 0 only)."""
        from gpudoctor.facts import Facts
        from gpudoctor.report.emit import Output, emit
        from gpudoctor.runner import run_checks

        findings = run_checks(job_specs(self.args.ignore), Facts(sections={"job": job}, meta={}), self.ctx)
        elapsed = time.monotonic() - self.started
        header = f"gpudoctor check --job ({self.world.launcher}, world size {n}, {elapsed:.1f} s)"
        args = self.args
        result = job_result(
            findings,
            job,
            header,
            strict=args.strict,
            verbose=args.verbose,
            hostname=self.hostname,
            judged_at=time.time(),
        )
        outputs = [Output("json" if args.json else "text")]
        outputs += [Output("junit", args.junit)] if args.junit else []
        outputs += [Output("prometheus", args.prometheus)] if getattr(args, "prometheus", None) else []
        emit(result, outputs)
        return result.exit_code

    def _foreign(self) -> str:
        store = f"{self.world.master_addr}:{self.world.master_port}"
        return f"another gpudoctor version or another program on the job's store {store}"

    def _unreadable(self, e: Exception, entry) -> str:
        writer = exchange.writer_of(entry)
        return (
            f"sent an entry this gpudoctor {__version__} cannot read ({e}): "
            + (f"gpudoctor {writer} wrote it, or " if writer and writer != __version__ else "")
            + self._foreign()
        )

    def _fetch(self, members: list[Member], me: Member) -> list[dict]:
        """Ask one rank of each digest rank 0 does not hold for that aspect's content; wait bounded. Returns
        an error entry for each rank whose answer cannot be read (its digests stay; its contents are unknown)."""
        known = {(a, d) for a, d in me.digests.items()}
        request: dict[str, list[str]] = {}
        for m in sorted(members, key=lambda m: m.rank):
            for a, d in m.digests.items():
                if (a, d) not in known:
                    known.add((a, d))
                    request.setdefault(str(m.rank), []).append(a)
        self.store.set(self.key("request"), exchange.encode({"ranks": request}))
        by_rank = {m.rank: m for m in members}
        until = time.monotonic() + min(FETCH_S, self.timeout)
        errors = []
        for rank, wanted in request.items():
            key = self.key(f"c/{rank}")
            if self._wait(key, until):
                entry = self.store.get(key)
                try:
                    by_rank[int(rank)].contents.update(exchange.contents(entry, wanted))
                except exchange.EntryError as e:
                    node = by_rank[int(rank)].node
                    errors.append({"rank": int(rank), "node": node, "error": self._unreadable(e, entry)})
        return errors


def _gpu_of(facts, world) -> str | None:
    """The UUID of the GPU this rank will train on: CUDA_VISIBLE_DEVICES resolved against NVML."""
    from gpudoctor.job.device import device_index_for
    from gpudoctor.readers import cudavis

    gpus = [g for g in facts.gpus if not g.get("error")]
    if not gpus:
        return None
    vis = cudavis.from_facts(facts)
    if vis.mig:
        return vis.mig[0]
    order = list(vis.gpus) if vis.is_set and vis.gpus is not None else [g.get("index") for g in gpus]
    idx = device_index_for(len(order), world.local_rank, world.launcher)
    if idx is None:
        return None
    by_index = {g.get("index"): g for g in gpus}
    return (by_index.get(order[idx]) or {}).get("uuid")
