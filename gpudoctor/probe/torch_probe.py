"""torch facts, from a child process of the target interpreter.

A torch that hangs or crashes on import costs us only the child: it runs in its own
session, and the parent kills that whole process group at the deadline (and after
every run, so nothing it started outlives the probe), recording a `timeout` or
`crashed` fact.

Where the caller has imported the target's torch itself and says so (`check --job`'s leader, which needs
torch.distributed's TCPStore: fork=True), the child is a fork of it instead of a new interpreter: the same torch,
without a second import (3-4 s of CPU on the machines of docs/benchmarks.md). Only on the caller's word: a process
that changed PYTHONPATH or LD_LIBRARY_PATH since its import would fork a torch a new interpreter would not load. It
still runs in its own session, bounded the same way: the steps that can hang or crash (CUDA's initialisation,
cuDNN's loading) run in the child only. A fork from a process that imported torch is what DataLoader's workers are,
so torch supports it while CUDA is not initialised in the parent, which gpudoctor never does.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings

from gpudoctor.probe.proc import ForkedChild, run_bounded

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_child.py")
RESULT_MARKER = "GPUDOCTOR-TORCH-FACTS "  # as in torch_child.py (which cannot import us)
STAGE_MARKER = "GPUDOCTOR-STAGE "

# What the child was doing when it last reported a stage (see torch_child.py).
STAGES = {
    "import": "importing torch",
    "cuda_init": "initialising CUDA (torch.cuda.is_available())",
    "devices": "querying the CUDA devices",
    "cudnn": "loading cuDNN",
    "distributed": "querying NCCL and torch.distributed",
    "precision": "querying bf16/TF32 support",
    "libraries": "listing loaded libraries",
    "done": "exiting",
}


class TorchProbe:
    """Started early, collected late, so the torch import overlaps the other probes."""

    def __init__(self, python: str | None, timeout: float, fork: bool = False):
        self.python = python or sys.executable
        self.timeout = timeout
        self.started = time.monotonic()
        self.proc: subprocess.Popen[bytes] | _Forked | None = None
        self.start_error = None
        self._out: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
        self._readers: list[threading.Thread] = []
        try:
            if fork and _torch_imported_here(self.python):
                self.proc = _Forked.start()
            else:
                self.proc = subprocess.Popen(
                    [self.python, CHILD],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,  # its own session and process group, killable as a whole
                )
        except OSError as e:
            self.start_error = f"cannot run {self.python}: {e.strerror or e}"
            return
        atexit.register(self._kill_group)  # if we die before result(), the child must not live on
        # Read in threads and wait for the child itself, not for the pipes to close: something
        # the child started may hold them open after it exits.
        for name in ("stdout", "stderr"):
            t = threading.Thread(target=_drain, args=(getattr(self.proc, name), self._out[name]), daemon=True)
            t.start()
            self._readers.append(t)

    def result(self) -> dict:
        base = {"python": self.python}
        if self.proc is None:
            return {**base, "status": "python_error", "error": self.start_error}
        remaining = max(0.1, self.timeout - (time.monotonic() - self.started))
        try:
            returncode: int | None = self.proc.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            returncode = None  # timed out
        stdout, stderr = self._finish()
        if returncode is not None:
            return _parse(base, returncode, stdout, stderr)
        stage = _last_stage(stderr)
        doing = STAGES.get(stage or "import", STAGES["import"])  # no stage reported yet: still importing
        return {
            **base,
            "status": "timeout",
            "error": f"{doing} did not finish within {self.timeout:g} s",
            "stage": stage,
            "timeout_seconds": self.timeout,
        }

    def cancel(self) -> None:
        """Not needed after all: stop the child and reap it."""
        if self.proc is not None:
            self._finish()

    def _kill_group(self) -> None:
        atexit.unregister(self._kill_group)
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            if isinstance(self.proc, _Forked) and self.proc.returncode is None:
                try:  # a fork killed before it made its own session: it has started nothing yet
                    os.kill(self.proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def _finish(self) -> tuple[str, str]:
        """Kill whatever is left of the child's process group, reap it, and collect its output."""
        self._kill_group()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for t in self._readers:
            t.join(timeout=2)  # a grandchild that left our session may still hold a pipe: give up on it
        stdout, stderr = (b"".join(self._out[n]).decode("utf-8", "replace") for n in ("stdout", "stderr"))
        return stdout, stderr


