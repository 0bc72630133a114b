"""hardware checks of the links between GPUs and the host: PCIe width and generation, NVLink, ACS and the IOMMU."""

from __future__ import annotations

from gpudoctor.checks.hardware._pci import pci_key
from gpudoctor.model import info, manual, passed, skip, warn
from gpudoctor.readers import cudavis
from gpudoctor.registry import check
from gpudoctor.units import GIB


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


def _busy(gpu: dict) -> bool:
    """Working now: NVML does not report the idle clock reason, and memory or processes are in use."""
    reasons = gpu.get("throttle_reasons")
    if not isinstance(reasons, dict) or "gpu_idle" in (reasons.get("active") or []):
        return False
    return bool(gpu.get("processes")) or (gpu.get("memory_used_bytes") or 0) > GIB


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
    by_key = {pci_key(g.get("pci_bus_id")): g["index"] for g in gpus}
    sys_gpus = [s for s in pci.get("gpus") or [] if pci_key(s.get("bdf")) in by_key]
    bridges = {b.get("bdf"): b for b in pci.get("bridges") or []}
    redirect: dict[str, list[int]] = {}
    unreadable: set[str] = set()
    translated: dict[int, str] = {}
    for s in sys_gpus:
        index = by_key[pci_key(s["bdf"])]
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
