"""nccl checks of the interfaces NCCL picks by itself when no NCCL_SOCKET_IFNAME is set."""

from __future__ import annotations

import re
from typing import Any

from gpudoctor.checks.nccl._interfaces import (
    NCCL_SKIPS_DEAD_AND_VIRBR,
    ib_ports,
    nccl_default_interfaces,
    nccl_version,
    running,
    socket_order,
)
from gpudoctor.job.env import job_env
from gpudoctor.job.layout import layout
from gpudoctor.model import info, manual, passed, set_env, skip, warn
from gpudoctor.readers.ncclenv import (
    nccl_flag,
    select_names,
)
from gpudoctor.registry import check

# Interfaces NCCL's default list ('^docker,lo') still accepts but no other node can reach, or that are not the
# cluster network: libvirt/container/overlay bridges, VPN tunnels, the USB "host interface" of a BMC (usb0, 169.254.x).
_VIRTUAL_NICS = (
    "virbr",
    "veth",
    "br-",
    "cni",
    "flannel",
    "cali",
    "vxlan",
    "tailscale",
    "wg",
    "tun",
    "tap",
    "zt",
    "usb",
    "enx",
    "vmnet",
    "lxc",
    "podman",
    "kube",
)


# NCCL 2.29 inverted the subnet test that, with NCCL_COMM_ID set and no ib* interface, picks the interface in the
# COMM_ID address's subnet: the right one is refused and another (lo) bound (NVIDIA/nccl#2047; src/os/linux.cc
# matchSubnet, inverted in the v2.29.2-1..v2.29.7-1 tags, right again in v2.30.3-1).
NCCL_SUBNET_MATCH_INVERTED = ((2, 29, 0), (2, 30, 3))


def _virtual_nic(iface: dict) -> bool:
    name = iface["name"]
    link_local = all(a.startswith(("169.254.", "fe80:")) for a in iface.get("addresses") or [])
    return name.startswith(_VIRTUAL_NICS) or (link_local and not iface.get("loopback"))


def _unreachable(iface: dict, newer: bool) -> str | None:
    if _virtual_nic(iface):
        return "virtual, tunnel, USB or link-local"
    if not newer and not running(iface):
        return f"no link ({iface.get('operstate') or 'down'})"
    return None


