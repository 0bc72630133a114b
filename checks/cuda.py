"""cuda checks: can torch be imported, is it a CUDA build that initialises, does it carry
kernels for these GPUs, and does it load the CUDA libraries it was built with."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from gpudoctor import shellquote, versions
from gpudoctor.job.env import job_env, probe_env
from gpudoctor.job.gpus import describe_groups, gpu_capabilities, nvml_gpus
from gpudoctor.model import Outcome, fail, info, manual, passed, set_env, skip, unset_env, warn
from gpudoctor.readers import cudavis
from gpudoctor.registry import check

# CUDA versions PyTorch publishes wheels for (download.pytorch.org/whl/cuXY); which ones exist
# depends on the torch release, so a fix names the newest one the driver can run and says so.
WHEEL_CUDA = [(13, 0), (12, 9), (12, 8), (12, 6), (12, 4), (12, 1), (11, 8)]

_ARCH = re.compile(r"^(sm|compute)_(\d+)([af]?)$")
_SONAME_MAJOR = re.compile(r"\.so\.(\d+)")


# ---------------------------------------------------------------- shared helpers


def _not_a_cuda_build(facts) -> Outcome | None:
    """A skip for CPU-only and ROCm builds (GD-CUDA-002 judges those)."""
    t = facts.torch
    if t.get("hip"):
        return skip(f"torch {t.get('version')} is a ROCm build (see GD-CUDA-002)")
    if not t.get("cuda"):
        return skip(f"torch {t.get('version')} is a CPU-only build (see GD-CUDA-002)")
    if versions.parse(t["cuda"]) is None:  # a replayed or hand-made snapshot; torch.version.cuda is 'X.Y'
        return skip(f"torch's CUDA version {str(t['cuda'])[:40]!r} is not a version number")
    return None


def _so_major(path: str) -> int | None:
    m = _SONAME_MAJOR.search(os.path.basename(path))
    return int(m.group(1)) if m else None


def _entry_major(entry: dict) -> int | None:
    v = versions.parse(entry.get("version"))
    return v[0] if v else None


def _entry_dir(entry: dict) -> str:
    return os.path.dirname(os.path.normpath(entry.get("realpath") or entry["path"]))


def _wheel_dirs(facts) -> set[str]:
    """NVIDIA pip-wheel library folders of the target interpreter.

    The torch child reports them from the target's own sys.path; the libraries probe sees
    gpudoctor's interpreter, which is only the right one for snapshots without that field.
    """
    t = facts.torch
    if "wheel_lib_dirs" in t:
        return {os.path.normpath(d) for d in t["wheel_lib_dirs"] or []}
    found = facts.libraries.get("found") or {}
    return {_entry_dir(e) for entries in found.values() for e in entries if e.get("source") == "pip-wheel"}


def _bundled_dirs(facts) -> set[str]:
    """Folders holding the CUDA libraries that came with torch: NVIDIA's pip wheels and torch/lib."""
    dirs = _wheel_dirs(facts)
    location = facts.torch.get("location")
    if location:
        dirs.add(os.path.join(os.path.dirname(os.path.normpath(location)), "lib"))
    return dirs


# The folders NVIDIA's pip wheels install each library family into (site-packages/nvidia/<folder>/lib).
WHEEL_FOLDERS = {
    "cudnn": ("cudnn",),
    "cudart": ("cuda_runtime", "cu13"),
    "cublas": ("cublas", "cu13"),
    "nvjitlink": ("nvjitlink", "cu13"),
}


def _wheel_copies(facts, family: str) -> list[str]:
    """Where NVIDIA's pip wheels installed `family` for the target's torch (files, else folders)."""
    dirs = _wheel_dirs(facts)
    found = (facts.libraries.get("found") or {}).get(family) or []
    files = [e["path"] for e in found if e.get("source") == "pip-wheel" and e.get("version") and _entry_dir(e) in dirs]
    if files:
        return files
    folders = WHEEL_FOLDERS.get(family, ())
    return sorted(d for d in dirs if os.path.basename(os.path.dirname(d)) in folders)


def _ld_path_without(facts, dirs: set[str]):
    """A fix that drops `dirs` from LD_LIBRARY_PATH (keeping the other entries and their order)."""
    current = [d for d in probe_env(facts).get("LD_LIBRARY_PATH", "").split(":") if d]
    keep = [d for d in current if os.path.normpath(d) not in dirs]
    title = f"Remove {', '.join(sorted(dirs))} from LD_LIBRARY_PATH"
    if not keep:
        return unset_env("LD_LIBRARY_PATH", title=title)
    return set_env("LD_LIBRARY_PATH", ":".join(keep), title=title)


def _wheel_index(driver_cuda: tuple[int, int] | None) -> str:
    """The newest CUDA wheel index the driver can run (an example, cu126, when the driver is unknown)."""
    cuda = next((c for c in WHEEL_CUDA if c <= driver_cuda), WHEEL_CUDA[-1]) if driver_cuda else (12, 6)
    return f"https://download.pytorch.org/whl/cu{cuda[0]}{cuda[1]}"


def _base_version(version: str | None) -> str | None:
    v = versions.parse(version)
    return versions.fmt(v) if v else None


# ---------------------------------------------------------------- GD-CUDA-001


def _import_error_hint(error: str) -> str:
    e = error.lower()
    if "cannot open shared object file" in e:
        return (
            "a shared library torch needs is missing (an incomplete "
            "install, or a CUDA wheel without its nvidia-* dependencies)"
        )
    if "undefined symbol" in e:
        return (
            "a different build of a library torch links was loaded first: look for CUDA/cuDNN/NCCL folders on "
            "LD_LIBRARY_PATH or LD_PRELOAD"
        )
    if "numpy" in e:
        return "numpy and torch disagree (a numpy 2 / torch built for numpy 1 mix)"
    if "not a complete installation" in e:
        return "an interrupted install or uninstall left a partial torch folder"
    return "torch is installed but does not import"


def _crash_hint(signal_name: str | None) -> str:
    if signal_name == "SIGILL":
        return "this CPU lacks an instruction set the torch (or numpy) build uses"
    if signal_name in ("SIGSEGV", "SIGBUS", "SIGABRT"):
        return (
            "a native library conflict is likely: check LD_LIBRARY_PATH and LD_PRELOAD for foreign "
            "CUDA/cuDNN/NCCL/MPI libraries"
        )
    return "a native library failed while torch was loading"


def _timeout_outcome(t: dict, python: str) -> Outcome:
    stage = t.get("stage")
    evidence = {"python": python, "stage": stage, "timeout_seconds": t.get("timeout_seconds")}
    if stage in ("cuda_init", "devices"):
        return fail(
            f"{t.get('error')}: CUDA initialisation hangs; the driver or a GPU is likely stuck",
            manual("Check the driver and the GPUs", "nvidia-smi", "dmesg | grep -i xid"),
            **evidence,
        )
    return fail(
        f"{t.get('error')}: every rank would stall the same way (slow shared filesystem, a huge sys.path, "
        "or a native library stuck while loading; if the filesystem is only slow, raise --torch-timeout)",
        manual("See where the import spends its time", f"{shellquote.quote(python)} -X importtime -c 'import torch'"),
        **evidence,
    )


