"""hardware checks of the errors the kernel logs: GPU Xid events and PCIe AER errors."""

from __future__ import annotations

from gpudoctor.checks.hardware._pci import pci_key
from gpudoctor.model import fail, info, manual, passed, skip, warn
from gpudoctor.readers import cudavis
from gpudoctor.registry import check

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
    gpu_of = {pci_key(g.get("pci_bus_id")): g.get("index") for g in facts.gpus if g.get("pci_bus_id")}
    job = {g.get("index") for g in cudavis.job_gpus(facts)}
    xids = log.get("xid") or []
    reset = log.get("reset_required") or []
    aer = [a for a in log.get("aer") or [] if a.get("severity") in ("fatal", "non_fatal")]
    corrected = [a for a in log.get("aer") or [] if a.get("severity") == "corrected"]

    def where(pci: str | None) -> str:
        index = gpu_of.get(pci_key(pci))
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
    on_job = any(gpu_of.get(pci_key(x.get("pci"))) in job or gpu_of.get(pci_key(x.get("pci"))) is None for x in severe)
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
    gpu_of = {pci_key(g.get("pci_bus_id")): g.get("index") for g in facts.gpus if g.get("pci_bus_id")}
    job = {g.get("index") for g in cudavis.job_gpus(facts)}
    uncorrected = {}
    for s in facts.pci.get("gpus") or []:
        index = gpu_of.get(pci_key(s.get("bdf")))
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


# NVIDIA DCGM's health watch warns above 8 PCIe replays per minute ("the maximum recommended by RM",
# DCGM's DcgmGpuHardwareLimits.h DCGM_LIMIT_MAX_PCIREPLAY_RATE, DCGM_FR_PCI_REPLAY_RATE). A corrected AER error
# (Receiver Error, Bad TLP/DLLP, Replay Timer Timeout) is the event behind a replay, so the same rate bounds them.
CORRECTED_PER_HOUR_LIMIT = 8 * 60


HOUR = 3600.0


def _job_links(facts) -> list[dict]:
    """Per job GPU: its PCIe link's two ends, the GPU and the port directly above it (the nearest bridge; None
    when the PCI tree was not read), with the sysfs AER totals each end counted since boot."""
    pci = facts.pci if not facts.pci.get("error") else {}
    sys_gpus = {pci_key(s.get("bdf")): s for s in pci.get("gpus") or []}
    bridges = {b.get("bdf"): b for b in pci.get("bridges") or []}
    links = []
    for g in cudavis.job_gpus(facts):
        s = sys_gpus.get(pci_key(g.get("pci_bus_id"))) or {}
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
        keys = {pci_key(bdf) for bdf in link["sysfs"]}
        ends = {dev: n for dev, n in by_device.items() if pci_key(dev) in keys}
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
            "no rate of corrected PCIe errors for the job's GPUs (no AER counts with a time to divide by)",
            **evidence,
            missing="no AER support or /sys in sysfs, no time since boot, and no readable kernel log",
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
