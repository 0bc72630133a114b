"""cuda checks of CUDA at run time: does it initialise, are there kernels for these GPUs, does the
toolkit (nvcc) match, does the profiler daemon initialise CUDA early."""

from __future__ import annotations

import re

from gpudoctor import versions
from gpudoctor.checks.cuda._loading import cuda_version
from gpudoctor.job.env import job_env, probe_env
from gpudoctor.job.gpus import describe_groups, gpu_capabilities, nvml_gpus
from gpudoctor.model import fail, info, manual, passed, skip, unset_env, warn
from gpudoctor.readers import cudavis
from gpudoctor.registry import check

_ARCH = re.compile(r"^(sm|compute)_(\d+)([af]?)$")


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
    requires=["torch", "cuda-build"],
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
    requires=["torch", "cuda-build"],
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


@check(
    id="GD-CUDA-007",
    name="nvcc-torch-cuda-mismatch",
    category="cuda",
    title="CUDA toolkit (nvcc) matches torch's CUDA for building extensions",
    needs=["torch", "libraries"],
    requires=["torch", "cuda-build"],
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
    t = facts.torch
    tk = facts.libraries.get("toolkit") or {}
    torch_cuda = cuda_version(facts)[:2]
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
