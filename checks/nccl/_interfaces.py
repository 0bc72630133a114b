"""The network interfaces and InfiniBand ports as NCCL sees them, and the ones it picks by default.
Shared by the nccl checks."""

from __future__ import annotations


def usable_interfaces(facts) -> list[dict]:
    """Interfaces NCCL's socket code can use: up, with an IPv4/IPv6 address."""
    return [i for i in facts.network.get("interfaces") or [] if i.get("up") and i.get("addresses")]


_CONTAINER_BRIDGES = ("docker", "veth", "virbr", "br-", "cni", "flannel", "cali")


def host_local_only(iface: dict) -> bool:
    return bool(iface.get("loopback")) or iface["name"].startswith(_CONTAINER_BRIDGES)


def ib_ports(facts) -> list[dict]:
    """Ports NCCL's IB transport can use (InfiniBand or RoCE); AWS EFA goes through its own plug-in."""
    return [p for p in facts.network.get("infiniband") or [] if not str(p.get("device", "")).startswith("efa")]


def port_name(p: dict) -> str:
    return f"{p.get('device')}:{p.get('port')}"


# NCCL 2.28.3 (release notes; src/misc/socket.cc findInterfaces): interfaces without IFF_RUNNING are no longer
# candidates (NVIDIA/nccl#1798: an interface that is down was chosen) and virbr* is tried only after docker* and lo.
# Before it, any interface holding an address counted, up or not, a libvirt bridge included.
NCCL_SKIPS_DEAD_AND_VIRBR = (2, 28, 3)


def running(iface: dict) -> bool:
    """IFF_RUNNING as getifaddrs reports it: up, and an operational state of up or unknown (no carrier: down)."""
    return bool(iface.get("up")) and iface.get("operstate") in (None, "up", "unknown")


def nccl_version(facts) -> tuple[int, ...] | None:
    """The NCCL torch was built with (torch.cuda.nccl.version()); a 4th item is a suffix."""
    numbers = tuple(v for v in (facts.torch.get("nccl") or ())[:3] if isinstance(v, int))
    return numbers if len(numbers) == 3 else None


def nccl_default_interfaces(interfaces: list[dict], nccl: tuple[int, ...] | None) -> list[dict]:
    """The interfaces NCCL chooses among with NCCL_SOCKET_IFNAME unset, in the order it meets them (ncclFindInterfaces:
    ib* first, else all but docker*/lo*; getifaddrs lists IPv4 addresses first, by interface index). The bootstrap
    takes the first one. An unknown NCCL version is judged as the older, wider choice."""
    newer = nccl is not None and nccl >= NCCL_SKIPS_DEAD_AND_VIRBR
    ordered = [i for i in socket_order(interfaces) if running(i) or not newer]
    ib = [i for i in ordered if i["name"].startswith("ib")]
    if ib:
        return ib
    skipped = ("docker", "lo", "virbr") if newer else ("docker", "lo")
    return [i for i in ordered if not i.get("loopback") and not i["name"].startswith(skipped)]


def socket_order(interfaces: list[dict]) -> list[dict]:
    """getifaddrs order (IPv4 addresses first, by interface index), as NCCL walks it; interfaces with an address."""

    def order(i: dict):
        ipv4 = any("." in a and ":" not in a for a in i.get("addresses") or [])
        return (not ipv4, i.get("ifindex") is None, i.get("ifindex") or 0, i["name"])

    return sorted((i for i in interfaces if i.get("addresses")), key=order)
