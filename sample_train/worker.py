"""One rank of the smoke run: report placement, train under DDP, measure, write the result.

Run as `python -m gpudoctor.sample_train.worker` by the spawning parent, or called in-process
by launch.run_in_world under torchrun/srun.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import sys
import threading
import time
import traceback
from contextlib import nullcontext
from datetime import timedelta

import torch
import torch.distributed as dist

from gpudoctor.job.compare import node_index
from gpudoctor.job.device import device_index_for, gpu_uuid_text, pci_address
from gpudoctor.job.world import World
from gpudoctor.readers import slurmfmt
from gpudoctor.sample_train import bench, faults, handdp, nccllog, optim, parts, selftest
from gpudoctor.sample_train.coordinator import HAND_BROADCAST, Keys, phase, read_json
from gpudoctor.sample_train.data import SyntheticTokens, batches, make_loader
from gpudoctor.sample_train.exits import die, finish, last_resort
from gpudoctor.sample_train.model import GPT
from gpudoctor.sample_train.options import SmokeOptions
from gpudoctor.sample_train.sizes import GPTConfig

HEARTBEAT_S = 0.5
GRACE_S = 10.0  # past the deadline, a rank ends itself if nobody has stopped it
STRAGGLER_PROBE_STEPS = 4  # the first is warm-up (kernel selection, allocations) and is dropped
SOAK_WINDOW_GPU_S, SOAK_WINDOW_CPU_S = 1.0, 0.4  # one soak sample's matmul window (its memory copy: a quarter)
# A CPU rank stands in for a GPU: one intra-op thread. Ranks (and "nodes" sharing a machine) each see every CPU;
# with several threads each they oversubscribe the cores, and OpenMP's spinning workers then make a rank's
# timings differ 30x from run to run (measured on 4 netns nodes x 2 threads on 2 cores), which no comparison
# between ranks survives. The tiny CPU model gains nothing from more threads.
CPU_RANK_THREADS = 1


class Stopped(Exception):
    """The coordinator said stop (bad placement or another rank failed): exit 1 quietly."""


class Watchdog(threading.Thread):
    """Publishes this rank's phase with a heartbeat; ends the process when the run is aborted,
    the parent is gone, the store is gone, or the deadline has long passed."""

    def __init__(
        self, store, keys: Keys, rank: int, deadline: float, parent_pid: int | None = None, exit_on_abort: bool = True
    ):
        super().__init__(name="gpudoctor-smoke-watchdog", daemon=True)
        self.store, self.keys, self.rank, self.deadline, self.parent_pid = store, keys, rank, deadline, parent_pid
        self.exit_on_abort = exit_on_abort  # not where the coordinator lives: it ends the process after its report
        self.main_ident = threading.get_ident()  # the thread that trains
        self.current = phase("rendezvous")
        self.stage_seconds: dict[str, float] = {}
        self._stage, self._stage_start = "rendezvous", time.monotonic()
        self._stop_event = threading.Event()
        self._changed = threading.Event()
        self._beat = 0

    def set_phase(self, stage: str, step: int | None = None, part: str | None = None) -> None:
        self.current = phase(stage, step, part)
        self._changed.set()  # publish at once, not at the next heartbeat: a rank may die right here
        if stage != self._stage:
            now = time.monotonic()
            self.stage_seconds[self._stage] = round(now - self._stage_start, 4)
            self._stage, self._stage_start = stage, now
        if stage == "training" and part == "forward":
            faults.maybe_inject(self.rank, f"step:{step}")

    def main_stack(self, depth: int = 6) -> list[str]:
        """Where the training thread is now, innermost first: tells a rank waiting in a collective
        from the one that never arrived."""
        frame = sys._current_frames().get(self.main_ident)
        if frame is None:
            return []
        summary = traceback.StackSummary.extract(traceback.walk_stack(frame), limit=depth, lookup_lines=False)
        out = []
        for fs in summary:
            path = fs.filename.replace(os.sep, "/")
            short = path.split("site-packages/")[-1] if "site-packages/" in path else "/".join(path.split("/")[-2:])
            out.append(f"{short}:{fs.lineno} {fs.name}")
        return out

    def stop(self) -> None:
        self._stop_event.set()
        self._changed.set()
        self.join(timeout=5)

    def run(self) -> None:
        failures, next_check = 0, 0.0
        while True:
            self._changed.wait(HEARTBEAT_S)
            self._changed.clear()
            if self._stop_event.is_set():
                return
            self._beat += 1
            try:
                state = {**self.current, "beat": self._beat, "stack": self.main_stack()}
                self.store.set(self.keys.state(self.rank), json.dumps(state))
                aborted = None
                if self.exit_on_abort and time.monotonic() >= next_check:
                    aborted = read_json(self.store, self.keys.abort)
                    next_check = time.monotonic() + HEARTBEAT_S
                failures = 0
            except Exception:
                failures += 1
                aborted = {"reason": "lost the rendezvous store"} if failures >= 6 else None
            if aborted is not None:
                die(f"rank {self.rank}: stopping ({aborted.get('reason', 'aborted')})")
            if self.parent_pid is not None and os.getppid() != self.parent_pid:
                die(f"rank {self.rank}: the gpudoctor process that started this rank is gone")
            if time.monotonic() > self.deadline + GRACE_S:
                die(f"rank {self.rank}: past the smoke run's timeout in {self.current['label']}")


# -- where this rank runs ------------------------------------------------------------------
def cpu_has_bf16() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            flags = set(fh.read().split())
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def choose_device(opts: SmokeOptions, world: World) -> tuple[torch.device | None, dict]:
    env = os.environ
    record = {
        "rank": world.rank,
        "local_rank": world.local_rank,
        "host": socket.gethostname(),
        "node_index": node_index(env),  # the launcher's node number: one host may run several nodes
        "pid": os.getpid(),
        "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
        "nccl_algo": env.get("NCCL_ALGO"),
        "torch": torch.__version__,
        "device_type": "cpu" if opts.train.device == "cpu" else "cuda",
        "device_index": None,
        "device_error": None,
    }
    if opts.train.device == "cpu":
        from gpudoctor.probe.host import cpu_model

        record.update(device="cpu", bf16_native=cpu_has_bf16(), cpu_threads=CPU_RANK_THREADS, cpu_model=cpu_model())
        return torch.device("cpu"), record
    for var in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        if env.get(var):
            try:
                allocated = [str(i) for i in slurmfmt.parse_index_list(env[var], var)]
            except slurmfmt.SlurmFormatError:
                allocated = [g for g in env[var].split(",") if g]
            record.update(slurm_gpus_var=var, slurm_gpus=allocated)
            break
    if not torch.cuda.is_available():
        visible = env.get("CUDA_VISIBLE_DEVICES")
        shown = "unset" if visible is None else repr(visible)
        record["device_error"] = f"torch sees no CUDA GPU (CUDA_VISIBLE_DEVICES {shown})"
        record["no_cuda"] = True
        return None, record
    count = torch.cuda.device_count()
    record["visible_count"] = count
    index = device_index_for(count, world.local_rank, world.launcher)
    if index is None:
        record["device_error"] = f"local rank {world.local_rank} has no GPU: only {count} are visible"
        return None, record
    try:
        # Bind first: every later CUDA call (properties, NCCL, the pin-memory thread) then lands
        # on this GPU, and no rank leaves a stray context on GPU 0.
        torch.cuda.set_device(index)
        props = torch.cuda.get_device_properties(index)
    except Exception as e:  # e.g. an exclusive-process GPU already taken by another rank
        record["device_error"] = f"cannot use cuda:{index}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        return None, record
    bus = getattr(props, "pci_bus_id", None)
    record.update(
        device=f"cuda:{index}",
        device_index=index,
        gpu_name=props.name,
        gpu_uuid=gpu_uuid_text(getattr(props, "uuid", None), env.get("CUDA_VISIBLE_DEVICES")),
        pci_bus_id=pci_address(getattr(props, "pci_domain_id", 0), bus, getattr(props, "pci_device_id", 0)),
        gpu_memory_bytes=props.total_memory,
        compute_capability=[props.major, props.minor],
        multiprocessors=getattr(props, "multi_processor_count", None),
        bf16_native=props.major >= 8,
        cuda=torch.version.cuda,
        nccl=_nccl_version(),
    )
    record.update(_memory_in_use(index, str(record["pci_bus_id"] or "")))
    return torch.device("cuda", index), record


def _memory_in_use(index: int, pci_bus_id: str) -> dict:
    """The GPU's free memory and the processes NVML sees on it, as this rank joins (sample_train/judge/fit.py sizes the
    run from them and names a process that is not the job's)."""
    out: dict = {"gpu_free_bytes": None, "gpu_processes": None}
    try:
        out["gpu_free_bytes"] = int(torch.cuda.mem_get_info(index)[0])
    except Exception:  # a GPU that cannot say: the model is sized from its total, as before
        pass
    if pci_bus_id:
        from gpudoctor.probe import nvidia

        state = nvidia.device_state(pci_bus_id)
        if not state.get("error"):
            out["gpu_processes"] = state.get("processes")
    return out


