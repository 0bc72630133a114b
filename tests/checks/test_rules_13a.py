"""The rules of issue 13 (part A) over facts fixtures: each catches its case, and none raises a warning or a
failure on the healthy fixtures (the recorded H100, the recorded CPU machine, the healthy 8-GPU node)."""

from __future__ import annotations

import pytest

from gpudoctor.model import Context, Severity
from gpudoctor.registry import load_all
from gpudoctor.runner import run_checks
from tests.factsutil import HEALTHY_GPU, RECORDED_CPU, make_facts, run, said, severity

RECORDED_H100 = "recorded-h100x1-driver580-torch2.11-cu130"
NEW_IDS = (
    "GD-HW-007",
    "GD-HW-008",
    "GD-HW-009",
    "GD-HW-010",
    "GD-DRV-002",
    "GD-CUDA-008",
    "GD-NCCL-007",
    "GD-NCCL-008",
    "GD-NCCL-009",
    "GD-NCCL-010",
    "GD-NCCL-011",
    "GD-DEV-004",
    "GD-DEV-006",
    "GD-ALLOC-007",
    "GD-DL-010",
    "GD-PREC-003",
    "GD-HW-011",  # issue 25
    "GD-NCCL-012",
    "GD-CUDA-009",
)


def _log(**kinds) -> dict:
    log = {
        "readable": True,
        "source": "/dev/kmsg",
        "window_hours": 24,
        "xid": [],
        "reset_required": [],
        "aer": [],
        "counts": {},
        "truncated": False,
        "attempts": [],
    }
    log.update(kinds)
    return {"cmdline": "BOOT_IMAGE=/vmlinuz root=/dev/sda1", "log": log}


def _pci(gpus: list[dict], bridges: list[dict], iommu: bool = False) -> dict:
    return {
        "iommu": {"enabled": iommu, "units": ["dmar0"] if iommu else [], "groups": 40 if iommu else 0},
        "gpus": gpus,
        "bridges": bridges,
    }


def _acs(redirect: bool) -> dict:
    return {
        "readable": True,
        "capable": True,
        "control": 0x1D if redirect else 0,
        "source_validation": redirect,
        "request_redirect": redirect,
        "completion_redirect": redirect,
        "direct_translated": False,
    }


def _pcie_pairs(n: int, nvlink: str = "not_supported") -> dict:
    return {
        "pairs": [
            {"gpus": [a, b], "topology": "PXB", "read": "ok", "nvlink": nvlink}
            for a in range(n)
            for b in range(a + 1, n)
        ],
        "truncated": False,
    }


# ------------------------------------------------------------------ healthy set-ups: no new alarm


@pytest.mark.parametrize(
    "fixture, expect",
    [(RECORDED_H100, 1), (RECORDED_CPU, 0), (HEALTHY_GPU, 8), ("recorded-h200x1-driver580-torch2.11-cu130", 1)],
)
def test_new_rules_raise_nothing_on_healthy_fixtures(fixture, expect):
    found = run_checks([load_all()[i] for i in NEW_IDS], make_facts(fixture), Context(expect_gpus=expect))
    bad = [
        (f.id, f.severity.value, f.message)
        for f in found
        if f.severity in (Severity.WARN, Severity.FAIL, Severity.ERROR, Severity.INFO)
    ]
    assert bad == []


def test_healthy_fixtures_with_clean_new_facts_raise_nothing():
    """The healthy 8-GPU node with the new sections filled as a clean machine would fill them."""
    facts = make_facts(patch={"kernel": _log(), "pci": _pci([], []), "nvidia.p2p": _pcie_pairs(8, nvlink="ok")})
    found = run_checks([load_all()[i] for i in NEW_IDS], facts, Context(expect_gpus=8))
    assert [(f.id, f.message) for f in found if f.severity not in (Severity.PASS, Severity.SKIP)] == []


# ------------------------------------------------------------------ GD-HW-007 PCIe generation under load


def test_low_generation_on_a_busy_gpu_warns_but_not_at_idle():
    busy = {"pcie.gen_current": 3, "throttle_reasons": {"raw": 0, "active": []}, "memory_used_bytes": 40 << 30}
    (f,) = run("GD-HW-007", make_facts(each_gpu=busy), expect_gpus=8)
    assert f.severity is Severity.WARN and "Gen3 of Gen5" in said(f)
    # the healthy fixture: Gen1 of Gen5, idle - power saving, not a fault
    assert severity("GD-HW-007", make_facts(), expect_gpus=8) is Severity.PASS


# ------------------------------------------------------------------ GD-HW-008 kernel log


def test_xid_79_on_a_job_gpu_fails_and_names_the_gpu():
    facts = make_facts(
        patch={
            "kernel": _log(
                xid=[{"pci": "0000:18:00", "code": 79, "message": "GPU has fallen off the bus.", "seconds_ago": 300}]
            )
        }
    )
    (f,) = run("GD-HW-008", facts, expect_gpus=8)
    assert f.severity is Severity.FAIL and "GPU 0 Xid 79" in said(f)


def test_reset_required_fails():
    facts = make_facts(
        patch={
            "kernel": _log(
                reset_required=[
                    {"message": "NVRM: GPU recovery action changed to 0x1 (GPU Reset Required)", "seconds_ago": 5}
                ]
            )
        }
    )
    assert severity("GD-HW-008", facts, expect_gpus=8) is Severity.FAIL


