"""Starting the ranks: spawn N local ranks (`--gpus N`), or join the world torchrun/srun made.

Spawn mode: this process hosts the rendezvous store and coordinates; it takes no part in
training, so it outlives any hang and kills every rank's process group when it is done.
Launcher mode: each process is one rank; rank 0 also runs the coordinator in a thread.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from datetime import timedelta

from gpudoctor.facts import redact_value  # MASTER_ADDR=user:password@host: reports show the host only
from gpudoctor.job.world import World, new_namespace, spawned
from gpudoctor.model import ExitCode, Severity
from gpudoctor.sample_train import exits, faults
from gpudoctor.sample_train.coordinator import Coordinator, Keys, Verdict, read_json
from gpudoctor.sample_train.judge import baseline, report
from gpudoctor.sample_train.judge.findings import build_text, make, ranks_text, visible_text
from gpudoctor.sample_train.options import SmokeOptions
from gpudoctor.sample_train.progress import Progress
from gpudoctor.sample_train.ranks import KILL_GRACE_S, Ranks, fork_is_safe, fork_ranks, gpu_count_without_cuda
from gpudoctor.sanitize import clean

# Host memory one spawned rank needs: a CPU rank of the tiny model peaked at 340 MiB RSS (torch, gloo, the
# model, a batch; measured with psutil on torch 2.13 CPU), GPU ranks hold the CUDA context's host side too.
RANK_MEMORY_BYTES = 512 * 2**20
# On CPU every rank computes: past two ranks per usable CPU they mostly wait for each other's time slices,
# and the run measures the scheduler, not the set-up (and may not finish before its deadline).
RANKS_PER_CPU = 2
LAST_RESORT_S = 30.0  # past --timeout: the coordinator and watchdogs act long before this


def default_timeout(device: str, compile_model: bool, soak_s: float | None = None) -> float:
    """Whole-run bound: torch import, NCCL set-up and a short run, with room for slow file systems; and the soak."""
    return (120.0 if device == "cpu" else 180.0) + (300.0 if compile_model else 0.0) + (soak_s or 0.0)


def emit(rep: dict, opts: SmokeOptions, file=None) -> int:
    if rep.get("refused"):  # a baseline of another kind of run: nothing is judged, one line, exit 2
        print(clean(f"gpudoctor smoke: {rep['refused']}"), file=sys.stderr)
        return ExitCode.USAGE
    saved = _save_baseline(rep, opts.measure.save_baseline) if opts.measure.save_baseline else True
    if opts.output.prometheus:
        saved = _write_prometheus(rep, opts.output.prometheus) and saved
    if not saved:
        rep.update(ok=False, exit_code=ExitCode.FAIL)
    if opts.output.json:
        report.print_json(rep, file)
    else:
        report.render_text(rep, file)
    return rep["exit_code"]


def _save_baseline(rep: dict, path: str) -> bool:
    """Writes the run's figures as a baseline, only from a run that passed; says so on stderr either way.
    False: it could not be written (the run then fails: the user asked for a file that is not there)."""
    if not rep["ok"] or not rep.get("expectations"):
        print(clean(f"gpudoctor smoke: --save-baseline {path}: not saved, the run did not pass"), file=sys.stderr)
        return True
    if not _write(path, json.dumps(baseline.from_report(rep), indent=2) + "\n", "--save-baseline"):
        return False
    print(clean(f"gpudoctor smoke: baseline saved to {path}"), file=sys.stderr)
    return True


def _write_prometheus(rep: dict, path: str) -> bool:
    from gpudoctor.report import prometheus

    return _write(path, prometheus.render_smoke(rep, time.time()), "--prometheus")


def _write(path: str, text: str, what: str) -> bool:
    """fileio.write_output (atomic); a file that cannot be written is one line on stderr and False."""
    from gpudoctor.fileio import FileIOError, write_output

    try:
        write_output(path, text, what)
    except FileIOError as e:
        print(clean(f"gpudoctor smoke: {e}"), file=sys.stderr)
        return False
    return True


def refuse_baseline(opts: SmokeOptions, world_size: int, device: str) -> int | None:
    """Exit 2 before any rank starts when --baseline is from another world size or device type."""
    if opts.measure.baseline is None:
        return None
    why = baseline.early_mismatch(opts.measure.baseline, world_size, device)
    if why is None:
        return None
    print(clean(f"gpudoctor smoke: --baseline {opts.measure.baseline_path}: {why}"), file=sys.stderr)
    return ExitCode.USAGE


# -- spawn mode ----------------------------------------------------------------------------
class TooManyRanks(ValueError):
    """--gpus asks for more ranks than this machine can run: one line, exit 2."""


def check_rank_budget(nprocs: int, device: str) -> None:
    """Refuses, before any rank starts, a rank count the CPUs or the memory cannot carry."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if device == "cpu" and nprocs > max(2, RANKS_PER_CPU * cpus):
        raise TooManyRanks(
            f"--gpus {nprocs} with --device cpu: this process may use {cpus} CPU(s), enough for at most "
            f"{max(2, RANKS_PER_CPU * cpus)} ranks ({RANKS_PER_CPU} per CPU)"
        )
    try:
        import psutil

        available = psutil.virtual_memory().available
    except Exception:  # no psutil or no /proc/meminfo: the CPU bound above still holds
        return
    if nprocs > 1 and nprocs * RANK_MEMORY_BYTES > available:
        raise TooManyRanks(
            f"--gpus {nprocs}: {nprocs} ranks need about {nprocs * RANK_MEMORY_BYTES / 2**30:.1f} GiB of "
            f"memory ({RANK_MEMORY_BYTES // 2**20} MiB each); {available / 2**30:.1f} GiB is available, "
            f"enough for {available // RANK_MEMORY_BYTES}"
        )


