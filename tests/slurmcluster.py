"""A real single-node SLURM cluster for the tests: munged, slurmctld and slurmd in a temp dir.

The node declares 8 GPUs in gres.conf, backed by fake character devices (`mknod ... c 1 3`,
the numbers of /dev/null), so srun and sbatch set real SLURM_* variables and
CUDA_VISIBLE_DEVICES exactly as on a GPU cluster. Everything it writes lives under one
directory; its own munge socket and free TCP ports keep it apart from any other cluster
on the machine (another test session may run one at the same time).

Needs root (slurmd runs jobs as their user; munged and mknod need root) and Debian's
slurm-wlm and munge; `ensure_installed()` installs them with apt-get when missing.

    cluster = SlurmCluster(tmp_dir)
    cluster.start()                          # about 2-10 s
    r = cluster.srun(["--ntasks=2", "env"])  # subprocess.CompletedProcess
    r = cluster.sbatch_wait(script_path)     # submits, waits for the end; returncode = the job's exit code
    cluster.stop()

MultiNodeCluster(tmp_dir, nodes=2) is the same with several nodes on this machine, one slurmd per network and
UTS namespace (its docstring), for jobs that span nodes; the same calls run it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from tests import netnodes

PACKAGES = ("slurm-wlm", "munge")
BINARIES = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "scontrol", "sinfo")
GPUS = 8
GPU_TYPE = "h200"  # typed, so the seed's --gres=gpu:h200:1 is satisfiable (untyped gpu:N matches too)
CPUS = 256  # declared, far more than this machine has (config_overrides): the seed scripts ask 8 tasks x 16 CPUs


TERMINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}


def _field(record: str, name: str) -> str | None:
    for part in record.split():
        if part.startswith(name + "="):
            return part.split("=", 1)[1]
    return None


class ClusterUnavailable(RuntimeError):
    """SLURM cannot run here; the message says why (used as the pytest skip reason)."""


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None and not os.path.exists(f"/usr/sbin/{b}")]


def ensure_installed(timeout: float = 900) -> None:
    """apt-get install slurm-wlm and munge when any binary is missing (root only)."""
    if not missing_binaries():
        return
    if os.geteuid() != 0:
        raise ClusterUnavailable(
            f"SLURM is not installed ({', '.join(missing_binaries())} missing) and installing needs root"
        )
    if shutil.which("apt-get") is None:
        raise ClusterUnavailable("SLURM is not installed and there is no apt-get to install it")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]):
        try:
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ClusterUnavailable(f"`{' '.join(cmd)}` failed: {e}") from None
        if r.returncode != 0:
            tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["?"]
            raise ClusterUnavailable(f"`{' '.join(cmd)}` exited {r.returncode}: {tail[0]}")
    if missing_binaries():
        raise ClusterUnavailable(f"still missing after install: {', '.join(missing_binaries())}")


def _sbin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmCluster:
    def __init__(
        self,
        root: str | os.PathLike,
        gpus: int = GPUS,
        cpus: int = CPUS,
        name: str | None = None,
        gpu_type: str = GPU_TYPE,
        extra_conf: str = "",
    ):
        self.root = Path(root)
        self.gpus = gpus
        self.gpu_type = gpu_type
        self.cpus = cpus
        self.node = name or f"gdnode{os.getpid()}"
        self.hostname = socket.gethostname()
        self.conf = self.root / "etc" / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.extra_conf = extra_conf  # slurm.conf lines appended as given (HealthCheckProgram, Prolog, ...)
        self._pids: dict[str, int] = {}

    # ------------------------------------------------------------ set-up

    def _write_munge_key(self) -> Path:
        mdir = self.root / "munge"
        mdir.mkdir(mode=0o755, parents=True, exist_ok=True)
        key = mdir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        return key

    def _make_gpu_devices(self, node: str) -> list[Path]:
        ddir = self.root / "dev" / node if len(self.node_names) > 1 else self.root / "dev"
        ddir.mkdir(parents=True, exist_ok=True)
        devices = []
        for i in range(self.gpus):
            dev = ddir / f"nvidia{i}"
            if not dev.exists():
                r = subprocess.run(["mknod", str(dev), "c", "1", "3"], capture_output=True, text=True)
                if r.returncode != 0:
                    raise ClusterUnavailable(f"mknod {dev} failed: {r.stderr.strip()}")
            devices.append(dev)
        return devices

    # The hooks MultiNodeCluster overrides: one node on 127.0.0.1 here.

    @property
    def node_names(self) -> list[str]:
        return [self.node]

    ctl_address = "127.0.0.1"
    _per_node = ""  # slurm.conf's %n: the node's own spool, pid and log files (one slurmd here: none)

    def _ports(self) -> tuple[int, int]:
        return _free_port(), _free_port()

    def _node_lines(self) -> str:
        return (
            f"NodeName={self.node} NodeHostname={self.hostname} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=1000 "
            f"Gres=gpu:{self.gpu_type}:{self.gpus} State=UNKNOWN"
        )

    def _start_slurmds(self) -> None:
        self._spawn("slurmd", [_sbin("slurmd"), "-D", "-N", self.node, "-f", str(self.conf)])

    def _daemons(self) -> list[str]:
        """Names of the daemons started, in the order to stop them."""
        return ["slurmd", "slurmctld", "munged"]

    def _write_config(self) -> None:
        etc = self.root / "etc"
        for d in ("etc", "state", "spool", "log"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        ctl_port, d_port = self._ports()
        r = self.root
        conf = f"""\