def test_uncorrected_aer_warns_and_corrected_aer_or_app_xids_are_info():
    aer = {
        "severity": "non_fatal",
        "device": "0000:18:00.0",
        "message": "AER: Uncorrected (Non-Fatal) error received",
        "seconds_ago": 60,
    }
    assert severity("GD-HW-008", make_facts(patch={"kernel": _log(aer=[aer])}), expect_gpus=8) is Severity.WARN
    corrected = dict(aer, severity="corrected")
    app = {"pci": "0000:18:00", "code": 31, "message": "MMU Fault", "seconds_ago": 60}
    (f,) = run("GD-HW-008", make_facts(patch={"kernel": _log(aer=[corrected], xid=[app])}), expect_gpus=8)
    assert f.severity is Severity.INFO and "31" in said(f)


def test_unreadable_log_is_a_visible_could_not_check_with_the_reason():
    kernel = {
        "cmdline": None,
        "log": {
            "readable": False,
            "source": None,
            "window_hours": 24,
            "attempts": [{"source": "/dev/kmsg", "reason": "permission denied (kernel.dmesg_restrict)"}],
        },
    }
    (f,) = run("GD-HW-008", make_facts(patch={"kernel": kernel}), expect_gpus=8)
    assert f.severity is Severity.INFO and "dmesg_restrict" in said(f)
    assert "could not check" in said(f) and "gpudoctor health" in said(f)


# ------------------------------------------------------------------ GD-HW-009 ACS / IOMMU


def _two_gpus_behind_a_switch(redirect: bool, domain: str | None = None) -> dict:
    chain = ["0000:16:01.0", "0000:17:00.0"]
    gpus = [
        {"bdf": "0000:18:00.0", "iommu_group": "3", "iommu_domain": domain, "bridges": chain},
        {"bdf": "0000:2a:00.0", "iommu_group": "4", "iommu_domain": domain, "bridges": chain},
    ]
    bridges = [
        {"bdf": chain[0], "root_port": True, "acs": _acs(True)},
        {"bdf": chain[1], "root_port": False, "acs": _acs(redirect)},
    ]
    return _pci(gpus, bridges, iommu=domain is not None)


def test_acs_redirect_on_the_switch_above_pcie_gpus_warns():
    patch = {"pci": _two_gpus_behind_a_switch(redirect=True), "nvidia.p2p": _pcie_pairs(8)}
    (f,) = run("GD-HW-009", make_facts(patch=patch, env={"CUDA_VISIBLE_DEVICES": "0,1"}), expect_gpus=2)
    assert f.severity is Severity.WARN and "0000:17:00.0" in said(f)


def test_root_port_acs_alone_and_passthrough_iommu_pass():
    patch = {"pci": _two_gpus_behind_a_switch(redirect=False, domain="identity"), "nvidia.p2p": _pcie_pairs(8)}
    assert (
        severity("GD-HW-009", make_facts(patch=patch, env={"CUDA_VISIBLE_DEVICES": "0,1"}), expect_gpus=2)
        is Severity.PASS
    )


def test_translated_iommu_domain_warns():
    patch = {"pci": _two_gpus_behind_a_switch(redirect=False, domain="DMA-FQ"), "nvidia.p2p": _pcie_pairs(8)}
    (f,) = run("GD-HW-009", make_facts(patch=patch, env={"CUDA_VISIBLE_DEVICES": "0,1"}), expect_gpus=2)
    assert f.severity is Severity.WARN and "DMA-FQ" in said(f)


def test_nvlink_pairs_are_not_judged_by_acs():
    patch = {"pci": _two_gpus_behind_a_switch(redirect=True), "nvidia.p2p": _pcie_pairs(8, nvlink="ok")}
    assert severity("GD-HW-009", make_facts(patch=patch), expect_gpus=8) is Severity.PASS


# ------------------------------------------------------------------ GD-HW-010 fabric manager version


def test_fabric_manager_of_another_version_fails():
    fm = {"binary": "/usr/bin/nv-fabricmanager", "version": "535.129.03", "service": "failed"}
    (f,) = run("GD-HW-010", make_facts(patch={"nvidia.nvswitch.fabric_manager": fm}), expect_gpus=8)
    assert f.severity is Severity.FAIL and "535.129.03" in said(f) and "550.54.15" in said(f)
    same = dict(fm, version="550.54.15", service="active")
    assert (
        severity("GD-HW-010", make_facts(patch={"nvidia.nvswitch.fabric_manager": same}), expect_gpus=8)
        is Severity.PASS
    )


# ------------------------------------------------------------------ GD-DRV-002 and GD-CUDA-003 together

RTX4090 = "synthetic-docker-rtx4090-defaults"
COMPAT = {
    "path": "/usr/local/cuda-12.4/compat/libcuda.so.550.54.15",
    "version": "550.54.15",
    "source": "LD_LIBRARY_PATH",
    "symlink": False,
}
ERROR_804 = (
    "CUDA unknown error - this may be due to an incorrectly set up environment "
    "(Error 804: forward compatibility was attempted on non supported HW)"
)


def _old_driver_with_compat(base: str, cuda_ok: bool) -> dict:
    return {
        "nvidia.cuda_driver_version": 12000,
        "nvidia.driver_version": "525.147.05",
        "torch.cuda": "12.4",
        "libraries.cuda_compat": [COMPAT],
        "torch.cuda_available": cuda_ok,
        "torch.cuda_error": None if cuda_ok else ERROR_804,
        "torch.device_count": 1 if cuda_ok else 0,
    }


def test_forward_compat_on_geforce_is_error_804_in_both_checks():
    facts = make_facts(
        RTX4090,
        env={"LD_LIBRARY_PATH": "/usr/local/cuda-12.4/compat:/opt/lib"},
        patch=_old_driver_with_compat(RTX4090, False),
    )
    found = {
        f.id: f
        for f in run_checks([load_all()[i] for i in ("GD-DRV-002", "GD-CUDA-003")], facts, Context(expect_gpus=1))
    }
    drv, cuda = found["GD-DRV-002"], found["GD-CUDA-003"]
    assert drv.severity is Severity.FAIL and "804" in said(drv) and "GeForce" in said(drv)
    assert cuda.severity is Severity.FAIL and "forward-compatibility" in said(cuda)
    assert drv.fix.actions[0].value == "/opt/lib"  # the compat folder leaves LD_LIBRARY_PATH, the rest stays


