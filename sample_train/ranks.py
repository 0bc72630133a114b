"""The local rank processes of a spawned smoke run: forked from this process when that is safe, else started anew.

Forked: this process has imported torch (and torch._dynamo, which DDP and AdamW import, unless a --quick run trains
without them: handdp.py) and has not initialised CUDA, so each rank starts with its imports done instead of
importing them again (4.3 + 4.4 s of wall on an H200 VM; 2.5 + 3 CPU-s a rank on the 2-core CI kind) — as
PyTorch's own DataLoader forks its workers from a process that imported torch. The ranks are forked before the
rendezvous store's server threads exist (a fork copies only the forking thread: a lock another thread held would
stay locked in the child), and wait on a pipe for their world and environment, which are known only once the
store has its port.

Started anew (`python -P -m gpudoctor.sample_train.worker`): where a fork is not safe, i.e. CUDA was initialised
here (torch's CUDA runtime cannot be used in a child forked after it) or the platform has no fork.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import traceback

from gpudoctor.probe.proc import ForkedChild

LOG_TAIL_CHARS = 1500
NO_FORK_ENV = "GPUDOCTOR_SMOKE_NO_FORK"  # set (to anything): every rank is started as a new interpreter
KILL_GRACE_S = 3.0


class ForkedRank(ForkedChild):
    """A forked rank, as much of subprocess.Popen as the launcher uses: pid, poll(), wait(), returncode."""

    def __init__(self, pid: int, pipe: int):
        super().__init__(pid, f"rank pid {pid}")
        self.pipe = pipe

    def send(self, payload: dict) -> None:
        """Its world and environment; a rank already gone (it never read them) is left to report its exit."""
        view = memoryview(json.dumps(payload).encode())
        try:
            while view:
                view = view[os.write(self.pipe, view) :]
        except BrokenPipeError:
            pass
        os.close(self.pipe)
        self.pipe = -1

    def abandon(self) -> None:
        """Never started (the launcher failed before sending): the rank reads end-of-file and exits."""
        if self.pipe >= 0:
            os.close(self.pipe)
            self.pipe = -1


def _forked_child(pipe: int) -> None:
    """The rank's side of the fork: its own session (the launcher kills it with its dataloader workers as one
    group), default signal handling, its log as stdout and stderr, its environment from the pipe; then the worker.
    Never returns: os._exit, as the worker ends itself (exits.finish)."""
    code = 1
    try:
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        chunks = []
        while chunk := os.read(pipe, 1 << 16):
            chunks.append(chunk)
        os.close(pipe)
        if not chunks:  # the launcher gave up before this rank was needed
            os._exit(1)
        payload = json.loads(b"".join(chunks))
        log = os.open(payload["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        os.environ.clear()
        os.environ.update(payload["env"])
        from gpudoctor.sample_train import worker

        code = worker.main()
        worker.finish(code)
    except BaseException:  # noqa: BLE001 - the rank's own report; the launcher names the rank from its exit
        try:
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(code or 1)
    os._exit(code)


def fork_ranks(n: int, with_dynamo: bool = True) -> list[ForkedRank]:
    """n children of this process, each waiting for ForkedRank.send. Call before any thread is started.
    with_dynamo: import torch._dynamo first, which DDP and AdamW import in every rank (sample_train/optim.py);
    not for a run that trains without them (sample_train/handdp.py)."""
    if with_dynamo:
        import torch._dynamo  # noqa: F401

    from gpudoctor.sample_train import worker  # noqa: F401 - imported once here, not in every rank

    for stream in (sys.stdout, sys.stderr):  # nothing buffered here may be written twice
        stream.flush()
    forked: list[ForkedRank] = []
    for _ in range(n):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(write)
            for other in forked:
                os.close(other.pipe)
            _forked_child(read)
        os.close(read)
        forked.append(ForkedRank(pid, write))
    return forked


def fork_is_safe(torch_module) -> bool:
    """No CUDA runtime or driver use in this process yet (torch's own record of its CUDA state), and a platform
    with fork. The GPU count for the launcher is then read through NVML (gpu_count_without_cuda)."""
    if os.environ.get(NO_FORK_ENV):  # the way back to separate interpreters, should a platform misbehave
        return False
    cuda = torch_module.cuda
    return hasattr(os, "fork") and not cuda.is_initialized() and not getattr(cuda, "_is_in_bad_fork", lambda: False)()


def gpu_count_without_cuda(torch_module) -> int | None:
    """The GPUs torch would see, read through NVML as torch itself can (it honours CUDA_VISIBLE_DEVICES), without
    initialising CUDA here; None where NVML cannot say (torch then initialises CUDA to count, and ranks are not
    forked). A CPU-only torch build sees none."""
    cuda = torch_module.cuda
    if not cuda._is_compiled():
        return 0
    count_nvml = getattr(cuda, "_device_count_nvml", None)
    try:
        count = count_nvml() if count_nvml is not None else -1
    except Exception:  # noqa: BLE001 - an NVML that cannot be read: fall back to CUDA's count
        return None
    return count if count >= 0 else None


class Ranks:
    """The local rank processes, each in its own session so that its dataloader workers go with it."""

    def __init__(self, n: int, forked: list[ForkedRank] | None = None):
        self.n, self.forked = n, forked
        self.procs: dict[int, subprocess.Popen | ForkedRank] = {}
        self.logdir = ""

    def start(self, envs: list[dict], logdir: str) -> None:
        self.logdir = logdir
        for rank, env in enumerate(envs):
            log = os.path.join(logdir, f"rank{rank}.log")
            if self.forked is not None:
                self.forked[rank].send({"env": env, "log": log})
                self.procs[rank] = self.forked[rank]
                continue
            with open(log, "wb") as fh:
                # -P: a gpudoctor/ folder in the cwd (a source checkout) must not shadow the installed package.
                self.procs[rank] = subprocess.Popen(
                    [sys.executable, "-P", "-m", "gpudoctor.sample_train.worker"],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )

    def abandon(self) -> None:
        """Forked ranks that were never sent their world end by themselves; reap them."""
        for rank in self.forked or []:
            if rank.pipe >= 0:
                rank.abandon()
                try:
                    rank.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    os.kill(rank.pid, signal.SIGKILL)

    def exits(self) -> dict[int, int]:
        return {r: code for r, p in self.procs.items() if (code := p.poll()) is not None}

    def tail(self, rank: int) -> str | None:
        try:
            with open(os.path.join(self.logdir, f"rank{rank}.log"), "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - LOG_TAIL_CHARS))
                text = fh.read().decode("utf-8", "replace").strip()
        except OSError:
            return None
        return text or None

    def stop(self, grace: float = KILL_GRACE_S) -> None:
        """Waits a moment for ranks to end by themselves, then kills what is left, whole sessions."""
        self.abandon()
        until = time.monotonic() + grace
        while time.monotonic() < until and any(p.poll() is None for p in self.procs.values()):
            time.sleep(0.1)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in self.procs.values():
                try:
                    os.killpg(p.pid, sig)  # the session leader's group: the rank and its workers
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.2 if sig == signal.SIGTERM else 0)
        for p in self.procs.values():
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
