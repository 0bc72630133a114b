"""Shared libraries a CUDA program may pick up, and the CUDA toolkit (nvcc) on this machine.

Versions are read from file names (libcudnn.so.9.1.0 -> 9.1.0): no library is loaded.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping

from gpudoctor.probe.proc import run_bounded

FAMILIES = {
    "cudnn": re.compile(r"^libcudnn\.so(?:\.(\d+(?:\.\d+)*))?$"),
    "nccl": re.compile(r"^libnccl\.so(?:\.(\d+(?:\.\d+)*))?$"),
    "cudart": re.compile(r"^libcudart\.so(?:\.(\d+(?:\.\d+)*))?$"),
    "cublas": re.compile(r"^libcublas\.so(?:\.(\d+(?:\.\d+)*))?$"),
    "nvjitlink": re.compile(r"^libnvJitLink\.so(?:\.(\d+(?:\.\d+)*))?$"),
    "cuda_driver": re.compile(r"^libcuda\.so(?:\.(\d+(?:\.\d+)*))?$"),
}


def _scan_dir(directory: str, source: str, found: dict) -> None:
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        for fam, rx in FAMILIES.items():
            m = rx.match(name)
            if m:
                path = os.path.join(directory, name)
                if not os.path.exists(path):
                    continue  # a dangling symlink: the loader cannot open it, so it shadows nothing
                entry = {"path": path, "version": m.group(1), "source": source, "symlink": os.path.islink(path)}
                real = os.path.realpath(path)
                if real != path:  # checks compare folders with the real paths a process maps
                    entry["realpath"] = real
                found[fam].append(entry)


_LDCONFIG_LINE = re.compile(r"^\s*(\S+)\s+\(([^)]*)\)\s*=>\s*(\S.*?)\s*$")
MAX_CACHE_ENTRIES = 400  # CUDA-library entries kept from `ldconfig -p` (a CUDA install registers a few dozen)
MAX_CUDNN_FILES = 128  # cuDNN files described per folder


def _ldconfig_entries() -> list[dict]:
    """The ld.so cache's entries for the CUDA libraries ({soname, flags, path}), in the cache's order: the
    loader takes the first entry of a name whose flags fit it. Empty when ldconfig is missing or hangs."""
    exe = shutil.which("ldconfig") or ("/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else None)
    if not exe:
        return []
    try:
        out = run_bounded([exe, "-p"], timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_ldconfig(out)


def parse_ldconfig(text: str) -> list[dict]:
    """`ldconfig -p` lines of the CUDA libraries: [{soname, flags, path}] in the cache's order."""
    entries = []
    for line in text.splitlines():
        m = _LDCONFIG_LINE.match(line)
        if m and any(
            k in m.group(1) for k in ("libcudnn", "libnccl", "libcudart", "libcublas", "libnvJitLink", "libcuda.so")
        ):
            entries.append({"soname": m.group(1), "flags": m.group(2), "path": m.group(3)})
            if len(entries) >= MAX_CACHE_ENTRIES:
                break
    return entries


def _ldconfig_dirs(entries: list[dict]) -> list[str]:
    return list(dict.fromkeys(os.path.dirname(e["path"]) for e in entries))


def _cudnn_files(directory: str) -> list[dict]:
    """libcudnn*.so* files of a folder by name (the name is what the loader opens), with their real paths."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.startswith("libcudnn") and ".so" in n)
    except OSError:
        return []
    out = []
    for name in names[:MAX_CUDNN_FILES]:
        path = os.path.join(directory, name)
        if os.path.exists(path):
            out.append({"name": name, "realpath": os.path.realpath(path)})
    return out


def cudnn_loader(ld_dirs: list[str], cache: list[dict]) -> dict:
    """What the dynamic loader could hand a cuDNN sub-library request from outside torch's own folder: the ld.so
    cache's libcudnn* entries and the libcudnn* files in each LD_LIBRARY_PATH entry (GD-CUDA-005)."""
    ld_cache = [
        {**e, "realpath": os.path.realpath(e["path"])}
        for e in cache
        if os.path.basename(e["soname"]).startswith("libcudnn")
    ]
    return {
        "ld_cache": ld_cache,
        "ld_library_path": [{"dir": d, "files": _cudnn_files(d)} for d in ld_dirs],
    }


