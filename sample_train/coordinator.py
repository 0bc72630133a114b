"""The coordinator: watches every rank through the rendezvous store and decides how the run went.

It runs in the `gpudoctor smoke` parent when we spawn the ranks, or in a thread of rank 0
under torchrun/srun. It takes no part in any collective, so a hung all-reduce cannot hang it.
Ranks write, under a per-run namespace: join/<r> (where the rank landed), state/<r> (its phase
and a heartbeat counter, twice a second), error/<r>, result/<r>. The coordinator writes plan
(go or stop, and the model every rank trains) and abort. No torch here.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from gpudoctor.model import Severity
from gpudoctor.sample_train.judge import fit, outliers, peaks, placement
from gpudoctor.sample_train.judge.findings import failed, make, ranks_text
from gpudoctor.sample_train.sizes import MIN_MEASURED_STEPS, QUICK_STEPS, QUICK_WARMUP, SIZES, GPTConfig, size_for_gpu

HAND_BROADCAST = "model broadcast (rank 0's parameters, --quick)"  # sample_train/handdp.py: no DDP
STAGES = (
    "start",
    "rendezvous",
    "init process group",
    "first all-reduce",
    "matmul benchmark",
    "part benchmarks",
    "correctness",
    "all-reduce benchmark",
    "all-reduce inside and across nodes",  # two nodes or more
    "node pairs",  # two nodes or more
    "GPU pairs inside nodes",  # --deep
    "model build",
    "model broadcast (DDP)",
    HAND_BROADCAST,
    "optimizer",
    "straggler probe",
    "training",
    "parameter checksum",
    "soak",  # --soak
    "finished",
)
TRAINING = STAGES.index("training")
STEP_PARTS = ("data", "forward", "backward + gradient all-reduce", "optimizer")
# Errors a rank raises because another rank went away: secondary, not the cause.
_KNOCK_ON = re.compile(
    r"connection (closed|reset)|broken pipe|by peer|timed out|timeout|socket|DistNetworkError|DistBackendError|"
    r"NCCL communicator was aborted|ProcessGroup",
    re.IGNORECASE,
)
# Frames of a training thread that waits for the other ranks (a collective, or DDP's all-reduce in backward).
_COLLECTIVE_FRAMES = ("torch/distributed/", "torch/nn/parallel/", "torch/autograd/")
POLL_S = 0.25
SETTLE_S = 1.5  # after a first failure, how long to gather the others' reports


class Keys:
    def __init__(self, namespace: str):
        self.ns = namespace
        self.plan, self.abort = f"{namespace}/plan", f"{namespace}/abort"
        self.fallback_reporter = f"{namespace}/fallback-reporter"
        self.pg_prefix = f"{namespace}/pg"
        self.verdict, self.verdict_read = f"{namespace}/verdict", f"{namespace}/verdict-read"

    def join(self, rank: int) -> str:
        return f"{self.ns}/join/{rank}"

    def state(self, rank: int) -> str:
        return f"{self.ns}/state/{rank}"

    def error(self, rank: int) -> str:
        return f"{self.ns}/error/{rank}"

    def result(self, rank: int) -> str:
        return f"{self.ns}/result/{rank}"


def phase(stage: str, step: int | None = None, part: str | None = None) -> dict:
    label = f"step {step} ({part})" if stage == "training" else (f"soak sample {step}" if stage == "soak" else stage)
    return {
        "label": label,
        "order": [STAGES.index(stage), step or 0, STEP_PARTS.index(part) if part else 0],
        "step": step,
    }


def read_json(store, key: str):
    return json.loads(store.get(key)) if store.check([key]) else None


@dataclass
class Verdict:
    ok: bool
    findings: list = field(default_factory=list)
    joins: dict = field(default_factory=dict)
    results: dict = field(default_factory=dict)
    states: dict = field(default_factory=dict)
    plan: dict | None = None


class _Stop(Exception):
    def __init__(self, finding):
        self.finding = finding


def plan_run(joins: dict[int, dict], opts, fits: str | None = None) -> dict:
    """The model and precision every rank trains with, decided once from all ranks' reports. fits: the largest
    model the GPUs' free memory allows, where another process holds some (fit.judge)."""
    records = list(joins.values())
    if all(r["device_type"] == "cpu" for r in records):
        size = "tiny" if opts.train.size == "auto" else opts.train.size
        native = all(r.get("bf16_native") for r in records)
        precision = opts.train.precision if opts.train.precision != "auto" else ("bf16" if native else "fp32")
        why = {
            "bf16": "bf16 autocast on CPU",
            "fp16": "fp16 autocast with GradScaler on CPU (asked for with --precision fp16)",
            "fp32": "fp32 (asked for with --precision fp32)"
            if opts.train.precision == "fp32"
            else "fp32: this CPU has no native bf16 (avx512_bf16/amx_bf16), where bf16 matmuls run in slow emulation",
        }[precision]
    else:
        gpus = {(r.get("gpu_name"), r.get("gpu_memory_bytes")) for r in records}
        spec = [p.tflops for p in (peaks.identify(name, memory) for name, memory in gpus) if p]
        memory = min(r.get("gpu_memory_bytes") or 0 for r in records)
        size = size_for_gpu(memory, min(spec) if spec else None) if opts.train.size == "auto" else opts.train.size
        if opts.train.size == "auto":
            size = min((size, fits or size, "small" if opts.measure.quick else size), key=list(SIZES).index)
        native = all(r.get("bf16_native") for r in records)
        precision = opts.train.precision if opts.train.precision != "auto" else ("bf16" if native else "fp16")
        why = {
            "bf16": "bf16 autocast",
            "fp16": "fp16 autocast with GradScaler (asked for with --precision fp16)"
            if opts.train.precision == "fp16"
            else "fp16 autocast with GradScaler: a GPU in this run has no bf16 tensor cores (compute capability < 8.0)",
            "fp32": "fp32 (asked for with --precision fp32)",
        }[precision]
    cfg = _apply_overrides(SIZES[size], opts)
    nodes = node_layout(joins)
    deep = opts.measure.deep
    widest = max(len(ranks) for ranks in nodes)
    return {
        "go": True,
        "model": cfg.to_dict(),
        "precision": precision,
        "precision_reason": why,
        "nodes": nodes,
        "node_rounds": outliers.pair_rounds(len(nodes), every=deep),
        "local_rounds": outliers.pair_rounds(widest, every=True) if deep else [],
    }


