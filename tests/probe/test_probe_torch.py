"""The torch probe against real (fake-torch) processes: import errors, hangs, crashes, a
missing torch, and no process left behind. No mocks: a `torch` package written to a
temporary folder is put first on PYTHONPATH and the real probe child imports it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpudoctor.probe.torch_probe import TorchProbe
from tests.cliutil import clean_env, run_gpudoctor
from tests.thismachine import torch_sees_gpu

ROOT = Path(__file__).resolve().parents[2]


def fake_torch(tmp_path: Path, body: str) -> Path:
    """A folder holding a package `torch` whose __init__ runs `body`."""
    pkg = tmp_path / "fake" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(body))
    return pkg.parent


def probe(monkeypatch, fake: Path | None, python: str | None = None, timeout: float = 30) -> dict:
    if fake is not None:
        monkeypatch.setenv("PYTHONPATH", str(fake))
    else:
        monkeypatch.delenv("PYTHONPATH", raising=False)
    return TorchProbe(python, timeout).result()


def gpudoctor(*args, pythonpath: Path | None = None, timeout: float = 120):
    started = time.monotonic()
    extra = {"PYTHONPATH": str(pythonpath)} if pythonpath is not None else None
    r = run_gpudoctor(*args, env=extra, drop=("PYTHONPATH",), timeout=timeout, cwd=ROOT)
    return r, time.monotonic() - started


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """The interpreter of a fresh venv without pip or torch."""
    venv = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    return str(venv / "bin" / "python")


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (a container's init may never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_dead(pids, seconds=5.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        living = [p for p in pids if alive(p)]
        if not living:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def record_pids(pid_file: Path) -> str:
    """Fake-torch code: start a grandchild, write both pids to pid_file."""
    return textwrap.dedent(f"""
        import os, subprocess
        grandchild = subprocess.Popen(["sleep", "600"])
        with open({str(pid_file)!r}, "w") as fh:
            fh.write(f"{{os.getpid()}} {{grandchild.pid}}")
        """)


def assert_no_survivor(pid_file: Path) -> None:
    """The fake torch's process and its grandchild are gone (killed by the test if not, then failed)."""
    survivors = wait_dead([int(p) for p in pid_file.read_text().split()])
    for pid in survivors:
        os.kill(pid, 9)
    assert survivors == [], "processes left behind by the torch probe"


# ---------------------------------------------------------------- statuses


def test_real_torch_of_this_machine(monkeypatch):
    r = probe(monkeypatch, None)
    assert r["status"] == "ok", r
    assert r["version"].startswith("2.")
    if torch_sees_gpu():
        assert r["cuda"] and r["cuda_available"] is True and r["device_count"] >= 1
    else:
        assert r["cuda_available"] is False
    assert r["float32_matmul_precision"] == "highest"  # torch's default
    assert isinstance(r["loaded_libraries"], dict) and isinstance(r["wheel_lib_dirs"], list)


def test_import_error_is_reported_with_its_message(monkeypatch, tmp_path):
    fake = fake_torch(
        tmp_path, 'raise ImportError("libcudnn.so.9: cannot open shared object file: No such file or directory")'
    )
    r = probe(monkeypatch, fake)
    assert r["status"] == "import_error"
    assert r["error"] == "ImportError: libcudnn.so.9: cannot open shared object file: No such file or directory"


def test_torch_folder_without_init_is_an_incomplete_install(monkeypatch, tmp_path, bare_python):
    # what an interrupted uninstall leaves; it imports as a namespace package where no real torch exists
    (tmp_path / "fake" / "torch" / "lib").mkdir(parents=True)
    r = probe(monkeypatch, tmp_path / "fake", python=bare_python)
    assert r["status"] == "import_error"
    assert "not a complete installation" in r["error"]


def test_half_broken_torch_still_gives_a_result_despite_noise_on_stdout(monkeypatch, tmp_path):
    fake = fake_torch(
        tmp_path,
        """
    print("{ not json, printed by a chatty import")
    __version__ = "0.0.1"
    """,
    )
    r = probe(monkeypatch, fake)
    assert r["status"] == "ok"
    assert r["version"] == "0.0.1"
    assert r["cuda_available"] is False and "cuda_error" in r


@pytest.mark.parametrize(
    "body",
    [
        'import os, sys\nsys.stdout = open(os.devnull, "w")\n__version__ = "0.0.2"',  # a plugin that silences stdout
        'import sys\nsys.stdout.write("loading... ")\n__version__ = "0.0.2"',  # a progress line with no newline
    ],
)
def test_result_arrives_when_the_import_replaces_stdout_or_leaves_a_partial_line(monkeypatch, tmp_path, body):
    r = probe(monkeypatch, fake_torch(tmp_path, body))
    assert r["status"] == "ok" and r["version"] == "0.0.2"


def test_closed_stdout_is_not_mistaken_for_a_native_crash(monkeypatch, tmp_path):
    r = probe(monkeypatch, fake_torch(tmp_path, 'import os\nos.close(1)\n__version__ = "0.0.2"'))
    assert r["status"] == "crashed" and r["stage"] == "done" and "never arrived" in r["error"]