def describe_cudnn_dirs(dirs: list[str]) -> list[dict]:
    """torch's own cuDNN folders: each libcudnn* file with the dynamic-section entries that decide where the
    loader looks for what it loads (SONAME, NEEDED, RPATH, RUNPATH), read from the ELF file (probe/elf.py)."""
    from gpudoctor.probe.elf import dynamic_info

    out = []
    for d in dict.fromkeys(dirs):
        files = []
        for f in _cudnn_files(d):
            info = dynamic_info(os.path.join(d, f["name"]))
            if info is not None:
                info["needed"] = [n for n in info["needed"] if n.startswith("libcudnn")]
            files.append({**f, "dynamic": info})
        out.append({"dir": d, "files": files})
    return out


def torch_cudnn_dirs(torch: dict) -> list[str]:
    """The folders torch's cuDNN comes from: those of the libcudnn files its process mapped, and the cuDNN wheel's."""
    mapped = ((torch.get("loaded_libraries") or {}).get("cudnn")) or []
    dirs = [os.path.dirname(os.path.normpath(p)) for p in mapped]
    dirs += [d for d in torch.get("wheel_lib_dirs") or [] if os.path.basename(os.path.dirname(d)) == "cudnn"]
    return list(dict.fromkeys(dirs))


def _wheel_dirs() -> list[str]:
    """NVIDIA's pip wheels (nvidia-cudnn-cu12, ...) that torch's CUDA wheels load first."""
    dirs = []
    for p in sys.path:
        dirs.extend(sorted(glob.glob(os.path.join(p, "nvidia", "*", "lib"))))
    return dirs


def _cuda_home(env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The CUDA_HOME torch.utils.cpp_extension would use, and how it would find it."""
    cuda_home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if cuda_home:
        return cuda_home, "CUDA_HOME" if env.get("CUDA_HOME") else "CUDA_PATH"
    nvcc = shutil.which("nvcc", path=env.get("PATH"))
    if nvcc:
        return os.path.dirname(os.path.dirname(nvcc)), "PATH"
    if os.path.exists("/usr/local/cuda"):
        return "/usr/local/cuda", "default"
    return None, None


def _toolkit(env: Mapping[str, str]) -> dict:
    cuda_home, found_via = _cuda_home(env)
    nvcc_path = os.path.join(cuda_home, "bin", "nvcc") if cuda_home else None
    nvcc = nvcc_path if nvcc_path and os.path.exists(nvcc_path) else None
    out: dict = {"cuda_home": cuda_home, "found_via": found_via, "nvcc": nvcc, "version": None}
    roots = [r for r in (cuda_home, os.path.dirname(os.path.dirname(os.path.realpath(nvcc))) if nvcc else None) if r]
    for root in roots:
        try:
            with open(os.path.join(root, "version.json")) as fh:
                out["version"] = json.load(fh)["cuda"]["version"]
                out["version_source"] = "version.json"
                break
        except (OSError, ValueError, KeyError, TypeError):
            pass
    if out["version"] is None and out["nvcc"]:
        try:
            text = run_bounded([out["nvcc"], "--version"], timeout=10).stdout
            m = re.search(r"release ([0-9]+\.[0-9]+)", text)
            out["version"] = m.group(1) if m else None
            out["version_source"] = "nvcc --version"
        except (OSError, subprocess.TimeoutExpired) as e:
            out["error"] = f"nvcc --version: {e}"
    return out


def probe(environ: dict | None = None) -> dict:
    env = os.environ if environ is None else environ
    found: dict = {fam: [] for fam in FAMILIES}
    ld_dirs = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    for d in ld_dirs:
        _scan_dir(d, "LD_LIBRARY_PATH", found)
    cache = _ldconfig_entries()
    for d in _ldconfig_dirs(cache):
        if d not in ld_dirs:
            _scan_dir(d, "ldconfig", found)
    for d in _wheel_dirs():
        _scan_dir(d, "pip-wheel", found)
    return {
        "ld_library_path": ld_dirs,
        "found": found,
        # forward-compat libcuda (cuda-compat package) on LD_LIBRARY_PATH: lets an old driver run newer CUDA
        "cuda_compat": [e for e in found["cuda_driver"] if e["source"] == "LD_LIBRARY_PATH" and "compat" in e["path"]],
        "toolkit": _toolkit(env),
        "cudnn_loader": cudnn_loader(ld_dirs, cache),
    }