def test_forward_compat_on_geforce_that_did_not_load_is_judged_by_the_real_driver():
    facts = make_facts(RTX4090, patch=_old_driver_with_compat(RTX4090, True))
    (drv,) = run("GD-DRV-002", facts, expect_gpus=1)
    assert (
        drv.severity is Severity.WARN and "forward" not in drv.message
    )  # 12.0 driver, torch 12.4: minor-version compat
    assert severity("GD-CUDA-003", facts, expect_gpus=1) is Severity.PASS


def test_forward_compat_on_a_data_centre_gpu_still_counts():
    facts = make_facts(patch=_old_driver_with_compat(HEALTHY_GPU, True))
    (drv,) = run("GD-DRV-002", facts, expect_gpus=8)
    assert drv.severity is Severity.PASS and "forward" in said(drv)


def test_cuda_10_runtime_newer_than_the_driver_fails_no_minor_version_compatibility():
    too_old = "The NVIDIA driver on your system is too old (found version 10010)"
    patch = {"nvidia.cuda_driver_version": 10010, "nvidia.driver_version": "418.87.01", "torch.cuda": "10.2"}
    facts = make_facts(patch={**patch, "torch.cuda_available": False, "torch.cuda_error": too_old})
    (drv,) = run("GD-DRV-002", facts, expect_gpus=8)
    assert drv.severity is Severity.FAIL and "10.2" in said(drv)
    same_minor_11 = make_facts(
        patch={"nvidia.cuda_driver_version": 11020, "nvidia.driver_version": "460.91.03", "torch.cuda": "11.8"}
    )
    assert (
        severity("GD-DRV-002", same_minor_11, expect_gpus=8) is Severity.WARN
    )  # CUDA 11+: minor-version compatibility


# ------------------------------------------------------------------ GD-CUDA-008 libnccl ahead of torch's

WHEEL_NCCL = "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"


def _nccl_found(*extra: dict) -> list[dict]:
    return [{"path": WHEEL_NCCL, "version": "2", "source": "pip-wheel", "symlink": False}, *extra]


def test_older_libnccl_loaded_from_ld_library_path_warns_with_a_fix():
    old = {
        "path": "/opt/hpcx/nccl/lib/libnccl.so.2.18.1",
        "version": "2.18.1",
        "source": "LD_LIBRARY_PATH",
        "symlink": False,
    }
    facts = make_facts(
        RECORDED_H100,
        env={"LD_LIBRARY_PATH": "/opt/hpcx/nccl/lib:/usr/local/nvidia/lib64"},
        patch={"libraries.found.nccl": _nccl_found(old), "torch.loaded_libraries.nccl": [old["path"]]},
    )
    (f,) = run("GD-CUDA-008", facts, expect_gpus=1)
    assert f.severity is Severity.WARN and "2.18.1" in said(f) and "2.28.9" in said(f)
    assert f.fix.actions[0].value == "/usr/local/nvidia/lib64"


def test_an_ld_library_path_copy_not_yet_loaded_is_judged_as_the_one_the_loader_will_take():
    old = {
        "path": "/usr/local/nccl/lib/libnccl.so.2",
        "version": "2",
        "source": "LD_LIBRARY_PATH",
        "symlink": True,
        "realpath": "/usr/local/nccl/lib/libnccl.so.2.21.5",
    }
    facts = make_facts(
        RECORDED_H100,
        env={"LD_LIBRARY_PATH": "/usr/local/nccl/lib"},
        patch={"libraries.found.nccl": _nccl_found(old), "torch.loaded_libraries.nccl": []},
    )
    (f,) = run("GD-CUDA-008", facts, expect_gpus=1)
    assert f.severity is Severity.WARN and "will load" in said(f) and "2.21.5" in said(f)


def test_a_newer_libnccl_or_the_system_copy_in_the_loader_cache_passes():
    newer = {
        "path": "/opt/nccl/lib/libnccl.so.2.30.1",
        "version": "2.30.1",
        "source": "LD_LIBRARY_PATH",
        "symlink": False,
    }
    facts = make_facts(
        RECORDED_H100,
        patch={"libraries.found.nccl": _nccl_found(newer), "torch.loaded_libraries.nccl": [newer["path"]]},
    )
    assert severity("GD-CUDA-008", facts, expect_gpus=1) is Severity.PASS
    # the recorded machine: libnccl 2.28.3 in the loader cache, torch's wheel 2.28.9 loaded - not a problem
    assert severity("GD-CUDA-008", make_facts(RECORDED_H100), expect_gpus=1) is Severity.PASS


# ------------------------------------------------------------ NCCL: interface lists, rails, virtual NICs, GeForce P2P

TWO_NODES = {"SLURM_JOB_ID": "42", "SLURM_NNODES": "2", "SLURM_NTASKS": "16", "SLURM_NTASKS_PER_NODE": "8"}


def _iface(name: str, *addresses: str, loopback: bool = False) -> dict:
    return {
        "name": name,
        "up": True,
        "operstate": "up",
        "loopback": loopback,
        "mtu": 1500,
        "speed_mbps": None,
        "addresses": list(addresses),
    }


LO = _iface("lo", "127.0.0.1", loopback=True)


