"""Model sizes for the smoke run, chosen from the device (no torch)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from gpudoctor.sample_train.judge.metrics import matmul_params


@dataclass(frozen=True)
class GPTConfig:
    name: str
    vocab: int
    d_model: int
    n_layer: int
    n_head: int
    seq_len: int
    batch_size: int  # per rank, unless the user's dataloader settings say otherwise
    steps: int
    warmup: int  # steps left out of the timing statistics
    lr: float

    def to_dict(self) -> dict:
        d = asdict(self)
        d["params_matmul"] = matmul_params(self.n_layer, self.d_model, self.vocab)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> GPTConfig:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


# 'tiny' keeps a 2-core CPU test to seconds. 'large' is for 80 GB GPUs of 300+ TFLOP/s (A100 80GB,
# H100, H200, B200): 16k tokens per step through matmuls of width 4096 (inner sizes 4096..16384).
# Width, not depth, is what raises MFU in eager mode: a layer's matmul FLOPs grow with d^2 but its
# elementwise traffic (layer norms, GELU, fp32 residual adds, casts) only with d. Estimated on an
# H100 SXM: d=2048 spends ~30% of the step outside matmuls and lands near the 45% MFU
# target; d=4096 ~20%, about 50% (estimates from FLOPs and memory traffic, not yet measured).
# Memory ~45 GB of 80: 1.35G parameters x 16 bytes (fp32 weights, grads as DDP bucket views, two
# AdamW moments) = 21.6 GB, activations 38 bytes x d per token and layer = 15.3 GB, ~5.4 GB at the
# loss (bf16 logits, fp32 copy, log-softmax), 2.7 GB of bf16 weight copies under autocast. Step
# ~0.26 s on an H200: 24 steps (6 of warm-up, 18 timed) ~6.5 s, which keeps the whole default run within
# 20 s (issue 28; docs/benchmarks.md has the phases). lr is halved with the width (a layer's output moves with lr x d).
# Widths and vocab are multiples of 128; head size 128 (flash attention's fast path).
SIZES = {
    "tiny": GPTConfig("tiny", 128, 64, 2, 4, 64, 8, 30, 5, 3e-3),
    "small": GPTConfig("small", 32768, 768, 6, 12, 1024, 8, 40, 10, 1e-3),
    "medium": GPTConfig("medium", 32768, 1024, 12, 16, 2048, 8, 40, 10, 1e-3),
    "large": GPTConfig("large", 32768, 4096, 6, 32, 2048, 8, 24, 6, 3e-4),
}
MIN_MEASURED_STEPS = 3
# What the small model needs on one GPU, estimated as the large one is above: 68M matmul parameters x 18 bytes
# (fp32 weights, grads, AdamW moments, bf16 copies) 1.2 GB, activations 38 x d x 8192 tokens x 6 layers 1.4 GB,
# the loss (8192 x 32768 logits, ~10 bytes each) 2.7 GB, and the benchmarks' buffers (~1.5 GB).
SMALL_MIN_GIB = 6
# --quick: enough steps for the loss to fall measurably (GD-SMOKE-006) and 7 timed ones; the small model on a GPU
# (its DDP broadcast and first steps take a fraction of a second where the large one's take seconds).
QUICK_STEPS, QUICK_WARMUP = 10, 3


def size_for_gpu(memory_bytes: int | None, spec_tflops: float | None, floor: bool = False) -> str | None:
    """large on 80 GB-class GPUs with >= 300 TFLOP/s, medium from 20 GB, small below. floor: None below what the
    small model needs (the memory is then the free memory, not the total: sample_train/judge/fit.py)."""
    gib = (memory_bytes or 0) / 2**30
    if gib >= 70 and (spec_tflops is None or spec_tflops >= 300):
        return "large"
    if gib >= 20:
        return "medium"
    if floor and gib < SMALL_MIN_GIB:
        return None
    return "small"
