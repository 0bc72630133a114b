"""Where a job's ranks are: world size, ranks on this node, nodes, read from the launcher's variables.

Pure: reads the job's environment (gpudoctor.job.env: this process's plus what a --sbatch script
exports) and the user's intent (Context), never the machine. Shared by the distributed, nccl and dataloader checks,
which all need "how many processes, on how many nodes" and must say where each number came from.

Sources, first that answers:
- world size: WORLD_SIZE (set by torchrun, Lightning, accelerate, deepspeed); SLURM_NTASKS
  when srun starts one task per rank (--launcher srun|lightning, or RANK equals
  SLURM_PROCID); ranks per node x nodes.
- ranks on this node: LOCAL_WORLD_SIZE; SLURM's tasks on this node when srun starts one
  task per rank; torchrun's --nproc-per-node on the --sbatch launch line; --expect-gpus;
  the GPUs this process can see when the launcher starts one rank per GPU (torchrun,
  lightning, accelerate, deepspeed).
- nodes: SLURM_STEP_NUM_NODES / SLURM_NNODES / SLURM_JOB_NUM_NODES; torchrun's
  GROUP_WORLD_SIZE; WORLD_SIZE / LOCAL_WORLD_SIZE.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from gpudoctor.job.env import job_env
from gpudoctor.model import PER_GPU_LAUNCHERS, Severity
from gpudoctor.readers.ints import python_int

# Evidence key of a finding that is a problem only when the job's ranks run on more than one host (a loopback
# MASTER_ADDR, NCCL_SOCKET_IFNAME=lo): `check --job` knows every rank's host and drops it when they share one.
SEVERAL_HOSTS_ONLY = "several_hosts_only"


def mark_several_hosts(result):
    """The outcome(s) of a check, each problem marked as one that exists only across hosts (SEVERAL_HOSTS_ONLY)."""
    if isinstance(result, list):
        return [mark_several_hosts(o) for o in result]
    if result.severity in (Severity.PASS, Severity.SKIP):
        return result
    return replace(result, evidence={**result.evidence, SEVERAL_HOSTS_ONLY: True})


def env_int(env: Mapping[str, str], name: str) -> int | None:
    """The variable as Python's int() reads it (what torch does), None when unset or not a number."""
    return python_int(env.get(name))


def tasks_on_node(value: str | None, node_index: int = 0) -> int | None:
    """SLURM_TASKS_PER_NODE ('2(x3),1') -> the task count of node number node_index; None if unreadable."""
    from gpudoctor.readers.slurmfmt import SlurmFormatError, parse_tasks_per_node

    if not value:
        return None
    try:
        counts = parse_tasks_per_node(value)
    except SlurmFormatError:
        return None
    return counts[node_index] if 0 <= node_index < len(counts) else None


@dataclass(frozen=True)
class Known:
    """A number and where it came from ('WORLD_SIZE', '--expect-gpus', 'assumed', ...)."""

    value: int | None
    source: str | None = None

    @property
    def known(self) -> bool:
        return self.value is not None


UNKNOWN = Known(None, None)


@dataclass(frozen=True)
class Layout:
    world_size: Known
    local_ranks: Known  # ranks (processes) on this node
    nodes: Known
    under_torchrun: bool  # an elastic agent started this process (TORCHELASTIC_RUN_ID)
    srun_per_rank: bool  # srun started one task per rank; each task is a rank

    @property
    def multi_node(self) -> bool:
        return bool(self.nodes.value and self.nodes.value > 1)

    @property
    def multi_process(self) -> bool:
        return bool((self.world_size.value or 0) > 1 or (self.local_ranks.value or 0) > 1 or self.multi_node)

    def evidence(self) -> dict:
        def show(k: Known):
            return None if k.value is None else f"{k.value} ({k.source})"

        return {"world_size": show(self.world_size), "ranks_on_node": show(self.local_ranks), "nodes": show(self.nodes)}


def intended_launcher(ctx) -> str | None:
    """--launcher, else the launcher of --sbatch's training line ('srun python train.py' counts as srun)."""
    if ctx.launcher:
        return ctx.launcher
    launch = ctx.sbatch.launch if ctx.sbatch is not None else None
    if launch is None:
        return None
    name = launch.launcher
    if name in ("torchrun", "torch.distributed.launch"):
        return "torchrun"
    if name in PER_GPU_LAUNCHERS:
        return name
    return "srun" if launch.srun is not None else None


def _script_ranks_per_node(ctx) -> int | None:
    """torchrun/deepspeed --nproc-per-node on --sbatch's training line (accelerate's count is a total)."""
    launch = ctx.sbatch.launch if ctx.sbatch is not None else None
    value = launch.nproc_per_node if launch else None
    return int(value) if value is not None and str(value).isdigit() and int(value) > 0 else None