def test_healthy_two_node_job_gets_no_new_nccl_alarm():
    facts = make_facts(env=TWO_NODES)
    for check_id in ("GD-NCCL-007", "GD-NCCL-008", "GD-NCCL-009", "GD-NCCL-010", "GD-NCCL-011"):
        assert severity(check_id, facts, expect_gpus=8) in (Severity.PASS, Severity.SKIP), check_id


def test_exclusion_list_that_keeps_lo_fails_on_two_nodes_and_passes_on_one():
    env = {**TWO_NODES, "NCCL_SOCKET_IFNAME": "^eth1"}
    (f,) = run("GD-NCCL-007", make_facts(env=env), expect_gpus=8)
    assert f.severity is Severity.FAIL and "lo" in said(f)
    assert f.fix.actions[0].value == "^lo,docker,eth1"
    assert severity("GD-NCCL-007", make_facts(env={"NCCL_SOCKET_IFNAME": "^eth1"}), expect_gpus=8) is Severity.PASS
    ok = {**TWO_NODES, "NCCL_SOCKET_IFNAME": "^lo,docker"}
    assert severity("GD-NCCL-007", make_facts(env=ok), expect_gpus=8) is Severity.PASS


def test_exclusion_list_that_keeps_a_docker_bridge_warns():
    ifaces = [LO, _iface("eth0", "10.0.3.11"), _iface("docker0", "172.17.0.1")]
    env = {**TWO_NODES, "NCCL_SOCKET_IFNAME": "^lo,eth1"}
    (f,) = run("GD-NCCL-007", make_facts(env=env, patch={"network.interfaces": ifaces}), expect_gpus=8)
    assert f.severity is Severity.WARN and "docker0" in said(f)


def test_exact_name_that_prefix_matches_a_vlan_warns_with_the_equals_fix():
    ifaces = [LO, _iface("bond0", "10.0.0.5"), _iface("bond0.2093", "10.209.0.5")]
    (f,) = run(
        "GD-NCCL-008",
        make_facts(env={"NCCL_SOCKET_IFNAME": "bond0"}, patch={"network.interfaces": ifaces}),
        expect_gpus=8,
    )
    assert f.severity is Severity.WARN and "bond0.2093" in said(f)
    assert f.fix.actions[0].value == "=bond0"
    exact = make_facts(env={"NCCL_SOCKET_IFNAME": "=bond0"}, patch={"network.interfaces": ifaces})
    assert severity("GD-NCCL-008", exact, expect_gpus=8) is Severity.PASS


def test_ib_hca_mlx5_1_also_selects_mlx5_10():
    ports = [
        {
            "device": f"mlx5_{i}",
            "port": 1,
            "state": "ACTIVE",
            "phys_state": "LinkUp",
            "rate": "400 Gb/sec (4X NDR)",
            "link_layer": "InfiniBand",
        }
        for i in (0, 1, 10, 11)
    ]
    (f,) = run(
        "GD-NCCL-008",
        make_facts(env={"NCCL_IB_HCA": "mlx5_0,mlx5_1"}, patch={"network.infiniband": ports}),
        expect_gpus=8,
    )
    assert f.severity is Severity.WARN and "mlx5_10" in said(f) and f.fix.actions[0].value == "=mlx5_0,mlx5_1"


def _ports(states: list[str], rates: list[str] | None = None) -> list[dict]:
    rates = rates or ["400 Gb/sec (4X NDR)"] * len(states)
    return [
        {
            "device": f"mlx5_{i}",
            "port": 1,
            "state": s,
            "phys_state": "LinkUp" if s == "ACTIVE" else "Polling",
            "rate": r,
            "link_layer": "InfiniBand",
        }
        for i, (s, r) in enumerate(zip(states, rates, strict=True))
    ]


def test_one_rail_down_on_a_two_node_job_warns():
    facts = make_facts(env=TWO_NODES, patch={"network.infiniband": _ports(["ACTIVE"] * 7 + ["DOWN"])})
    (f,) = run("GD-NCCL-009", facts, expect_gpus=8)
    assert f.severity is Severity.WARN and "mlx5_7:1 DOWN" in said(f)
    # a spare, uncabled port beside a full set of rails is no loss
    spare = make_facts(env=TWO_NODES, patch={"network.infiniband": _ports(["ACTIVE"] * 8 + ["DOWN"])})
    assert severity("GD-NCCL-009", spare, expect_gpus=8) is Severity.PASS
    # one node: not judged
    assert (
        severity(
            "GD-NCCL-009", make_facts(patch={"network.infiniband": _ports(["ACTIVE"] * 7 + ["DOWN"])}), expect_gpus=8
        )
        is Severity.SKIP
    )


def test_a_rail_at_a_lower_rate_warns():
    rates = ["400 Gb/sec (4X NDR)"] * 7 + ["200 Gb/sec (4X HDR)"]
    (f,) = run(
        "GD-NCCL-009",
        make_facts(env=TWO_NODES, patch={"network.infiniband": _ports(["ACTIVE"] * 8, rates)}),
        expect_gpus=8,
    )
    assert f.severity is Severity.WARN and "200 Gb/s" in said(f)


def test_virbr0_and_a_bmc_usb_nic_among_nccl_default_candidates_warn_on_two_nodes():
    ifaces = [LO, _iface("eno1", "10.1.0.7"), _iface("virbr0", "192.168.122.1"), _iface("usb0", "169.254.3.1")]
    no_ib = {"network.infiniband": []}
    (f,) = run("GD-NCCL-010", make_facts(env=TWO_NODES, patch={"network.interfaces": ifaces, **no_ib}), expect_gpus=8)
    assert f.severity is Severity.WARN and "virbr0" in said(f) and "usb0" in said(f)
    assert f.fix.actions[0].value == "eno1"
    # an IPoIB interface: NCCL takes ib* first, the bridge is never a candidate
    with_ib = ifaces + [_iface("ibp24s0", "192.168.10.11")]
    assert (
        severity("GD-NCCL-010", make_facts(env=TWO_NODES, patch={"network.interfaces": with_ib}), expect_gpus=8)
        is Severity.PASS
    )


