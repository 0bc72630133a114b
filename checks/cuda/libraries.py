"""cuda checks of the CUDA runtime libraries and NCCL: does torch load the copies it was built with."""

from __future__ import annotations

import os
import re

from gpudoctor import versions
from gpudoctor.checks.cuda._loading import (
    bundled_dirs,
    cuda_version,
    entry_dir,
    entry_major,
    ld_path_without,
    library_shadowing,
    other_copies,
    wheel_copies,
)
from gpudoctor.job.env import probe_env
from gpudoctor.model import info, manual, passed, skip, warn
from gpudoctor.registry import check

CUDA_FAMILIES = {"cudart": "the CUDA runtime (libcudart)", "cublas": "cuBLAS", "nvjitlink": "nvJitLink"}


@check(
    id="GD-CUDA-006",
    name="cuda-runtime-libraries-shadowed",
    category="cuda",
    title="torch loads its own CUDA runtime and cuBLAS",
    needs=["torch", "libraries", "env"],
    requires=["torch", "cuda-build"],
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
    t = facts.torch
    major = cuda_version(facts)[0]
    loaded_all = t.get("loaded_libraries") or {}
    notes, evidence = [], {"torch_cuda": t["cuda"], "ld_library_path": probe_env(facts).get("LD_LIBRARY_PATH")}
    for family, label in CUDA_FAMILIES.items():
        loaded = loaded_all.get(family) or []
        problem = library_shadowing(facts, family, label, major, loaded)
        if problem:
            return problem
        loaded_dirs = {os.path.dirname(os.path.normpath(p)) for p in loaded}
        same, other = other_copies(facts, family, major, loaded_dirs, ("LD_LIBRARY_PATH",))
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
    requires=["torch", "cuda-build"],
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
    t = facts.torch
    built = tuple(v for v in (t.get("nccl") or ())[:3] if isinstance(v, int)) or None  # a 4th item is a suffix
    if not built or len(built) < 2:
        return skip(f"torch {t.get('version')} reports no NCCL version (built without NCCL?)")
    loaded = ((t.get("loaded_libraries") or {}).get("nccl")) or []
    bundled = bundled_dirs(facts)
    wheel = wheel_copies(facts, "nccl")
    ld_copies = [
        e
        for e in (facts.libraries.get("found") or {}).get("nccl") or []
        if e.get("source") == "LD_LIBRARY_PATH" and entry_major(e) == 2 and entry_dir(e) not in bundled
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
        if e["path"] == path or entry_dir(e) == os.path.dirname(path)
    }
    fix = (
        ld_path_without(facts, dirs)
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
