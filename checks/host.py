"""host checks: the machine around the GPUs - memory, /dev/shm, locked-memory limits for RDMA."""

from __future__ import annotations

from gpudoctor.model import manual, passed, skip, warn
from gpudoctor.readers import cudavis
from gpudoctor.registry import check
from gpudoctor.units import GIB, MIB

# Host RAM per byte of GPU memory. Below 1x a process cannot even stage one full copy of what the GPUs
# hold (checkpoint loading goes through CPU memory, pinned buffers and dataloader workers come on top);
# NVIDIA's own DGX/HGX systems ship with about 2x or more (DGX H100: 2 TiB for 640 GB of GPU memory).
RAM_MIN_RATIO = 1.0
RAM_GOOD_RATIO = 2.0
DOCKER_DEFAULT_SHM = 64 * MIB
SHM_MIN_BYTES = 1 * GIB  # a few prefetched batches per DataLoader worker already exceed Docker's 64 MiB


def _usable_ram(host: dict) -> tuple[int | None, str]:
    """Physical RAM, or the container's/SLURM job's cgroup limit when that is lower."""
    total = host.get("mem_total_bytes")
    limit = (host.get("container") or {}).get("memory_limit_bytes")
    if limit and (not total or limit < total):
        return limit, "cgroup memory limit (container or SLURM --mem)"
    return total, "physical RAM"


def _gib(n: int) -> str:
    return f"{n / GIB:.0f} GiB" if n >= 10 * GIB else f"{n / GIB:.1f} GiB"


@check(
    id="GD-HOST-001",
    name="host-ram-too-small",
    category="host",
    title="Enough host memory for the GPUs",
    needs=["host", "nvidia", "env"],
    requires=["job-gpus"],
    what="Compares the memory this process may use (physical RAM, or the cgroup limit of a container or SLURM job "
    "when lower) with the total memory of the job's GPUs. Below 1x is flagged; NVIDIA's own GPU servers ship "
    "with about 2x (a DGX H100 has 2 TiB of RAM for 640 GB of GPU memory).",
    why="Checkpoints are loaded through host memory, every rank keeps its own copy of the model on the CPU while "
    "starting, and pinned buffers and DataLoader workers come on top: with less RAM than GPU memory, ranks are "
    "killed by the OOM killer (often seen only as 'exitcode -9' or a SLURM OUT_OF_MEMORY) during start-up or "
    "checkpointing.",
    fix="Request more memory (`#SBATCH --mem=0` gives the job the whole node's memory, or `--mem-per-gpu`), raise "
    "the container's memory limit, or load checkpoints with mmap=True / rank by rank.",
)
def host_ram_too_small(facts, ctx):
    gpus = cudavis.job_gpus(facts)
    gpu_mem = sum(g.get("memory_total_bytes") or 0 for g in gpus)
    ram, source = _usable_ram(facts.host)
    if not gpu_mem:
        return skip("the GPUs' memory size is unknown")
    if not ram:
        return skip("host memory size unknown")
    ratio = ram / gpu_mem
    evidence = {
        "usable_ram_bytes": ram,
        "ram_source": source,
        "gpu_memory_bytes": gpu_mem,
        "gpus": len(gpus),
        "ratio": round(ratio, 2),
    }
    summary = f"{_gib(ram)} of {source} for {len(gpus)} GPU(s) with {_gib(gpu_mem)} in total ({ratio:.1f}x)"
    if ratio < RAM_MIN_RATIO:
        return warn(
            f"{summary}: less host memory than GPU memory - ranks "
            "risk the OOM killer while loading checkpoints or data",
            manual(
                "Request more host memory for the job",
                "#SBATCH --mem=0   (the whole node's memory)",
                "docker run --memory=<size> ...",
            ),
            **evidence,
        )
    if ratio < RAM_GOOD_RATIO:
        return passed(f"{summary}: enough, though GPU servers usually have 2x", **evidence)
    return passed(summary, **evidence)


