"""hardware checks of the GPUs themselves: memory errors, pending row remapping, throttled clocks."""

from __future__ import annotations

from gpudoctor.model import fail, info, manual, passed, warn
from gpudoctor.readers import cudavis
from gpudoctor.registry import check

# Clock-event reasons that mean the GPU is slowed by a fault or by cooling/power delivery.
SLOWDOWN_REASONS = {
    "hw_thermal_slowdown": "hardware thermal slowdown (the GPU is too hot)",
    "sw_thermal_slowdown": "software thermal slowdown (GPU or memory temperature limit)",
    "hw_slowdown": "hardware slowdown (thermal or power-brake signal from the board)",
    "hw_power_brake_slowdown": "power-brake slowdown (the power supply asked the GPUs to slow down)",
}


@check(
    id="GD-HW-001",
    name="ecc-uncorrected-errors",
    category="hardware",
    title="No uncorrected GPU memory (ECC) errors",
    needs=["env", "nvidia"],
    requires=["job-gpus"],
    what="Reads each GPU's uncorrected ECC error counters: volatile (since the last driver load or reboot) and "
    "aggregate (over the GPU's lifetime).",
    why="An uncorrected error since the last reboot means memory contents were lost (Xid 48/63/64/94/95): "
    "processes on the GPU were killed or computed on corrupt data, and until the GPU is reset it may fail again. "
    "Lifetime-only errors were handled but show the card's history.",
    fix="Drain the node and reset the GPU (`sudo nvidia-smi -r -i N`, or reboot); if errors come back, run "
    "`dcgmi diag -r 3` and open an RMA.",
)
def ecc_uncorrected_errors(facts, ctx):
    gpus = cudavis.job_gpus(facts)
    volatile, aggregate = {}, {}
    for g in gpus:
        ecc = g.get("ecc") or {}
        if (ecc.get("uncorrected_volatile") or 0) > 0:
            volatile[g["index"]] = ecc["uncorrected_volatile"]
        if (ecc.get("uncorrected_aggregate") or 0) > 0:
            aggregate[g["index"]] = ecc["uncorrected_aggregate"]
    evidence = {"uncorrected_volatile": volatile, "uncorrected_aggregate": aggregate}
    if volatile:
        return fail(
            f"uncorrected ECC errors since the last reboot on GPU(s) {sorted(volatile)} ({volatile}): the GPU lost "
            "memory contents and needs a reset before it can be trusted",
            manual(
                "Drain the node, reset the GPU(s), run diagnostics",
                *[f"sudo nvidia-smi -r -i {i}" for i in sorted(volatile)],
                "dcgmi diag -r 3",
            ),
            **evidence,
        )
    if aggregate:
        return warn(
            f"GPU(s) {sorted(aggregate)} have had uncorrected ECC errors in their lifetime ({aggregate}), none since "
            "the last reboot: watch them",
            manual(
                "Check the memory repair state and diagnostics",
                "nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT",
                "dcgmi diag -r 3",
            ),
            **evidence,
        )
    with_ecc = [g["index"] for g in gpus if (g.get("ecc") or {}).get("current")]
    if not with_ecc:
        return passed("ECC is off or not supported on these GPUs: nothing to count", **evidence)
    return passed(f"no uncorrected ECC errors on GPU(s) {with_ecc}", **evidence)


@check(
    id="GD-HW-002",
    name="memory-repair-pending",
    category="hardware",
    title="No GPU memory repair pending or failed",
    needs=["env", "nvidia"],
    requires=["job-gpus"],
    what="Reads row remapping (Ampere and newer) and page retirement (older GPUs): a remap or retirement that is "
    "pending until the next GPU reset, and a failed remap.",
    why="A pending repair means a bad memory row is still in use until the GPU is reset; a failed remap means the "
    "GPU ran out of spare rows and must be replaced. Jobs on such GPUs crash with Xid errors or produce NaNs.",
    fix="Pending: drain the node and reset the GPU (`sudo nvidia-smi -r -i N`) or reboot. Failed: take the GPU out "
    "of service and open an RMA.",
)
def memory_repair_pending(facts, ctx):
    gpus = cudavis.job_gpus(facts)
    failed = [g["index"] for g in gpus if (g.get("remapped_rows") or {}).get("failed")]
    pending = [
        g["index"]
        for g in gpus
        if (g.get("remapped_rows") or {}).get("pending") or (g.get("retired_pages") or {}).get("pending")
    ]
    evidence = {
        "remapped_rows": {g["index"]: g.get("remapped_rows") for g in gpus if g.get("remapped_rows")},
        "retired_pages": {g["index"]: g.get("retired_pages") for g in gpus if g.get("retired_pages")},
    }
    if failed:
        return fail(
            f"row remapping FAILED on GPU(s) {failed}: no spare memory rows left - the GPU needs replacement (RMA)",
            manual("Take the GPU out of service and open an RMA", "nvidia-smi -q -d ROW_REMAPPER", "dcgmi diag -r 3"),
            **evidence,
        )
    if pending:
        return fail(
            f"a memory repair (row remap / page retirement) is pending on GPU(s) {pending}: it takes effect only "
            "after a GPU reset",
            manual("Drain the node and reset the GPU(s)", *[f"sudo nvidia-smi -r -i {i}" for i in pending]),
            **evidence,
        )
    return passed("no pending or failed memory repairs", **evidence)


@check(
    id="GD-HW-003",
    name="gpu-clocks-throttled",
    category="hardware",
    title="GPU clocks are not held down by heat or power faults",
    needs=["env", "nvidia"],
    requires=["job-gpus"],
    what="Reads NVML's current clock-event (throttle) reasons. Thermal and hardware slowdowns and power brake "
    "mean trouble; the software power cap is normal under full load; gpu_idle only means the GPU has no work.",
    why="A GPU slowed by heat or a power-brake signal runs far below its rated speed, and in data-parallel "
    "training every other GPU waits for it.",
    fix="Check cooling (fans, airflow, inlet temperature) and power delivery; `nvidia-smi -q -d "
    "PERFORMANCE,TEMPERATURE` shows the active reasons; persistent hardware slowdowns need the vendor.",
)
def gpu_clocks_throttled(facts, ctx):
    gpus = cudavis.job_gpus(facts)
    bad, capped = {}, []
    for g in gpus:
        active = (g.get("throttle_reasons") or {}).get("active") or []
        reasons = [r for r in active if r in SLOWDOWN_REASONS]
        if reasons:
            bad[g["index"]] = reasons
        if "sw_power_cap" in active:
            capped.append(g["index"])
    temps = {g["index"]: g.get("temperature_c") for g in gpus if g.get("temperature_c") is not None}
    evidence = {"slowdowns": bad, "power_capped": capped, "temperature_c": temps}
    if bad:
        detail = "; ".join(f"GPU {i}: {', '.join(SLOWDOWN_REASONS[r] for r in rs)}" for i, rs in bad.items())
        return warn(
            f"clocks are held down: {detail}",
            manual("Check cooling and power delivery", "nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER"),
            **evidence,
        )
    if capped:
        return info(
            f"GPU(s) {capped} are at their software power cap: normal under full load, worth a look on an idle GPU",
            None,
            **evidence,
        )
    return passed("no thermal, hardware or power-brake slowdown", **evidence)
