"""The smoke run's per-rank figures, one row each: everything else derives from this table (no torch).

A row says what a figure is (its key, what it measures, its unit), where the rank's result holds it (`measured`:
a part benchmark of sample_train/parts.py, by name), how it is judged (always against the job's median, by
slowness.judge; against the GPU model's reference where `reference` names a figure of peaks.py; against a fleet
baseline, which keeps every row's job median), its floor flag, and its label on the rank's text line. From it:
the worker's part benchmarks (parts.measure), the rank rows of the gpudoctor.smoke/3 report (report._per_rank),
the report's `parts` section and its text line, the Prometheus `gpudoctor_smoke_part` gauge, the baseline's
figures, the `--min-...` flags (options.py) and GD-SMOKE-020. docs/architecture.md "A new smoke figure".
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Floor:
    """A `--min-...` flag that fails a rank whose figure is below it (GD-SMOKE-020); rows may share one."""

    flag: str  # the command line's spelling
    option: str  # its name in SmokeOptions.floors and in the report's `floors` section
    metavar: str
    help: str


@dataclass(frozen=True)
class Figure:
    key: str  # a rank row's key: the JSON field, the baseline's figure, the Prometheus `part` label
    what: str  # how messages name it
    unit: str
    measured: tuple[str, str] | None = None  # (part benchmark, its field) in the rank's result; None: report.py
    reference: str | None = None  # the GPU model's reference figure (peaks.FIGURES); None: no reference
    floor: Floor | None = None
    label: str | None = None  # on the rank's text line; None: not shown there


MATMUL = Floor("--min-matmul-tflops", "min_matmul_tflops", "X", "fail a rank whose square matmul is below X")
MEMBW = Floor("--min-membw", "min_membw_gbps", "GBPS", "fail a rank whose device memory copy is below GB/s")
HOSTBW = Floor(
    "--min-hostbw",
    "min_hostbw_gbps",
    "GBPS",
    "fail a GPU whose pinned host<->device copy (either direction) is below GB/s",
)


def _host_copy(direction: str, what: str) -> Figure:
    """A pinned copy across the host link, one way: its part, its reference and its label are its direction."""
    return Figure(
        f"{direction}_gbps",
        what,
        "GB/s",
        measured=(direction, "gbps"),
        reference=direction,
        floor=HOSTBW,
        label=direction.upper(),
    )


RANK = (
    # the run's own square matmul (worker: result["matmul"], also the MFU's measured peak)
    Figure("matmul_tflops", "square matmul", "TFLOP/s", reference="gemm", floor=MATMUL, label="matmul"),
    Figure("ffn_gemm_tflops", "the model's FFN matmul", "TFLOP/s", measured=("ffn_gemm", "tflops"), label="FFN"),
    Figure(
        "memory_copy_gbps",
        "device memory copy",
        "GB/s",
        measured=("memory_copy", "gbps"),
        reference="memory_bandwidth",
        floor=MEMBW,
        label="memory",
    ),
    _host_copy("h2d", "host-to-device copy (pinned)"),
    _host_copy("d2h", "device-to-host copy (pinned)"),
    # tokens per step over the rank's best own forward+backward (DDP no_sync), computed by report._per_rank
    Figure("compute_tokens_per_s", "own forward+backward", "tokens/s"),
)
COMPUTE = "compute_tokens_per_s"  # the straggler's figure (GD-SMOKE-010); the others are parts (GD-SMOKE-016)


def floors() -> list[Floor]:
    """Each floor once, in the table's order (the flags' order in `gpudoctor smoke --help`)."""
    return list(dict.fromkeys(f.floor for f in RANK if f.floor is not None))


def measured_parts() -> list[str]:
    """The part benchmarks a rank runs, in the table's order."""
    return list(dict.fromkeys(f.measured[0] for f in RANK if f.measured is not None))


def from_parts(parts: dict) -> dict:
    """A rank row's figures from its part benchmarks (None where it did not run one: no GPU, no pinned copy)."""
    return {f.key: (parts.get(f.measured[0]) or {}).get(f.measured[1]) for f in RANK if f.measured is not None}