def run_spawn(opts: SmokeOptions) -> int:
    if opts.train.nprocs is not None:  # before torch loads: a refused count costs nothing
        check_rank_budget(opts.train.nprocs, opts.train.device)
    cache = _private_inductor_cache()
    try:
        return _run_spawn(opts)
    finally:
        if cache is not None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            shutil.rmtree(cache, ignore_errors=True)


def _private_inductor_cache() -> str | None:
    """torch's inductor cache defaults to $TMPDIR/torchinductor_<user>, which every run would leave behind:
    the run gets its own, removed at its end. A cache dir the user chose is kept as it is."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return None
    path = tempfile.mkdtemp(prefix="gpudoctor-smoke-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path  # the ranks inherit it
    return path


def _run_spawn(opts: SmokeOptions) -> int:
    started = time.monotonic()
    _interrupt_on_sigterm()
    import torch
    import torch.distributed as dist

    from gpudoctor.sample_train import handdp

    # Counted through NVML where it can be: CUDA initialised here would forbid forking the ranks (ranks.py).
    counted = gpu_count_without_cuda(torch) if opts.train.device != "cpu" else None
    if opts.train.device != "cpu" and not (counted if counted is not None else torch.cuda.is_available()):
        return _early_failure(
            opts,
            make(
                "GD-SMOKE-012",
                Severity.FAIL,
                f"torch {torch.__version__} sees no CUDA GPU "
                f"({visible_text(os.environ.get('CUDA_VISIBLE_DEVICES'))}, {build_text(torch.version.cuda)})",
                torch=torch.__version__,
                torch_cuda=torch.version.cuda,
                next="run `gpudoctor check` for the cause, or pass --device cpu to test the CPU/gloo path",
            ),
            started,
        )
    opts.train.device = "cpu" if opts.train.device == "cpu" else "cuda"
    if opts.train.device == "cuda":
        visible = counted if counted is not None else torch.cuda.device_count()
    else:
        visible = None
    nprocs = opts.train.nprocs or visible or 2
    if visible is not None and nprocs > visible:
        return _early_failure(
            opts,
            make(
                "GD-SMOKE-003",
                Severity.FAIL,
                f"--gpus {nprocs} asks for more ranks than the {visible} GPU(s) torch sees: "
                f"ranks {visible}..{nprocs - 1} would have no GPU of their own",
                visible=visible,
                cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
            ),
            started,
        )
    refused = refuse_baseline(opts, nprocs, opts.train.device)
    if refused is not None:
        return refused
    opts.train.timeout = opts.train.timeout or default_timeout(opts.train.device, opts.train.compile, opts.measure.soak)
    deadline = started + opts.train.timeout
    # --quick trains without DDP and torch.optim, where it can (handdp.usable: fp16 is decided by the ranks later)
    dynamo = not handdp.usable(opts, opts.train.precision)
    ranks = Ranks(nprocs, fork_ranks(nprocs, dynamo) if fork_is_safe(torch) else None)  # before the store's threads
    try:
        store = dist.TCPStore(
            "127.0.0.1", 0, None, True, timeout=timedelta(seconds=opts.train.timeout), wait_for_workers=False
        )
    except BaseException:
        ranks.abandon()
        raise
    namespace = new_namespace()
    with tempfile.TemporaryDirectory(prefix="gpudoctor-smoke-") as logdir:
        progress = Progress(quiet=opts.output.json)
        interrupted = True
        try:
            ranks.start([_rank_env(rank, nprocs, store.port, namespace, opts) for rank in range(nprocs)], logdir)
            ranks_started_s = time.monotonic() - started
            coordinator = Coordinator(
                store, Keys(namespace), nprocs, deadline, opts, exits=ranks.exits, logs=ranks.tail, progress=progress
            )
            verdict = coordinator.run()
            interrupted = False
        finally:
            progress.close()
            ranks.stop(grace=0 if interrupted else KILL_GRACE_S)  # interrupted ranks do not end by themselves
        launch = {
            "mode": "spawn",
            "world_size": nprocs,
            "local_world_size": nprocs,
            "nodes": 1,
            "backend": "nccl" if opts.train.device == "cuda" else "gloo",
            "master_addr": "127.0.0.1",
            "master_port": store.port,
            "reporter": {"role": "spawner", "pid": os.getpid()},
            "ranks_forked": ranks.forked is not None,
            "ranks_started_s": round(ranks_started_s, 3),
        }
        return emit(report.build(verdict, opts, launch, time.monotonic() - started), opts)


def _rank_env(rank: int, n: int, port: int, namespace: str, opts: SmokeOptions) -> dict:
    """A spawned rank's environment: this one, its world for the worker, and torchrun's variables."""
    world = spawned(rank, n, port, namespace)
    return {
        **os.environ,
        "GPUDOCTOR_SMOKE_WORLD": json.dumps(world.to_dict()),
        "GPUDOCTOR_SMOKE_OPTIONS": opts.to_json(),
        "GPUDOCTOR_SMOKE_PARENT": str(os.getpid()),
        "RANK": str(rank),
        "WORLD_SIZE": str(n),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(n),
        "MASTER_ADDR": world.master_addr,
        "MASTER_PORT": str(port),
    }


def _interrupt_on_sigterm() -> None:
    """SIGTERM (kill, a scheduler) ends the run as Ctrl-C does: the ranks are stopped, one line is printed."""

    def interrupt(signum, frame):
        from gpudoctor.report.usage import Terminated

        raise Terminated  # a KeyboardInterrupt: the same unwinding, exit 143 (gpudoctor.cli)

    signal.signal(signal.SIGTERM, interrupt)


def _early_failure(opts: SmokeOptions, finding, started: float) -> int:
    launch = {
        "mode": "spawn",
        "world_size": 0,
        "local_world_size": 0,
        "nodes": 0,
        "backend": None,
        "reporter": {"role": "spawner", "pid": os.getpid()},
    }
    return emit(report.build(Verdict(False, [finding]), opts, launch, time.monotonic() - started), opts)


# -- launcher mode -------------------------------------------------------------------------
class NoCoordinator(Exception):
    pass


def run_in_world(world: World, opts: SmokeOptions) -> int:
    """This process is one rank of a torchrun/srun world. Ends the process (os._exit)."""
    started = time.monotonic()
    refused = refuse_baseline(opts, world.world_size, "cpu" if opts.train.device == "cpu" else "cuda")
    if refused is not None:
        return refused
    opts.train.timeout = opts.train.timeout or default_timeout(
        "cpu" if opts.train.device == "cpu" else "cuda", opts.train.compile, opts.measure.soak
    )
    deadline = started + opts.train.timeout
    exits.last_resort(
        opts.train.timeout + LAST_RESORT_S,
        f"rank {world.rank}: no outcome {opts.train.timeout + LAST_RESORT_S:.0f} s "
        f"after start (rendezvous store {redact_value(world.master_addr)}:{world.master_port}); giving up",
    )
    # Rank 0 reports even when the launcher stops the job (a rank exited) before it is up.
    terminated = _watch_sigterm() if world.rank == 0 else None
    faults.maybe_inject(world.rank, "start")
    cache = _private_inductor_cache()
    if cache is not None:
        exits.remove_on_finish(cache)
    from gpudoctor.sample_train import worker  # torch from here on

    store = _connect(world, opts, started)
    keys = Keys(world.namespace)
    launch = _launch_info(world, opts)
    coordinator = (
        _start_coordinator(opts, store, keys, world.world_size, deadline, launch, started, terminated)
        if world.rank == 0
        else None
    )
    try:
        code = worker.run_rank(
            world, opts, store, keys, deadline, no_coordinator=NoCoordinator, coordinating=coordinator is not None
        )
    except NoCoordinator:
        code = _fallback_report(world, opts, store, keys, launch, started)
        exits.finish(code)  # no rank 0 to give a verdict
    if coordinator is not None:
        coordinator.join()
        code = coordinator.exit_code
        _publish_verdict(store, keys, code, world.world_size)
    elif code == 0:
        code = _await_verdict(store, keys, deadline + LAST_RESORT_S / 2)
    elif code:
        print(f"gpudoctor smoke: rank {world.rank} stopped (rank 0 reports why)", file=sys.stderr)
    exits.finish(code)
    # Not reached (finish is NoReturn); mypy sees `exits` as Any through the package-dir mapping.
    raise AssertionError("exits.finish() returned")


VERDICT_READ_S = 10.0


def _publish_verdict(store, keys: Keys, code: int, world_size: int, wait: bool = True) -> None:
    """Every rank exits with the run's verdict: under torchrun a node whose ranks exit 0 while another
    node's fail waits in the agents' exit barrier (300 s) instead of ending with the job."""
    try:
        store.set(keys.verdict, str(int(code)))
        # rank 0 may host the store: after a pass, stay until the others read it (after a failure a rank that
        # finds the store gone exits 1 anyway, and a hung one never reads)
        until = time.monotonic() + (VERDICT_READ_S if wait else 0)
        while store.add(keys.verdict_read, 0) < world_size - 1 and time.monotonic() < until:
            time.sleep(0.05)
    except Exception:
        pass


def _await_verdict(store, keys: Keys, until: float) -> int:
    try:
        store.wait([keys.verdict], timedelta(seconds=max(0.1, until - time.monotonic())))
        code = int(store.get(keys.verdict))
        store.add(keys.verdict_read, 1)
        return code
    except Exception:  # the store went away, or the deadline passed, without a verdict: rank 0 ended abnormally
        print(
            "gpudoctor smoke: rank 0 ended without a verdict; this rank exits 1 (rank 0 reports why)", file=sys.stderr
        )
        return 1


def _launch_info(world: World, opts: SmokeOptions) -> dict:
    return {
        "mode": world.launcher,
        "world_size": world.world_size,
        "local_world_size": world.local_world_size,
        "master_addr": redact_value(world.master_addr),
        "master_port": world.master_port,
        "backend": "gloo" if opts.train.device == "cpu" else "nccl",
        "reporter": {"role": "rank", "rank": world.rank, "pid": os.getpid()},
    }


def _connect(world: World, opts: SmokeOptions, started: float):
    import torch.distributed as dist

    from gpudoctor.sample_train.worker import await_store

    hosting = world.rank == 0 and not world.agent_store
    try:
        socket.getaddrinfo(world.master_addr, world.master_port)  # fail now, not after the whole timeout
        if not hosting:
            await_store(world.master_addr, world.master_port, started + opts.train.timeout)
        return dist.TCPStore(
            world.master_addr,
            world.master_port,
            None,
            hosting,
            timeout=timedelta(seconds=opts.train.timeout),
            wait_for_workers=False,
        )
    except Exception as e:  # nobody to coordinate: this rank reports for itself
        what = "host" if hosting else "reach"
        finding = make(
            "GD-SMOKE-001",
            Severity.FAIL,
            f"rank {world.rank} could not {what} the rendezvous store "
            f"at {redact_value(world.master_addr)}:{world.master_port} within {opts.train.timeout:.0f} s "
            f"({type(e).__name__}: {redact_value(str(e).splitlines()[0]) if str(e) else ''}). "
            + (
                "MASTER_ADDR does not resolve (DNS, /etc/hosts): set MASTER_ADDR to rank 0's address."
                if isinstance(e, socket.gaierror)
                else "Another process holds MASTER_PORT, or MASTER_ADDR is not an address of this host."
                if hosting
                else "Rank 0 did not start, or MASTER_ADDR/MASTER_PORT do not reach it (firewall, wrong interface)."
            ),
            rank=world.rank,
            master_addr=redact_value(world.master_addr),
            master_port=world.master_port,
        )
        rep = report.build(Verdict(False, [finding]), opts, _launch_info(world, opts), time.monotonic() - started)
        # Without a store no rank can coordinate: each reports for itself; rank 0 on stdout, so that
        # stdout holds at most one report, the others on stderr.
        exits.finish(emit(rep, opts, None if world.rank == 0 else sys.stderr))


class _CoordinatorThread(threading.Thread):
    """Rank 0's coordinator. It prints the report; on failure it ends the process at once,
    since the main thread may be stuck in a collective that will never return."""

    def __init__(self, coordinator: Coordinator, opts: SmokeOptions, launch: dict, started: float, progress: Progress):
        super().__init__(name="gpudoctor-smoke-coordinator", daemon=True)
        self.coordinator, self.opts, self.launch, self.started, self.progress = (
            coordinator,
            opts,
            launch,
            started,
            progress,
        )
        self.exit_code = 1

    def run(self) -> None:
        try:
            verdict = self.coordinator.run()
        except Exception as e:  # a bug here must still end the run with a word
            verdict = Verdict(
                False, [make("GD-SMOKE-004", Severity.ERROR, f"coordinator crashed: {type(e).__name__}: {e}")]
            )
        self.progress.close()
        self.launch["nodes"] = len({j["host"] for j in verdict.joins.values()})
        self.launch["reporter"]["host"] = verdict.joins.get(0, {}).get("host")
        try:
            self.exit_code = emit(
                report.build(verdict, self.opts, self.launch, time.monotonic() - self.started), self.opts
            )
        except Exception as e:  # stdout gone (the launcher died) or a bug: still end the run, with a word
            print(f"gpudoctor smoke: could not write the report: {type(e).__name__}: {e}", file=sys.stderr)
        finally:  # a failed run must end this process: its main thread may be stuck in a collective
            if not verdict.ok or self.exit_code:
                c = self.coordinator
                _publish_verdict(c.store, c.keys, 1, c.world_size, wait=False)
                exits.finish(1)


def _watch_sigterm():
    """Lets the coordinator thread notice a SIGTERM even while the main thread is stuck in C code:
    the signal's number arrives on a pipe (set_wakeup_fd) whatever the main thread is doing."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)  # the coordinator reports, then ends the process
    signal.set_wakeup_fd(w)
    seen = False

    def terminated() -> bool:  # one byte per signal, its number (SIGCHLD from dataloader workers comes too)
        nonlocal seen
        try:
            seen = seen or signal.SIGTERM in os.read(r, 256)
        except BlockingIOError:
            pass
        return seen

    return terminated


