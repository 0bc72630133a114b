"""Several "nodes" on this one machine, for real: network namespaces on a bridge, a slow link, a CPU quota.

Each node is a network namespace (ip-netns(8)) joined to a Linux bridge in the root namespace by a veth pair
(its inside end is `eth0`, 10.213.0.<i+2>/24; the subnet repeats in every world, since each world's bridge is
its own segment), with its own host name: commands run through `ip netns exec NS unshare --uts`, so
socket.gethostname() in them is the node's name. Real slowness, no mocks:
- a slow link: tc-tbf(8) on both ends of the node's veth (traffic toward it and from it); netem is not built
  into these kernels, tbf is;
- a slow CPU: the node's processes run in a cgroup with a CPU quota (cgroup v1 cpu.cfs_quota_us /
  cpu.cfs_period_us, or v2 cpu.max; the kernel's Documentation/scheduler/sched-bwc.rst), joined before exec so
  that every child (torchrun's workers) inherits it.
The namespaces, bridge and hosts file are tests/netnodes.py's (shared with tests/slurmcluster.py's nodes).
Needs root, iproute2 and `unshare`; the world skips its test with the reason otherwise. Everything it made is
removed on the way out, also after a failure. Names carry a per-process prefix (tests run under xdist).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field

import pytest

from tests import netnodes

SUBNET = "10.213.0"
TBF_BURST = "32kbit"  # at least rate / HZ for the rates used here, so tbf really holds the rate
TBF_LATENCY = "400ms"


_run = netnodes.run


def _cgroup_root() -> tuple[str, str] | None:
    """(directory under which to make a CPU cgroup, 'v1'|'v2'), or None."""
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        return "/sys/fs/cgroup", "v2"
    for root in ("/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu"):
        if os.path.exists(f"{root}/cpu.cfs_quota_us"):
            return root, "v1"
    return None


def _has_socket(pid: int) -> bool:
    """Whether the process holds a socket (psutil's connection list reads this namespace's /proc/net, so it
    sees nothing of a process in another network namespace; its fds tell)."""
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:") for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def usable() -> str | None:
    """Why a world cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, tc, cgroups)"
    return netnodes.usable(("ip", "tc", "unshare", "nsenter", "taskset"))