@check(
    id="GD-HOST-002",
    name="shm-too-small",
    category="host",
    title="/dev/shm is large enough for DataLoader workers",
    needs=["host"],
    what="Reads the size of /dev/shm, where PyTorch DataLoader worker processes put the batches they hand to the "
    "training process. Docker gives containers 64 MiB unless told otherwise.",
    why="When /dev/shm fills up, workers die with 'Bus error' or 'unable to write to file </torch_...>: No space left "
    "on device' - typically minutes into the first epoch, with num_workers > 0.",
    fix="Docker: `--shm-size=16g` or `--ipc=host`; Kubernetes: mount an emptyDir with medium: Memory at /dev/shm. "
    "As a stopgap, num_workers=0 avoids shared memory (slowly).",
)
def shm_too_small(facts, ctx):
    shm = facts.host.get("shm")
    container = (facts.host.get("container") or {}).get("in_container")
    fix = manual(
        "Give the container a larger /dev/shm", "docker run --shm-size=16g ...   (or --ipc=host)", "df -h /dev/shm"
    )
    if not shm:
        return warn(
            "/dev/shm is missing or unreadable: DataLoader workers cannot share batches with the training process",
            fix,
            shm=shm,
        )
    total = shm.get("total_bytes") or 0
    evidence = {"shm_total_bytes": total, "shm_free_bytes": shm.get("free_bytes"), "in_container": container}
    if total < SHM_MIN_BYTES:
        docker = " (Docker's default)" if total == DOCKER_DEFAULT_SHM else ""
        return warn(
            f"/dev/shm is only {total / MIB:.0f} MiB{docker}: DataLoader workers die with 'Bus error' under load",
            fix,
            **evidence,
        )
    free = shm.get("free_bytes")
    if free is not None and free < SHM_MIN_BYTES:
        return warn(
            f"/dev/shm has {_gib(total)} but only {free / MIB:.0f} MiB free: something else fills it (stale "
            "/dev/shm/torch_* files?)",
            manual("Look at what fills /dev/shm", "ls -la /dev/shm", "df -h /dev/shm"),
            **evidence,
        )
    return passed(f"/dev/shm is {_gib(total)}", **evidence)


@check(
    id="GD-HOST-003",
    name="memlock-limited-with-infiniband",
    category="host",
    title="Locked-memory limit allows RDMA (InfiniBand/RoCE)",
    needs=["host", "network"],
    what="On machines with InfiniBand/RoCE ports, checks that the locked-memory limit (`ulimit -l`) is unlimited.",
    why="RDMA must pin (lock) the buffers it registers with the network card. With a small memlock limit (often "
    "64 KiB or 8 MiB in containers and under SLURM) memory registration fails: NCCL's IB transport errors out "
    "('ibv_reg_mr failed' / 'Cannot allocate memory') or NCCL silently falls back to TCP sockets at a fraction "
    "of the bandwidth.",
    fix="Set `* - memlock unlimited` in /etc/security/limits.conf (and restart slurmd, whose limit jobs inherit); "
    "Docker: `--ulimit memlock=-1`; check with `ulimit -l` inside the job.",
)
def memlock_limited_with_infiniband(facts, ctx):
    ports = facts.network.get("infiniband") or []
    if not ports:
        return passed("no InfiniBand/RoCE ports: the locked-memory limit does not matter")
    active = [p for p in ports if (p.get("state") or "").upper() == "ACTIVE"]
    limits = facts.host.get("ulimits") or {}
    soft, hard = limits.get("memlock_soft"), limits.get("memlock_hard")
    evidence = {
        "memlock_soft": soft,
        "memlock_hard": hard,
        "ib_ports": [f"{p.get('device')}/{p.get('port')} {p.get('state')}" for p in ports],
    }
    if soft is None:
        return skip("locked-memory limit unknown", **evidence)
    if soft == -1:
        return passed(f"memlock unlimited; {len(ports)} RDMA port(s)", **evidence)
    if not active:
        return passed(
            f"{len(ports)} RDMA port(s), none active: NCCL will not use them (memlock limit {soft} bytes)", **evidence
        )
    shown = f"{soft // 1024} KiB" if soft < MIB else f"{soft // MIB} MiB"
    return warn(
        f"locked-memory limit is {shown} (ulimit -l) on a machine with {len(active)} active RDMA port(s): NCCL's "
        "InfiniBand transport cannot register its buffers and fails or falls back to TCP",
        manual(
            "Raise the memlock limit to unlimited",
            "ulimit -l unlimited   (if the hard limit allows)",
            "/etc/security/limits.conf: * - memlock unlimited",
            "docker run --ulimit memlock=-1 ...",
        ),
        **evidence,
    )