def node_layout(joins: dict[int, dict]) -> list[list[int]]:
    """The ranks of each node, nodes in order of their lowest rank. A node is the launcher's node index
    (GROUP_RANK/SLURM_NODEID/NODE_RANK: one host may run several nodes), else the host."""
    by_node: dict = {}
    for rank in sorted(joins):
        j = joins[rank]
        by_node.setdefault((j.get("host"), j.get("node_index")), []).append(rank)
    return list(by_node.values())


def _apply_overrides(cfg: GPTConfig, opts) -> GPTConfig:
    quick = opts.measure.quick
    steps = opts.train.steps or (QUICK_STEPS if quick else cfg.steps)
    warmup = (QUICK_WARMUP if quick else cfg.warmup) if opts.train.warmup is None else opts.train.warmup
    warmup = max(0, min(warmup, steps - MIN_MEASURED_STEPS))
    return replace(
        cfg,
        steps=steps,
        warmup=warmup,
        seq_len=opts.train.seq_len or cfg.seq_len,
        batch_size=opts.train.loader.batch_size or cfg.batch_size,
    )


class Coordinator:
    """exits(): {rank: returncode} of local processes that ended (spawn mode only); logs(rank): tail."""

    def __init__(
        self,
        store,
        keys: Keys,
        world_size: int,
        deadline: float,
        opts,
        *,
        exits=None,
        logs=None,
        progress=None,
        stale_s: float = 15.0,
        terminated=None,
    ):
        self.store, self.keys, self.world_size, self.deadline, self.opts = store, keys, world_size, deadline, opts
        self.exits: Callable[[], dict[int, int]] = exits or (lambda: {})
        self.logs = logs or (lambda rank: None)
        self.progress = progress or (lambda info: None)
        self.terminated = terminated or (lambda: False)
        self.stale_s = stale_s
        self.joins: dict[int, dict] = {}
        self.states: dict[int, dict] = {}
        self.results: dict[int, dict] = {}
        self.errors: dict[int, dict] = {}
        self._beats: dict[int, tuple[int, float]] = {}
        self._moved: dict[int, tuple[tuple, float]] = {}  # each rank's last phase and when it changed
        self.plan: dict | None = None

    # -- the run -------------------------------------------------------------------------
    def run(self) -> Verdict:
        findings = []
        try:
            self._await("join", self.joins, self.keys.join)
            findings = [make("GD-SMOKE-001", Severity.PASS, self._joined_text()), *placement.check(self.joins)]
            fits, fitting = fit.judge(self.joins, self.opts)
            findings += fitting
            if failed(findings):
                self._publish(self.keys.plan, {"go": False, "reason": "placement"})
                return self._verdict(False, findings)
            self.plan = plan_run(self.joins, self.opts, fits)
            self._publish(self.keys.plan, self.plan)
            self._await("result", self.results, self.keys.result)
        except _Stop as stop:
            self._publish(self.keys.abort, {"reason": stop.finding.message})
            return self._verdict(False, findings + [stop.finding])
        return self._verdict(
            True,
            findings
            + [
                make("GD-SMOKE-004", Severity.PASS, "no rank failed"),
                make("GD-SMOKE-005", Severity.PASS, "the run finished within its timeout"),
            ],
        )

    def _verdict(self, ok: bool, findings: list) -> Verdict:
        return Verdict(ok, findings, self.joins, self.results, self.states, self.plan)

    def _publish(self, key: str, value: dict) -> None:
        try:
            self.store.set(key, json.dumps(value))
        except Exception:  # the store may be going away with a dying run; the verdict stands
            pass

    def _joined_text(self) -> str:
        hosts = sorted({j["host"] for j in self.joins.values()})
        return f"{len(self.joins)} of {self.world_size} ranks joined from {len(hosts)} host(s): {', '.join(hosts)}"

    def _await(self, what: str, into: dict, key_of) -> None:
        while True:
            for rank in range(self.world_size):
                if rank not in into:
                    value = read_json(self.store, key_of(rank))
                    if value is not None:
                        into[rank] = value
            if len(into) == self.world_size:
                return
            self._watch(stage=what)
            time.sleep(POLL_S)

    # -- failure detection ---------------------------------------------------------------
    def _watch(self, stage: str) -> None:
        self._read_states()
        self.progress(self._progress_info(stage))
        # A launcher that stops the job SIGTERMs every rank: ranks going silent, and the others' errors
        # waiting for them, are its doing, not a crash. An error of a rank's own still names the cause better.
        if self.terminated() and all(_KNOCK_ON.search(e.get("error", "")) for e in self.errors.values()):
            time.sleep(SETTLE_S)  # let this rank's own join and the others' last words arrive
            self._read_states()
            self.joins.update(
                {
                    r: j
                    for r in range(self.world_size)
                    if r not in self.joins and (j := read_json(self.store, self.keys.join(r))) is not None
                }
            )
            raise _Stop(self._terminated_finding())
        if self._failures():
            before = {r: beat for r, (beat, _) in self._beats.items()}
            time.sleep(SETTLE_S)  # let the others' errors arrive: the first to fail is the cause
            self._read_states()
            if not self._failures():  # a rank that exited 0 had written its result since the last read
                return
            silent = [
                r for r in before if r not in self.errors and r not in self.results and self._beats[r][0] == before[r]
            ]  # ranks still starting have no heartbeat yet
            raise _Stop(self._failure_finding(silent))
        if time.monotonic() >= self.deadline:
            raise _Stop(self._missing_finding() if stage == "join" else self._hang_finding())

    def _read_states(self) -> None:
        now = time.monotonic()
        for rank in range(self.world_size):
            state = read_json(self.store, self.keys.state(rank))
            if state is not None:
                self.states[rank] = state
                beat = state.get("beat", 0)
                if rank not in self._beats or self._beats[rank][0] != beat:
                    self._beats[rank] = (beat, now)
                order = tuple(state.get("order") or ())
                if rank not in self._moved or self._moved[rank][0] != order:
                    self._moved[rank] = (order, now)
            if rank not in self.errors:
                error = read_json(self.store, self.keys.error(rank))
                if error is not None:
                    self.errors[rank] = error

    def _dead(self) -> dict[int, str]:
        """Ranks gone without an error report: exited (spawn mode) or silent (no heartbeat). A rank writes its
        result, then exits 0: one seen gone is looked up in the store again, after its exit was seen, before it
        counts as gone without a result (the results read before it exited are older than its exit)."""
        dead = {}
        for rank, code in self.exits().items():
            if code == 0 and rank not in self.results and (result := read_json(self.store, self.keys.result(rank))):
                self.results[rank] = result
            if rank not in self.errors and (code != 0 or rank not in self.results):
                dead[rank] = _exit_text(code)
        now = time.monotonic()
        for rank, (_, since) in self._beats.items():
            if rank not in dead and rank not in self.errors and rank not in self.results and now - since > self.stale_s:
                dead[rank] = f"stopped responding (no heartbeat for {now - since:.0f} s: killed or frozen)"
        return dead

    def _failures(self) -> bool:
        return bool(self.errors) or bool(self._dead())

    def _phase_of(self, rank: int) -> str:
        if rank in self.errors:
            return self.errors[rank].get("phase", "?")
        state = self.states.get(rank)
        return state["label"] if state else ("rendezvous" if rank in self.joins else "start (before joining)")

    def _failure_finding(self, silent: list[int]):
        dead = self._dead()
        for rank in silent:  # no heartbeat while the others reported errors: it died without a word
            dead.setdefault(
                rank,
                f"went silent (no heartbeat for {SETTLE_S} s) without reporting an error: killed, "
                "out of memory or crashed in native code",
            )
        causes = {r: e for r, e in self.errors.items() if not _KNOCK_ON.search(e.get("error", ""))}
        primary = sorted(set(causes) | set(dead)) or sorted(self.errors)
        knock_on = sorted(set(self.errors) - set(primary))
        parts, evidence = [], {}
        for rank in primary:
            what = self.errors[rank]["error"] if rank in self.errors else dead[rank]
            host = self.joins.get(rank, {}).get("host")
            parts.append(f"rank {rank}{f' on {host}' if host else ''} failed in {self._phase_of(rank)}: {what}")
            evidence[f"rank{rank}"] = self._rank_evidence(rank, what)
        message = "; ".join(parts)
        if knock_on:
            message += f"; {ranks_text(knock_on)} then failed waiting for it ({self._phase_of(knock_on[0])})"
            for rank in knock_on:
                evidence[f"rank{rank}"] = self._rank_evidence(rank, self.errors[rank]["error"])
        return make("GD-SMOKE-004", Severity.FAIL, message, failed_ranks=primary, **evidence)

    def _rank_evidence(self, rank: int, what: str) -> dict:
        ev = {"phase": self._phase_of(rank), "error": what}
        if rank in self.errors and self.errors[rank].get("traceback"):
            ev["traceback"] = self.errors[rank]["traceback"]
        tail = self.logs(rank)
        if tail:
            ev["log_tail"] = tail
        return ev

    def _missing_finding(self):
        missing = [r for r in range(self.world_size) if r not in self.joins]
        hosts = sorted({j["host"] for j in self.joins.values()})
        present = f"{ranks_text(self.joins)} joined from {', '.join(hosts)}" if self.joins else "no rank joined"
        message = (
            f"{ranks_text(missing)} never joined the rendezvous within {self.opts.train.timeout:.0f} s ({present}). "
            "A missing rank makes NCCL wait forever at the first collective. Check that every task started "
            "(the launcher's log for that rank) and that it can reach the rendezvous at MASTER_ADDR:MASTER_PORT."
        )
        evidence = {"missing_ranks": missing, "joined_ranks": sorted(self.joins)}
        for rank in missing:
            tail = self.logs(rank)
            if tail:
                evidence[f"rank{rank}_log_tail"] = tail
        return make("GD-SMOKE-001", Severity.FAIL, message, **evidence)

    def _groups(self) -> list[tuple[tuple, list[int]]]:
        groups: dict[tuple, list[int]] = {}
        for rank in range(self.world_size):
            order = tuple(self.states[rank]["order"]) if rank in self.states else (-1, 0, 0)
            groups.setdefault(order, []).append(rank)
        return sorted(groups.items())

    def _in_collective(self, rank: int) -> bool:
        stack = self.states.get(rank, {}).get("stack") or []
        return any(mark in frame for frame in stack for mark in _COLLECTIVE_FRAMES)

    def _hang_finding(self):
        moving = self._still_moving()
        if moving is not None:
            return moving
        groups = self._groups()
        behind_order, behind = groups[0]
        if len(groups) == 1:  # all in one phase: the ones not waiting inside a collective hold the rest up
            waiting = [r for r in behind if self._in_collective(r)]
            if waiting and len(waiting) < len(behind):
                groups = [(behind_order, [r for r in behind if r not in waiting]), (behind_order, waiting)]
                behind = groups[0][1]
        where = self._phase_of(behind[0])
        phases = {ranks_text(ranks): self._phase_of(ranks[0]) for _, ranks in groups}
        stacks = {
            f"rank{r}": self.states[r]["stack"] for r in range(self.world_size) if self.states.get(r, {}).get("stack")
        }
        if len(groups) == 1 and all(self._in_collective(r) for r in behind):
            message = (
                f"no progress within --timeout {self.opts.train.timeout:.0f} s: all ranks are stuck in {where}. "
                "Every rank waits inside the same collective: suspect the network between ranks (NCCL_SOCKET_IFNAME, "
                "InfiniBand, firewall) or a GPU that stopped responding; rerun with NCCL_DEBUG=INFO."
            )
        elif len(groups) == 1:  # e.g. a single rank, or every rank hung in its own work
            at = (self.states.get(behind[0], {}).get("stack") or ["?"])[0]
            message = (
                f"no progress within --timeout {self.opts.train.timeout:.0f} s: {ranks_text(behind)} stuck in {where} "
                f"at {at}, outside any collective: work too slow for the timeout (a large --seq-len or --batch-size: "
                "lower them or raise --timeout), a stuck input pipeline, a deadlock, or a GPU that stopped responding."
            )
        else:
            ahead = ", ".join(f"{r} in {p}" for r, p in phases.items() if r != ranks_text(behind))
            at = (self.states.get(behind[0], {}).get("stack") or ["?"])[0]
            message = (
                f"no progress within --timeout {self.opts.train.timeout:.0f} s: {ranks_text(behind)} stuck in {where} "
                f"at {at}, while the others wait for it in a collective ({ahead}). A rank that stops short of "
                "a collective is hung: a stuck input pipeline, a deadlock, a GPU that stopped responding."
            )
        return make(
            "GD-SMOKE-005",
            Severity.FAIL,
            message,
            stuck_ranks=behind,
            phase=where,
            phases=phases,
            timeout_s=self.opts.train.timeout,
            stacks=stacks,
        )

    def _still_moving(self):
        """At the deadline: every rank still advanced through its phases and steps lately (within a tenth of the
        timeout, at least 2 s), so the run was too long for its --timeout, not hung. None: some rank stood still."""
        now, window = time.monotonic(), max(2.0, 0.1 * self.opts.train.timeout)
        pending = [r for r in range(self.world_size) if r not in self.results]
        if not pending or any(r not in self._moved or now - self._moved[r][1] > window for r in pending):
            return None
        where = {ranks_text([r]): self._phase_of(r) for r in pending}
        return make(
            "GD-SMOKE-005",
            Severity.FAIL,
            f"the run did not finish within --timeout {self.opts.train.timeout:.0f} s, but it was not hung: every rank "
            f"was still advancing ({', '.join(f'{r} at {p}' for r, p in where.items())}; each moved on within the "
            f"last {window:.0f} s). Raise --timeout, or ask for less (--steps, --soak).",
            still_advancing=pending,
            phases=where,
            timeout_s=self.opts.train.timeout,
        )

    def _terminated_finding(self):
        groups = self._groups()
        missing = [r for r in range(1, self.world_size) if r not in self.joins]  # rank 0 is here, reporting
        now = time.monotonic()
        quiet = {r: now - since for r, (_, since) in self._beats.items() if now - since > SETTLE_S}
        suspects = missing or sorted(quiet, key=lambda rank: quiet[rank], reverse=True)[:1]
        message = (
            f"the launcher stopped the run (SIGTERM to rank 0 in {self._phase_of(0)}); launchers do this when "
            "another rank exits. "
            + (f"{ranks_text(missing)} never joined: most likely exited at start. " if missing else "")
            + (
                f"Rank {suspects[0]} went silent {quiet[suspects[0]]:.0f} s ago in {self._phase_of(suspects[0])}: "
                "most likely the rank that exited. "
                if suspects and not missing
                else ""
            )
            + "Last heard from: "
            + ", ".join(f"{ranks_text(ranks)} in {self._phase_of(ranks[0])}" for _, ranks in groups)
        )
        return make(
            "GD-SMOKE-004",
            Severity.FAIL,
            message,
            failed_ranks=suspects,
            phases={ranks_text(r): self._phase_of(r[0]) for _, r in groups},
        )

    def _progress_info(self, stage: str) -> dict:
        info = {"stage": stage, "joined": len(self.joins), "world_size": self.world_size, "label": "starting training"}
        if self.states:
            slowest = min(self.states.values(), key=lambda s: s["order"])
            info["label"] = slowest["label"]
            if slowest["order"][0] == TRAINING:
                info["step"] = slowest["step"]
        if self.plan:
            info["steps"] = self.plan["model"]["steps"]
        return info


def _exit_text(code: int | None) -> str:
    if code is None:
        return "is gone"
    if code < 0:
        return f"was killed by signal {-code}"
    return f"exited with code {code} without reporting an error" if code else "exited before reporting a result"
