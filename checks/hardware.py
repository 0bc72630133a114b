"""hardware checks: memory errors, throttling, PCIe and NVLink links, the NVSwitch fabric."""

from __future__ import annotations

from gpudoctor.model import fail, info, manual, passed, skip, warn
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


@check(
    id="GD-HW-004",
    name="pcie-link-degraded",
    category="hardware",
    title="GPU PCIe links run at full width",
    needs=["env", "nvidia"],
    requires=["job-gpus"],
    what="Compares each GPU's current PCIe link width with its maximum. The link generation is not judged: GPUs "
    "drop to a lower PCIe generation when idle to save power and go back up under load.",
    why="A link trained at x8 or x4 instead of x16 (a badly seated card, a damaged riser or slot) halves or "
    "quarters host-to-GPU bandwidth for data loading, and GPU-to-GPU traffic that crosses PCIe.",
    fix="Reseat the GPU or riser, check the slot; confirm under load with `nvidia-smi -q -d PCIE`.",
)
def pcie_link_degraded(facts, ctx):
    gpus = cudavis.job_gpus(facts)
    narrow = {}
    for g in gpus:
        pcie = g.get("pcie") or {}
        cur, best = pcie.get("width_current"), pcie.get("width_max")
        if cur and best and cur < best:
            narrow[g["index"]] = f"x{cur} of x{best}"
    evidence = {
        "narrow_links": narrow,
        "widths": {g["index"]: (g.get("pcie") or {}).get("width_current") for g in gpus},
    }
    if narrow:
        detail = ", ".join(f"GPU {i} {w}" for i, w in narrow.items())
        return warn(
            f"PCIe link narrower than the GPU supports: {detail} - less host-GPU bandwidth",
            manual("Reseat the card or riser and check the slot; confirm under load", "nvidia-smi -q -d PCIE"),
            **evidence,
        )
    return passed("every PCIe link at its full width (generation changes at idle are normal)", **evidence)


@check(
    id="GD-HW-005",
    name="nvlink-links-down",
    category="hardware",
    title="All NVLink links are up",
    needs=["env", "nvidia"],
    requires=["job-gpus"],
    what="Counts active and inactive NVLink links per GPU, on machines where NVLink is in use: a GPU with some "
    "links down, or with all links down while GPUs of the same model have theirs up.",
    why="NCCL routes GPU-to-GPU traffic over NVLink; with links down the traffic gets less bandwidth or falls back "
    "to PCIe, and all-reduce - paced by the slowest link - slows the whole job.",
    fix="Check `nvidia-smi nvlink -s` and `nvidia-smi topo -m`; links that stay down after a reboot need the vendor.",
)
def nvlink_links_down(facts, ctx):
    gpus = cudavis.job_gpus(facts)
    active = {g["index"]: sum(1 for link in g.get("nvlink") or [] if link.get("active")) for g in gpus}
    links = {g["index"]: len(g.get("nvlink") or []) for g in gpus}
    if not any(active.values()):
        return passed("no active NVLink links (GPUs without NVLink, or NVLink not in use)", active_links=active)
    models_with_links = {g.get("name") for g in gpus if active[g["index"]]}
    partly = {i: f"{active[i]} of {links[i]}" for i in active if 0 < active[i] < links[i]}
    dark = [
        g["index"] for g in gpus if links[g["index"]] and not active[g["index"]] and g.get("name") in models_with_links
    ]
    evidence = {"active_links": active, "links": links}
    if partly or dark:
        parts = [f"GPU {i}: {n} links active" for i, n in partly.items()]
        parts += [f"GPU {i}: every link down while GPUs of the same model have theirs up" for i in dark]
        return warn(
            "NVLink links down - " + "; ".join(parts),
            manual("Inspect the links", "nvidia-smi nvlink -s", "nvidia-smi topo -m"),
            **evidence,
        )
    return passed(f"all NVLink links up ({', '.join(f'GPU {i}: {n}' for i, n in active.items())})", **evidence)


