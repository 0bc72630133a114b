"""The reference table: what each GPU model's datasheet promises, what a healthy one is published
to reach, and how a device is told apart by its NVML/torch name, memory and power limit
(documented in docs/gpu_peaks.md; a test keeps that table and this one equal).

Units: TFLOP/s for `gemm` (dense tensor-core, no 2:4 sparsity: datasheets print the sparse
figure with an asterisk, we halve it), GB/s (10**9 bytes/s) for everything else, W for power,
GB as the datasheet prints it for memory (NVIDIA's "80GB" is 80 GiB of HBM less what ECC and
the driver reserve). The precision of `tflops` is the one the smoke run trains in: bf16 where
the GPU has bf16 tensor cores, fp16 (fp32 accumulate) on Volta and Turing, which have none.

Expectations (`expectation()`) are floors below which a device is *clearly* unhealthy, not
targets: a published healthy figure times MARGIN. No GPU was available to this project when the
table was written, so every fraction comes from someone else's published measurement, named in
the row; `measured_here` is kept for the figures this project measures itself later.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from gpudoctor.units import GIB

FIGURES = ("gemm", "memory_bandwidth", "h2d", "d2h")
UNITS = {"gemm": "TFLOP/s", "memory_bandwidth": "GB/s", "h2d": "GB/s", "d2h": "GB/s"}
# A published healthy figure times this is the floor: the run's own measurement is brief and
# goes through torch (no locked clocks, no tuned shapes), and a false alarm costs trust.
MARGIN = 0.7

_PCIE_GT_S = {3: 8.0, 4: 16.0, 5: 32.0}  # PCIe 3.0+ encode 128b/130b


def pcie_gbs(gen: int, lanes: int = 16) -> float:
    """Theoretical PCIe bandwidth per direction in GB/s: GT/s x lanes x 128/130 / 8 (15.75 for
    3.0 x16, 31.5 for 4.0 x16, 63.0 for 5.0 x16; datasheets print twice it, both directions)."""
    return round(_PCIE_GT_S[gen] * lanes * 128 / 130 / 8, 2)


@dataclass(frozen=True)
class Published:
    """What a healthy device of this model was published to reach on one figure."""

    figure: str  # one of FIGURES
    value: float  # in the figure's unit
    source: str
    floor: bool = False  # a fleet's pass threshold (healthy devices reach more), not a measurement


@dataclass(frozen=True)
class Reference:
    model: str  # the GPU as the table names it
    dtype: str  # bfloat16 | float16: the precision of `tflops`
    tflops: float  # dense tensor-core TFLOP/s
    memory_gb: tuple[float, ...]  # the sizes this model ships in, as the datasheet prints them
    memory_bandwidth_gbs: float
    host_link: str  # "PCIe 5.0 x16", "NVLink-C2C"
    host_link_gbs: float  # theoretical, per direction
    nvlink_gbs: float | None  # per GPU, both directions summed as datasheets print it; None: none
    power_w: float  # TDP: the board's maximum power limit
    source: str  # the datasheet/whitepaper every figure above is from, with the tflops derivation
    family: str  # regex on the normalised name: which family the device is
    marker: str | None = None  # regex: the name says it is this row (SXM, PCIE, NVL)
    bare_name: bool = False  # the row a name without any marker is, when memory and power do not say
    published: tuple[Published, ...] = ()
    measured_here: tuple[tuple[str, float], ...] = ()  # (figure, value) measured by this project

    def datasheet(self, figure: str) -> float:
        if figure == "gemm":
            return self.tflops
        if figure == "memory_bandwidth":
            return self.memory_bandwidth_gbs
        if figure in ("h2d", "d2h"):
            return self.host_link_gbs
        raise ValueError(f"unknown figure {figure!r}: one of {', '.join(FIGURES)}")

    def published_for(self, figure: str) -> Published | None:
        return next((p for p in self.published if p.figure == figure), None)


@dataclass(frozen=True)
class Expected:
    """The floor a healthy device reaches on one figure, and where it comes from."""

    figure: str
    value: float  # in `unit`
    unit: str
    fraction: float  # of the datasheet figure
    basis: str  # "H100 SXM datasheet 3350 GB/s x 0.56 (...)"
    published: bool  # True: from a published measurement of this model; False: datasheet only
    measured_here: float | None = None


# -- sources ---------------------------------------------------------------------------------
_H100 = "NVIDIA H100 Tensor Core GPU datasheet (2023)"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (2024)"
_GH200 = "NVIDIA GH200 Grace Hopper Superchip datasheet (2023)"
_B200 = "NVIDIA DGX B200 datasheet (8 GPUs: 72 PFLOPS bf16 sparse, 1440 GB, 64 TB/s)"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet (2021)"
_V100 = "NVIDIA V100 Tensor Core GPU datasheet (2020)"
_T4 = "NVIDIA T4 Tensor Core GPU datasheet"
_L40S = "NVIDIA L40S datasheet"
_L40 = "NVIDIA L40 datasheet"
_L4 = "NVIDIA L4 Tensor Core GPU datasheet"
_A10 = "NVIDIA A10 Tensor Core GPU datasheet"
_ADA = "NVIDIA Ada GPU architecture whitepaper v2.1, table 2 (GeForce RTX 4090)"
_GA102 = "NVIDIA Ampere GA102 GPU architecture whitepaper v2.1, table 1 (GeForce RTX 3090)"

# Published measurements, quoted where they are cited in docs/gpu_peaks.md.
_MAMF = "stas00/ml-engineering compute/accelerator/README.md, Maximum Achievable Matmul FLOPS table (bf16)"
_MAG = "mag-/gpu_benchmark README, mamf-finder results (bf16)"
_STREAM = "te42kyfo/gpu-benches gpu-stream"
_AZ = "Azure/azurehpc-health-checks conf"


def _gemm(value: float, source: str) -> Published:
    return Published("gemm", value, source)


def _copy(value: float, source: str) -> Published:
    return Published("memory_bandwidth", value, source)


def _host(value: float, source: str) -> tuple[Published, Published]:
    """A fleet's pass threshold for nvbandwidth's host_to_device/device_to_host_memcpy_ce (Azure's
    check_gpu_bw / check_cuda_bw use one value for both directions)."""
    return Published("h2d", value, source, floor=True), Published("d2h", value, source, floor=True)


_H100_FAMILY = r"\bH100\b"
_H200_FAMILY = r"\bH200\b"
_A100_FAMILY = r"\bA100\b"
_V100_FAMILY = r"\bV100\b"
_SXM = r"\bSXM\d?\b"
_PCIE = r"\bPCIE\b"
_NVL = r"\bNVL\b"

# Order matters between families only: the first family whose regex matches the name is the
# device's; within a family the name, memory and power choose the row (identify()).
_TABLE: tuple[Reference, ...] = (
    Reference(
        "B200",
        "bfloat16",
        2250.0,
        (180,),
        8000.0,
        "PCIe 5.0 x16",
        pcie_gbs(5),
        1800.0,
        1000.0,
        f"{_B200}; per GPU: 4.5 PFLOPS bf16 sparse / 2, 8 TB/s, NVLink 5 1.8 TB/s, 1000 W (HGX B200)",
        r"\bB200\b",
        published=(_gemm(1745.0, f"{_MAMF}: B200 SXM 1745 TFLOPS"),),
    ),
    Reference(
        "GH200 96GB",
        "bfloat16",
        989.4,
        (96,),
        4000.0,
        "NVLink-C2C",
        450.0,
        900.0,
        1000.0,
        f"{_GH200}: 1979 bf16 sparse / 2, 96 GB HBM3 4 TB/s, NVLink-C2C 900 GB/s both directions, "
        "module 450-1000 W (CPU and memory included)",
        r"\bGH200\b",
        marker=r"\b480GB\b",
        published=(_gemm(852.5, f"{_MAG}: GH200 96GB 852.5 TFLOPS"),),
    ),
    Reference(
        "GH200 144GB",
        "bfloat16",
        989.4,
        (144,),
        4900.0,
        "NVLink-C2C",
        450.0,
        900.0,
        1000.0,
        f"{_GH200}: 1979 bf16 sparse / 2, 144 GB HBM3e 4.9 TB/s, NVLink-C2C 900 GB/s both directions, "
        "module 450-1000 W",
        r"\bGH200\b",
        marker=r"\bHBM3E\b",
        published=(_gemm(828.6, f"{_MAMF}: GH200 SXM 141GiB HBM3e 900W 828.6 TFLOPS"),),
    ),
    Reference(
        "H200 SXM",
        "bfloat16",
        989.4,
        (141,),
        4800.0,
        "PCIe 5.0 x16",
        pcie_gbs(5),
        900.0,
        700.0,
        f"{_H200}: 1979 bf16 sparse / 2, 141 GB 4.8 TB/s, NVLink 900 GB/s, PCIe Gen5 128 GB/s, up to 700 W",
        _H200_FAMILY,
        marker=_SXM,
        bare_name=True,
        published=(
            _gemm(794.5, f"{_MAMF}: H100 SXM 794.5 TFLOPS, 'H200 is the same'"),
            _copy(3165.0, f"{_STREAM}/h200.txt: scale kernel (1 read + 1 write stream) 3165 GB/s"),
            *_host(48.0, f"{_AZ}/nd96isr_h200_v5.conf: check_gpu_bw 48 (ND H200 v5)"),
        ),
    ),
    Reference(
        "H200 NVL",
        "bfloat16",
        835.5,
        (141,),
        4800.0,
        "PCIe 5.0 x16",
        pcie_gbs(5),
        900.0,
        600.0,
        f"{_H200}: 1671 bf16 sparse / 2, 141 GB 4.8 TB/s, NVLink bridge 900 GB/s, PCIe Gen5 128 GB/s, up to 600 W",
        _H200_FAMILY,
        marker=_NVL,
        published=(_copy(3165.0, f"{_STREAM}/h200.txt: scale kernel 3165 GB/s (form factor not stated; same HBM3e)"),),
    ),
    Reference(
        "H100 SXM",
        "bfloat16",
        989.4,
        (80,),
        3350.0,
        "PCIe 5.0 x16",
        pcie_gbs(5),
        900.0,
        700.0,
        f"{_H100}: 1979 bf16 sparse / 2, 80 GB 3.35 TB/s, NVLink 900 GB/s, PCIe Gen5 128 GB/s, up to 700 W",
        _H100_FAMILY,
        marker=rf"{_SXM}|\bHBM3\b",  # 'NVIDIA H100 80GB HBM3' is the SXM5 board
        published=(
            _gemm(794.5, f"{_MAMF}: H100 SXM 794.5 TFLOPS"),
            *_host(52.0, f"{_AZ}/nd96isr_h100_v5.conf: check_cuda_bw 52 (ND H100 v5)"),
        ),
    ),
    Reference(
        "H100 PCIe",
        "bfloat16",
        756.5,
        (80,),
        2000.0,
        "PCIe 5.0 x16",
        pcie_gbs(5),
        600.0,
        350.0,
        f"{_H100}: 1513 bf16 sparse / 2, 80 GB 2 TB/s, NVLink bridge 600 GB/s, PCIe Gen5 128 GB/s, 300-350 W",
        _H100_FAMILY,
        marker=_PCIE,
        published=(_gemm(499.5, f"{_MAG}: H100 PCIe 499.5 TFLOPS"),),
    ),
    Reference(
        "H100 NVL",
        "bfloat16",
        835.5,
        (94,),
        3900.0,
        "PCIe 5.0 x16",
        pcie_gbs(5),
        600.0,
        400.0,
        f"{_H100}: 1671 bf16 sparse / 2, 94 GB 3.9 TB/s, NVLink bridge 600 GB/s, PCIe Gen5 128 GB/s, 350-400 W",
        _H100_FAMILY,
        marker=_NVL,
        published=(
            _gemm(488.5, f"{_MAG}: H100 NVL 488.5 TFLOPS"),
            *_host(52.0, f"{_AZ}/nc40ads_h100_v5.conf: check_cuda_bw 52 (NCads H100 v5, H100 NVL)"),
        ),
    ),
    Reference(
        "A100 SXM4 40GB",
        "bfloat16",
        312.0,
        (40,),
        1555.0,
        "PCIe 4.0 x16",
        pcie_gbs(4),
        600.0,
        400.0,
        f"{_A100}: 624 bf16 sparse / 2, 40 GB HBM2 1555 GB/s, NVLink 600 GB/s, PCIe Gen4 64 GB/s, 400 W",
        _A100_FAMILY,
        marker=_SXM,
        published=(
            _gemm(271.2, f"{_MAMF}: A100 SXM 271.2 TFLOPS (memory size not stated)"),
            _copy(1381.0, f"{_STREAM}/a100_40.txt: scale kernel 1381 GB/s (A100 40 GB, form factor not stated)"),
            *_host(24.0, f"{_AZ}/nd96asr_v4.conf: check_cuda_bw 24 (ND A100 v4, A100 SXM4 40GB)"),
        ),
    ),
    Reference(
        "A100 SXM4 80GB",
        "bfloat16",
        312.0,
        (80,),
        2039.0,
        "PCIe 4.0 x16",
        pcie_gbs(4),
        600.0,
        400.0,
        f"{_A100}: 624 bf16 sparse / 2, 80 GB HBM2e 2039 GB/s, NVLink 600 GB/s, PCIe Gen4 64 GB/s, 400 W",
        _A100_FAMILY,
        marker=_SXM,
        published=(
            _gemm(271.2, f"{_MAMF}: A100 SXM 271.2 TFLOPS (memory size not stated)"),
            *_host(24.0, f"{_AZ}/nd96amsr_a100_v4.conf: check_cuda_bw 24 (NDm A100 v4, A100 SXM4 80GB)"),
        ),
    ),
    Reference(
        "A100 PCIe 40GB",
        "bfloat16",
        312.0,
        (40,),
        1555.0,
        "PCIe 4.0 x16",
        pcie_gbs(4),
        600.0,
        250.0,
        f"{_A100}: 624 bf16 sparse / 2, 40 GB HBM2 1555 GB/s, NVLink bridge 600 GB/s, PCIe Gen4 64 GB/s, 250 W",
        _A100_FAMILY,
        marker=_PCIE,
        published=(
            _gemm(252.9, f"{_MAMF}: A100 PCIe 252.9 TFLOPS (memory size not stated)"),
            _copy(1381.0, f"{_STREAM}/a100_40.txt: scale kernel 1381 GB/s (A100 40 GB, form factor not stated)"),
        ),
    ),
    Reference(
        "A100 PCIe 80GB",
        "bfloat16",
        312.0,
        (80,),
        1935.0,
        "PCIe 4.0 x16",
        pcie_gbs(4),
        600.0,
        300.0,
        f"{_A100}: 624 bf16 sparse / 2, 80 GB HBM2e 1935 GB/s, NVLink bridge 600 GB/s, PCIe Gen4 64 GB/s, 300 W",
        _A100_FAMILY,
        marker=_PCIE,
        published=(
            _gemm(252.9, f"{_MAMF}: A100 PCIe 252.9 TFLOPS (memory size not stated)"),
            *_host(23.0, f"{_AZ}/nc24ads_a100_v4.conf: check_gpu_bw 23 (NC A100 v4, A100 80GB PCIe)"),
        ),
    ),
    Reference(
        "L40S",
        "bfloat16",
        362.05,
        (48,),
        864.0,
        "PCIe 4.0 x16",
        pcie_gbs(4),
        None,
        350.0,
        f"{_L40S}: 733 bf16 sparse / 2, 48 GB GDDR6 864 GB/s, PCIe Gen4 x16 64 GB/s, 350 W, no NVLink",
        r"\bL40S\b",
        published=(_gemm(252.0, f"{_MAG}: L40S 252.0 TFLOPS"),),
    ),
    Reference(
        "L40",
        "bfloat16",
        181.05,
        (48,),
        864.0,
        "PCIe 4.0 x16",
        pcie_gbs(4),
        None,
        300.0,
        f"{_L40}: 362 bf16 sparse / 2, 48 GB GDDR6 864 GB/s, PCIe Gen4 x16 64 GB/s, 300 W, no NVLink",
        r"\bL40\b",
        published=(
            _gemm(170.3, f"{_MAG}: L40 170.3 TFLOPS"),
            _copy(770.0, f"{_STREAM}/l40.txt: scale kernel 770 GB/s at full occupancy"),
        ),
    ),
    Reference(
        "L4",
        "bfloat16",
        121.0,
        (24,),
        300.0,
        "PCIe 4.0 x16",
        pcie_gbs(4),
        None,
        72.0,
        f"{_L4}: 242 bf16 sparse / 2, 24 GB GDDR6 300 GB/s, PCIe Gen4 x16 64 GB/s, 72 W",
        r"\bL4\b",
        published=(_gemm(91.4, f"{_MAG}: L4 91.4 TFLOPS"),),
    ),
    Reference(
        "A10",
        "bfloat16",
        125.0,
        (24,),
        600.0,
        "PCIe 4.0 x16",
        pcie_gbs(4),
        None,
        150.0,
        f"{_A10}: 250 bf16 sparse / 2, 24 GB GDDR6 600 GB/s, PCIe Gen4 64 GB/s, 150 W; not the A10G",
        r"\bA10\b",
    ),
    # GeForce: the fp32-accumulate rate (what autocast matmuls use); fp16-accumulate is twice it.
    # The 4090 D and the 3090 Ti are other SKUs with other peaks: no match rather than a wrong one.
    Reference(
        "GeForce RTX 4090",
        "bfloat16",
        165.2,
        (24,),
        1008.0,
        "PCIe 4.0 x16",
        pcie_gbs(4),
        None,
        450.0,
        f"{_ADA}: 330.4 bf16 sparse / 2 (fp32 accumulate), 24 GB GDDR6X 1008 GB/s, 450 W",
        r"\bRTX 4090\b(?! D\b)",
        published=(_gemm(178.8, f"{_MAG}: GeForce RTX 4090 178.8 TFLOPS"),),
    ),
    Reference(
        "GeForce RTX 3090",
        "bfloat16",
        71.0,
        (24,),
        936.0,
        "PCIe 4.0 x16",
        pcie_gbs(4),
        112.5,
        350.0,
        f"{_GA102}: 142 bf16 sparse / 2 (fp32 accumulate), 24 GB GDDR6X 936 GB/s, NVLink 112.5 GB/s, 350 W",
        r"\bRTX 3090\b(?! Ti\b)",
    ),
    Reference(
        "V100S PCIe",
        "float16",
        130.0,
        (32,),
        1134.0,
        "PCIe 3.0 x16",
        pcie_gbs(3),
        None,
        250.0,
        f"{_V100}: 130 fp16 tensor (no bf16), 32 GB HBM2 1134 GB/s, PCIe Gen3 32 GB/s, 250 W",
        r"\bV100S\b",
    ),
    Reference(
        "V100 SXM2",
        "float16",
        125.0,
        (16, 32),
        900.0,
        "PCIe 3.0 x16",
        pcie_gbs(3),
        300.0,
        300.0,
        f"{_V100}: 125 fp16 tensor (no bf16), 16/32 GB HBM2 900 GB/s, NVLink 300 GB/s, PCIe Gen3 32 GB/s, 300 W",
        _V100_FAMILY,
        marker=_SXM,
        published=_host(10.0, f"{_AZ}/nd40rs_v2.conf: check_gpu_bw 10 (ND40rs v2, V100 SXM2 32GB)"),
    ),
    Reference(
        "V100 PCIe",
        "float16",
        112.0,
        (16, 32),
        900.0,
        "PCIe 3.0 x16",
        pcie_gbs(3),
        None,
        250.0,
        f"{_V100}: 112 fp16 tensor (no bf16), 16/32 GB HBM2 900 GB/s, PCIe Gen3 32 GB/s, 250 W",
        _V100_FAMILY,
        marker=_PCIE,
        published=(
            _copy(788.0, "te42kyfo/gpu-benches README, cuda-stream on Tesla V100-PCIe-16GB: scale 788 GB/s"),
            Published("h2d", 12.35, "te42kyfo/gpu-benches README, cuda-memcpy on Tesla V100 PCIe 16GB: 12.35 GB/s"),
            Published("d2h", 10.0, f"{_AZ}/nc6s_v3.conf: check_gpu_bw 10 (NC v3, V100 PCIe 16GB)", floor=True),
        ),
    ),
    Reference(
        "T4",
        "float16",
        65.0,
        (16,),
        320.0,
        "PCIe 3.0 x16",
        pcie_gbs(3),
        None,
        70.0,
        f"{_T4}: 65 fp16 tensor (no bf16), 16 GB GDDR6 320 GB/s, PCIe Gen3 x16 32 GB/s, 70 W",
        r"\bT4\b",
    ),
)

# -- identify ----------------------------------------------------------------------------------
_MOBILE = re.compile(r"\b(Laptop|Mobile|Max Q)\b", re.IGNORECASE)
_MIG = re.compile(r"\bMIG\b", re.IGNORECASE)
# Datasheet "80GB" is ~80 GiB of HBM; NVML/torch report less (ECC on GDDR6 keeps 1/16, the driver a
# little): 'Tesla T4' 15 GiB, 'NVIDIA L40S' 45 GiB, 'NVIDIA H100 80GB HBM3' 79.2 GiB, 'NVIDIA
# H200' 140.4 GiB. Disjoint for every pair of rows in one family (80 vs 94: 82.4 < 82.7).
_MEMORY_LOW, _MEMORY_HIGH = 0.88, 1.03
# A power limit can be lowered below the board's maximum, never raised above it (NVML's
# constraints); 5% for boards that allow a little more than the datasheet's TDP.
_POWER_SLACK = 1.05


def _normalise(name: str) -> str:
    return " ".join(name.replace("-", " ").replace("_", " ").split())


def _memory_fits(ref: Reference, memory_bytes: float) -> bool:
    gib = memory_bytes / GIB
    return any(size * _MEMORY_LOW <= gib <= size * _MEMORY_HIGH for size in ref.memory_gb)


def _sizes_in_name(name: str) -> set[float]:
    return {float(n) for n in re.findall(r"\b(\d+)\s?GB?\b", name, re.IGNORECASE)}


def _narrow(candidates: list[Reference], keep: Callable[[Reference], bool]) -> list[Reference]:
    """The candidates `keep` admits, or all of them when it admits none (a hint that fits no row
    of the family says nothing)."""
    kept = [r for r in candidates if keep(r)]
    return kept or candidates


def identify(
    name: str | None, memory_bytes: float | None = None, power_limit_w: float | None = None
) -> Reference | None:
    """The reference row of a device, or None where it cannot be told without guessing.

    Decided in this order, each step only among the rows the previous one left:
    1. the name picks the family (B200, GH200, H200, H100, A100, ...); laptop parts, MIG slices
       and names of other SKUs (A10G, H20, H800, GB200, RTX 4090 D) match none;
    2. a form-factor marker in the name (SXM, PCIE, NVL; 'HBM3' on an H100 is the SXM5 board),
       then a memory size in the name ('A100-SXM4-40GB');
    3. the device's memory (within 0.88-1.03 of the datasheet size): a memory no row of the
       family has means an unknown variant: None;
    4. the power limit: rows whose maximum is below it are out (a limit can be lowered, never
       raised past the board's maximum), so an SXM capped to 500 W stays SXM beside a 350 W
       PCIe board; of the rows left, the one with the lowest maximum that admits the limit
       (a bare H100 at 350 W is the PCIe board, at 700 W the SXM);
    5. a row marked `bare_name` for a name without a marker ('NVIDIA H200' is what the SXM board
       reports; the NVL reports 'NVIDIA H200 NVL').
    One row left: that row; several: None.
    """
    if not name:
        return None
    text = _normalise(name)
    if _MOBILE.search(text) or _MIG.search(text):  # other clocks and power / a slice of the SMs
        return None
    family = next((r.family for r in _TABLE if re.search(r.family, text, re.IGNORECASE)), None)
    if family is None:
        return None
    rows = [r for r in _TABLE if r.family == family]
    marked = [r for r in rows if r.marker and re.search(r.marker, text, re.IGNORECASE)]
    candidates = marked or rows
    sizes = _sizes_in_name(text)
    candidates = _narrow(candidates, lambda r: bool(sizes.intersection(r.memory_gb)))
    if memory_bytes:
        candidates = [r for r in candidates if _memory_fits(r, memory_bytes)]
    if power_limit_w and len(candidates) > 1:
        admitted = [r for r in candidates if power_limit_w <= r.power_w * _POWER_SLACK]
        candidates = sorted(admitted, key=lambda r: r.power_w)[:1]
    if len(candidates) > 1 and not marked:
        candidates = [r for r in candidates if r.bare_name] or candidates
    return candidates[0] if len(candidates) == 1 else None


def lookup(device_name: str | None) -> Reference | None:
    """The reference for a torch/NVML device name alone, such as 'NVIDIA H100 80GB HBM3', or None."""
    return identify(device_name)


def table() -> list[Reference]:
    return list(_TABLE)


# -- expectations ----------------------------------------------------------------------------
def _healthy_fraction(published: Published, datasheet: float) -> float:
    return published.value / datasheet


def _lowest_published_fraction(figure: str) -> tuple[float, Reference, Published]:
    """The lowest healthy fraction of the datasheet any model is published at for `figure`: the
    floor for a model with no measurement of its own must not be above what a healthy one of
    another model reaches."""
    found = [(_healthy_fraction(p, r.datasheet(figure)), r, p) for r in _TABLE if (p := r.published_for(figure))]
    return min(found, key=lambda t: t[0])


def expectation(ref: Reference, figure: str) -> Expected | None:
    """The floor a healthy `ref` device reaches on `figure` (gemm, memory_bandwidth, h2d, d2h),
    in the figure's unit, with the fraction of the datasheet it is and its basis."""
    if figure not in FIGURES:
        raise ValueError(f"unknown figure {figure!r}: one of {', '.join(FIGURES)}")
    datasheet = ref.datasheet(figure)
    unit = UNITS[figure]
    here = dict(ref.measured_here).get(figure)
    published = ref.published_for(figure)
    if published is not None:
        healthy = _healthy_fraction(published, datasheet)
        fraction = round(healthy * MARGIN, 3)
        what = "fleet floor" if published.floor else "published"
        basis = (
            f"{ref.model} datasheet {datasheet:g} {unit} x {fraction:g} = {what} {published.value:g} {unit} "
            f"({healthy:.2f} of datasheet) x {MARGIN} margin; published measurement: {published.source}"
        )
        return Expected(figure, round(datasheet * fraction, 2), unit, fraction, basis, True, here)
    lowest, other, source = _lowest_published_fraction(figure)
    fraction = round(lowest * MARGIN, 3)
    basis = (
        f"{ref.model} datasheet {datasheet:g} {unit} x {fraction:g}; datasheet only (no measured fraction "
        f"for this model): the lowest published healthy fraction of any model, {other.model} {lowest:.2f} "
        f"({source.source}), x {MARGIN} margin"
    )
    return Expected(figure, round(datasheet * fraction, 2), unit, fraction, basis, False, here)
