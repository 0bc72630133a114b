"""Before submission (check --sbatch/--config outside a job) the local torch is neither imported nor read,
unless asked with --python PATH or --local-torch (gpudoctor.inputs.probes_torch).

The proof is an import hook, not a timing: a sitecustomize on PYTHONPATH puts a meta-path finder in every
interpreter started with this environment (gpudoctor and its torch child alike) that logs each `import torch`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gpudoctor.facts import Facts
from gpudoctor.model import Context, Severity
from gpudoctor.probe import TORCH_NOT_ASKED, collect
from gpudoctor.registry import load_all
from gpudoctor.runner import run_checks
from tests.cliutil import run_gpudoctor
from tests.factsutil import FIXTURES, load_fixture, said

SCRIPT = FIXTURES / "sbatch" / "seed-broken-gres1-ntasks8.slurm"
CONFIG = FIXTURES / "configs" / "synthetic-good-dataloader.yaml"

IMPORT_LOGGER = """
import os, sys

class _LogTorchImport:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            with open(os.environ["GD19A_TORCH_IMPORTS"], "a") as f:
                f.write(f"{os.getpid()}\\n")
        return None  # the normal finders import it

sys.meta_path.insert(0, _LogTorchImport())
"""


def _check_logging_torch_imports(tmp_path: Path, *args: str) -> tuple[dict, list[str]]:
    hook = tmp_path / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(IMPORT_LOGGER)
    log = tmp_path / "torch-imports.log"
    log.unlink(missing_ok=True)
    r = run_gpudoctor("check", *args, "--json", env={"PYTHONPATH": str(hook), "GD19A_TORCH_IMPORTS": str(log)})
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout), (log.read_text().split() if log.exists() else [])


# the checks of the script with and without --local-torch serve several tests: one worker runs them, once each
shares_the_script_checks = pytest.mark.xdist_group("presubmission-script-checks")


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """_check_logging_torch_imports(ARGS), each command line run once for all this module's tests (read only)."""
    runs: dict[tuple[str, ...], tuple[dict, list[str]]] = {}

    def check(*args: str) -> tuple[dict, list[str]]:
        if args not in runs:
            runs[args] = _check_logging_torch_imports(tmp_path_factory.mktemp("check"), *args)
        return runs[args]

    return check


def _by_id(report: dict) -> dict:
    return {f["id"]: f for f in report["findings"]}


@shares_the_script_checks
@pytest.mark.parametrize("given", [("--sbatch", str(SCRIPT)), ("--config", str(CONFIG), "--expect-gpus", "1")])
def test_before_submission_torch_is_never_imported(checked, given):
    report, imports = checked(*given)
    assert imports == []
    cuda = _by_id(report)["GD-CUDA-001"]
    assert cuda["severity"] == "skip"
    assert "--python PATH" in said(cuda) and "--local-torch" in said(cuda)
    assert "not probed" not in said(cuda)


@shares_the_script_checks
def test_the_import_hook_sees_torch_when_asked(checked):
    """The same hook logs the import with --local-torch and with --python (the hook can fail)."""
    report, imports = checked("--sbatch", str(SCRIPT), "--local-torch")
    assert imports, "--local-torch must import torch in the probe's child"
    assert _by_id(report)["GD-CUDA-001"]["severity"] != "skip"
    _, imports = checked("--sbatch", str(SCRIPT), "--python", sys.executable)
    assert imports


@shares_the_script_checks
def test_the_verdict_about_the_script_is_the_same_without_torch(checked):
    without, _ = checked("--sbatch", str(SCRIPT))
    with_torch, _ = checked("--sbatch", str(SCRIPT), "--local-torch")
    failing = [{f["id"] for f in r["findings"] if f["severity"] == "fail"} for r in (without, with_torch)]
    assert failing[0] == failing[1] and {"GD-SLURM-002", "GD-SLURM-005"} <= failing[0]


def test_not_asked_facts_follow_the_schema_and_skip_torch_checks_with_the_reason():
    """collect(probe_torch=False): no torch section, torch_meta says why; checks needing torch skip with it,
    and the allocator checks still judge the script's variables (torch version unknown)."""
    facts = collect({"torch", "torch_meta", "env"}, probe_torch=False)
    assert "torch" not in facts.sections
    assert facts.torch_meta == {"version": None, "not_asked": TORCH_NOT_ASKED}
    from gpudoctor.factschema import first_problem

    assert first_problem(json.loads(facts.dump())) is None

    data = load_fixture("synthetic-h100x8-healthy")
    del data["torch"]
    data["torch_meta"] = {"version": None, "not_asked": TORCH_NOT_ASKED}
    data["env"]["vars"]["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:true"
    replay = Facts.from_dict(data)
    specs = load_all()
    found = {f.id: f for f in run_checks([specs["GD-CUDA-001"], specs["GD-ALLOC-001"]], replay, Context())}
    assert found["GD-CUDA-001"].severity is Severity.SKIP
    assert TORCH_NOT_ASKED in found["GD-CUDA-001"].message
    assert found["GD-ALLOC-001"].severity is Severity.FAIL  # lower-case true: judged without torch's version
