"""Nodes as network namespaces on a Linux bridge: the plumbing tests/smoke/networld.py and tests/slurmcluster.py share.

A node is a network namespace (ip-netns(8)) joined to a bridge in the root namespace by a veth pair (its inside end
is `eth0`). A command runs on a node through `nsenter --net=/run/netns/NS unshare --uts --mount`: in the node's
network, with the node's host name (its own UTS namespace) and a hosts file bind-mounted over /etc/hosts (its own
mount namespace, private propagation), so every node resolves every node's name as on a cluster. Whatever it starts
(slurmd's slurmstepd, torchrun's workers) inherits all three.

Needs root, iproute2, nsenter and unshare (`usable()` says why not). Names are the caller's: interface names are
at most 15 characters (IFNAMSIZ).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from typing import IO

TOOLS = ("ip", "unshare", "nsenter")
# Run on the node: bind the hosts file, take the host name, then exec the command (nsenter and unshare exec too,
# so the process started is the command itself, and a signal to it reaches it).
_INSIDE = 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"'


def run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=20)


def usable(tools: tuple[str, ...] = TOOLS) -> str | None:
    """Why nodes cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in tools:
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def make_bridge(name: str, address: str | None = None) -> None:
    """A bridge, up; address ("10.1.2.1/24"): the root namespace's own address on it (None: none)."""
    run("ip", "link", "add", name, "type", "bridge")
    # Bridged frames skip the host's iptables (a Docker-style FORWARD DROP would drop the nodes' traffic)
    # where br_netfilter is loaded; without it the file is absent and nothing filters them anyway.
    for table in ("iptables", "ip6tables", "arptables"):
        knob = f"/sys/class/net/{name}/bridge/nf_call_{table}"
        if os.path.exists(knob):
            with open(knob, "w") as fh:
                fh.write("0")
    if address:
        run("ip", "addr", "add", address, "dev", name)
    run("ip", "link", "set", name, "up")


def add_node(bridge: str, ns: str, veth: str, address: str) -> None:
    """Namespace ns with eth0 at address ("10.1.2.3/24"), its peer veth on the bridge; lo up."""
    run("ip", "netns", "add", ns)
    run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
    run("ip", "link", "set", veth, "master", bridge, "up")
    run("ip", "-n", ns, "addr", "add", address, "dev", "eth0")
    run("ip", "-n", ns, "link", "set", "eth0", "up")
    run("ip", "-n", ns, "link", "set", "lo", "up")


def remove(namespaces: list[str], links: list[str]) -> None:
    """Deletes what exists of them (a namespace takes its eth0 and so its veth peer with it); never raises."""
    for ns in namespaces:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
    for link in links:
        subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=20)


def leftovers(namespaces: list[str], links: list[str]) -> list[str]:
    """Which of them are still on the machine."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=20).stdout.split()
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=20).stdout
    present = {line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if line.count(":") >= 2}
    return [ns for ns in namespaces if ns in netns] + [name for name in links if name in present]


def write_hosts(path: str | os.PathLike, names: dict[str, str]) -> None:
    """A hosts file: localhost and {name: address}."""
    with open(path, "w") as fh:
        fh.write("127.0.0.1 localhost\n" + "".join(f"{addr} {name}\n" for name, addr in names.items()))


def on_node(ns: str, host: str, hosts_file: str | os.PathLike, argv: list[str]) -> list[str]:
    """The command line that runs argv on node ns as host, resolving names with hosts_file."""
    return [
        "nsenter",
        f"--net=/run/netns/{ns}",
        "unshare",
        "--uts",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        _INSIDE,
        "sh",
        str(hosts_file),
        host,
        *argv,
    ]


def routed_subnets() -> str:
    """`ip -o addr` and `ip route` of the root namespace, to see which subnets are taken."""
    out = [subprocess.run(["ip", *cmd], capture_output=True, text=True, timeout=20).stdout
           for cmd in (["-o", "addr"], ["route"])]  # fmt: skip
    return "\n".join(out)


def claim_subnet(first: int = 16, count: int = 200, base: str = "10.214") -> tuple[int, IO[str]]:
    """A /24 (f"{base}.{k}") no other instance on this machine holds: an exclusive flock on
    /tmp/gpudoctor-subnet-{base}.{k}.lock, held while the returned file is open (a killed process frees it with
    its descriptors), and not routed here already. Raises RuntimeError when all are taken."""
    taken = routed_subnets()
    for k in range(first, first + count):
        if f" {base}.{k}." in taken:
            continue
        fh = open(f"/tmp/gpudoctor-subnet-{base}.{k}.lock", "a+")  # noqa: SIM115 (held for the caller's life)
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            continue
        return k, fh
    raise RuntimeError(f"no free subnet among {base}.{first}-{first + count - 1}.0/24")
