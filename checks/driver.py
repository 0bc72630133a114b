"""driver checks: is the NVIDIA driver there, and new enough for the CUDA torch was built with."""

from __future__ import annotations

import os
import re

from gpudoctor import versions
from gpudoctor.job.env import probe_env
from gpudoctor.model import Outcome, fail, info, manual, passed, set_env, skip, unset_env, warn
from gpudoctor.registry import check

# Driver branch -> newest CUDA it supports (NVIDIA's CUDA toolkit release notes, table 3).
# Used for the forward-compatibility libcuda, whose file name carries only the driver version.
DRIVER_BRANCH_CUDA = [
    (580, (13, 0)),
    (575, (12, 9)),
    (570, (12, 8)),
    (560, (12, 6)),
    (555, (12, 5)),
    (550, (12, 4)),
    (545, (12, 3)),
    (535, (12, 2)),
    (530, (12, 1)),
    (525, (12, 0)),
    (520, (11, 8)),
    (515, (11, 7)),
    (510, (11, 6)),
    (495, (11, 5)),
    (470, (11, 4)),
    (465, (11, 3)),
    (460, (11, 2)),
    (455, (11, 1)),
    (450, (11, 0)),
]


def cuda_for_driver(driver_version: str | None) -> tuple[int, int] | None:
    v = versions.parse(driver_version)
    if not v:
        return None
    for branch, cuda in DRIVER_BRANCH_CUDA:
        if v[0] >= branch:
            return cuda
    return None


def _nvml_hint(error: str) -> str:
    e = error.lower()
    if "mismatch" in e:
        return "the loaded kernel module and the user-space driver libraries differ (a driver upgrade without a reboot)"
    if "library not found" in e or "not installed" in e or "libnvidia-ml" in e:
        return "no NVIDIA driver library (libnvidia-ml.so) on this machine or in this container"
    if "permission" in e or "no permission" in e:
        return "this user may not open /dev/nvidia* (container without --gpus, or device cgroup)"
    if "driver not loaded" in e:
        return "the nvidia kernel module is not loaded"
    return "NVML could not be initialised"


@check(
    id="GD-DRV-001",
    name="nvidia-driver-unusable",
    category="driver",
    title="NVIDIA driver and NVML usable",
    needs=["nvidia"],
    what="Initialises NVML (the library behind nvidia-smi) and counts the GPUs it sees.",
    why="Without a working driver, torch silently falls back to the CPU or fails at the first "
    "CUDA call; a driver/library version mismatch after an upgrade looks like a broken GPU.",
    fix="Install or load the NVIDIA driver; after a driver upgrade, reboot (or reload the nvidia "
    "kernel modules). In containers, start with `--gpus all` (Docker) or `--nv` (Apptainer). "
    "Use `--expect-gpus 0` for a job that is meant to run on CPUs.",
)
def nvidia_driver_unusable(facts, ctx):
    nv = facts.nvidia
    if nv.get("timed_out"):
        return fail(
            "NVML did not answer in time: the driver may be hung",
            manual("Check `nvidia-smi` and `dmesg` for Xid errors"),
            error=nv.get("error"),
        )
    if not nv.get("available"):
        error = nv.get("error") or "NVML unavailable"
        if not ctx.gpus_expected:
            return skip("no GPUs expected (--expect-gpus 0); no NVIDIA driver found", error=error)
        return fail(
            f"no usable NVIDIA driver: {_nvml_hint(error)}",
            # nvidia-smi only shows whether a driver is there: the fix loads one (a container gets it from its runtime)
            manual(
                "Load the NVIDIA driver (install it if none is; a container: --gpus all; CPU job: --expect-gpus 0)",
                "sudo modprobe nvidia",
            ),
            error=error,
        )
    # A GPU NVML may not open belongs to another job's device cgroup (SLURM): not ours, not broken.
    gpus = [g for g in facts.gpus if not g.get("inaccessible")]
    broken = [g for g in gpus if g.get("error")]
    if broken:
        return fail(
            f"{len(broken)} of {len(gpus)} GPU(s) cannot be queried (fallen off the bus?)",
            manual("Look for Xid 79 in `dmesg`; the node needs a reset or repair", "nvidia-smi -q"),
            gpus={g["index"]: g["error"] for g in broken},
            driver_version=nv.get("driver_version"),
        )
    if not gpus:
        if not ctx.gpus_expected:
            return skip("no GPUs expected (--expect-gpus 0)", driver_version=nv.get("driver_version"))
        return fail(
            "the NVIDIA driver is loaded but sees no GPUs",
            manual("Check `nvidia-smi -L` and the node's hardware"),
            driver_version=nv.get("driver_version"),
        )
    return passed(
        f"driver {nv.get('driver_version')} "
        f"(CUDA {versions.fmt(versions.cuda_from_int(nv.get('cuda_driver_version')))}) sees {len(gpus)} GPU(s)",
        driver_version=nv.get("driver_version"),
        cuda_driver_version=nv.get("cuda_driver_version"),
        gpu_count=len(gpus),
    )


