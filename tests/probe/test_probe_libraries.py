"""The library and CUDA-toolkit probe against real files: fake shared libraries (empty files and
symlinks, since versions are read from names) and fake nvcc scripts."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from gpudoctor.probe import libraries


def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_library_versions_come_from_file_names_and_dangling_links_are_left_out(tmp_path):
    for name in ("libcudnn.so.8.9.7", "libcudart.so.11.0", "libcublas.so.12"):
        (tmp_path / name).touch()
    (tmp_path / "libcudnn.so.8").symlink_to("libcudnn.so.8.9.7")
    (tmp_path / "libcudart.so.12").symlink_to("/nonexistent/libcudart.so.12")  # a half-removed toolkit
    found = {fam: [] for fam in libraries.FAMILIES}
    libraries._scan_dir(str(tmp_path), "LD_LIBRARY_PATH", found)
    assert sorted((os.path.basename(e["path"]), e["version"]) for e in found["cudnn"]) == [
        ("libcudnn.so.8", "8"),
        ("libcudnn.so.8.9.7", "8.9.7"),
    ]
    # the loader cannot open a dangling link, so it shadows nothing
    assert [os.path.basename(e["path"]) for e in found["cudart"]] == ["libcudart.so.11.0"]
    assert [e["version"] for e in found["cublas"]] == ["12"]


@pytest.mark.parametrize(
    "body, version",
    [
        ('echo "Cuda compilation tools, release 11.8, V11.8.89"\n', "11.8"),
        ("echo garbage; echo release banana\n", None),
        ('printf "\\377\\376 release 12.\\377"\n', None),  # bytes that are not UTF-8
    ],
)
def test_nvcc_banner_is_read_and_garbage_costs_only_the_version(tmp_path, body, version):
    _script(tmp_path / "bin" / "nvcc", body)
    tk = libraries._toolkit({"CUDA_HOME": str(tmp_path)})
    assert tk["nvcc"] == str(tmp_path / "bin" / "nvcc") and tk["version"] == version and "error" not in tk


def test_hanging_nvcc_is_killed_with_what_it_started(tmp_path):
    pidfile = tmp_path / "child.pid"
    nvcc = _script(tmp_path / "bin" / "nvcc", f"sleep 300 &\necho $! > {pidfile}\nwait\n")
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        libraries.run_bounded([str(nvcc), "--version"], timeout=1)  # probe.proc, the one runner
    assert time.monotonic() - started < 5
    pid = int(pidfile.read_text())
    time.sleep(0.2)
    stat = Path(f"/proc/{pid}/stat")
    assert not stat.exists() or stat.read_text().split(") ")[1].startswith("Z")
