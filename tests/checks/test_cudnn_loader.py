"""GD-CUDA-005's loader rule for cuDNN's sub-libraries: which copy the dynamic loader hands torch's cuDNN.

The rule (ld.so(8), dlopen(3)): DT_RPATH of the asking object when it has no DT_RUNPATH, LD_LIBRARY_PATH,
the asking object's own DT_RUNPATH (not inherited), the ld.so cache. The last test builds real libraries
with gcc, runs them under the real loader with a private ld.so cache (a mount namespace, so the machine's
cache is untouched) and compares LD_DEBUG=libs with what the check decides from the probed facts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpudoctor.facts import Facts
from gpudoctor.model import Severity
from gpudoctor.probe import libraries
from tests.factsutil import load_fixture, make_facts, run, said

RECORDED_H200 = "recorded-h200x1-driver580-torch2.11-cu130"  # gpudoctor snapshot on a lent H200 (2026-11-26)
WHEEL8 = "/venv/lib/python3.10/site-packages/nvidia/cudnn/lib"
SYS = "/usr/lib/x86_64-linux-gnu"


def _file(name: str, needed=(), runpath: str | None = None, rpath: str | None = None) -> dict:
    dynamic = {"soname": name, "needed": list(needed), "rpath": rpath, "runpath": runpath}
    return {"name": name, "realpath": f"{WHEEL8}/{name}", "dynamic": dynamic}


def _cache(*names_versions: tuple[str, str]) -> list[dict]:
    return [
        {
            "soname": n,
            "flags": "libc6,x86-64",
            "path": f"{SYS}/{n}",
            "realpath": f"{SYS}/{n.rsplit('.so.', 1)[0]}.so.{v}",
        }
        for n, v in names_versions
    ]


def _facts(bundle_files: list[dict], cache: list[dict], cudnn: int, loaded: list[str], env: dict | None = None):
    v = (
        (cudnn // 10000, cudnn % 10000 // 100, cudnn % 100)
        if cudnn >= 10000
        else (cudnn // 1000, cudnn % 1000 // 100, 0)
    )
    major = str(v[0])
    patch = {
        "torch.cudnn": cudnn,
        "torch.cudnn_compile": list(v),
        "torch.loaded_libraries.cudnn": loaded,
        "torch.wheel_lib_dirs": [WHEEL8],
        "libraries.found.cudnn": [
            {"path": f"{SYS}/libcudnn.so.{major}", "version": major, "source": "ldconfig", "symlink": True},
            {"path": f"{WHEEL8}/libcudnn.so.{major}", "version": major, "source": "pip-wheel", "symlink": False},
        ],
        "libraries.cudnn_loader": {
            "ld_cache": cache,
            "ld_library_path": [],
            "bundle": [{"dir": WHEEL8, "files": bundle_files}],
        },
    }
    return make_facts(env={"PATH": "/usr/bin", **(env or {})}, patch=patch)


CUDNN8_HELPERS = ("libcudnn_ops_infer.so.8", "libcudnn_cnn_infer.so.8", "libcudnn_adv_infer.so.8")


def _cudnn8_bundle(shim_runpath: str | None = "$ORIGIN", helper_runpath: str | None = None) -> list[dict]:
    return [
        _file("libcudnn.so.8", runpath=shim_runpath),
        _file("libcudnn_ops_infer.so.8", runpath=helper_runpath),
        _file("libcudnn_cnn_infer.so.8", needed=["libcudnn_ops_infer.so.8"], runpath=helper_runpath),
        _file("libcudnn_adv_infer.so.8", needed=["libcudnn_ops_infer.so.8"], runpath=helper_runpath),
    ]


def test_cudnn8_helpers_without_runpath_take_the_system_copy_from_the_cache_warn():
    # pytorch#104591: torch's bundled 8.5 beside a system 8.9 registered in the ld.so cache
    facts = _facts(
        _cudnn8_bundle(),
        _cache(*[(n, "8.9.2") for n in CUDNN8_HELPERS]),
        8500,
        [f"{WHEEL8}/libcudnn.so.8"],
    )
    (f,) = run("GD-CUDA-005", facts)
    assert f.severity is Severity.WARN, f.message
    assert "libcudnn_ops_infer.so.8 (NEEDED of libcudnn_cnn_infer.so.8)" in said(f)
    assert f"{SYS}/libcudnn_ops_infer.so.8 (cuDNN 8.9.2, through the ld.so cache" in said(f)
    assert f.fix.actions[0].target == "LD_LIBRARY_PATH" and f.fix.actions[0].value == WHEEL8


def test_cudnn8_with_helpers_that_find_their_own_folder_stays_a_note():
    facts = _facts(
        _cudnn8_bundle(helper_runpath="$ORIGIN"),
        _cache(*[(n, "8.9.2") for n in CUDNN8_HELPERS]),
        8500,
        [f"{WHEEL8}/libcudnn.so.8"],
    )
    (f,) = run("GD-CUDA-005", facts)
    assert f.severity is Severity.INFO and "not used" in said(f)


def test_a_system_copy_of_the_same_version_is_no_mix():
    facts = _facts(_cudnn8_bundle(), _cache(*[(n, "8.5.0") for n in CUDNN8_HELPERS]), 8500, [f"{WHEEL8}/libcudnn.so.8"])
    assert run("GD-CUDA-005", facts)[0].severity is Severity.INFO


def test_a_shim_with_a_dt_rpath_is_searched_before_ld_library_path():
    other = "/opt/cudnn-8.9/lib"
    facts = _facts(
        _cudnn8_bundle(shim_runpath=None, helper_runpath=None)[:1]
        + [dict(_file("libcudnn_ops_infer.so.8"), dynamic={"soname": "libcudnn_ops_infer.so.8", "needed": []})],
        [],
        8500,
        [f"{WHEEL8}/libcudnn.so.8"],
        env={"LD_LIBRARY_PATH": other},
    )
    facts.sections["libraries"]["ld_library_path"] = [other]
    facts.sections["libraries"]["cudnn_loader"]["ld_library_path"] = [
        {
            "dir": other,
            "files": [{"name": "libcudnn_ops_infer.so.8", "realpath": f"{other}/libcudnn_ops_infer.so.8.9.2"}],
        }
    ]
    shim = facts.sections["libraries"]["cudnn_loader"]["bundle"][0]["files"][0]["dynamic"]
    shim["runpath"] = "$ORIGIN"  # RUNPATH: LD_LIBRARY_PATH comes first
    (f,) = run("GD-CUDA-005", facts)
    assert f.severity is Severity.WARN and "LD_LIBRARY_PATH is searched before the RUNPATH" in said(f)
    assert f.fix.actions[0].value == WHEEL8  # the foreign entry dropped, torch's folder first
    shim["runpath"], shim["rpath"] = None, "$ORIGIN"  # DT_RPATH without RUNPATH: before LD_LIBRARY_PATH
    assert run("GD-CUDA-005", facts)[0].severity is not Severity.WARN


def test_a_sub_library_torchs_wheel_lacks_is_taken_from_a_newer_system_cudnn9():
    # pytorch#188892: the 9.20 wheel has no libcudnn_engines_tensor_ir.so.9; a system 9.24 does
    wheel = [
        _file("libcudnn.so.9", runpath="$ORIGIN"),
        _file("libcudnn_graph.so.9", runpath="$ORIGIN"),
        _file("libcudnn_ops.so.9", needed=["libcudnn_graph.so.9"], runpath="$ORIGIN"),
    ]
    cache = _cache(
        ("libcudnn_graph.so.9", "9.24.0"),
        ("libcudnn_ops.so.9", "9.24.0"),
        ("libcudnn_engines_tensor_ir.so.9", "9.24.0"),
    )
    facts = _facts(wheel, cache, 92000, [f"{WHEEL8}/libcudnn.so.9", f"{WHEEL8}/libcudnn_graph.so.9"])
    (f,) = run("GD-CUDA-005", facts)
    assert f.severity is Severity.WARN
    assert "torch's folder has no libcudnn_engines_tensor_ir.so.9" in said(f)
    assert "libcudnn_ops.so.9" not in said(f)  # found in torch's own folder first (RUNPATH $ORIGIN)
    assert f.fix.safety.value == "manual"


def test_recorded_h200_system_cudnn_914_beside_torchs_919_stays_a_note():
    # recorded before the loader facts existed: the system copy is named, as a note
    (f,) = run("GD-CUDA-005", Facts.from_dict(load_fixture(RECORDED_H200)))
    assert f.severity is Severity.INFO and "libcudnn.so.9.14.0" in said(f)


def test_recorded_h200_with_its_wheels_runpath_stays_a_note():
    # the same machine with the loader facts the probe now records: the wheel's cuDNN 9 libraries carry
    # RUNPATH $ORIGIN (pytorch/builder#1859 for libcudnn_graph), so every sub-library is found in torch's folder
    data = load_fixture(RECORDED_H200)
    wheel = "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib"
    subs = ["libcudnn_graph.so.9", "libcudnn_ops.so.9", "libcudnn_cnn.so.9", "libcudnn_engines_precompiled.so.9"]
    files = [
        {
            "name": n,
            "realpath": f"{wheel}/{n}",
            "dynamic": {"soname": n, "needed": [], "rpath": None, "runpath": "$ORIGIN"},
        }
        for n in ["libcudnn.so.9", *subs]
    ]
    system = "/usr/lib/x86_64-linux-gnu"
    data["libraries"]["cudnn_loader"] = {
        "ld_cache": [
            {"soname": n, "path": f"/lib/x86_64-linux-gnu/{n}", "realpath": f"{system}/{n}.14.0"} for n in subs
        ],
        "ld_library_path": [{"dir": d, "files": []} for d in data["libraries"]["ld_library_path"]],
        "bundle": [{"dir": wheel, "files": files}],
    }
    (f,) = run("GD-CUDA-005", Facts.from_dict(data))
    assert f.severity is Severity.INFO and "not used" in said(f), f.message


# ------------------------------------------------------------------ the real loader


def _gcc(out: Path, source: Path, *flags: str) -> None:
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(source), *flags], check=True, timeout=60)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if not shutil.which("gcc") or not shutil.which("unshare") or os.geteuid() != 0:
        pytest.skip("needs gcc, unshare and root (a private mount namespace for the ld.so cache)")
    root = tmp_path_factory.mktemp("ldso")
    (root / "sub.c").write_text('const char *which(void) { return "x"; }\n')
    (root / "needs.c").write_text("extern const char *which(void);\nconst char *cnn(void) { return which(); }\n")
    (root / "main.c").write_text(
        "#include <dlfcn.h>\n#include <stdio.h>\nint main(int c, char **v) {\n"
        "  void *h = dlopen(v[1], RTLD_NOW | RTLD_GLOBAL); if (!h) return 1;\n"
        '  void (*load)(const char *) = (void (*)(const char *))dlsym(h, "load");\n'
        "  for (int i = 2; i < c; i++) load(v[i]);\n  return 0;\n}\n"
    )
    (root / "shim.c").write_text(
        "#include <dlfcn.h>\n#include <stdio.h>\n"
        'void load(const char *n) { if (!dlopen(n, RTLD_NOW | RTLD_GLOBAL)) printf("%s\\n", dlerror()); }\n'
    )
    system, bundle = root / "system", root / "bundle"
    system.mkdir()
    bundle.mkdir()
    for folder, version in ((system, ".8.9.2"), (bundle, "")):
        ops = folder / f"libcudnn_ops_infer.so.8{version}"
        _gcc(ops, root / "sub.c", "-Wl,-soname,libcudnn_ops_infer.so.8")
        cnn = folder / f"libcudnn_cnn_infer.so.8{version}"
        _gcc(cnn, root / "needs.c", "-Wl,-soname,libcudnn_cnn_infer.so.8", f"-L{folder}", f"-l:{ops.name}")
        if version:
            (folder / "libcudnn_ops_infer.so.8").symlink_to(ops.name)
            (folder / "libcudnn_cnn_infer.so.8").symlink_to(cnn.name)
    _gcc(
        bundle / "libcudnn.so.8", root / "shim.c", "-Wl,-soname,libcudnn.so.8", "-Wl,--enable-new-dtags,-rpath,$ORIGIN"
    )
    subprocess.run(["gcc", "-o", str(root / "prog"), str(root / "main.c"), "-ldl"], check=True, timeout=60)
    (root / "ld.so.conf").write_text(f"{system}\n")
    subprocess.run(
        ["ldconfig", "-C", str(root / "ld.so.cache"), "-f", str(root / "ld.so.conf")], check=True, timeout=60
    )
    listing = subprocess.run(["ldconfig", "-C", str(root / "ld.so.cache"), "-p"], capture_output=True, text=True)
    return root, libraries.parse_ldconfig(listing.stdout)


def _real_loader(root: Path, *names: str) -> str:
    cache = root / "ld.so.cache"
    command = (
        f"mount --bind {cache} /etc/ld.so.cache && {root / 'prog'} {root / 'bundle/libcudnn.so.8'} {' '.join(names)}"
    )
    r = subprocess.run(
        ["unshare", "-m", "sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=60,
        env={"LD_DEBUG": "libs", "PATH": "/usr/bin:/bin"},
    )
    if "mount" in r.stderr and r.returncode:
        pytest.skip(f"no private mount namespace here: {r.stderr.strip()[:200]}")
    return r.stderr


def test_the_real_loader_takes_what_the_check_says(built):
    root, cache_entries = built
    bundle = str(root / "bundle")
    loader = libraries.cudnn_loader([], cache_entries)
    loader["bundle"] = libraries.describe_cudnn_dirs([bundle])
    patch = {
        "torch.cudnn": 8500,
        "torch.cudnn_compile": [8, 5, 0],
        "torch.loaded_libraries.cudnn": [f"{bundle}/libcudnn.so.8"],
        "torch.wheel_lib_dirs": [],
        "libraries.found.cudnn": [],
        "libraries.ld_library_path": [],
        "libraries.cudnn_loader": loader,
    }
    (f,) = run("GD-CUDA-005", make_facts(env={"PATH": "/usr/bin"}, patch=patch))
    predicted = {s["soname"]: s["path"] for s in f.evidence.get("sublibraries", [])}
    # the shim (RUNPATH $ORIGIN) loads libcudnn_cnn_infer.so.8 from its folder; that helper has no RUNPATH,
    # so its NEEDED libcudnn_ops_infer.so.8 comes from the ld.so cache: the system copy
    trace = _real_loader(root, "libcudnn_cnn_infer.so.8")
    assert f"calling init: {root}/system/libcudnn_ops_infer.so.8" in trace, trace[-2000:]
    assert f"calling init: {bundle}/libcudnn_cnn_infer.so.8" in trace
    assert f.severity is Severity.WARN and os.path.dirname(predicted["libcudnn_ops_infer.so.8"]) == str(root / "system")
    assert "libcudnn_cnn_infer.so.8" not in predicted  # dlopen by the shim: its RUNPATH finds torch's own
    # with torch's folder first on LD_LIBRARY_PATH (the check's fix) the loader keeps to torch's copies
    fixed = subprocess.run(
        [
            "unshare",
            "-m",
            "sh",
            "-c",
            f"mount --bind {root / 'ld.so.cache'} /etc/ld.so.cache && "
            f"{root / 'prog'} {bundle}/libcudnn.so.8 libcudnn_cnn_infer.so.8",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"LD_DEBUG": "libs", "PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": f.fix.actions[0].value},
    ).stderr
    assert f"calling init: {bundle}/libcudnn_ops_infer.so.8" in fixed and "system/libcudnn_ops" not in fixed


def _without_loader_facts(system_version: str, cudnn: int = 8500):
    facts = _facts([], [], cudnn, [f"{WHEEL8}/libcudnn.so.8"])
    libs = facts.sections["libraries"]
    del libs["cudnn_loader"]  # a snapshot from before issue 25
    libs["found"]["cudnn"][0]["realpath"] = f"{SYS}/libcudnn.so.{system_version}"
    return facts


def test_an_older_snapshot_with_a_system_cudnn8_of_another_version_warns_by_cudnn8s_missing_runpath():
    (f,) = run("GD-CUDA-005", _without_loader_facts("8.9.2"))
    assert f.severity is Severity.WARN and "cuDNN 8.9.2" in said(f) and "no RUNPATH" in said(f)
    assert f.fix.actions[0].value == WHEEL8
    assert run("GD-CUDA-005", _without_loader_facts("8.5.0"))[0].severity is Severity.INFO
