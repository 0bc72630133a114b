"""The one way a probe runs a command: bounded in time and output, and leaving nothing behind.

subprocess.run(timeout=...) kills only the direct child: a wrapper script's children (an `ldconfig`
shim that runs another program, a `--python` conda shim whose child sleeps) live on as orphans and
keep the pipes open. Here the command runs in its own session (its own process group); when it
exits, and at the deadline, the whole group is killed with SIGKILL before the leader is reaped (so
the group id cannot have been reused). Output past max_output bytes is read and thrown away, so a
command that floods its pipe cannot grow memory. A grandchild that holds the pipes after the command
exited is given EXIT_GRACE_S to let go.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass

DEFAULT_MAX_OUTPUT = 4 * 2**20
EXIT_GRACE_S = 0.5


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    truncated: bool = False  # output past max_output was dropped


def run_bounded(
    cmd: list[str],
    timeout: float,
    env: dict | None = None,
    input: bytes | None = None,
    max_output: int = DEFAULT_MAX_OUTPUT,
    cwd: str | None = None,
) -> Result:
    """Run cmd with stdin from `input` (or /dev/null); its process group is killed when it exits or at
    `timeout` seconds. Raises subprocess.TimeoutExpired (after the kill) or OSError (cannot start)."""
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=env,
        cwd=cwd,
    )
    deadline = time.monotonic() + timeout
    reaped = False
    try:
        out, truncated = _exchange(proc, input, max_output, deadline, cmd, timeout)
        _wait_for_exit(proc, deadline, cmd, timeout)
        _kill_group(proc.pid)
        proc.wait()
        reaped = True
    finally:
        if not reaped:
            _kill_group(proc.pid)
            proc.wait()
        _close_pipes(proc)
    stdout, stderr = (bytes(buf).decode("utf-8", "replace") for buf in out.values())  # insertion order
    return Result(proc.returncode, stdout, stderr, truncated)


def _exchange(
    proc: subprocess.Popen, input: bytes | None, max_output: int, deadline: float, cmd: list[str], timeout: float
) -> tuple[dict[int, bytearray], bool]:
    """Write input to the command's stdin and read its stdout and stderr (each kept to max_output bytes) until
    both pipes close, or EXIT_GRACE_S after the command exited; (output per fd, truncated).
    Raises subprocess.TimeoutExpired at the deadline."""
    # Popen with stdout/stderr=PIPE (and stdin=PIPE when there is input) always sets these streams.
    assert proc.stdout is not None and proc.stderr is not None
    out = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    truncated = False
    with selectors.DefaultSelector() as sel:
        for stream in (proc.stdout, proc.stderr):
            os.set_blocking(stream.fileno(), False)
            sel.register(stream.fileno(), selectors.EVENT_READ)
        pending = memoryview(input) if input is not None else None
        stdin_fd = -1
        if pending is not None:
            assert proc.stdin is not None  # stdin=PIPE whenever there is input
            stdin_fd = proc.stdin.fileno()
            os.set_blocking(stdin_fd, False)
            sel.register(stdin_fd, selectors.EVENT_WRITE)
        exited_at = None
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                raise subprocess.TimeoutExpired(cmd, timeout)
            if exited_at is None and _exited(proc.pid):
                exited_at = now
            if exited_at is not None and now - exited_at > EXIT_GRACE_S:
                break  # the command is done; whatever still holds its pipes is killed by the caller
            for key, _ in sel.select(min(deadline - now, 0.1)):
                if key.fd == stdin_fd and pending is not None and proc.stdin is not None:
                    pending = _write_some(sel, proc.stdin, pending)
                else:
                    truncated |= _read_some(sel, key.fd, out[key.fd], max_output)
    return out, truncated


def _write_some(sel: selectors.BaseSelector, stdin, pending: memoryview) -> memoryview:
    """The input left after one write; stdin is closed once all is written or the command stopped reading."""
    fd = stdin.fileno()
    try:
        pending = pending[os.write(fd, pending[:65536]) :]
    except BlockingIOError:
        return pending
    except BrokenPipeError:
        pending = pending[len(pending) :]
    if not pending:
        sel.unregister(fd)
        stdin.close()
    return pending


def _read_some(sel: selectors.BaseSelector, fd: int, buf: bytearray, max_output: int) -> bool:
    """One read from fd into buf, kept to max_output bytes; whether any was dropped. At end of file fd is done."""
    try:
        chunk = os.read(fd, 65536)
    except BlockingIOError:
        return False
    if not chunk:
        sel.unregister(fd)
        return False
    room = max_output - len(buf)
    buf += chunk[: max(room, 0)]
    return len(chunk) > room


def _wait_for_exit(proc: subprocess.Popen, deadline: float, cmd: list[str], timeout: float) -> None:
    """Until the command has exited (not reaped: its group id stays ours to kill); TimeoutExpired at the deadline."""
    while not _exited(proc.pid):
        if time.monotonic() >= deadline:
            raise subprocess.TimeoutExpired(cmd, timeout)
        time.sleep(0.01)


def _close_pipes(proc: subprocess.Popen) -> None:
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            try:
                pipe.close()
            except OSError:
                pass


def _exited(pid: int) -> bool:
    """Whether the child has exited, without reaping it (its pid, and so its group id, stays ours)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class ForkedChild:
    """A process this one forked (no exec), as much of subprocess.Popen as waiting for it needs: pid, returncode,
    poll(), wait(timeout). Subclasses say what status a child reaped elsewhere gets (its own is lost)."""

    REAPED_ELSEWHERE: int | None = None

    def __init__(self, pid: int, name: str):
        self.pid, self.name = pid, name
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = self.REAPED_ELSEWHERE
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.005
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.name, timeout or 0)
            time.sleep(pause)
            pause = min(0.02, pause * 2)
        return code