def _start_coordinator(opts, store, keys, world_size, deadline, launch, started, terminated) -> _CoordinatorThread:
    progress = Progress(quiet=opts.output.json)
    coordinator = Coordinator(store.clone(), keys, world_size, deadline, opts, progress=progress, terminated=terminated)
    thread = _CoordinatorThread(coordinator, opts, launch, started, progress)
    thread.start()
    return thread


def _fallback_report(world: World, opts: SmokeOptions, store, keys: Keys, launch: dict, started: float) -> int:
    """Rank 0 never coordinated: the first other rank to notice reports what it can see."""
    try:
        if store.add(keys.fallback_reporter, 1) != 1:
            return 1
        joins = {r: j for r in range(world.world_size) if (j := read_json(store, keys.join(r))) is not None}
    except Exception:
        return 1
    missing = [r for r in range(world.world_size) if r not in joins]
    finding = make(
        "GD-SMOKE-001",
        Severity.FAIL,
        f"rank 0, which coordinates the run, never published a plan within {opts.train.timeout:.0f} s; "
        f"{ranks_text(missing) if missing else 'no rank'} never joined. "
        "Check that rank 0 started and that its log shows no error.",
        missing_ranks=missing,
        joined_ranks=sorted(joins),
        reported_by=world.rank,
    )
    launch["reporter"] = {"role": "rank", "rank": world.rank, "pid": os.getpid(), "fallback": True}
    return emit(report.build(Verdict(False, [finding], joins=joins), opts, launch, time.monotonic() - started), opts)