@check(
    id="GD-HW-006",
    name="fabric-manager-not-running",
    category="hardware",
    title="NVSwitch fabric is initialised (fabric manager running)",
    needs=["env", "nvidia"],
    what="On NVSwitch systems (HGX/DGX: NVSwitch devices present, or GPUs reporting a fabric state), checks that "
    "nv-fabricmanager runs and that each GPU's fabric registration completed.",
    why="Until the fabric manager has configured the NVSwitches, CUDA initialisation fails with error 802 "
    "'system not yet initialized' - torch reports no usable GPU although nvidia-smi lists them all.",
    fix="`sudo systemctl enable --now nvidia-fabricmanager` (its version must match the driver's); check "
    "`systemctl status nvidia-fabricmanager` and /var/log/fabricmanager.log.",
)
def fabric_manager_not_running(facts, ctx):
    if not facts.nvidia.get("available"):
        return skip("no NVIDIA driver (see GD-DRV-001)")
    nvswitch = facts.nvidia.get("nvswitch") or {}
    count, running = nvswitch.get("count") or 0, nvswitch.get("fabric_manager_running")
    fabric = {
        g["index"]: g["fabric"]
        for g in facts.gpus
        if isinstance(g.get("fabric"), dict) and g["fabric"].get("state") not in (None, "not_supported")
    }
    unready = {
        i: f for i, f in fabric.items() if f.get("state") != "completed" or f.get("status") not in (None, "success")
    }
    evidence = {"nvswitch_count": count, "fabric_manager_running": running, "gpu_fabric": fabric}
    fix = manual(
        "Start the NVIDIA fabric manager (same version as the driver)",
        "sudo systemctl enable --now nvidia-fabricmanager",
        "systemctl status nvidia-fabricmanager",
    )
    if unready:
        detail = ", ".join(
            f"GPU {i}: {f.get('state')}" + (f" ({f.get('status')})" if f.get("status") not in (None, "success") else "")
            for i, f in unready.items()
        )
        return fail(
            f"NVSwitch fabric not ready ({detail}): CUDA initialisation "
            "fails with error 802 'system not yet initialized'",
            fix,
            **evidence,
        )
    if count and running is False:
        if fabric:  # every GPU registered: the fabric is up, whoever runs the manager
            return passed(f"{count} NVSwitch(es); every GPU's fabric registration completed", **evidence)
        return fail(
            f"{count} NVSwitch device(s) but nv-fabricmanager is not running: CUDA initialisation fails with error 802 "
            "'system not yet initialized'",
            fix,
            **evidence,
        )
    if count and running is None and not fabric:
        return info(
            f"{count} NVSwitch device(s); whether nv-fabricmanager runs cannot be seen from here (container?)",
            None,
            **evidence,
        )
    if not count and not fabric:
        return passed("no NVSwitch fabric on this machine", **evidence)
    return passed("NVSwitch fabric initialised", **evidence)


# ---------------------------------------------------------------- issue 13: PCIe generation, kernel log, ACS/IOMMU, FM


def _busy(gpu: dict) -> bool:
    """Working now: NVML does not report the idle clock reason, and memory or processes are in use."""
    reasons = gpu.get("throttle_reasons")
    if not isinstance(reasons, dict) or "gpu_idle" in (reasons.get("active") or []):
        return False
    return bool(gpu.get("processes")) or (gpu.get("memory_used_bytes") or 0) > 1 << 30


