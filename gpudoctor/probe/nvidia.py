"""NVIDIA facts through NVML (the nvidia-ml-py binding, imported as pynvml).

Every NVML call is wrapped: a call this GPU or driver does not support leaves the
field None and names the call in the GPU's "unsupported" list; the probe never raises.

Section "nvidia": available, error, driver_version, nvml_version, cuda_driver_version (12040),
gpus, nvswitch {count, fabric_manager_running: True|False|None (None: cannot see, e.g. in a
container), fabric_manager {binary, version, service} (NVSwitch systems only)}, device_files,
p2p {pairs [{gpus [a, b], topology PIX|PXB|PHB|NODE|SYS|internal, read, nvlink}], truncated} | None
(fewer than two GPUs), persistenced_running (True|False|None), errors (failed system calls). Each GPU:
  index (NVML's, PCI order), name, uuid, pci_bus_id, compute_capability [9, 0],
  memory_total_bytes, memory_used_bytes (v2 query: without the driver's reservation),
  memory_reserved_bytes (None when only the v1 query worked: then "used" includes it),
  persistence_mode, compute_mode (Default|Exclusive_Thread|Prohibited|Exclusive_Process),
  mig {current, pending, devices [{uuid, memory_total_bytes}]} | None,
  ecc {current, pending, uncorrected_volatile, uncorrected_aggregate} | None,
  remapped_rows {correctable, uncorrectable, pending, failed} | None (Ampere+),
  retired_pages {pending, double_bit, single_bit} | None (pre-Ampere),
  temperature_c, power_draw_w, power_limit_w, throttle_reasons {raw, active [names]},
  pcie {gen_current, gen_max, width_current, width_max}, nvlink [{link, active}] (links the
  GPU has), processes [{pid, type, used_memory_bytes}], fabric {state, status} | None,
  unsupported [call names], errors {call: message}.
A GPU NVML cannot open is {index, error} (+ inaccessible: True for NO_PERMISSION, i.e. not
this job's GPU under a SLURM device cgroup; CUDA does not enumerate it either).
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from typing import Any

from gpudoctor.probe import fabric

THROTTLE_REASONS = {
    # bit: name (nvmlClocksEventReason*/nvmlClocksThrottleReason*; stable across versions)
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
NVLINK_MAX_LINKS = 18


def _text(v):
    return v.decode() if isinstance(v, bytes) else v


class _Calls:
    """Runs NVML calls, remembering which ones this device does not support."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.unsupported: list[str] = []
        self.errors: dict[str, str] = {}

    def __call__(self, name: str, *args):
        fn = getattr(self.nvml, name, None)
        if fn is None:
            self.unsupported.append(name)
            return None
        try:
            return fn(*args)
        except self.nvml.NVMLError as e:
            if getattr(e, "value", None) in (
                self.nvml.NVML_ERROR_NOT_SUPPORTED,
                getattr(self.nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", -1),
            ):
                self.unsupported.append(name)
            else:
                self.errors[name] = str(e)
            return None
        except Exception as e:  # ctypes or binding trouble: record, go on
            self.errors[name] = f"{type(e).__name__}: {e}"
            return None


def _memory(nvml, call, h, g: dict) -> None:
    """Total and used memory. The v2 query keeps the driver's reservation (~0.5 GiB on an
    H100) out of "used", so an idle GPU does not look busy; v1 counts it as used."""
    mem = call("nvmlDeviceGetMemoryInfo", h, nvml.nvmlMemory_v2) if hasattr(nvml, "nvmlMemory_v2") else None
    g["memory_reserved_bytes"] = int(mem.reserved) if mem is not None else None
    if mem is None:
        mem = call("nvmlDeviceGetMemoryInfo", h)
    g["memory_total_bytes"] = int(mem.total) if mem is not None else None
    g["memory_used_bytes"] = int(mem.used) if mem is not None else None


def _processes(call, h) -> list[dict]:
    """Processes with a context on the GPU. Inside a container NVML often returns none
    (other PID namespaces), so memory in use is the better sign of a busy GPU."""
    procs = []
    for kind, names in (
        ("compute", ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2")),
        ("graphics", ("nvmlDeviceGetGraphicsRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses_v2")),
    ):
        found = None
        for name in names:  # the unversioned call needs a driver with the _v3 symbol
            found = call(name, h)
            if found is not None:
                break
        for p in found or []:
            used = getattr(p, "usedGpuMemory", None)
            procs.append({"pid": int(p.pid), "type": kind, "used_memory_bytes": None if used is None else int(used)})
    return procs


def _fabric(nvml, call, h) -> dict | None:
    """NVSwitch fabric registration (Hopper and newer): state 'completed' with status 'success'
    means the fabric manager has set this GPU up. Older GPUs answer NotSupported."""
    # pynvml passes the struct straight to C: the caller must hand it over by reference.
    info = None
    for fn, struct in (
        ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
        ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"),
    ):
        if getattr(nvml, struct, None) is None:
            continue
        candidate = getattr(nvml, struct)()  # the V struct's constructor sets its version field
        if call(fn, h, ctypes.byref(candidate)) is not None:
            info = candidate
            break
    if info is None:
        return None
    states = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
    status = int(info.status)
    return {
        "state": states.get(int(info.state), str(int(info.state))),
        "status": "success" if status == 0 else _error_text(nvml, status),
    }


def _error_text(nvml, code: int) -> str:
    try:
        return str(nvml.NVMLError(code))
    except Exception:
        return f"NVML error {code}"


def _gpu(nvml, index: int) -> dict:
    call = _Calls(nvml)
    h = nvml.nvmlDeviceGetHandleByIndex(index)
    g: dict = {"index": index}
    g["name"] = _text(call("nvmlDeviceGetName", h))
    g["uuid"] = _text(call("nvmlDeviceGetUUID", h))
    pci = call("nvmlDeviceGetPciInfo", h)
    g["pci_bus_id"] = _text(pci.busId) if pci is not None else None
    _memory(nvml, call, h, g)
    cc = call("nvmlDeviceGetCudaComputeCapability", h)
    g["compute_capability"] = list(cc) if cc is not None else None
    pm = call("nvmlDeviceGetPersistenceMode", h)
    g["persistence_mode"] = None if pm is None else bool(pm)
    cm = call("nvmlDeviceGetComputeMode", h)
    g["compute_mode"] = None if cm is None else COMPUTE_MODES.get(cm, str(cm))
    g["mig"] = _mig(nvml, call, h)
    g["ecc"] = _ecc(nvml, call, h)
    # Ampere and newer remap rows; older GPUs retire pages. Each reports NotSupported on the other.
    g["remapped_rows"] = _remapped_rows(call, h)
    g["retired_pages"] = _retired_pages(nvml, call, h)
    _performance(nvml, call, h, g)
    g["nvlink"] = _nvlink(nvml, h)
    g["processes"] = _processes(call, h)
    g["fabric"] = _fabric(nvml, call, h)
    g["unsupported"] = sorted(set(call.unsupported))
    if call.errors:
        g["errors"] = call.errors
    return g


def _mig(nvml, call, h) -> dict | None:
    """MIG mode now and after the next reset, and the MIG devices with their memory when it is on."""
    mig = call("nvmlDeviceGetMigMode", h)
    if mig is None:
        return None
    current, pending = mig
    devices = []
    if current:
        count = call("nvmlDeviceGetMaxMigDeviceCount", h) or 0
        for i in range(count):
            try:
                mh = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
            except nvml.NVMLError:
                continue
            mmem = call("nvmlDeviceGetMemoryInfo", mh)
            devices.append(
                {
                    "uuid": _text(call("nvmlDeviceGetUUID", mh)),
                    "memory_total_bytes": int(mmem.total) if mmem is not None else None,
                }
            )
    return {"current": bool(current), "pending": bool(pending), "devices": devices}


def _ecc(nvml, call, h) -> dict | None:
    """ECC mode now and after the next reset; with ECC on, the uncorrected errors since boot and ever."""
    ecc = call("nvmlDeviceGetEccMode", h)
    if ecc is None:
        return None
    current, pending = ecc
    out = {"current": bool(current), "pending": bool(pending)}
    if current:
        unc = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        out["uncorrected_volatile"] = call("nvmlDeviceGetTotalEccErrors", h, unc, nvml.NVML_VOLATILE_ECC)
        out["uncorrected_aggregate"] = call("nvmlDeviceGetTotalEccErrors", h, unc, nvml.NVML_AGGREGATE_ECC)
    return out


def _remapped_rows(call, h) -> dict | None:
    remap = call("nvmlDeviceGetRemappedRows", h)
    if remap is None:
        return None
    corr, unc, pending, failed = remap
    return {"correctable": int(corr), "uncorrectable": int(unc), "pending": bool(pending), "failed": bool(failed)}


def _retired_pages(nvml, call, h) -> dict | None:
    pending_retire = call("nvmlDeviceGetRetiredPagesPendingStatus", h)
    if pending_retire is None:
        return None
    dbe = call("nvmlDeviceGetRetiredPages", h, nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    sbe = call("nvmlDeviceGetRetiredPages", h, nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
    return {
        "pending": bool(pending_retire),
        "double_bit": None if dbe is None else len(dbe),
        "single_bit": None if sbe is None else len(sbe),
    }


def _nvlink(nvml, h) -> list[dict]:
    """The GPU's NVLinks, each active or not."""
    links = []
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", NVLINK_MAX_LINKS)):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(h, link)
        except nvml.NVMLError as e:
            if getattr(e, "value", None) == nvml.NVML_ERROR_NOT_SUPPORTED:
                continue  # no NVLink, or a link this SKU does not have (H800s enable fewer)
            break  # INVALID_ARGUMENT: past the GPU's last link
        links.append({"link": link, "active": bool(state)})
    return links


def _performance(nvml, call, h, g: dict) -> None:
    """What sets the GPU's speed now: temperature, power draw and limit, clock slowdown reasons, PCIe link."""
    g["temperature_c"] = call("nvmlDeviceGetTemperature", h, nvml.NVML_TEMPERATURE_GPU)
    power = call("nvmlDeviceGetPowerUsage", h)
    g["power_draw_w"] = None if power is None else power / 1000.0
    limit = call("nvmlDeviceGetEnforcedPowerLimit", h)
    g["power_limit_w"] = None if limit is None else limit / 1000.0

    reasons = call("nvmlDeviceGetCurrentClocksEventReasons", h)
    if reasons is None:
        reasons = call("nvmlDeviceGetCurrentClocksThrottleReasons", h)
    g["throttle_reasons"] = None
    if reasons is not None:
        g["throttle_reasons"] = {
            "raw": int(reasons),
            "active": [name for bit, name in THROTTLE_REASONS.items() if reasons & bit],
        }

    g["pcie"] = {
        "gen_current": call("nvmlDeviceGetCurrPcieLinkGeneration", h),
        "gen_max": call("nvmlDeviceGetMaxPcieLinkGeneration", h),
        "width_current": call("nvmlDeviceGetCurrPcieLinkWidth", h),
        "width_max": call("nvmlDeviceGetMaxPcieLinkWidth", h),
    }


P2P_STATUS = {
    0: "ok",
    1: "chipset_not_supported",
    2: "gpu_not_supported",
    3: "topology_not_supported",
    4: "disabled_by_regkey",
    5: "not_supported",
    6: "unknown",
}
# nvmlGpuTopologyLevel_t, named as `nvidia-smi topo -m` names the path between two GPUs
TOPOLOGY = {0: "internal", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
MAX_P2P_GPUS = 16  # 120 pairs: a few ms of NVML calls


def _p2p(nvml, indices: list[int]) -> dict:
    """Topology and P2P status of every pair of GPUs (nvmlDeviceGetTopologyCommonAncestor,
    nvmlDeviceGetP2PStatus): the path NCCL's P2P traffic takes, and whether the driver allows it."""
    call = _Calls(nvml)
    shown = indices[:MAX_P2P_GPUS]
    handles = {}
    for i in shown:
        try:
            handles[i] = nvml.nvmlDeviceGetHandleByIndex(i)
        except Exception:
            continue
    # nvmlGpuP2PCapsIndex_t values from nvml.h (stable); the binding's own NVML_P2P_CAPS_INDEX_READ is the
    # tuple (0,) in nvidia-ml-py 13.615.71 (a stray comma), which ctypes refuses as an argument.
    caps = {"read": 0, "nvlink": 2}
    pairs = []
    order = sorted(handles)
    for n, a in enumerate(order):
        for b in order[n + 1 :]:
            level = call("nvmlDeviceGetTopologyCommonAncestor", handles[a], handles[b])
            pair: dict = {"gpus": [a, b], "topology": None if level is None else TOPOLOGY.get(int(level), str(level))}
            for name, index in caps.items():
                status = call("nvmlDeviceGetP2PStatus", handles[a], handles[b], index)
                pair[name] = None if status is None else P2P_STATUS.get(int(status), str(status))
            pairs.append(pair)
    out: dict = {"pairs": pairs, "truncated": len(indices) > len(shown)}
    if call.errors:
        out["errors"] = dict(list(call.errors.items())[:8])
    return out


def _nvswitch() -> dict:
    """NVSwitch systems (HGX) need nv-fabricmanager running before CUDA works.

    Each switch shows up both as /dev/nvidia-nvswitchN and under /proc/driver: count the
    larger set, not both. The fabric manager runs on the host, so from inside a container
    (another PID namespace) "not seen" means "unknown" (None), not "not running".
    """
    dev = glob.glob("/dev/nvidia-nvswitch[0-9]*")
    proc = glob.glob("/proc/driver/nvidia-nvswitch/devices/*")
    return {"count": max(len(dev), len(proc)), "fabric_manager_running": _fabric_manager_running()}


def _fabric_manager_running() -> bool | None:
    # the kernel keeps 15 characters of a name: "nv-fabricmanage"
    return fabric.process_running("nv-fabricmanage")


def probe() -> dict:
    try:
        import pynvml as nvml
    except ImportError as e:
        return {"available": False, "error": f"nvidia-ml-py is not installed ({e})", "gpus": []}
    except (Exception, SystemExit) as e:  # a pynvml shadow on sys.path that raises or calls sys.exit()
        where = getattr(sys.modules.get("pynvml"), "__file__", None)
        return {
            "available": False,
            "error": f"importing pynvml failed ({type(e).__name__}: {str(e)[:200]})"
            + (f" from {where}" if where else ""),
            "gpus": [],
        }
    try:
        nvml.nvmlInit()
    except (Exception, SystemExit) as e:
        nvml_error = getattr(nvml, "NVMLError", None)
        if isinstance(nvml_error, type) and isinstance(e, nvml_error):
            return {"available": False, "error": f"NVML: {e}", "gpus": []}
        return {"available": False, "error": f"NVML: {type(e).__name__}: {str(e)[:200]}", "gpus": []}
    try:
        call = _Calls(nvml)
        out: dict = {"available": True, "error": None}
        out["driver_version"] = _text(call("nvmlSystemGetDriverVersion"))
        out["nvml_version"] = _text(call("nvmlSystemGetNVMLVersion"))
        out["cuda_driver_version"] = call("nvmlSystemGetCudaDriverVersion_v2") or call("nvmlSystemGetCudaDriverVersion")
        count = call("nvmlDeviceGetCount") or 0
        gpus = []
        for i in range(count):
            try:
                gpus.append(_gpu(nvml, i))
            except nvml.NVMLError as e:  # e.g. a GPU that fell off the bus
                gpu = {"index": i, "error": str(e)}
                if getattr(e, "value", None) == nvml.NVML_ERROR_NO_PERMISSION:
                    # counted by nvmlDeviceGetCount_v2 but not ours to open: a SLURM job with
                    # ConstrainDevices or a container sees only its own GPUs; CUDA skips the rest
                    gpu["inaccessible"] = True
                gpus.append(gpu)
            except Exception as e:  # binding trouble: keep the other GPUs
                gpus.append({"index": i, "error": f"probe failed: {type(e).__name__}: {e}"})
        out["gpus"] = gpus
        if call.errors:
            out["errors"] = call.errors
        out["nvswitch"] = _nvswitch()
        usable = [g["index"] for g in gpus if not g.get("error")]
        out["p2p"] = _p2p(nvml, usable) if len(usable) > 1 else None
        out["persistenced_running"] = fabric.persistenced_running()
        if out["nvswitch"]["count"] or out["nvswitch"]["fabric_manager_running"]:
            out["nvswitch"]["fabric_manager"] = fabric.fabric_manager()
        out["device_files"] = sorted(os.path.basename(p) for p in glob.glob("/dev/nvidia[0-9]*"))
        return out
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def device_state(pci_bus_id: str) -> dict:
    """One GPU's condition now, for naming why it is slow: temperature, power, slowdown reasons, PCIe link,
    SM clock against its maximum, and the processes on it. {"error": ...} when NVML cannot tell; never raises.
    The smoke run calls it in a rank, on the rank's own GPU, right after the rank's timed work."""
    try:
        import pynvml as nvml

        nvml.nvmlInit()
    except (Exception, SystemExit) as e:
        return {"error": f"NVML: {type(e).__name__}: {str(e)[:200]}"}
    try:
        call = _Calls(nvml)
        h = nvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id.encode() if isinstance(pci_bus_id, str) else pci_bus_id)
        g: dict = {"pci_bus_id": pci_bus_id, "name": _text(call("nvmlDeviceGetName", h))}
        g["power_limit_default_w"] = _milli(call("nvmlDeviceGetPowerManagementDefaultLimit", h))
        _performance(nvml, call, h, g)
        g["sm_clock_mhz"] = call("nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_SM)
        g["sm_clock_max_mhz"] = call("nvmlDeviceGetMaxClockInfo", h, nvml.NVML_CLOCK_SM)
        g["processes"] = _processes(call, h)
        return g
    except Exception as e:  # a GPU NVML cannot open by that address (a container's remapped bus ids)
        return {"error": f"NVML: {type(e).__name__}: {str(e)[:200]}"}
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def _milli(value) -> float | None:
    return None if value is None else value / 1000.0