@pytest.mark.parametrize(
    "body, signal_name",
    [("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", "SIGSEGV"), ("import os\nos.abort()", "SIGABRT")],
)
def test_crash_is_reported_with_the_signal_name(monkeypatch, tmp_path, body, signal_name):
    r = probe(monkeypatch, fake_torch(tmp_path, body))
    assert r["status"] == "crashed"
    assert r["signal"] == signal_name
    assert signal_name in r["error"] and "importing torch" in r["error"]


def test_hang_times_out_within_the_limit_and_leaves_no_process(monkeypatch, tmp_path):
    pid_file = tmp_path / "pids"
    fake = fake_torch(tmp_path, record_pids(pid_file) + "\nimport time\ntime.sleep(600)\n")
    started = time.monotonic()
    r = probe(monkeypatch, fake, timeout=2)
    elapsed = time.monotonic() - started
    assert r["status"] == "timeout"
    assert r["stage"] == "import"
    assert "importing torch did not finish within 2 s" == r["error"]
    assert elapsed < 10
    assert_no_survivor(pid_file)


def test_hang_in_cuda_init_is_told_apart_from_a_hang_in_import(monkeypatch, tmp_path):
    fake = fake_torch(
        tmp_path,
        """
    import time
    __version__ = "2.99.0"
    class version:
        cuda = "12.4"
    class cuda:
        @staticmethod
        def get_arch_list():
            return ["sm_90"]
        @staticmethod
        def is_available():
            time.sleep(600)
    """,
    )
    r = probe(monkeypatch, fake, timeout=2)
    assert r["status"] == "timeout"
    assert r["stage"] == "cuda_init"
    assert r["error"].startswith("initialising CUDA")


FAKE_CUDA_TORCH = """
__version__ = "2.99.0"
class version:
    cuda = "12.4"
class _Props:
    name = "NVIDIA H100 80GB HBM3"
    major, minor = 9, 0
    total_memory = 85 << 30
    uuid = "8932f937-d72c-4106-c12f-20bd9faed9f6"  # torch's _CUuuid prints without a prefix
class cuda:
    get_arch_list = staticmethod(lambda: ["sm_90"])
    is_available = staticmethod(lambda: True)
    device_count = staticmethod(lambda: 1)
    get_device_properties = staticmethod(lambda i: _Props())
"""


@pytest.mark.parametrize(
    "visible, expected",
    [
        (None, "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"),
        ("0", "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"),
        ("MIG-0b3c7f2e-aaaa-bbbb-cccc-0123456789ab", "MIG-8932f937-d72c-4106-c12f-20bd9faed9f6"),
    ],
)
def test_device_uuid_is_written_as_nvml_and_cuda_visible_devices_write_it(monkeypatch, tmp_path, visible, expected):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    r = probe(monkeypatch, fake_torch(tmp_path, FAKE_CUDA_TORCH))
    assert r["status"] == "ok" and r["devices"][0]["uuid"] == expected


def test_something_the_import_started_does_not_outlive_a_successful_probe(monkeypatch, tmp_path):
    pid_file = tmp_path / "pids"
    fake = fake_torch(tmp_path, record_pids(pid_file) + '\n__version__ = "0.0.2"\n')
    started = time.monotonic()
    r = probe(monkeypatch, fake, timeout=30)
    # the grandchild holds our pipes open; we wait for the child, not for them
    assert time.monotonic() - started < 10
    assert r["status"] == "ok" and r["version"] == "0.0.2"
    assert_no_survivor(pid_file)


def test_missing_torch_in_a_fresh_venv(monkeypatch, bare_python):
    r = probe(monkeypatch, None, python=bare_python)
    assert r["status"] == "missing"
    assert "No module named 'torch'" in r["error"]
    assert r["python"] == bare_python


def test_an_executable_that_is_not_python(monkeypatch):
    r = probe(monkeypatch, None, python="/bin/true")
    assert r["status"] == "python_error"
    assert "/bin/true" in r["error"]


# ---------------------------------------------------------------- through the CLI


def test_cli_hung_torch_fails_within_the_torch_timeout(tmp_path):
    pid_file = tmp_path / "pids"
    fake = fake_torch(tmp_path, record_pids(pid_file) + "\nimport time\ntime.sleep(600)\n")
    r, elapsed = gpudoctor("check", "--select", "GD-CUDA-001", "--torch-timeout", "2", "--json", pythonpath=fake)
    assert r.returncode == 1, r.stderr
    (finding,) = json.loads(r.stdout)["findings"]
    assert finding["severity"] == "fail"
    assert "did not finish within 2 s" in finding["message"]
    assert elapsed < 30  # 2 s of import plus gpudoctor's own start on a busy 2-core machine
    assert_no_survivor(pid_file)


