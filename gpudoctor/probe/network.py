"""Network interfaces and InfiniBand ports, from /sys (no tools needed)."""

from __future__ import annotations

import os

from gpudoctor.fileio import read_text as _read
from gpudoctor.readers.ints import small_int

SYS_NET = "/sys/class/net"
SYS_IB = "/sys/class/infiniband"


def device_bus(net_dir: str) -> str | None:
    """The bus a network interface's device sits on: the name of <net_dir>/device/subsystem's target ('pci',
    'usb', ...), which NCCL's topology detection reads (src/graph/xml.cc ncclTopoGetSubsystem); None without a
    device (virtual interfaces: bridges, bonds, veth, tunnels)."""
    subsystem = os.path.join(net_dir, "device", "subsystem")
    if not os.path.exists(subsystem):
        return None
    return os.path.basename(os.path.realpath(subsystem)) or None


def _interfaces() -> list[dict]:
    try:
        import psutil

        addrs = psutil.net_if_addrs()
        stats = psutil.net_if_stats()
    except Exception:
        addrs, stats = {}, {}
    names = sorted(set(os.listdir(SYS_NET)) if os.path.isdir(SYS_NET) else set(addrs))
    out = []
    for name in names:
        st = stats.get(name)
        operstate = _read(os.path.join(SYS_NET, name, "operstate"))
        out.append(
            {
                "name": name,
                "up": bool(st.isup) if st else operstate in ("up", "unknown"),
                "operstate": operstate,
                # getifaddrs() (which NCCL walks to choose) lists IPv4 addresses by interface index
                "ifindex": small_int(_read(os.path.join(SYS_NET, name, "ifindex"))),
                "loopback": name == "lo" or _read(os.path.join(SYS_NET, name, "type")) == "772",
                "bus": device_bus(os.path.join(SYS_NET, name)),
                "mtu": st.mtu if st else None,
                "speed_mbps": st.speed if st and st.speed else None,
                "addresses": [a.address for a in addrs.get(name, []) if a.family.name in ("AF_INET", "AF_INET6")],
            }
        )
    return out


def infiniband(root: str = SYS_IB) -> list[dict]:
    """Every port of every RDMA device under root (/sys/class/infiniband/<dev>/ports/<n>/): state, phys_state,
    rate and link_layer as the kernel's ib_core exports them, the values `ibstat` shows, without needing it.
    Each file is read non-blocking and bounded (fileio.read_text); the whole probe runs under collect()'s deadline."""
    ports: list[dict] = []
    if not os.path.isdir(root):
        return ports
    for dev in sorted(os.listdir(root)):
        pdir = os.path.join(root, dev, "ports")
        if not os.path.isdir(pdir):
            continue
        for port in sorted(os.listdir(pdir), key=lambda p: int(p) if p.isdigit() else 0):
            base = os.path.join(pdir, port)
            state = _read(os.path.join(base, "state")) or ""  # "4: ACTIVE"
            phys = _read(os.path.join(base, "phys_state")) or ""  # "5: LinkUp"
            ports.append(
                {
                    "device": dev,
                    "port": int(port) if port.isdigit() else port,
                    "state": state.split(":", 1)[-1].strip() or None,
                    "phys_state": phys.split(":", 1)[-1].strip() or None,
                    "rate": _read(os.path.join(base, "rate")),
                    "link_layer": _read(os.path.join(base, "link_layer")),
                }
            )
    return ports


def probe(ib_root: str = SYS_IB) -> dict:
    return {"interfaces": _interfaces(), "infiniband": infiniband(ib_root)}