def in_srun_step(env: Mapping[str, str]) -> bool:
    """This process is a task of an srun job step (not the batch script itself)."""
    return "SLURM_PROCID" in env and ("SLURM_STEP_ID" in env or "SLURM_STEPID" in env)


def _srun_per_rank(env: dict, launcher: str | None) -> bool:
    """srun starts each rank as its own task."""
    if "TORCHELASTIC_RUN_ID" in env or launcher in ("torchrun", "accelerate", "deepspeed"):
        return False
    if launcher in ("srun", "lightning"):
        return "SLURM_NTASKS" in env or "SLURM_PROCID" in env
    # No stated launcher: srun started several tasks and the rank variables follow SLURM's.
    rank, procid = env_int(env, "RANK"), env_int(env, "SLURM_PROCID")
    return in_srun_step(env) and rank is not None and rank == procid and (env_int(env, "SLURM_NTASKS") or 1) > 1


def _slurm_tasks_here(env: dict) -> int | None:
    node = env_int(env, "SLURM_NODEID") or 0
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        n = tasks_on_node(env.get(name), node)
        if n is not None:
            return n
    return env_int(env, "SLURM_NTASKS_PER_NODE")


def _nodes(env: dict) -> Known:
    for name in ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES", "GROUP_WORLD_SIZE"):
        n = env_int(env, name)
        if n and n > 0:
            return Known(n, name)
    world, local = env_int(env, "WORLD_SIZE"), env_int(env, "LOCAL_WORLD_SIZE")
    if world and local and local > 0:
        return Known(-(-world // local), "WORLD_SIZE / LOCAL_WORLD_SIZE")
    return UNKNOWN


def _visible_gpus(facts) -> int | None:
    count = facts.torch.get("device_count") if facts.torch.get("status") == "ok" else None
    if count:
        return count
    if facts.nvidia.get("available") and facts.gpus:
        from gpudoctor.readers.cudavis import from_facts

        return from_facts(facts).count
    return None


def _local_ranks(facts, ctx, env: dict, srun_per_rank: bool) -> Known:
    n = env_int(env, "LOCAL_WORLD_SIZE")
    if n and n > 0:
        return Known(n, "LOCAL_WORLD_SIZE")
    if srun_per_rank:
        n = _slurm_tasks_here(env)
        if n:
            return Known(n, "SLURM tasks on this node")
    n = _script_ranks_per_node(ctx)
    if n:
        return Known(n, "ranks per node on the batch script's launch line")
    if ctx.expect_gpus:
        return Known(ctx.expect_gpus, "--expect-gpus")
    launcher = intended_launcher(ctx)
    if launcher in PER_GPU_LAUNCHERS and ctx.gpus_expected:
        n = _visible_gpus(facts)
        if n:
            return Known(n, f"GPUs visible here ({launcher} starts one rank per GPU)")
    return UNKNOWN


def _world_size(env: dict, srun_per_rank: bool, local: Known, nodes: Known) -> Known:
    n = env_int(env, "WORLD_SIZE")
    if n and n > 0:
        return Known(n, "WORLD_SIZE")
    if srun_per_rank:
        n = env_int(env, "SLURM_NTASKS")
        if n and n > 0:
            return Known(n, "SLURM_NTASKS")
    if local.value is not None and nodes.value is not None:
        return Known(local.value * nodes.value, f"{local.source} x {nodes.source}")
    return UNKNOWN


def layout(facts, ctx) -> Layout:
    env = job_env(facts, ctx)
    per_rank = _srun_per_rank(env, intended_launcher(ctx))
    nodes = _nodes(env)
    local = _local_ranks(facts, ctx, env, per_rank)
    if not nodes.known and local.known and not any(k in env for k in ("WORLD_SIZE", "SLURM_JOB_ID")):
        nodes = Known(1, "assumed: no multi-node launcher or SLURM variables")
    world = _world_size(env, per_rank, local, nodes)
    return Layout(
        world_size=world,
        local_ranks=local,
        nodes=nodes,
        under_torchrun="TORCHELASTIC_RUN_ID" in env,
        srun_per_rank=per_rank,
    )


def before_submission(facts, ctx) -> bool:
    """--sbatch given outside any SLURM job: this host is the submit host, not where the job runs
    (unless the facts are a --node-snapshot recorded on the job's node)."""
    return bool(ctx.sbatch) and "SLURM_JOB_ID" not in facts.env and not getattr(ctx, "node_facts", None)
