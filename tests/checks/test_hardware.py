import types

import pynvml
import pytest

from gpudoctor.model import Severity
from gpudoctor.probe import nvidia as nvprobe
from tests.factsutil import RECORDED_CPU, make_facts, run, said, severity

MIXED = "synthetic-mixed-a100-h100-pcie"


# --- GD-HW-001 ecc-uncorrected-errors -----------------------------------------------------------


def test_volatile_uncorrected_ecc_fails():
    (f,) = run(
        "GD-HW-001",
        make_facts(patch={"nvidia.gpus.3.ecc.uncorrected_volatile": 2, "nvidia.gpus.3.ecc.uncorrected_aggregate": 2}),
    )
    assert f.severity is Severity.FAIL and "[3]" in said(f)
    assert any("nvidia-smi -r -i 3" in a.target for a in f.fix.actions)


def test_aggregate_only_ecc_warns():
    assert severity("GD-HW-001", make_facts(patch={"nvidia.gpus.3.ecc.uncorrected_aggregate": 5})) is Severity.WARN


def test_clean_ecc_passes_and_cpu_machine_skips():
    assert severity("GD-HW-001", make_facts()) is Severity.PASS
    assert severity("GD-HW-001", make_facts(RECORDED_CPU)) is Severity.SKIP


def test_ecc_errors_on_gpu_outside_the_job_do_not_count():
    f = make_facts(env={"CUDA_VISIBLE_DEVICES": "0,1"}, patch={"nvidia.gpus.3.ecc.uncorrected_volatile": 2})
    assert severity("GD-HW-001", f) is Severity.PASS


# --- GD-HW-002 memory-repair-pending ------------------------------------------------------------


def test_row_remap_pending_fails_with_reset():
    (f,) = run("GD-HW-002", make_facts(patch={"nvidia.gpus.6.remapped_rows.pending": True}))
    assert f.severity is Severity.FAIL and "reset" in said(f)


def test_row_remap_failure_fails_with_rma():
    (f,) = run("GD-HW-002", make_facts(patch={"nvidia.gpus.6.remapped_rows.failed": True}))
    assert f.severity is Severity.FAIL and "RMA" in said(f)


def test_retired_pages_pending_fails():
    f = make_facts(patch={"nvidia.gpus.0.retired_pages": {"pending": True, "double_bit": 1, "single_bit": 0}})
    assert severity("GD-HW-002", f) is Severity.FAIL


def test_no_repairs_pass():
    assert severity("GD-HW-002", make_facts()) is Severity.PASS


# --- GD-HW-003 gpu-clocks-throttled -------------------------------------------------------------


@pytest.mark.parametrize(
    "reason", ["hw_thermal_slowdown", "sw_thermal_slowdown", "hw_slowdown", "hw_power_brake_slowdown"]
)
def test_thermal_and_hardware_slowdowns_warn(reason):
    f = make_facts(patch={"nvidia.gpus.4.throttle_reasons": {"raw": 0, "active": [reason]}})
    assert severity("GD-HW-003", f) is Severity.WARN


def test_power_cap_under_load_is_info():
    f = make_facts(each_gpu={"throttle_reasons": {"raw": 4, "active": ["sw_power_cap"]}})
    assert severity("GD-HW-003", f) is Severity.INFO


def test_idle_is_not_throttling():
    assert severity("GD-HW-003", make_facts()) is Severity.PASS  # the fixture's GPUs report gpu_idle


# --- GD-HW-004 pcie-link-degraded ---------------------------------------------------------------


def test_narrow_link_warns():
    (f,) = run("GD-HW-004", make_facts(patch={"nvidia.gpus.2.pcie.width_current": 8}))
    assert f.severity is Severity.WARN and "GPU 2 x8 of x16" in said(f)


def test_low_generation_at_idle_is_not_an_alarm():
    f = make_facts(each_gpu={"pcie.gen_current": 1, "pcie.gen_max": 5})
    assert severity("GD-HW-004", f) is Severity.PASS


# --- GD-HW-005 nvlink-links-down ----------------------------------------------------------------