def test_cli_crashing_torch_fails_and_names_the_signal(tmp_path):
    fake = fake_torch(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)")
    r, _ = gpudoctor("check", "--select", "GD-CUDA-001", "--json", pythonpath=fake)
    assert r.returncode == 1, r.stderr
    (finding,) = json.loads(r.stdout)["findings"]
    assert finding["severity"] == "fail" and "SIGSEGV" in finding["message"]


def test_cli_missing_torch_fails_but_only_warns_with_expect_gpus_0(bare_python):
    python = bare_python
    r, _ = gpudoctor("check", "--select", "cuda", "--python", python, "--json")
    assert r.returncode == 1
    findings = {f["id"]: f for f in json.loads(r.stdout)["findings"]}
    assert findings["GD-CUDA-001"]["severity"] == "fail" and python in findings["GD-CUDA-001"]["message"]
    r, _ = gpudoctor("check", "--select", "cuda", "--python", python, "--expect-gpus", "0", "--json")
    assert r.returncode == 0, r.stdout
    findings = {f["id"]: f for f in json.loads(r.stdout)["findings"]}
    assert findings["GD-CUDA-001"]["severity"] == "warn"


@pytest.mark.parametrize("kind", ["not-executable", "missing", "directory"])
def test_cli_python_that_cannot_run_is_one_line_and_exit_2(tmp_path, kind):
    path = tmp_path / "python"
    if kind == "not-executable":
        path.write_text("#!/bin/sh\n")
        path.chmod(0o644)
    elif kind == "directory":
        path.mkdir()
    r, _ = gpudoctor("check", "--python", str(path))
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "Traceback" not in r.stderr


# ---------------------------------------------------------------- a fork of a process that imported torch


def _forked_probe(timeout: float) -> tuple[dict, int]:
    """The probe as `check --job`'s leader starts it (fork=True, after its own torch import): result and child pid."""
    from gpudoctor.probe.torch_probe import _Forked

    torch = pytest.importorskip("torch")
    if torch.cuda.is_initialized():
        pytest.skip("CUDA is initialised in this test process: the probe would not fork it")
    p = TorchProbe(None, timeout, fork=True)
    assert isinstance(p.proc, _Forked), "a caller that imported torch must get a fork, not a new interpreter"
    return p.result(), p.proc.pid


def test_a_forked_probe_reports_what_a_new_interpreter_does_without_importing_again(monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    forked, _ = _forked_probe(60)
    fresh_probe = TorchProbe(None, 60)  # not asked to fork: a new interpreter, whatever this process imported
    assert isinstance(fresh_probe.proc, subprocess.Popen)
    fresh = fresh_probe.result()
    assert forked["status"] == fresh["status"] == "ok", (forked, fresh)
    timing = ("import_seconds", "elapsed_seconds")
    assert "import_seconds" not in forked and fresh["import_seconds"] > 0  # a fork's import would read 0 s
    assert {k: v for k, v in forked.items() if k not in timing} == {k: v for k, v in fresh.items() if k not in timing}


def test_a_forked_probe_hung_in_cuda_init_is_killed_at_the_deadline(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: time.sleep(600))  # inherited by the fork
    started = time.monotonic()
    r, pid = _forked_probe(2)
    assert time.monotonic() - started < 10
    assert r["status"] == "timeout" and r["stage"] == "cuda_init", r
    assert r["error"] == "initialising CUDA (torch.cuda.is_available()) did not finish within 2 s"
    assert wait_dead([pid]) == []


FORKED_CRASH = """
import faulthandler, json, os, torch
from gpudoctor.probe.torch_probe import TorchProbe, _Forked

faulthandler.enable(os.fdopen(os.dup(2), "w"))  # as pytest does: its own copy of stderr, which a dup2 misses

def crash():
    print("noise from the fork", flush=True)
    os.abort()

torch.cuda.is_available = crash  # inherited by the fork
p = TorchProbe(None, 30, fork=True)
print(json.dumps({"forked": isinstance(p.proc, _Forked), **p.result()}))
"""


def test_a_forked_probe_that_crashes_is_named_with_the_signal_and_its_output_stays_off_ours():
    """In a process with Python's faulthandler on (as pytest has it, on its own copy of stderr): the fork's crash
    report goes to the probe's stderr, as a new interpreter's would, never to the parent's; its stdout likewise."""
    pytest.importorskip("torch")
    r = subprocess.run(
        [sys.executable, "-c", FORKED_CRASH],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(r.stdout)  # one line: nothing of the fork's
    assert result["forked"] and result["status"] == "crashed" and result["signal"] == "SIGABRT", result
    assert result["stage"] == "cuda_init"
    assert any("in _cuda_facts" in line for line in result["stderr_tail"]), result["stderr_tail"]  # its stack
    assert "Fatal Python error" not in r.stderr, r.stderr[-2000:]


def test_only_this_interpreter_is_forked(monkeypatch, bare_python):
    pytest.importorskip("torch")
    p = TorchProbe(bare_python, 30, fork=True)  # another interpreter: a new process, even when asked to fork
    assert isinstance(p.proc, subprocess.Popen)
    assert p.result()["status"] == "missing"