def _geforce_pair(driver: str) -> dict:
    return {
        "nvidia.driver_version": driver,
        "nvidia.p2p": {"pairs": [{"gpus": [0, 1], "topology": "PHB", "read": "ok", "nvlink": "not_supported"}]},
    }


def test_pcie_p2p_on_geforce_with_a_known_bad_driver_warns():
    facts = make_facts(
        env={"CUDA_VISIBLE_DEVICES": "0,1"},
        each_gpu={"name": "NVIDIA GeForce RTX 4090"},
        patch=_geforce_pair("525.60.11"),
    )
    (f,) = run("GD-NCCL-011", facts, expect_gpus=2)
    assert f.severity is Severity.WARN and f.fix.actions[0].target == "NCCL_P2P_DISABLE"
    newer = make_facts(
        env={"CUDA_VISIBLE_DEVICES": "0,1"},
        each_gpu={"name": "NVIDIA GeForce RTX 4090"},
        patch=_geforce_pair("570.124.06"),
    )
    assert severity("GD-NCCL-011", newer, expect_gpus=2) is Severity.INFO
    disabled = make_facts(
        env={"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_P2P_DISABLE": "1"},
        each_gpu={"name": "NVIDIA GeForce RTX 4090"},
        patch=_geforce_pair("525.60.11"),
    )
    assert severity("GD-NCCL-011", disabled, expect_gpus=2) is Severity.PASS


# ------------------------------------------------------------------ devices: MIG list, persistence on multi-GPU servers

MIG = "synthetic-a100x2-mig"
MIG0, MIG1 = "MIG-9a1b2c3d-4e5f-5a6b-8c7d-000000000000", "MIG-9a1b2c3d-4e5f-5a6b-8c7d-000000000001"


def test_two_mig_devices_listed_for_one_process_warns_and_keeps_the_first():
    (f,) = run("GD-DEV-004", make_facts(MIG, env={"CUDA_VISIBLE_DEVICES": f"{MIG0},{MIG1}"}))
    assert f.severity is Severity.WARN and "only the first" in said(f)
    assert f.fix.actions[0].value == MIG0
    assert severity("GD-DEV-004", make_facts(MIG, env={"CUDA_VISIBLE_DEVICES": MIG1}), expect_gpus=1) is Severity.PASS


def test_persistence_off_on_a_single_gpu_machine_stays_info():
    one = make_facts(RECORDED_H100, patch={"nvidia.gpus.0.persistence_mode": False})
    assert severity("GD-DEV-006", one, expect_gpus=1) is Severity.INFO


# ------------------------------------------------------------------ allocator, dataloader, precision

WSL_KERNEL = "5.15.153.1-microsoft-standard-WSL2"


def test_max_split_with_expandable_segments_warns_and_keeps_the_other_keys():
    env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512,expandable_segments:True,garbage_collection_threshold:0.8"}
    (f,) = run("GD-ALLOC-007", make_facts(env=env), expect_gpus=8)  # torch 2.3.1: the fixed assert, the growth remains
    assert f.severity is Severity.WARN and "123548" in said(f)
    assert f.fix.actions[0].value == "expandable_segments:True,garbage_collection_threshold:0.8"
    (old,) = run(
        "GD-ALLOC-007",
        make_facts(env=env, patch={"torch_meta.version": "2.2.2", "torch.version": "2.2.2"}),
        expect_gpus=8,
    )
    assert old.severity is Severity.WARN and "INTERNAL ASSERT" in said(old)
    for alone in (
        "expandable_segments:True",
        "max_split_size_mb:512",
        "max_split_size_mb:512,expandable_segments:False",
    ):
        assert (
            severity("GD-ALLOC-007", make_facts(env={"PYTORCH_CUDA_ALLOC_CONF": alone}), expect_gpus=8) is Severity.PASS
        )


def test_pin_memory_under_wsl2_warns_also_by_the_hugging_face_default():
    wsl = make_facts(RTX4090, patch={"host.kernel": WSL_KERNEL})
    (f,) = run(
        "GD-DL-010",
        wsl,
        expect_gpus=1,
        config={"dataloader": {"pin_memory": True, "num_workers": 4}},
        config_path="train.yaml",
    )
    assert f.severity is Severity.WARN and f.fix.actions[0].value is False
    hf = {"per_device_train_batch_size": 8, "dataloader_num_workers": 4}
    (d,) = run("GD-DL-010", wsl, expect_gpus=1, config=hf, config_path="args.yaml")
    assert d.severity is Severity.WARN and "default" in said(d)
    # native Linux: no finding; WSL2 with pinning off: GD-DL-003 no longer asks to turn it on
    assert (
        severity("GD-DL-010", make_facts(RTX4090), expect_gpus=1, config={"dataloader": {"pin_memory": True}})
        is Severity.PASS
    )
    off = {"dataloader": {"pin_memory": False, "num_workers": 4}}
    assert severity("GD-DL-010", wsl, expect_gpus=1, config=off) is Severity.PASS
    assert severity("GD-DL-003", wsl, expect_gpus=1, config=off) is Severity.PASS
    assert severity("GD-DL-003", make_facts(RTX4090), expect_gpus=1, config=off) is Severity.INFO


def _v100(n: int = 8) -> dict:
    return {"name": "Tesla V100-SXM2-32GB", "compute_capability": [7, 0]}