@check(
    id="GD-CUDA-001",
    name="torch-not-importable",
    category="cuda",
    title="torch imports in the target interpreter",
    needs=["torch"],
    what="Imports torch in a child process of the target interpreter (--python, default: this one), "
    "with a time limit (--torch-timeout), and reports a missing torch, an import error, a hang or a crash.",
    why="A training job whose `import torch` fails, hangs on a slow filesystem or crashes in a native "
    "library never starts, and under a scheduler it may sit on its allocation until the time limit.",
    fix="Install torch into the interpreter the job uses, or point gpudoctor at it with --python. For "
    "import errors, read the message: a missing .so means an incomplete install; an undefined symbol "
    "usually means a foreign CUDA library on LD_LIBRARY_PATH was loaded first.",
)
def torch_not_importable(facts, ctx):
    t = facts.torch
    status = t.get("status")
    python = t.get("python") or "python"
    if status == "ok":
        return passed(
            f"torch {t.get('version')} imports"
            + (f" in {t['import_seconds']} s" if t.get("import_seconds") is not None else "")
            + f" ({python})",
            python=python,
            version=t.get("version"),
            location=t.get("location"),
            import_seconds=t.get("import_seconds"),
        )
    evidence = {"python": python, "status": status, "error": t.get("error")}
    if status == "missing":
        msg = f"torch is not installed for {python}"
        fix = manual(
            "Install torch there, or point gpudoctor at the job's interpreter",
            f"{shellquote.quote(python)} -m pip install torch",
            "gpudoctor check --python /path/to/job/env/bin/python",
        )
        if not ctx.gpus_expected:
            # --expect-gpus 0: possibly a login/CI node auditing settings, not the training environment
            return warn(
                f"{msg}: jobs started from this environment cannot run (if they use another one, pass --python)",
                fix,
                **evidence,
            )
        return fail(f"{msg}: the job cannot start here, and the CUDA checks cannot judge it", fix, **evidence)
    if status == "import_error":
        hint = _import_error_hint(t.get("error") or "")
        return fail(
            f"import torch fails: {t.get('error')} ({hint})",
            manual(
                "Reproduce and repair the install",
                f"{shellquote.quote(python)} -c 'import torch'",
                f"{shellquote.quote(python)} -m pip install --force-reinstall torch",
            ),
            ld_library_path=probe_env(facts).get("LD_LIBRARY_PATH"),
            ld_preload=probe_env(facts).get("LD_PRELOAD"),
            **evidence,
        )
    if status == "timeout":
        return _timeout_outcome(t, python)
    if status == "crashed":
        # stage 'done': torch imported and was described, only the report to gpudoctor got lost
        hint = (
            "torch imported, but something it loaded closed or redirected standard output"
            if t.get("stage") == "done"
            else _crash_hint(t.get("signal"))
        )
        return fail(
            f"{t.get('error')}: {hint}",
            manual(
                "Reproduce with a native traceback",
                f"{shellquote.quote(python)} -X faulthandler -c 'import torch; torch.cuda.is_available()'",
            ),
            signal=t.get("signal"),
            stage=t.get("stage"),
            stderr_tail=t.get("stderr_tail"),
            ld_library_path=probe_env(facts).get("LD_LIBRARY_PATH"),
            ld_preload=probe_env(facts).get("LD_PRELOAD"),
            **evidence,
        )
    if status == "python_error":
        return fail(
            f"cannot run the target interpreter: {t.get('error')}",
            manual(
                "Point --python at the job's Python 3 interpreter", "gpudoctor check --python /path/to/env/bin/python"
            ),
            **evidence,
        )
    return fail(f"the torch probe gave no usable result: {t.get('error') or status}", **evidence)


# ---------------------------------------------------------------- GD-CUDA-002


@check(
    id="GD-CUDA-002",
    name="torch-cpu-only-build",
    category="cuda",
    title="torch build can use the NVIDIA GPUs",
    needs=["torch", "nvidia"],
    requires=["torch"],
    what="Reads torch.version.cuda (None for CPU-only builds) and torch.version.hip, and compares "
    "with the NVIDIA GPUs the driver sees.",
    why="A CPU-only torch (the +cpu wheels, or a pip index that served one) runs the whole job on the "
    "CPU without an error: torch.cuda.is_available() is simply False.",
    fix="Reinstall torch from the CUDA wheel index the driver supports, e.g. "
    "`pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu124`.",
)
def torch_cpu_only_build(facts, ctx):
    t = facts.torch
    gpus = nvml_gpus(facts)
    evidence = {"torch": t.get("version"), "torch_cuda": t.get("cuda"), "nvidia_gpus": len(gpus)}
    if t.get("cuda"):
        return passed(f"torch {t.get('version')} is built for CUDA {t['cuda']}", **evidence)
    driver_cuda = versions.cuda_from_int(facts.nvidia.get("cuda_driver_version"))
    version = _base_version(t.get("version"))
    pin = f"torch=={version}" if version else "torch"
    limit = (
        f"CUDA {versions.fmt(driver_cuda)} or older (the driver's limit)"
        if driver_cuda
        else "the CUDA version the driver supports (nvidia-smi shows it; e.g. cu126)"
    )
    fix = manual(
        f"Install a CUDA build of torch for {limit}; pytorch.org lists the CUDA builds of each torch release",
        f"pip install --force-reinstall {pin} --index-url {_wheel_index(driver_cuda)}",
    )
    kind = f"a ROCm build (HIP {t['hip']})" if t.get("hip") else "a CPU-only build"
    if gpus and ctx.gpus_expected:
        return fail(
            f"torch {t.get('version')} is {kind}, but this machine has "
            f"{len(gpus)} NVIDIA GPU(s): the job would run on the CPU",
            fix,
            **evidence,
        )
    if gpus:
        return info(
            f"torch {t.get('version')} is {kind} on a machine with {len(gpus)} NVIDIA GPU(s); fine for --expect-gpus 0",
            fix,
            **evidence,
        )
    if ctx.gpus_expected:
        return warn(
            f"torch {t.get('version')} is {kind}: it could not use GPUs even where there are some "
            "(none are visible here; see GD-DRV-001)",
            fix,
            **evidence,
        )
    return skip(f"torch {t.get('version')} is {kind}; no GPUs expected (--expect-gpus 0)", **evidence)


# ---------------------------------------------------------------- GD-CUDA-003


def _cuda_init_hint(error: str) -> str:
    e = error.lower()
    if "802" in e or "system not yet initialized" in e:
        return "on NVSwitch systems (HGX/DGX) this means nvidia-fabricmanager is not running or not yet done"
    if "804" in e or "forward compatibility" in e:
        return (
            "a CUDA forward-compatibility libcuda (cuda-compat) is "
            "on the library path of a GPU that does not support it"
        )
    if "too old" in e:
        return "the driver is too old for this torch's CUDA (see GD-DRV-002)"
    if "no cuda-capable device" in e or "error 100" in e:
        return "no GPU is visible to this process (CUDA_VISIBLE_DEVICES, container device list or cgroup)"
    if "999" in e or "unknown error" in e:
        return "the driver is in a bad state (often after suspend or an Xid error): reload nvidia_uvm or reboot"
    return "CUDA failed to initialise"


