"""Signatures of ranks that do not match the GPUs they were given (diagnose)."""

from gpudoctor.checks.diagnose._signature import JUDGED_BY, Signature, verdicts
from gpudoctor.registry import declare

_CUDA_SEMANTICS = "https://pytorch.org/docs/stable/notes/cuda.html#cuda-semantics"

SIGNATURES = (
    Signature(
        id="GD-DIAG-002",
        name="log-invalid-device-ordinal",
        category="devices",
        title="Every rank's GPU index exists among the GPUs its process sees",
        keys=("invalid device ordinal",),
        cause="a rank asked for a GPU index its process cannot see (more ranks than visible GPUs)",
        why="torch.cuda.set_device(LOCAL_RANK) or cuda:N names a device index at or past the count of devices "
        "CUDA_VISIBLE_DEVICES leaves visible: --nproc_per_node larger than the GPUs SLURM gave the task, or "
        "one task per GPU where each task sees only its own GPU (index 0).",
        fix="Start as many ranks per node as GPUs each node's tasks see: torchrun --nproc_per_node equal to the "
        "GPUs per node (--gpus-per-node), or with one task per GPU use device 0 / LOCAL_RANK from SLURM_LOCALID "
        "only where all the node's GPUs are visible.",
        source=_CUDA_SEMANTICS,
        check=("GD-SLURM-027", "GD-DEV-002", "GD-SLURM-010"),
    ),
    Signature(
        id="GD-DIAG-003",
        name="log-duplicate-gpu",
        category="devices",
        title="No two ranks of one communicator use the same GPU",
        keys=("Duplicate GPU detected",),
        pattern=r"Duplicate GPU detected\s*:\s*rank (?P<a>\d+) and rank (?P<b>\d+) both on CUDA device (?P<dev>\w+)",
        cause="two ranks use the same GPU, which NCCL refuses (each rank needs its own GPU)",
        why="NCCL gives each rank of a communicator its own device; two ranks on one GPU (every rank on cuda:0, "
        "LOCAL_RANK not used, or more tasks than GPUs with every GPU visible) fail ncclCommInitRank with "
        "ncclInvalidUsage.",
        fix="Call torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before init_process_group (or give each "
        "task its own GPU: --gpus-per-task=1 / --ntasks-per-gpu), and start no more ranks per node than GPUs.",
        source="https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html",
        check=("GD-SLURM-002", "GD-JOB-006"),
        versions="NCCL >= 2.5",
    ),
    Signature(
        id="GD-DIAG-004",
        name="log-ranks-share-gpu-oom",
        category="devices",
        title="A GPU out-of-memory error does not show several ranks on one GPU",
        keys=("out of memory",),
        pattern=r"out of memory.*?(?:GPU (?P<gpu>\d+)).*?Process \d+ has [^.]*\.[^P]*Process \d+ has",
        cause="GPU memory ran out with several processes on GPU {gpu}: ranks share it (or another job's process does)",
        why="The out-of-memory message lists every process holding memory on the GPU (torch >= 2.0); two or more of "
        "the job's "
        "processes on one GPU means the ranks were not spread over the GPUs (no set_device(LOCAL_RANK), or all "
        "ranks given device 0), so each has a fraction of the memory it was sized for.",
        fix="Give each rank its own GPU: torch.cuda.set_device(local_rank) before any CUDA work, model.to(local_rank), "
        "and one rank per GPU on the node.",
        source=_CUDA_SEMANTICS,
        check=("GD-SLURM-002", "GD-JOB-006"),
        versions="torch >= 2.0 (the message lists the processes)",
    ),
    Signature(
        id="GD-DIAG-005",
        name="log-no-cuda-gpus",
        category="devices",
        title="Every rank sees at least one GPU",
        keys=(
            "No CUDA GPUs are available",
            "no CUDA-capable device is detected",
            "Found no NVIDIA driver",
            "ProcessGroupNCCL is only supported with GPUs, no GPUs found",
        ),
        cause="a rank saw no GPU at all (none requested, or CUDA_VISIBLE_DEVICES empty or naming GPUs not there)",
        why="CUDA found no device: the job asked SLURM for no GPU (no --gres=gpu / --gpus), CUDA_VISIBLE_DEVICES "
        "was set empty or to indices that do not exist, or the node has no working driver.",
        fix="Request GPUs (#SBATCH --gpus-per-node=N or --gres=gpu:N) and leave CUDA_VISIBLE_DEVICES to SLURM.",
        source="https://slurm.schedmd.com/gres.html",
        check=("GD-DEV-001", "GD-SLURM-010", "GD-DRV-001"),
    ),
    Signature(
        id="GD-DIAG-006",
        name="log-gpu-busy-or-unavailable",
        category="devices",
        title="No rank finds its GPU busy or unavailable",
        keys=("busy or unavailable",),
        cause="a GPU was busy or unavailable (exclusive compute mode with several ranks, or a held GPU)",
        why="In EXCLUSIVE_PROCESS compute mode a GPU takes one process: a second rank on it, or a leftover process "
        "from an earlier job, makes CUDA report the device busy or unavailable.",
        fix="One rank per GPU (set_device(LOCAL_RANK)); find leftover processes with nvidia-smi and end them.",
        source="https://docs.nvidia.com/deploy/nvidia-smi/index.html",
        check=("GD-DEV-005", "GD-DEV-007"),
    ),
)

declare(verdicts(SIGNATURES), source="diagnose", judged_by=JUDGED_BY)
