"""The suite on an "HPC login node": a second, unrelated SLURM answers as this machine's own cluster.

    python -m tests.ambient_slurm [pytest arguments]      # as root; e.g. -n 3 -q

Starts a real single-node SLURM of another shape (2 GPUs of another type, 16 CPUs) with
tests/slurmcluster.py, makes it this machine's cluster the two ways a login node does (its slurm.conf
at /etc/slurm/slurm.conf, and SLURM_CONF exported), checks that a bare `scontrol show partition` reaches
it, then runs pytest. Every test must pass as without it: a test that let the ambient cluster answer its
preflight would judge the fixtures against 2-GPU nodes (GD-SLURM-020) and fail. /etc/slurm/slurm.conf is
restored (or removed) afterwards, and the cluster stopped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.slurmcluster import SlurmCluster

SYSTEM_CONF = Path("/etc/slurm/slurm.conf")


def main(argv: list[str]) -> int:
    root = Path(tempfile.mkdtemp(prefix="gd-ambient-slurm-"))
    cluster = SlurmCluster(root, gpus=2, cpus=16, name="ambientnode", gpu_type="a100").start()
    saved = SYSTEM_CONF.read_bytes() if SYSTEM_CONF.exists() else None
    try:
        SYSTEM_CONF.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cluster.conf, SYSTEM_CONF)
        env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
        answer = subprocess.run(["scontrol", "show", "partition"], capture_output=True, text=True, env=env, timeout=30)
        if "ambientnode" not in answer.stdout:
            print(f"the ambient cluster does not answer: {answer.stderr.strip()}", file=sys.stderr)
            return 2
        print("ambient cluster answering: " + answer.stdout.split("\n")[0], file=sys.stderr)
        env["SLURM_CONF"] = str(cluster.conf)
        return subprocess.run([sys.executable, "-m", "pytest", *argv], env=env).returncode
    finally:
        if saved is None:
            SYSTEM_CONF.unlink(missing_ok=True)
        else:
            SYSTEM_CONF.write_bytes(saved)
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
