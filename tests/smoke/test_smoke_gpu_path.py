"""Pure pieces of the smoke run's GPU path, testable without a GPU: device choice, GPU identity,
spec peaks, the FLOP and MFU arithmetic on a GPU-shaped report, the default model size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudoctor.job.device import device_index_for, gpu_uuid_text, pci_address
from gpudoctor.model import Severity
from gpudoctor.sample_train.coordinator import Verdict, plan_run
from gpudoctor.sample_train.judge import metrics, peaks, placement, report
from gpudoctor.sample_train.options import SmokeOptions
from gpudoctor.sample_train.sizes import SIZES, size_for_gpu


# -- which GPU a rank takes ------------------------------------------------------------------
@pytest.mark.parametrize(
    "visible, local_rank, launcher, expected",
    [
        (1, 5, "srun", 0),  # --gpus-per-task=1: the task sees only its own GPU, as cuda:0
        (1, 3, "torchrun", 0),  # one visible GPU: every local rank gets it (then GD-SMOKE-002 fails them)
        (8, 5, "torchrun", 5),  # torchrun/spawn: LOCAL_RANK indexes the node's GPUs
        (8, 5, "srun", 5),  # srun --gres=gpu:8 without per-task binding: SLURM_LOCALID indexes them
        (2, 3, "srun", 1),  # --gpus-per-task=2: each task has its own pair; local rank 3 takes the 2nd of its pair
        (2, 3, "torchrun", None),  # torchrun ranks all see the same two: local rank 3 has none of its own
        (2, 3, "spawn", None),
        (0, 0, "srun", None),
    ],
)
def test_device_index_for(visible, local_rank, launcher, expected):
    assert device_index_for(visible, local_rank, launcher) == expected


def test_uuid_is_written_as_nvml_writes_it():
    # torch's _CUuuid prints 8-4-4-4-12 hex without a prefix; NVML and nvidia-smi say GPU-<uuid>.
    raw = "4a3e2c1b-0f1e-2d3c-4b5a-69788796a5b4"
    assert gpu_uuid_text(raw) == "GPU-" + raw
    assert gpu_uuid_text(raw, "MIG-9f1d2c3b-aaaa-bbbb-cccc-0123456789ab") == "MIG-" + raw
    assert gpu_uuid_text("GPU-" + raw) == "GPU-" + raw  # never doubled
    assert gpu_uuid_text(None) is None and gpu_uuid_text("") is None


def test_pci_address_is_nvml_form():
    assert pci_address(0, 0x18, 0) == "00000000:18:00.0"
    assert pci_address(0, 0x2A, 0) == "00000000:2A:00.0"
    assert pci_address(0, None, 0) is None


def gpu_join(rank, uuid=None, pci=None, host="n1"):
    return {
        "rank": rank,
        "local_rank": rank,
        "host": host,
        "device_type": "cuda",
        "device_index": 0,
        "device": "cuda:0",
        "gpu_uuid": uuid,
        "pci_bus_id": pci,
        "gpu_name": "NVIDIA H100 80GB HBM3",
        "visible_count": 1,
        "cuda_visible_devices": "0",
        "gpu_memory_bytes": 85 * 10**9,
        "bf16_native": True,
    }


def by_id(findings):
    return {f.id: f for f in findings}


def test_shared_gpu_found_by_pci_address_when_torch_has_no_uuid():
    joins = {0: gpu_join(0, pci="00000000:18:00.0"), 1: gpu_join(1, pci="00000000:18:00.0")}
    f = by_id(placement.check(joins))["GD-SMOKE-002"]
    assert f.severity is Severity.FAIL and "ranks 0, 1" in f.message


def test_same_pci_address_on_two_hosts_is_two_gpus():
    joins = {0: gpu_join(0, pci="00000000:18:00.0", host="a"), 1: gpu_join(1, pci="00000000:18:00.0", host="b")}
    assert by_id(placement.check(joins))["GD-SMOKE-002"].severity is Severity.PASS


def test_unknown_gpu_identity_is_not_a_pass():
    joins = {0: gpu_join(0), 1: gpu_join(1)}
    f = by_id(placement.check(joins))["GD-SMOKE-002"]
    assert f.severity is Severity.INFO and "cannot tell" in f.message


# -- spec peaks -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, tflops",
    [
        ("NVIDIA H100 80GB HBM3", 989.4),  # SXM5: 1979 sparse
        ("NVIDIA H100 PCIe", 756.5),  # 1513 sparse
        ("NVIDIA H100 NVL", 835.5),  # 1671 sparse
        ("NVIDIA H200", 989.4),
        ("NVIDIA H200 NVL", 835.5),
        ("NVIDIA A100 80GB PCIe", 312.0),
        ("NVIDIA L40", 181.05),
        ("NVIDIA GeForce RTX 3090", 71.0),  # fp32 accumulate, not the fp16-accumulate 142
        ("Tesla V100S-PCIE-32GB", 130.0),
    ],
)
def test_dense_peaks(name, tflops):
    assert peaks.lookup(name).tflops == tflops


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA GeForce RTX 4090 Laptop GPU",  # AD103 at laptop power: not a desktop 4090
        "NVIDIA GeForce RTX 4090 D",  # fewer SMs than the 4090
        "NVIDIA GeForce RTX 3090 Ti",  # more SMs and clock than the 3090
        "Quadro RTX 5000 with Max-Q Design",
        "NVIDIA GB200",  # not the HGX B200's 2250
        "NVIDIA H20",  # not an H200
    ],
)
def test_other_skus_get_no_borrowed_peak(name):
    assert peaks.lookup(name) is None


# -- the arithmetic of a GPU run --------------------------------------------------------------
def gpu_result(rank, step_s, matmul_tflops=700.0, allreduce_s=0.002, local_compute_s=None):
    falling = [10.4, 10.2, 9.9, 9.0, 8.0, 7.0]
    return {
        "rank": rank,
        "host": "n1",
        "local_rank": rank,
        "backend": "nccl",
        "warmup": 2,
        "losses": falling,
        "step_times": [step_s] * len(falling),
        "data_waits": [0.0] * len(falling),
        "local_compute_s": [step_s] * 3 if local_compute_s is None else local_compute_s,
        "matmul": {"n": 8192, "dtype": "bfloat16", "tflops": matmul_tflops},
        "first_allreduce_s": 0.5,
        "allreduce": {"payload_bytes": 256 << 20, "dtype": "bfloat16", "iterations": 20, "seconds": allreduce_s},
        "peak_memory": {
            "bytes": 50 << 30,
            "kind": "torch.cuda.max_memory_allocated",
            "reserved_bytes": 54 << 30,
            "device_total_bytes": 85 * 10**9,
        },
        "param_checksum": "same",
        "tokens_per_step": 8 * 2048,
        "samples_per_step": 8,
        "optimizer": "AdamW (fused)",
        "dataloader": {},
    }


def gpu_report(n_ranks, step_s, precision="auto", **result_kw):
    opts = SmokeOptions.of(device="cuda", precision=precision)
    joins = {r: gpu_join(r, uuid=f"GPU-{r}") for r in range(n_ranks)}
    plan = plan_run(joins, opts)
    results = {r: gpu_result(r, step_s, **result_kw) for r in range(n_ranks)}
    verdict = Verdict(True, [], joins, results, {}, plan)
    return report.build(
        verdict,
        opts,
        {"mode": "spawn", "world_size": n_ranks, "backend": "nccl", "reporter": {"role": "spawner", "pid": 1}},
        30.0,
    )


def test_mfu_against_the_h100_sxm_dense_peak():
    rep = gpu_report(8, step_s=0.3)
    cfg = rep["run"]["model"]
    per_step = metrics.flops_per_token(cfg["n_layer"], cfg["d_model"], cfg["seq_len"], cfg["vocab"]) * 8 * 2048
    achieved = per_step / 0.3 / 1e12
    assert rep["flops"]["achieved_tflops_total"] == pytest.approx(8 * achieved)
    assert rep["mfu"]["spec_peak_tflops_per_device"] == 989.4
    assert rep["mfu"]["vs_spec"] == pytest.approx(achieved / 989.4)
    assert rep["mfu"]["vs_measured_matmul"] == pytest.approx(achieved / 700.0)
    assert "H100 SXM dense bfloat16" in rep["mfu"]["spec_source"]


def test_gpu_memory_reports_allocated_and_reserved_peaks(capsys):
    rep = gpu_report(2, step_s=0.3)
    assert rep["memory"]["peak_bytes_max"] == 50 << 30 and rep["memory"]["reserved_peak_bytes_max"] == 54 << 30
    report.render_text(rep)
    assert "55,296 MiB reserved by the caching allocator" in capsys.readouterr().out


def test_busbw_of_eight_ranks():
    rep = gpu_report(8, step_s=0.3, allreduce_s=0.001)
    algbw = (256 << 20) / 0.001
    assert rep["allreduce"]["algbw_gbps"] == pytest.approx(algbw / 1e9)
    assert rep["allreduce"]["busbw_gbps"] == pytest.approx(algbw * 2 * 7 / 8 / 1e9)
    assert rep["allreduce"]["payload_bytes"] == 256 << 20 and rep["allreduce"]["dtype"] == "bfloat16"


def test_one_gpu_without_a_straggler_probe_is_judged_and_rendered(capsys):
    """One rank runs no straggler probe (nothing waits for it): its report has no stragglers section, and the rest
    stands (this crashed the report on a real H200 before the medians skipped what was not measured)."""
    import jsonschema

    rep = gpu_report(1, step_s=0.26, local_compute_s=[])
    assert rep["ok"] and rep["stragglers"] is None and rep["mfu"]["vs_spec"] is not None
    schema = json.loads((Path(__file__).resolve().parents[2] / "docs" / "smoke.schema.json").read_text())
    rep["run"]["timeout_s"] = 180.0  # the launcher sets it in a real run
    jsonschema.Draft202012Validator(schema).validate(json.loads(json.dumps(rep)))
    report.render_text(rep)
    assert "throughput" in capsys.readouterr().out


def test_fp32_run_is_not_measured_against_a_bf16_peak():
    rep = gpu_report(1, step_s=3.0, precision="fp32")
    assert rep["mfu"]["vs_spec"] is None and "fp32 run" in rep["mfu"]["vs_spec_missing_reason"]
    assert rep["mfu"]["vs_measured_matmul"] is not None


def test_attention_term_is_full_quadratic_attention_forward_and_backward():
    # Per layer and token: QK^T and AV are 2*S*d FLOPs each forward; backward doubles it: 3 * 4*S*d.
    L, d, S, V = 6, 4096, 2048, 32768
    assert metrics.flops_per_token(L, d, S, V) - 6 * metrics.matmul_params(L, d, V) == L * 3 * 4 * S * d
    assert "without halving for the causal mask" in metrics.FLOP_FORMULA


# -- the default model on an 80 GB GPU --------------------------------------------------------
def test_large_model_fits_an_80gb_gpu_and_feeds_its_tensor_cores():
    cfg = SIZES["large"]
    assert size_for_gpu(80 * 10**9, 989.4) == "large" and size_for_gpu(80 * 10**9, 312.0) == "large"
    assert cfg.d_model // cfg.n_head == 128 and cfg.d_model % 128 == 0
    params = metrics.matmul_params(cfg.n_layer, cfg.d_model, cfg.vocab) + cfg.seq_len * cfg.d_model
    states = 16 * params  # fp32 weights + fp32 grads (bucket views) + two fp32 AdamW moments
    tokens = cfg.batch_size * cfg.seq_len
    # saved activations per layer and token, bytes: fp32 residual x2, bf16 ln/qkv/attn/proj-in, fc and gelu outputs
    activations = 38 * cfg.d_model * tokens * cfg.n_layer
    logits = 10 * tokens * cfg.vocab  # at the loss: bf16 logits + their fp32 copy + the fp32 log-softmax
    assert states + activations + logits + 2 * params < 60 * 10**9  # 79 GiB usable on an H100 80GB
    assert (
        metrics.flops_per_token(cfg.n_layer, cfg.d_model, cfg.seq_len, cfg.vocab) * tokens < 200e12
    )  # ~0.3 s at 500 TF/s