@check(
    id="GD-DRV-002",
    name="driver-too-old-for-torch-cuda",
    category="driver",
    title="Driver supports torch's CUDA version",
    needs=["nvidia", "torch", "libraries"],
    requires=["nvidia-driver", "torch"],
    what="Compares the newest CUDA version the driver supports (NVML) with the CUDA version torch "
    "was built with, counting CUDA forward-compatibility libraries on LD_LIBRARY_PATH.",
    why="A torch built for a newer CUDA major version than the driver supports fails at the first "
    "CUDA call ('The NVIDIA driver on your system is too old (found version 11040)'). Within one "
    "major version, minor-version compatibility lets eager kernels run, but PTX JIT (a GPU not in "
    "torch's arch list) and Triton kernels from torch.compile can fail. Minor-version compatibility "
    "exists only from CUDA 11 on: a 10.2 runtime on a 10.1 driver fails (NVIDIA, CUDA Compatibility, "
    "Minor Version Compatibility). A cuda-compat libcuda counts only on data-centre GPUs: on GeForce and "
    "TITAN cards CUDA fails with error 804, cudaErrorCompatNotSupportedOnDevice (NVIDIA, CUDA "
    "Compatibility, Forward Compatibility) - the same cause GD-CUDA-003 reports.",
    fix="Upgrade the driver, or install the torch wheel built for the driver's CUDA version "
    "(e.g. `pip install torch --index-url https://download.pytorch.org/whl/cu118`). On data-centre "
    "GPUs, the cuda-compat package can run a newer CUDA on an older driver.",
)
def driver_too_old_for_torch_cuda(facts, ctx):
    nv, t = facts.nvidia, facts.torch
    if not t.get("cuda"):
        return skip("torch is a CPU-only build (see the cuda checks)", torch=t.get("version"))
    torch_cuda = versions.parse(t["cuda"])
    if torch_cuda is None:  # a replayed or hand-made snapshot; torch.version.cuda is 'X.Y'
        return skip(f"torch's CUDA version {str(t['cuda'])[:40]!r} is not a version number")
    need = torch_cuda[:2]
    have = versions.cuda_from_int(nv.get("cuda_driver_version"))
    evidence = {
        "torch": t.get("version"),
        "torch_cuda": t["cuda"],
        "driver_version": nv.get("driver_version"),
        "driver_cuda": versions.fmt(have),
    }
    if have is None:
        return skip("NVML did not report the driver's CUDA version", **evidence)
    compat_cuda = _forward_compat_cuda(facts, have, need, evidence)
    if isinstance(compat_cuda, Outcome):
        return compat_cuda
    have_eff = _effective_cuda(facts, have, compat_cuda, evidence)
    return _judge_driver_cuda(facts, need, have, have_eff, compat_cuda, evidence)


def _cuda_error(t: dict) -> str:
    return str(t.get("cuda_error") or "").lower()


def _cuda_said_too_old(t: dict) -> bool:
    error = _cuda_error(t)
    return "too old" in error or "insufficient" in error


def _forward_compat_cuda(facts, have: tuple[int, int], need: tuple[int, ...], evidence: dict):
    """The CUDA version of a forward-compatibility libcuda in use (None: the installed driver is the one
    judged), or the failure when such a libcuda is loaded on GPUs that cannot use it."""
    t = facts.torch
    compat = [c for c in facts.libraries.get("cuda_compat", []) if c.get("version")]
    compat_cuda = max((cuda_for_driver(c["version"]) or (0, 0) for c in compat), default=None)
    unsupported = forward_compat_unsupported(facts)
    error = _cuda_error(t)
    said_804 = "804" in error or "forward compatibility was attempted" in error
    if unsupported and ((compat_cuda and compat_cuda > have) or said_804):
        # the compat libcuda is not a newer driver here: judged with the installed one (GD-CUDA-003 agrees)
        evidence["forward_compat"] = [c["path"] for c in compat]
        evidence["forward_compat_unsupported"] = unsupported
        if not t.get("cuda_available"):
            return fail(
                "a CUDA forward-compatibility libcuda "
                f"({', '.join(evidence['forward_compat']) or 'not on LD_LIBRARY_PATH'}) is loaded, "
                f"but {unsupported}: CUDA initialisation fails with error 804 "
                "(cudaErrorCompatNotSupportedOnDevice); the driver itself supports CUDA "
                f"{versions.fmt(have)}, torch needs {versions.fmt(need)}",
                _without_compat(facts, compat)
                if compat
                else manual("Find and remove the cuda-compat libcuda", "ldconfig -p | grep libcuda"),
                **evidence,
            )
        return None
    if not compat_cuda or compat_cuda <= have or _cuda_said_too_old(t):
        return None  # CUDA said the driver is too old: the compat libcuda is not the one in use (GD-CUDA-003)
    evidence["forward_compat"] = [c["path"] for c in compat]
    evidence["forward_compat_cuda"] = versions.fmt(compat_cuda)
    return compat_cuda