@dataclass
class NetWorld:
    """n nodes named f"{prefix}node{i+1}"; slow_mbit: {node: Mbit/s of its link}; cpu_quota: {node: CPUs}."""

    n: int
    prefix: str = field(default_factory=lambda: f"gw{os.getpid() % 100000}")
    slow_mbit: dict[int, float] = field(default_factory=dict)
    cpu_quota: dict[int, float] = field(default_factory=dict)
    late_quota: bool = False  # the quota only from throttle_once_connected() on
    pin_cpus: bool = True  # each node on CPU i % CPUs (False: every node sees every CPU, as an unpinned world)
    procs: list[subprocess.Popen] = field(default_factory=list)
    cgroups: dict[int, str] = field(default_factory=dict)
    _versions: dict[int, tuple[str, str]] = field(default_factory=dict)

    def ns(self, i: int) -> str:
        return f"{self.prefix}n{i}"

    def host(self, i: int) -> str:
        return f"{self.prefix}node{i + 1}"

    def address(self, i: int) -> str:
        return f"{SUBNET}.{i + 2}"

    @property
    def hosts_file(self) -> str:
        return f"/tmp/{self.prefix}-hosts"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    def __enter__(self) -> NetWorld:
        why = usable()
        if why:
            pytest.skip(why)
        try:
            self._build()
        except Exception:
            self.__exit__(None, None, None)
            raise
        return self

    def _build(self) -> None:
        # Every node resolves every node's name, as on a cluster: each node's commands see this world's hosts file
        # bind-mounted over /etc/hosts in a mount namespace of their own.
        netnodes.write_hosts(self.hosts_file, {self.host(i): self.address(i) for i in range(self.n)})
        netnodes.make_bridge(self.bridge)
        for i in range(self.n):
            ns, outside = self.ns(i), f"{self.prefix}v{i}"
            netnodes.add_node(self.bridge, ns, outside, f"{self.address(i)}/24")
            if i in self.slow_mbit:
                rate = f"{self.slow_mbit[i]}mbit"
                for where in (["dev", outside], ["-n", ns, "dev", "eth0"]):
                    netns = where[:2] if where[0] == "-n" else []
                    dev = where[2:] if netns else where
                    _run("tc", *netns, "qdisc", "add", *dev, "root", "tbf", "rate", rate, "burst", TBF_BURST,
                         "latency", TBF_LATENCY)  # fmt: skip
            if i in self.cpu_quota:
                self.cgroups[i] = self._cgroup(i, None if self.late_quota else self.cpu_quota[i])

    def throttle_once_connected(self, i: int, marker: str, timeout: float = 120) -> threading.Thread:
        """Gives node i's cgroup its quota only once a process of the node whose command line holds marker (and
        not torchrun's: the rank itself) holds a socket (its rendezvous store's): the rank has imported torch and
        reached its rendezvous at full speed, and is slowed for the run itself (a CPU quota from the start would
        spend most of the test importing torch at a tenth of a CPU)."""
        import psutil

        procs_file, quota = self.cgroups[i], self.cpu_quota[i]

        def wait_then_throttle() -> None:
            until = time.monotonic() + timeout
            while time.monotonic() < until:
                try:
                    with open(procs_file) as fh:
                        pids = [int(x) for x in fh.read().split()]
                except OSError:
                    return
                for pid in pids:
                    try:
                        proc = psutil.Process(pid)
                        command = " ".join(proc.cmdline())
                        if marker in command and "torchrun" not in command and _has_socket(pid):
                            self._set_quota(i, quota)
                            return
                    except (psutil.Error, OSError):
                        continue
                time.sleep(0.05)

        thread = threading.Thread(target=wait_then_throttle, daemon=True)
        thread.start()
        return thread

    def _set_quota(self, i: int, cpus: float | None) -> None:
        """cpus of quota per period (None: no limit)."""
        path, version = self._versions[i]
        period = 20_000  # short periods: a rank's 10 ms bursts are throttled too, not only sustained work
        if version == "v2":
            with open(os.path.join(path, "cpu.max"), "w") as fh:
                fh.write(f"{'max' if cpus is None else int(cpus * period)} {period}")
            return
        with open(os.path.join(path, "cpu.cfs_period_us"), "w") as fh:
            fh.write(str(period))
        with open(os.path.join(path, "cpu.cfs_quota_us"), "w") as fh:
            fh.write(str(-1 if cpus is None else int(cpus * period)))

    def _cgroup(self, i: int, cpus: float | None) -> str:
        found = _cgroup_root()
        if found is None:
            pytest.skip("no cgroup CPU controller here")
        root, version = found
        path = os.path.join(root, f"{self.prefix}q{i}")
        os.makedirs(path, exist_ok=True)
        if version == "v2":
            with open(os.path.join(root, "cgroup.subtree_control"), "w") as fh:
                fh.write("+cpu")
        self._versions[i] = (path, version)
        self._set_quota(i, cpus)
        return os.path.join(path, "cgroup.procs")

    def popen(self, i: int, argv: list[str], env: dict[str, str], **kw) -> subprocess.Popen:
        """Runs argv on node i: in its cgroup, its network namespace (nsenter: unlike `ip netns exec`, it leaves
        /sys and so the cgroup files as they are), its own host name and hosts file, on CPU i % CPUs (a node of
        its own CPU, shared with the nodes of the same parity: no node oversubscribes another's threads);
        gloo on its eth0."""
        env = {**env, "GLOO_SOCKET_IFNAME": "eth0", "GPUDOCTOR_NETWORLD_CGROUP": self.cgroups.get(i, "")}
        cpus = sorted(os.sched_getaffinity(0))
        join = 'if [ -n "$GPUDOCTOR_NETWORLD_CGROUP" ]; then echo $$ > "$GPUDOCTOR_NETWORLD_CGROUP"; fi; exec "$@"'
        chain = ["sh", "-c", join, "sh"] + (["taskset", "-c", str(cpus[i % len(cpus)])] if self.pin_cpus else [])
        # nsenter: unlike `ip netns exec`, it leaves /sys and so the cgroup files as they are
        chain += netnodes.on_node(self.ns(i), self.host(i), self.hosts_file, argv)
        p = subprocess.Popen(chain, env=env, start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        netnodes.remove(self._namespaces(), self._links())
        if os.path.exists(self.hosts_file):
            os.unlink(self.hosts_file)
        for procs in self.cgroups.values():
            path = os.path.dirname(procs)
            for _ in range(50):  # the killed processes leave the cgroup a moment later
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)

    def _namespaces(self) -> list[str]:
        return [self.ns(i) for i in range(self.n)]

    def _links(self) -> list[str]:
        return [*(f"{self.prefix}v{i}" for i in range(self.n)), self.bridge]

    def leftovers(self) -> list[str]:
        """What of this world is still on the machine (for a test that the clean-up is complete)."""
        left = netnodes.leftovers(self._namespaces(), self._links())
        left += [os.path.dirname(p) for p in self.cgroups.values() if os.path.exists(os.path.dirname(p))]
        left += [self.hosts_file] if os.path.exists(self.hosts_file) else []
        return left
