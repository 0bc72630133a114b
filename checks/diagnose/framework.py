"""Signatures of the training framework: DDP, collectives, Lightning, Accelerate (diagnose)."""

from gpudoctor.checks.diagnose._signature import JUDGED_BY, Signature, verdicts
from gpudoctor.registry import declare

_DDP = "https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html"
_DEBUG = "https://pytorch.org/docs/stable/distributed.html#debugging-torch-distributed-applications"

SIGNATURES = (
    Signature(
        id="GD-DIAG-032",
        name="log-ddp-unused-parameters",
        category="distributed",
        title="Every parameter DDP wraps gets a gradient each step",
        keys=("Expected to have finished reduction in the prior iteration",),
        cause="DDP found parameters that got no gradient: the model has unused parameters",
        why="DDP all-reduces every parameter's gradient; a parameter not used in computing the loss (a branch not "
        "taken, a frozen head, an output not in the loss) never gets its gradient ready, and the next step "
        "finds the previous reduction unfinished.",
        fix="Use every parameter in the loss, freeze unused ones (requires_grad=False) before wrapping in DDP, or "
        "DistributedDataParallel(model, find_unused_parameters=True) (slower).",
        source=_DDP,
    ),
    Signature(
        id="GD-DIAG-033",
        name="log-ddp-variable-ready-twice",
        category="distributed",
        title="DDP marks each parameter ready once per step",
        keys=("Expected to mark a variable ready only once",),
        cause="DDP saw a parameter's gradient twice in one step (reentrant checkpointing or a reused module)",
        why="A parameter used twice in one backward (a module called twice with find_unused_parameters, or "
        "reentrant activation checkpointing) fires DDP's hook twice.",
        fix="torch.utils.checkpoint with use_reentrant=False, or DistributedDataParallel(static_graph=True); do not "
        "combine find_unused_parameters=True with reused modules.",
        source=_DDP,
    ),
    Signature(
        id="GD-DIAG-034",
        name="log-collective-mismatch",
        category="distributed",
        title="Every rank runs the same collectives in the same order",
        keys=("Detected mismatch between collectives", "mismatch between collectives", "Collectives differ"),
        cause="the ranks ran different collectives (one rank took another branch): a desync in the program",
        why="Every rank must call the same collectives with the same shapes in the same order; a branch on the "
        "rank (logging, evaluation, a data-dependent skip) or uneven data makes one rank call another. "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL checks each collective's fingerprint and names both.",
        fix="Make every rank call the same collectives (evaluate on all ranks or guard the whole block, "
        "DistributedSampler(drop_last=True) for equal batches); the message names the two collectives.",
        source=_DEBUG,
    ),
    Signature(
        id="GD-DIAG-035",
        name="log-lightning-misconfiguration",
        category="slurm",
        title="Lightning's devices and nodes match the job's tasks and GPUs",
        keys=("MisconfigurationException", "ntasks-per-node", "in your SLURM bash script"),
        pattern=r"MisconfigurationException(?!.*You requested)|(?:devices|num_nodes)=.*ntasks-per-node"
        r"|ntasks-per-node.*(?:devices|num_nodes)|You set .--ntasks=\d+. in your SLURM bash script",
        cause="Lightning refused its configuration: devices or num_nodes disagree with the job's tasks or GPUs",
        why="Under SLURM, Lightning takes its processes from SLURM's tasks: Trainer(devices=N) needs "
        "--ntasks-per-node=N and num_nodes the job's node count; asking for more GPUs than the node shows is "
        "refused.",
        fix="#SBATCH --ntasks-per-node equal to Trainer(devices=...), --nodes equal to num_nodes, and run the "
        "script under srun.",
        source="https://lightning.ai/docs/pytorch/stable/clouds/cluster_advanced.html",
        check=("GD-SLURM-005",),
        versions="pytorch-lightning / lightning >= 1.6",
    ),
    Signature(
        id="GD-DIAG-036",
        name="log-accelerate-misconfiguration",
        category="distributed",
        title="Accelerate's configuration matches the processes and machines",
        keys=("num_processes", "num_machines", "machine_rank"),
        pattern=r"(?:ValueError|RuntimeError|Error).*(?:num_processes|num_machines|machine_rank)",
        cause="Accelerate refused its configuration (num_processes or num_machines against the job)",
        why="accelerate launch reads num_processes, num_machines and machine_rank from its config or flags; "
        "values that disagree with the nodes and GPUs the job has, or a config file not read on the nodes, stop "
        "the launch.",
        fix="Pass --num_processes (GPUs in the job), --num_machines $SLURM_NNODES and --machine_rank $SLURM_NODEID "
        "on the launch line, or a config file every node reads.",
        source="https://huggingface.co/docs/accelerate/basic_tutorials/launch",
        check=("GD-SLURM-033",),
    ),
    Signature(
        id="GD-DIAG-037",
        name="log-device-side-assert",
        category="cuda",
        title="No kernel hits a device-side assertion",
        keys=("device-side assert triggered", "Assertion `t >= 0 && t < n_classes` failed", "indexSelect"),
        pattern=r"device-side assert triggered|Assertion .* failed",
        cause="a CUDA kernel's assertion failed: an index out of range (labels >= classes, embedding ids)",
        why="Device-side asserts come from indexing checks in kernels: a class label outside [0, n_classes), a "
        "token id at or past the embedding size. The report is asynchronous, so the Python line may be later.",
        fix="Check the labels and ids against the sizes (run one batch on CPU, or with CUDA_LAUNCH_BLOCKING=1 to "
        "see the line).",
        source="https://pytorch.org/docs/stable/notes/cuda.html#asynchronous-execution",
    ),
    Signature(
        id="GD-DIAG-038",
        name="log-illegal-memory-access",
        category="cuda",
        title="No kernel accesses memory outside its buffers",
        keys=(
            "illegal memory access",
            "misaligned address",
            "unspecified launch failure",
            "illegal instruction",
            "ILLEGAL_ADDRESS",
            "cudaErrorIllegalAddress",
        ),
        cause="a CUDA kernel faulted (illegal memory access): a bug in a kernel or extension, or a failing GPU",
        why="An illegal address in a kernel is a bug in custom CUDA code, a library version mismatch, or rarely a "
        "failing GPU (a kernel Xid 13/31 alongside); the error is asynchronous.",
        fix="Rerun with CUDA_LAUNCH_BLOCKING=1 to find the kernel; if it follows one GPU across runs, test that "
        "GPU (gpudoctor smoke, dcgmi diag).",
        source="https://pytorch.org/docs/stable/notes/cuda.html#asynchronous-execution",
    ),
    Signature(
        id="GD-DIAG-062",
        name="log-lightning-gpus-not-visible",
        category="devices",
        title="The GPUs the trainer asks for are visible to its process",
        keys=("You requested gpu", "You requested GPUs", "But your machine only has"),
        pattern=r"You requested (?:gpu|GPUs)s?:?\s*(?P<asked>\[[^\]]*\])?|But your machine only has",
        cause="the trainer asked for GPUs its process cannot see (requested {asked})",
        why="Lightning checks Trainer(gpus=/devices=) against torch.cuda.device_count(): an index past the visible "
        "GPUs (devices=[1] where CUDA_VISIBLE_DEVICES leaves one GPU, index 0), or no GPU visible at all (no GPU "
        "requested from SLURM, a CPU-only torch) is refused.",
        fix="Ask for device indices among the visible ones (devices=N, not [N]), request the GPUs from SLURM "
        "(--gpus-per-node), and leave CUDA_VISIBLE_DEVICES to SLURM.",
        source="https://github.com/AntixK/PyTorch-VAE/issues/81",
        check=("GD-DEV-001", "GD-SLURM-010", "GD-SLURM-005"),
        versions="pytorch-lightning / lightning",
    ),
)

declare(verdicts(SIGNATURES), source="diagnose", judged_by=JUDGED_BY)