@check(
    id="GD-HW-007",
    name="pcie-generation-low-under-load",
    category="hardware",
    title="Busy GPUs run their PCIe link at the full generation",
    needs=["env", "nvidia"],
    requires=["job-gpus"],
    what="For GPUs that are busy now (no idle clock reason, memory or processes in use), compares the PCIe link "
    "generation with the highest this GPU and slot can train to (nvmlDeviceGetMaxPcieLinkGeneration, the "
    "lower of the two). Idle GPUs are not judged: they drop to a lower generation to save power.",
    why="A link that stays at Gen1-3 while the GPU works (a riser or slot that cannot hold the rate, BIOS "
    "set to a lower generation, a link retrained after errors) halves or quarters host-to-GPU bandwidth. NVML "
    "documents the current generation as possibly lower at idle (NVML API reference, "
    "nvmlDeviceGetCurrPcieLinkGeneration); `nvidia-smi -q -d PCIE` shows both.",
    fix="Confirm under load (`nvidia-smi -q -d PCIE`); check the BIOS PCIe speed setting, reseat the card or "
    "riser, and look for AER errors in the kernel log (GD-HW-008).",
)
def pcie_generation_low_under_load(facts, ctx):
    gpus = cudavis.job_gpus(facts)
    low, idle = {}, []
    for g in gpus:
        pcie = g.get("pcie") or {}
        cur, best = pcie.get("gen_current"), pcie.get("gen_max")
        if not (cur and best and cur < best):
            continue
        if _busy(g):
            low[g["index"]] = f"Gen{cur} of Gen{best}"
        else:
            idle.append(g["index"])
    evidence = {
        "low_generation_busy": low,
        "low_generation_idle": idle,
        "generations": {g["index"]: (g.get("pcie") or {}).get("gen_current") for g in gpus},
    }
    if low:
        detail = ", ".join(f"GPU {i} {v}" for i, v in low.items())
        return warn(
            f"PCIe link below its generation while the GPU is busy: {detail} - less host-GPU bandwidth",
            manual("Check the BIOS PCIe speed, the riser/slot, and AER errors", "nvidia-smi -q -d PCIE"),
            **evidence,
        )
    if idle:
        return passed(
            f"GPU(s) {idle} idle at a lower PCIe generation (normal power saving); busy links at full speed", **evidence
        )
    return passed("every PCIe link at its highest generation", **evidence)