def _effective_cuda(facts, have: tuple[int, int], compat_cuda, evidence: dict) -> tuple[int, int]:
    """The CUDA version the libcuda in use supports: the compat copy's, or an older copy CUDA named."""
    have_eff = compat_cuda or have
    t = facts.torch
    found = _FOUND_VERSION.search(_cuda_error(t)) if _cuda_said_too_old(t) and not t.get("cuda_available") else None
    loaded = versions.cuda_from_int(int(found.group(1))) if found else None
    if loaded:
        # the libcuda CUDA actually loaded (a stale copy in the image) is older than NVML's driver: judge that one
        have_eff = min(have_eff, loaded)
        evidence["libcuda_cuda"] = versions.fmt(have_eff)
    return have_eff


def _judge_driver_cuda(facts, need: tuple[int, ...], have, have_eff, compat_cuda, evidence: dict) -> Outcome:
    """The verdict on the CUDA version the driver in use supports (have_eff) against torch's (need)."""
    t = facts.torch
    upgrade = manual(
        f"Upgrade the NVIDIA driver to one for CUDA {versions.fmt(need)}, or install a torch built for "
        f"CUDA {versions.fmt(have)} or older",
        f"pip install torch --index-url https://download.pytorch.org/whl/cu{have[0]}{have[1]}",
    )
    if have_eff >= need:
        via = f" through forward-compatibility libcuda (CUDA {versions.fmt(compat_cuda)})" if have_eff != have else ""
        return passed(
            f"driver supports CUDA {versions.fmt(have_eff)}{via}; torch needs {versions.fmt(need)}", **evidence
        )
    cuda_refused = _cuda_said_too_old(t) and not t.get("cuda_available")  # CUDA itself said so: no minor-version rescue
    if have_eff[0] < need[0] or need[0] < 11 or cuda_refused:
        # before CUDA 11 there is no minor-version compatibility: a 10.2 runtime needs a 10.2 driver (NVIDIA,
        # "CUDA Compatibility", Minor Version Compatibility: applies from CUDA 11 onwards)
        if t.get("cuda_available"):  # it did initialise: a newer libcuda than NVML's (a compat copy) is in use
            libcuda = (t.get("loaded_libraries") or {}).get("cuda") or []
            return info(
                f"NVML reports a driver for CUDA {versions.fmt(have)}, yet torch (CUDA {versions.fmt(need)}) "
                f"initialised CUDA: a newer libcuda is in use ({', '.join(libcuda) or 'path unknown'}), "
                "e.g. a forward-compatibility copy "
                "outside LD_LIBRARY_PATH",
                None,
                libcuda=libcuda,
                **evidence,
            )
        return fail(
            f"torch {t.get('version')} needs CUDA {versions.fmt(need)} but the driver supports only "
            f"CUDA {versions.fmt(have_eff)}: "
            f"CUDA calls will fail with 'driver too old (found version {have_eff[0] * 1000 + have_eff[1] * 10})'",
            upgrade,
            **evidence,
        )
    return warn(
        f"torch needs CUDA {versions.fmt(need)}, the driver supports {versions.fmt(have_eff)}: eager kernels run "
        "through minor-version compatibility, but PTX JIT and torch.compile/Triton kernels may fail",
        upgrade,
        **evidence,
    )


# Forward compatibility (cuda-compat) is supported only on data-centre GPUs, select NGC-ready RTX SKUs and Jetson
# (NVIDIA, "CUDA Compatibility", Forward Compatibility); elsewhere CUDA fails with error 804,
# cudaErrorCompatNotSupportedOnDevice. GeForce and TITAN cards are never among them.
_CONSUMER = re.compile(r"\b(GeForce|TITAN)\b", re.I)
_FOUND_VERSION = re.compile(r"found version (\d{4,6})")


def forward_compat_unsupported(facts) -> str | None:
    """Why a forward-compatibility libcuda cannot work on this machine's GPUs, or None when it may."""
    consumer = sorted({g.get("name") for g in facts.gpus if _CONSUMER.search(g.get("name") or "")})
    if consumer:
        return f"forward compatibility works only on data-centre GPUs, not on {', '.join(consumer)}"
    error = str(facts.torch.get("cuda_error") or "")
    if "804" in error or "forward compatibility was attempted" in error.lower():
        return "CUDA reported error 804 (forward compatibility not supported on this hardware)"
    return None


def _without_compat(facts, compat: list[dict]):
    dirs = {os.path.dirname(os.path.normpath(c["path"])) for c in compat}
    keep = [d for d in probe_env(facts).get("LD_LIBRARY_PATH", "").split(":") if d and os.path.normpath(d) not in dirs]
    title = f"Remove {', '.join(sorted(dirs))} (cuda-compat) from LD_LIBRARY_PATH"
    if keep:
        return set_env("LD_LIBRARY_PATH", ":".join(keep), title=title)
    return unset_env("LD_LIBRARY_PATH", title=title)
