"""NCCL's own debug output, captured per rank so that the report can say which transport NCCL used
(judge/transport.py reads it). No torch: NCCL reads these variables when the first communicator is made.

Captured only where the user has not chosen where NCCL logs (NCCL_DEBUG_FILE): then their setting stands and the
transport is not read. NCCL_DEBUG=INFO with the INIT and NET subsystems is a few hundred lines a rank. NCCL's
warnings still reach the rank's log (and so the report's tail of it): they are copied there from the file.
"""

from __future__ import annotations

import os
import sys
import tempfile

from gpudoctor.sample_train import exits
from gpudoctor.sample_train.judge import transport

RDMA_CLASS = "/sys/class/infiniband"  # InfiniBand, RoCE and EFA devices alike register here


def capture(rank: int) -> tuple[str | None, str | None]:
    """(the file NCCL will log to, why not captured). Call before the process group is made."""
    if os.environ.get("NCCL_DEBUG_FILE"):
        return None, "NCCL_DEBUG_FILE is set (yours), so NCCL's log was left where you send it"
    folder = tempfile.mkdtemp(prefix=f"gpudoctor-nccl-rank{rank}-")
    exits.remove_on_finish(folder)  # whatever happens to the rank (os._exit runs no clean-up of its own)
    path = os.path.join(folder, "nccl.log")
    os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET", NCCL_DEBUG_FILE=path)
    return path, None


def _text(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(8 * 2**20)
    except OSError:
        return None


def echo_warnings(path: str | None, text: str | None = None) -> None:
    """NCCL's warnings from its log (text: already read) to stderr (the rank's log), as NCCL would have printed them
    without the file."""
    for line in (text if text is not None else _text(path) or "").splitlines():
        if " NCCL WARN " in line:
            print(line, file=sys.stderr)


def read(path: str | None) -> dict | None:
    """The parsed transport (judge/transport.parse) with this host's RDMA devices; the log's warnings echoed."""
    text = _text(path)
    if text is None:
        return None
    echo_warnings(path, text)
    parsed = transport.parse(text)
    parsed["rdma_devices"] = rdma_devices()
    return parsed


def rdma_devices() -> list[str]:
    try:
        return sorted(os.listdir(RDMA_CLASS))
    except OSError:
        return []
