"""precision checks: do the GPUs run bf16 natively, and will fp32 matmuls use TF32."""

from __future__ import annotations

from typing import Any

from gpudoctor import versions
from gpudoctor.job.env import job_env
from gpudoctor.job.gpus import describe_groups, gpu_capabilities
from gpudoctor.model import Action, ActionKind, Fix, Safety, fail, info, manual, passed, skip, unset_env, warn
from gpudoctor.registry import check

AMPERE = (8, 0)  # first compute capability with bf16 and TF32 tensor cores
VOLTA = (7, 0)  # first with fp16 tensor cores

# Config keys that name the training precision (Lightning, HF Trainer, Accelerate, DeepSpeed, plain scripts).
PRECISION_KEYS = ("precision", "mixed_precision", "amp_dtype", "bf16", "fp16")


def _precision_value(key: str, value) -> str | None:
    """'bf16', 'fp16' or 'fp32' from one config entry, None if it says nothing."""
    if isinstance(value, dict):  # DeepSpeed: {"bf16": {"enabled": true}}
        value = value.get("enabled")
    if key in ("bf16", "fp16"):
        return key if value is True or str(value).lower() in ("true", "1", "yes") else None
    text = str(value).lower()
    if "bf16" in text or "bfloat16" in text:
        return "bf16"
    if text in ("16", "16-mixed", "16-true", "fp16", "float16", "half"):
        return "fp16"
    if text in ("32", "32-true", "fp32", "float32", "no", "none"):
        return "fp32"
    return None


def configured_precision(config) -> tuple[str, str] | None:
    """(precision, dotted key) the training config asks for, searching nested mappings."""
    if not isinstance(config, dict):
        return None
    for key, value in config.items():
        if str(key).lower() in PRECISION_KEYS:
            found = _precision_value(str(key).lower(), value)
            if found:
                return found, str(key)
    for key, value in config.items():
        if isinstance(value, dict):
            nested = configured_precision(value)
            if nested:
                return nested[0], f"{key}.{nested[1]}"
    return None


def _by_gpu(gpus: dict) -> dict[int, str]:
    """{index: 'Tesla V100 (7.0)'}: each GPU's model and compute capability, for the evidence."""
    return {i: f"{n} ({versions.fmt(cc)})" for i, (n, cc) in gpus.items()}


def _before_ampere(gpus: dict) -> dict:
    """The GPUs without bf16 and TF32 tensor cores (compute capability below 8.0)."""
    return {i: g for i, g in gpus.items() if g[1] < AMPERE}


def _describe(gpus: dict) -> str:
    groups: dict[tuple, list[int]] = {}
    for idx, (name, cc) in gpus.items():
        groups.setdefault((name, cc), []).append(idx)
    return describe_groups(groups)


