"""One run of a Monitor test world: a rank script (rank 0, which forks or starts the others) in a session of its
own, given a free port for its store, killed with everything it started once it ends or times out."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path


def run_ranks(script: Path, *args: str, timeout: float) -> tuple[int | None, str]:
    """(rank 0's exit status, its stderr) of `python SCRIPT PORT ARGS...` with one OpenMP thread per rank."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("LOCAL_RANK", None)
    ranks = subprocess.Popen(
        [sys.executable, str(script), str(port), *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        said = ranks.communicate(timeout=timeout)[1]
    finally:
        try:
            os.killpg(ranks.pid, 9)  # every rank, whatever became of them
        except ProcessLookupError:
            pass
    return ranks.returncode, said
