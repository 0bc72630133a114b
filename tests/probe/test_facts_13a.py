"""The kernel, PCI and NVIDIA-daemon probes of issue 13 against real files and real processes: a fake
sysfs tree with real config-space bytes, fake journalctl/dmesg/nv-fabricmanager scripts on PATH
(one of them hangs with a child, to prove the bound and the process-group kill)."""

from __future__ import annotations

import time
from pathlib import Path

from gpudoctor.facts import Facts, collectable_env
from gpudoctor.factschema import first_problem
from gpudoctor.probe import fabric, kernel, pci


def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def _proc(tmp_path: Path, uptime: float = 100000.0) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir(exist_ok=True)
    (proc / "uptime").write_text(f"{uptime} 1.0\n")
    (proc / "cmdline").write_text("BOOT_IMAGE=/vmlinuz root=/dev/sda1 intel_iommu=on iommu=pt\n")
    return proc


# ------------------------------------------------------------------ kernel log


def test_xid_reset_and_aer_lines_are_classified():
    events: dict = {}
    counts: dict = {}
    for line in (
        "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        "NVRM: Xid (PCI:0000:86:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
        "pcieport 0000:00:03.0: AER: Uncorrected (Non-Fatal) error received: 0000:3b:00.0",
        "pcieport 0000:00:03.0: AER: Corrected error received: 0000:3b:00.0",
        "nvidia 0000:3b:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Requester ID)",
        "e1000e: eth0 NIC Link is Up 1000 Mbps Full Duplex",
    ):
        kernel.classify(line, 60.0, events, counts)
    assert [(x["pci"], x["code"]) for x in events["xid"]] == [("0000:3b:00", 79), ("0000:86:00", 154)]
    assert len(events["reset_required"]) == 1 and "Reset Required" in events["reset_required"][0]["message"]
    assert [a["severity"] for a in events["aer"]] == ["non_fatal", "corrected", "fatal"]
    assert events["aer"][0]["device"] == "0000:3b:00.0"
    # corrected errors are also counted per source device, without the cap on listed events (GD-HW-011's rate)
    assert counts == {"xid": 2, "reset_required": 1, "aer": 3, "aer_corrected:0000:3b:00.0": 1}


def test_journal_is_read_when_kmsg_is_missing_and_old_lines_are_dropped(tmp_path):
    now = time.time()
    _script(
        tmp_path / "bin/journalctl",
        f'echo "{now - 7200:.6f} node1 kernel: NVRM: Xid (PCI:0000:18:00): 48, pid=1, DBE (0x1,0x2)"\n'
        f'echo "{now - 60:.6f} node1 kernel: NVRM: Xid (PCI:0000:18:00): 63, pid=1, Row Remapping"\n',
    )
    log = kernel.kernel_log(
        kmsg_path=str(tmp_path / "no-kmsg"), proc_root=str(_proc(tmp_path)), path=str(tmp_path / "bin"), hours=1
    )
    assert log["readable"] and log["source"] == "journalctl"
    assert [x["code"] for x in log["xid"]] == [63]  # the DBE two hours ago is outside the 1-hour window
    assert log["attempts"][0]["source"] == "/dev/kmsg" and "does not exist" in log["attempts"][0]["reason"]
    assert log["aer_corrected_by_device"] == {} and log["window_seconds"] == 3600


def test_a_hanging_journalctl_is_killed_with_its_child_and_dmesg_is_used(tmp_path):
    pidfile = tmp_path / "child.pid"
    _script(tmp_path / "bin/journalctl", f"sleep 300 & echo $! > {pidfile}\nwait\n")
    _script(tmp_path / "bin/dmesg", 'echo "[99990.5] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."\n')
    started = time.monotonic()
    log = kernel.kernel_log(
        kmsg_path=str(tmp_path / "no-kmsg"), proc_root=str(_proc(tmp_path)), path=str(tmp_path / "bin")
    )
    elapsed = time.monotonic() - started
    assert elapsed < kernel.COMMAND_TIMEOUT + 2, elapsed
    assert log["source"] == "dmesg" and log["xid"][0]["code"] == 79 and log["xid"][0]["seconds_ago"] == 10
    assert "did not answer" in log["attempts"][1]["reason"]
    child = int(pidfile.read_text())
    time.sleep(0.2)
    assert not _alive(child), "the hanging journalctl's child outlived the probe"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:
        return False


def test_unreadable_log_says_why_for_every_source(tmp_path):
    _script(tmp_path / "bin/journalctl", 'echo "No journal files were opened due to insufficient permissions." >&2\n')
    log = kernel.kernel_log(
        kmsg_path=str(tmp_path / "no-kmsg"), proc_root=str(_proc(tmp_path)), path=str(tmp_path / "bin")
    )
    assert log["readable"] is False and log["source"] is None
    reasons = {a["source"]: a["reason"] for a in log["attempts"]}
    assert "permission" in reasons["journalctl"] and "not found" in reasons["dmesg"]


def test_real_kernel_log_probe_is_fast_and_follows_the_schema():
    started = time.monotonic()
    section = kernel.probe()
    assert time.monotonic() - started < 3.0
    assert isinstance(section["log"]["readable"], bool)
    data = {"schema": "gpudoctor.facts/1", "kernel": section, "pci": pci.probe()}
    assert first_problem(data) is None


# ------------------------------------------------------------------ PCI / ACS


def _config_with_acs(control: int | None) -> bytes:
    """4096 bytes of config space: an AER capability at 0x100, then ACS at 0x148 (when control is given)."""
    space = bytearray(4096)
    space[0:2] = (0x10B5).to_bytes(2, "little")  # a PLX switch port
    next_cap = 0x148 if control is not None else 0
    space[0x100:0x104] = (0x0001 | (1 << 16) | (next_cap << 20)).to_bytes(4, "little")  # AER
    if control is not None:
        space[0x148:0x14C] = (0x000D | (1 << 16)).to_bytes(4, "little")
        space[0x14C:0x14E] = (0x5F).to_bytes(2, "little")  # capabilities
        space[0x14E:0x150] = control.to_bytes(2, "little")
    return bytes(space)


def _device(root: Path, chain: list[str], vendor: str, cls: str, config: bytes) -> Path:
    path = root / "sys/devices/pci0000:00"
    for bdf in chain:
        path = path / bdf
    path.mkdir(parents=True, exist_ok=True)
    (path / "vendor").write_text(vendor + "\n")
    (path / "class").write_text(cls + "\n")
    (path / "config").write_bytes(config)
    link = root / "sys/bus/pci/devices" / chain[-1]
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        link.symlink_to(path)
    return path


def test_acs_redirect_on_the_switch_above_two_gpus_is_read_from_config_space(tmp_path):
    chain = ["0000:00:01.0", "0000:01:00.0", "0000:02:08.0"]
    _device(tmp_path, chain[:1], "0x8086", "0x060400", _config_with_acs(0x1D))  # root port: SV RR CR UF
    _device(tmp_path, chain[:2], "0x10b5", "0x060400", _config_with_acs(None))  # upstream port, no ACS
    _device(tmp_path, chain, "0x10b5", "0x060400", _config_with_acs(0x0C))  # downstream: RR CR
    _device(tmp_path, chain + ["0000:03:00.0"], "0x10de", "0x030200", bytes(64))
    _device(tmp_path, chain[:2] + ["0000:02:10.0"], "0x10b5", "0x060400", bytes(64))  # non-root view: 64 bytes
    _device(tmp_path, chain[:2] + ["0000:02:10.0", "0000:04:00.0"], "0x10de", "0x030200", bytes(64))
    groups = tmp_path / "sys/kernel/iommu_groups/17"
    groups.mkdir(parents=True)
    (groups / "type").write_text("DMA-FQ\n")
    (tmp_path / "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:03:00.0/iommu_group").symlink_to(
        groups
    )
    (tmp_path / "sys/class/iommu/dmar0").mkdir(parents=True)
    gpu0 = tmp_path / "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:03:00.0"
    (gpu0 / "aer_dev_fatal").write_text("Undefined 0\nDLP 0\nTOTAL_ERR_FATAL 0\n")
    (gpu0 / "aer_dev_nonfatal").write_text("Undefined 0\nCmpltTO 2\nTOTAL_ERR_NONFATAL 2\n")
    (gpu0 / "aer_dev_correctable").write_text("RxErr 17\nTOTAL_ERR_COR 17\n")
    port = gpu0.parent  # the switch's downstream port: the other end of GPU 0's link counts its own errors
    (port / "aer_dev_correctable").write_text("RxErr 90000\nBadTLP 12\nTOTAL_ERR_COR 90012\n")
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/uptime").write_text("86400.25 1234567.00\n")

    section = pci.probe(str(tmp_path))
    assert section["uptime_seconds"] == 86400.25
    assert [b["bdf"] for b in section["bridges"] if b["aer"]] == ["0000:02:08.0"]
    assert next(b for b in section["bridges"] if b["bdf"] == "0000:02:08.0")["aer"] == {"corrected": 90012}
    assert [g["bdf"] for g in section["gpus"]] == ["0000:03:00.0", "0000:04:00.0"]
    assert section["gpus"][0]["bridges"] == chain and section["gpus"][0]["iommu_domain"] == "DMA-FQ"
    bridges = {b["bdf"]: b for b in section["bridges"]}
    assert bridges["0000:00:01.0"]["root_port"] and bridges["0000:00:01.0"]["acs"]["request_redirect"]
    assert bridges["0000:01:00.0"]["acs"] == {"readable": True, "capable": False}
    assert bridges["0000:02:08.0"]["acs"]["completion_redirect"] and not bridges["0000:02:08.0"]["root_port"]
    assert bridges["0000:02:10.0"]["acs"]["readable"] is False and "root" in bridges["0000:02:10.0"]["acs"]["reason"]
    assert section["iommu"] == {"enabled": True, "units": ["dmar0"], "groups": 1}
    assert (
        section["gpus"][0]["aer"] == {"fatal": 0, "non_fatal": 2, "corrected": 17} and section["gpus"][1]["aer"] is None
    )
    assert first_problem({"schema": "gpudoctor.facts/1", "pci": section}) is None


def test_a_looping_capability_chain_ends(tmp_path):
    space = bytearray(4096)
    space[0x100:0x104] = (0x0001 | (0x100 << 20)).to_bytes(4, "little")  # points at itself
    assert pci.acs_state(bytes(space)) == {"readable": True, "capable": False}


def test_no_sysfs_is_an_error_fact(tmp_path):
    assert "does not exist" in pci.probe(str(tmp_path))["error"]


# ------------------------------------------------------------------ fabric manager, env


def test_fabric_manager_version_and_service_state_from_the_tools(tmp_path):
    _script(tmp_path / "bin/nv-fabricmanager", 'echo "Fabric Manager version is : 535.129.03"\n')
    _script(tmp_path / "bin/systemctl", "echo failed; exit 3\n")
    fm = fabric.fabric_manager(path=str(tmp_path / "bin"))
    assert fm["version"] == "535.129.03" and fm["service"] == "failed" and fm["binary"].endswith("nv-fabricmanager")


def test_a_hanging_fabric_manager_is_bounded(tmp_path):
    pidfile = tmp_path / "child.pid"
    _script(tmp_path / "bin/nv-fabricmanager", f"sleep 300 & echo $! > {pidfile}\nwait\n")
    started = time.monotonic()
    fm = fabric.fabric_manager(path=str(tmp_path / "bin"))
    assert time.monotonic() - started < fabric.COMMAND_TIMEOUT + 2
    assert fm["version"] is None and "did not answer" in fm["errors"]["version"]
    time.sleep(0.2)
    assert not _alive(int(pidfile.read_text())), "the hanging nv-fabricmanager's child outlived the probe"


def test_profiler_and_compiler_families_are_collected_but_credentials_are_not():
    env = collectable_env(
        {
            "KINETO_USE_DAEMON": "1",
            "TORCHINDUCTOR_CACHE_DIR": "/tmp/x",
            "TRITON_CACHE_DIR": "/t",
            "NVTE_FUSED_ATTN": "0",
            "MALLOC_ARENA_MAX": "2",
            "TRITON_API_KEY": "s3cret",
            "HOME": "/root",
        }
    )
    assert env == {
        "KINETO_USE_DAEMON": "1",
        "MALLOC_ARENA_MAX": "2",
        "NVTE_FUSED_ATTN": "0",
        "TORCHINDUCTOR_CACHE_DIR": "/tmp/x",
        "TRITON_CACHE_DIR": "/t",
    }


def test_kernel_and_pci_sections_round_trip_through_a_snapshot():
    data = {
        "schema": "gpudoctor.facts/1",
        "kernel": {"cmdline": "x", "log": {"readable": False, "attempts": []}},
        "pci": {"iommu": {"enabled": False}, "gpus": [], "bridges": []},
    }
    facts = Facts.from_dict(data)
    assert facts.kernel["log"]["readable"] is False and facts.pci["iommu"]["enabled"] is False


def test_credential_like_kernel_parameters_are_redacted(tmp_path):
    proc = _proc(tmp_path)
    (proc / "cmdline").write_text("root=/dev/sda1 iommu=pt iscsi.password=hunter2 rd.auth_token=abc quiet\n")
    section = kernel.probe(proc_root=str(proc), kmsg_path=str(tmp_path / "no-kmsg"), path=str(tmp_path / "empty"))
    assert section["cmdline"] == "root=/dev/sda1 iommu=pt iscsi.password=<redacted> rd.auth_token=<redacted> quiet"
    assert section["iommu_params"] == ["iommu=pt"]


def test_malformed_new_sections_are_refused_by_the_schema():
    bad_log = {"schema": "gpudoctor.facts/1", "kernel": {"cmdline": None, "log": {"readable": True, "xid": "many"}}}
    assert "kernel.log.xid" in first_problem(bad_log)
    bad_acs = {
        "schema": "gpudoctor.facts/1",
        "pci": {"iommu": {"enabled": False}, "gpus": [], "bridges": [{"bdf": "x"}]},
    }
    assert "pci.bridges.0" in first_problem(bad_acs)
    ok_error = {"schema": "gpudoctor.facts/1", "kernel": {"error": "probe timed out", "timed_out": True}}
    assert first_problem(ok_error) is None


def test_a_nics_bus_is_the_subsystem_its_device_links_to(tmp_path):
    from gpudoctor.probe.network import device_bus

    usb = tmp_path / "sys/bus/usb"
    usb.mkdir(parents=True)
    device = tmp_path / "sys/devices/pci0000:00/0000:00:14.0/usb1/1-4/1-4:1.0"
    device.mkdir(parents=True)
    (device / "subsystem").symlink_to(usb)
    nic = tmp_path / "sys/class/net/enx0c3796a1b2c3"
    nic.mkdir(parents=True)
    (nic / "device").symlink_to(device)
    assert device_bus(str(nic)) == "usb"
    bridge = tmp_path / "sys/class/net/br0"
    bridge.mkdir(parents=True)
    assert device_bus(str(bridge)) is None
