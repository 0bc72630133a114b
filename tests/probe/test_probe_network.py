"""The InfiniBand probe on a sysfs tree written the way the kernel's ib_core lays it out (issue 18), and
GD-NCCL-009 over what it reads: a node with some HCAs ACTIVE and some DOWN, judged with NCCL_IB_HCA as
NCCL reads it (prefixes, '=' exact, ':port', '^' exclusion) and NCCL_IB_DISABLE."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.model import Severity
from gpudoctor.probe.network import infiniband
from gpudoctor.readers.ncclenv import hca_port_selected
from tests.factsutil import make_facts, run, said

TWO_NODES = {"SLURM_JOB_ID": "42", "SLURM_NNODES": "2", "SLURM_NTASKS": "16", "SLURM_NTASKS_PER_NODE": "8"}


def _port(root: Path, dev: str, port: int, state: str, phys: str, rate: str | None, layer: str) -> None:
    d = root / dev / "ports" / str(port)
    d.mkdir(parents=True)
    (d / "state").write_text(state + "\n")
    (d / "phys_state").write_text(phys + "\n")
    (d / "link_layer").write_text(layer + "\n")
    if rate is not None:
        (d / "rate").write_text(rate + "\n")


@pytest.fixture
def sysfs(tmp_path) -> Path:
    """Four NDR HCAs, two of them DOWN (cable out: Polling), a RoCE NIC, and a device without ports."""
    root = tmp_path / "sys" / "class" / "infiniband"
    for i, up in enumerate([True, True, False, False]):
        if up:
            _port(root, f"mlx5_{i}", 1, "4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)", "InfiniBand")
        else:
            _port(root, f"mlx5_{i}", 1, "1: DOWN", "2: Polling", "10 Gb/sec (4X SDR)", "InfiniBand")
    _port(root, "mlx5_bond_0", 1, "4: ACTIVE", "5: LinkUp", None, "Ethernet")
    (root / "rxe_half").mkdir()  # a device that lists no ports: skipped, not an error
    return root


def test_the_probe_reads_state_phys_state_rate_and_link_layer(sysfs):
    ports = infiniband(str(sysfs))
    assert [(p["device"], p["port"], p["state"], p["phys_state"]) for p in ports] == [
        ("mlx5_0", 1, "ACTIVE", "LinkUp"),
        ("mlx5_1", 1, "ACTIVE", "LinkUp"),
        ("mlx5_2", 1, "DOWN", "Polling"),
        ("mlx5_3", 1, "DOWN", "Polling"),
        ("mlx5_bond_0", 1, "ACTIVE", "LinkUp"),
    ]
    assert ports[0]["rate"] == "400 Gb/sec (4X NDR)" and ports[0]["link_layer"] == "InfiniBand"
    assert ports[4]["rate"] is None and ports[4]["link_layer"] == "Ethernet"  # a missing file is None


def test_a_missing_root_is_no_ports(tmp_path):
    assert infiniband(str(tmp_path / "none")) == []


def _judge(sysfs: Path, **env):
    facts = make_facts(env={**TWO_NODES, **env}, patch={"network.infiniband": infiniband(str(sysfs))})
    (finding,) = run("GD-NCCL-009", facts, expect_gpus=8)
    return finding


def test_hcas_down_beside_active_ones_with_nccl_ib_hca_unset_warn(sysfs):
    finding = _judge(sysfs)
    assert finding.severity is Severity.WARN, finding.message
    assert "mlx5_2:1 DOWN" in said(finding) and "mlx5_3:1 DOWN" in said(finding)


@pytest.mark.parametrize("hca", ["mlx5_0,mlx5_1", "=mlx5_0:1,mlx5_1:1", "^mlx5_2,mlx5_3", "mlx5_0:1,mlx5_1:1"])
def test_nccl_ib_hca_leaving_out_the_dead_ports_passes(sysfs, hca):
    assert _judge(sysfs, NCCL_IB_HCA=hca).severity is Severity.PASS


def test_nccl_ib_hca_naming_a_dead_port_warns(sysfs):
    finding = _judge(sysfs, NCCL_IB_HCA="mlx5_0,mlx5_2:1")
    assert finding.severity is Severity.WARN and "mlx5_2:1 DOWN" in said(finding)
    assert "mlx5_3" not in said(finding)  # not selected, not judged


def test_ib_disabled_leaves_the_ports_unjudged(sysfs):
    assert _judge(sysfs, NCCL_IB_DISABLE="1").severity is Severity.SKIP
    assert _judge(sysfs, NCCL_NET="Socket").severity is Severity.SKIP
    # NCCL reads 'true' as 0 (strtoll): InfiniBand stays on, the dead ports still count
    assert _judge(sysfs, NCCL_IB_DISABLE="true").severity is Severity.WARN


def test_hca_port_selection_as_nccl_reads_it():
    assert hca_port_selected(None, "mlx5_0", 1) and hca_port_selected("", "mlx5_0", 1)
    assert hca_port_selected("mlx5", "mlx5_10", 1)  # a prefix
    assert not hca_port_selected("=mlx5_1", "mlx5_10", 1)  # '=' exact names
    assert hca_port_selected("mlx5_0:1", "mlx5_0", 1) and not hca_port_selected("mlx5_0:1", "mlx5_0", 2)
    assert not hca_port_selected("^mlx5_0:1", "mlx5_0", 1) and hca_port_selected("^mlx5_0:1", "mlx5_0", 2)
    assert hca_port_selected("^=mlx5_1", "mlx5_10", 1)  # excluded only by exact name


# --- GD-NCCL-010: the interfaces NCCL's bootstrap may pick, by NCCL version ------------------------------------


def _iface(name: str, index: int, *addresses: str, operstate: str = "up", up: bool = True) -> dict:
    return {
        "name": name,
        "up": up,
        "operstate": operstate,
        "ifindex": index,
        "loopback": name == "lo",
        "mtu": 1500,
        "speed_mbps": None,
        "addresses": list(addresses),
    }


LO = _iface("lo", 1, "127.0.0.1", operstate="unknown")
ENO1 = _iface("eno1", 3, "10.1.0.7")
# a USB Ethernet adapter left plugged in with a static address, its cable out: up, but no carrier
ENX = _iface("enx00e04c680001", 2, "192.168.42.10", operstate="down")


def _nics(interfaces: list[dict], nccl: list[int]):
    patch = {"network.interfaces": interfaces, "network.infiniband": [], "torch.nccl": nccl}
    (finding,) = run("GD-NCCL-010", make_facts(env=TWO_NODES, patch=patch), expect_gpus=8)
    return finding


def test_this_machines_interfaces_carry_their_index():
    from gpudoctor.probe.network import probe

    interfaces = probe()["interfaces"]
    lo = [i for i in interfaces if i["name"] == "lo"]
    assert lo and lo[0]["ifindex"] == 1  # the kernel numbers the loopback first
    assert all(isinstance(i["ifindex"], int) for i in interfaces)


def test_a_usb_nic_without_link_before_the_cluster_nic_under_nccl_before_2_28_3_warns():
    finding = _nics([LO, ENX, ENO1], [2, 27, 7])
    assert finding.severity is Severity.WARN, finding.message
    assert "NCCL 2.27.7" in said(finding) and "its bootstrap binds enx00e04c680001, the first" in said(finding)
    assert finding.fix.actions[0].value == "eno1"


def test_the_same_usb_nic_under_nccl_2_28_3_is_skipped_by_nccl():
    finding = _nics([LO, ENX, ENO1], [2, 28, 3])
    assert finding.severity is Severity.PASS, finding.message
    assert finding.evidence["candidates"] == ["eno1"]


def test_virbr0_is_a_candidate_only_before_nccl_2_28_3():
    virbr = _iface("virbr0", 4, "192.168.122.1")
    assert _nics([LO, ENO1, virbr], [2, 21, 5]).severity is Severity.WARN
    assert _nics([LO, ENO1, virbr], [2, 28, 9]).severity is Severity.PASS


def test_a_running_link_local_bmc_nic_first_warns_under_every_nccl():
    bmc = _iface("usb0", 2, "169.254.3.1")  # a BMC's USB host interface (uccl-project/uccl#1034)
    for version in ([2, 21, 5], [2, 28, 9], [2, 30, 7]):
        finding = _nics([LO, bmc, ENO1], version)
        assert finding.severity is Severity.WARN and "bootstrap binds usb0" in said(finding), version


def test_an_admin_down_interface_with_an_address_counts_before_nccl_2_28_3():
    eth1 = _iface("eth1", 2, "10.9.0.1", operstate="down", up=False)
    assert _nics([LO, eth1, ENO1], [2, 26, 2]).severity is Severity.WARN
    assert _nics([LO, eth1, ENO1], [2, 28, 3]).severity is Severity.PASS


def test_nccl_comm_id_under_nccl_2_29_warns_of_the_inverted_subnet_match():
    patch = {"network.interfaces": [LO, ENO1], "network.infiniband": []}
    env = {**TWO_NODES, "NCCL_COMM_ID": "10.1.0.7:12340"}
    for version, expected in (([2, 29, 7], Severity.WARN), ([2, 30, 3], Severity.PASS), ([2, 28, 9], Severity.PASS)):
        facts = make_facts(env=env, patch={**patch, "torch.nccl": version})
        (finding,) = run("GD-NCCL-010", facts, expect_gpus=8)
        assert finding.severity is expected, (version, finding.message)
        if expected is Severity.WARN:
            assert "NVIDIA/nccl#2047" in said(finding) and finding.fix.actions[0].value == "eno1"