@check(
    id="GD-CUDA-003",
    name="torch-cuda-init-failed",
    category="cuda",
    title="torch initialises CUDA on the GPUs the driver sees",
    needs=["torch", "nvidia", "env"],
    requires=["torch"],
    what="Calls torch.cuda.is_available() in the probe child (recording the warning torch prints "
    "when CUDA initialisation fails) on a machine where NVML sees GPUs and torch is a CUDA build.",
    why="When the driver sees GPUs but CUDA cannot initialise (fabric manager not running on an HGX "
    "node, Error 802; a forward-compatibility libcuda on an unsupported GPU, Error 804; "
    "CUDA_VISIBLE_DEVICES hiding all GPUs), torch quietly reports no GPU and the job runs on the CPU "
    "or fails at its first .cuda().",
    fix="Read the recorded CUDA error. Error 802 on NVSwitch nodes: `systemctl start "
    "nvidia-fabricmanager`. Error 804: remove the cuda-compat folder from LD_LIBRARY_PATH. Error 999: "
    "reload the nvidia_uvm module or reboot.",
)
def torch_cuda_init_failed(facts, ctx):
    skipped = _not_a_cuda_build(facts)
    if skipped:
        return skipped
    t = facts.torch
    gpus = nvml_gpus(facts)
    if not gpus:
        if t.get("cuda_available"):
            return passed(
                f"torch initialises CUDA and sees {t.get('device_count')} device(s) (NVML could not list them)",
                device_count=t.get("device_count"),
            )
        return skip("the NVIDIA driver sees no GPU here (see GD-DRV-001)")
    evidence = {
        "torch_cuda": t.get("cuda"),
        "nvidia_gpus": len(gpus),
        "cuda_available": t.get("cuda_available"),
        "device_count": t.get("device_count"),
        "CUDA_VISIBLE_DEVICES": probe_env(facts).get("CUDA_VISIBLE_DEVICES"),
    }
    if t.get("cuda_available"):
        return passed(
            f"torch initialises CUDA and sees {t.get('device_count')} device(s) (the driver sees {len(gpus)})",
            **evidence,
        )
    error = t.get("cuda_error") or "torch.cuda.is_available() returned False without an error message"
    evidence["cuda_error"] = error
    visibility = cudavis.from_facts(facts)
    if visibility.hides_all:
        # Not a CUDA fault: the variable leaves torch no GPU. GD-DEV-001 names the entry that does it.
        if "GD-DEV-001" in (ctx.running or ()):
            return skip(f"{visibility.describe()} leaves this process no GPU (see GD-DEV-001)", **evidence)
        hint = f"{visibility.describe()} leaves this process no GPU"
        fix = manual(
            "Request GPUs from the scheduler (e.g. --gres=gpu:8), or unset CUDA_VISIBLE_DEVICES outside a scheduler",
            "unset CUDA_VISIBLE_DEVICES",
        )
    else:
        hint, fix = _cuda_init_hint(error), None
        if "fabricmanager" in hint:
            fix = manual(
                "Start the NVIDIA fabric manager (root)",
                "systemctl start nvidia-fabricmanager",
                "systemctl status nvidia-fabricmanager",
            )
    msg = f"the driver sees {len(gpus)} GPU(s) but torch cannot initialise CUDA: {hint} ({error})"
    if not ctx.gpus_expected:  # --expect-gpus 0: the job falls back to the CPU, as intended
        return info(msg, fix, **evidence)
    return fail(msg, fix, **evidence)


# ---------------------------------------------------------------- GD-CUDA-004


def _parse_arch(entry: str):
    """'sm_90' -> ('sm', (9, 0), ''); 'compute_120' -> ('compute', (12, 0), ''); 'sm_90a' -> (..., 'a')."""
    m = _ARCH.match(entry.strip())
    if not m:
        return None
    digits = m.group(2)
    return m.group(1), (int(digits[:-1] or 0), int(digits[-1])), m.group(3)


def _arch_covers(entry, cc: tuple[int, int]) -> str | None:
    """'sass' if the entry's machine code runs on cc, 'ptx' if its PTX can be JIT-compiled for cc."""
    kind, target, suffix = entry
    if suffix == "a":  # architecture-specific: that exact GPU only
        ok = target == cc
    elif suffix == "f" or kind == "sm":  # machine code: same major, same or newer minor
        ok = target[0] == cc[0] and target[1] <= cc[1]
    else:  # portable PTX: any GPU at least as new
        ok = target <= cc
    if not ok:
        return None
    return "sass" if kind == "sm" else "ptx"


def _coverage(arch_list: list[str], cc: tuple[int, int]) -> str | None:
    kinds = {_arch_covers(a, cc) for a in filter(None, map(_parse_arch, arch_list))}
    return "sass" if "sass" in kinds else "ptx" if "ptx" in kinds else None


@check(
    id="GD-CUDA-004",
    name="torch-lacks-kernels-for-gpu",
    category="cuda",
    title="torch carries kernels for every GPU's architecture",
    needs=["torch", "nvidia"],
    requires=["torch"],
    what="Compares each GPU's compute capability with torch.cuda.get_arch_list(): an sm_XY entry runs on "
    "GPUs of the same major version and an equal or newer minor (X.Y and later X.*); a compute_XY "
    "(PTX) entry can be JIT-compiled for any GPU of capability X.Y or newer; sm_XYa only on X.Y.",
    why="Without machine code or PTX for the GPU, every CUDA kernel fails with 'no kernel image is "
    "available for execution on the device' (new GPUs on an old torch, old GPUs on a torch that "
    "dropped them). With PTX only, the driver JIT-compiles all kernels at first use: minutes of start-up.",
    fix="Install a torch build whose arch list includes the GPU (Blackwell needs a CUDA 12.8+ build; "
    "`python -c 'import torch; print(torch.cuda.get_arch_list())'` shows it), or build from source "
    "with TORCH_CUDA_ARCH_LIST set to the GPU's capability.",
)
def torch_lacks_kernels_for_gpu(facts, ctx):
    skipped = _not_a_cuda_build(facts)
    if skipped:
        return skipped
    t = facts.torch
    gpus = gpu_capabilities(facts)
    if not gpus:
        return skip("no GPU with a known compute capability (see GD-DRV-001)")
    arch_list = t.get("arch_list") or []
    if not arch_list:
        # older torch returns [] from get_arch_list() when CUDA did not initialise
        return skip("torch reported no arch list (see GD-CUDA-003)", arch_list_error=t.get("arch_list_error"))
    by_cov: dict[str | None, dict[tuple, list[int]]] = {}
    for idx, (name, cc) in gpus.items():
        by_cov.setdefault(_coverage(arch_list, cc), {}).setdefault((name, cc), []).append(idx)
    evidence = {
        "torch": t.get("version"),
        "arch_list": arch_list,
        "gpus": {i: f"{n} ({versions.fmt(cc)})" for i, (n, cc) in gpus.items()},
    }

    if None in by_cov:
        groups = by_cov[None]
        ccs = sorted({cc for _, cc in groups})
        newest = max(ccs)
        hint = " (Blackwell GPUs need a torch built for CUDA 12.8 or newer)" if newest[0] >= 10 else ""
        fix = manual(
            f"Install a torch build whose arch list includes sm_{newest[0]}{newest[1]}{hint}, or build torch with "
            f'TORCH_CUDA_ARCH_LIST="{";".join(versions.fmt(c) for c in ccs)}"',
            "python -c 'import torch; print(torch.cuda.get_arch_list())'",
        )
        return fail(
            f"{describe_groups(groups)}: torch {t.get('version')} has no kernels for this architecture (arch list: "
            f"{' '.join(arch_list)}); CUDA calls fail with 'no kernel image is available for execution on the device'",
            fix,
            **evidence,
        )
    if "ptx" in by_cov:
        return warn(
            f"{describe_groups(by_cov['ptx'])}: torch {t.get('version')} has only PTX for this "
            f"architecture (arch list: {' '.join(arch_list)}); the driver JIT-compiles every kernel "
            "on first use, which can take many minutes per process (cached in ~/.nv/ComputeCache, "
            "CUDA_CACHE_MAXSIZE), and JIT needs a driver at least as new as torch's CUDA (see GD-DRV-002)",
            manual(
                "Prefer a torch build with machine code (sm_XY) for these GPUs",
                "python -c 'import torch; print(torch.cuda.get_arch_list())'",
            ),
            **evidence,
        )
    ccs = sorted({versions.fmt(cc) for _, cc in gpus.values()})
    return passed(
        f"torch's arch list ({' '.join(arch_list)}) has machine code for compute capability {', '.join(ccs)}",
        **evidence,
    )


# ---------------------------------------------------------------- GD-CUDA-005


def _cudnn_major(t: dict) -> int | None:
    v = versions.cudnn_from_int(t.get("cudnn"))
    if v:
        return v[0]
    compile_v = t.get("cudnn_compile")
    return int(compile_v[0]) if compile_v else None


def _other_copies(facts, family: str, major: int | None, loaded_dirs: set[str], sources: tuple[str, ...]):
    """Found copies of `family` outside the folders torch loaded it from: (same major, other major)."""
    bundled = _bundled_dirs(facts)
    found = (facts.libraries.get("found") or {}).get(family) or []
    same: list[dict] = []
    other: list[dict] = []
    for e in found:
        if e.get("source") not in sources or _entry_major(e) is None:
            continue
        d = _entry_dir(e)
        if d in loaded_dirs or d in bundled:
            continue
        (same if _entry_major(e) == major else other).append(e)
    return same, other