@check(
    id="GD-NCCL-010",
    name="nccl-default-interfaces-include-virtual-nics",
    category="nccl",
    title="NCCL's own interface choice cannot land on a virtual, USB or dead NIC",
    needs=["env", "network", "torch"],
    requires="several-hosts",
    scope="node",
    what="With NCCL_SOCKET_IFNAME unset on a multi-node job, applies NCCL's default choice for torch's NCCL version "
    "(ib* interfaces first, else every interface with an address but lo* and docker*, in interface-index order; "
    "the bootstrap binds the first) and looks for libvirt/container/overlay bridges, VPN tunnels, USB NICs "
    "(enx*, usb0) and link-local-only ones (a BMC's 169.254.x.x) among the candidates, and, before NCCL 2.28.3, "
    "interfaces without link.",
    why="NCCL lists the interfaces with an address and picks the first that matches its filter (NCCL maintainers "
    "on NVIDIA/nccl#519: a veth with an IPv6 address was picked); the socket transport uses every match. An "
    "address on virbr0, a tunnel or a USB NIC is not reachable from the other nodes: bootstrap hangs or the "
    "all-reduce fails with 'connection refused' / timeouts (horovod#98 shows NCCL using docker0, br-* and veth*; "
    "uccl-project/uccl#1034: a GH200's link-local 169.254.3.1 NIC chosen, 'Connection refused' on two nodes). "
    "NCCL before 2.28.3 also takes interfaces that are down or have no carrier, and virbr* like any other "
    "(NVIDIA/nccl#1798; NCCL 2.28.3 release notes: only IFF_RUNNING interfaces, virbr* last). NCCL 2.29 with "
    "NCCL_COMM_ID set refuses the interface in that address's subnet and may bind lo (NVIDIA/nccl#2047, right "
    "again in 2.30.3).",
    fix="Set NCCL_SOCKET_IFNAME to the cluster interface (e.g. NCCL_SOCKET_IFNAME=eth0, or ib for IPoIB), or "
    "exclude the virtual ones: NCCL_SOCKET_IFNAME=^lo,docker,virbr,veth,usb.",
)
def nccl_default_interfaces_include_virtual_nics(facts, ctx):
    env = job_env(facts, ctx)
    if env.get("NCCL_SOCKET_IFNAME") is not None:
        return skip("NCCL_SOCKET_IFNAME is set (see GD-NCCL-002/007/008)", NCCL_SOCKET_IFNAME=env["NCCL_SOCKET_IFNAME"])
    if facts.network.get("error"):
        return skip(f"the network probe failed: {facts.network['error']}")
    lay = layout(facts, ctx)
    nccl = nccl_version(facts)
    newer = nccl is not None and nccl >= NCCL_SKIPS_DEAD_AND_VIRBR
    candidates = nccl_default_interfaces(facts.network.get("interfaces") or [], nccl)
    bad = {i["name"]: why for i in candidates if (why := _unreachable(i, newer))}
    version = f"NCCL {'.'.join(map(str, nccl))}" if nccl else "NCCL (version unknown, judged as before 2.28.3)"
    evidence: dict[str, Any] = {
        "nccl": version,
        "candidates": [i["name"] for i in candidates],
        "unreachable": bad,
        "virtual_or_usb": sorted(n for n, why in bad.items() if not why.startswith("no link")),
        **lay.evidence(),
    }
    low, fixed = NCCL_SUBNET_MATCH_INVERTED
    ib_first = bool(candidates) and candidates[0]["name"].startswith("ib")
    if env.get("NCCL_COMM_ID") and nccl and low <= nccl < fixed and not ib_first:
        real = [n for n in evidence["candidates"] if n not in bad]
        return warn(
            f"{version} with NCCL_COMM_ID={env['NCCL_COMM_ID']} and no ib* interface: this release's subnet match "
            "is inverted (NVIDIA/nccl#2047, right again in 2.30.3), so the bootstrap refuses the interface in "
            "NCCL_COMM_ID's subnet and may bind another one, lo included",
            set_env("NCCL_SOCKET_IFNAME", real[0], title="Name the interface")
            if real
            else manual("Set NCCL_SOCKET_IFNAME to the interface in NCCL_COMM_ID's subnet"),
            NCCL_COMM_ID=env["NCCL_COMM_ID"],
            **evidence,
        )
    if not bad:
        return passed(
            f"{version} would choose among {', '.join(evidence['candidates']) or 'no interface'}: "
            "no virtual, USB or dead NIC",
            **evidence,
        )
    real = [n for n in evidence["candidates"] if n not in bad]
    named = ", ".join(f"{n} ({why})" for n, why in bad.items())
    fix = set_env(
        "NCCL_SOCKET_IFNAME",
        real[0] if len(real) == 1 else "^lo,docker," + ",".join(sorted(set(bad))),
        title="Tell NCCL which interface to use",
    )
    first = evidence["candidates"][0]
    active_ib = [p for p in ib_ports(facts) if str(p.get("state") or "").upper() == "ACTIVE"]
    if active_ib and real and first not in bad:
        # data goes over InfiniBand/RoCE; only the bootstrap uses the first socket interface, here a real one
        evidence = {**evidence, "beside": ", ".join(real), "with InfiniBand/RoCE": f"only the first ({first}) is used"}
        return info(
            f"NCCL_SOCKET_IFNAME is unset and {version}'s bootstrap candidates include {named}: set it if it hangs",
            fix,
            **evidence,
        )
    where = f"its bootstrap binds {first}, the first of them" if first in bad else "its socket transport uses them all"
    evidence = {
        **evidence,
        "beside": ", ".join(real) or "nothing else",
        "then": f"{where}, and other nodes cannot reach it",
    }
    short = first if first in bad else named
    return warn(
        f"NCCL_SOCKET_IFNAME is unset, so {version} may pick {short}, which other nodes cannot reach", fix, **evidence
    )


# NCCL 2.18.5 began keeping PCI devices under a CPU sorted by bus id (src/graph/xml.cc, "Issue #820"); the sort
# reads the 'busid' of every sibling, and the <nic> node NCCL hangs off the first CPU for a network device that is
# not on PCI (USB, virtio, virtual: ncclTopoFillNet, "is not a PCI device ... Attaching to first CPU") has none, so
# the next PCI device added there fails init with "Attribute busid of node nic not found" (NVIDIA/nccl#1125, a USB
# NIC on one node; fixed in v2.20.3-1, which skips siblings without a busid).
NCCL_TOPO_BUSID_SORT_BUG = ((2, 18, 5), (2, 20, 3))


_USB_NAME = re.compile(r"^(enx[0-9a-f]{12}|usb\d+|en\S*u\d+(?:u\d+)*)$")


def _not_on_pci(iface: dict) -> str | None:
    """Why NCCL's topology would hang this interface off the first CPU: its device is not on PCI."""
    if "bus" in iface:  # probed: the device's subsystem, as NCCL reads it
        bus = iface["bus"]
        return None if bus == "pci" else (f"a {bus} device" if bus else "no device (virtual)")
    if _USB_NAME.match(iface["name"]):  # older snapshots: systemd's names for USB NICs (enx<MAC>, ...u<port>)
        return "a USB NIC by its name"
    return None


