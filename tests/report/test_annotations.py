"""Findings on their file and line: Finding.location (job/locate.py), the JSON report's optional
"location", and the github / concise output formats (report/annotations.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema

from gpudoctor.model import Context, Finding, Location, Severity
from gpudoctor.report import annotations
from tests.cliutil import run_gpudoctor_here
from tests.factsutil import FIXTURES

ROOT = Path(__file__).resolve().parents[2]
REPORT_SCHEMA = json.loads((ROOT / "docs" / "report.schema.json").read_text())
SEED = FIXTURES / "sbatch" / "seed-broken-gres1-ntasks8.slurm"  # line 6: --gres=gpu:h200:1; line 15: srun ...
GOOD = FIXTURES / "sbatch" / "correct-srun-ntasks8-gres8.slurm"

# Every command of the batch body below the first one runs; the late #SBATCH line (7) is ignored by sbatch,
# line 9 exports CUDA_VISIBLE_DEVICES over SLURM's choice, line 10 launches without srun.
BROKEN = """#!/bin/bash
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:4

module load cuda
#SBATCH --time=01:00:00
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:true
export CUDA_VISIBLE_DEVICES=0,1,2,3
torchrun --nproc-per-node=4 train.py
"""


def _check(*args: str):
    return run_gpudoctor_here("check", *args)  # the CLI's answer, run in this process


def _findings(path) -> dict[str, dict]:
    r = _check("--sbatch", str(path), "--json")
    report = json.loads(r.stdout)
    jsonschema.validate(report, REPORT_SCHEMA)
    return {f["id"]: f for f in report["findings"]}


def test_findings_about_a_script_carry_the_line_the_fix_or_launch_names():
    found = _findings(SEED)
    assert found["GD-SLURM-002"]["location"] == {
        "file": str(SEED),
        "line": 6,
        "column": 9,
        "end_line": 6,
        "end_column": 26,
    }  # `--gres=gpu:h200:1`, the option the fix rewrites
    assert found["GD-SLURM-007"]["location"]["line"] == 15  # the launch line (evidence "launch line")
    assert "location" not in found["GD-DRV-001"]  # about this machine: no file


def test_each_kind_of_script_problem_lands_on_its_own_line(tmp_path):
    script = tmp_path / "broken.slurm"
    script.write_text(BROKEN)
    lines = {f["id"]: f.get("location", {}).get("line") for f in _findings(script).values()}
    assert lines["GD-SLURM-011"] == 7  # the late #SBATCH line, which the fix moves
    assert lines["GD-ALLOC-001"] == 8  # the export the fix replaces (lower-case true)
    assert lines["GD-SLURM-010"] == 9  # the export the fix removes
    assert lines["GD-SLURM-012"] == 10  # the launch line without srun


def test_concise_prints_one_path_line_id_message_per_problem(tmp_path):
    r = _check("--sbatch", str(SEED), "--format", "concise")
    assert r.returncode == 1
    out = r.stdout.splitlines()
    assert all(re.match(rf"^{re.escape(str(SEED))}:\d+: GD-[A-Z]+-\d{{3}} ", line) for line in out), out
    assert f"{SEED}:6: GD-SLURM-002 8 tasks per node but only 1 GPU(s)" in r.stdout
    assert "GD-DRV-001" not in r.stdout  # the submit host's missing driver is outside the verdict
    good = _check("--sbatch", str(GOOD), "--format", "concise")
    assert (good.returncode, good.stdout) == (0, "")


def test_github_format_writes_workflow_commands_on_the_line():
    r = _check("--sbatch", str(SEED), "--format", "github")
    assert r.returncode == 1
    first = r.stdout.splitlines()[0]
    assert first.startswith(
        f"::error file={SEED},line=6,col=9,endLine=6,endColumn=26,title=GD-SLURM-002 several-tasks-share-one-gpu::"
    )
    assert "::notice file=" in r.stdout and ",line=15," in r.stdout  # GD-SLURM-007 is info


def test_workflow_command_escaping_is_the_toolkits():
    """actions/toolkit packages/core/src/command.ts: escapeData %, CR, LF; escapeProperty also ':' and ','."""
    f = Finding("GD-X-001", "a,b", "slurm", Severity.WARN, "t", "50% done\r\nnext: a,b")
    line = annotations.github_line(f, Context(sbatch_path="dir:1/job,v2.slurm"))
    assert line == "::warning file=dir%3A1/job%2Cv2.slurm,line=1,title=GD-X-001 a%2Cb::50%25 done%0D%0Anext: a,b"


def test_a_finding_without_a_line_goes_on_line_1_of_the_script_or_on_no_file():
    f = Finding("GD-X-001", "n", "slurm", Severity.FAIL, "t", "multi\nline")
    assert annotations.concise_line(f, Context(sbatch_path="job.slurm")) == "job.slurm:1: GD-X-001 multi line"
    assert annotations.concise_line(f, Context()) == "gpudoctor: GD-X-001 multi line"
    at = Finding("GD-X-001", "n", "slurm", Severity.WARN, "t", "m", location=Location("c.yaml", 4))
    assert annotations.concise_line(at, Context(sbatch_path="job.slurm")) == "c.yaml:4: GD-X-001 warning: m"
    assert Finding.from_dict(at.to_dict()) == at


CONFIG = """trainer:
  devices: 8