def _ld_dirs_of(entries: list[dict]) -> set[str]:
    return {os.path.dirname(os.path.normpath(e["path"])) for e in entries}


_FULL_FILE_VERSION = re.compile(r"\.so\.(\d+(?:\.\d+)+)$")


def file_version(path: str) -> tuple[int, ...] | None:
    """The full version a mapped library's file name carries (libcudnn.so.9.1.0 -> (9, 1, 0),
    libcublasLt.so.12.4.5.8 -> (12, 4, 5, 8)); None for a bare soname such as the wheels' libcudnn.so.9."""
    m = _FULL_FILE_VERSION.search(os.path.basename(path))
    return versions.parse(m.group(1)) if m else None


def built_with(facts, family: str) -> tuple[int, ...] | None:
    """The version of `family` torch was built with, as far as its files' names can be compared with it:
    cuDNN's compile-time version (major, minor); for CUDA 12 and later the CUDA runtime, cuBLAS and nvJitLink
    carry the toolkit's major.minor in their file versions (libcublas.so.12.4.5.8 is CUDA 12.4's), so
    torch.version.cuda is theirs. None where there is no such version (CUDA 11's cuBLAS 11.11 is CUDA 11.8's)."""
    t = facts.torch
    if family == "cudnn":
        compiled = [v for v in t.get("cudnn_compile") or [] if isinstance(v, int)]
        return tuple(compiled[:2]) if len(compiled) >= 2 else None
    cuda = versions.parse(t.get("cuda"))
    if family in ("cudart", "cublas", "nvjitlink") and cuda and len(cuda) >= 2 and cuda[0] >= 12:
        return tuple(cuda[:2])
    return None


def loader_source(facts, path: str) -> str | None:
    """How the dynamic loader came to a mapped file torch did not bring with it: 'LD_PRELOAD', 'LD_LIBRARY_PATH
    entry <dir>' or 'the ld.so cache'; None when neither explains it (a RUNPATH, a dlopen by full path)."""
    env = probe_env(facts)
    folder = os.path.dirname(os.path.normpath(path))
    preload = re.split(r"[\s:]+", env.get("LD_PRELOAD", "").strip())
    if any(p and (os.path.normpath(p) == path or os.path.basename(p) == os.path.basename(path)) for p in preload):
        return "LD_PRELOAD"
    found = [e for entries in (facts.libraries.get("found") or {}).values() for e in entries]
    for entry in [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]:
        # the entry as written, or one whose files resolve (symlinks) into the mapped file's folder
        if os.path.normpath(entry) == folder or any(
            e.get("source") == "LD_LIBRARY_PATH"
            and _entry_dir(e) == folder
            and os.path.dirname(os.path.normpath(e["path"])) == os.path.normpath(entry)
            for e in found
        ):
            return f"LD_LIBRARY_PATH entry {entry}"
    if any(e.get("source") == "ldconfig" and _entry_dir(e) == folder for e in found):
        return "the ld.so cache"
    return None


def _version_mismatch(facts, family: str, label: str, loaded: list[str]) -> Outcome | None:
    """A file of `family` mapped from outside torch's own folders, found on the loader path, whose version is
    not the one torch was built with: fail when older (torch needs what it was built against), warn when newer."""
    built = built_with(facts, family)
    if not built:
        return None
    bundled = _bundled_dirs(facts)
    for path in loaded:
        have = file_version(path)
        source = loader_source(facts, path)
        if have is None or source is None or os.path.dirname(os.path.normpath(path)) in bundled:
            continue
        if have[: len(built)] == built:
            continue
        wheel = _wheel_copies(facts, family)
        evidence = {
            "loaded": path,
            "loaded_version": versions.fmt(have),
            "built_with": versions.fmt(built),
            "found_through": source,
            "wheel_copies": wheel,
            "ld_library_path": probe_env(facts).get("LD_LIBRARY_PATH"),
        }
        older = have[: len(built)] < built
        what = (
            f"torch's process mapped {label} {versions.fmt(have)} ({path}, found through {source}) but torch was "
            f"built with {versions.fmt(built)}"
        )
        consequence = (
            ": older than torch's, so functions torch calls are missing or refused ('undefined symbol: ...', "
            "'cuDNN version incompatibility', CUBLAS_STATUS_INVALID_VALUE)"
            if older
            else ": a build torch was not tested with, found before torch's own copy"
        )
        return (fail if older else warn)(what + consequence, _loader_fix(facts, source, wheel), **evidence)
    return None


def _loader_fix(facts, source: str, wheel: list[str]):
    """Take the folder off LD_LIBRARY_PATH; for the ld.so cache, put torch's own copy first."""
    if source.startswith("LD_LIBRARY_PATH entry "):
        return _ld_path_without(facts, {os.path.normpath(source.removeprefix("LD_LIBRARY_PATH entry "))})
    if source == "the ld.so cache" and wheel:
        # _wheel_copies names the files where the probe found them, else the folders
        folders = list(dict.fromkeys(os.path.dirname(p) if ".so" in os.path.basename(p) else p for p in wheel))
        current = [d for d in probe_env(facts).get("LD_LIBRARY_PATH", "").split(":") if d]
        return set_env("LD_LIBRARY_PATH", ":".join([*folders, *current]), title="Put torch's own copy first")
    return manual(f"Stop the {source} from handing the process another copy (LD_PRELOAD, ldconfig)")


def _library_shadowing(facts, family: str, label: str, major: int | None, loaded: list[str]) -> Outcome | None:
    """The finding shared by the cuDNN and CUDA-library checks, or None when nothing is off."""
    loaded_dirs = {os.path.dirname(os.path.normpath(p)) for p in loaded}
    loaded_majors = {m for m in map(_so_major, loaded) if m is not None}
    evidence = {"loaded": loaded, "ld_library_path": probe_env(facts).get("LD_LIBRARY_PATH")}
    if len(loaded_majors) > 1:
        return warn(
            f"torch's process has {label} of several major versions "
            f"loaded ({', '.join(loaded)}): two copies in one process",
            None,
            **evidence,
        )
    mismatch = _version_mismatch(facts, family, label, loaded)
    if mismatch:
        return mismatch
    bundled = _bundled_dirs(facts)
    wheel = _wheel_copies(facts, family)
    foreign = sorted(d for d in loaded_dirs if d not in bundled)
    if wheel and foreign:
        ld_entries = [
            e
            for e in (facts.libraries.get("found") or {}).get(family, [])
            if e.get("source") == "LD_LIBRARY_PATH" and _entry_dir(e) in foreign
        ]
        fix = _ld_path_without(facts, _ld_dirs_of(ld_entries)) if ld_entries else None
        return warn(
            f"torch loaded {label} from {', '.join(foreign)} instead of the copy its wheels installed "
            f"({', '.join(wheel)}): a different build than torch was tested with, found first on the library path",
            fix,
            wheel_copies=wheel,
            **evidence,
        )
    if len(loaded_dirs) > 1:
        return warn(
            f"{label} files were loaded from several folders ({', '.join(sorted(loaded_dirs))}): parts of two "
            "installations mixed in one process",
            None,
            **evidence,
        )
    return None


# How the dynamic loader finds a library a loaded object asks for by name (ld.so(8); dlopen(3) searches the same
# way from the object that calls it): DT_RPATH of the asking object when it has no DT_RUNPATH, LD_LIBRARY_PATH,
# its DT_RUNPATH (its own only: not inherited by what it loads), the ld.so cache, the default folders. A name
# already loaded is reused. Confirmed with LD_DEBUG=libs on built libraries (tests/checks/test_cudnn_loader.py).
_CUDNN_ASKERS = ("libcudnn.so.", "libcudnn_graph.so.")  # cuDNN's shim and cuDNN 9's graph library dlopen the rest