# Xid codes by what they mean for the next job (NVIDIA "Xid Errors" catalog, docs.nvidia.com/deploy/xid-errors;
# "Dynamic Page Retirement" and "Row Remapping" guides). Codes not listed are application-level (13 graphics engine
# exception, 31 MMU fault, 43 stopped processing, 45 preemptive cleanup): the faulting program, not the GPU.
XID_NEEDS_RESET = {
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    64: "row remapping / page retirement failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}
XID_HARDWARE = {
    61: "internal micro-controller breakpoint",
    63: "row remapping / page retirement event",
    92: "high single-bit ECC rate",
    94: "contained ECC error",
    121: "C2C link error",
    149: "NVLink/fabric error",
    154: "GPU recovery action changed",
}


def _pci_key(text: str | None) -> str | None:
    """'00000000:3B:00.0', '0000:3b:00', '0000:3b:00.0' -> '3b:00' (bus:device), the part every form shares."""
    if not text:
        return None
    parts = text.lower().split(":")
    return ":".join(parts[-2:]).split(".")[0] if len(parts) >= 2 else None


@check(
    id="GD-HW-008",
    name="kernel-log-gpu-errors",
    category="hardware",
    title="No GPU Xid errors, reset requests or PCIe AER errors in the kernel log",
    needs=["env", "nvidia", "kernel"],
    what="Reads the kernel log of the last hours (/dev/kmsg, journalctl -k or dmesg): NVRM Xid events, NVRM "
    "messages asking for a GPU reset or a reboot, and PCIe AER errors. When the log cannot be read (a container: "
    "/dev/kmsg absent, dmesg refused with EPERM; a user without CAP_SYSLOG where kernel.dmesg_restrict=1) it says "
    'so as a finding ("could not check"), never a silent skip, and still reads the world-readable sysfs AER '
    "totals.",
    why="Xid 79 (fallen off the bus), 48/95 (uncorrectable ECC), 64 (row-remap failure), 74 (NVLink) and 119/120 (GSP) "
    "mean the GPU must be reset before it can be trusted: the next job crashes or computes on corrupt memory "
    "(NVIDIA Xid catalog, docs.nvidia.com/deploy/xid-errors). Uncorrected PCIe AER errors precede GPUs falling "
    "off the bus and links retraining at lower speed. nvidia-smi shows none of this history.",
    fix="Drain the node and reset the GPU (`sudo nvidia-smi -r -i N`) or reboot; for repeated hardware Xids run "
    "`dcgmi diag -r 3` and contact the vendor. Application Xids (13, 31, 43) point at the program that faulted.",
)
def kernel_log_gpu_errors(facts, ctx):
    log = facts.kernel.get("log") or {}
    if facts.kernel.get("error"):
        return _aer_counters_only(facts, f"the kernel probe failed: {facts.kernel['error']}", None)
    if not log.get("readable"):
        reasons = "; ".join(a.get("reason", "?") for a in log.get("attempts") or []) or "no source"
        return _aer_counters_only(facts, reasons, log.get("attempts"))
    hours = log.get("window_hours")
    gpu_of = {_pci_key(g.get("pci_bus_id")): g.get("index") for g in facts.gpus if g.get("pci_bus_id")}
    job = {g.get("index") for g in cudavis.job_gpus(facts)}
    xids = log.get("xid") or []
    reset = log.get("reset_required") or []
    aer = [a for a in log.get("aer") or [] if a.get("severity") in ("fatal", "non_fatal")]
    corrected = [a for a in log.get("aer") or [] if a.get("severity") == "corrected"]

    def where(pci: str | None) -> str:
        index = gpu_of.get(_pci_key(pci))
        return f"GPU {index}" if index is not None else f"PCI {pci}"

    severe = [x for x in xids if x.get("code") in XID_NEEDS_RESET]
    hardware = [x for x in xids if x.get("code") in XID_HARDWARE]
    app = [x for x in xids if x.get("code") not in XID_NEEDS_RESET and x.get("code") not in XID_HARDWARE]
    evidence = {
        "source": log.get("source"),
        "window_hours": hours,
        "counts": log.get("counts"),
        "xid": [f"{where(x.get('pci'))}: Xid {x.get('code')}" for x in xids][-10:],
        "reset_required": [r.get("message") for r in reset][-3:],
        "aer": [f"{a.get('device')}: {a.get('severity')}" for a in aer + corrected][-10:],
    }
    reset_fix = manual(
        "Drain the node and reset the GPU(s), or reboot",
        "sudo nvidia-smi -r -i <index>",
        "sudo dmesg -T | grep -E 'Xid|NVRM'",
    )
    on_job = any(
        gpu_of.get(_pci_key(x.get("pci"))) in job or gpu_of.get(_pci_key(x.get("pci"))) is None for x in severe
    )
    if reset or (severe and on_job):
        what = sorted({f"{where(x.get('pci'))} Xid {x['code']} ({XID_NEEDS_RESET[x['code']]})" for x in severe})
        if reset:
            what.append(f"the driver asks for a reset: {reset[-1].get('message')}")
        return fail(f"kernel log of the last {hours} h: {'; '.join(what)}", reset_fix, **evidence)
    if severe or hardware or aer:
        what = sorted(
            {
                f"{where(x.get('pci'))} Xid {x['code']} ({(XID_NEEDS_RESET | XID_HARDWARE)[x['code']]})"
                for x in severe + hardware
            }
        )
        what += sorted(
            {f"PCIe AER {a.get('severity').replace('_', '-')} error on {a.get('device') or '?'}" for a in aer}
        )
        return warn(
            f"kernel log of the last {hours} h: {'; '.join(what)}",
            manual("Watch the GPU; run diagnostics", "dcgmi diag -r 2"),
            **evidence,
        )
    if app or corrected:
        notes = []
        if app:
            notes.append(f"application Xid(s) {sorted({x['code'] for x in app})} (faults of a program, not the GPU)")
        if corrected:
            notes.append(f"{len(corrected)} corrected PCIe AER error(s) (their rate on the GPUs' links: GD-HW-011)")
        return info(f"kernel log of the last {hours} h: {'; '.join(notes)}", None, **evidence)
    return passed(
        f"no Xid, reset request or PCIe AER error in the kernel log of the last {hours} h ({log.get('source')})",
        **evidence,
    )


def _aer_counters_only(facts, reasons: str, attempts) -> object:
    """Without the kernel log, the GPUs' sysfs AER totals (since boot, world-readable) still tell of PCIe errors."""
    gpu_of = {_pci_key(g.get("pci_bus_id")): g.get("index") for g in facts.gpus if g.get("pci_bus_id")}
    job = {g.get("index") for g in cudavis.job_gpus(facts)}
    uncorrected = {}
    for s in facts.pci.get("gpus") or []:
        index = gpu_of.get(_pci_key(s.get("bdf")))
        aer = s.get("aer") or {}
        count = (aer.get("fatal") or 0) + (aer.get("non_fatal") or 0)
        if index in job and count:
            uncorrected[index] = count
    evidence = {"log_attempts": attempts, "aer_uncorrected_since_boot": uncorrected}
    if uncorrected:
        detail = ", ".join(f"GPU {i}: {n}" for i, n in sorted(uncorrected.items()))
        return warn(
            f"could not check the kernel log for Xid errors ({reasons}), but sysfs counts uncorrected PCIe AER "
            f"errors since boot ({detail}); run `gpudoctor health` on the host for the log",
            manual("Ask an administrator for the kernel log (Xid, AER)", "sudo dmesg -T | grep -E 'Xid|AER'"),
            **evidence,
        )
    # Not a skip: an unread log is an unchecked GPU, and a hidden skip reads as "no Xid errors"
    container = (facts.host.get("container") or {}).get("in_container")
    where = " (this runs in a container, which does not see the host's kernel log)" if container else ""
    return info(
        f"could not check the kernel log for Xid errors: {reasons}{where}; run `gpudoctor health` on the host, "
        "or ask an administrator for `sudo dmesg -T | grep -E 'Xid|NVRM'`",
        manual("Check the GPUs' kernel log on the host", "gpudoctor health", "sudo dmesg -T | grep -E 'Xid|NVRM'"),
        **evidence,
    )


def _translated(domain: str | None) -> bool:
    return domain is not None and domain.upper().startswith("DMA")


@check(
    id="GD-HW-009",
    name="pcie-acs-or-iommu-blocks-p2p",
    category="hardware",
    title="PCIe peer-to-peer between the job's GPUs is not redirected (ACS) or translated (IOMMU)",
    needs=["env", "nvidia", "pci"],
    requires=["job-gpus"],
    what="For jobs on two or more GPUs that talk over PCIe (no NVLink between them, from NVML's P2P status), "
    "reads the ACS control register of the PCIe switch ports above the GPUs (request/completion redirect) "
    "and the IOMMU domain of each GPU (DMA = translated, identity = passthrough).",
    why="NCCL's troubleshooting guide: IO virtualization (VT-d/IOMMU) can interfere with GPU Direct by "
    "redirecting all PCI point-to-point traffic to the CPU root complex (ACS), causing a significant performance "
    "reduction or even a hang; the kernel enables ACS on switch ports whenever an IOMMU is on. NCCL's P2P "
    "transport then stalls at the first all-reduce although nvidia-smi topo -p2p reports OK.",
    fix="ACS redirect: disable IO virtualization / VT-d / ACS in the BIOS, or clear it per boot on PLX/Broadcom "
    "switches with `setpci -s <bridge> ECAP_ACS+0x6.w=0000` (root; NCCL troubleshooting guide). Translated IOMMU "
    "domain: boot with `iommu=pt` (passthrough) or turn the IOMMU off. Until then, NCCL_P2P_DISABLE=1 avoids the "
    "hang at a bandwidth cost.",
)
def pcie_acs_or_iommu_blocks_p2p(facts, ctx):
    gpus = cudavis.job_gpus(facts)
    pci = facts.pci
    if pci.get("error"):
        return skip(f"the PCI probe failed: {pci['error']}")
    if len(gpus) < 2:
        return passed(f"{len(gpus)} GPU in the job: no GPU-to-GPU traffic", gpus=len(gpus))
    job = {g["index"] for g in gpus}
    pairs = [p for p in (facts.nvidia.get("p2p") or {}).get("pairs") or [] if set(p.get("gpus") or []) <= job]
    nvlinked = all(any(link.get("active") for link in g.get("nvlink") or []) for g in gpus)
    if (pairs and all(p.get("nvlink") == "ok" for p in pairs)) or (not pairs and nvlinked):
        return passed(
            "every pair of the job's GPUs is connected by NVLink: peer traffic does not cross PCIe switches",
            pairs=len(pairs),
        )
    by_key = {_pci_key(g.get("pci_bus_id")): g["index"] for g in gpus}
    sys_gpus = [s for s in pci.get("gpus") or [] if _pci_key(s.get("bdf")) in by_key]
    bridges = {b.get("bdf"): b for b in pci.get("bridges") or []}
    redirect, unreadable, translated = {}, set(), {}
    for s in sys_gpus:
        index = by_key[_pci_key(s["bdf"])]
        if _translated(s.get("iommu_domain")):
            translated[index] = s["iommu_domain"]
        for bdf in (s.get("bridges") or [])[1:]:  # below the root port: switch ports, where P2P turns around
            acs = (bridges.get(bdf) or {}).get("acs") or {}
            if not acs.get("readable"):
                unreadable.add(bdf)
            elif acs.get("request_redirect") or acs.get("completion_redirect"):
                redirect.setdefault(bdf, []).append(index)
    evidence = {
        "acs_redirect": redirect,
        "acs_unreadable": sorted(unreadable),
        "iommu_translated": translated,
        "iommu": pci.get("iommu"),
        "iommu_params": facts.kernel.get("iommu_params"),
        "p2p": {f"{p['gpus'][0]}-{p['gpus'][1]}": f"{p.get('topology')} read={p.get('read')}" for p in pairs},
    }
    fix = manual(
        "Disable ACS / VT-d in the BIOS or boot with iommu=pt (administrator); meanwhile NCCL_P2P_DISABLE=1",
        "sudo lspci -vvv | grep -E 'ACSCtl|^[0-9a-f]'",
        "cat /proc/cmdline",
    )
    if not sys_gpus:
        return skip("sysfs lists none of the job's GPUs (a container or VM without the PCI tree)", **evidence)
    if redirect:
        detail = ", ".join(f"{bdf} (above GPU {', '.join(map(str, idx))})" for bdf, idx in sorted(redirect.items()))
        return warn(
            f"PCIe ACS redirects peer-to-peer traffic on {detail}: NCCL's P2P transfers go through the root "
            "complex - much slower, or a hang at the first collective",
            fix,
            **evidence,
        )
    if translated:
        return warn(
            f"the IOMMU translates the DMA of GPU(s) {sorted(translated)} "
            f"({', '.join(sorted(set(translated.values())))}): "
            "GPU peer-to-peer and GPUDirect RDMA are remapped - slower, and on some platforms a hang",
            fix,
            **evidence,
        )
    if unreadable and (pci.get("iommu") or {}).get("enabled"):
        return info(
            f"the IOMMU is on and the ACS state of {len(unreadable)} switch port(s) needs root to read; "
            "run as root to judge",
            None,
            **evidence,
        )
    no_p2p = {f"{p['gpus'][0]}-{p['gpus'][1]}": p.get("read") for p in pairs if p.get("read") not in (None, "ok")}
    if no_p2p and not any(p.get("nvlink") == "ok" for p in pairs):
        detail = ", ".join(f"GPU {k} ({v})" for k, v in sorted(no_p2p.items()))
        return info(
            f"the driver reports no PCIe peer-to-peer between {detail}: NCCL copies through host memory (SHM), "
            "which is slower but does not hang",
            None,
            **evidence,
        )
    return passed("no ACS redirect above the job's GPUs and no translated IOMMU domain", **evidence)


@check(
    id="GD-HW-010",
    name="fabric-manager-version-mismatch",
    category="hardware",
    title="The NVIDIA fabric manager matches the driver version",
    needs=["env", "nvidia"],
    what="On NVSwitch systems, compares `nv-fabricmanager --version` with the driver version NVML reports, and reads "
    "the nvidia-fabricmanager service state.",
    why="The fabric manager must be exactly the driver's version (NVIDIA Fabric Manager user guide: the "
    "fabric manager and driver versions must match); after a driver upgrade without the matching "
    "nvidia-fabricmanager package the service fails to start, the NVSwitches stay unconfigured and CUDA "
    "initialisation fails with error 802 'system not yet initialized'.",
    fix="Install the nvidia-fabricmanager package of the driver's exact version, then "
    "`sudo systemctl restart nvidia-fabricmanager`.",
)
def fabric_manager_version_mismatch(facts, ctx):
    nv = facts.nvidia
    if not nv.get("available"):
        return skip("no NVIDIA driver (see GD-DRV-001)")
    nvswitch = nv.get("nvswitch") or {}
    fm = nvswitch.get("fabric_manager")
    evidence = {
        "nvswitch_count": nvswitch.get("count"),
        "driver_version": nv.get("driver_version"),
        "fabric_manager": fm,
    }
    if not nvswitch.get("count"):
        return passed("no NVSwitch on this machine: no fabric manager needed", **evidence)
    if not isinstance(fm, dict) or not fm.get("binary"):
        return skip(
            "nv-fabricmanager is not visible from here (a container, or not installed; see GD-HW-006)", **evidence
        )
    version, driver = fm.get("version"), nv.get("driver_version")
    if not version or not driver:
        return skip(
            "the fabric manager's version could not be read "
            f"({(fm.get('errors') or {}).get('version', 'no version printed')})",
            **evidence,
        )
    if version != driver:
        return fail(
            f"nv-fabricmanager {version} does not match driver {driver}: the service refuses to start "
            f"(state: {fm.get('service') or 'unknown'}) and CUDA fails with error 802",
            manual(
                f"Install nvidia-fabricmanager {driver} and restart it", "sudo systemctl restart nvidia-fabricmanager"
            ),
            **evidence,
        )
    service = fm.get("service") or "unknown"
    return passed(f"nv-fabricmanager {version} matches the driver (service: {service})", **evidence)


# NVIDIA DCGM's health watch warns above 8 PCIe replays per minute ("the maximum recommended by RM",
# DCGM's DcgmGpuHardwareLimits.h DCGM_LIMIT_MAX_PCIREPLAY_RATE, DCGM_FR_PCI_REPLAY_RATE). A corrected AER error
# (Receiver Error, Bad TLP/DLLP, Replay Timer Timeout) is the event behind a replay, so the same rate bounds them.
CORRECTED_PER_HOUR_LIMIT = 8 * 60
HOUR = 3600.0


def _job_links(facts) -> list[dict]:
    """Per job GPU: its PCIe link's two ends, the GPU and the port directly above it (the nearest bridge; None
    when the PCI tree was not read), with the sysfs AER totals each end counted since boot."""
    pci = facts.pci if not facts.pci.get("error") else {}
    sys_gpus = {_pci_key(s.get("bdf")): s for s in pci.get("gpus") or []}
    bridges = {b.get("bdf"): b for b in pci.get("bridges") or []}
    links = []
    for g in cudavis.job_gpus(facts):
        s = sys_gpus.get(_pci_key(g.get("pci_bus_id"))) or {}
        port = (s.get("bridges") or [None])[-1]
        ends = {s.get("bdf") or g.get("pci_bus_id"): (s.get("aer") or {}).get("corrected")}
        if port:
            ends[port] = ((bridges.get(port) or {}).get("aer") or {}).get("corrected")
        links.append({"gpu": g.get("index"), "port": port, "sysfs": ends})
    return links


def _sysfs_rates(facts, links: list[dict]) -> list[dict]:
    """Corrected errors per hour since boot at each link's ends (sysfs aer_dev_correctable, /proc/uptime)."""
    uptime = facts.pci.get("uptime_seconds")
    if not isinstance(uptime, int | float) or uptime <= 0:
        return []
    hours = max(uptime, HOUR) / HOUR  # at least an hour: a burst while the link trained at boot is not a rate
    out = []
    for link in links:
        known = {bdf: n for bdf, n in link["sysfs"].items() if isinstance(n, int)}
        if known:
            total = sum(known.values())
            out.append(
                {
                    **link,
                    "count": total,
                    "per_hour": total / hours,
                    "over": f"since boot {_uptime_text(uptime)}",
                    "ends": known,
                }
            )
    return out


def _log_rates(facts, links: list[dict]) -> list[dict]:
    """Corrected errors per hour in the kernel log's window whose source is one of each link's ends."""
    log = facts.kernel.get("log") or {}
    if not log.get("readable"):
        return []
    by_device = log.get("aer_corrected_by_device")
    if by_device is None:  # older snapshots: the listed events (the newest 50), one 'error received' line per error
        by_device = {}
        for a in log.get("aer") or []:
            if a.get("severity") == "corrected" and "error received" in (a.get("message") or ""):
                by_device[a.get("device") or "?"] = by_device.get(a.get("device") or "?", 0) + 1
    seconds = log.get("window_seconds") or (log.get("window_hours") or 24) * HOUR
    hours = max(seconds, HOUR) / HOUR
    out = []
    for link in links:
        keys = {_pci_key(bdf) for bdf in link["sysfs"]}
        ends = {dev: n for dev, n in by_device.items() if _pci_key(dev) in keys}
        if ends:
            total = sum(ends.values())
            window = f"in the kernel log of the last {seconds / HOUR:.0f} h"
            out.append({**link, "count": total, "per_hour": total / hours, "over": window, "ends": ends})
    return out


@check(
    id="GD-HW-011",
    name="pcie-corrected-error-flood",
    category="hardware",
    title="No flood of corrected PCIe errors on the GPUs' links",
    needs=["env", "nvidia"],  # pci and kernel are each optional: either gives a rate
    requires=["job-gpus"],
    what="Reads the corrected PCIe AER error totals since boot (sysfs aer_dev_correctable, world-readable) at both "
    "ends of each job GPU's link: the GPU and the port directly above it (a root port or a switch's downstream "
    "port), and turns them into a rate per hour since boot (/proc/uptime); and the kernel log's 'AER: Corrected "
    "error received: <device>' lines from either end in its window. More than DCGM's limit of 8 per minute "
    f"({CORRECTED_PER_HOUR_LIMIT} per hour, counted over at least an hour) is a warning.",
    why="A corrected error is a link-level retry (Receiver Error, Bad TLP/DLLP, Replay Timer Timeout): the data "
    "arrives, so nothing fails, but every retry costs bandwidth and a flood of them is a link degrading (a riser, "
    "cable or slot going bad, signal integrity at Gen4/Gen5 speed). It precedes the link retraining to a lower "
    "speed or width and uncorrected errors that drop the GPU off the bus (Xid 79). NVIDIA's DCGM health watch "
    "warns above 8 PCIe replays per minute (DCGM_LIMIT_MAX_PCIREPLAY_RATE, 'the maximum recommended by RM').",
    fix="Drain the node and have the link checked: reseat or replace the riser/cable, try another slot, check the "
    "BIOS PCIe settings; `sudo lspci -vvv -s <bdf>` shows the AER status, `nvidia-smi -q -d PCIE` the replay "
    "counter.",
)
def pcie_corrected_error_flood(facts, ctx):
    links = _job_links(facts)
    rates = _sysfs_rates(facts, links) + _log_rates(facts, links)
    evidence = {
        "rates": [
            {
                "gpu": r["gpu"],
                "count": r["count"],
                "per_hour": round(r["per_hour"], 1),
                "over": r["over"],
                "ends": r["ends"],
            }
            for r in rates
        ],
        "uptime_seconds": facts.pci.get("uptime_seconds"),
        "limit_per_hour": CORRECTED_PER_HOUR_LIMIT,
    }
    if not links:
        return skip("no job GPU to judge")
    if not rates:
        return skip(
            "no count of corrected PCIe errors for the job's GPUs with a time to turn it into a rate (no AER "
            "support or /sys in sysfs, no time since boot, and no readable kernel log)",
            **evidence,
        )
    flooded = [r for r in rates if r["per_hour"] > CORRECTED_PER_HOUR_LIMIT]
    if not flooded:
        worst = max(rates, key=lambda r: r["per_hour"])
        return passed(
            f"corrected PCIe errors on the job's GPU links at most {worst['per_hour']:.0f} per hour "
            f"({worst['count']} {worst['over']}): below {CORRECTED_PER_HOUR_LIMIT} per hour",
            **evidence,
        )
    detail = "; ".join(
        f"GPU {r['gpu']}: {r['count']} {r['over']}, {r['per_hour']:.0f}/h ("
        + ", ".join(f"{n} at {bdf}" for bdf, n in r["ends"].items())
        + ")"
        for r in flooded
    )
    bdfs = list(dict.fromkeys(bdf for r in flooded for bdf in r["ends"]))
    return warn(
        f"corrected PCIe errors flood the link of {detail}: above DCGM's limit of 8 per minute "
        f"({CORRECTED_PER_HOUR_LIMIT}/h) - a link degrading (riser, cable, slot) that retries transfers and goes "
        "on to retrain slower or drop the GPU off the bus",
        manual(
            "Drain the node and have the GPU's PCIe link checked (riser, cable, slot)",
            *[f"sudo lspci -vvv -s {bdf} | grep -A10 'Advanced Error'" for bdf in bdfs[:2]],
            "nvidia-smi -q -d PCIE",
        ),
        **evidence,
    )


def _uptime_text(seconds: float) -> str:
    hours = seconds / HOUR
    return f"(up {hours / 24:.1f} days)" if hours >= 48 else f"(up {hours:.1f} h)"
