"""Which library files a process really maps (issue 18): a real shared library named libcudnn.so.9, built with
gcc into a folder on LD_LIBRARY_PATH and loaded by soname in a real child process, read back from that process's
/proc/<pid>/maps; then the whole torch probe with a torch package that loads it, judged by GD-CUDA-005.

On this CPU-only machine torch maps no CUDA library, so the loader is exercised with a library of our own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpudoctor.model import Severity
from gpudoctor.probe import libraries
from gpudoctor.probe.torch_child import _loaded_libraries
from gpudoctor.probe.torch_probe import TorchProbe
from tests.factsutil import make_facts, run, said
from tests.probe.test_probe_torch import fake_torch


@pytest.fixture(scope="module")
def cudnn_dir(tmp_path_factory) -> Path:
    """A folder holding libcudnn.so.9 -> libcudnn.so.9.1.0, a real ELF shared object with that soname."""
    gcc = shutil.which("gcc") or pytest.skip("gcc is needed to build a shared library")
    d = tmp_path_factory.mktemp("gd18b-cudnn")
    (d / "cudnn.c").write_text("int cudnnGetVersion(void) { return 90100; }\n")
    subprocess.run(
        [gcc, "-shared", "-fPIC", "-Wl,-soname,libcudnn.so.9", "-o", str(d / "libcudnn.so.9.1.0"), str(d / "cudnn.c")],
        check=True,
        timeout=60,
    )
    (d / "libcudnn.so.9").symlink_to("libcudnn.so.9.1.0")
    return d


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH")}
    return {**env, **extra}


def test_the_maps_of_a_real_process_name_the_file_found_on_ld_library_path(cudnn_dir):
    loader = "import ctypes, sys; ctypes.CDLL('libcudnn.so.9'); print('loaded', flush=True); sys.stdin.read()"
    child = subprocess.Popen(
        [sys.executable, "-c", loader],
        env=_env(LD_LIBRARY_PATH=f"/nonexistent-gd18b:{cudnn_dir}"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "loaded"
        found = _loaded_libraries(f"/proc/{child.pid}/maps")
    finally:
        child.communicate("", timeout=30)
    # the file the loader opened, symlink resolved: its name carries the full version
    assert found["cudnn"] == [str(cudnn_dir / "libcudnn.so.9.1.0")]
    assert found["cublas"] == [] and found["nccl"] == []


def test_an_unreadable_maps_file_is_none_not_an_error(tmp_path):
    assert _loaded_libraries(str(tmp_path / "no-such-maps")) is None


FAKE_TORCH = """
import ctypes, types
ctypes.CDLL("libcudnn.so.9")  # what libtorch_cuda.so's dependency on libcudnn.so.9 makes the loader do
__version__ = "2.4.0"
version = types.SimpleNamespace(cuda="12.4", hip=None, debug=False)
_C = types.SimpleNamespace(_cudnn=types.SimpleNamespace(getCompileVersion=lambda: (9, 5, 0)))
backends = types.SimpleNamespace(cudnn=types.SimpleNamespace(is_available=lambda: True, version=lambda: 90100))
"""


def test_the_torch_probe_records_the_mapped_cudnn_and_the_check_names_the_ld_library_path_entry(
    cudnn_dir, tmp_path, monkeypatch
):
    # torch built with cuDNN 9.5 finds a cuDNN 9.1 through LD_LIBRARY_PATH (a real process, a real loader)
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{cudnn_dir}:/opt/gd18b-mpi/lib")
    monkeypatch.setenv("PYTHONPATH", str(fake_torch(tmp_path, FAKE_TORCH)))
    torch_facts = TorchProbe(None, 60).result()
    assert torch_facts["status"] == "ok", torch_facts
    assert torch_facts["loaded_libraries"]["cudnn"] == [str(cudnn_dir / "libcudnn.so.9.1.0")]
    assert torch_facts["cudnn_compile"] == [9, 5, 0] and torch_facts["cudnn"] == 90100
    env = {"LD_LIBRARY_PATH": os.environ["LD_LIBRARY_PATH"]}
    facts = make_facts(env=env, patch={"torch": torch_facts, "libraries": libraries.probe(env)})
    (finding,) = run("GD-CUDA-005", facts)
    assert finding.severity is Severity.FAIL, finding.message
    assert f"cuDNN 9.1.0 ({cudnn_dir}/libcudnn.so.9.1.0, found through LD_LIBRARY_PATH entry {cudnn_dir})" in (
        said(finding)
    )
    (action,) = finding.fix.actions
    assert (action.target, action.value) == ("LD_LIBRARY_PATH", "/opt/gd18b-mpi/lib")
    json.dumps(facts.to_dict())  # still a JSON-serialisable snapshot
