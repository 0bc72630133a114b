"""What `gpudoctor watch` observes on one node, as plain data: the job's processes and per-GPU NVML samples.

The node probe (node.py) writes one NodeObservation as JSON; the judge (judge.py) reads it back. A GPU's
samples use the field names of the recorded NVML traces (tests/fixtures/watch/, recorded on an H200 with
nvidia-ml-py): util_gpu (%), mem_used_bytes, sm_clock_mhz, clock_event_reasons (NVML's bitmask), power_w,
temp_c, processes [{pid, used_memory_bytes}]; t is seconds since the first sample. `--log FILE` writes the same
lines, so a log can be judged again and a recorded trace read like a live window.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

from gpudoctor.readers.ints import whole_number
from gpudoctor.redact import redact_text, redact_words

_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?$")
NO_PROGRESS_SHARE = 0.02  # of one core over a window: a process that made no progress (judge and node probe)


@dataclass(frozen=True)
class GpuSample:
    t: float
    util_gpu: int | None = None
    mem_used_bytes: int | None = None
    sm_clock_mhz: int | None = None
    clock_event_reasons: int | None = None
    power_w: float | None = None
    temp_c: int | None = None
    processes: tuple[tuple[int, int | None], ...] = ()  # (pid, used memory bytes)

    @classmethod
    def from_dict(cls, d: dict) -> GpuSample:
        procs = tuple((int(p["pid"]), whole_number(p.get("used_memory_bytes"))) for p in d.get("processes") or ())
        return cls(
            t=float(d.get("t") or 0.0),
            util_gpu=whole_number(d.get("util_gpu")),
            mem_used_bytes=whole_number(d.get("mem_used_bytes")),
            sm_clock_mhz=whole_number(d.get("sm_clock_mhz")),
            clock_event_reasons=whole_number(d.get("clock_event_reasons")),
            power_w=_float(d.get("power_w")),
            temp_c=whole_number(d.get("temp_c")),
            processes=procs,
        )

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("t", "util_gpu", "mem_used_bytes", "sm_clock_mhz", "clock_event_reasons")}
        d.update(power_w=self.power_w, temp_c=self.temp_c)
        d["processes"] = [{"pid": pid, "used_memory_bytes": used} for pid, used in self.processes]
        return d


@dataclass(frozen=True)
class GpuTrace:
    """One GPU's static facts and its samples over the window. index: the node's GPU index (NVML's, which is
    SLURM's when gres.conf lists the GPUs in PCI order, as AutoDetect=nvml does)."""

    index: int
    name: str | None = None
    uuid: str | None = None
    sm_clock_max_mhz: int | None = None
    power_limit_w: float | None = None
    memory_total_bytes: int | None = None
    samples: tuple[GpuSample, ...] = ()

    @classmethod
    def from_dict(cls, d: dict) -> GpuTrace:
        static = d.get("static") or {}
        return cls(
            index=int(d["index"]),
            name=static.get("name"),
            uuid=static.get("uuid"),
            sm_clock_max_mhz=whole_number(static.get("sm_clock_max_mhz")),
            power_limit_w=_float(static.get("power_limit_w")),
            memory_total_bytes=whole_number(static.get("memory_total_bytes")),
            samples=tuple(GpuSample.from_dict(s) for s in d.get("samples") or ()),
        )

    def static(self) -> dict:
        keys = ("name", "uuid", "sm_clock_max_mhz", "power_limit_w", "memory_total_bytes")
        return {k: getattr(self, k) for k in keys}

    def to_dict(self) -> dict:
        return {"index": self.index, "static": self.static(), "samples": [s.to_dict() for s in self.samples]}

    def window(self, start: float, end: float) -> GpuTrace:
        """The samples with start <= t < end (a phase of a recording), times kept."""
        kept = tuple(s for s in self.samples if start <= s.t < end)
        return GpuTrace(**{**self.__dict__, "samples": kept})


def heartbeat_file(tmpdir: str, uid: int, pid: int) -> str:
    """Where gpudoctor.watch.Monitor's rank `pid` of user `uid` writes its heartbeat under `tmpdir`: the one
    naming both the writer (monitor.heartbeat_path) and the outside reader (node.read_heartbeat) use."""
    return os.path.join(tmpdir, f"gpudoctor-{uid}", f"heartbeat-{pid}.json")


def _heartbeat(value) -> dict | None:
    """A heartbeat as the node probe reports it, its fields checked (None for anything else)."""
    if not isinstance(value, dict):
        return None
    step, age, window = whole_number(value.get("step")), _float(value.get("age_s")), _float(value.get("window_s"))
    if step is None or age is None or window is None or window <= 0:
        return None
    return {"step": step, "age_s": age, "window_s": window, "closed": value.get("closed") is True}


@dataclass(frozen=True)
class JobProcess:
    """A process of the job as /proc shows it on its node (environ values only those listed in ENV_KEYS)."""

    pid: int
    ppid: int | None = None
    user: str | None = None
    cmdline: tuple[str, ...] = ()
    env: dict = field(default_factory=dict)
    cpu_seconds: float | None = None  # user + system time at the end of the window
    cpu_seconds_start: float | None = None  # at its start
    stack: str | None = None  # `py-spy dump` of a Python process that made no progress, where py-spy is installed
    # Its gpudoctor.watch.Monitor's heartbeat at the window's end, where it runs one: the last step it counted
    # ("step"), how long before the window's end it wrote it ("age_s", the node's own clock), "window_s", "closed".
    heartbeat: dict | None = None

    @property
    def runs_python(self) -> bool:
        """Its own argv[0] is a Python interpreter (a console script such as torchrun shows the interpreter
        there, the kernel having run its #! line); never what a shell or wrapper would start."""
        return bool(self.cmdline) and bool(_PYTHON.match(os.path.basename(self.cmdline[0])))

    def cpu_share(self, window_s: float | None) -> float | None:
        """The share of one core it used over the window."""
        if self.cpu_seconds is None or self.cpu_seconds_start is None or not window_s:
            return None
        return max(0.0, self.cpu_seconds - self.cpu_seconds_start) / window_s

    @classmethod
    def from_dict(cls, d: dict) -> JobProcess:
        return cls(
            pid=int(d["pid"]),
            ppid=whole_number(d.get("ppid")),
            user=d.get("user"),
            # redacted again as read: an answer from another probe (or a hand-made one) holds no shown secret
            cmdline=redact_words([str(w) for w in d.get("cmdline") or ()]),
            env={str(k): str(v) for k, v in (d.get("env") or {}).items()},
            cpu_seconds=_float(d.get("cpu_seconds")),
            cpu_seconds_start=_float(d.get("cpu_seconds_start")),
            # py-spy's dump starts with the process's command line (`Process 12: python train.py --token ...`)
            stack=redact_text(d["stack"]) if isinstance(d.get("stack"), str) else None,
            heartbeat=_heartbeat(d.get("heartbeat")),
        )

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


# The variables the judge reads from a process's environment (nothing else is copied: environments hold secrets).
ENV_KEYS = (
    "CUDA_VISIBLE_DEVICES",
    # where its gpudoctor.watch.Monitor writes its heartbeat (tempfile.gettempdir's first choices)
    "TMPDIR",
    "TEMP",
    "TMP",
    "LOCAL_RANK",
    "RANK",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "SLURM_STEP_GPUS",
    "SLURM_JOB_GPUS",
    "SLURM_LOCALID",
    "SLURM_PROCID",
    # PyTorch's flight recorder (torch/csrc/distributed/c10d: the NCCL process group's trace buffer and its dump)
    "TORCH_NCCL_TRACE_BUFFER_SIZE",
    "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    "TORCH_FR_DUMP_TEMP_FILE",
)


@dataclass(frozen=True)
class NodeObservation:
    """One node's answer: the job's processes, the GPUs allocated there, their NVML traces (empty with
    nvml_error when NVML cannot be read) and the owners of other processes seen on those GPUs. error: the node
    did not answer (nothing else is known)."""

    node: str
    allocated: tuple[int, ...] = ()
    processes: tuple[JobProcess, ...] = ()
    gpus: tuple[GpuTrace, ...] = ()
    nvml_error: str | None = None
    others: dict = field(default_factory=dict)  # pid -> {user, cmdline, slurm_job}: processes on GPUs, not the job's
    window_s: float | None = None
    error: str | None = None

    @property
    def observed(self) -> bool:
        return self.error is None

    @classmethod
    def from_dict(cls, d: dict) -> NodeObservation:
        return cls(
            node=str(d["node"]),
            allocated=tuple(int(i) for i in d.get("allocated") or ()),
            processes=tuple(JobProcess.from_dict(p) for p in d.get("processes") or ()),
            gpus=tuple(GpuTrace.from_dict(g) for g in d.get("gpus") or ()),
            nvml_error=d.get("nvml_error"),
            others={int(k): _other(v) for k, v in (d.get("others") or {}).items()},
            window_s=_float(d.get("window_s")),
            error=d.get("error"),
        )

    def to_dict(self) -> dict:
        return {
            "node": self.node,
            "allocated": list(self.allocated),
            "processes": [p.to_dict() for p in self.processes],
            "gpus": [g.to_dict() for g in self.gpus],
            "nvml_error": self.nvml_error,
            "others": {str(k): v for k, v in self.others.items()},
            "window_s": self.window_s,
            "error": self.error,
        }


def _other(value) -> dict:
    """A process on the job's GPUs that is not the job's, its command line redacted again as read."""
    if not isinstance(value, dict):
        return {}
    words = value.get("cmdline")
    if isinstance(words, (list, tuple)):
        return {**value, "cmdline": list(redact_words([str(w) for w in words]))}
    return {k: v for k, v in value.items() if k != "cmdline"}


def read_trace(lines: list[str], index: int = 0) -> tuple[GpuTrace, list[str]]:
    """A recorded NVML trace (first line {"static": ...}, then one sample per line, each may carry "phase")
    as one GpuTrace, with the phase of each sample in order."""
    head = json.loads(lines[0])
    samples, phases = [], []
    for line in lines[1:]:
        if line.strip():
            d = json.loads(line)
            samples.append(GpuSample.from_dict(d))
            phases.append(str(d.get("phase") or ""))
    trace = GpuTrace.from_dict({"index": index, "static": head.get("static") or {}, "samples": []})
    return GpuTrace(**{**trace.__dict__, "samples": tuple(samples)}), phases


def log_lines(node: NodeObservation, job_id: str) -> list[str]:
    """`--log`: per GPU a static line, then one line per sample, in the recorded traces' format plus node/gpu."""
    out = []
    for g in node.gpus:
        out.append(json.dumps({"static": g.static(), "job": job_id, "node": node.node, "gpu": g.index}))
        out += [json.dumps({**s.to_dict(), "node": node.node, "gpu": g.index}) for s in g.samples]
    return out


def _float(v) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None
