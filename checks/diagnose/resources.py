"""Signatures of resources running out: /dev/shm, host memory, open files, GPU memory, disk (diagnose)."""

from gpudoctor.checks.diagnose._signature import JUDGED_BY, Signature, verdicts
from gpudoctor.registry import declare

_DATA = "https://pytorch.org/docs/stable/data.html#multi-process-data-loading"

SIGNATURES = (
    Signature(
        id="GD-DIAG-026",
        name="log-dataloader-shm-bus-error",
        category="dataloader",
        title="DataLoader workers have enough shared memory",
        keys=(
            "Unexpected bus error encountered in worker",
            "killed by signal: Bus error",
            "insufficient shared memory",
            "unable to allocate shared memory(shm)",
            "exitcode  : -7",
            "exitcode: -7",
            "Signals.SIGBUS",
            "Signal 7 (SIGBUS)",
            "Bus error (core dumped)",
        ),
        cause="a DataLoader worker ran out of shared memory: /dev/shm is too small for the batches it hands over",
        why="DataLoader workers pass batches through shared memory (/dev/shm); when it fills (a container's 64 MB, "
        "a small tmpfs, many workers with big batches) the worker touching a new page gets SIGBUS, or (torch >= "
        "2.1, which preallocates the segment) fails with 'unable to allocate shared memory(shm)'.",
        fix="Give /dev/shm room (docker --ipc=host or --shm-size=16g; a larger tmpfs), or fewer num_workers / "
        "smaller prefetch_factor.",
        source=_DATA,
        check=("GD-DL-005", "GD-HOST-002"),
    ),
    Signature(
        id="GD-DIAG-027",
        name="log-host-oom-kill",
        category="host",
        title="The job's tasks stay within their memory",
        keys=("oom_kill event", "oom-kill", "Out of memory: Killed process", "OOM Killed", "Out Of Memory"),
        pattern=r"Detected (?P<count>\d+) oom[_-]kill event|oom-kill|Out of memory: Killed process|OOM Killed"
        r"|tasks? [\d,-]+: Out Of Memory",
        cause="the kernel's OOM killer ended a task: the job used more host memory than it was given",
        why="SLURM's cgroup (or the node) limits the job's memory; DataLoader workers copying the dataset, pinned "
        "memory, or loading a checkpoint on every rank at once go past it, and the kernel kills a process "
        "(slurmstepd reports the oom_kill event).",
        fix="Ask for more memory (#SBATCH --mem=0 for the whole node, or --mem-per-gpu), use fewer DataLoader "
        "workers, load checkpoints with mmap=True / on one rank at a time.",
        source="https://slurm.schedmd.com/cgroup.conf.html",
        check=("GD-HOST-001",),
    ),
    Signature(
        id="GD-DIAG-028",
        name="log-too-many-open-files",
        category="host",
        title="The job stays within its open-files limit",
        keys=("Too many open files", "received 0 items of ancdata"),
        cause="the process ran out of file descriptors (open-files limit; DataLoader's file_descriptor sharing)",
        why="DataLoader workers share tensors through file descriptors by default; many workers, prefetching or "
        "datasets holding files open exhaust RLIMIT_NOFILE (`ulimit -n`).",
        fix="Raise the limit (`ulimit -n 65536` in the batch script) or use "
        "torch.multiprocessing.set_sharing_strategy('file_system').",
        source="https://pytorch.org/docs/stable/multiprocessing.html#sharing-strategies",
    ),
    Signature(
        id="GD-DIAG-029",
        name="log-cuda-out-of-memory",
        category="allocator",
        title="The model and batch fit in GPU memory",
        keys=(
            "CUDA out of memory",
            "OutOfMemoryError",
            "CUBLAS_STATUS_ALLOC_FAILED",
            "CUDA error: out of memory",
            "CUDA driver error: out of memory",
            "Cuda failure 'out of memory'",
        ),
        pattern=r"(?:CUDA out of memory|OutOfMemoryError|ALLOC_FAILED|CUDA (?:driver )?error: out of memory"
        r"|Cuda failure 'out of memory')"
        r"(?:.*?GPU (?P<gpu>\d+))?",
        cause="GPU memory ran out (the batch, the model or activations do not fit on the GPU)",
        why="The caching allocator could not get the memory asked for: the batch or model is too large for the "
        "GPU, memory is fragmented, or another process holds part of the GPU.",
        fix="Smaller per-GPU batch (gradient accumulation keeps the global batch), activation checkpointing, "
        "mixed precision; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation.",
        source="https://pytorch.org/docs/stable/notes/cuda.html#memory-management",
        check=("GD-DEV-007",),
    ),
    Signature(
        id="GD-DIAG-030",
        name="log-no-space-left",
        category="host",
        title="The job's file systems have room for what it writes",
        keys=("No space left on device", "PytorchStreamWriter failed writing", "unexpected pos"),
        pattern=r"No space left on device|PytorchStreamWriter failed writing|inline_container.cc.*unexpected pos",
        cause="a file system was full (checkpoints, /tmp, a cache, or /dev/shm)",
        why="Writing a checkpoint, a compile cache or a dataset cache to a full file system fails with ENOSPC; "
        "torch.save's zip writer says it as 'PytorchStreamWriter failed writing file' or 'unexpected pos N vs M'.",
        fix="Write checkpoints and caches (TRITON_CACHE_DIR, HF_HOME, TMPDIR) to a file system with room; clean "
        "old checkpoints.",
        source="https://github.com/pytorch/pytorch/issues/76108",
    ),
    Signature(
        id="GD-DIAG-031",
        name="log-killed-by-sigkill",
        category="host",
        title="No rank is killed by SIGKILL",
        keys=(
            "exitcode  : -9",
            "exitcode: -9",
            "Signals.SIGKILL",
            "killed by signal: Killed",
            "Signal 9 (SIGKILL)",
            "return code = -9",
            "Killed",
        ),
        pattern=r"exitcode\s*: -9\b|SIGKILL|killed by signal: Killed|return code = -9|^\s*Killed\s*$|\d+ Killed\s",
        role="hint",
        cause="a process was killed by SIGKILL (most often the kernel's OOM killer: host memory)",
        why="SIGKILL cannot be caught: the kernel's OOM killer, SLURM ending a step, or an administrator sent it. "
        "Without an oom_kill line or a time limit in the log, host memory is the usual cause.",
        fix="Check `sacct -j JOBID -o JobID,State,MaxRSS,ReqMem` and dmesg on the node; ask for more memory or use "
        "fewer DataLoader workers.",
        source="https://man7.org/linux/man-pages/man7/signal.7.html",
        check=("GD-HOST-001",),
    ),
)

declare(verdicts(SIGNATURES), source="diagnose", judged_by=JUDGED_BY)
