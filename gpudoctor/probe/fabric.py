"""NVIDIA host daemons: nv-fabricmanager (service state and version) and nvidia-persistenced.

The fabric manager must be the same version as the driver, or it refuses to start and CUDA fails
with error 802 on NVSwitch systems (NVIDIA Fabric Manager user guide, "Fabric Manager and driver
version compatibility"). Its version is read from `nv-fabricmanager --version` and its state from
`systemctl is-active`, each bounded and run only when the tool exists.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from gpudoctor.probe.kernel import run_bounded

COMMAND_TIMEOUT = 3.0
FM_UNIT = "nvidia-fabricmanager"
_VERSION = re.compile(r"version is\s*:?\s*([0-9][0-9.]*)|([0-9]{3}\.[0-9]+(?:\.[0-9]+)?)")


def fabric_manager(path: str | None = None) -> dict:
    """{binary, version, service, errors?}: None where the tool is missing or did not answer."""
    search = os.environ.get("PATH", os.defpath) if path is None else path
    search = search + os.pathsep + "/usr/bin:/usr/sbin:/usr/local/sbin"
    env = {**os.environ, "LC_ALL": "C"}
    out: dict = {"binary": shutil.which("nv-fabricmanager", path=search), "version": None, "service": None}
    errors = {}
    if out["binary"]:
        try:
            _, text, err = run_bounded([out["binary"], "--version"], COMMAND_TIMEOUT, env)
            m = _VERSION.search(text + "\n" + err)
            out["version"] = (m.group(1) or m.group(2)).rstrip(".") if m else None
        except subprocess.TimeoutExpired:
            errors["version"] = f"nv-fabricmanager --version did not answer within {COMMAND_TIMEOUT:g} s (killed)"
        except OSError as e:
            errors["version"] = f"nv-fabricmanager: {e.strerror or e}"
    systemctl = shutil.which("systemctl", path=search)
    if systemctl and out["binary"]:
        try:
            _, text, _ = run_bounded([systemctl, "is-active", FM_UNIT], COMMAND_TIMEOUT, env)
            state = text.strip().splitlines()[0] if text.strip() else ""
            out["service"] = state if re.fullmatch(r"[a-z-]{1,20}", state) else None
        except subprocess.TimeoutExpired:
            errors["service"] = f"systemctl is-active did not answer within {COMMAND_TIMEOUT:g} s (killed)"
        except OSError as e:
            errors["service"] = f"systemctl: {e.strerror or e}"
    if errors:
        out["errors"] = errors
    return out


def process_running(prefix: str) -> bool | None:
    """Whether a process whose name starts with prefix runs; None when that cannot be seen."""
    try:
        import psutil

        for p in psutil.process_iter(["name"]):
            if (p.info.get("name") or "").startswith(prefix):
                return True
    except Exception:
        return None
    return None if in_other_pid_namespace() else False


def persistenced_running() -> bool | None:
    # the kernel keeps 15 characters of a name: "nvidia-persiste"
    return process_running("nvidia-persiste")


def in_other_pid_namespace() -> bool:
    """True in a container, where host daemons are invisible."""
    if os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv") or "KUBERNETES_SERVICE_HOST" in os.environ:
        return True
    try:
        with open("/proc/1/cgroup") as fh:
            text = fh.read()
    except OSError:
        return False
    return any(word in text for word in ("docker", "kubepods", "containerd", "lxc"))
