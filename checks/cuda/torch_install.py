"""cuda checks of the torch install: can torch be imported, and is it a CUDA build."""

from __future__ import annotations

from gpudoctor import shellquote, versions
from gpudoctor.job.env import probe_env
from gpudoctor.job.gpus import nvml_gpus
from gpudoctor.model import Outcome, fail, info, manual, passed, skip, warn
from gpudoctor.registry import check

# CUDA versions PyTorch publishes wheels for (download.pytorch.org/whl/cuXY); which ones exist
# depends on the torch release, so a fix names the newest one the driver can run and says so.
WHEEL_CUDA = [(13, 0), (12, 9), (12, 8), (12, 6), (12, 4), (12, 1), (11, 8)]


def _wheel_index(driver_cuda: tuple[int, int] | None) -> str:
    """The newest CUDA wheel index the driver can run (an example, cu126, when the driver is unknown)."""
    cuda = next((c for c in WHEEL_CUDA if c <= driver_cuda), WHEEL_CUDA[-1]) if driver_cuda else (12, 6)
    return f"https://download.pytorch.org/whl/cu{cuda[0]}{cuda[1]}"


def _base_version(version: str | None) -> str | None:
    v = versions.parse(version)
    return versions.fmt(v) if v else None


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