@check(
    id="GD-NCCL-012",
    name="nccl-non-pci-nic-first-breaks-init",
    category="nccl",
    title="NCCL's socket devices do not start with a USB or virtual NIC (NCCL 2.18.5-2.20.2 init failure)",
    needs=["env", "network", "torch"],
    scope="node",
    what="For torch's NCCL between 2.18.5 and 2.20.2, when NCCL would use TCP sockets (no active InfiniBand/RoCE "
    "port, or NCCL_IB_DISABLE / NCCL_NET=Socket), lists the interfaces NCCL's socket transport takes, in its own "
    "order (NCCL_SOCKET_IFNAME, else ib* first, else all but lo*/docker* in getifaddrs order) and reads the bus "
    "of each one's device (/sys/class/net/<if>/device/subsystem): a USB (enx*, usb0), virtio or deviceless NIC "
    "before a PCI one is flagged, on one node as on several.",
    why="NCCL adds every socket device to its topology at communicator init, on a single node too. A device that "
    "is not on PCI is hung off the first CPU as a <nic> without a bus id; from 2.18.5 NCCL keeps the PCI devices "
    "under a CPU sorted by bus id and reads every sibling's, so the next PCI device fails init: 'Attribute busid "
    "of node nic not found', ncclInternalError (NVIDIA/nccl#1125: a USB NIC, init failing with 1 or 2 GPUs; "
    "src/graph/xml.cc ncclTopoGetXmlFromSys, fixed in 2.20.3).",
    fix="Keep the USB/virtual NIC out of NCCL's list (NCCL_SOCKET_IFNAME=^docker,lo,<its name>, or name the "
    "PCI interface), or use a torch whose NCCL is 2.20.3 or newer.",
)
def nccl_non_pci_nic_first_breaks_init(facts, ctx):
    env = job_env(facts, ctx)
    nccl = nccl_version(facts)
    if facts.network.get("error"):
        return skip(f"the network probe failed: {facts.network['error']}")
    lay = layout(facts, ctx)
    from gpudoctor.readers.cudavis import job_gpus

    if not lay.multi_process and len(job_gpus(facts)) < 2:
        return skip("one process on one GPU: no NCCL communicator", **lay.evidence())
    low, fixed = NCCL_TOPO_BUSID_SORT_BUG
    version = f"NCCL {'.'.join(map(str, nccl))}" if nccl else None
    if nccl is not None and not low <= nccl < fixed:
        return passed(f"{version} is outside 2.18.5-2.20.2, whose topology detection this concerns", nccl=version)
    active_ib = [p for p in ib_ports(facts) if str(p.get("state") or "").upper() == "ACTIVE"]
    socket_forced = nccl_flag(env, "NCCL_IB_DISABLE") != 0 or str(env.get("NCCL_NET") or "").lower() == "socket"
    if active_ib and not socket_forced:
        return passed("NCCL uses InfiniBand/RoCE here: its socket interfaces are not network devices in its topology")
    interfaces = facts.network.get("interfaces") or []
    ifname = env.get("NCCL_SOCKET_IFNAME")
    if ifname:
        chosen = set(select_names(ifname, [i["name"] for i in interfaces]))
        ordered = [i for i in socket_order(interfaces) if i["name"] in chosen]
    else:
        ordered = nccl_default_interfaces(interfaces, nccl)
    evidence: dict[str, Any] = {
        "nccl": version,
        "socket_devices": [i["name"] for i in ordered],
        "buses": {i["name"]: i.get("bus", "not probed") for i in ordered},
        "NCCL_SOCKET_IFNAME": ifname,
    }
    first_pci = next((n for n, i in enumerate(ordered) if _not_on_pci(i) is None), None)
    before = [(i, why) for i in ordered[: first_pci or 0] if (why := _not_on_pci(i))]
    if first_pci is None or not before:
        return passed(
            f"{version or 'NCCL'}'s socket devices ({', '.join(evidence['socket_devices']) or 'none'}) do not put a "
            "USB or virtual NIC before a PCI one",
            **evidence,
        )
    names = [i["name"] for i, _ in before]
    what = ", ".join(f"{i['name']} ({why})" for i, why in before)
    fix = set_env(
        "NCCL_SOCKET_IFNAME", "^docker,lo," + ",".join(names), title=f"Keep {', '.join(names)} out of NCCL's list"
    )
    if version is None:
        return info(
            f"NCCL's socket devices start with {what} before {ordered[first_pci]['name']}: NCCL 2.18.5-2.20.2 fail "
            "init on that ('Attribute busid of node nic not found', NVIDIA/nccl#1125); torch's NCCL version is "
            "unknown here",
            fix,
            **evidence,
        )
    return warn(
        f"{version} would use {what} as a socket network device before {ordered[first_pci]['name']}: its topology "
        "detection hangs a non-PCI NIC off the first CPU without a bus id, and a PCI device added under that CPU "
        "afterwards fails communicator init with 'Attribute busid of node nic not found' (NVIDIA/nccl#1125, fixed "
        "in 2.20.3) - on a single node too",
        fix,
        **evidence,
    )