def _condition(record: dict) -> dict:
    """What sets this rank's speed, read right after its work: its GPU's state through NVML, or its CPU share."""
    if record.get("pci_bus_id"):
        from gpudoctor.probe import nvidia

        return {"gpu": nvidia.device_state(record["pci_bus_id"])}
    from gpudoctor.probe import host

    return {"cpu": host.cpu_share()}


def _brief(record: dict) -> dict:
    """What a soak sample keeps of the device's condition: clocks, temperature, power and throttle reasons, or the
    CPU quota and load."""
    condition = _condition(record)
    gpu, cpu = condition.get("gpu"), condition.get("cpu")
    if gpu and not gpu.get("error"):
        keep = ("sm_clock_mhz", "sm_clock_max_mhz", "temperature_c", "power_draw_w", "power_limit_w")
        return {
            **{k: gpu.get(k) for k in keep},
            "throttle": (gpu.get("throttle_reasons") or {}).get("active", []),
            "processes": [p.get("pid") for p in gpu.get("processes") or []],
        }
    if cpu:
        return {k: cpu.get(k) for k in ("cpu_limit", "load_1m", "affinity_cpus")}
    return {}


def _nccl_version() -> str | None:
    try:
        return ".".join(map(str, torch.cuda.nccl.version())) if dist.is_nccl_available() else None
    except Exception:  # a build whose NCCL cannot be queried: the version is evidence, not a need
        return None


