"""A stand-in training program: records what one process of a job was started as, one JSON line per process.

Started the way a batch script starts a training program (`python recorder.py ...`, `srun python ...`,
`torchrun ... recorder.py ...`, `bash -c 'python recorder.py ...'`), it writes one file holding one JSON line,
`$GD_RECORD_DIR/<host>-<pid>.json`, with:
- host (socket.gethostname(): the node's name on tests/slurmcluster.MultiNodeCluster), pid, ppid;
- argv (sys.argv as the program sees it: argv[0] is the script's path as given), and its parent's command line
  (/proc/PPID/cmdline: torchrun's own argv, after the shell expanded it, where torchrun started it);
- env: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK, MASTER_ADDR, MASTER_PORT,
  TORCHELASTIC_*, SLURM_* and CUDA_VISIBLE_DEVICES where set;
- rank: the rank as this program reads it (a `--rank` argument first, then RANK, then SLURM_PROCID), and which;
- world: when GD_RECORD_JOIN is set, whether torch.distributed.init_process_group("gloo", env://) formed a world
  within GD_RECORD_TIMEOUT seconds (default 30), its size, this process's rank in it and the world's id (rank 0's
  random id, broadcast: records with the same id are one world); otherwise null.
The record is written before joining (world "pending") and again after, so a process killed while joining
still says so. It never raises: an error is recorded and the process exits 0 unless GD_RECORD_EXIT says
otherwise. Standard library and torch only: it runs inside the job, not under pytest.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import uuid

NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR",
         "MASTER_PORT", "CUDA_VISIBLE_DEVICES")  # fmt: skip
PREFIXES = ("TORCHELASTIC_", "SLURM_")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k in NAMES or k.startswith(PREFIXES)}


def _parent_argv() -> list[str] | None:
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as fh:
            return [a.decode(errors="replace") for a in fh.read().split(b"\0")[:-1]]
    except OSError:
        return None


def _rank_argument(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg.startswith("--rank="):
            return arg.split("=", 1)[1]
        if arg == "--rank" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _rank() -> tuple[str | None, str | None]:
    """(value, where from): the --rank argument, else RANK, else SLURM_PROCID."""
    for value, source in ((_rank_argument(sys.argv[1:]), "--rank"), (os.environ.get("RANK"), "RANK"),
                          (os.environ.get("SLURM_PROCID"), "SLURM_PROCID")):  # fmt: skip
        if value is not None:
            return value, source
    return None, None


def _join(timeout: float) -> dict:
    try:
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=timeout))
        # a tensor, not broadcast_object_list (which needs numpy, absent from the test venv)
        ident = torch.tensor([uuid.uuid4().int >> 65 if dist.get_rank() == 0 else 0], dtype=torch.int64)
        dist.broadcast(ident, src=0)
        world = {"formed": True, "size": dist.get_world_size(), "rank": dist.get_rank(), "id": f"{int(ident[0]):x}"}
        dist.barrier()
        dist.destroy_process_group()
        return world
    except Exception as e:  # recorded, never raised: the record is the result
        return {"formed": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}


def _write(path: str, record: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
    os.replace(tmp, path)


def main() -> int:
    out = os.environ.get("GD_RECORD_DIR")
    if not out:
        print("recorder: GD_RECORD_DIR is not set", file=sys.stderr)
        return 2
    rank, rank_from = _rank()
    host = socket.gethostname()
    record = {
        "host": host,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "argv": sys.argv,
        "parent_argv": _parent_argv(),
        "env": _env(),
        "rank": rank,
        "rank_from": rank_from,
        "world": None,
        "time": time.time(),
    }
    path = os.path.join(out, f"{host}-{os.getpid()}.json")
    try:
        if os.environ.get("GD_RECORD_JOIN"):
            record["world"] = {"formed": None, "pending": True}
            _write(path, record)
            record["world"] = _join(float(os.environ.get("GD_RECORD_TIMEOUT", "30")))
        _write(path, record)
    except OSError as e:
        print(f"recorder: cannot write {path}: {e}", file=sys.stderr)
        return 2
    return int(os.environ.get("GD_RECORD_EXIT", "0"))


if __name__ == "__main__":
    sys.exit(main())