def test_some_links_down_warns():
    f = make_facts(patch={"nvidia.gpus.1.nvlink.3.active": False, "nvidia.gpus.1.nvlink.4.active": False})
    (finding,) = run("GD-HW-005", f)
    assert finding.severity is Severity.WARN and "GPU 1: 16 of 18" in said(finding)


def test_gpu_with_all_links_down_among_linked_peers_warns():
    f = make_facts(patch={"nvidia.gpus.5.nvlink": [{"link": i, "active": False} for i in range(18)]})
    (finding,) = run("GD-HW-005", f)
    assert finding.severity is Severity.WARN and "GPU 5" in said(finding)


def test_pcie_only_machine_passes():
    assert severity("GD-HW-005", make_facts(MIXED)) is Severity.PASS
    assert severity("GD-HW-005", make_facts()) is Severity.PASS


# --- GD-HW-006 fabric-manager-not-running -------------------------------------------------------


def test_nvswitch_without_fabric_manager_fails_with_802():
    (f,) = run("GD-HW-006", make_facts(patch={"nvidia.nvswitch.fabric_manager_running": False}))
    assert f.severity is Severity.FAIL and "802" in said(f)


def test_gpu_fabric_not_started_fails_even_when_switches_are_invisible():
    # inside a container: no /dev/nvidia-nvswitch*, fabric manager not visible, but NVML reports the state
    f = make_facts(
        patch={"nvidia.nvswitch": {"count": 0, "fabric_manager_running": None}},
        each_gpu={"fabric": {"state": "not_started", "status": "success"}},
    )
    assert severity("GD-HW-006", f) is Severity.FAIL


def test_registered_fabric_passes():
    f = make_facts(each_gpu={"fabric": {"state": "completed", "status": "success"}})
    assert severity("GD-HW-006", f) is Severity.PASS
    assert severity("GD-HW-006", make_facts()) is Severity.PASS
    assert severity("GD-HW-006", make_facts(MIXED)) is Severity.PASS


# --- the NVML probe, against a stand-in with pynvml's own constants and return shapes -----------


class FakeNVML(types.SimpleNamespace):
    """pynvml's names and return types (read from nvidia-ml-py's pynvml.py), no driver needed."""


def fake_nvml(links=18, unsupported=(), v2_memory=True):
    m = FakeNVML()
    for name in dir(pynvml):
        if name.startswith("NVML_") or name in (
            "NVMLError",
            "nvmlMemory_v2",
            "c_nvmlGpuFabricInfoV_t",
            "c_nvmlGpuFabricInfo_t",
        ):
            setattr(m, name, getattr(pynvml, name))
    ns = types.SimpleNamespace

    def not_supported(*_):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def memory(handle, version=None):
        if version:
            if not v2_memory:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            return ns(total=80 << 30, reserved=512 << 20, free=(80 << 30) - (513 << 20), used=1 << 20)
        return ns(total=80 << 30, free=(80 << 30) - (513 << 20), used=513 << 20)

    def link_state(handle, link):
        if link >= links:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if link == 2:  # a link this SKU lacks
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 0 if link == 5 else 1

    def fabric(handle, ref):
        info = ref._obj  # like NVML, write through the pointer the caller passed
        assert info.version == pynvml.nvmlGpuFabricInfo_v2
        info.state, info.status = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_SUCCESS
        return pynvml.NVML_SUCCESS

    calls = {
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetName": lambda h: "NVIDIA H100 80GB HBM3",
        "nvmlDeviceGetUUID": lambda h: f"GPU-0000000{h}",
        "nvmlDeviceGetPciInfo": lambda h: ns(busId=b"00000000:18:00.0"),
        "nvmlDeviceGetMemoryInfo": memory,
        "nvmlDeviceGetCudaComputeCapability": lambda h: (9, 0),
        "nvmlDeviceGetPersistenceMode": lambda h: pynvml.NVML_FEATURE_ENABLED,
        "nvmlDeviceGetComputeMode": lambda h: pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
        "nvmlDeviceGetMigMode": lambda h: [0, 0],
        "nvmlDeviceGetEccMode": lambda h: [1, 1],
        "nvmlDeviceGetTotalEccErrors": lambda h, kind, counter: 3 if counter == pynvml.NVML_AGGREGATE_ECC else 0,
        "nvmlDeviceGetRemappedRows": lambda h: (1, 0, 1, 0),
        "nvmlDeviceGetRetiredPagesPendingStatus": not_supported,
        "nvmlDeviceGetTemperature": lambda h, sensor: 41,
        "nvmlDeviceGetPowerUsage": lambda h: 123456,
        "nvmlDeviceGetEnforcedPowerLimit": lambda h: 700000,
        "nvmlDeviceGetCurrentClocksEventReasons": lambda h: 0x1 | 0x40,
        "nvmlDeviceGetCurrPcieLinkGeneration": lambda h: 1,
        "nvmlDeviceGetMaxPcieLinkGeneration": lambda h: 5,
        "nvmlDeviceGetCurrPcieLinkWidth": lambda h: 8,
        "nvmlDeviceGetMaxPcieLinkWidth": lambda h: 16,
        "nvmlDeviceGetNvLinkState": link_state,
        "nvmlDeviceGetComputeRunningProcesses": lambda h: [
            ns(pid=99, usedGpuMemory=None, gpuInstanceId=0, computeInstanceId=0)
        ],
        "nvmlDeviceGetGraphicsRunningProcesses": lambda h: [],
        "nvmlDeviceGetGpuFabricInfoV": fabric,
    }
    for name, fn in calls.items():
        setattr(m, name, not_supported if name in unsupported else fn)
    return m


