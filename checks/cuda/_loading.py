"""Where the CUDA libraries torch loads come from: the wheels' folders, the dynamic loader's search
order, the version a file carries. Shared by the library checks."""

from __future__ import annotations

import os
import re

from gpudoctor import versions
from gpudoctor.job.env import probe_env
from gpudoctor.model import Outcome, fail, manual, set_env, unset_env, warn

_SONAME_MAJOR = re.compile(r"\.so\.(\d+)")


def cuda_version(facts) -> tuple[int, ...]:
    """torch's CUDA version, in a check declared with requires=["torch", "cuda-build"] (so it is a version number)."""
    parsed = versions.parse(facts.torch["cuda"])
    assert parsed is not None, 'a check that reads the CUDA version declares requires="cuda-build"'
    return parsed


def _so_major(path: str) -> int | None:
    m = _SONAME_MAJOR.search(os.path.basename(path))
    return int(m.group(1)) if m else None


def entry_major(entry: dict) -> int | None:
    v = versions.parse(entry.get("version"))
    return v[0] if v else None


def entry_dir(entry: dict) -> str:
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
    return {entry_dir(e) for entries in found.values() for e in entries if e.get("source") == "pip-wheel"}


def bundled_dirs(facts) -> set[str]:
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


def wheel_copies(facts, family: str) -> list[str]:
    """Where NVIDIA's pip wheels installed `family` for the target's torch (files, else folders)."""
    dirs = _wheel_dirs(facts)
    found = (facts.libraries.get("found") or {}).get(family) or []
    files = [e["path"] for e in found if e.get("source") == "pip-wheel" and e.get("version") and entry_dir(e) in dirs]
    if files:
        return files
    folders = WHEEL_FOLDERS.get(family, ())
    return sorted(d for d in dirs if os.path.basename(os.path.dirname(d)) in folders)


def ld_path_without(facts, dirs: set[str]):
    """A fix that drops `dirs` from LD_LIBRARY_PATH (keeping the other entries and their order)."""
    current = [d for d in probe_env(facts).get("LD_LIBRARY_PATH", "").split(":") if d]
    keep = [d for d in current if os.path.normpath(d) not in dirs]
    title = f"Remove {', '.join(sorted(dirs))} from LD_LIBRARY_PATH"
    if not keep:
        return unset_env("LD_LIBRARY_PATH", title=title)
    return set_env("LD_LIBRARY_PATH", ":".join(keep), title=title)


def other_copies(facts, family: str, major: int | None, loaded_dirs: set[str], sources: tuple[str, ...]):
    """Found copies of `family` outside the folders torch loaded it from: (same major, other major)."""
    bundled = bundled_dirs(facts)
    found = (facts.libraries.get("found") or {}).get(family) or []
    same: list[dict] = []
    other: list[dict] = []
    for e in found:
        if e.get("source") not in sources or entry_major(e) is None:
            continue
        d = entry_dir(e)
        if d in loaded_dirs or d in bundled:
            continue
        (same if entry_major(e) == major else other).append(e)
    return same, other


def ld_dirs_of(entries: list[dict]) -> set[str]:
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
            and entry_dir(e) == folder
            and os.path.dirname(os.path.normpath(e["path"])) == os.path.normpath(entry)
            for e in found
        ):
            return f"LD_LIBRARY_PATH entry {entry}"
    if any(e.get("source") == "ldconfig" and entry_dir(e) == folder for e in found):
        return "the ld.so cache"
    return None


def _version_mismatch(facts, family: str, label: str, loaded: list[str]) -> Outcome | None:
    """A file of `family` mapped from outside torch's own folders, found on the loader path, whose version is
    not the one torch was built with: fail when older (torch needs what it was built against), warn when newer."""
    built = built_with(facts, family)
    if not built:
        return None
    bundled = bundled_dirs(facts)
    for path in loaded:
        have = file_version(path)
        source = loader_source(facts, path)
        if have is None or source is None or os.path.dirname(os.path.normpath(path)) in bundled:
            continue
        if have[: len(built)] == built:
            continue
        wheel = wheel_copies(facts, family)
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
        return ld_path_without(facts, {os.path.normpath(source.removeprefix("LD_LIBRARY_PATH entry "))})
    if source == "the ld.so cache" and wheel:
        # wheel_copies names the files where the probe found them, else the folders
        folders = list(dict.fromkeys(os.path.dirname(p) if ".so" in os.path.basename(p) else p for p in wheel))
        current = [d for d in probe_env(facts).get("LD_LIBRARY_PATH", "").split(":") if d]
        return set_env("LD_LIBRARY_PATH", ":".join([*folders, *current]), title="Put torch's own copy first")
    return manual(f"Stop the {source} from handing the process another copy (LD_PRELOAD, ldconfig)")


def library_shadowing(facts, family: str, label: str, major: int | None, loaded: list[str]) -> Outcome | None:
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
    bundled = bundled_dirs(facts)
    wheel = wheel_copies(facts, family)
    foreign = sorted(d for d in loaded_dirs if d not in bundled)
    if wheel and foreign:
        ld_entries = [
            e
            for e in (facts.libraries.get("found") or {}).get(family, [])
            if e.get("source") == "LD_LIBRARY_PATH" and entry_dir(e) in foreign
        ]
        fix = ld_path_without(facts, ld_dirs_of(ld_entries)) if ld_entries else None
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
