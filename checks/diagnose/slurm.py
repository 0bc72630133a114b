"""Signatures of SLURM's own lines: time limit, steps, GRES, cancellation (diagnose)."""

from gpudoctor.checks.diagnose._signature import JUDGED_BY, Signature, verdicts
from gpudoctor.registry import declare

_SBATCH = "https://slurm.schedmd.com/sbatch.html"
_SRUN = "https://slurm.schedmd.com/srun.html"

SIGNATURES = (
    Signature(
        id="GD-DIAG-039",
        name="log-slurm-time-limit",
        category="slurm",
        title="The job ends within its time limit",
        keys=("DUE TO TIME LIMIT",),
        pattern=r"\*\*\* (?:JOB|STEP) (?P<job>[\d.]+) ON (?P<node>\S+) CANCELLED AT \S+ DUE TO TIME LIMIT",
        cause="SLURM ended the job at its time limit (job {job} on {node})",
        why="slurmstepd cancels every step when the job reaches --time; the ranks are killed wherever they are "
        "(their SIGTERM/SIGKILL messages follow).",
        fix="Ask for more time (#SBATCH --time=...), checkpoint and resubmit (--signal=USR1@120 to save before "
        "the end), or find what made it slower (a hang before the limit shows as no progress in the log).",
        source=_SBATCH,
        versions="SLURM",
    ),
    Signature(
        id="GD-DIAG-040",
        name="log-slurm-step-creation",
        category="slurm",
        title="srun can create the job's steps",
        keys=("Unable to create step", "Unable to create job step", "Requested nodes are busy"),
        pattern=r"Unable to create (?:job )?step[^:]*: (?P<reason>.+)|step creation temporarily disabled.*"
        r"\((?P<busy>Requested nodes are busy)\)",
        cause="srun could not create the step: it asked for more than the job holds or another step holds it",
        why="A step may use only what the job was allocated; an srun asking for more tasks, CPUs, GPUs or memory "
        "than the job holds, or a second step while the first holds every resource (no --overlap), cannot be "
        "created.",
        fix="Make srun's -n/--ntasks-per-node/--gpus/--cpus-per-task fit the #SBATCH request (or omit them to "
        "inherit it).",
        source=_SRUN,
        check=("GD-SLURM-007", "GD-SLURM-004"),
        versions="SLURM",
    ),
    Signature(
        id="GD-DIAG-041",
        name="log-slurm-gres",
        category="slurm",
        title="The job's GPU request is one the cluster can satisfy",
        keys=("Invalid generic resource", "gres", "GRES", "Requested node configuration is not available"),
        pattern=r"Invalid generic resource|Requested node configuration is not available|requested GRES but job"
        r"|[Gg]res\b.*(?:invalid|not available|error)",
        cause="SLURM could not satisfy the GPU request (a GRES the job or its nodes do not have)",
        why="--gres=gpu:TYPE:N must name a GRES type and count the partition's nodes have (scontrol show node "
        "shows Gres=); a type typo or more GPUs per node than any node has is refused, and a step (srun) may ask "
        "only for GRES its job holds.",
        fix="Use a GRES the nodes have (`sinfo -o '%P %G'`), or --gpus-per-node=N without a type.",
        source="https://slurm.schedmd.com/gres.html",
        check=("GD-SLURM-020", "GD-SLURM-029"),
        versions="SLURM",
    ),
    Signature(
        id="GD-DIAG-042",
        name="log-slurm-node-failure",
        category="hardware",
        title="The job's nodes stay up",
        keys=("DUE TO NODE FAILURE", "NODE_FAIL", "Node failure on"),
        cause="SLURM lost a node of the job (node failure)",
        why="slurmctld marks a node failed when it stops answering (a crash, a reboot, a network partition); the "
        "job's steps on it end and the others lose their peers.",
        fix="Resubmit excluding the node (#SBATCH --exclude=NODE) and report it to the administrators; "
        "--requeue lets SLURM restart the job.",
        source=_SBATCH,
        versions="SLURM",
    ),
    Signature(
        id="GD-DIAG-043",
        name="log-slurm-preempted-or-cancelled",
        category="slurm",
        title="The job is not cancelled or preempted",
        keys=("DUE TO PREEMPTION", "CANCELLED AT"),
        pattern=r"CANCELLED AT \S+(?: DUE TO (?P<why>PREEMPTION))?(?: \*\*\*)?\s*$",
        cause="SLURM cancelled the job (scancel, or preemption by a higher-priority job)",
        why="A job cancelled by a user or an administrator (scancel), or preempted on a partition with "
        "PreemptMode, ends at once on every node; what the ranks print afterwards follows from it.",
        fix="Resubmit; on a preemptible partition checkpoint often and submit with --requeue.",
        source="https://slurm.schedmd.com/preempt.html",
        versions="SLURM",
    ),
    Signature(
        id="GD-DIAG-044",
        name="log-slurm-execve-failed",
        category="slurm",
        title="The command each task runs exists on the nodes",
        keys=("execve():",),
        pattern=r"execve\(\): (?P<what>[^:]+): No such file or directory",
        cause="a task's command ({what}) does not exist on the node (environment not activated, wrong path)",
        why="slurmstepd runs the step's command on each node; a program found on the login node only (a venv or "
        "module not activated in the batch script, a relative path) is missing there.",
        fix="Activate the environment in the batch script before srun, or give the program's absolute path.",
        source=_SRUN,
        check=("GD-SLURM-015",),
        versions="SLURM",
    ),
)

declare(verdicts(SIGNATURES), source="diagnose", judged_by=JUDGED_BY)