data:
  loader:
    num_workers: 4
    pin_memory: true
    prefetch_factor: 0
"""


def test_a_config_finding_lands_on_its_key_line(tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text(CONFIG)
    r = _check("--config", str(config), "--expect-gpus", "8", "--before-submission", "--format", "concise")
    assert f"{config}:7: GD-DL-008 " in r.stdout, r.stdout + r.stderr  # prefetch_factor: 0, on line 7
    as_json = tmp_path / "train.json"  # JSON is read the same way
    as_json.write_text(json.dumps({"data": {"loader": {"num_workers": 4, "prefetch_factor": 0}}}, indent=1))
    r = _check("--config", str(as_json), "--expect-gpus", "8", "--before-submission", "--format", "concise")
    assert f"{as_json}:5: GD-DL-008 " in r.stdout, r.stdout + r.stderr


def test_key_lines_of_yaml_and_json_and_nothing_for_a_broken_file(tmp_path):
    from gpudoctor.readers.trainconfig import key_lines

    config = tmp_path / "c.yaml"
    config.write_text(CONFIG + "callbacks:\n  - name: ckpt\n    every: 10\nbase: &b {lr: 1}\nother: *b\n")
    lines = key_lines(str(config))
    assert lines["data.loader.prefetch_factor"] == 7 and lines["trainer.devices"] == 2
    assert lines["callbacks.0.every"] == 10 and lines["base.lr"] == 11
    broken = tmp_path / "b.yaml"
    broken.write_text("a: [1, 2\n")
    assert key_lines(str(broken)) == {} and key_lines(str(tmp_path / "missing.yaml")) == {}


REALWORLD = FIXTURES / "sbatch" / "realworld"
NAMED_LINES = [  # issue 38: findings whose line is named only in their evidence or message, once put on line 1
    ("accelerate-machine-rank-expanded-in-batch-shell.slurm", "GD-DIST-001", 16),  # evidence "line 16: srun ..."
    ("localhost-master-addr-4nodes.slurm", "GD-DIST-006", 14),  # evidence "<script> line 14"
    ("princeton-ddp-srun-2gpus.slurm", "GD-DIST-001", 22),  # `export WORLD_SIZE=...`, a variable of its evidence
    ("legacy-launch-use-env-srun.slurm", "GD-DIST-004", 21),  # evidence "lines": ["line 21: srun ..."]
    ("deepspeed-launcher-slurm-from-batch-shell.slurm", "GD-DL-006", 16),  # a fix exporting before the launch
]


def test_every_format_puts_a_finding_on_the_line_it_names():
    for name, check_id, line in NAMED_LINES:
        path = str(REALWORLD / name)
        report = json.loads(_check("--sbatch", path, "--json").stdout)
        (found,) = [f for f in report["findings"] if f["id"] == check_id]
        assert found["location"]["line"] == line, (name, found)
        concise = _check("--sbatch", path, "--format", "concise").stdout
        github = _check("--sbatch", path, "--format", "github").stdout
        if found["severity"] in ("fail", "warn"):
            assert f"{path}:{line}: {check_id}" in concise, concise
        assert f"line={line}," in next(g for g in github.splitlines() if check_id in g)