@dataclass
class _Resolution:
    soname: str
    asker: str  # the file name of the object that asks for it
    asked_by: str  # "dlopen" or "NEEDED"
    path: str | None  # None: not found, or a folder on the way could not be read
    realpath: str | None
    through: str
    known: bool = True


def _search_dirs(spec: str | None, origin: str) -> list[str]:
    return [
        os.path.normpath(d.replace("${ORIGIN}", origin).replace("$ORIGIN", origin))
        for d in (spec or "").split(":")
        if d
    ]


class _CudnnLoader:
    """The loader's search for cuDNN's sub-libraries, over what the libraries probe recorded."""

    def __init__(self, loader: dict, ld_library_path: list[str]):
        self.files: dict[str, dict[str, str]] = {}
        for group in (loader.get("bundle") or []) + (loader.get("ld_library_path") or []):
            names = {f["name"]: f.get("realpath") or os.path.join(group["dir"], f["name"]) for f in group["files"]}
            self.files[os.path.normpath(group["dir"])] = names
        self.cache: dict[str, dict] = {}
        for entry in loader.get("ld_cache") or []:
            self.cache.setdefault(entry["soname"], entry)  # the first entry of a name is the one taken
        self.ld_dirs = [os.path.normpath(d) for d in ld_library_path]

    def resolve(self, soname: str, asker_dir: str, asker: str, dynamic: dict, asked_by: str) -> _Resolution:
        steps = []
        if dynamic.get("rpath") and not dynamic.get("runpath"):
            steps += [(d, f"the RPATH of {asker}") for d in _search_dirs(dynamic["rpath"], asker_dir)]
        steps += [(d, f"LD_LIBRARY_PATH entry {d}") for d in self.ld_dirs]
        steps += [(d, f"the RUNPATH of {asker}") for d in _search_dirs(dynamic.get("runpath"), asker_dir)]
        for folder, how in steps:
            names = self.files.get(folder)
            if names is None:  # a folder whose files were not recorded: where the search ends is unknown
                return _Resolution(soname, asker, asked_by, None, None, f"{how} (not read)", known=False)
            if soname in names:
                return _Resolution(soname, asker, asked_by, os.path.join(folder, soname), names[soname], how)
        entry = self.cache.get(soname)
        if entry:
            real = entry.get("realpath") or entry["path"]
            return _Resolution(soname, asker, asked_by, entry["path"], real, "the ld.so cache")
        return _Resolution(soname, asker, asked_by, None, None, "nowhere")


def cudnn_sublibrary_resolutions(facts, bundle_dir: str, major: int) -> list[_Resolution] | None:
    """Where the loader would find each cuDNN sub-library of torch's major version when torch's own cuDNN files
    ask for it (by dlopen from the shim or cuDNN 9's graph library, or as a NEEDED entry); None without the facts
    (snapshots before issue 25)."""
    loader = facts.libraries.get("cudnn_loader")
    if not isinstance(loader, dict) or "bundle" not in loader:
        return None
    group = next((g for g in loader["bundle"] if os.path.normpath(g["dir"]) == bundle_dir), None)
    if group is None:
        return None
    suffix = f".so.{major}"
    names = {f["name"] for f in group["files"]}
    names |= {e["soname"] for e in loader.get("ld_cache") or []}
    names |= {f["name"] for g in loader.get("ld_library_path") or [] for f in g["files"]}
    wanted = sorted(n for n in names if n.startswith("libcudnn_") and n.endswith(suffix))
    resolver = _CudnnLoader(loader, facts.libraries.get("ld_library_path") or [])
    out = []
    for f in group["files"]:
        dynamic = f.get("dynamic")
        if not dynamic or f["name"] != (dynamic.get("soname") or f["name"]):
            continue  # each object once, under the name it is loaded by
        asks = [(n, "NEEDED") for n in dynamic.get("needed") or []]
        if f["name"].startswith(_CUDNN_ASKERS):
            asks += [(n, "dlopen") for n in wanted if n != f["name"]]
        for soname, how in asks:
            out.append(resolver.resolve(soname, bundle_dir, f["name"], dynamic, how))
    return out


def _foreign_sublibraries(facts, resolutions: list[_Resolution], bundle_dir: str, torch_v) -> list[_Resolution]:
    """Resolutions that land outside torch's cuDNN folder on a file of another (or unknown) version."""
    bundled = _bundled_dirs(facts) | {bundle_dir}
    bad: dict[str, _Resolution] = {}
    for r in resolutions:
        if not r.known or r.path is None or os.path.dirname(os.path.normpath(r.path)) in bundled:
            continue
        have = file_version(r.realpath or r.path)
        if have is not None and torch_v is not None and have[:3] == tuple(torch_v)[: len(have[:3])]:
            continue
        bad.setdefault(r.soname, r)
    return list(bad.values())


def _sublibrary_finding(facts, using: str, bundle_dir: str, major: int, torch_v, evidence: dict) -> Outcome | None:
    resolutions = cudnn_sublibrary_resolutions(facts, bundle_dir, major)
    if resolutions is None:
        return None
    bad = _foreign_sublibraries(facts, resolutions, bundle_dir, torch_v)
    if not bad:
        return None
    own = {f["name"] for g in facts.libraries["cudnn_loader"]["bundle"] for f in g["files"]}
    missing = sorted({r.soname for r in bad if r.soname not in own})

    def one(r: _Resolution) -> str:
        have = file_version(r.realpath or r.path or "")
        version = f"cuDNN {versions.fmt(have)}" if have else "a cuDNN of unknown version"
        why = (
            f"torch's folder has no {r.soname}"
            if r.soname in missing
            else (
                f"{r.asker} has no RUNPATH or RPATH naming its own folder"
                if r.through == "the ld.so cache"
                else "LD_LIBRARY_PATH is searched before the RUNPATH"
            )
        )
        return f"{r.soname} ({r.asked_by} of {r.asker}) from {r.path} ({version}, through {r.through}: {why})"

    text = "; ".join(one(r) for r in bad[:3]) + (f"; and {len(bad) - 3} more" if len(bad) > 3 else "")
    evidence = {
        **evidence,
        "sublibraries": [
            {"soname": r.soname, "asker": r.asker, "asked_by": r.asked_by, "path": r.path, "through": r.through}
            for r in bad
        ],
        "missing_from_torch": missing,
    }
    if missing:
        fix = manual(
            f"Keep the other cuDNN out of the loader's reach for this job, or give torch a cuDNN wheel that has "
            f"{', '.join(missing[:3])}",
            "ldconfig -p | grep libcudnn",
            f"ls {bundle_dir}",
        )
    else:
        current = [d for d in probe_env(facts).get("LD_LIBRARY_PATH", "").split(":") if d]
        keep = [d for d in current if not any(r.through == f"LD_LIBRARY_PATH entry {os.path.normpath(d)}" for r in bad)]
        fix = set_env(
            "LD_LIBRARY_PATH",
            ":".join([bundle_dir, *keep]),
            title=f"Put torch's cuDNN folder first on LD_LIBRARY_PATH ({bundle_dir})",
        )
    return warn(
        f"{using}, but the loader would take cuDNN sub-libraries from another installation when they are first "
        f"loaded: {text}. Two cuDNN versions in one process fail at the first convolution "
        "(CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH, 'version libcudnn_ops_infer.so.8 not defined', "
        "pytorch/pytorch#104591, #188892)",
        fix,
        **evidence,
    )


