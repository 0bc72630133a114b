"""JobShape: the shape of a SLURM job as the slurm checks judge it, whichever source it came from (the live
environment, shape_env.py; a batch script, shape.py). Every number keeps the name of the variable or directive
it came from, so verdicts can show evidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpudoctor.readers import slurmfmt

INTERACTIVE_JOB_NAMES = ("bash", "interactive")  # Lightning: SLURM not managing tasks under these names


@dataclass
class JobShape:
    source: str  # "env" (inside a SLURM job) | "sbatch" (a batch script, before submission)
    where: str  # said in messages: "this srun step" / "train.slurm"
    script: str | None = None  # the batch script, target of sbatch_set fixes
    srun_launch: bool | None = None  # the training is started by srun (None: unknown, e.g. a batch-shell preflight)
    job_name: str | None = None
    nodes: int | None = None
    ntasks: int | None = None  # tasks of the (training) step
    ntasks_in_env: bool = False  # SLURM_NTASKS will be in the training process's environment
    ntasks_option: int | None = None  # --ntasks / -n as given (job or srun)
    ntasks_per_node: int | None = None  # --ntasks-per-node as given (SLURM_NTASKS_PER_NODE)
    tasks_per_node: list[int] | None = None  # SLURM's placement, one count per node, when known
    tasks_here: int | None = None  # tasks on this node (env) or the most on any node (sbatch)
    gpus_per_node: int | None = None
    gpu_type: str | None = None
    gpus_per_task: int | None = None  # --gpus-per-task: each task bound to its own GPUs
    task_gpus: int | None = None  # GPUs one task can see
    cpus_per_task: int | None = None  # --cpus-per-task of the job (SLURM_CPUS_PER_TASK)
    srun_cpus_per_task: int | None = None  # srun -c / SRUN_CPUS_PER_TASK
    launcher: str | None = (
        None  # what each task runs: torchrun, torch.distributed.launch, deepspeed, accelerate, python, lightning
    )
    launcher_source: str | None = None
    procs_per_task: int | None = None  # processes a task starts itself (torchrun --nproc-per-node); 1 for python
    lightning: dict = field(default_factory=dict)  # devices / num_nodes the job gives Lightning, with sources
    launch_line: str | None = None  # sbatch: the training command as written
    launch_lineno: int | None = None
    cuda_visible_export: Any = None  # sbatch: `export CUDA_VISIBLE_DEVICES=...` (readers.sbatch.Assignment)
    directives: dict = field(default_factory=dict)  # sbatch: the #SBATCH options
    directive_lines: dict = field(default_factory=dict)
    srun_options: dict | None = None  # sbatch: options on the launch line's srun
    evidence: dict = field(default_factory=dict)  # name -> value for every input used
    evidence_extra: dict = field(default_factory=dict)  # read while working out the launcher, merged into evidence
    problems: list[str] = field(default_factory=list)  # values that could not be read
    notes: list[str] = field(default_factory=list)  # readable, but judged with an assumption
    program: Any = None  # readers.program.ProgramModel of the launched program (sbatch; None: not looked for)

    @property
    def from_script(self) -> bool:
        return self.source == "sbatch"

    @property
    def interactive_name(self) -> bool:
        return (self.job_name or "") in INTERACTIVE_JOB_NAMES

    def opt(self, name: str) -> str:
        """How the user spells a SLURM option here: '#SBATCH --x' (script) or '--x' (env)."""
        return f"#SBATCH --{name}" if self.from_script else f"--{name}"


def read_int(value, what: str, problems: list[str], minimum: int = 0, maximum: int | None = None) -> int | None:
    if value is None or value is True:
        return None
    try:
        n = slurmfmt.parse_int(value, what, minimum)
    except slurmfmt.SlurmFormatError as e:
        problems.append(str(e))
        return None
    if maximum is not None and n > maximum:
        problems.append(f"{what}: {n} is implausibly large")
        return None
    return n
