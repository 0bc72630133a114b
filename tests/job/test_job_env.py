"""The one environment accessor: the job's variables (this process's plus a script's exports), each with its source."""

from __future__ import annotations

import pathlib
import re

from gpudoctor.job.env import DIRECTIVES, ENVIRONMENT, job_env, probe_env
from gpudoctor.model import Context, Severity
from gpudoctor.readers.sbatch import parse_sbatch
from tests.factsutil import make_facts, run

SCRIPT = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gres=gpu:8
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:true
export NCCL_SOCKET_IFNAME=ib0
export RUN_DIR=$(mktemp -d)
unset OMP_NUM_THREADS
srun python train.py
"""


def _ctx(text: str = SCRIPT) -> Context:
    return Context(sbatch=parse_sbatch(text, "/home/u/job.slurm"), sbatch_path="/home/u/job.slurm")


def test_values_come_with_their_source():
    facts = make_facts(env={"OMP_NUM_THREADS": "4", "HOME": "/home/u"})
    env = job_env(facts, _ctx())
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:true"
    assert env.source("PYTORCH_CUDA_ALLOC_CONF") == "job.slurm line 5"
    assert env.source("HOME") == ENVIRONMENT
    assert env.source("SLURM_NNODES") == DIRECTIVES and env["SLURM_NNODES"] == "2"
    # computed at run time: unknown, not guessed; unset in the script: the job does not get it
    assert "RUN_DIR" not in env and env.source("RUN_DIR") is None
    assert "OMP_NUM_THREADS" not in env and probe_env(facts)["OMP_NUM_THREADS"] == "4"


def test_every_check_judges_the_scripts_exports_alike():
    # Issue 9: with both exported in one script, the NCCL checks judged the script's value while
    # GD-ALLOC-001 judged this process's (unset) one and passed.
    facts = make_facts()
    ctx = _ctx()
    (alloc,) = run("GD-ALLOC-001", facts, sbatch=ctx.sbatch, sbatch_path=ctx.sbatch_path)
    assert alloc.severity is Severity.FAIL and alloc.evidence["set_in"] == "job.slurm line 5"
    nccl = run("GD-NCCL-002", facts, sbatch=ctx.sbatch, sbatch_path=ctx.sbatch_path)
    assert any("ib0" in str(f.evidence) or "ib0" in f.message for f in nccl)


def test_no_check_reads_the_environment_around_the_accessor():
    checks = pathlib.Path(__file__).resolve().parents[2] / "checks"
    offenders = [
        f"{p.name}:{n}"
        for p in sorted(checks.glob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"\bfacts\.env\b|\bos\.environ\b(?!\[')", line)  # os.environ['X'] quoted in docs is fine
    ]
    assert offenders == [], "read the environment through gpudoctor.job.env (job_env / probe_env)"
