"""Broken environments set through real environment variables, judged by the real CLI in a subprocess."""

from __future__ import annotations

import json

import pytest

from tests.cliutil import run_gpudoctor

SELECT = ["check", "--select", "allocator,devices", "--expect-gpus", "0", "--json"]
CLEARED = ("CUDA_", "PYTORCH_", "TORCH_", "SLURM_", "NCCL_", "CUDNN_", "CUBLAS")


def gpudoctor(*args, env=None, pythonpath=None):
    extra = {**(env or {}), **({"PYTHONPATH": pythonpath} if pythonpath else {})}
    return run_gpudoctor(*args, env=extra, drop=(*CLEARED, "LD_PRELOAD", "PYTHONPATH"))


def verdicts(result) -> dict[str, str]:
    assert result.returncode in (0, 1), result.stdout + result.stderr
    report = json.loads(result.stdout)
    return {f["id"]: f["severity"] for f in report["findings"]}


def finding(result, check_id) -> dict:
    return next(f for f in json.loads(result.stdout)["findings"] if f["id"] == check_id)


def test_clean_environment_passes_and_exits_0():
    r = gpudoctor(*SELECT)
    v = verdicts(r)
    assert r.returncode == 0
    assert all(v[i] == "pass" for i in ("GD-ALLOC-001", "GD-ALLOC-003", "GD-ALLOC-004", "GD-DEV-001")), v


def test_garbage_max_split_size_fails_the_run():
    r = gpudoctor(*SELECT, env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:abc"})
    assert verdicts(r)["GD-ALLOC-001"] == "fail"
    assert r.returncode == 1
    assert "max_split_size_mb:abc" in finding(r, "GD-ALLOC-001")["message"]


def test_lower_case_true_fails_with_corrected_value():
    r = gpudoctor(*SELECT, env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:true"})
    f = finding(r, "GD-ALLOC-001")
    assert f["severity"] == "fail"
    assert f["fix"]["actions"] == [
        {"kind": "set_env", "target": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments:True"}
    ]


def test_empty_visible_devices_hides_every_gpu():
    cpu_job = gpudoctor(*SELECT, env={"CUDA_VISIBLE_DEVICES": ""})
    assert verdicts(cpu_job)["GD-DEV-001"] == "pass"  # --expect-gpus 0: hiding the GPUs is what a CPU job wants
    gpu_job = gpudoctor("check", "--select", "devices", "--json", env={"CUDA_VISIBLE_DEVICES": ""})
    assert verdicts(gpu_job)["GD-DEV-001"] == "fail" and gpu_job.returncode == 1
    assert "empty" in finding(gpu_job, "GD-DEV-001")["message"]


def test_malformed_visible_devices_is_reported_even_without_nvml():
    r = gpudoctor("check", "--select", "GD-DEV-001", "--json", env={"CUDA_VISIBLE_DEVICES": "0,,1"})
    f = finding(r, "GD-DEV-001")
    assert f["severity"] == "fail" and "silently ignores '1'" in f["message"]


def test_no_cuda_memory_caching_follows_this_torchs_rule():
    on = gpudoctor(*SELECT, env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"})
    assert verdicts(on)["GD-ALLOC-003"] == "warn"
    # the installed torch is 2.13: from 2.7 the value 0 means off
    off = gpudoctor(*SELECT, env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "0"})
    assert verdicts(off)["GD-ALLOC-003"] == "pass"


@pytest.mark.parametrize("value, expected", [("1", "warn"), ("0", "pass")])
def test_cuda_launch_blocking(value, expected):
    r = gpudoctor(*SELECT, env={"CUDA_LAUNCH_BLOCKING": value})
    assert verdicts(r)["GD-ALLOC-004"] == expected


def test_strict_turns_debug_switch_warnings_into_exit_1():
    r = gpudoctor(*SELECT, "--strict", env={"CUDA_LAUNCH_BLOCKING": "1"})
    assert r.returncode == 1


def _fake_torch(tmp_path):
    """A `torch` that shadows the real one and leaves a marker file when anything imports it."""
    marker = tmp_path / "torch-was-imported"
    pkg = tmp_path / "shadow" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "import os, pathlib\n"
        "pathlib.Path(os.environ['GPUDOCTOR_TEST_TORCH_MARKER']).write_text('imported')\n"
        "raise ImportError('fake torch for gpudoctor tests')\n"
    )
    return marker, str(tmp_path / "shadow")


def test_select_allocator_devices_never_imports_torch(tmp_path):
    marker, shadow = _fake_torch(tmp_path)
    env = {"GPUDOCTOR_TEST_TORCH_MARKER": str(marker), "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    r = gpudoctor(*SELECT, env=env, pythonpath=shadow)
    v = verdicts(r)
    assert v["GD-ALLOC-001"] == "pass"  # torch's version still known from package metadata
    assert "valid for torch 2." in finding(r, "GD-ALLOC-001")["message"]
    assert not marker.exists(), "an allocator/devices check made gpudoctor import torch"


def test_torch_import_detector_works(tmp_path):
    # the control: a check that needs the torch probe does trip the marker, so the test above can fail
    marker, shadow = _fake_torch(tmp_path)
    r = gpudoctor(
        "check", "--select", "GD-DRV-002", "--json", env={"GPUDOCTOR_TEST_TORCH_MARKER": str(marker)}, pythonpath=shadow
    )
    assert r.returncode in (0, 1), r.stderr
    assert marker.exists()