def _cpu_threads(world: World) -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    return max(1, cpus // max(1, world.local_world_size))


def loader_settings(opts: SmokeOptions, device: torch.device, world: World) -> dict:
    """The user's dataloader settings where given, else defaults suited to the device."""
    chosen = opts.train.loader
    if chosen.num_workers is not None:
        workers = chosen.num_workers
    elif device.type == "cuda":
        workers = min(4, max(1, _cpu_threads(world) - 1))
    elif chosen.prefetch_factor is not None or chosen.persistent_workers:
        workers = 1  # these settings only exist with worker processes: honour them rather than drop them
    else:
        workers = 0  # a tiny CPU model: worker processes would cost more than they save
    return {
        "num_workers": workers,
        "pin_memory": chosen.pin_memory if chosen.pin_memory is not None else device.type == "cuda",
        "persistent_workers": chosen.persistent_workers if chosen.persistent_workers is not None else workers > 0,
        "prefetch_factor": chosen.prefetch_factor,
        "drop_last": chosen.drop_last if chosen.drop_last is not None else True,
        "source": chosen.source,
    }


# -- the run -------------------------------------------------------------------------------
class Rank:
    def __init__(self, world: World, opts: SmokeOptions, store, keys: Keys, watchdog: Watchdog, deadline: float):
        self.world, self.opts, self.store, self.keys, self.wd, self.deadline = (
            world,
            opts,
            store,
            keys,
            watchdog,
            deadline,
        )
        self.nccl_log: str | None = None  # NCCL's debug log while it is being written (sample_train/nccllog.py)

    def remaining(self, extra: float = 0.0) -> timedelta:
        return timedelta(seconds=max(1.0, self.deadline - time.monotonic() + extra))

    def join(self, record: dict, no_coordinator: type[Exception]) -> dict:
        self.store.set(self.keys.join(self.world.rank), json.dumps(record))
        try:
            self.store.wait([self.keys.plan], self.remaining(GRACE_S / 2))
        except dist.DistStoreError:
            raise no_coordinator() from None
        plan = json.loads(self.store.get(self.keys.plan))
        if not plan.get("go"):
            raise Stopped("the coordinator stopped the run before training (see its report)")
        return plan

    def train(self, device: torch.device, plan: dict) -> dict:
        world, wd = self.world, self.wd
        cfg = GPTConfig.from_dict(plan["model"])
        cuda = device.type == "cuda"
        if cuda:
            torch.cuda.set_device(device)
            torch.cuda.reset_peak_memory_stats(device)
        else:
            torch.set_num_threads(CPU_RANK_THREADS)
        backend = "nccl" if cuda else "gloo"
        self.nccl_log, why_unread = nccllog.capture(world.rank) if cuda else (None, None)
        wd.set_phase("init process group")
        store = dist.PrefixStore(self.keys.pg_prefix, self.store)
        # Collectives time out after the coordinator's deadline, so the coordinator names the phase first.
        dist.init_process_group(
            backend, store=store, rank=world.rank, world_size=world.world_size, timeout=self.remaining(GRACE_S)
        )
        result = {"rank": world.rank, "backend": backend}

        wd.set_phase("first all-reduce")
        faults.maybe_inject(world.rank, "first-allreduce")
        result["first_allreduce_s"] = bench.first_allreduce(device, world.world_size)

        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[plan["precision"]]
        result.update(self._device_benchmarks(device, dtype, cfg))
        wd.set_phase("all-reduce benchmark")
        result["allreduce"] = self._allreduce_bench(device) if world.world_size > 1 else None
        if len(plan.get("nodes") or []) > 1:
            wd.set_phase("all-reduce inside and across nodes")
            result.update(self._node_allreduce_bench(device, plan["nodes"]))
            wd.set_phase("node pairs")
            result["node_pairs"] = self._exchanges(device, plan["nodes"], plan["node_rounds"], across=True)
        if plan.get("local_rounds"):
            wd.set_phase("GPU pairs inside nodes")
            result["local_pairs"] = self._exchanges(device, plan["nodes"], plan["local_rounds"], across=False)

        if cuda:
            result["nccl_transport"] = nccllog.read(self.nccl_log)
            self.nccl_log = None  # read: its warnings are in the rank's log already
            result["nccl_transport_unread"] = why_unread
            # the benchmarks' buffers are not the training's peak
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        model, ddp, optimizer, optimizer_name = self._build(cfg, device, plan["precision"])
        result["optimizer"] = optimizer_name
        scaler = torch.amp.GradScaler(device.type) if plan["precision"] == "fp16" else None
        autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype != torch.float32 else nullcontext
        settings = loader_settings(self.opts, device, world)
        result["dataloader"] = settings
        stream = self._batches(cfg, settings)
        step_fn = torch.compile(ddp) if self.opts.train.compile else ddp

        if world.world_size > 1:  # one rank: no other rank's wait to tell its own compute from
            wd.set_phase("straggler probe")
            result["local_compute_s"] = self._straggler_probe(step_fn, ddp, stream, device, autocast, scaler)
            optimizer.zero_grad(set_to_none=True)
        else:
            result["local_compute_s"] = []

        result.update(self._loop(cfg, step_fn, optimizer, stream, device, autocast, scaler))
        wd.set_phase("parameter checksum")
        result["param_checksum"] = param_checksum(model)
        result["peak_memory"] = peak_memory(device)
        result["tokens_per_step"] = cfg.batch_size * cfg.seq_len
        result["samples_per_step"] = cfg.batch_size
        return result

    def _device_benchmarks(self, device: torch.device, dtype: torch.dtype, cfg: GPTConfig) -> dict:
        """The measured matmul peak, the parts and the correctness tests: timed on the device where it is a GPU."""
        quick = self.opts.measure.quick
        self.wd.set_phase("matmul benchmark")
        seconds, warm_s = (1.0, 0.3) if device.type == "cuda" else (0.15, 0.05)
        peak = bench.max_matmul(device, dtype, seconds / 2 if quick else seconds, warm_s / 2 if quick else warm_s)
        matmul = {"n": peak["shapes"][0][0], "dtype": str(dtype).replace("torch.", ""), **peak}
        self.wd.set_phase("part benchmarks")
        found = parts.measure(device, dtype, cfg, quick=quick)
        self.wd.set_phase("correctness")
        return {"matmul": matmul, "parts": found, "correctness": selftest.run(device, self.world.rank)}

    def soak(self, device: torch.device, plan: dict, record: dict) -> list[dict]:
        """Sustained speed: the square matmul and the device memory copy measured again and again for --soak
        seconds (each sample the mean over its window: a throttling GPU is slow on average, not in its best
        moment), with the device's condition read after each."""
        cuda = device.type == "cuda"
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[plan["precision"]]
        n, window = (8192, SOAK_WINDOW_GPU_S) if cuda else (256, SOAK_WINDOW_CPU_S)
        size = 512 * 2**20 if cuda else 64 * 2**20
        src = torch.ones(size, dtype=torch.uint8, device=device)
        dst = torch.zeros_like(src)
        faults.maybe_inject(self.world.rank, "soak")
        samples: list[dict] = []
        start = time.monotonic()
        end = min(start + (self.opts.measure.soak or 0.0), self.deadline - GRACE_S)
        while time.monotonic() < end:
            self.wd.set_phase("soak", step=len(samples))
            t = time.monotonic() - start
            matmul = bench.gemm_tflops(device, dtype, n, n, n, window, 1)
            copy = bench.copy_gbps(src, dst, device, window / 4, 1)
            samples.append({"t": round(t, 2), "matmul_tflops": matmul, "memory_copy_gbps": copy, **_brief(record)})
        del src, dst
        return samples

    def _allreduce_bench(self, device: torch.device, group=None) -> dict:
        cuda = device.type == "cuda"
        payload, dtype = (256 * 2**20, torch.bfloat16) if cuda else (4 * 2**20, torch.float32)
        iters, warmup = (20, 5) if cuda else (5, 2)
        if self.opts.measure.quick:
            iters, warmup = max(3, iters // 3), 2
        seconds = bench.allreduce_seconds(device, payload, dtype, iters, warmup, group)
        return {
            "payload_bytes": payload,
            "dtype": str(dtype).replace("torch.", ""),
            "iterations": iters,
            "seconds": seconds,
        }

    def _exchanges(self, device: torch.device, nodes: list[list[int]], rounds: list, across: bool) -> list[dict]:
        """Rounds of disjoint pairs sending and receiving at once. across: node pairs (the i-th rank of one node
        with the i-th of the other); else the ranks of each node in pairs (every node at once)."""
        rank = self.world.rank
        payload, iters = (64 * 2**20, 5) if device.type == "cuda" else (2**20, 5)
        mine = next(i for i, ranks in enumerate(nodes) if rank in ranks)
        position = nodes[mine].index(rank)
        out = []
        for number, pairs in enumerate(rounds):
            peer = None
            for a, b in pairs:
                if across and mine in (a, b):
                    other = nodes[b if mine == a else a]
                    peer = other[position] if position < len(other) else None
                elif not across and position in (a, b) and max(a, b) < len(nodes[mine]):
                    peer = nodes[mine][b if position == a else a]
            gbps = bench.exchange_gbps(device, peer, payload, iters)
            if peer is not None:
                out.append({"round": number, "peer": peer, "gbps": gbps, "payload_bytes": payload, "iterations": iters})
        return out

    def _node_allreduce_bench(self, device: torch.device, nodes: list[list[int]]) -> dict:
        """The same all-reduce inside each node (all nodes at once) and across nodes (one group per local
        position: the i-th rank of every node), as nccl-tests measures a node and the fabric apart."""
        rank = self.world.rank
        out: dict[str, dict | None] = {}
        # every rank creates every group, in one order (torch.distributed.new_group's rule)
        intra = [(ranks, dist.new_group(ranks)) for ranks in nodes]
        width = min(len(r) for r in nodes)
        inter = [([r[i] for r in nodes], dist.new_group([r[i] for r in nodes])) for i in range(width)]
        for name, groups in (("allreduce_intra_node", intra), ("allreduce_inter_node", inter)):
            mine = next(((ranks, g) for ranks, g in groups if rank in ranks), None)
            if mine is None or len(mine[0]) < 2:
                out[name] = None
                continue
            bench_result = self._allreduce_bench(device, mine[1])
            out[name] = {**bench_result, "group": mine[0]}
        return out

    def _build(self, cfg: GPTConfig, device: torch.device, precision: str):
        torch.manual_seed(self.opts.train.seed)  # identical init everywhere; DDP broadcasts rank 0's anyway
        self.wd.set_phase("model build")
        with device:  # built where it trains: initialising a large model on the CPU would take seconds
            model = GPT(cfg)
        if handdp.usable(self.opts, precision):
            self.wd.set_phase(HAND_BROADCAST)
            replicated = handdp.Replicated(model, self.world.world_size)
            self.wd.set_phase("optimizer")
            return model, replicated, handdp.AdamW(model.parameters(), cfg.lr, self.world.world_size), handdp.NAME
        device_ids = [device.index] if device.type == "cuda" else None
        self.wd.set_phase("model broadcast (DDP)")
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids, gradient_as_bucket_view=True)
        self.wd.set_phase("optimizer")
        optimizer, name = optim.build(model.parameters(), cfg.lr)
        return model, ddp, optimizer, name

    def _batches(self, cfg: GPTConfig, settings: dict):
        total = cfg.steps + STRAGGLER_PROBE_STEPS
        dataset = SyntheticTokens(
            cfg.vocab, cfg.seq_len, total * cfg.batch_size * self.world.world_size, self.opts.train.seed
        )
        loader = make_loader(
            dataset,
            rank=self.world.rank,
            world_size=self.world.world_size,
            seed=self.opts.train.seed,
            batch_size=cfg.batch_size,
            settings=settings,
        )
        return batches(loader)

    def _straggler_probe(self, step_fn, ddp, stream, device, autocast, scaler) -> list[float]:
        """fwd+bwd without the gradient all-reduce (no_sync): this rank's own speed, unblurred by the others."""
        times = []
        with ddp.no_sync():
            for _ in range(STRAGGLER_PROBE_STEPS):
                x, y = (t.to(device, non_blocking=True) for t in next(stream))
                bench.synchronize(device)
                start = time.perf_counter()
                with autocast():
                    loss = step_fn(x, y)
                (scaler.scale(loss) if scaler else loss).backward()
                bench.synchronize(device)
                times.append(time.perf_counter() - start)
        return times[1:]

    def _loop(self, cfg, step_fn, optimizer, stream, device, autocast, scaler) -> dict:
        wd = self.wd
        losses, step_times, data_waits = [], [], []
        lr_warmup = max(1, cfg.steps // 4)  # a short linear ramp: full lr from step 1 can blow up a large model
        for step in range(1, cfg.steps + 1):
            for group in optimizer.param_groups:
                group["lr"] = cfg.lr * min(1.0, step / lr_warmup)
            start = time.perf_counter()
            wd.set_phase("training", step, "data")
            x, y = (t.to(device, non_blocking=True) for t in next(stream))
            data_waits.append(time.perf_counter() - start)
            wd.set_phase("training", step, "forward")
            with autocast():
                loss = step_fn(x, y)
            wd.set_phase("training", step, "backward + gradient all-reduce")
            if scaler:
                scaler.scale(loss).backward()
                wd.set_phase("training", step, "optimizer")
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                reduce = getattr(optimizer, "reduce_gradients", None)
                if reduce is not None:  # --quick's hand-written training (handdp.py): its all-reduce, in this phase
                    reduce()
                wd.set_phase("training", step, "optimizer")
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())  # waits for the GPU: the step is really over
            step_times.append(time.perf_counter() - start)
        return {"losses": losses, "step_times": step_times, "data_waits": data_waits, "warmup": cfg.warmup}


def param_checksum(model: torch.nn.Module) -> str:
    """An exact fingerprint of every parameter's bits (selftest.fingerprint), computed where they live."""
    return selftest.fingerprint(sorted(model.named_parameters()))


def peak_memory(device: torch.device) -> dict:
    if device.type == "cuda":
        # allocated: what tensors used at the peak; reserved: what the caching allocator held then,
        # which is what runs out first. Neither counts the CUDA context or NCCL's own buffers.
        return {
            "bytes": torch.cuda.max_memory_allocated(device),
            "kind": "torch.cuda.max_memory_allocated",
            "reserved_bytes": torch.cuda.max_memory_reserved(device),
            "device_total_bytes": torch.cuda.get_device_properties(device).total_memory,
        }
    return {"bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "kind": "process peak RSS (CPU run)"}


def run_rank(
    world: World,
    opts: SmokeOptions,
    store,
    keys: Keys,
    deadline: float,
    parent_pid: int | None = None,
    no_coordinator: type[Exception] = Stopped,
    coordinating: bool = False,
) -> int:
    """This rank's whole part; returns its exit code. Raises no_coordinator when no plan ever came.
    coordinating: the coordinator runs in this process (rank 0 under torchrun/srun)."""
    watchdog = Watchdog(store.clone(), keys, world.rank, deadline, parent_pid, exit_on_abort=not coordinating)
    watchdog.start()
    rank = Rank(world, opts, store, keys, watchdog, deadline)
    try:
        device, record = choose_device(opts, world)
        plan = rank.join(record, no_coordinator)
        if device is None:  # the coordinator stops a run with a rank that has no device; never trains without one
            raise Stopped(record.get("device_error") or "this rank has no device")
        result = rank.train(device, plan)
        result["condition"] = _condition(record)
        if opts.measure.soak:
            watchdog.set_phase("soak", step=0)
            result["soak"] = rank.soak(device, plan, record)
        watchdog.set_phase("finished")
        result.update(host=record["host"], local_rank=world.local_rank, stage_seconds=watchdog.stage_seconds)
        watchdog.stop()  # our last store write is the result: nothing may touch the store after
        store.set(keys.result(world.rank), json.dumps(result))
        return 0
    except Stopped:
        return 1
    except no_coordinator:
        watchdog.stop()
        raise
    except BaseException as e:  # report it, then wait for the coordinator to stop the run
        nccllog.echo_warnings(rank.nccl_log)
        report_error(store, keys, world.rank, watchdog.current["label"], e)
        _await_abort(store, keys)
        return 1
    finally:
        _destroy_process_group()


DESTROY_S = 10.0


def _destroy_process_group() -> None:
    """Tear the process group down, as PyTorch asks, but never wait on it for long: NCCL's
    teardown flushes outstanding work and can block on a peer that is gone. The process
    ends right after (os._exit), so a teardown still running then does no harm."""
    if not dist.is_initialized():
        return
    # The current CUDA device is per thread: carry this rank's over to the thread that tears down.
    cuda_index = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None

    def destroy() -> None:
        try:
            if cuda_index is not None:
                torch.cuda.set_device(cuda_index)
            dist.destroy_process_group()
        except Exception:
            pass

    worker = threading.Thread(target=destroy, name="gpudoctor-smoke-destroy-pg", daemon=True)
    worker.start()
    worker.join(DESTROY_S)


def report_error(store, keys: Keys, rank: int, where: str, error: BaseException) -> None:
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    if isinstance(error, torch.cuda.OutOfMemoryError):
        text += " (out of GPU memory: lower --batch-size or --seq-len, or pass --size small)"
    tb = traceback.format_exception(error)
    record = {
        "phase": where,
        "error": text.splitlines()[0][:500] if text else type(error).__name__,
        "traceback": "".join(tb)[-2000:],
    }
    try:
        store.set(keys.error(rank), json.dumps(record))
    except Exception:
        print(f"gpudoctor smoke: rank {rank} failed in {where}: {text}", file=sys.stderr)


def _await_abort(store, keys: Keys, seconds: float = 20.0) -> None:
    """Stay alive until the coordinator has seen our error: a launcher kills the job when a rank exits."""
    try:
        store.wait([keys.abort], timedelta(seconds=seconds))
    except Exception:
        pass


def await_store(addr: str, port: int, deadline: float, parent_pid: int | None = None) -> None:
    """Waits until the rendezvous store accepts connections, until the run's deadline. TCPStore's own
    connect retries for about twice its timeout, and a spawned rank must not outlive its spawner meanwhile."""
    while True:
        if parent_pid is not None and os.getppid() != parent_pid:
            die("the gpudoctor process that started this rank is gone")
        try:
            socket.create_connection((addr, port), timeout=1.0).close()
            return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"nothing accepted connections at {addr}:{port}") from e
            time.sleep(0.2)


def main() -> int:
    """Entry point of a rank spawned by `gpudoctor smoke` (its world and options come in env vars)."""
    world = World(**json.loads(os.environ["GPUDOCTOR_SMOKE_WORLD"]))
    opts = SmokeOptions.from_json(os.environ["GPUDOCTOR_SMOKE_OPTIONS"])
    deadline = time.monotonic() + opts.train.timeout
    last_resort(opts.train.timeout + 2 * GRACE_S, f"rank {world.rank}: no outcome within the timeout; giving up")
    faults.maybe_inject(world.rank, "start")
    parent_pid = int(os.environ["GPUDOCTOR_SMOKE_PARENT"])
    await_store(world.master_addr, world.master_port, deadline, parent_pid)
    store = dist.TCPStore(
        world.master_addr, world.master_port, None, False, timeout=timedelta(seconds=opts.train.timeout)
    )
    keys = Keys(world.namespace)
    return run_rank(world, opts, store, keys, deadline, parent_pid=parent_pid)


if __name__ == "__main__":
    finish(main())
