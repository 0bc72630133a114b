"""The probe `gpudoctor watch` runs on each node of a job: `python -m gpudoctor.watch.node --job J --for S ...`.

Started by `srun --jobid J --overlap --ntasks-per-node=1` (cli.py), so it runs inside the job's allocation as
the job's user, and prints one line of JSON: a samples.NodeObservation. It imports no torch, creates no CUDA
context and starts nothing on a GPU: NVML (nvidia-ml-py) reads the driver's counters without a context.

- The job's processes: those SLURM says are the job's -- `scontrol listpids J` (slurmstepd's own list, from
  its proctrack plugin) and the processes in the job's cgroup (/proc/PID/cgroup: slurm's cgroup paths hold
  `job_J`, `/slurm/uid_U/job_J/step_S` with cgroup v1, `/.../slurmstepd.scope/job_J/step_S` with v2) and
  their descendants (a torchrun worker in a session of its own escapes proctrack/pgid's list) -- owned
  by the job's user (--uid: the UserId of `scontrol show job`; the probe's own uid when not given). A process
  that only sets SLURM_JOB_ID=J in its environment is no member: anyone can set a variable, and another user's
  process listed as the job's could claim an idle GPU (issue 35 item 4). Only where SLURM says nothing at all
  (no listpids answer, no job cgroup on the node) is the environment read instead, still for the job user's
  processes only. The probe's own step is left out (its SLURM_STEP_ID, and its own ancestors). Of each:
  parent, user, command line (redacted as batch script words are: gpudoctor/redact.redact_words), the
  variables in samples.ENV_KEYS only (environments hold secrets), and its CPU time at the start and the end of
  the window (/proc/PID/stat utime+stime).
- With py-spy on PATH, the Python stack of each of the job's training processes that made no progress on the
  CPU during a window of 10 s or more (`py-spy dump --nonblocking`: the process is not paused).
- NVML, for the GPUs the job holds on this node (--gpus, from scontrol show job -d on the login node), every
  1/--rate seconds for --for seconds: utilization, memory used, SM clock, clock event reasons, power,
  temperature and the processes with a context; the owners of processes that are not the job's.

Bounded: the window is at most MAX_WINDOW_S, samples at most MAX_RATE_HZ and MAX_SAMPLES per GPU; every command through
probe/proc.run_bounded. Nothing here raises: what cannot be read is said in the output.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import shutil
import socket
import stat
import subprocess
import sys
import time

from gpudoctor.probe.proc import run_bounded
from gpudoctor.readers.ints import int_option, number_option
from gpudoctor.redact import redact_text, redact_words
from gpudoctor.watch.samples import (
    ENV_KEYS,
    NO_PROGRESS_SHARE,
    GpuSample,
    GpuTrace,
    JobProcess,
    NodeObservation,
    heartbeat_file,
)

MAX_WINDOW_S = 3600.0
MAX_RATE_HZ = 10.0
MAX_SAMPLES = 3600  # per GPU and window: a longer window is sampled less often (about 1 MiB of JSON per GPU)
MAX_CMDLINE = 4096
MAX_ENVIRON = 1 << 20
LISTPIDS_TIMEOUT_S = 5.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _read(path: str, limit: int) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return None


def _environ(pid: int) -> dict[str, str] | None:
    raw = _read(f"/proc/{pid}/environ", MAX_ENVIRON)
    if raw is None:
        return None
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return out


def _stat(pid: int) -> tuple[int | None, float | None]:
    """(parent PID, user+system CPU seconds) from /proc/PID/stat (fields after the command's closing ')')."""
    raw = _read(f"/proc/{pid}/stat", 4096)
    if raw is None:
        return None, None
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        return int(fields[1]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    except (IndexError, ValueError):
        return None, None


def _uid(pid: int) -> int | None:
    """The process's real uid (/proc/PID/status `Uid:`, its first field): whose process it is, whatever
    /proc/PID's own owner says (root for a process that made itself not dumpable)."""
    raw = _read(f"/proc/{pid}/status", 8192)
    for line in (raw or b"").decode("utf-8", "replace").splitlines():
        fields = line.split()
        if fields[:1] == ["Uid:"] and len(fields) > 1 and fields[1].isdigit() and fields[1].isascii():
            return int(fields[1])
    return None


def _user(pid: int) -> str | None:
    uid = _uid(pid)
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _cmdline(pid: int) -> list[str]:
    raw = _read(f"/proc/{pid}/cmdline", MAX_CMDLINE) or b""
    words = [w.decode("utf-8", "replace") for w in raw.split(b"\0") if w]
    return list(redact_words(words))


def _ancestors(pid: int) -> set[int]:
    out = set()
    while pid > 1 and pid not in out:
        out.add(pid)
        parent, _ = _stat(pid)
        if parent is None:
            break
        pid = parent
    return out


def listpids(job: str) -> dict[int, str]:
    """{pid: step} from `scontrol listpids JOB` on this node; {} when it cannot say."""
    try:
        r = run_bounded(["scontrol", "listpids", job], LISTPIDS_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out = {}
    for line in r.stdout.splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 3 and parts[0].isdigit() and parts[0].isascii() and _same_job(parts[1], job):
            out[int(parts[0])] = parts[2]
    return out


def _same_job(listed: str, job: str) -> bool:
    """listpids' JOBID column names the job asked for: its id (`46`), or, for a het job's component, the het
    job and offset (`45+1`, which `scontrol listpids 46` prints for component 46: only that job is listed)."""
    return listed == job or listed.split("+")[0] == job.split("_")[0] or "+" in listed


# slurm's cgroup paths (task/cgroup, proctrack/cgroup): v1 `/slurm/uid_U/job_J/step_S/task_T`, v2
# `/system.slice/slurmstepd.scope/job_J/step_S/user/task_T` (slurm's cgroup_v2 plugin), the slurm directory
# possibly renamed (`/slurm_NODE/` with several slurmd on one host). Never under a user's own delegated slice.
_SLURM_CGROUP = re.compile(r"/(?:slurm[^/]*|slurmstepd\.scope)/(?:uid_\d+/)?job_(\d+)(?:/|$)")


def cgroup_job(pid: int) -> str | None:
    """The SLURM job whose cgroup holds pid (/proc/PID/cgroup), None when none does or it cannot be read."""
    raw = _read(f"/proc/{pid}/cgroup", 8192)
    for line in (raw or b"").decode("utf-8", "replace").splitlines():
        path = line.split(":", 2)[-1]
        m = _SLURM_CGROUP.search(path)
        if m and not path.startswith("/user.slice"):
            return m.group(1)
    return None


def job_processes(job: str, uid: int | None = None) -> list[JobProcess]:
    """The job's processes on this node (the module docstring's rule): members by SLURM's word -- listed, in
    the job's cgroup, or descended from such a process (a torchrun worker started in a session of its own
    escapes proctrack/pgid's list, not its parent) -- owned by uid (the job's user; this probe's own uid when
    None)."""
    own_step = os.environ.get("SLURM_STEP_ID") if os.environ.get("SLURM_JOB_ID") == job else None
    owner = os.getuid() if uid is None else uid
    mine = _ancestors(os.getpid())
    listed = listpids(job)
    job_id = job.split("_")[0]
    pids = [int(n) for n in os.listdir("/proc") if n.isdigit() and n.isascii() and int(n) not in mine]
    owned = [pid for pid in pids if _uid(pid) == owner]  # another user's process is never the job's
    members = set(listed) | {pid for pid in owned if cgroup_job(pid) == job_id}
    slurm_says = bool(members)
    stats = {pid: _stat(pid) for pid in owned}
    if slurm_says:
        members |= {pid for pid in owned if _descends(pid, members, stats)}
    found: dict[int, JobProcess] = {}
    for pid in owned:
        env = _environ(pid)
        if slurm_says:
            if pid not in members:
                continue
            env = env or {}
            step = listed.get(pid) or env.get("SLURM_STEP_ID")
            if own_step is not None and step == own_step:
                continue
        elif env is None or env.get("SLURM_JOB_ID") != job:
            continue
        elif own_step is not None and env.get("SLURM_STEP_ID") == own_step:
            continue
        ppid, cpu = stats[pid]
        if cpu is None:  # exited meanwhile
            continue
        found[pid] = JobProcess(
            pid=pid,
            ppid=ppid,
            user=_user(pid),
            cmdline=tuple(_cmdline(pid)),
            env={k: env[k] for k in ENV_KEYS if k in env},
            cpu_seconds_start=cpu,
        )
    return [found[p] for p in sorted(found)]


def _descends(pid: int, members: set[int], stats: dict[int, tuple[int | None, float | None]]) -> bool:
    """Whether a parent of pid, up the chain of the job user's processes, is one of members."""
    seen = {pid}
    parent = stats[pid][0]
    while parent is not None and parent > 1 and parent not in seen and parent in stats:
        if parent in members:
            return True
        seen.add(parent)
        parent = stats[parent][0]
    return False


def _with_end_cpu(processes: list[JobProcess]) -> list[JobProcess]:
    out = []
    for p in processes:
        _, cpu = _stat(p.pid)
        out.append(JobProcess(**{**p.__dict__, "cpu_seconds": cpu, "heartbeat": read_heartbeat(p)}))
    return out


HEARTBEAT_MAX_BYTES = 4096


def read_heartbeat(p: JobProcess) -> dict | None:
    """The heartbeat p's gpudoctor.watch.Monitor writes (monitor.heartbeat_path: gpudoctor-<uid>/heartbeat-<pid>.json
    under its temporary directory, TMPDIR, TEMP or TMP as tempfile.gettempdir reads them, else /tmp), with its age
    on this node's clock; None where it runs no Monitor or the file cannot be read (bounded: 4 KiB, no link)."""
    try:
        uid = os.stat(f"/proc/{p.pid}").st_uid
    except OSError:
        return None
    dirs = [p.env[k] for k in ("TMPDIR", "TEMP", "TMP") if p.env.get(k)] + ["/tmp"]
    for d in dirs:
        path = heartbeat_file(d, uid, p.pid)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            beat = json.loads(os.read(fd, HEARTBEAT_MAX_BYTES))
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)
        if not isinstance(beat, dict) or not isinstance(beat.get("time"), (int, float)):
            return None
        return {
            "step": beat.get("step"),
            "age_s": round(time.time() - float(beat["time"]), 3),
            "window_s": beat.get("window_s"),
            "closed": beat.get("closed") is True,
        }
    return None


# ---------------------------------------------------------------- NVML


def sample_gpus(indices: list[int], window_s: float, rate_hz: float) -> tuple[list[GpuTrace], str | None]:
    """NVML samples of the given GPUs for the window; ([], error) when NVML cannot be read."""
    try:
        import pynvml as nvml

        nvml.nvmlInit()
    except (Exception, SystemExit) as e:  # no driver, no library, a shadowing module
        time.sleep(window_s)  # the window is still the window: CPU time is compared over it
        return [], f"NVML: {type(e).__name__}: {str(e)[:200]}"
    from gpudoctor.probe.nvidia import _Calls, _processes, _text

    try:
        call = _Calls(nvml)
        handles, static = {}, {}
        for i in indices:
            try:
                h = nvml.nvmlDeviceGetHandleByIndex(i)
            except nvml.NVMLError:
                continue  # not openable here (another job's GPU under a device cgroup): left unsampled
            handles[i] = h
            mem = call("nvmlDeviceGetMemoryInfo", h)
            limit = call("nvmlDeviceGetEnforcedPowerLimit", h)
            static[i] = {
                "name": _text(call("nvmlDeviceGetName", h)),
                "uuid": _text(call("nvmlDeviceGetUUID", h)),
                "sm_clock_max_mhz": call("nvmlDeviceGetMaxClockInfo", h, nvml.NVML_CLOCK_SM),
                "power_limit_w": None if limit is None else limit / 1000.0,
                "memory_total_bytes": None if mem is None else int(mem.total),
            }
        samples: dict[int, list[GpuSample]] = {i: [] for i in handles}
        start = time.monotonic()
        period = 1.0 / rate_hz
        while True:
            now = time.monotonic() - start
            for i, h in handles.items():
                util = call("nvmlDeviceGetUtilizationRates", h)
                mem = call("nvmlDeviceGetMemoryInfo", h)
                reasons = call("nvmlDeviceGetCurrentClocksEventReasons", h)
                if reasons is None:
                    reasons = call("nvmlDeviceGetCurrentClocksThrottleReasons", h)
                power = call("nvmlDeviceGetPowerUsage", h)
                procs = tuple((p["pid"], p["used_memory_bytes"]) for p in _processes(call, h) if p["type"] == "compute")
                samples[i].append(
                    GpuSample(
                        t=round(now, 3),
                        util_gpu=None if util is None else int(util.gpu),
                        mem_used_bytes=None if mem is None else int(mem.used),
                        sm_clock_mhz=call("nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_SM),
                        clock_event_reasons=None if reasons is None else int(reasons),
                        power_w=None if power is None else power / 1000.0,
                        temp_c=call("nvmlDeviceGetTemperature", h, nvml.NVML_TEMPERATURE_GPU),
                        processes=procs,
                    )
                )
            left = window_s - (time.monotonic() - start)
            if left <= 0:
                break
            time.sleep(min(period, left))
        traces = [GpuTrace(index=i, samples=tuple(samples[i]), **{k: v for k, v in static[i].items()}) for i in handles]
        return traces, None
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def _others(traces: list[GpuTrace], job_pids: set[int]) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for t in traces:
        for s in t.samples:
            for pid, _ in s.processes:
                if pid in job_pids or pid in out or not os.path.exists(f"/proc/{pid}"):
                    continue
                env = _environ(pid) or {}
                out[pid] = {"user": _user(pid), "cmdline": _cmdline(pid)[:20], "slurm_job": env.get("SLURM_JOB_ID")}
    return out


# ---------------------------------------------------------------- stacks of processes that made no progress

MAX_STACKS = 16
STACK_TIMEOUT_S = 5.0
MAX_STACK_BYTES = 16 * 1024


def stacks(processes: list[JobProcess], window_s: float) -> list[JobProcess]:
    """With py-spy on PATH and a window of HANG_MIN_WINDOW_S or more: `py-spy dump --nonblocking --pid P` (the
    process is not paused) of each training process of the job (judge.training_processes) that used under
    NO_PROGRESS_SHARE of a core over the window, at most MAX_STACKS of them. py-spy needs ptrace rights on the
    process (the job's own user; a container may forbid it): its error is kept."""
    from gpudoctor.watch.judge import HANG_MIN_WINDOW_S, training_processes

    spy = shutil.which("py-spy")
    if spy is None or window_s < HANG_MIN_WINDOW_S:
        return processes
    ranks = {p.pid for p in training_processes(tuple(processes))}  # not their helpers: idle DataLoader workers
    out, dumped = [], 0
    for p in processes:
        share = p.cpu_share(window_s)
        if dumped < MAX_STACKS and p.pid in ranks and share is not None and share < NO_PROGRESS_SHARE:
            dumped += 1
            try:
                r = run_bounded(
                    [spy, "dump", "--nonblocking", "--pid", str(p.pid)], STACK_TIMEOUT_S, max_output=MAX_STACK_BYTES
                )
                said = (
                    r.stdout if r.returncode == 0 else f"py-spy failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}"
                )
            except subprocess.TimeoutExpired:
                said = f"py-spy did not answer within {STACK_TIMEOUT_S:g} s"
            except OSError as e:
                said = f"cannot run py-spy: {e.strerror or e}"
            p = JobProcess(**{**p.__dict__, "stack": redact_text(said[:MAX_STACK_BYTES])})
        out.append(p)
    return out


def observe(
    job: str, node: str, allocated: list[int], window_s: float, rate_hz: float, uid: int | None = None
) -> NodeObservation:
    processes = job_processes(job, uid)
    traces, nvml_error = sample_gpus(allocated, window_s, rate_hz)
    processes = stacks(_with_end_cpu(processes), window_s)
    return NodeObservation(
        node=node,
        allocated=tuple(allocated),
        processes=tuple(processes),
        gpus=tuple(traces),
        nvml_error=nvml_error,
        others=_others(traces, {p.pid for p in processes}),
        window_s=window_s,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpudoctor.watch.node")
    p.add_argument("--job", required=True)
    p.add_argument("--for", dest="window", type=number_option(0.0, MAX_WINDOW_S), default=30.0)
    p.add_argument("--rate", type=number_option(0.0, MAX_RATE_HZ), default=1.0)
    p.add_argument("--allocation", default="{}", help="JSON {node: [GPU indices]} from scontrol show job -d")
    p.add_argument("--uid", type=int_option(low=0), default=None, help="the job's user (scontrol's UserId=)")
    args = p.parse_args(argv)
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    try:
        allocation = json.loads(args.allocation)
        allocated = [int(i) for i in allocation.get(node, [])]
    except (ValueError, TypeError, AttributeError):
        allocated = []
    window = min(max(args.window, 0.0), MAX_WINDOW_S)
    rate = min(max(args.rate, 0.01), MAX_RATE_HZ, MAX_SAMPLES / window if window else MAX_RATE_HZ)
    try:
        obs = observe(args.job, node, allocated, window, rate, args.uid)
    except Exception as e:  # the login side reports this node as not observed, with the reason
        obs = NodeObservation(node=node, allocated=tuple(allocated), error=f"the probe failed: {type(e).__name__}: {e}")
    sys.stdout.write(json.dumps(obs.to_dict(), separators=(",", ":")) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
