"""cuda checks of cuDNN: the copy torch loads, its sub-libraries, and the one it was built with."""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpudoctor import versions
from gpudoctor.checks.cuda._loading import (
    bundled_dirs,
    entry_major,
    file_version,
    ld_dirs_of,
    ld_path_without,
    library_shadowing,
    other_copies,
)
from gpudoctor.job.env import probe_env
from gpudoctor.model import Outcome, fail, info, manual, passed, set_env, skip, warn
from gpudoctor.registry import check


def _cudnn_major(t: dict) -> int | None:
    v = versions.cudnn_from_int(t.get("cudnn"))
    if v:
        return v[0]
    compile_v = t.get("cudnn_compile")
    return int(compile_v[0]) if compile_v else None


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
    bundled = bundled_dirs(facts) | {bundle_dir}
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
    requires=["torch", "cuda-build"],
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
    t = facts.torch
    if t.get("cudnn") is None and not t.get("cudnn_error"):
        return skip("torch reports no cuDNN (built without it, or cuDNN unavailable)")
    loaded = ((t.get("loaded_libraries") or {}).get("cudnn")) or []
    major = _cudnn_major(t)
    ld_entries = [
        e
        for e in (facts.libraries.get("found") or {}).get("cudnn", [])
        if e.get("source") == "LD_LIBRARY_PATH" and (major is None or entry_major(e) in (None, major))
    ]
    evidence = {
        "torch_cudnn": versions.fmt(versions.cudnn_from_int(t.get("cudnn"))),
        "cudnn_compile": t.get("cudnn_compile"),
        "loaded": loaded,
        "ld_library_path": probe_env(facts).get("LD_LIBRARY_PATH"),
    }
    error = t.get("cudnn_error")
    if error:
        fix = ld_path_without(facts, ld_dirs_of(ld_entries)) if ld_entries else None
        where = f" (cuDNN on LD_LIBRARY_PATH: {', '.join(e['path'] for e in ld_entries)})" if ld_entries else ""
        return fail(f"torch cannot use the cuDNN it loaded: {error}{where}", fix, cudnn_error=error, **evidence)
    problem = library_shadowing(facts, "cudnn", "cuDNN", major, loaded)
    if problem:
        return problem
    loaded_dirs = {os.path.dirname(os.path.normpath(p)) for p in loaded}
    if not loaded_dirs:
        return passed(f"torch uses cuDNN {evidence['torch_cudnn']} (which file it mapped is unknown)", **evidence)
    same_ld, other_ld = other_copies(facts, "cudnn", major, loaded_dirs, ("LD_LIBRARY_PATH",))
    using = f"torch uses cuDNN {evidence['torch_cudnn']} from {', '.join(sorted(loaded_dirs))}"
    if same_ld:
        paths = [e["path"] for e in same_ld]
        return warn(
            f"{using}, but LD_LIBRARY_PATH also holds cuDNN {major} ({', '.join(paths)}): it is searched first for "
            "the cuDNN sub-libraries loaded on first use, so the two installations can mix "
            "(CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH or a version-incompatibility error at the first convolution)",
            ld_path_without(facts, ld_dirs_of(same_ld)),
            other_copies=paths,
            **evidence,
        )
    shim_dirs = sorted({os.path.dirname(os.path.normpath(p)) for p in loaded if "libcudnn.so" in os.path.basename(p)})
    if shim_dirs and major is not None:
        torch_v = versions.cudnn_from_int(t.get("cudnn"))
        sub = _sublibrary_finding(facts, using, shim_dirs[0], major, torch_v, evidence)
        if sub:
            return sub
    same_sys, _ = other_copies(facts, "cudnn", major, loaded_dirs, ("ldconfig",))
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