def _cudnn8_cache_finding(facts, using: str, bundle_dir: str, same_sys: list[dict], evidence: dict) -> Outcome | None:
    """Without the probed ELF facts (older snapshots): cuDNN 8's sub-libraries carry no RUNPATH (NVIDIA's archives
    and the pip wheels alike; spack/spack-packages#3399 adds $ORIGIN for that reason), so their NEEDED siblings
    come from the ld.so cache: a system cuDNN 8 of another version there mixes with torch's (pytorch#104591)."""
    torch_v = versions.cudnn_from_int(facts.torch.get("cudnn"))
    other = []
    for e in same_sys:
        have = file_version(e.get("realpath") or e["path"])
        if have is not None and torch_v is not None and have[:3] != tuple(torch_v)[: len(have[:3])]:
            other.append((e, have))
    if not other:
        return None
    entry, have = other[0]
    current = [d for d in probe_env(facts).get("LD_LIBRARY_PATH", "").split(":") if d]
    return warn(
        f"{using}, but the ld.so cache also holds cuDNN {versions.fmt(have)} ({entry['path']}): cuDNN 8's "
        "sub-libraries (libcudnn_cnn_infer.so.8, ...) carry no RUNPATH, so the ones they load by name "
        "(libcudnn_ops_infer.so.8) come from the cache when first needed and two versions mix at the first "
        "convolution ('version libcudnn_ops_infer.so.8 not defined', pytorch/pytorch#104591)",
        set_env(
            "LD_LIBRARY_PATH",
            ":".join([bundle_dir, *[d for d in current if os.path.normpath(d) != bundle_dir]]),
            title=f"Put torch's cuDNN folder first on LD_LIBRARY_PATH ({bundle_dir})",
        ),
        other_copies=[e["path"] for e, _ in other],
        **evidence,
    )


@check(
    id="GD-CUDA-005",
    name="cudnn-shadowed",
    category="cuda",
    title="torch loads the cuDNN it was built with",
    needs=["torch", "libraries", "env"],
    requires=["torch"],
    what="Compares the cuDNN torch reports and the libcudnn files its process mapped (/proc/self/maps of the "
    "target interpreter after torch.backends.cudnn.version()) with the cuDNN copies on LD_LIBRARY_PATH and in "
    "the system library cache; a mapped file from outside torch's own folders that LD_LIBRARY_PATH, LD_PRELOAD "
    "or the ld.so cache handed the process is compared with the cuDNN major.minor torch was compiled with. "
    "Then the sub-libraries cuDNN loads only at first use (cuDNN 8's libcudnn_ops_infer/cnn_infer/adv_*.so.8, "
    "cuDNN 9's libcudnn_graph/engines_*/ops/cnn/adv.so.9) are followed the way the loader would find them when "
    "torch's own cuDNN files ask for them (dlopen by libcudnn.so.N or libcudnn_graph.so.9, or their NEEDED "
    "entries): DT_RPATH of the asking file when it has no DT_RUNPATH, LD_LIBRARY_PATH, the asking file's own "
    "DT_RUNPATH (not inherited), the ld.so cache (ld.so(8), dlopen(3); confirmed with LD_DEBUG=libs on built "
    "libraries). The probe reads RPATH/RUNPATH/NEEDED from the files' ELF dynamic sections and the cache from "
    "`ldconfig -p`.",
    why="The dynamic loader searches LD_LIBRARY_PATH before the folders torch's libraries point at, so "
    "a cuDNN of the same major version there (e.g. after `export LD_LIBRARY_PATH=$CUDA_HOME/lib64:...`) "
    "can replace or mix with the one torch ships: 'cuDNN version incompatibility: PyTorch was compiled "
    "against ... but found runtime version ...' or CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH at the first "
    "convolution. A cuDNN of another major version cannot replace torch's (the file name carries the "
    "major version), so it concerns only other libraries in the process. torch accepts a runtime cuDNN of "
    "its compile-time major version and at least its minor version (torch/backends/cudnn/__init__.py, "
    "'cuDNN version incompatibility'): an older one is refused, a newer one is a build torch was not tested "
    "with. Sub-libraries are loaded by name at first use, so a system cuDNN of another version in the ld.so "
    "cache (registered by the CUDA/cuDNN packages) is taken wherever the asking file does not find torch's own "
    "copy first: cuDNN 8's helper libraries carry no RUNPATH, so their NEEDED siblings come from the cache "
    "('version libcudnn_ops_infer.so.8 not defined in file libcudnn_ops_infer.so.8', pytorch/pytorch#104591), "
    "and a sub-library torch's wheel lacks comes from a newer system cuDNN 9 (libcudnn_engines_tensor_ir, "
    "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH, pytorch/pytorch#188892). Where torch's files find their own folder "
    "first (RUNPATH $ORIGIN, as the cuDNN 9 wheels have) the system copy is only a note.",
    fix="Remove the folder holding the other cuDNN from LD_LIBRARY_PATH (pip and conda torch builds "
    "bring their own cuDNN), or install the cuDNN version torch was built against. For sub-libraries the cache "
    "would hand out, put torch's cuDNN folder first on LD_LIBRARY_PATH; for one torch's wheel lacks, keep the "
    "other cuDNN out of the loader's reach for the job or use a cuDNN wheel that has it.",
)
def cudnn_shadowed(facts, ctx):
    skipped = _not_a_cuda_build(facts)
    if skipped:
        return skipped
    t = facts.torch
    if t.get("cudnn") is None and not t.get("cudnn_error"):
        return skip("torch reports no cuDNN (built without it, or cuDNN unavailable)")
    loaded = ((t.get("loaded_libraries") or {}).get("cudnn")) or []
    major = _cudnn_major(t)
    ld_entries = [
        e
        for e in (facts.libraries.get("found") or {}).get("cudnn", [])
        if e.get("source") == "LD_LIBRARY_PATH" and (major is None or _entry_major(e) in (None, major))
    ]
    evidence = {
        "torch_cudnn": versions.fmt(versions.cudnn_from_int(t.get("cudnn"))),
        "cudnn_compile": t.get("cudnn_compile"),
        "loaded": loaded,
        "ld_library_path": probe_env(facts).get("LD_LIBRARY_PATH"),
    }
    error = t.get("cudnn_error")
    if error:
        fix = _ld_path_without(facts, _ld_dirs_of(ld_entries)) if ld_entries else None
        where = f" (cuDNN on LD_LIBRARY_PATH: {', '.join(e['path'] for e in ld_entries)})" if ld_entries else ""
        return fail(f"torch cannot use the cuDNN it loaded: {error}{where}", fix, cudnn_error=error, **evidence)
    problem = _library_shadowing(facts, "cudnn", "cuDNN", major, loaded)
    if problem:
        return problem
    loaded_dirs = {os.path.dirname(os.path.normpath(p)) for p in loaded}
    if not loaded_dirs:
        return passed(f"torch uses cuDNN {evidence['torch_cudnn']} (which file it mapped is unknown)", **evidence)
    same_ld, other_ld = _other_copies(facts, "cudnn", major, loaded_dirs, ("LD_LIBRARY_PATH",))
    using = f"torch uses cuDNN {evidence['torch_cudnn']} from {', '.join(sorted(loaded_dirs))}"
    if same_ld:
        paths = [e["path"] for e in same_ld]
        return warn(
            f"{using}, but LD_LIBRARY_PATH also holds cuDNN {major} ({', '.join(paths)}): it is searched first for "
            "the cuDNN sub-libraries loaded on first use, so the two installations can mix "
            "(CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH or a version-incompatibility error at the first convolution)",
            _ld_path_without(facts, _ld_dirs_of(same_ld)),
            other_copies=paths,
            **evidence,
        )
    shim_dirs = sorted({os.path.dirname(os.path.normpath(p)) for p in loaded if "libcudnn.so" in os.path.basename(p)})
    if shim_dirs and major is not None:
        torch_v = versions.cudnn_from_int(t.get("cudnn"))
        sub = _sublibrary_finding(facts, using, shim_dirs[0], major, torch_v, evidence)
        if sub:
            return sub
    same_sys, _ = _other_copies(facts, "cudnn", major, loaded_dirs, ("ldconfig",))
    judged = bool(shim_dirs) and major is not None and cudnn_sublibrary_resolutions(facts, shim_dirs[0], major)
    if same_sys and not judged and major == 8 and shim_dirs:
        cudnn8 = _cudnn8_cache_finding(facts, using, shim_dirs[0], same_sys, evidence)
        if cudnn8:
            return cudnn8
    if same_sys:
        paths = [e["path"] for e in same_sys]
        how = (
            "the loader finds every sub-library torch's cuDNN asks for in torch's own folder first (their RUNPATH or "
            "RPATH), so it is not used"
            if judged
            else "a sub-library torch's copy lacks would be taken from there"
        )
        return info(
            f"{using}; a system cuDNN {major} is also installed ({', '.join(paths)}): {how}",
            other_copies=paths,
            **evidence,
        )
    if other_ld:
        paths = [e["path"] for e in other_ld]
        return info(
            f"{using}; LD_LIBRARY_PATH also holds another cuDNN major version "
            f"({', '.join(paths)}), which cannot replace torch's (the file name carries "
            "the major version) but will be what other libraries in the process load",
            other_copies=paths,
            **evidence,
        )
    return passed(using, **evidence)


