"""Runs inside the *target* interpreter (--python) to describe its torch.

Standalone on purpose: it imports nothing from gpudoctor, so it works in any
environment that has a Python 3. Prints one JSON object, on a line starting with
RESULT_MARKER, on stdout; before each step that can hang it writes a STAGE_MARKER
line to stderr, so the parent can say which step a timeout interrupted.
Every step after the import is guarded: a half-broken torch still yields a result.
"""

import glob
import json
import os
import sys
import time
import warnings

RESULT_MARKER = "GPUDOCTOR-TORCH-FACTS "
STAGE_MARKER = "GPUDOCTOR-STAGE "

# Running as a script puts this file's folder first on sys.path; drop it so that
# nothing beside this file can shadow the user's packages.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

LIBRARY_FAMILIES = {
    "cudnn": "libcudnn",
    "nccl": "libnccl",
    "cudart": "libcudart",
    "cublas": "libcublas",  # libcublas and libcublasLt
    "nvjitlink": "libnvJitLink",
    "cuda": "libcuda.so",
}


def _stage(name):
    sys.stderr.write(STAGE_MARKER + name + "\n")
    sys.stderr.flush()


def _loaded_libraries(maps="/proc/self/maps"):
    """Shared libraries a process has mapped (Linux; this one by default), by family. The kernel names each
    mapping by the file the loader opened, symlinks resolved (libcudnn.so.9.1.0, not libcudnn.so.9), so these
    are the files the process runs, wherever LD_LIBRARY_PATH, the ld.so cache or a RUNPATH found them."""
    found = {k: [] for k in LIBRARY_FAMILIES}  # type: dict[str, list[str]]
    try:
        with open(maps) as fh:
            for line in fh:
                parts = line.split()
                if len(parts) < 6:
                    continue
                path = parts[5]
                base = path.rsplit("/", 1)[-1]
                for fam, prefix in LIBRARY_FAMILIES.items():
                    if base.startswith(prefix) and path not in found[fam]:
                        if fam == "cudnn" and not (base.startswith("libcudnn.so") or base.startswith("libcudnn_")):
                            continue
                        found[fam].append(path)
    except OSError:
        return None
    return found


def _wheel_lib_dirs():
    """NVIDIA's pip-wheel library folders (nvidia/<lib>/lib, nvidia/cu13/lib) on *this* interpreter's path."""
    dirs = []
    for p in sys.path:
        for d in sorted(glob.glob(os.path.join(p or os.curdir, "nvidia", "*", "lib"))):
            real = os.path.realpath(d)
            if real not in dirs:
                dirs.append(real)
    return dirs


def _error(e):
    return type(e).__name__ + ": " + str(e)  # no f-string: this runs under the target's Python 3, whatever its version


def _import_torch(out, forked=False):
    """Imports torch; on failure fills status/error and returns None. forked: torch was imported before the fork,
    so the import is not timed (it would say 0 s)."""
    _stage("import")
    t0 = time.monotonic()
    try:
        import torch
    except BaseException as e:  # ImportError, OSError from a missing .so, SystemExit...
        missing = isinstance(e, ModuleNotFoundError) and e.name == "torch"
        out["status"] = "missing" if missing else "import_error"
        out["error"] = _error(e)
        return None
    if not forked:
        out["import_seconds"] = round(time.monotonic() - t0, 3)
    out["location"] = getattr(torch, "__file__", None)
    if not hasattr(torch, "__version__"):
        # e.g. an empty torch/ folder left behind by an interrupted uninstall: imports as a namespace package
        out["status"] = "import_error"
        paths = list(getattr(torch, "__path__", []))
        out["error"] = "torch at %s is not a complete installation (no torch.__version__)" % (paths or "?")
        return None
    return torch


def _build_facts(torch, out):
    out["version"] = str(torch.__version__)
    version = getattr(torch, "version", None)
    out["cuda"] = getattr(version, "cuda", None)
    out["hip"] = getattr(version, "hip", None)
    out["debug"] = bool(getattr(version, "debug", False))
    try:
        out["arch_list"] = list(torch.cuda.get_arch_list())
    except Exception as e:
        out["arch_list"] = []
        out["arch_list_error"] = _error(e)


def nvml_style_uuid(raw, visible=None):
    """torch's device UUID ('8-4-4-4-12' hex, no prefix) as NVML, nvidia-smi and CUDA_VISIBLE_DEVICES
    write it: 'GPU-<uuid>', or 'MIG-<uuid>' when the process was given a MIG device (CUDA then shows
    it exactly one, and its UUID is the MIG device's)."""
    text = str(raw) if raw is not None else ""
    if not text:
        return None
    if text.startswith(("GPU-", "MIG-")):
        return text
    mig = any(e.strip().startswith("MIG-") for e in (visible or "").split(","))
    return ("MIG-" if mig else "GPU-") + text


