"""slurm checks of a launcher's own inputs on the launch line of a batch script (--sbatch).

GD-SLURM-033: the config file `accelerate launch --config_file F` reads, read as accelerate reads it
(gpudoctor/readers/accelerate.py, after huggingface/accelerate 1.x commands/launch.py and
commands/config/config_args.py): where it is, whether it can be read, and the values the launch takes from it.
The process counts it gives are judged by the existing launcher checks (GD-SLURM-002/003/009, GD-DIST-001)
through the job's shape.

GD-SLURM-034: the rendezvous endpoint that each task of `srun bash -c '...'` computes itself
(gpudoctor/readers/pertask.py: what the batch shell expands once and what each task's shell expands).
"""

from __future__ import annotations

import re

from gpudoctor.model import fail, info, manual, passed, skip, warn
from gpudoctor.readers.accelerate import DEFAULT_CONFIG, accelerate_plan
from gpudoctor.readers.pertask import PER_LOCAL_TASK, PER_NODE, PER_TASK, RANDOM, Varying, varying_endpoints
from gpudoctor.registry import check


def _launch_evidence(launch) -> dict:
    return {"launch line": f"line {launch.line}: {launch.text}"}


# The wrappers (readers/sbatch/launch.WRAPPERS) that run the launch in a container's own file system.
_CONTAINERS = ("singularity", "apptainer", "docker", "podman", "enroot", "shifter")


@check(
    id="GD-SLURM-033",
    name="accelerate-config-file-unread",
    category="slurm",
    title="The accelerate config file of the launch line is there and readable",
    needs=[],
    scope="job",
    what="Reads the file of `accelerate launch --config_file F` on the batch script's training line as accelerate "
    "does: JSON for a .json name, YAML otherwise, relative to the directory the launch runs in (#SBATCH --chdir, "
    "else the directory sbatch is run from, which is unknown before submission: the script's directory and the "
    "current directory are tried; then any `cd`). Reports where F was found and the values the launch takes from "
    "it: the command line wins, then F, then accelerate's defaults (num_machines 1, machine_rank 0). Those values "
    "are what the launcher checks (GD-SLURM-002/003/009, GD-DIST-001) judge.",
    why="accelerate stops at once when F does not exist ('The passed configuration file ... does not exist'), when "
    "it is not valid YAML/JSON, when it has no distributed_type, and when neither F nor the line gives "
    "num_processes -- after the job has waited in the queue; over several machines without a main_process_ip "
    "every machine's rendezvous points at the host 'None'. And F decides how many processes each node starts "
    "and which node is the main one: a config written for one machine starts the wrong world on several.",
    fix="Give F as an absolute path, or one relative to a directory the script `cd`s to, and write it with "
    "`accelerate config --config_file F` (or correct the key named). Without --config_file accelerate reads "
    f"{DEFAULT_CONFIG} on the node when it exists: pass --config_file to make the job independent of it.",
)
def accelerate_config_file_unread(facts, ctx):
    sb = ctx.sbatch
    if sb is None or not hasattr(sb, "launch"):
        return skip("no batch script given (--sbatch)")
    launch = sb.launch
    if launch is None or launch.launcher != "accelerate" or not launch.config_file:
        return skip("the training line is not `accelerate launch --config_file F`")
    config = launch.launcher_config
    evidence = {**_launch_evidence(launch), "config_file": launch.config_file}
    if config is None:
        return skip("the config file was not looked for (the script was not read from a file)", **evidence)
    where = config.path or config.written
    if config.status == "unresolved":
        return info(
            f"--config_file {config.written}: {config.problem}, so its values (processes, machines, machine rank) "
            "are not known before submission",
            **evidence,
        )
    container = next((w for w in launch.wrappers if w in _CONTAINERS), None)
    if config.status == "missing" and container is not None:
        # inside a container the path is the container's (a --bind/--mount/--container-mounts destination, or a
        # file of the image): this machine cannot say whether it is there
        return info(
            f"--config_file {config.written} is read inside the {container} container: whether it is there "
            "(a bind mount or the image) is not known here",
            **evidence,
        )
    if config.status == "missing":
        # relative to the directory sbatch is run from, which is not known before submission: not there is a guess
        submit_dir = not config.written.startswith(("/", "~")) and launch.cwd is None and not sb.options.get("chdir")
        fix = manual(
            "Point --config_file at the file the job can open",
            f"accelerate config --config_file {config.written}   (writes it), or give its absolute path",
        )
        message = (
            f"--config_file {config.written} (line {launch.line}): {config.problem}; accelerate stops at start "
            f"('The passed configuration file `{config.written}` does not exist')"
        )
        if submit_dir:
            return info(
                message + " unless the directory sbatch is run from holds it (the job starts there, unknown before "
                "submission); its values (processes, machines, machine rank) are not known here",
                fix,
                looked_in=where,
                **evidence,
            )
        return warn(message, fix, looked_in=where, **evidence)
    if config.status == "unreadable":
        return warn(
            f"accelerate cannot read its config file: {config.problem}; the launch stops before training",
            manual("Rewrite the config file", f"accelerate config --config_file {where}"),
            **evidence,
        )
    plan = accelerate_plan(launch)
    settings = {
        name: f"{getattr(plan, name).value} ({getattr(plan, name).source})"
        for name in ("mode", "num_processes", "num_machines", "machine_rank", "main_process_ip", "main_process_port")
    }
    evidence.update(config_path=where, **settings)
    if plan.stops:
        return fail(
            "; ".join(plan.stops) + " -- before any training",
            manual(
                "Complete the config file (or pass the value on the launch line)",
                f"accelerate config --config_file {where}",
            ),
            **evidence,
        )
    per = f" ({plan.procs_per_machine} per machine)" if plan.procs_per_machine else ""
    notes = "; ".join(plan.notes)
    return passed(
        f"accelerate reads {where}: {plan.mode.value or 'distributed_type unknown'}, num_processes "
        f"{plan.num_processes.value} over num_machines {plan.num_machines.value}{per}, machine_rank "
        f"{plan.machine_rank.value}" + (f"; {notes}" if notes else ""),
        **evidence,
    )