# Written by tests/slurmcluster.py: a throw-away single-node cluster.
ClusterName=gdtest{os.getpid()}
SlurmctldHost={self.hostname}({self.ctl_address})
SlurmctldPort={ctl_port}
SlurmdPort={d_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool{self._per_node}
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd{self._per_node}.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd{self._per_node}.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
ReturnToService=2
MessageTimeout=20
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=2
MinJobAge=30
{self._node_lines()}
PartitionName=debug Nodes={",".join(self.node_names)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
{self.extra_conf}"""
        (etc / "slurm.conf").write_text(conf)
        gres = "".join(
            f"NodeName={node} Name=gpu Type={self.gpu_type} File={device}\n"
            for node in self.node_names
            for device in self._make_gpu_devices(node)
        )
        (etc / "gres.conf").write_text(gres)
        (etc / "cgroup.conf").write_text("CgroupPlugin=autodetect\nIgnoreSystemd=yes\n")

    def env(self, extra: dict | None = None) -> dict:
        """The environment for client commands: this cluster's slurm.conf, no outer SLURM job."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SRUN_", "SBATCH_", "SALLOC_"))}
        env["SLURM_CONF"] = str(self.conf)
        env.pop("CUDA_VISIBLE_DEVICES", None)
        env.update(extra or {})
        return env

    def _spawn(self, name: str, cmd: list[str], env: dict | None = None) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env(env),
            start_new_session=True,
        )
        log.close()
        self._pids[name] = proc.pid
        self._procs = getattr(self, "_procs", {})
        self._procs[name] = proc

    def start(self, timeout: float = 30) -> SlurmCluster:
        if os.geteuid() != 0:
            raise ClusterUnavailable("starting SLURM daemons needs root")
        missing = missing_binaries()
        if missing:
            raise ClusterUnavailable(f"SLURM/munge binaries missing: {', '.join(missing)}")
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)  # munged wants a socket directory others may traverse
        key = self._write_munge_key()
        self._write_config()
        m = self.root / "munge"
        self._spawn(
            "munged",
            [
                _sbin("munged"),
                "--foreground",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={m}/munged.pid",
                f"--log-file={self.root}/log/munged.log",
                f"--seed-file={m}/munged.seed",
            ],
        )
        self._wait_for(lambda: self.munge_socket.exists(), 10, "munged did not create its socket")
        self._spawn("slurmctld", [_sbin("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._start_slurmds()
        self._wait_for(self._node_ready, timeout, "the node did not become idle")
        return self

    def _wait_for(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in getattr(self, "_procs", {}).items():
                if proc.poll() is not None:
                    self.stop()
                    raise ClusterUnavailable(f"{name} exited with status {proc.returncode}: {self._log_tail(name)}")
            if ready():
                return
            time.sleep(0.2)
        tails = "; ".join(f"{n}: {self._log_tail(n)}" for n in reversed(self._daemons()[:-1]))
        self.stop()
        raise ClusterUnavailable(f"{what} within {timeout:g} s ({tails})")

    def _log_tail(self, name: str) -> str:
        for path in (self.root / "log" / f"{name}.log", self.root / "log" / f"{name}.out"):
            try:
                lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
            except OSError:
                continue
            if lines:
                return lines[-1][-300:]
        return "no log"

    def _node_ready(self) -> bool:
        try:
            r = subprocess.run(
                [_sbin("sinfo"), "-h", "-N", "-o", "%T"], env=self.env(), capture_output=True, text=True, timeout=5
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        states = [line.strip().rstrip("*") for line in r.stdout.splitlines() if line.strip()]
        return (
            r.returncode == 0
            and len(states) == len(self.node_names)
            and all(state in ("idle", "mixed", "allocated") for state in states)
        )

    # ------------------------------------------------------------ use

    def srun(
        self, args: list[str], env: dict | None = None, timeout: float = 120, cwd=None
    ) -> subprocess.CompletedProcess:
        """srun ARGS in this cluster (a new allocation); output captured as text."""
        return subprocess.run(
            [shutil.which("srun") or "srun", "--quit-on-interrupt", *args],
            env=self.env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
        )

    def sbatch_wait(
        self,
        script: str | os.PathLike,
        args: list[str] | None = None,
        env: dict | None = None,
        timeout: float = 180,
        cwd=None,
        real_wait: bool = False,
    ) -> subprocess.CompletedProcess:
        """Submit SCRIPT and wait for the job to end; returncode is the job's exit code.

        real_wait=True runs `sbatch --wait` itself (what CI pipelines do); by default the job
        is polled every 0.2 s instead, because `sbatch --wait` sleeps up to 10 s between polls.
        """
        if real_wait:
            return subprocess.run(
                [shutil.which("sbatch") or "sbatch", "--wait", *(args or []), str(script)],
                env=self.env(env),
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=cwd or self.root,
                stdin=subprocess.DEVNULL,
            )
        sub = subprocess.run(
            [shutil.which("sbatch") or "sbatch", "--parsable", *(args or []), str(script)],
            env=self.env(env),
            capture_output=True,
            text=True,
            timeout=30,
            cwd=cwd or self.root,
            stdin=subprocess.DEVNULL,
        )
        if sub.returncode != 0:
            return sub
        job_id = sub.stdout.strip().split(";")[0]
        deadline = time.monotonic() + timeout
        record = ""
        while time.monotonic() < deadline:
            r = subprocess.run(
                [_sbin("scontrol"), "show", "job", "-o", job_id],
                env=self.env(),
                capture_output=True,
                text=True,
                timeout=10,
            )
            record = r.stdout
            state = _field(record, "JobState")
            if state in TERMINAL_STATES:
                code = _field(record, "ExitCode") or "1:0"
                rc, sig = (int(x) for x in code.split(":"))
                return subprocess.CompletedProcess(
                    sub.args, rc or (128 + sig if sig else 0), job_id, sub.stderr + record
                )
            time.sleep(0.2)
        subprocess.run([shutil.which("scancel") or "scancel", job_id], env=self.env(), capture_output=True, timeout=10)
        raise subprocess.TimeoutExpired(sub.args, timeout, output=job_id, stderr=record)

    def python_command(self) -> list[str]:
        """The interpreter running the tests: jobs run the gpudoctor installed in it."""
        return [sys.executable, "-m", "gpudoctor"]

    # ------------------------------------------------------------ tear-down

    def stop(self) -> None:
        """Kill the daemons this cluster started (and only those), children included."""
        for name in self._daemons():
            pid = self._pids.pop(name, None)
            if pid is None:
                continue
            try:
                os.killpg(pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                continue
            proc = getattr(self, "_procs", {}).get(name)
            try:
                if proc is not None:
                    proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(pid, signal.SIGKILL)
                    proc.wait(timeout=5)
                except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
                    pass
        self._kill_leftover_steps()

    def _kill_leftover_steps(self) -> None:
        """slurmstepd processes of this cluster's jobs outlive slurmd's process group."""
        spool = str(self.root / "spool")
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                environ = (proc / "environ").read_bytes()
            except OSError:
                continue
            if cmdline.startswith("slurmstepd") and (spool.encode() in environ or str(self.conf).encode() in environ):
                try:
                    os.kill(int(proc.name), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


class MultiNodeCluster(SlurmCluster):
    """nodes "nodes" on this one machine: one slurmd per network and UTS namespace (tests/netnodes.py), each its
    own NodeName and host name, joined by a bridge; slurmctld and munged stay in the root namespace, on the
    bridge's own address, so the client commands (sbatch, srun, scontrol) run here as for SlurmCluster.

    srun really starts tasks on two or three "nodes": a task sees its node's host name and addresses, and a
    `localhost` on node 2 is node 2's own loopback, where nothing of node 1 listens. Every node resolves every
    node's name (a hosts file bind-mounted over /etc/hosts in the node's mount namespace). Each node has its own
    spool, pid and log files (slurm.conf's %n, which slurmd expands to the node's name; Debian's slurmd, built
    without --enable-multiple-slurmd, runs one instance per host, so each has a "host" of its own here) and its
    own fake GPU device files in gres.conf.

    Instances on the same machine (other xdist workers, other sessions) never collide: each claims its own /24
    (tests/netnodes.claim_subnet, an flock held for its life), and its namespace, veth and bridge names carry that
    subnet's number. stop() kills every process left in its namespaces, then removes them and the bridge; start()
    does so itself when it fails. Raises ClusterUnavailable (the skip reason) where this cannot run.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        nodes: int = 2,
        gpus: int = 4,
        cpus: int = 64,
        gpu_type: str = GPU_TYPE,
        extra_conf: str = "",
    ):
        super().__init__(root, gpus=gpus, cpus=cpus, gpu_type=gpu_type, extra_conf=extra_conf)
        self.nodes = nodes
        self.subnet_index: int | None = None
        self._lock: IO[str] | None = None

    # names and addresses, all derived from the subnet claimed

    @property
    def subnet(self) -> str:
        return f"10.214.{self.subnet_index}"

    @property
    def prefix(self) -> str:
        return f"gds{self.subnet_index}"

    @property
    def node_names(self) -> list[str]:
        return [f"gd{self.subnet_index}node{i + 1}" for i in range(self.nodes)]

    @property
    def ctl_address(self) -> str:  # type: ignore[override]
        return f"{self.subnet}.1"

    _per_node = "-%n"

    def address(self, i: int) -> str:
        return f"{self.subnet}.{i + 2}"

    def ns(self, i: int) -> str:
        return f"{self.prefix}n{i}"

    @property
    def hosts_file(self) -> Path:
        return self.root / "etc" / "hosts"

    def _links(self) -> list[str]:
        return [*(f"{self.prefix}v{i}" for i in range(self.nodes)), f"{self.prefix}br"]

    def _namespaces(self) -> list[str]:
        return [self.ns(i) for i in range(self.nodes)]

    # the SlurmCluster hooks

    def _ports(self) -> tuple[int, int]:
        return _free_port(), 6818  # slurmd: each in its own network namespace, so its default port is free

    def _node_lines(self) -> str:
        return "\n".join(
            f"NodeName={node} NodeHostname={node} NodeAddr={self.address(i)} CPUs={self.cpus} RealMemory=1000 "
            f"Gres=gpu:{self.gpu_type}:{self.gpus} State=UNKNOWN"
            for i, node in enumerate(self.node_names)
        )

    def _daemons(self) -> list[str]:
        return [*(f"slurmd-{node}" for node in self.node_names), "slurmctld", "munged"]

    def _start_slurmds(self) -> None:
        for i, node in enumerate(self.node_names):
            (self.root / f"spool-{node}").mkdir(parents=True, exist_ok=True)
            slurmd = [_sbin("slurmd"), "-D", "-N", node, "-f", str(self.conf)]
            self._spawn(f"slurmd-{node}", netnodes.on_node(self.ns(i), node, self.hosts_file, slurmd))

    # life

    def start(self, timeout: float = 60) -> MultiNodeCluster:
        if os.geteuid() != 0:
            raise ClusterUnavailable("starting SLURM daemons in network namespaces needs root")
        why = netnodes.usable()
        if why:
            raise ClusterUnavailable(f"no network namespaces for the nodes: {why}")
        try:
            self.subnet_index, self._lock = netnodes.claim_subnet()
        except RuntimeError as e:
            raise ClusterUnavailable(str(e)) from None
        try:
            self._stop_network()  # leftovers of a killed instance that held this subnet
            (self.root / "etc").mkdir(parents=True, exist_ok=True)
            names = {node: self.address(i) for i, node in enumerate(self.node_names)}
            netnodes.write_hosts(self.hosts_file, {**names, self.hostname: self.ctl_address})
            netnodes.make_bridge(f"{self.prefix}br", f"{self.ctl_address}/24")
            for i in range(self.nodes):
                netnodes.add_node(f"{self.prefix}br", self.ns(i), f"{self.prefix}v{i}", f"{self.address(i)}/24")
        except (OSError, subprocess.SubprocessError) as e:
            self.stop()
            detail = getattr(e, "stderr", b"") or b""
            raise ClusterUnavailable(
                f"could not make the nodes' network: {e} {detail.decode(errors='replace')}"
            ) from None
        try:
            super().start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def run_on(self, i: int, argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
        """argv on node i (its network, host name and hosts file), outside SLURM; output captured as text."""
        return subprocess.run(
            netnodes.on_node(self.ns(i), self.node_names[i], self.hosts_file, argv),
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        """The daemons, every process left in the nodes' namespaces, the namespaces, the bridge, the subnet."""
        super().stop()
        if self.subnet_index is None:
            return
        self._stop_network()
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def _stop_network(self) -> None:
        self._kill_namespace_processes()
        netnodes.remove(self._namespaces(), self._links())

    def _kill_namespace_processes(self) -> None:
        """Tasks a killed slurmstepd left (torchrun's workers) keep a namespace alive after `ip netns del`."""
        inodes = set()
        for ns in self._namespaces():
            try:
                inodes.add(f"net:[{os.stat(f'/run/netns/{ns}').st_ino}]")
            except OSError:
                continue
        if not inodes:
            return
        for _ in range(3):
            found = False
            for proc in Path("/proc").iterdir():
                if not proc.name.isdigit():
                    continue
                try:
                    if os.readlink(proc / "ns" / "net") not in inodes:
                        continue
                    os.kill(int(proc.name), signal.SIGKILL)
                    found = True
                except OSError:
                    continue
            if not found:
                return
            time.sleep(0.2)

    def leftovers(self) -> list[str]:
        """What of this cluster is still on the machine (for a test that the clean-up is complete)."""
        if self.subnet_index is None:
            return []
        return netnodes.leftovers(self._namespaces(), self._links())


def start_cluster(root: str | os.PathLike, install: bool = True) -> SlurmCluster:
    """Install if needed and start; raises ClusterUnavailable with the reason."""
    if os.geteuid() != 0:
        raise ClusterUnavailable(
            "not running as root: a SLURM cluster needs root to start munged, slurmctld and slurmd"
        )
    if install:
        ensure_installed()
    return SlurmCluster(root).start()
