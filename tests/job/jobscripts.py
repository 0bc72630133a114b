"""The batch scripts the model-against-reality tests run (tests/job/test_job_reality.py: against what they mean
and against gpudoctor's job model), and the terms processes are compared in (Proc)."""

from __future__ import annotations

from dataclasses import dataclass

from tests.job.reality import JobRun, ProcessRecord

HEAD = 'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
TORCHRUN_2 = "srun torchrun {nnodes}--nproc_per_node=2 --rdzv_id=$SLURM_JOB_ID --rdzv_backend=c10d {endpoint} "
# join_timeout: a rendezvous that cannot form fails in 10 s, not torchrun's default 600 s (one that forms keeps
# the default: on a loaded machine a node's torchrun may take long to import torch)
TORCHRUN_TAIL = "--rdzv_conf=join_timeout=10 recorder.py --epochs 1\n"
FORMS_TAIL = "recorder.py --epochs 1\n"


def _header(nodes: int, **directives: str | int) -> str:
    lines = [f"#SBATCH --nodes={nodes}", *(f"#SBATCH --{k.replace('_', '-')}={v}" for k, v in directives.items())]
    return "#!/bin/bash\n" + "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Script:
    text: str
    join: bool = False  # the recorders join a gloo world (a torch import each)


SCRIPTS: dict[str, Script] = {
    # single node, no launcher: srun starts the tasks, the program reads SLURM's variables
    "srun_python": Script(_header(1, ntasks=2, gres="gpu:2") + "srun python recorder.py --epochs 1\n"),
    "plain_python": Script(_header(1, ntasks=2, gres="gpu:2") + "python recorder.py --epochs 1\n"),
    # the batch shell expands $SLURM_PROCID once (0), unless each task's own shell does (bash -c '...')
    "srun_rank_argument": Script(_header(1, ntasks=2) + "srun python recorder.py --rank=$SLURM_PROCID\n"),
    "srun_bash_c_rank": Script(_header(1, ntasks=2) + "srun bash -c 'python recorder.py --rank=$SLURM_PROCID'\n"),
    # an export narrows what every worker sees: 4 workers, 1 GPU
    "cvd_export_torchrun": Script(
        _header(1, ntasks=1, gres="gpu:4")
        + "export CUDA_VISIBLE_DEVICES=0\ntorchrun --standalone --nproc_per_node=4 recorder.py\n"
    ),
    # bash splits `=0, 1` into CUDA_VISIBLE_DEVICES=0, and a failing `export 1`: CUDA reads one GPU
    "cvd_split_by_bash": Script(
        _header(1, ntasks=1, gres="gpu:4")
        + "export CUDA_VISIBLE_DEVICES=0, 1\ntorchrun --standalone --nproc_per_node=2 recorder.py\n"
    ),
    # SLURM binds each task to its own GPU
    "srun_gpus_per_task": Script(_header(1, ntasks=2, gpus_per_task=1) + "srun python recorder.py --epochs 1\n"),
    # a static rendezvous per task's shell: node rank from SLURM_NODEID, the address exported by the batch shell
    "torchrun_2nodes_static_bash_c": Script(
        _header(2, ntasks_per_node=1, gres="gpu:2")
        + 'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
        + "srun bash -c 'torchrun --nnodes=2 --node_rank=$SLURM_NODEID --nproc_per_node=2 "
        + "--master_addr=$MASTER_ADDR --master_port=29500 recorder.py --epochs 1'\n",
        join=True,
    ),
    # torchrun as a module: the same launcher
    "python_m_distributed_run": Script(
        _header(1, ntasks=1, gres="gpu:2")
        + "python -m torch.distributed.run --standalone --nproc_per_node=2 recorder.py\n"
    ),
    # three tasks on two nodes: SLURM places them (block: two on the first node, one on the second)
    "srun_3_tasks_2_nodes": Script(_header(2, ntasks=3) + "srun python recorder.py --epochs 1\n"),
    # two nodes, one torchrun per node (srun), c10d on the first node's host name: one world of 4
    "torchrun_2nodes": Script(
        _header(2, ntasks_per_node=1, gres="gpu:2")
        + HEAD
        + TORCHRUN_2.format(nnodes="--nnodes=2 ", endpoint="--rdzv_endpoint=$head:29500")
        + FORMS_TAIL,
        join=True,
    ),
    # the same with a loopback endpoint: each node's torchrun hosts its own store and waits for a second node
    "torchrun_2nodes_localhost": Script(
        _header(2, ntasks_per_node=1, gres="gpu:2")
        + TORCHRUN_2.format(nnodes="--nnodes=2 ", endpoint="--rdzv_endpoint localhost:29500")
        + TORCHRUN_TAIL,
        join=True,
    ),
    # $(hostname) expanded by each task's own shell: each node's torchrun meets itself
    "torchrun_2nodes_own_hostname": Script(
        _header(2, ntasks_per_node=1, gres="gpu:2")
        + "srun bash -c '"
        + TORCHRUN_2.format(nnodes="--nnodes=2 ", endpoint="--rdzv_endpoint=$(hostname):29500")[5:]
        + TORCHRUN_TAIL.rstrip("\n")
        + "'\n",
        join=True,
    ),
    # the same without --nnodes (so 1): node 1's torchrun completes a rendezvous of one node alone
    "torchrun_2nodes_no_nnodes": Script(
        _header(2, ntasks_per_node=1, gres="gpu:2")
        + HEAD
        + TORCHRUN_2.format(nnodes="", endpoint="--rdzv_endpoint=$head:29500")
        + TORCHRUN_TAIL,
        join=True,
    ),
}


@dataclass(frozen=True, order=True)
class Proc:
    """One process, in the terms the model predicts: node index, rank and world size as the program reads them,
    CUDA_VISIBLE_DEVICES (None: unset), the rendezvous endpoint as (node index its host is, port), argv."""

    node: int | None
    rank: str | None
    world_size: str | None
    visible_gpus: str | None
    endpoint: tuple[int | None, int | None] | None
    argv: tuple[str, ...]


def endpoint_node(host: str, node: int | None, names: list[str]) -> int | None:
    """The node a rendezvous host names from node `node`: a loopback name is the node itself."""
    if host in ("localhost", "127.0.0.1", "::1") or host.startswith("127."):
        return node
    return names.index(host) if host in names else None


def observed_endpoint(rec: ProcessRecord, names: list[str]) -> tuple[int | None, int | None] | None:
    """The rendezvous of the torchrun that started rec, as (node it reaches from rec's node, port); --standalone is
    its own node at a port torchrun picks (None)."""
    if rec.launcher_endpoint:
        host, _, port = rec.launcher_endpoint.rpartition(":")
        return endpoint_node(host, rec.node, names), int(port)
    if rec.parent_argv and "--standalone" in rec.parent_argv:
        return rec.node, None
    return None


def observed(rec: ProcessRecord, names: list[str]) -> Proc:
    return Proc(rec.node, rec.rank, rec.world_size, rec.visible_gpus, observed_endpoint(rec, names), rec.argv)


def observed_all(run: JobRun, names: list[str]) -> list[Proc]:
    return sorted(observed(rec, names) for rec in run.records)