def _torch_imported_here(python: str) -> bool:
    """Whether this process can fork the probe's torch: the same interpreter, torch loaded whole (a half-imported or
    stand-in module is left to a fresh child to judge), and CUDA not initialised here (a fork could not use it)."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(os, "fork") or not hasattr(torch, "__version__"):
        return False
    try:
        if torch.cuda.is_initialized():
            return False
    except Exception:
        return False
    # the path, not the file: a venv's bin/python links to its base interpreter but has its own site-packages
    return os.path.abspath(python) == os.path.abspath(sys.executable)


class _Forked(ForkedChild):
    """The torch child as a fork of this process, with the part of subprocess.Popen that TorchProbe uses."""

    REAPED_ELSEWHERE = 255  # its status is lost: not a timeout

    def __init__(self, pid: int, stdout, stderr):
        super().__init__(pid, "the forked torch probe")
        self.stdout, self.stderr = stdout, stderr

    @classmethod
    def start(cls) -> _Forked:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        for stream in (sys.stdout, sys.stderr):  # nothing buffered here may be written twice
            try:
                if stream is not None:
                    stream.flush()
            except (OSError, ValueError):
                pass
        with warnings.catch_warnings():  # Python 3.12 warns of fork() beside threads (torch's own, as for DataLoader)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: never returns
            _run_forked_child(out_r, out_w, err_r, err_w)
        os.close(out_w)
        os.close(err_w)
        return cls(pid, os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb"))


def _run_forked_child(out_r: int, out_w: int, err_r: int, err_w: int) -> None:
    """In the fork: its own session, stdout and stderr to the parent's pipes, torch_child's steps, then _exit (no
    handler of the parent's runs here: not its atexit, not its signal handlers)."""
    code = 1
    try:
        os.setsid()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        for fd in (null, out_r, out_w, err_r, err_w):
            os.close(fd)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        import faulthandler

        if faulthandler.is_enabled():  # its report of a crash here goes to the probe's stderr, as a new child's would
            faulthandler.enable(sys.stderr)
        from gpudoctor.probe import torch_child

        torch_child.main(forked=True)
        sys.stdout.flush()
        sys.stderr.flush()
        code = 0
    except BaseException:  # noqa: BLE001 - whatever happens here ends in _exit, as a fresh child's would
        try:
            import traceback

            traceback.print_exc(file=sys.stderr)
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(code)


MAX_CHILD_OUTPUT = 32 * 2**20  # the facts are well under 1 MiB; a --python that floods its pipe must not fill memory


def _drain(stream, sink: list[bytes]) -> None:
    kept = 0
    try:
        for chunk in iter(lambda: stream.read1(65536), b""):
            if kept < MAX_CHILD_OUTPUT:  # past the cap the pipe is still emptied, so the child never blocks on it
                sink.append(chunk[: MAX_CHILD_OUTPUT - kept])
                kept += len(sink[-1])
    except (OSError, ValueError):
        pass
    finally:
        try:
            stream.close()
        except OSError:
            pass


def _last_stage(stderr: str | None) -> str | None:
    stages = [ln[len(STAGE_MARKER) :].strip() for ln in (stderr or "").splitlines() if ln.startswith(STAGE_MARKER)]
    return stages[-1] if stages else None


def _stderr_tail(stderr: str | None, lines: int = 8) -> list[str]:
    return [ln for ln in (stderr or "").strip().splitlines() if not ln.startswith(STAGE_MARKER)][-lines:]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _parse(base: dict, rc: int, stdout: str, stderr: str) -> dict:
    results = [ln[len(RESULT_MARKER) :] for ln in (stdout or "").splitlines() if ln.startswith(RESULT_MARKER)]
    if rc == 0 and results:
        try:
            result = json.loads(results[-1])
        except (json.JSONDecodeError, RecursionError, ValueError):
            result = None
        if isinstance(result, dict):  # a wrapper printing a JSON list or number is no torch probe result
            return result
    tail = _stderr_tail(stderr)
    stage = _last_stage(stderr)
    where = f" while {STAGES[stage]}" if stage in STAGES else ""
    if rc < 0:
        sig = _signal_name(-rc)
        return {
            **base,
            "status": "crashed",
            "signal": sig,
            "stage": stage,
            "error": f"the torch probe died with {sig}{where}",
            "stderr_tail": tail,
        }
    if (
        rc > 128 and rc - 128 in signal.valid_signals()
    ):  # a wrapper script (shell, conda shim) passed the signal on as a status
        sig = _signal_name(rc - 128)
        return {
            **base,
            "status": "crashed",
            "signal": sig,
            "stage": stage,
            "error": f"the torch probe exited with status {rc} ({sig}){where}",
            "stderr_tail": tail,
        }
    if stage is None:  # our script never started: not a (recent enough) Python
        why = "is it a Python 3 interpreter?"
        if any("SyntaxError" in ln for ln in tail):
            why = "it cannot run the probe script: not a Python 3 interpreter"
        return {
            **base,
            "status": "python_error",
            "error": f"{base['python']} exited with status {rc} and no result ({why})",
            "stderr_tail": tail,
        }
    if stage == "done" and rc >= 0:
        return {
            **base,
            "status": "crashed",
            "stage": stage,
            "stderr_tail": tail,
            "error": "the torch probe finished but its result never arrived",
        }
    return {
        **base,
        "status": "crashed",
        "stage": stage,
        "error": f"the torch probe exited with status {rc}{where}",
        "stderr_tail": tail,
    }


def torch_meta(python: str | None) -> dict:
    """torch's installed version without importing it (fast; used by allocator checks)."""
    if python is None:
        from importlib.metadata import PackageNotFoundError, distribution

        try:
            d = distribution("torch")
            return {"installed": True, "version": d.version, "python": sys.executable}
        except PackageNotFoundError:
            return {"installed": False, "version": None, "python": sys.executable}
    code = (
        "import json\nfrom importlib.metadata import version\n"
        "try: print(json.dumps({'installed': True, 'version': version('torch')}))\n"
        "except Exception: print(json.dumps({'installed': False, 'version': None}))"
    )
    try:
        r = run_bounded([python, "-c", code], timeout=10)  # its process group is killed whole
        out = json.loads(r.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError, IndexError) as e:
        return {"error": f"cannot ask {python} for torch's version: {e}", "python": python}
    if not isinstance(out, dict) or not isinstance(out.get("installed"), bool):
        return {
            "error": f"cannot ask {python} for torch's version: its answer is not the expected object",
            "python": python,
        }
    out["python"] = python
    return out
