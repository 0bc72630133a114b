"""PCIe facts from sysfs (section "pci"): the NVIDIA GPUs, the bridges above them with their ACS
(Access Control Services) state, and the IOMMU mode.

NCCL's troubleshooting guide: ACS on PCIe switches redirects GPU-to-GPU (P2P) traffic to the root
complex, and an IOMMU in translated (DMA) mode remaps it; either makes P2P slow, or hang. The ACS
control register lives in PCIe extended config space (offset >= 0x100), which sysfs lets only root
read past the first 64 bytes: without it acs is {"readable": false}.

Section "pci": iommu {enabled, groups}, gpus [{bdf, iommu_group, iommu_domain, bridges [bdf, from
the root port down], aer {fatal, non_fatal, corrected} | None (totals since boot)}], bridges [{bdf,
root_port, acs {readable, capable, control, request_redirect, completion_redirect, source_validation},
aer {...} | None (the port's own totals since boot: link errors are counted at both ends)}],
uptime_seconds (when the totals were read: their rate per hour since boot).
"""

from __future__ import annotations

import os
import re

from gpudoctor.fileio import read_text

NVIDIA_VENDOR = "0x10de"
_BDF = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
ACS_CAP_ID = 0x000D
MAX_GPUS = 64
MAX_CAPS = 64  # extended capabilities followed at most (a corrupt chain must not loop)


def _is_gpu(dev: str) -> bool:
    cls = read_text(os.path.join(dev, "class")) or ""
    # 0x0300xx VGA controller, 0x0302xx 3D controller (data-centre GPUs)
    return read_text(os.path.join(dev, "vendor")) == NVIDIA_VENDOR and cls[:6] in ("0x0300", "0x0302")


def acs_state(config: bytes | None) -> dict:
    """ACS capability and control bits from a device's config space bytes."""
    if config is None:
        return {"readable": False, "reason": "config space unreadable"}
    if len(config) <= 0x100:
        return {
            "readable": False,
            "reason": f"only {len(config)} bytes of config space readable (extended space needs root)",
        }
    offset, seen = 0x100, 0
    while offset and offset + 8 <= len(config) and seen < MAX_CAPS:
        header = int.from_bytes(config[offset : offset + 4], "little")
        if header in (0, 0xFFFFFFFF):
            break
        if header & 0xFFFF == ACS_CAP_ID:
            control = int.from_bytes(config[offset + 6 : offset + 8], "little")
            return {
                "readable": True,
                "capable": True,
                "control": control,
                "source_validation": bool(control & 0x1),
                "request_redirect": bool(control & 0x4),
                "completion_redirect": bool(control & 0x8),
                "direct_translated": bool(control & 0x40),
            }
        offset, seen = (header >> 20) & 0xFFC, seen + 1
    return {"readable": True, "capable": False}


def _read_config(dev: str) -> bytes | None:
    try:
        with open(os.path.join(dev, "config"), "rb") as fh:
            return fh.read(4096)
    except OSError:
        return None


AER_FILES = {"fatal": "aer_dev_fatal", "non_fatal": "aer_dev_nonfatal", "corrected": "aer_dev_correctable"}


def aer_counts(dev: str) -> dict | None:
    """PCIe AER error totals since boot from sysfs (world-readable, unlike the kernel log); None without AER.

    Each file lists counters per error type and a last line "TOTAL_ERR_FATAL 0" (or _NONFATAL, _COR)."""
    out = {}
    for kind, filename in AER_FILES.items():
        text = read_text(os.path.join(dev, filename))
        if text is None:
            continue
        total = next((line.split()[-1] for line in text.splitlines() if line.startswith("TOTAL_ERR")), None)
        if total is not None and total.isdigit():
            out[kind] = int(total)
    return out or None


def _iommu(root: str) -> dict:
    classes = os.path.join(root, "sys/class/iommu")
    groups = os.path.join(root, "sys/kernel/iommu_groups")
    units = os.listdir(classes) if os.path.isdir(classes) else []
    count = len(os.listdir(groups)) if os.path.isdir(groups) else 0
    return {"enabled": bool(units) or count > 0, "units": sorted(units)[:16], "groups": count}


def probe(root: str = "/") -> dict:
    devices_dir = os.path.join(root, "sys/bus/pci/devices")
    if not os.path.isdir(devices_dir):
        return {"error": f"{devices_dir} does not exist (no sysfs here)"}
    gpus: list[dict] = []
    bridges: dict = {}
    for name in sorted(os.listdir(devices_dir))[:4096]:
        dev = os.path.join(devices_dir, name)
        if not _is_gpu(dev):
            continue
        if len(gpus) >= MAX_GPUS:
            break
        real = os.path.realpath(dev)
        # /sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0: every BDF above the GPU is a bridge
        above = [part for part in real.split(os.sep)[:-1] if _BDF.match(part)]
        group_link = os.path.join(dev, "iommu_group")
        group = os.path.basename(os.path.realpath(group_link)) if os.path.islink(group_link) else None
        domain = read_text(os.path.join(real, "iommu_group", "type")) if group is not None else None
        gpus.append(
            {"bdf": name, "iommu_group": group, "iommu_domain": domain, "bridges": above, "aer": aer_counts(real)}
        )
        parent = os.path.dirname(real)
        for i, bdf in enumerate(reversed(above)):  # nearest first, walking up the real path
            path = parent
            for _ in range(i):
                path = os.path.dirname(path)
            if bdf not in bridges:
                bridges[bdf] = {
                    "bdf": bdf,
                    "root_port": bdf == above[0],
                    "acs": acs_state(_read_config(path)),
                    "aer": aer_counts(path),
                }
    return {
        "iommu": _iommu(root),
        "gpus": gpus,
        "bridges": sorted(bridges.values(), key=lambda b: b["bdf"]),
        "uptime_seconds": _uptime(root),
    }


def _uptime(root: str) -> float | None:
    """Seconds since boot (/proc/uptime's first field), the time the AER totals were counted over."""
    text = read_text(os.path.join(root, "proc/uptime")) or ""
    try:
        return float(text.split()[0])
    except (IndexError, ValueError):
        return None