def test_hf_tf32_on_volta_fails_and_other_tf32_requests_warn():
    volta = make_facts(each_gpu=_v100())
    (f,) = run(
        "GD-PREC-003",
        volta,
        expect_gpus=8,
        config={"training_args": {"tf32": True, "bf16": False}},
        config_path="a.yaml",
    )
    assert f.severity is Severity.FAIL and "Ampere" in said(f) and f.fix.actions[0].key == "training_args.tf32"
    (w,) = run("GD-PREC-003", volta, expect_gpus=8, config={"trainer": {"float32_matmul_precision": "high"}})
    assert w.severity is Severity.WARN
    assert severity("GD-PREC-003", make_facts(), expect_gpus=8, config={"tf32": True}) is Severity.PASS  # H100
    assert severity("GD-PREC-003", volta, expect_gpus=8, config={"tf32": False}) is Severity.PASS


def test_unreadable_log_with_uncorrected_aer_counters_in_sysfs_warns():
    kernel = {
        "cmdline": None,
        "log": {"readable": False, "attempts": [{"source": "/dev/kmsg", "reason": "permission denied"}]},
    }
    pci = _pci([{"bdf": "0000:18:00.0", "bridges": [], "aer": {"fatal": 0, "non_fatal": 3, "corrected": 40}}], [])
    (f,) = run("GD-HW-008", make_facts(patch={"kernel": kernel, "pci": pci}), expect_gpus=8)
    assert f.severity is Severity.WARN and "GPU 0: 3" in said(f)
    corrected_only = _pci(
        [{"bdf": "0000:18:00.0", "bridges": [], "aer": {"fatal": 0, "non_fatal": 0, "corrected": 40}}], []
    )
    (f,) = run("GD-HW-008", make_facts(patch={"kernel": kernel, "pci": corrected_only}), expect_gpus=8)
    assert f.severity is Severity.INFO and "could not check" in said(f)  # corrected ones: GD-HW-011's rate


def test_nvlinked_gpus_without_p2p_facts_are_not_judged_by_acs():
    patch = {"pci": _two_gpus_behind_a_switch(redirect=True), "nvidia.p2p": None}
    assert (
        severity("GD-HW-009", make_facts(patch=patch), expect_gpus=8) is Severity.PASS
    )  # the fixture's NVLinks are up
    no_links = make_facts(patch=patch, env={"CUDA_VISIBLE_DEVICES": "0,1"}, each_gpu={"nvlink": []})
    assert severity("GD-HW-009", no_links, expect_gpus=2) is Severity.WARN


ERRORS = {
    "ok": None,
    "too_old": "The NVIDIA driver on your system is too old (found version 12000)",
    "804": ERROR_804,
}


@pytest.mark.parametrize("base", [HEALTHY_GPU, RTX4090])
@pytest.mark.parametrize("with_compat", [False, True])
@pytest.mark.parametrize("outcome", sorted(ERRORS))
@pytest.mark.parametrize(
    "driver_cuda, torch_cuda", [(12000, "12.4"), (11080, "12.1"), (12040, "12.4"), (10010, "10.2")]
)
def test_drv002_and_cuda003_never_contradict(base, with_compat, outcome, driver_cuda, torch_cuda):
    """DRV-002 may not pass when CUDA-003 fails for a driver cause, nor fail when torch did initialise CUDA."""
    ok = outcome == "ok"
    patch = {
        "nvidia.cuda_driver_version": driver_cuda,
        "torch.cuda": torch_cuda,
        "torch.cuda_available": ok,
        "torch.cuda_error": ERRORS[outcome],
        "torch.device_count": 1 if ok else 0,
        "libraries.cuda_compat": [COMPAT] if with_compat else [],
    }
    facts = make_facts(base, patch=patch)
    found = run_checks([load_all()[i] for i in ("GD-DRV-002", "GD-CUDA-003")], facts, Context())
    drv, cuda = (next(f for f in found if f.id == i) for i in ("GD-DRV-002", "GD-CUDA-003"))
    if cuda.severity is Severity.FAIL and outcome in ("too_old", "804"):
        assert drv.severity is Severity.FAIL, (drv.message, cuda.message)
    if cuda.severity is Severity.PASS:
        assert drv.severity is not Severity.FAIL, (drv.message, cuda.message)


def test_this_machines_own_kernel_log_and_pci_tree_raise_no_new_alarm():
    """The new sections probed live here (a CI VM: its log readable or not, no PCI GPUs), judged with the
    recorded CPU machine's other facts: a healthy machine gets pass or skip, with the reason."""
    from gpudoctor.probe import kernel, pci

    live = {"kernel": kernel.probe(), "pci": pci.probe()}
    facts = make_facts(RECORDED_CPU, patch=live)
    found = run_checks([load_all()[i] for i in ("GD-HW-008", "GD-HW-009")], facts, Context(expect_gpus=0))
    xids = live["kernel"]["log"].get("xid") or []
    if xids:  # a machine with a real Xid in its log must not pass: then the test says so instead
        pytest.skip(f"this machine's kernel log has Xid events: {xids[:2]}")
    assert all(f.severity in (Severity.PASS, Severity.SKIP) for f in found), [(f.id, f.message) for f in found]


def test_an_exclusion_list_leaving_only_lo_is_left_to_nccl_002():
    ifaces = [LO, _iface("eth0", "10.0.3.11")]
    env = {**TWO_NODES, "NCCL_SOCKET_IFNAME": "^eth"}
    facts = make_facts(env=env, patch={"network.interfaces": ifaces})
    assert severity("GD-NCCL-007", facts, expect_gpus=8) is Severity.SKIP
    assert severity("GD-NCCL-002", facts, expect_gpus=8) is Severity.FAIL


