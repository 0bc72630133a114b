"""Ending a rank process from any thread, with its own child processes (no torch)."""

from __future__ import annotations

import os
import shutil
import sys
import threading
from typing import NoReturn

_REMOVE_ON_FINISH: list[str] = []


def remove_on_finish(path: str) -> None:
    """A folder of this process's own (a private torchinductor cache) that finish() deletes: os._exit runs no atexit."""
    _REMOVE_ON_FINISH.append(path)


def kill_children() -> None:
    """Kills this process's descendants (its dataloader workers), and only those."""
    try:
        import psutil

        for child in psutil.Process().children(recursive=True):
            child.kill()
    except Exception:
        pass


def finish(code: int) -> NoReturn:
    """Ends the process without interpreter teardown, which dataloader workers and NCCL
    threads can stall; the process's own children go first."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    kill_children()
    for path in _REMOVE_ON_FINISH:
        shutil.rmtree(path, ignore_errors=True)
    os._exit(code)


def die(message: str, code: int = 1) -> None:
    print(f"gpudoctor smoke: {message}", file=sys.stderr, flush=True)
    finish(code)


def last_resort(seconds: float, message: str) -> threading.Timer:
    """A bound on the process itself, for when even the watchdog cannot act (a store connect
    that retries past its own timeout, a wedged coordinator)."""
    timer = threading.Timer(seconds, die, args=(message,))
    timer.daemon = True
    timer.start()
    return timer
