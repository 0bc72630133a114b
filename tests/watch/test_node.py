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


# ---------------------------------------------------------------- who is the job's (issue 35 items 1 and 4)

STRANGER = "gpudoctor-stranger"


def _stranger() -> tuple[int, int]:
    """A local user that is not this one (created with useradd when missing; left for the next run: other tests
    may use it at the same time). Skips where this is not root."""
    import pwd

    if os.geteuid() != 0:
        pytest.skip("starting a process as another user needs root (useradd, setuid)")
    try:
        entry = pwd.getpwnam(STRANGER)
    except KeyError:
        r = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", STRANGER],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if r.returncode not in (0, 9):  # 9: made meanwhile by another test process
            pytest.skip(f"useradd failed: {r.stderr.strip()}")
        entry = pwd.getpwnam(STRANGER)
    return entry.pw_uid, entry.pw_gid


def _any_users_python() -> str:
    """A python interpreter another user may run (this test's own may sit in a directory only root enters)."""
    import shutil

    found = shutil.which("python3", path="/usr/bin:/bin:/usr/local/bin")
    if found is None:
        pytest.skip("no python3 another user can run in /usr/bin, /bin or /usr/local/bin")
    return found


def _started(argv: list[str], env: dict, **kw) -> subprocess.Popen:
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, **kw)
    deadline = time.monotonic() + 10
    while f"SLURM_JOB_ID={env['SLURM_JOB_ID']}".encode() not in open(f"/proc/{proc.pid}/environ", "rb").read():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return proc


def test_another_users_process_that_claims_the_job_is_not_the_jobs():
    uid, gid = _stranger()
    env = dict(os.environ, SLURM_JOB_ID=JOB, CUDA_VISIBLE_DEVICES="1", LOCAL_RANK="0")
    claims = [_any_users_python(), "-c", "import time; time.sleep(60)", "stranger-claims-the-job"]
    stranger = _started(claims, env, user=uid, group=gid, extra_groups=[], cwd="/")
    own = _started([sys.executable, "-c", "import time; time.sleep(60)", "the-jobs-own"], env)
    try:
        found = {p.pid: p for p in node.job_processes(JOB)}  # the job's user: this one (the probe's own uid)
        assert stranger.pid not in found and own.pid in found
        # the owner decides, not the variable: judged as the stranger's job, only the stranger's process
        assert [p.pid for p in node.job_processes(JOB, uid)] == [stranger.pid]
    finally:
        for p in (stranger, own):
            p.kill()
            p.wait()


@pytest.mark.parametrize(
    "line, job",
    [
        ("12:freezer:/slurm/uid_1000/job_46/step_0/task_0", "46"),
        ("0::/system.slice/slurmstepd.scope/job_46/step_batch/user/task_0", "46"),
        ("0::/slurm_node07/uid_0/job_7", "7"),
        ("0::/user.slice/user-1001.slice/user@1001.service/app.slice/slurm/job_46", None),  # a user's own slice
        ("0::/system.slice/job_46.scope", None),
        ("0::/", None),
    ],
)
def test_the_jobs_cgroup_is_read_from_slurms_own_paths(tmp_path, monkeypatch, line, job):
    monkeypatch.setattr(node, "_read", lambda path, limit: line.encode() + b"\n")
    assert node.cgroup_job(12345) == job


def test_an_option_and_its_value_in_two_argv_words_are_redacted(tmp_path):
    env = dict(os.environ, SLURM_JOB_ID=JOB)
    argv = [sys.executable, "-c", "import time; time.sleep(60)", "-u", "bob:MARKERu", "--proxy-user", "p:MARKERp"]
    argv += ["--user", "c:MARKERc", "-ud:MARKERd", "--token", "MARKERt", "--user=e:MARKERe"]
    proc = _started(argv, env)
    try:
        (p,) = [p for p in node.job_processes(JOB) if p.pid == proc.pid]
        assert "MARKER" not in json.dumps(p.to_dict()), p.cmdline
        assert p.cmdline[3:5] == ("-u", "bob:<redacted>")
    finally:
        proc.kill()
        proc.wait()


def test_slurms_list_and_its_descendants_decide_not_the_variable(monkeypatch):
    """Where SLURM lists the job's processes (here: listpids answering with a real process of this test), those
    and their descendants are the job's -- a child in a session of its own too, which proctrack/pgid would not
    list (torchrun starts its workers so) -- and a process that only sets SLURM_JOB_ID is not."""
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
        "print(p.pid, flush=True)\ntime.sleep(60)\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    parent = subprocess.Popen([sys.executable, "-c", code], env=clean, stdout=subprocess.PIPE, text=True)
    claims = _started([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ, SLURM_JOB_ID=JOB))
    child = None
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        monkeypatch.setattr(node, "listpids", lambda job: {parent.pid: "0"})
        found = {p.pid for p in node.job_processes(JOB)}
        assert {parent.pid, child} <= found and claims.pid not in found, found
    finally:
        for p in (parent, claims):
            p.kill()
            p.wait()
        if child is not None:
            try:
                os.kill(child, 9)
            except ProcessLookupError:
                pass
