"""Running the real `gpudoctor` command in a child process, for CLI tests."""

from __future__ import annotations

import os
import subprocess
import sys

# Variables of the machine running the tests that would change a verdict: a GPU, a job, a launcher.
JOB_AND_GPU_PREFIXES = ("CUDA_", "SLURM_", "NCCL_", "OMP_", "RANK", "WORLD_", "LOCAL_")


def run_gpudoctor(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m gpudoctor ARGS` with this environment less its job, launcher and GPU variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(JOB_AND_GPU_PREFIXES)}
    return subprocess.run(
        [sys.executable, "-m", "gpudoctor", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