@check(
    id="GD-PREC-001",
    name="bf16-not-native",
    category="precision",
    title="GPUs run bf16 natively",
    needs=["nvidia", "torch"],
    what="Compares each GPU's compute capability with 8.0 (Ampere), the first with bf16 tensor cores, "
    "and reads torch.cuda.is_bf16_supported(including_emulation=False) where torch could tell.",
    why="Below compute capability 8.0 (V100, T4, RTX 20xx) torch emulates bf16 through fp32: a bf16 "
    "job runs without an error but slower than fp16, often slower than fp32, and torch.compile cannot "
    "generate bf16 Triton kernels for these GPUs. torch.cuda.is_bf16_supported() without "
    "including_emulation=False says True there.",
    fix="On compute capability 7.x, train with fp16 autocast and a gradient scaler "
    "(torch.autocast('cuda', dtype=torch.float16) with torch.amp.GradScaler('cuda'); Lightning: "
    "precision='16-mixed'). Below 7.0 there are no tensor cores: fp32 is usually as fast.",
)
def bf16_not_native(facts, ctx):
    gpus = gpu_capabilities(facts)
    if not gpus:
        return skip("no NVIDIA GPU visible: nothing to judge (see GD-DRV-001)")
    t = facts.torch
    torch_says = t.get("bf16_supported") if t.get("status") == "ok" else None
    old = _before_ampere(gpus)
    configured = configured_precision(ctx.config)
    evidence: dict[str, Any] = {
        "gpus": _by_gpu(gpus),
        "torch_bf16_supported": torch_says,
    }
    if configured:
        evidence["config_precision"] = f"{configured[1]}: {configured[0]}"
    if not old and torch_says is not False:
        return passed(f"bf16 is native on all {len(gpus)} GPU(s) (compute capability 8.0 or newer)", **evidence)
    if not old:
        return warn(
            f"torch {t.get('version')} (CUDA {t.get('cuda')}) reports no native bf16 on these GPUs "
            "(is_bf16_supported(including_emulation=False) is False) although their compute capability is 8.0+",
            manual("Use a torch build for CUDA 11 or newer", "python -c 'import torch; print(torch.version.cuda)'"),
            **evidence,
        )
    if configured and configured[0] != "bf16":
        return info(
            f"{_describe(old)}: no native bf16, and the config uses "
            f"{configured[0]} ({configured[1]}), which suits them",
            **evidence,
        )
    no_tensor_cores = any(cc < VOLTA for _, cc in old.values())
    alternative = "fp16 autocast with torch.amp.GradScaler (fp16 tensor cores from 7.0)" + (
        "; below 7.0 there are no tensor cores, so plain fp32 is usually as fast" if no_tensor_cores else ""
    )
    asked = f" the config asks for bf16 ({configured[1]});" if configured else ""
    return warn(
        f"{_describe(old)}: no native bf16 (needs compute capability 8.0);{asked} "
        "torch emulates it, so a bf16 job runs without error but slower than fp16, "
        f"and torch.compile cannot build bf16 kernels for them; use {alternative}",
        manual(
            "Train in fp16 with a gradient scaler on these GPUs "
            "(Lightning: precision='16-mixed'; HF Trainer: fp16=True)",
            "torch.autocast('cuda', dtype=torch.float16)  +  scaler = torch.amp.GradScaler('cuda')",
        ),
        **evidence,
    )