def _cuda_facts(torch, out):
    _stage("cuda_init")
    out["cuda_available"] = False
    out["device_count"] = 0
    try:
        # torch reports why CUDA failed to initialise as a warning, not an exception
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out["cuda_available"] = bool(torch.cuda.is_available())
        messages = [str(w.message) for w in caught if "CUDA" in str(w.message) or "cuda" in str(w.message)]
        if messages:
            out["cuda_warnings"] = messages[:5]
        if out["cuda_available"]:
            out["device_count"] = torch.cuda.device_count()
        elif messages:
            out["cuda_error"] = messages[0]
    except Exception as e:
        out["cuda_error"] = _error(e)
    _stage("devices")
    devices = []
    for i in range(out["device_count"]):
        try:
            p = torch.cuda.get_device_properties(i)
            devices.append(
                {
                    "index": i,
                    "name": p.name,
                    "capability": [p.major, p.minor],
                    "memory_total_bytes": p.total_memory,
                    "uuid": nvml_style_uuid(getattr(p, "uuid", None), os.environ.get("CUDA_VISIBLE_DEVICES")),
                }
            )
        except Exception as e:
            devices.append({"index": i, "error": str(e)})
    out["devices"] = devices


def _cudnn_facts(torch, out):
    _stage("cudnn")
    out["cudnn"] = None
    try:
        cudnn_c = getattr(torch._C, "_cudnn", None)
        if cudnn_c is not None and hasattr(cudnn_c, "getCompileVersion"):
            out["cudnn_compile"] = list(cudnn_c.getCompileVersion())
    except Exception:
        pass
    try:
        # version() checks the loaded cuDNN against the one torch was built with and raises on a mismatch
        out["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception as e:
        out["cudnn_error"] = _error(e)


def _distributed_facts(torch, out):
    _stage("distributed")
    try:
        out["nccl"] = list(torch.cuda.nccl.version()) if out.get("cuda") else None
    except Exception:
        out["nccl"] = None
    try:
        import torch.distributed as dist

        out["distributed_available"] = dist.is_available()
        out["nccl_available"] = bool(dist.is_available() and dist.is_nccl_available())
        out["gloo_available"] = bool(dist.is_available() and dist.is_gloo_available())
    except Exception:
        out["distributed_available"] = False


def _precision_facts(torch, out):
    _stage("precision")
    bf16 = None
    if out.get("cuda_available"):
        try:
            bf16 = bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except TypeError:  # older torch: no emulation argument (and it counts emulation)
            bf16 = all(d.get("capability", [0])[0] >= 8 for d in out.get("devices", []))
        except Exception:
            bf16 = None
    out["bf16_supported"] = bf16
    # Defaults of a fresh process: what a script gets unless it changes them
    # (TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 turns the first to "high").
    try:
        out["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    except Exception:
        out["float32_matmul_precision"] = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # allow_tf32 is deprecated in newer torch
            out["cudnn_allow_tf32"] = bool(torch.backends.cudnn.allow_tf32)
    except Exception:
        out["cudnn_allow_tf32"] = None


def main(forked=False):
    """forked: run in a fork of a gpudoctor process that has imported torch (torch_probe.TorchProbe)."""
    # type comments, not annotations: this file runs under the target's Python, however old
    out = {"status": "ok", "python": sys.executable, "python_version": sys.version.split()[0]}  # type: dict
    t0 = time.monotonic()
    torch = _import_torch(out, forked)
    if torch is not None:
        for step in (_build_facts, _cuda_facts, _cudnn_facts, _distributed_facts, _precision_facts):
            try:
                step(torch, out)
            except Exception as e:  # a half-broken torch: record it, keep going
                out.setdefault("probe_errors", []).append(step.__name__.strip("_") + ": " + _error(e))
    _stage("libraries")
    # Read after the steps above: importing torch maps libcublas/libcublasLt (libtorch_cuda.so needs them) and
    # torch.backends.cudnn.version() loads libcudnn; cuDNN's engine sub-libraries load only at a first GPU
    # convolution, which a probe does not run (no CUDA context is created here).
    out["loaded_libraries"] = _loaded_libraries()
    out["wheel_lib_dirs"] = _wheel_lib_dirs()
    out["elapsed_seconds"] = round(time.monotonic() - t0, 3)
    _stage("done")
    _write_result("\n" + RESULT_MARKER + json.dumps(out) + "\n")


def _write_result(text):
    """To file descriptor 1 itself: an import may have replaced or closed sys.stdout."""
    try:
        sys.stdout.flush()  # what the import printed comes first
    except Exception:
        pass
    data = text.encode("utf-8")
    while data:
        data = data[os.write(1, data) :]


if __name__ == "__main__":
    main()
    sys.stderr.flush()
    # Skip interpreter teardown: unloading torch takes about as long as a third of importing it,
    # and everything this process had to say is written.
    os._exit(0)
