"""Which distributed world this process is in: none (we spawn the ranks), torchrun's, or srun's.

Only environment variables are read here (no torch), so the CLI can decide cheaply.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

from gpudoctor.readers import slurmfmt


class WorldError(ValueError):
    """The launcher's variables are present but unusable: one line, exit 2."""


@dataclass(frozen=True)
class World:
    launcher: str  # torchrun | srun | env (RANK/WORLD_SIZE set by something else) | spawn
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    agent_store: bool  # torchrun's agent hosts the store; otherwise rank 0 does
    namespace: str  # store key prefix, unique per run/restart/step

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _int(env: dict, name: str, default: int | None = None) -> int:
    value = env.get(name)
    if value is None or value == "":
        if default is None:
            raise WorldError(f"{name} is not set")
        return default
    try:
        return int(value)
    except ValueError:
        raise WorldError(f"{name}={value!r} is not a whole number") from None


def detect(env: dict | None = None) -> World | None:
    """The launcher world this process belongs to, or None when no launcher started it."""
    env = dict(os.environ if env is None else env)
    if "RANK" in env and "WORLD_SIZE" in env:
        return _from_torch_env(env)
    if _is_srun_step(env):
        return _from_srun(env)
    return None


def _is_srun_step(env: dict) -> bool:
    # SLURM_STEP_NUM_TASKS is set by srun for each step; a batch script (SLURM_PROCID=0 of the
    # batch step) does not have it, so `gpudoctor smoke --gpus 2` inside sbatch still spawns.
    return "SLURM_PROCID" in env and _int(env, "SLURM_STEP_NUM_TASKS", 1) > 1


def _check_ranks(rank: int, world_size: int, local_rank: int, local_world_size: int, names: str) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise WorldError(f"{names}: rank {rank} is not within a world of {world_size}")
    if not 1 <= local_world_size <= world_size:
        raise WorldError(f"{names}: {local_world_size} local ranks on this node do not fit a world of {world_size}")
    if not 0 <= local_rank < local_world_size:
        raise WorldError(f"{names}: local rank {local_rank} is not within {local_world_size} local ranks")


def _from_torch_env(env: dict) -> World:
    rank, world_size = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    local_rank = _int(env, "LOCAL_RANK", 0)
    local_world_size = _int(env, "LOCAL_WORLD_SIZE", world_size if "LOCAL_RANK" not in env else local_rank + 1)
    _check_ranks(rank, world_size, local_rank, local_world_size, "RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE")
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if not env.get(name):
            raise WorldError(f"RANK and WORLD_SIZE are set but {name} is not: which launcher started this process?")
    torchrun = "TORCHELASTIC_RUN_ID" in env
    run_id = env.get("TORCHELASTIC_RUN_ID") or env.get("SLURM_JOB_ID") or "env"
    restart = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    return World(
        launcher="torchrun" if torchrun else "env",
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        master_addr=env["MASTER_ADDR"],
        master_port=_port(env["MASTER_PORT"]),
        agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
        namespace=f"gpudoctor-smoke/{run_id}/{restart}",
    )


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise WorldError(f"MASTER_PORT={text!r} is not a port number") from None
    if not 0 < port < 65536:
        raise WorldError(f"MASTER_PORT={port} is outside 1..65535")
    return port


def _from_srun(env: dict) -> World:
    rank, world_size = _int(env, "SLURM_PROCID"), _int(env, "SLURM_STEP_NUM_TASKS")
    local_rank = _int(env, "SLURM_LOCALID", 0)
    local_world_size = tasks_on_node(env)
    _check_ranks(rank, world_size, local_rank, local_world_size, "SLURM_PROCID/SLURM_STEP_NUM_TASKS/SLURM_LOCALID")
    job, step = _int(env, "SLURM_JOB_ID", 0), _int(env, "SLURM_STEP_ID", 0)
    if env.get("MASTER_ADDR"):
        addr = env["MASTER_ADDR"]
    else:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not nodelist:
            raise WorldError("srun step without SLURM_STEP_NODELIST or MASTER_ADDR: cannot find rank 0's host")
        addr = first_host(nodelist)
        # Rank 0 runs on the step's first node. On that node, reach its store over loopback:
        # SLURM node names need not resolve (NodeName may differ from the host name).
        if env.get("SLURMD_NODENAME") == addr:
            addr = "127.0.0.1"
    # Without MASTER_PORT, derive one from the job and step so concurrent steps do not collide;
    # 20000-29999 stays below Linux's ephemeral range (32768+).
    port = _port(env["MASTER_PORT"]) if env.get("MASTER_PORT") else 20000 + (job * 16 + step) % 10000
    return World(
        launcher="srun",
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        master_addr=addr,
        master_port=port,
        agent_store=False,
        namespace=f"gpudoctor-smoke/slurm-{job}.{step}",
    )


def tasks_on_node(env: dict) -> int:
    """This node's task count from SLURM_STEP_TASKS_PER_NODE ('2(x3),1') and SLURM_NODEID."""
    name = "SLURM_STEP_TASKS_PER_NODE" if env.get("SLURM_STEP_TASKS_PER_NODE") else "SLURM_TASKS_PER_NODE"
    if not env.get(name):
        return 1
    try:
        counts = slurmfmt.parse_tasks_per_node(env[name], name)
    except slurmfmt.SlurmFormatError as e:
        raise WorldError(str(e)) from None
    node = _int(env, "SLURM_NODEID", 0)
    if node >= len(counts):
        raise WorldError(f"SLURM_NODEID={node} but {name}={env[name]!r} lists {len(counts)} nodes")
    return counts[node]


def first_host(nodelist: str) -> str:
    """First host of a SLURM node list ('gpu[07-09,12],cpu1' -> 'gpu07'): rank 0 runs there."""
    try:
        return slurmfmt.expand_nodelist(nodelist)[0]
    except slurmfmt.SlurmFormatError as e:
        raise WorldError(str(e)) from None


def spawned(rank: int, world_size: int, port: int, namespace: str) -> World:
    return World("spawn", rank, world_size, rank, world_size, "127.0.0.1", port, False, namespace)


def new_namespace() -> str:
    return f"gpudoctor-smoke/spawn-{uuid.uuid4().hex[:12]}"