# ---------------------------------------------------------------- GD-CUDA-006

CUDA_FAMILIES = {"cudart": "the CUDA runtime (libcudart)", "cublas": "cuBLAS", "nvjitlink": "nvJitLink"}


@check(
    id="GD-CUDA-006",
    name="cuda-runtime-libraries-shadowed",
    category="cuda",
    title="torch loads its own CUDA runtime and cuBLAS",
    needs=["torch", "libraries", "env"],
    requires=["torch"],
    what="Looks at the libcudart, libcublas/libcublasLt and libnvJitLink files torch's process mapped, "
    "and at the copies on LD_LIBRARY_PATH, against the ones NVIDIA's pip wheels installed for torch. From "
    "CUDA 12 their file versions carry the toolkit's major.minor (libcublas.so.12.4.5.8 is CUDA 12.4's), so a "
    "mapped file that LD_LIBRARY_PATH, LD_PRELOAD or the ld.so cache supplied is compared with "
    "torch.version.cuda.",
    why="A CUDA toolkit folder on LD_LIBRARY_PATH is searched before the wheel folders, so a library "
    "of the same major version there can be loaded instead of the wheel's: typical symptoms are "
    "'undefined symbol: __nvJitLinkComplete_12_4' or cublasLt errors: an older cuBLAS than torch's fails at "
    "import with 'undefined symbol: cublasLt...' (pytorch/pytorch#91067, #103832), and a system libcublasLt "
    "beside the wheel's libcublas gives CUBLAS_STATUS_INVALID_VALUE (pytorch/pytorch#174320). Copies of another "
    "major version cannot replace torch's (the file name carries the major version).",
    fix="Remove the CUDA toolkit's lib64 folder from LD_LIBRARY_PATH for training jobs: pip and conda "
    "torch builds bring their own CUDA libraries.",
)
def cuda_runtime_libraries_shadowed(facts, ctx):
    skipped = _not_a_cuda_build(facts)
    if skipped:
        return skipped
    t = facts.torch
    major = versions.parse(t["cuda"])[0]
    loaded_all = t.get("loaded_libraries") or {}
    notes, evidence = [], {"torch_cuda": t["cuda"], "ld_library_path": probe_env(facts).get("LD_LIBRARY_PATH")}
    for family, label in CUDA_FAMILIES.items():
        loaded = loaded_all.get(family) or []
        problem = _library_shadowing(facts, family, label, major, loaded)
        if problem:
            return problem
        loaded_dirs = {os.path.dirname(os.path.normpath(p)) for p in loaded}
        same, other = _other_copies(facts, family, major, loaded_dirs, ("LD_LIBRARY_PATH",))
        if same and loaded_dirs:
            notes.append(
                f"{label} {major} also on LD_LIBRARY_PATH ({', '.join(e['path'] for e in same)}); torch loaded its own"
            )
        if other:
            notes.append(
                f"{label} of another major version on LD_LIBRARY_PATH "
                f"({', '.join(e['path'] for e in other)}) cannot replace torch's"
            )
        evidence[family] = loaded
    if notes:
        # torch's own copies are in use; the others matter to libraries loaded later by bare name
        return info("; ".join(notes), **evidence)
    return passed(f"torch uses its own CUDA {t['cuda']} libraries", **evidence)


# ---------------------------------------------------------------- GD-CUDA-007


@check(
    id="GD-CUDA-007",
    name="nvcc-torch-cuda-mismatch",
    category="cuda",
    title="CUDA toolkit (nvcc) matches torch's CUDA for building extensions",
    needs=["torch", "libraries"],
    requires=["torch"],
    what="Compares the CUDA toolkit torch.utils.cpp_extension would use (CUDA_HOME or CUDA_PATH, else "
    "nvcc on PATH, else /usr/local/cuda) with the CUDA version torch was built with.",
    why="Extensions compiled at install or run time (DeepSpeed ops, flash-attn or apex from source, "
    "cpp_extension.load) need nvcc: cpp_extension refuses a toolkit whose CUDA major version differs "
    "from torch's ('The detected CUDA version ... mismatches the version that was used to compile "
    "PyTorch') and only warns on a minor difference. Jobs that build nothing do not need nvcc.",
    fix="Point CUDA_HOME at a toolkit of torch's CUDA major version (e.g. /usr/local/cuda-12.4 for a "
    "cu124 torch), or install the torch build that matches the toolkit.",
)
def nvcc_torch_cuda_mismatch(facts, ctx):
    skipped = _not_a_cuda_build(facts)
    if skipped:
        return skipped
    t = facts.torch
    tk = facts.libraries.get("toolkit") or {}
    torch_cuda = versions.parse(t["cuda"])[:2]
    evidence = {
        "torch_cuda": t["cuda"],
        "cuda_home": tk.get("cuda_home"),
        "found_via": tk.get("found_via"),
        "nvcc": tk.get("nvcc"),
        "nvcc_cuda": tk.get("version"),
    }
    if tk.get("cuda_home") and tk.get("found_via") in ("CUDA_HOME", "CUDA_PATH") and not tk.get("nvcc"):
        return warn(
            f"{tk['found_via']}={tk['cuda_home']} has no bin/nvcc: building CUDA extensions fails ('nvcc not found')",
            manual(f"Point {tk['found_via']} at a CUDA {torch_cuda[0]}.x toolkit, or unset it"),
            **evidence,
        )
    if not tk.get("nvcc"):
        return info(
            "no CUDA toolkit (nvcc): fine unless the job compiles CUDA extensions (DeepSpeed ops JIT, flash-attn or "
            f"apex from source); those would need a CUDA {torch_cuda[0]}.x toolkit",
            **evidence,
        )
    nvcc_cuda = versions.parse(tk.get("version"))
    if not nvcc_cuda:
        return skip(f"could not read the version of {tk['nvcc']}", **evidence)
    nvcc_cuda = nvcc_cuda[:2]
    if nvcc_cuda[0] != torch_cuda[0]:
        return warn(
            f"nvcc at {tk['nvcc']} is CUDA {versions.fmt(nvcc_cuda)} but torch is built for "
            f"CUDA {versions.fmt(torch_cuda)}: "
            "building CUDA extensions fails (cpp_extension raises 'The detected CUDA version mismatches the version "
            "that was used to compile PyTorch')",
            manual(
                f"Point CUDA_HOME at a CUDA {torch_cuda[0]}.x toolkit for extension builds",
                f"export CUDA_HOME=/usr/local/cuda-{versions.fmt(torch_cuda)}",
            ),
            **evidence,
        )
    if nvcc_cuda != torch_cuda:
        return info(
            f"nvcc is CUDA {versions.fmt(nvcc_cuda)}, torch is built for {versions.fmt(torch_cuda)}: same major "
            "version, so extensions build (cpp_extension only warns about the minor difference)",
            **evidence,
        )
    return passed(f"nvcc at {tk['nvcc']} is CUDA {versions.fmt(nvcc_cuda)}, as torch", **evidence)


# ---------------------------------------------------------------- GD-CUDA-008 (issue 13)

_NCCL_FILE_VERSION = re.compile(r"libnccl\.so\.(\d+\.\d+\.\d+)")


