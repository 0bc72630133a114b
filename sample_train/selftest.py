"""Does this rank's device compute right? The smoke run's correctness tests, run by each rank (torch).

A GPU can be fast and wrong (a bad SM, a weak HBM stack): training then diverges or turns to NaN days later.
DCGM's diagnostic, gpu-burn and nccl-tests' `-c` compare results for this reason. Each rank runs:

- a chain of matmuls (bf16 and fp32) on fixed data, and one SGD training step of a small MLP on fixed
  input: their bits are fingerprinted here and compared across ranks of the same kind by the pure judge
  (correctness.py). cuBLAS promises bit-wise identical results on every run on GPUs of the same architecture
  and SM count with one toolkit version (cuBLAS docs, "Results reproducibility"); the MLP step uses only
  matmuls, elementwise ops and sums (no atomics: an embedding's or attention's backward would vary run to run);
- a small matmul against float64 on the CPU: its normwise relative error against the rounding error it may have;
- a device memory pattern test over a bounded share of the free memory (two bit patterns and each word's own
  index, as memtest's "own address" test), counting the words that read back wrong.

Faults for tests only: GPUDOCTOR_SMOKE_FAULT="rank=N,at=selftest,do=corrupt" perturbs one value of that rank's
chain, "at=memory,do=corrupt" one word of its memory test (faults.py).
"""

from __future__ import annotations

import hashlib
import math
import time

import torch

from gpudoctor.sample_train import faults

SEED = 20261126
CHAIN_STEPS = 8
REFERENCE_N = {"cuda": 256, "cpu": 128}
CHAIN_N = {"cuda": 2048, "cpu": 128}
# The memory test's share of the free device memory, and its ceiling: a few hundred ms at HBM speed.
MEMORY_SHARE, MEMORY_MAX_BYTES = 0.05, 2 << 30
MEMORY_CPU_BYTES = 4 << 20
CHUNK_BYTES = {"cuda": 1 << 26, "cpu": 1 << 20}
PATTERNS = (0x55, 0xAA)


def fingerprint(named: list[tuple[str, torch.Tensor]]) -> str:
    """An exact fingerprint of the tensors' bits, computed where they live: integer sums of the 16-bit halves
    of each value's bit pattern, plain and position-weighted (order-independent, so reduction order cannot make
    equal tensors look different)."""
    digest = hashlib.sha256()
    chunk = 1 << 24
    for name, t in named:
        flat = t.detach().reshape(-1)
        bits = flat.view(torch.int32) if flat.element_size() == 4 else flat.view(torch.int16).to(torch.int32)
        sums = [0, 0, 0, 0]
        for start in range(0, bits.numel(), chunk):
            b = bits[start : start + chunk].to(torch.int64)
            w = torch.arange(start, start + b.numel(), device=b.device) % 251 + 1
            lo, hi = b & 0xFFFF, (b >> 16) & 0xFFFF
            part = torch.stack([lo.sum(), hi.sum(), (lo * w).sum(), (hi * w).sum()]).tolist()
            sums = [s + q for s, q in zip(sums, part, strict=True)]
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)}:{sums};".encode())
    return digest.hexdigest()[:16]


def _fixed(shape: tuple[int, ...], salt: int) -> torch.Tensor:
    """The same values on every rank: drawn on the CPU from a fixed seed (device generators differ by model)."""
    gen = torch.Generator().manual_seed(SEED + salt)
    return torch.randn(*shape, generator=gen, dtype=torch.float32)


class _HighestFp32:
    """fp32 matmuls in full fp32 (no TF32) while the test runs; the user's setting is put back."""

    def __enter__(self) -> None:
        self.before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")

    def __exit__(self, *exc) -> None:
        torch.set_float32_matmul_precision(self.before)


