"""The node probe (watch/node.py) on this machine: real processes in /proc, and NVML through a stand-in module
(no NVIDIA driver here; the stand-in answers the nvidia-ml-py calls the probe makes, constructed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from gpudoctor.watch import node
from gpudoctor.watch.samples import NodeObservation

# One job id per test process: under pytest-xdist two workers may each run a test with its own stand-in job process,
# and a shared id would show each the other's.
JOB = str(900_000 + os.getpid() % 99_999)


@pytest.fixture
def job_process():
    """A process of job JOB as SLURM would start it: its environment holds the job's variables and a secret."""
    env = dict(os.environ, SLURM_JOB_ID=JOB, SLURM_STEP_ID="0", CUDA_VISIBLE_DEVICES="3", LOCAL_RANK="0")
    env["WANDB_API_KEY"] = "sekrit-env"
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "--api-key", "sekrit-arg"],
        env=env,
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while f"SLURM_JOB_ID={JOB}".encode() not in open(f"/proc/{proc.pid}/environ", "rb").read():
        assert time.monotonic() < deadline
        time.sleep(0.01)  # until the exec has replaced the forked copy of this process
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(autouse=True)
def no_cluster(monkeypatch):
    # scontrol without a cluster fails at once with an empty slurm.conf (a missing one retries for 60 s)
    monkeypatch.setenv("SLURM_CONF", os.devnull)
    for name in ("SLURM_JOB_ID", "SLURM_STEP_ID"):
        monkeypatch.delenv(name, raising=False)


def test_the_jobs_processes_are_found_with_only_the_variables_the_judge_reads(job_process):
    found = {p.pid: p for p in node.job_processes(JOB)}
    assert list(found) == [job_process.pid]
    p = found[job_process.pid]
    assert p.ppid == os.getpid() and p.cpu_seconds_start is not None
    assert p.env == {"CUDA_VISIBLE_DEVICES": "3", "LOCAL_RANK": "0", "SLURM_JOB_ID": JOB, "SLURM_STEP_ID": "0"}
    assert "sekrit-arg" not in " ".join(p.cmdline) and "sekrit" not in json.dumps(p.to_dict())


def test_the_probes_own_step_is_left_out(job_process, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", JOB)
    monkeypatch.setenv("SLURM_STEP_ID", "0")  # the probe runs in the step the process belongs to
    assert node.job_processes(JOB) == []
    monkeypatch.setenv("SLURM_STEP_ID", "1")
    assert [p.pid for p in node.job_processes(JOB)] == [job_process.pid]


class _FakeNvml:
    """The nvidia-ml-py calls node.sample_gpus makes, answering for two GPUs (constructed figures)."""

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_ERROR_NOT_SUPPORTED = 3

    class NVMLError(Exception):
        value = 999

    def __init__(self):
        self.shut = False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetHandleByIndex(self, i):
        if i > 1:
            raise self.NVMLError("Insufficient Permissions")
        return i

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H100"

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h}"

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return 1980

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700000

    def nvmlDeviceGetMemoryInfo(self, h):
        return type("Mem", (), {"total": 80 * 2**30, "used": (10 + h) * 2**30})()

    def nvmlDeviceGetUtilizationRates(self, h):
        return type("Util", (), {"gpu": 97 if h == 0 else 0, "memory": 10})()

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 4

    def nvmlDeviceGetPowerUsage(self, h):
        return 650000

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1485

    def nvmlDeviceGetTemperature(self, h, kind):
        return 60

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [type("P", (), {"pid": 4242, "usedGpuMemory": 9 * 2**30})()] if h == 0 else []

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return []


def test_nvml_samples_of_the_allocated_gpus(monkeypatch):
    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    traces, error = node.sample_gpus([0, 1, 2], window_s=0.3, rate_hz=10)
    assert error is None and fake.shut
    assert [t.index for t in traces] == [0, 1]  # GPU 2 cannot be opened here: left unsampled, not invented
    first = traces[0]
    assert (first.name, first.uuid, first.sm_clock_max_mhz, first.power_limit_w) == ("NVIDIA H100", "GPU-0", 1980, 700)
    assert len(first.samples) >= 2
    s = first.samples[0]
    assert (s.util_gpu, s.sm_clock_mhz, s.clock_event_reasons, s.power_w, s.temp_c) == (97, 1485, 4, 650.0, 60)
    assert s.processes == ((4242, 9 * 2**30),)


def test_without_nvml_the_window_is_kept_and_the_reason_given(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as without nvidia-ml-py
    started = time.monotonic()
    traces, error = node.sample_gpus([0], window_s=0.2, rate_hz=1)
    assert traces == [] and error.startswith("NVML: ")
    assert time.monotonic() - started >= 0.2


def test_the_probe_prints_one_observation(job_process):
    env = dict(os.environ, SLURMD_NODENAME="gpu07", SLURM_CONF=os.devnull)
    r = subprocess.run(
        [sys.executable, "-m", "gpudoctor.watch.node", "--job", JOB, "--for", "0.2", "--allocation", '{"gpu07": [3]}'],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    (line,) = r.stdout.splitlines()
    obs = NodeObservation.from_dict(json.loads(line))
    assert obs.node == "gpu07" and obs.allocated == (3,) and obs.window_s == 0.2
    assert [p.pid for p in obs.processes] == [job_process.pid]
    assert obs.processes[0].cpu_seconds is not None


def test_a_python_process_without_progress_gets_its_stack_where_py_spy_is(job_process, tmp_path, monkeypatch):
    # a stand-in py-spy (constructed): prints what `py-spy dump` prints for the PID it is given
    spy = tmp_path / "py-spy"
    spy.write_text('#!/bin/sh\necho "Thread $4 (idle): \\"MainThread\\""\necho "    sleep (<string>:1)"\n')
    spy.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    (p,) = node.job_processes(JOB)
    time.sleep(0.2)
    (p,) = node.stacks(node._with_end_cpu([p]), window_s=10.0)  # it sleeps: no progress
    assert p.stack is not None and f"Thread {p.pid} (idle)" in p.stack and "sleep (<string>:1)" in p.stack
    busy = type(p)(**{**p.__dict__, "stack": None, "cpu_seconds": p.cpu_seconds_start + 8.0})
    assert node.stacks([busy], window_s=10.0)[0].stack is None  # 80 % of a core: progress, not dumped
    idle = type(p)(**{**p.__dict__, "stack": None})
    assert node.stacks([idle], window_s=5.0)[0].stack is None  # too short a window to call anything stuck