@check(
    id="GD-PREC-002",
    name="tf32-unavailable-or-off",
    category="precision",
    title="fp32 matmuls can use TF32 tensor cores",
    needs=["nvidia", "torch", "env"],
    what="Checks that the GPUs have TF32 (compute capability 8.0+), that NVIDIA_TF32_OVERRIDE=0 does not "
    "switch it off, and reads torch.get_float32_matmul_precision() in a fresh process.",
    why="TF32 runs fp32 matmuls and convolutions on tensor cores (several times faster on A100/H100). "
    "torch uses it for convolutions by default, but since 1.12 not for fp32 matmuls (precision "
    "'highest') unless the script asks; NVIDIA_TF32_OVERRIDE=0 disables it in cuBLAS and cuDNN "
    "whatever torch says. Work inside bf16/fp16 autocast is not affected.",
    fix="Call torch.set_float32_matmul_precision('high') in the training script (or set "
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1), if TF32's 10-bit mantissa is acceptable for the model; unset "
    "NVIDIA_TF32_OVERRIDE.",
)
def tf32_unavailable_or_off(facts, ctx):
    gpus = gpu_capabilities(facts)
    if not gpus:
        return skip("no NVIDIA GPU visible: nothing to judge (see GD-DRV-001)")
    t = facts.torch
    precision = t.get("float32_matmul_precision") if t.get("status") == "ok" else None
    old = _before_ampere(gpus)
    evidence: dict[str, Any] = {
        "gpus": _by_gpu(gpus),
        "float32_matmul_precision": precision,
        "NVIDIA_TF32_OVERRIDE": job_env(facts, ctx).get("NVIDIA_TF32_OVERRIDE"),
    }
    if old:
        return info(
            f"{_describe(old)}: no TF32 (needs compute capability 8.0), so fp32 matmuls and convolutions run at plain "
            "fp32 speed there; fp16 autocast is what uses their tensor cores",
            **evidence,
        )
    if job_env(facts, ctx).get("NVIDIA_TF32_OVERRIDE", "").strip() == "0":
        return warn(
            "NVIDIA_TF32_OVERRIDE=0 disables TF32 in cuBLAS and cuDNN for the whole process, whatever torch is told: "
            "fp32 matmuls and convolutions run at plain fp32 speed",
            unset_env("NVIDIA_TF32_OVERRIDE"),
            **evidence,
        )
    if precision in ("high", "medium"):
        return passed(
            f"TF32 available on the {len(gpus)} GPU(s) and enabled for "
            f"fp32 matmuls (float32 matmul precision '{precision}')",
            **evidence,
        )
    shown = f"'{precision}'" if precision else "'highest', the default since torch 1.12"
    return info(
        f"the {len(gpus)} GPU(s) have TF32, but fp32 matmuls do not use it unless the script enables it (float32 "
        f"matmul precision {shown}; convolutions do use it). bf16/fp16 autocast work is unaffected; for fp32 work, "
        "torch.set_float32_matmul_precision('high') is several times faster",
        Fix(
            "Enable TF32 for fp32 matmuls (changes numerics: 10-bit mantissa)",
            Safety.UNSAFE,
            (Action(ActionKind.SET_ENV, "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "1"),),
        ),
        **evidence,
    )


# ---------------------------------------------------------------- GD-PREC-003 (issue 13)

TF32_KEYS = ("tf32", "allow_tf32", "enable_tf32", "use_tf32")
MATMUL_PRECISION_KEYS = ("float32_matmul_precision", "matmul_precision")


def requested_tf32(config, path: str = "", depth: int = 0) -> tuple[str, str] | None:
    """(dotted key, value) of the first config entry that asks for TF32, searching nested mappings."""
    if not isinstance(config, dict) or depth > 20:
        return None
    for key, value in config.items():
        name = str(key).lower()
        dotted = f"{path}{key}"
        if name in TF32_KEYS and (value is True or str(value).lower() in ("true", "1", "yes")):
            return dotted, str(value)
        if name in MATMUL_PRECISION_KEYS and str(value).lower() in ("high", "medium"):
            return dotted, str(value)
    for key, value in config.items():
        found = requested_tf32(value, f"{path}{key}.", depth + 1)
        if found:
            return found
    return None


@check(
    id="GD-PREC-003",
    name="tf32-requested-on-pre-ampere",
    category="precision",
    title="The config does not ask for TF32 on GPUs without it",
    needs=["nvidia", "torch"],
    requires=["gpus-expected"],
    what="Finds TF32 requests in the training config (Hugging Face `tf32: true`, `allow_tf32`, "
    "`float32_matmul_precision: high|medium`) and compares them with the GPUs' compute capability (TF32 needs 8.0).",
    why="Hugging Face TrainingArguments raises 'ValueError: --tf32 requires Ampere or a newer GPU arch, cuda>=11 and "
    "torch>=1.7' on a V100 or T4, so the job dies before training; elsewhere the request is silently ignored and fp32 "
    "runs at plain fp32 speed - the speed-up the config was written for never comes.",
    fix="Remove the TF32 setting for pre-Ampere GPUs (tf32: false), or run on Ampere or newer; use fp16 autocast "
    "for tensor cores on Volta/Turing.",
)
def tf32_requested_on_pre_ampere(facts, ctx):
    if not ctx.config:
        return skip("no training config (--config) to read a TF32 setting from")
    found = requested_tf32(ctx.config)
    gpus = gpu_capabilities(facts)
    if not found:
        return passed("the config asks for no TF32")
    key, value = found
    evidence: dict[str, Any] = {
        "setting": f"{key}={value}",
        "gpus": _by_gpu(gpus),
    }
    if not gpus:
        return skip("no NVIDIA GPU visible to compare with (see GD-DRV-001)", **evidence)
    old = _before_ampere(gpus)
    if not old:
        return passed(f"{key}={value}: every GPU has TF32 (compute capability 8.0+)", **evidence)
    fix = (
        Fix(
            f"Turn {key} off for these GPUs", Safety.UNSAFE, (Action(ActionKind.YAML_SET, ctx.config_path, False, key),)
        )
        if ctx.config_path and key.rsplit(".", 1)[-1].lower() in TF32_KEYS
        else None
    )
    if key.rsplit(".", 1)[-1].lower() == "tf32":
        return fail(
            f"{key}={value} on {_describe(old)} (no TF32 before compute capability 8.0): Hugging Face's "
            "TrainingArguments raises 'ValueError: --tf32 requires Ampere or a newer GPU arch'",
            fix,
            **evidence,
        )
    return warn(
        f"{key}={value} on {_describe(old)}: these GPUs have no TF32, the setting is silently ignored and fp32 "
        "runs at plain fp32 speed",
        fix,
        **evidence,
    )