def test_a_cleared_recovery_action_is_not_a_reset_request():
    from gpudoctor.probe import kernel

    events: dict = {}
    counts: dict = {}
    cleared = "NVRM: Xid (PCI:0000:86:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"
    kernel.classify(cleared, 5.0, events, counts)
    assert counts == {}


def test_virtual_nic_beside_active_infiniband_is_only_info():
    ifaces = [LO, _iface("eno1", "10.1.0.7"), _iface("virbr0", "192.168.122.1")]
    facts = make_facts(env=TWO_NODES, patch={"network.interfaces": ifaces})  # the fixture's 8 IB ports are ACTIVE
    assert severity("GD-NCCL-010", facts, expect_gpus=8) is Severity.INFO


def test_nccl_version_with_a_suffix_item_is_read_as_three_numbers():
    old = {
        "path": "/opt/nccl/lib/libnccl.so.2.18.1",
        "version": "2.18.1",
        "source": "LD_LIBRARY_PATH",
        "symlink": False,
    }
    patch = {
        "torch.nccl": [2, 28, 9, "+cuda13.0"],
        "libraries.found.nccl": _nccl_found(old),
        "torch.loaded_libraries.nccl": [old["path"]],
    }
    (f,) = run("GD-CUDA-008", make_facts(RECORDED_H100, patch=patch), expect_gpus=1)
    assert f.severity is Severity.WARN and "2.28.9" in said(f) and "+cuda" not in said(f)


def test_pcie_pairs_without_driver_p2p_are_info():
    pairs = {"pairs": [{"gpus": [0, 1], "topology": "SYS", "read": "chipset_not_supported", "nvlink": "not_supported"}]}
    patch = {"pci": _two_gpus_behind_a_switch(redirect=False), "nvidia.p2p": pairs}
    (f,) = run("GD-HW-009", make_facts(patch=patch, env={"CUDA_VISIBLE_DEVICES": "0,1"}), expect_gpus=2)
    assert f.severity is Severity.INFO and "chipset_not_supported" in said(f)


@pytest.mark.parametrize(
    "driver, expected, source",
    [
        ("525.60.11", Severity.WARN, "nccl-tests#117"),
        ("535.183.01", Severity.INFO, None),  # 535 fixed the hang of NVIDIA/nccl#1127
        ("545.29.06", Severity.WARN, "nccl#1127"),
        ("560.35.03", Severity.WARN, "xgboost#11242"),
        ("570.124.06", Severity.INFO, None),
    ],
)
def test_geforce_p2p_is_judged_by_the_driver_branches_with_reports(driver, expected, source):
    facts = make_facts(
        env={"CUDA_VISIBLE_DEVICES": "0,1"}, each_gpu={"name": "NVIDIA GeForce RTX 4090"}, patch=_geforce_pair(driver)
    )
    (f,) = run("GD-NCCL-011", facts, expect_gpus=2)
    assert f.severity is expected, f.message
    if source:
        assert source in said(f) and f"on the {driver.split('.')[0]} branch" in said(f)


def test_kernel_log_hidden_in_a_container_says_xids_were_not_checked():
    # a container: /dev/kmsg absent, dmesg refused (EPERM), no journal: never a silent skip
    attempts = [
        {"source": "/dev/kmsg", "reason": "not present"},
        {"source": "dmesg", "reason": "dmesg: read kernel buffer failed: Operation not permitted"},
    ]
    kernel = {"cmdline": None, "log": {"readable": False, "source": None, "window_hours": 24, "attempts": attempts}}
    patch = {"kernel": kernel, "host.container": {"docker": True, "in_container": True}}
    (f,) = run("GD-HW-008", make_facts(patch=patch), expect_gpus=8)
    assert f.severity is Severity.INFO and "container" in said(f) and "Operation not permitted" in said(f)
    assert f.fix is not None and "gpudoctor health" in f.fix.actions[0].target
    kernel_failed = {"cmdline": None, "log": {}, "error": "TimeoutExpired"}
    (f,) = run("GD-HW-008", make_facts(patch={"kernel": kernel_failed}), expect_gpus=8)
    assert f.severity is Severity.INFO and "could not check" in said(f)


# ------------------------------------------------------------------ GD-HW-011 corrected PCIe error flood


def _gpu_behind_port(gpu_corrected: int, port_corrected: int | None, uptime: float | None) -> dict:
    gpu = {"bdf": "0000:18:00.0", "bridges": ["0000:00:01.0", "0000:16:00.0"], "aer": {"corrected": gpu_corrected}}
    port_aer = None if port_corrected is None else {"fatal": 0, "non_fatal": 0, "corrected": port_corrected}
    bridges = [
        {"bdf": "0000:00:01.0", "root_port": True, "acs": {"readable": False}, "aer": {"corrected": 0}},
        {"bdf": "0000:16:00.0", "root_port": False, "acs": {"readable": False}, "aer": port_aer},
    ]
    return {**_pci([gpu], bridges), "uptime_seconds": uptime}


def _one_gpu_at(bdf: str) -> dict:
    return {"nvidia.gpus": [dict(make_facts().gpus[0], index=0, pci_bus_id=bdf)]}


def test_a_flood_of_corrected_errors_on_the_gpus_upstream_port_warns_with_the_rate():
    # 2 days up, 150 000 corrected errors counted at the switch port above the GPU: ~3 125 per hour
    pci = _gpu_behind_port(12, 150_000, 2 * 24 * 3600.0)
    (f,) = run("GD-HW-011", make_facts(patch={"pci": pci, **_one_gpu_at("00000000:18:00.0")}), expect_gpus=1)
    assert f.severity is Severity.WARN, f.message
    assert "3125/h" in said(f) and "0000:16:00.0" in said(f) and "8 per minute" in said(f)
    assert "since boot (up 2.0 days)" in said(f)