def chain(device: torch.device, dtype: torch.dtype, n: int, corrupt: bool = False) -> str:
    """CHAIN_STEPS products x <- tanh(x @ w / sqrt(n)) on fixed data; the fingerprint of the result."""
    x = _fixed((n, n), 1).to(device=device, dtype=dtype)
    w = _fixed((n, n), 2).to(device=device, dtype=dtype)
    if corrupt:
        x[n // 2, n // 3] += 1.0  # as one wrong value from a bad SM would
    scale = 1.0 / math.sqrt(n)
    for _ in range(CHAIN_STEPS):
        x = torch.tanh(torch.mm(x, w) * scale)
    return fingerprint([("chain", x)])


def reference_error(device: torch.device, dtype: torch.dtype, n: int) -> dict:
    """A matmul on the device against the same product in float64 on the CPU, from the same (rounded) inputs.
    Normwise relative error ||C - C64|| / ||C64||, and its tolerance: 10 x sqrt(n) x the unit roundoff of the
    product's accumulation (fp32: 2^-24), plus the output's own rounding (bf16: 2^-8)."""
    a, b = _fixed((n, n), 3).to(dtype), _fixed((n, n), 4).to(dtype)
    exact = a.double() @ b.double()
    got = torch.mm(a.to(device), b.to(device)).double().cpu()
    error = float(torch.linalg.norm(got - exact) / torch.linalg.norm(exact))
    output_rounding = {torch.float32: 0.0, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[dtype]
    tolerance = 10 * (math.sqrt(n) * 2.0**-24 + output_rounding)
    return {"n": n, "dtype": str(dtype).replace("torch.", ""), "rel_error": error, "tolerance": tolerance}


def train_step(device: torch.device) -> str:
    """One SGD step of a small MLP on fixed input (fp32); the fingerprint of the loss and the new weights."""
    torch.manual_seed(SEED)
    d = 256
    model = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.copy_(_fixed(tuple(p.shape), 10 + i) * 0.05)
    model.to(device)
    x, y = _fixed((64, d), 30).to(device), _fixed((64, d), 31).to(device)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    with torch.no_grad():  # plain SGD: torch.optim's first step imports for seconds and adds nothing here
        for p in model.parameters():
            assert p.grad is not None  # every parameter is in the loss
            p.add_(p.grad, alpha=-0.1)
    return fingerprint([("loss", loss.detach().reshape(1)), *((f"p{i}", p) for i, p in enumerate(model.parameters()))])


def memory_pattern(device: torch.device, corrupt: bool = False) -> dict:
    """Write and read back two bit patterns and each 32-bit word's own index over a bounded buffer, compared in
    chunks (a full-size comparison would need as much memory again)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        chunk = CHUNK_BYTES["cuda"]
        nbytes = int(min(MEMORY_MAX_BYTES, free * MEMORY_SHARE)) // chunk * chunk
    else:
        free, nbytes, chunk = None, MEMORY_CPU_BYTES, CHUNK_BYTES["cpu"]
    if nbytes < chunk:
        return {"bytes": 0, "errors": None, "free_bytes": free, "reason": "too little free device memory to test"}
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
    chunks = range(0, nbytes, chunk)
    errors = 0
    for value in PATTERNS:
        buf.fill_(value)
        if corrupt:
            buf[nbytes // 2] ^= 0x01
        errors += sum(int((buf[i : i + chunk] != value).sum()) for i in chunks)
    words = buf.view(torch.int32)
    per_chunk = chunk // 4
    for start in range(0, words.numel(), per_chunk):  # each word's own index (memtest's "own address")
        torch.arange(start, start + per_chunk, dtype=torch.int32, device=device, out=words[start : start + per_chunk])
    for start in range(0, words.numel(), per_chunk):
        index = torch.arange(start, start + per_chunk, dtype=torch.int32, device=device)
        errors += int((words[start : start + per_chunk] != index).sum())
    del buf, words
    return {"bytes": nbytes, "errors": errors, "free_bytes": free, "patterns": len(PATTERNS) + 1}


def run(device: torch.device, rank: int) -> dict:
    """Every test on this rank's device; seconds taken. A test that cannot run records its error, never raises."""
    start = time.perf_counter()
    kind = device.type
    out: dict = {"chain_steps": CHAIN_STEPS, "chain_n": CHAIN_N[kind]}
    corrupt = faults.corrupts(rank, "selftest")
    with _HighestFp32():
        for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
            out[f"chain_{name}"] = _guarded(lambda dtype=dtype: chain(device, dtype, CHAIN_N[kind], corrupt))
        out["train_step"] = _guarded(lambda: train_step(device))
        out["reference"] = [
            _guarded(lambda dtype=dtype: reference_error(device, dtype, REFERENCE_N[kind]))
            for dtype in (torch.float32, torch.bfloat16)
        ]
    out["memory"] = _guarded(lambda: memory_pattern(device, faults.corrupts(rank, "memory")))
    if kind == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    out["seconds"] = round(time.perf_counter() - start, 4)
    return out


def _guarded(test):
    try:
        return test()
    except Exception as e:  # an out-of-memory or a kernel the device lacks: the test says so, the run goes on
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]}
