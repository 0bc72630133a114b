"""What the launched program does with its process and the GPUs it sees, for the checks that count processes.

The rule of `fix` this serves (README, "Do no harm"): a fix that adds tasks, GPUs or an `srun` prefix to
a plain `python` line starts N copies of the program, which is right only when the program is one rank
per process and learns its rank under srun (Lightning's SLURMEnvironment, or a program that reads
SLURM_PROCID). srun sets SLURM_PROCID/SLURM_LOCALID, not torchrun's RANK/LOCAL_RANK/WORLD_SIZE (srun(1),
"OUTPUT ENVIRONMENT VARIABLES"), so a program that reads the latter is started with torchrun instead; a
program not read (absent, dynamic) gets no such fix at all.

Verified on slurm-wlm 22.05 (tests/slurmcluster.py): a job with --ntasks-per-node=4 --cpus-per-task=1
--gres=gpu:1 runs a plain `python` line once in the batch shell, which has SLURM_CPUS_ON_NODE=4 (the four
tasks' CPUs); `srun` in the same job starts four copies, every one with CUDA_VISIBLE_DEVICES=0.
"""

from __future__ import annotations

from gpudoctor.job.shape import JobShape


def program_of(shape: JobShape):
    """The ProgramModel read for a batch script's launch (None inside a live job: nothing was read)."""
    return shape.program if shape.from_script else None


def python_processes(shape: JobShape) -> tuple[int | None, str]:
    """Processes one `python prog.py` task becomes: a spawning program's own count, else 1."""
    program = program_of(shape)
    if program is not None and program.kind == "spawn":
        if program.processes == "visible GPUs":
            return shape.task_gpus, program.describe()
        if isinstance(program.processes, int):
            return program.processes, program.describe()
        return None, program.describe()
    if program is not None and program.known:
        return 1, f"plain python: one process per task; {program.describe()}"
    return 1, "plain python: one process per task"


def drives_all_gpus(shape: JobShape) -> bool:
    """One process that uses every GPU it sees (nn.DataParallel, Hugging Face Trainer, device_map='auto')."""
    program = program_of(shape)
    return program is not None and program.kind == "one_process_many_gpus"


def one_rank_per_task_under_srun(shape: JobShape) -> bool:
    """The premise of a fix that starts a task per GPU with srun: the program is one rank per process and
    takes its rank from SLURM's task variables (Lightning, or SLURM_PROCID read by the program)."""
    program = program_of(shape)
    if program is None:
        return False
    return program.kind == "lightning" or (program.kind == "rank_per_process" and program.rank_source == "SLURM")


def wants_torchrun(shape: JobShape) -> bool:
    """A one-rank-per-process program that reads torchrun's RANK/LOCAL_RANK: started by torchrun, not srun."""
    program = program_of(shape)
    return program is not None and program.kind == "rank_per_process" and program.rank_source == "launcher"


def program_status(shape: JobShape) -> str:
    """What is known of the program, or why nothing is."""
    program = program_of(shape)
    if program is not None and program.known:
        return program.describe()
    why = program.describe() if program is not None else "the program was not read"
    return f"what the program does with its process is not known ({why})"


def unknown_note(shape: JobShape, copies: int) -> str:
    """Why no fix is offered when the program was not read."""
    return (
        f"{program_status(shape)}; no fix offered: more tasks or an srun prefix would start {copies} copies of a "
        "program that may not be distributed"
    )
