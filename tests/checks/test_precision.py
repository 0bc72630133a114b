"""precision checks over facts fixtures."""

import pytest

from gpudoctor.model import Safety, Severity
from tests.factsutil import RECORDED_CPU, make_facts, run, said, severity

V100 = {"compute_capability": [7, 0], "name": "Tesla V100-SXM2-32GB"}


def one(check_id, facts, **ctx):
    (finding,) = run(check_id, facts, **ctx)
    return finding


def v100_node(**patch):
    return make_facts(each_gpu=V100, patch={"torch.bf16_supported": False, **patch})


# ---------------------------------------------------------------- GD-PREC-001 bf16


def test_bf16_on_v100_warns_with_the_fp16_gradscaler_alternative():
    finding = one("GD-PREC-001", v100_node())
    assert finding.severity is Severity.WARN
    assert "GPU 0,1,2,3,4,5,6,7 (Tesla V100-SXM2-32GB, compute capability 7.0)" in said(finding)
    assert "GradScaler" in said(finding)
    assert finding.fix.safety is Safety.MANUAL


def test_bf16_judged_by_capability_when_torch_could_not_tell():
    f = make_facts(each_gpu=V100, patch={"torch.bf16_supported": None, "torch.cuda_available": False})
    assert severity("GD-PREC-001", f) is Severity.WARN


def test_bf16_warns_on_the_old_gpus_of_a_mixed_node():
    f = make_facts(patch={"nvidia.gpus.7.compute_capability": [7, 5], "nvidia.gpus.7.name": "Tesla T4"})
    finding = one("GD-PREC-001", f)
    assert finding.severity is Severity.WARN
    assert "GPU 7 (Tesla T4" in said(finding) and "GPU 0" not in said(finding)


def test_pre_volta_gpus_get_told_fp16_has_no_tensor_cores_either():
    f = make_facts(each_gpu={"compute_capability": [6, 0], "name": "Tesla P100"}, patch={"torch.bf16_supported": False})
    assert "no tensor cores" in said(one("GD-PREC-001", f))


def test_bf16_config_on_v100_is_named_and_fp16_config_is_fine():
    finding = one("GD-PREC-001", v100_node(), config={"trainer": {"precision": "bf16-mixed"}})
    assert finding.severity is Severity.WARN
    assert "trainer.precision" in said(finding)
    finding = one("GD-PREC-001", v100_node(), config={"trainer": {"precision": "16-mixed"}})
    assert finding.severity is Severity.INFO
    assert severity("GD-PREC-001", v100_node(), config={"fp16": {"enabled": True}}) is Severity.INFO


def test_bf16_passes_on_h100():
    assert severity("GD-PREC-001", make_facts()) is Severity.PASS


def test_torch_denying_bf16_on_ampere_warns():
    assert (
        severity("GD-PREC-001", make_facts(patch={"torch.bf16_supported": False, "torch.cuda": "10.2"}))
        is Severity.WARN
    )


# ---------------------------------------------------------------- GD-PREC-002 TF32


def test_tf32_unavailable_before_ampere_is_info():
    finding = one("GD-PREC-002", v100_node())
    assert finding.severity is Severity.INFO
    assert "no TF32" in said(finding)


def test_tf32_disabled_by_nvidia_override_warns_with_a_safe_unset():
    finding = one("GD-PREC-002", make_facts(env={"NVIDIA_TF32_OVERRIDE": "0"}))
    assert finding.severity is Severity.WARN
    (action,) = finding.fix.actions
    assert (action.kind, action.target) == ("unset_env", "NVIDIA_TF32_OVERRIDE")
    assert finding.fix.safety is Safety.SAFE


def test_tf32_default_highest_precision_is_info_with_an_unsafe_fix():
    finding = one("GD-PREC-002", make_facts(patch={"torch.float32_matmul_precision": "highest"}))
    assert finding.severity is Severity.INFO
    assert "'highest'" in said(finding)
    assert finding.fix.safety is Safety.UNSAFE  # it changes the job's numerics
    assert finding.fix.actions[0].target == "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"


def test_tf32_enabled_passes():
    f = make_facts(env={"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"}, patch={"torch.float32_matmul_precision": "high"})
    assert severity("GD-PREC-002", f) is Severity.PASS


# ---------------------------------------------------------------- CPU-only


@pytest.mark.parametrize("check_id", ["GD-PREC-001", "GD-PREC-002"])
@pytest.mark.parametrize("expect_gpus", [None, 0])
def test_precision_checks_skip_on_a_cpu_only_machine(check_id, expect_gpus):
    assert severity(check_id, make_facts(RECORDED_CPU), expect_gpus=expect_gpus) is Severity.SKIP
