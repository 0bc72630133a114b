"""The whole catalog over facts recorded on a real, healthy H100 machine (gpudoctor snapshot on a lent
one-GPU H100: driver 580.159.04, torch 2.11.0+cu130, no SLURM). A healthy machine must get no
warning and no failure; the same facts with a real mistake added must."""

from gpudoctor.model import Context, Severity
from gpudoctor.registry import load_all
from gpudoctor.runner import run_checks
from tests.factsutil import load_fixture, make_facts, run

RECORDED_H100 = "recorded-h100x1-driver580-torch2.11-cu130"


def findings(facts, **ctx):
    return run_checks(load_all().values(), facts, Context(**ctx))


def by_severity(found, *severities):
    return sorted(f.id for f in found if f.severity in severities)


def test_healthy_h100_has_no_warning_or_failure():
    found = findings(make_facts(RECORDED_H100), expect_gpus=1)
    assert by_severity(found, Severity.FAIL, Severity.WARN, Severity.ERROR) == []
    # What is said is true of this machine: a second (system) cuDNN beside the wheel's, TF32 off for fp32.
    assert by_severity(found, Severity.INFO) == ["GD-CUDA-005", "GD-PREC-002"]
    passed = set(by_severity(found, Severity.PASS))
    assert {"GD-DRV-001", "GD-DRV-002", "GD-CUDA-004", "GD-PREC-001", "GD-HW-001", "GD-HW-004"} <= passed


def test_recorded_h100_facts_are_what_nvml_reported():
    facts = load_fixture(RECORDED_H100)
    (gpu,) = facts["nvidia"]["gpus"]
    assert gpu["name"] == "NVIDIA H100 80GB HBM3" and gpu["compute_capability"] == [9, 0]
    assert facts["nvidia"]["cuda_driver_version"] == 13000
    assert facts["torch"]["cuda"] == "13.0"


def test_eight_gpu_job_on_the_one_gpu_machine_fails():
    f = make_facts(RECORDED_H100)
    found = findings(f, expect_gpus=8)
    failed = by_severity(found, Severity.FAIL)
    assert "GD-DEV-002" in failed
    (count,) = run("GD-DEV-002", f, expect_gpus=8)
    assert "8" in count.message and "1" in count.message


def test_cuda_visible_devices_naming_a_missing_gpu_fails():
    f = make_facts(RECORDED_H100, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    (finding,) = run("GD-DEV-001", f, expect_gpus=1)
    assert finding.severity is Severity.FAIL
    assert "1" in finding.message


def test_launch_blocking_left_on_is_flagged_on_the_real_machine():
    f = make_facts(RECORDED_H100, env={"CUDA_LAUNCH_BLOCKING": "1"})
    assert run("GD-ALLOC-004", f, expect_gpus=1)[0].severity in (Severity.WARN, Severity.FAIL)
