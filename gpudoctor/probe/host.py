"""Host facts: OS, CPU, memory, /dev/shm, containers, ulimits, Python."""

from __future__ import annotations

import os
import platform
import resource
import socket
import sys

from gpudoctor.fileio import read_text as _read
from gpudoctor.readers.ints import python_int


def _limit(value: int) -> int:
    """-1 means unlimited, as `ulimit` prints it."""
    return -1 if value == resource.RLIM_INFINITY else int(value)


def _cgroup_paths() -> dict[str, str]:
    """/proc/self/cgroup as {controller: path}; cgroup v2's unified line is keyed ""."""
    out = {}
    for line in (_read("/proc/self/cgroup") or "").splitlines():
        _, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path.strip()
    return out


def _walk_up(root: str, path: str | None) -> list[str]:
    """root/path and each of its parents up to root, innermost first.

    A SLURM job's --mem limit sits on the job's own cgroup (.../job_123/step_0), not on the
    root; inside a container the path may not exist below the mount, and root is what counts.
    """
    parts = [p for p in (path or "").split("/") if p]
    return ["/".join([root, *parts[:n]]) for n in range(len(parts), -1, -1)]


def _own_cgroup_dirs() -> list[str]:
    """This process's cgroup v2 directory and its parents, innermost first."""
    return _walk_up("/sys/fs/cgroup", _cgroup_paths().get(""))


def _cgroup_limits() -> dict:
    """CPU and memory limits of the cgroups this process is in (v2, else v1): a container's or
    a SLURM job's real size. The tightest limit on the path wins."""
    paths = _cgroup_paths()
    mems, cpus = [], []
    for d in _walk_up("/sys/fs/cgroup", paths.get("")):
        mems.append(python_int(_read(f"{d}/memory.max")))
        quota, _, period = (_read(f"{d}/cpu.max") or "").partition(" ")
        cpus.append(_ratio(python_int(quota), python_int(period)))
    if not any(mems):  # cgroup v1
        mems = [
            python_int(_read(f"{d}/memory.limit_in_bytes"))
            for d in _walk_up("/sys/fs/cgroup/memory", paths.get("memory"))
        ]
    if not any(cpus):
        for root in ("/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu"):
            for d in _walk_up(root, paths.get("cpu")):
                cpus.append(
                    _ratio(python_int(_read(f"{d}/cpu.cfs_quota_us")), python_int(_read(f"{d}/cpu.cfs_period_us")))
                )
    mem_limits = [m for m in mems if m and m < 1 << 60]  # v1 writes "no limit" as a huge number
    cpu_limits = [c for c in cpus if c]
    return {
        "cpu_limit": round(min(cpu_limits), 2) if cpu_limits else None,
        "memory_limit_bytes": min(mem_limits) if mem_limits else None,
    }


def _ratio(quota: int | None, period: int | None) -> float | None:
    return quota / period if quota and period and quota > 0 else None


def _container() -> dict:
    cgroup = _read("/proc/1/cgroup") or ""
    c = {
        "docker": os.path.exists("/.dockerenv") or "docker" in cgroup,
        "podman": os.path.exists("/run/.containerenv"),
        "kubernetes": "KUBERNETES_SERVICE_HOST" in os.environ,
        "apptainer": "APPTAINER_CONTAINER" in os.environ or "SINGULARITY_CONTAINER" in os.environ,
    }
    c["in_container"] = any(c.values())
    c.update(_cgroup_limits())
    return c


def cpu_model() -> str | None:
    """The CPU's marketing name.

    Linux names it in /proc/cpuinfo, which costs nothing. py-cpuinfo is the portable
    fallback, but it starts helper interpreters and probes CPUID (about 1 s of CPU here),
    which on a small node would slow the torch import that `check` runs beside it.
    """
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "cpu model") and value.strip():
            return value.strip()
    try:
        import cpuinfo

        return cpuinfo.get_cpu_info().get("brand_raw") or None
    except Exception:
        return platform.processor() or None


def probe() -> dict:
    import psutil

    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = list(range(os.cpu_count() or 1))
    vm = psutil.virtual_memory()
    shm = None
    if os.path.isdir("/dev/shm"):
        try:
            st = os.statvfs("/dev/shm")
            shm = {"total_bytes": st.f_blocks * st.f_frsize, "free_bytes": st.f_bavail * st.f_frsize}
        except OSError:
            pass
    memlock = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {
        "hostname": socket.gethostname(),
        "os": platform.system(),
        "os_release": _os_release(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_count_logical": psutil.cpu_count(logical=True),
        "cpu_count_physical": psutil.cpu_count(logical=False),
        "cpus_allowed": allowed,
        "cpus_allowed_count": len(allowed),
        "mem_total_bytes": vm.total,
        "mem_available_bytes": vm.available,
        "shm": shm,
        "container": _container(),
        "ulimits": {
            "memlock_soft": _limit(memlock[0]),
            "memlock_hard": _limit(memlock[1]),
            "nofile_soft": _limit(nofile[0]),
            "nofile_hard": _limit(nofile[1]),
        },
        "python": {
            "version": platform.python_version(),
            "executable": sys.executable,
            "implementation": platform.python_implementation(),
        },
    }


def _os_release() -> str | None:
    text = _read("/etc/os-release") or ""
    for line in text.splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip('"')
    return None


def cpu_share() -> dict:
    """The CPU this process may use now, for naming why a CPU rank is slow: its cgroup quota (a SLURM job's or
    a container's cpu.max / cfs_quota_us, in CPUs), the CPUs it may run on, and the load on the machine."""
    try:
        affinity: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    try:
        load = round(os.getloadavg()[0], 2)
    except OSError:
        load = None
    return {"cpu_limit": _cgroup_limits()["cpu_limit"], "affinity_cpus": affinity, "load_1m": load}