def _one_line(text: str, limit: int = 100) -> str:
    """A value as one short line: a port picked with a heredoc spans lines."""
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _shown(v: Varying) -> str:
    """`setting=value`, and the expansion that makes it vary when the value is more than that expansion."""
    value, because = _one_line(v.value), _one_line(v.because)
    return f"{v.setting}={value}" + (f" ({because})" if v.because != v.value else "")


_HOW_WORDS = {
    PER_NODE: "one value per node",
    PER_TASK: "one value per task",
    PER_LOCAL_TASK: "one value per task on a node",
    RANDOM: "picked afresh in each task",
}


def _differs(how: str, shape) -> str | None:
    """Why a value computed this way differs between the job's processes; None when they all get the same."""
    nodes, tasks = shape.nodes or 1, shape.ntasks or 1
    per_node = shape.tasks_here or 1
    if how == PER_NODE and nodes > 1:
        return f"each of the {nodes} nodes gets its own"
    if how in (PER_TASK, RANDOM) and tasks > 1:
        return f"each of the {tasks} tasks gets its own"
    if how == PER_LOCAL_TASK and per_node > 1:
        return f"each of the {per_node} tasks on a node gets its own"
    return None


@check(
    id="GD-SLURM-034",
    name="rendezvous-endpoint-computed-per-task",
    category="slurm",
    title="Every task of `srun bash -c '...'` meets at the same rendezvous endpoint",
    needs=[],
    scope="job",
    what="Reads the command string of `srun bash -c '...'` on the training line as each task's shell gets it: "
    "what the batch shell expanded before srun ($(...), `...` and $NAME outside single quotes, unescaped) is one "
    "value for all; what is left -- $(hostname), $HOSTNAME, $SLURM_PROCID/$SLURM_NODEID/$SLURM_LOCALID, $RANDOM, "
    "a free port picked with python's socket.bind(('', 0)) or shuf -- each task expands on its own node. Judges "
    "the rendezvous settings so computed: torchrun --rdzv_endpoint/--master_addr/--master_port, accelerate "
    "--main_process_ip/--main_process_port (and a config main_process_port: 0 over several machines), deepspeed "
    "--master_addr/--master_port, MASTER_ADDR/MASTER_PORT for a plain python or Lightning rank.",
    why="The ranks of one job must meet at one address and port. A host computed per task names each node "
    "itself and a port picked per task differs in every task: each node's launcher waits at its own endpoint "
    "(the c10d rendezvous starts its store on whichever host matches), the ranks never meet, and the job hangs "
    "until the rendezvous or NCCL timeout (bash(1) QUOTING; srun(1): each task's own SLURM_PROCID/SLURM_NODEID).",
    fix="Compute the endpoint once in the batch shell, outside the single quotes, and export it: "
    '`export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)` and '
    "`export MASTER_PORT=$((10000 + SLURM_JOB_ID % 50000))`; inside the quotes use $MASTER_ADDR/$MASTER_PORT.",
)
def rendezvous_endpoint_computed_per_task(facts, ctx):
    from gpudoctor.job.shape import job_shape

    sb = ctx.sbatch
    if sb is None or not hasattr(sb, "launch"):
        return skip("no batch script given (--sbatch)")
    launch = sb.launch
    if launch is None:
        return skip("no training launch line in the batch script")
    shape = job_shape(facts, ctx)
    varying = (
        varying_endpoints(launch.task_command, launch.batch_evaluated, launch.launcher, launch.standalone)
        if launch.task_command and launch.srun is not None
        else []
    )
    if launch.launcher == "accelerate":
        plan = accelerate_plan(launch)
        machines = plan.num_machines.value
        if str(plan.main_process_port.value) == "0" and isinstance(machines, int) and machines > 1:
            varying.append(
                Varying("main_process_port", "0", PER_NODE, f"main_process_port 0 ({plan.main_process_port.source})")
            )
    evidence = {"launch line": f"line {launch.line}: {launch.text}"}
    per_task_shell = bool(launch.task_command and launch.srun is not None)
    if not per_task_shell and not varying:
        return skip(
            "the training line is no `srun bash -c '...'`: the batch shell expands it once, the same for every task",
            **evidence,
        )
    problems = [(v, why) for v in varying if shape is not None and (why := _differs(v.how, shape))]
    if not problems:
        if varying:
            shown = ", ".join(f"{v.setting}={v.value}" for v in varying)
            return passed(f"{shown}: computed in each task, but every task that meets there gets the same", **evidence)
        return passed("the rendezvous endpoint is the same for every task", **evidence)
    parts = [
        f"{_shown(v)} is "
        + ("picked afresh" if v.how == RANDOM else f"expanded per {v.how}")
        + f" by each task's own shell, so {why}"
        for v, why in problems
    ]
    return fail(
        f"line {launch.line}: each task computes its own {', '.join(sorted({v.setting for v, _ in problems}))}: "
        "the ranks wait at different endpoints",
        manual(
            "Compute the endpoint once in the batch shell (outside the single quotes) and export it",
            'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            "export MASTER_PORT=$((10000 + SLURM_JOB_ID % 50000))",
            "then use $MASTER_ADDR / $MASTER_PORT inside the quoted command",
        ),
        varying=[
            f"{v.setting}={_one_line(v.value)} ({_one_line(v.because)}: {_HOW_WORDS[v.how]})" for v, _ in problems
        ],
        nodes=shape.nodes if shape else None,
        tasks=shape.ntasks if shape else None,
        per_task=parts,
        **evidence,
    )
