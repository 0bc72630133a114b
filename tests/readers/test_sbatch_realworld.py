"""Batch scripts written the way people write them (tests/fixtures/sbatch/realworld/): every verdict.

Each fixture says in its header comment where the pattern comes from, whether it is correct, and
what gpudoctor must say about it:

    # expect: warn                         worst severity over the slurm and distributed checks
    # fires: GD-SLURM-007=warn             these checks give exactly this severity
    # must-not: GD-SLURM-009 GD-SLURM-012  these checks give neither warn nor fail
    # slurm-version: 23.11.6               `srun --version` of the cluster (default 22.05.8)
    # args: --launcher lightning --expect-gpus 8   the Context the check runs with

The checks run over a GPU node's facts with no environment of their own, as `gpudoctor check
--sbatch FILE` does on a login node before submission.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from gpudoctor.job.env import job_env
from gpudoctor.job.model import build
from gpudoctor.model import Context, Severity
from gpudoctor.readers.sbatch import load_sbatch
from gpudoctor.registry import load_all
from gpudoctor.runner import run_check
from tests.factsutil import make_facts

REALWORLD = Path(__file__).parents[1] / "fixtures" / "sbatch" / "realworld"
# A script in a folder of its own comes with the program it launches (readers/program.py reads it).
SCRIPTS = sorted(REALWORLD.glob("*.slurm")) + sorted(REALWORLD.glob("*/*.slurm"))
CATEGORIES = ("slurm", "distributed")
DEFAULT_SLURM_VERSION = "22.05.8"
BAD = (Severity.WARN, Severity.FAIL)


def header(path: Path) -> dict:
    """The `# key: value` lines of the fixture's header comment."""
    out: dict = {}
    for line in path.read_text().splitlines()[1:]:
        if not line.startswith("#") or line.startswith("#SBATCH"):
            if line.startswith("#SBATCH") or not line.strip():
                continue
            break
        m = re.match(r"#\s*(expect|fires|must-not|slurm-version|args):\s*(.*)$", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def context(path: Path, args: str) -> Context:
    sb = load_sbatch(str(path))
    ctx: dict = {"sbatch": sb, "sbatch_path": str(path)}
    words = args.split()
    for flag, value in zip(words[::2], words[1::2], strict=False):
        if flag == "--launcher":
            ctx["launcher"] = value
        elif flag == "--expect-gpus":
            ctx["expect_gpus"] = int(value)
        else:
            raise ValueError(f"{path.name}: unknown args flag {flag}")
    return Context(**ctx)


def verdicts(path: Path) -> dict[str, list]:
    """check id -> its findings, for every slurm and distributed check."""
    head = header(path)
    slurm = {"in_job": False, "version": head.get("slurm-version", DEFAULT_SLURM_VERSION), "job": None, "packages": {}}
    facts = make_facts(patch={"slurm": slurm})
    ctx = context(path, head.get("args", ""))
    ctx = replace(ctx, job=build(ctx.sbatch, job_env(facts, ctx), ctx))  # the job model, built once as the runner does
    return {cid: run_check(spec, facts, ctx) for cid, spec in load_all().items() if spec.category in CATEGORIES}


def worst(findings: list) -> Severity:
    return max(findings, key=lambda f: f.severity.rank).severity


def test_there_are_enough_realworld_scripts():
    assert len(SCRIPTS) >= 20
    for path in SCRIPTS:
        head = header(path)
        assert "expect" in head, f"{path.name}: no '# expect:' line"
        text = path.read_text()
        assert "Pattern:" in text and "Judgement:" in text, f"{path.name}: say where it comes from and why"


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_realworld_verdict(path):
    head = header(path)
    found = verdicts(path)
    summary = {cid: worst(fs).value for cid, fs in found.items()}
    messages = {
        cid: [f.message for f in fs if f.severity not in (Severity.PASS, Severity.SKIP)] for cid, fs in found.items()
    }
    messages = {k: v for k, v in messages.items() if v}
    overall = max((worst(fs) for fs in found.values()), key=lambda s: s.rank)
    assert overall is Severity(head["expect"]), f"worst {overall.value}, expected {head['expect']}: {messages}"
    for item in head.get("fires", "").split():
        cid, _, sev = item.partition("=")
        assert summary[cid] == sev, f"{cid}: {summary[cid]}, expected {sev}: {messages.get(cid)}"
    for cid in head.get("must-not", "").split():
        assert worst(found[cid]) not in BAD, f"{cid} must not warn or fail here: {messages.get(cid)}"
    for cid, fs in found.items():
        for f in fs:
            if f.severity in BAD:
                assert f.message and (f.evidence or f.fix), f"{cid}: a {f.severity.value} needs evidence or a fix"
                assert f.fix is not None, f"{cid}: a {f.severity.value} must name the fix: {f.message}"


def test_header_parser_reads_the_keys():
    head = header(REALWORLD / "stas-torchrun-bash-c-2nodes.slurm")
    assert head["expect"] == "warn"
    assert "GD-SLURM-007=warn" in head["fires"]
    assert "GD-SLURM-009" in head["must-not"]


def test_env_unset_wrapper_keeps_the_launcher():
    """`srun env -u CUDA_VISIBLE_DEVICES python -m torch.distributed.run` (pytorch/pytorch#73656): env's -u
    takes the next word as its value, so the launcher is torchrun with its own options read."""
    sb = load_sbatch(str(REALWORLD / "jsc-srun-env-unset-torchrun.slurm"))
    (launch,) = sb.launches
    assert launch.launcher == "torchrun" and launch.srun is not None
    assert launch.nproc_per_node == "gpu" and launch.rdzv_backend == "c10d"