def test_a_few_corrected_errors_or_a_boot_burst_pass():
    facts = make_facts(patch={"pci": _gpu_behind_port(3, 20, 30 * 24 * 3600.0), **_one_gpu_at("0000:18:00.0")})
    assert severity("GD-HW-011", facts, expect_gpus=1) is Severity.PASS
    # 300 errors while the link trained, two minutes after boot: counted over an hour at least, not 9 000/h
    burst = make_facts(patch={"pci": _gpu_behind_port(0, 300, 120.0), **_one_gpu_at("0000:18:00.0")})
    assert severity("GD-HW-011", burst, expect_gpus=1) is Severity.PASS


def test_corrected_errors_without_the_time_since_boot_are_not_judged():
    old = make_facts(patch={"pci": _gpu_behind_port(0, 150_000, None), **_one_gpu_at("0000:18:00.0")})
    (f,) = run("GD-HW-011", old, expect_gpus=1)
    assert f.severity is Severity.SKIP and "since boot" in said(f)


def _corrected_lines(source: str, n: int) -> list[dict]:
    message = f"pcieport 0000:00:01.0: AER: Corrected error received: {source}"
    return [{"severity": "corrected", "device": source, "message": message, "seconds_ago": 60} for _ in range(n)]


def test_a_flood_of_corrected_errors_in_the_kernel_log_warns_with_its_rate_not_an_info():
    # 40 000 'AER: Corrected error received' lines from the GPU's upstream port in the last 24 h: ~1 667 per hour
    log = _log(aer=_corrected_lines("0000:16:00.0", 50), counts={"aer": 80_000}, truncated=True)
    log["log"]["aer_corrected_by_device"] = {"0000:16:00.0": 40_000}
    log["log"]["window_seconds"] = 86_400
    pci = _gpu_behind_port(0, None, None)
    facts = make_facts(patch={"pci": pci, "kernel": log, **_one_gpu_at("0000:18:00.0")})
    (f,) = run("GD-HW-011", facts, expect_gpus=1)
    assert f.severity is Severity.WARN and "1667/h" in said(f) and "kernel log" in said(f), f.message
    # a few, or another device's: no alarm
    log["log"]["aer_corrected_by_device"] = {"0000:16:00.0": 30, "0000:af:00.0": 90_000}
    facts = make_facts(patch={"pci": pci, "kernel": log, **_one_gpu_at("0000:18:00.0")})
    assert severity("GD-HW-011", facts, expect_gpus=1) is Severity.PASS


# ------------------------------------------------------------ GD-NCCL-012 a non-PCI NIC first (NCCL 2.18.5-2.20.2)


def _nic(name: str, ifindex: int, bus: str | None, *addresses: str) -> dict:
    return dict(_iface(name, *addresses), ifindex=ifindex, bus=bus)


ONE_NODE_8 = {"SLURM_JOB_ID": "7", "SLURM_NNODES": "1", "SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "8"}
USB_FIRST = [
    dict(LO, ifindex=1, bus=None),
    _nic("enx0c3796a1b2c3", 2, "usb", "169.254.3.1"),
    _nic("eno1", 3, "pci", "10.1.0.7"),
]


def _nccl_facts(interfaces, nccl, env=ONE_NODE_8):
    patch = {"network.interfaces": interfaces, "network.infiniband": [], "torch.nccl": list(nccl)}
    return make_facts(env=env, patch=patch)


def test_a_usb_nic_first_on_one_node_warns_for_nccl_2_18_and_2_19():
    for nccl in ((2, 18, 5), (2, 19, 3)):
        (f,) = run("GD-NCCL-012", _nccl_facts(USB_FIRST, nccl), expect_gpus=8)
        assert f.severity is Severity.WARN, (nccl, f.message)
        assert "enx0c3796a1b2c3 (a usb device)" in said(f) and "nccl#1125" in said(f)
        action = f.fix.actions[0]
        assert action.target == "NCCL_SOCKET_IFNAME" and action.value == "^docker,lo,enx0c3796a1b2c3"


def test_nccl_outside_the_window_or_a_pci_nic_first_or_infiniband_pass():
    assert severity("GD-NCCL-012", _nccl_facts(USB_FIRST, (2, 20, 3)), expect_gpus=8) is Severity.PASS
    assert severity("GD-NCCL-012", _nccl_facts(USB_FIRST, (2, 18, 3)), expect_gpus=8) is Severity.PASS
    pci_first = [USB_FIRST[0], dict(USB_FIRST[1], ifindex=9), USB_FIRST[2]]
    assert severity("GD-NCCL-012", _nccl_facts(pci_first, (2, 19, 3)), expect_gpus=8) is Severity.PASS
    # the name alone (an older snapshot without "bus"): systemd's enx<MAC> is a USB NIC
    unprobed = [{k: v for k, v in i.items() if k != "bus"} for i in USB_FIRST]
    assert severity("GD-NCCL-012", _nccl_facts(unprobed, (2, 19, 3)), expect_gpus=8) is Severity.WARN
    excluded = {**ONE_NODE_8, "NCCL_SOCKET_IFNAME": "eno1"}
    assert severity("GD-NCCL-012", _nccl_facts(USB_FIRST, (2, 19, 3), excluded), expect_gpus=8) is Severity.PASS
    with_ib = make_facts(
        env=ONE_NODE_8,
        patch={"network.interfaces": USB_FIRST, "torch.nccl": [2, 19, 3], "network.infiniband": _ports(["ACTIVE"])},
    )
    assert severity("GD-NCCL-012", with_ib, expect_gpus=8) is Severity.PASS