def _nccl_file_version(path: str, facts) -> tuple[int, ...] | None:
    """The x.y.z in a libnccl file's name, directly or through the found copy it is the target of."""
    m = _NCCL_FILE_VERSION.search(os.path.basename(path))
    if m:
        return versions.parse(m.group(1))
    for e in (facts.libraries.get("found") or {}).get("nccl") or []:
        if os.path.normpath(e.get("path", "")) == os.path.normpath(path) or e.get("realpath") == path:
            m = _NCCL_FILE_VERSION.search(os.path.basename(e.get("realpath") or e["path"]))
            if m:
                return versions.parse(m.group(1))
    return None


@check(
    id="GD-CUDA-008",
    name="nccl-library-shadowed",
    category="cuda",
    title="torch loads an NCCL at least as new as the one it was built with",
    needs=["torch", "libraries", "env"],
    requires=["torch"],
    what="Compares the NCCL version torch was built with (torch.cuda.nccl.version(), from nccl.h at build time) "
    "with the libnccl file torch's process mapped, and with libnccl copies on LD_LIBRARY_PATH, which the loader "
    "searches before the RUNPATH that points torch at the nvidia-nccl wheel.",
    why="A libnccl.so.2 on LD_LIBRARY_PATH (a CUDA or HPC-SDK module, a container's /usr/local/nccl) replaces the "
    "one torch ships, whatever its minor version: an older one fails with 'undefined symbol: ncclCommSplit' or "
    "similar, or lacks fixes torch relies on. torch.cuda.nccl.version() is the nccl.h torch was compiled "
    "with (torch/csrc/cuda/nccl.cpp, NCCL_MAJOR/MINOR/PATCH), not the library the loader picked.",
    fix="Remove the folder holding the other libnccl from LD_LIBRARY_PATH (pip and conda torch bring their own), "
    "or install an NCCL at least as new as torch's.",
)
def nccl_library_shadowed(facts, ctx):
    skipped = _not_a_cuda_build(facts)
    if skipped:
        return skipped
    t = facts.torch
    built = tuple(v for v in (t.get("nccl") or ())[:3] if isinstance(v, int)) or None  # a 4th item is a suffix
    if not built or len(built) < 2:
        return skip(f"torch {t.get('version')} reports no NCCL version (built without NCCL?)")
    loaded = ((t.get("loaded_libraries") or {}).get("nccl")) or []
    bundled = _bundled_dirs(facts)
    wheel = _wheel_copies(facts, "nccl")
    ld_copies = [
        e
        for e in (facts.libraries.get("found") or {}).get("nccl") or []
        if e.get("source") == "LD_LIBRARY_PATH" and _entry_major(e) == 2 and _entry_dir(e) not in bundled
    ]
    evidence = {
        "torch_nccl": versions.fmt(built),
        "loaded": loaded,
        "ld_library_path": probe_env(facts).get("LD_LIBRARY_PATH"),
        "ld_library_path_copies": [e["path"] for e in ld_copies],
        "wheel_copies": wheel,
    }
    foreign = [p for p in loaded if os.path.dirname(os.path.normpath(p)) not in bundled]
    if loaded and not foreign:
        return passed(f"torch uses its own NCCL {versions.fmt(built)} ({', '.join(loaded)})", **evidence)
    # Without a mapped file (NCCL loads lazily in some builds) the first LD_LIBRARY_PATH copy is the loader's pick.
    candidates = foreign or ([ld_copies[0]["path"]] if ld_copies and wheel else [])
    if not candidates:
        return passed(
            f"torch is built with NCCL {versions.fmt(built)}; no other libnccl.so.2 on LD_LIBRARY_PATH", **evidence
        )
    path = candidates[0]
    have = _nccl_file_version(path, facts)
    evidence["other_nccl"] = path
    evidence["other_nccl_version"] = versions.fmt(have) if have else None
    dirs = {
        os.path.dirname(os.path.normpath(e["path"]))
        for e in ld_copies
        if e["path"] == path or _entry_dir(e) == os.path.dirname(path)
    }
    fix = (
        _ld_path_without(facts, dirs)
        if dirs
        else manual("Make torch load its own libnccl (check LD_LIBRARY_PATH and LD_PRELOAD)")
    )
    verb = "loaded" if foreign else "will load"
    if have and have[:3] < built[:3]:
        return warn(
            f"torch {verb} NCCL {versions.fmt(have)} from {path}, "
            f"older than the {versions.fmt(built)} it was built with: "
            "missing symbols or fixes torch expects ('undefined symbol: nccl...' or hangs fixed since)",
            fix,
            **evidence,
        )
    if have:
        return passed(
            f"torch {verb} NCCL {versions.fmt(have)} from {path} (built with {versions.fmt(built)}): not older",
            **evidence,
        )
    if wheel:
        return warn(
            f"torch {verb} a libnccl from {path} instead of the copy its wheel installed ({', '.join(wheel)}); "
            "its version "
            f"is unknown (torch was built with {versions.fmt(built)})",
            fix,
            **evidence,
        )
    return passed(
        f"torch uses the NCCL at {path} (built with {versions.fmt(built)}; no wheel copy to compare)", **evidence
    )


# ---------------------------------------------------------------- GD-CUDA-009

KINETO_DAEMON_VAR = "KINETO_USE_DAEMON"


@check(
    id="GD-CUDA-009",
    name="kineto-daemon-initialises-cuda-at-import",
    category="cuda",
    title="`import torch` leaves CUDA to be initialised by the program (no KINETO_USE_DAEMON)",
    needs=["env"],
    scope="job",
    what="Reads KINETO_USE_DAEMON in the job's environment. Set at all counts, whatever its value (0 and empty "
    "included): kineto tests only that the variable exists (pytorch/kineto libkineto isDaemonEnvVarSet: "
    "getenv(...) != nullptr; pytorch/pytorch#112389: 'just looking for env to be set, not really reading its "
    "value').",
    why="With the variable set, torch initialises its profiler library when it loads instead of on the first "
    "profiler call, so that the Dynolog daemon can trace the process on demand (pytorch/pytorch#120276), and "
    "kineto then initialises its profilers at once ('For open source users that would like to connect to a "
    "profiling daemon we should always initialize the profiler at this point', libkineto/src/init.cpp): CUPTI and "
    "the CUDA driver in every process that imports torch. A process whose CUDA driver was initialised cannot "
    'fork children that use CUDA: `torch.multiprocessing.start_processes(..., start_method="fork")` ranks and '
    "DataLoader workers started by fork (Linux's default) that touch CUDA fail with 'CUDA error: initialization "
    "error' or 'Cannot re-initialize CUDA in forked subprocess'; torch has also been seen failing at start with "
    "it set (pytorch/pytorch#125705, facebookincubator/dynolog#271).",
    fix="Unset KINETO_USE_DAEMON unless the job is meant to be traced by Dynolog; then start subprocesses with "
    "the 'spawn' method (`torch.multiprocessing.spawn`, `DataLoader(multiprocessing_context=\"spawn\")`).",
)
def kineto_daemon_initialises_cuda(facts, ctx):
    env = job_env(facts, ctx)
    value = env.get(KINETO_DAEMON_VAR)
    if value is None:
        return passed(
            "KINETO_USE_DAEMON is not set: the profiler library is initialised on first use, not at `import torch`"
        )
    source = env.source(KINETO_DAEMON_VAR)
    return warn(
        f"KINETO_USE_DAEMON={value!r} (from {source}): torch initialises its profiler library with CUPTI and the "
        "CUDA driver at `import torch` (set is enough: 0 and an empty value count too), so children the job forks that "
        "use CUDA (mp.start_processes with start_method='fork', fork-started DataLoader workers touching the GPU) "
        "fail with 'CUDA error: initialization error'; it is meant only for on-demand tracing by Dynolog",
        unset_env(KINETO_DAEMON_VAR),
        KINETO_USE_DAEMON=value,
        source=source,
    )