def test_probe_reads_every_field_in_the_documented_shape():
    g = nvprobe._gpu(fake_nvml(), 0)
    assert g["memory_used_bytes"] == 1 << 20 and g["memory_reserved_bytes"] == 512 << 20  # v2: reservation apart
    assert g["compute_capability"] == [9, 0] and g["compute_mode"] == "Exclusive_Process"
    assert g["ecc"] == {"current": True, "pending": True, "uncorrected_volatile": 0, "uncorrected_aggregate": 3}
    assert g["remapped_rows"] == {"correctable": 1, "uncorrectable": 0, "pending": True, "failed": False}
    assert g["retired_pages"] is None and "nvmlDeviceGetRetiredPagesPendingStatus" in g["unsupported"]
    assert g["throttle_reasons"]["active"] == ["gpu_idle", "hw_thermal_slowdown"]
    assert g["pcie"] == {"gen_current": 1, "gen_max": 5, "width_current": 8, "width_max": 16}
    assert g["power_draw_w"] == pytest.approx(123.456)
    assert g["processes"] == [{"pid": 99, "type": "compute", "used_memory_bytes": None}]
    assert g["fabric"] == {"state": "completed", "status": "success"}


def test_probe_skips_unsupported_nvlinks_and_stops_after_the_last():
    links = nvprobe._gpu(fake_nvml(links=18), 0)["nvlink"]
    assert [link["link"] for link in links] == [i for i in range(18) if i != 2]
    assert [link["link"] for link in links if not link["active"]] == [5]
    assert nvprobe._gpu(fake_nvml(unsupported=("nvmlDeviceGetNvLinkState",)), 0)["nvlink"] == []


def test_probe_falls_back_to_v1_memory_and_records_unsupported_calls():
    g = nvprobe._gpu(fake_nvml(v2_memory=False, unsupported=("nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetMigMode")), 0)
    assert g["memory_used_bytes"] == 513 << 20 and g["memory_reserved_bytes"] is None
    assert g["mig"] is None and g["fabric"] is None
    assert "nvmlDeviceGetMigMode" in g["unsupported"]


def test_nvswitch_devices_are_counted_once(monkeypatch):
    paths = {
        "/dev/nvidia-nvswitch[0-9]*": [f"/dev/nvidia-nvswitch{i}" for i in range(4)],
        "/proc/driver/nvidia-nvswitch/devices/*": [f"/proc/driver/nvidia-nvswitch/devices/000{i}" for i in range(4)],
    }
    monkeypatch.setattr(nvprobe.glob, "glob", lambda pattern: paths.get(pattern, []))
    monkeypatch.setattr(nvprobe, "_fabric_manager_running", lambda: True)
    assert nvprobe._nvswitch() == {"count": 4, "fabric_manager_running": True}
