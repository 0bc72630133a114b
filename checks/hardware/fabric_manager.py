"""hardware checks of the NVSwitch fabric: is the fabric manager running, does its version match the driver."""

from __future__ import annotations

from gpudoctor.model import fail, info, manual, passed, skip
from gpudoctor.registry import check


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
