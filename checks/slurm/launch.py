"""Task placement and who starts the ranks: tasks placed per node (GD-SLURM-004), one launcher
(GD-SLURM-009), srun for a multi-node or multi-task job (GD-SLURM-012).
"""

from __future__ import annotations

import re

from gpudoctor.checks.slurm._shared import (
    directive_fix,
    known_node_cpus,
    same_cpus_per_node,
    shape_evidence,
    slurm_shape,
)
from gpudoctor.job.process_model import (
    one_rank_per_task_under_srun,
    program_of,
    program_status,
    unknown_note,
    wants_torchrun,
)
from gpudoctor.job.shape import JobShape
from gpudoctor.model import (
    LAUNCHER_TABLE,
    SPAWNING_LAUNCHERS,
    Action,
    ActionKind,
    Fix,
    Safety,
    fail,
    info,
    manual,
    passed,
    skip,
    warn,
)
from gpudoctor.registry import check

# ---------------------------------------------------------------- GD-SLURM-004


@check(
    id="GD-SLURM-004",
    name="ntasks-without-ntasks-per-node",
    category="slurm",
    title="Tasks are placed per node explicitly",
    needs=["env"],
    requires=["slurm-job"],
    scope="job",
    what="Looks for --ntasks (SLURM_NTASKS) greater than one without --ntasks-per-node "
    "(SLURM_NTASKS_PER_NODE) on a job that has, or may get, more than one node, and at how SLURM "
    "actually placed the tasks (SLURM_TASKS_PER_NODE).",
    why="--ntasks alone lets SLURM place tasks where CPUs are free: 8 tasks on two 4-GPU nodes can land as "
    "5+3, leaving one node with a task too many for its GPUs and the other with an idle GPU. Lightning "
    "refuses --ntasks>1 without --ntasks-per-node outright.",
    fix="Say how many tasks go on each node: `#SBATCH --nodes=N` and `#SBATCH --ntasks-per-node=<GPUs per node>`.",
)
def ntasks_without_ntasks_per_node(facts, ctx):
    shape = slurm_shape(facts, ctx)
    nt = shape.ntasks_option if shape.from_script else shape.ntasks
    default_placement = not shape.from_script and shape.tasks_per_node and set(shape.tasks_per_node) == {1}
    if shape.ntasks_per_node is not None or not nt or nt <= 1 or default_placement:
        return passed(
            "tasks per node are set explicitly"
            if shape.ntasks_per_node
            else "no --ntasks above 1 without --ntasks-per-node",
            **shape_evidence(shape),
        )
    ev = shape_evidence(shape, ntasks=nt)
    if (
        shape.nodes
        and nt == shape.nodes
        and (not shape.from_script or "nodes" in shape.directives or (shape.srun_options or {}).get("nodes"))
    ):
        # Every node of a step runs at least one task (SLURM lowers the node count otherwise), so this is one per node.
        light = " (Lightning still refuses it: see GD-SLURM-005)" if shape.launcher == "lightning" else ""
        return passed(f"--ntasks={nt} on {nt} nodes: exactly one task on each node{light}", **ev)
    if shape.nodes == 1 and (
        not shape.from_script or "nodes" in shape.directives or (shape.srun_options or {}).get("nodes")
    ):
        light = " (Lightning still refuses it: see GD-SLURM-005)" if shape.launcher == "lightning" else ""
        return passed(f"--ntasks={nt} on one node: all tasks share that node{light}", **ev)
    nodes = shape.nodes
    per_node = nt // nodes if nodes and nt % nodes == 0 else None
    changes = {"ntasks-per-node": str(per_node)} if per_node else {}
    if not shape.directives.get("nodes") and shape.from_script:
        changes = {"nodes": "1", "ntasks-per-node": str(nt)} if nodes in (None, 1) else changes
    fix = (
        directive_fix(
            shape, facts, "Place tasks per node: " + ", ".join(f"--{k}={v}" for k, v in changes.items()), changes
        )
        if changes
        else manual("Choose --nodes and --ntasks-per-node so every node gets as many tasks as it has GPUs")
    )
    if shape.tasks_per_node and len(set(shape.tasks_per_node)) > 1:
        return warn(
            f"--ntasks={nt} without --ntasks-per-node: SLURM placed "
            f"the tasks unevenly ({shape.tasks_per_node} per node)",
            fix,
            **ev,
        )
    if shape.tasks_per_node:
        return info(
            f"--ntasks={nt} without --ntasks-per-node: placed evenly this time ({shape.tasks_per_node}), which SLURM "
            "does not promise",
            fix,
            **ev,
        )
    where = f"{nodes} nodes" if nodes else "however many nodes SLURM picks (no --nodes)"
    return warn(f"--ntasks={nt} without --ntasks-per-node: SLURM may spread the tasks unevenly over {where}", fix, **ev)


# ---------------------------------------------------------------- GD-SLURM-009


@check(
    id="GD-SLURM-009",
    name="launcher-inside-multi-task-srun",
    category="slurm",
    title="Only one launcher starts the ranks",
    needs=["env"],
    requires=["slurm-job"],
    scope="job",
    what="Looks for a process launcher (torchrun, python -m torch.distributed.run/launch, deepspeed, "
    "accelerate launch) started by srun with more than one task per node -- from the launch line of "
    "--sbatch, or inside a task from TORCHELASTIC_RUN_ID/LOCAL_WORLD_SIZE next to SLURM_STEP_TASKS_PER_NODE.",
    why="srun starts N copies of the launcher per node and each starts its own ranks: 8 tasks x "
    "--nproc-per-node=8 is 64 processes on 8 GPUs in eight separate worlds. NCCL stops with 'Duplicate "
    "GPU detected', or the rendezvous collides and hangs.",
    fix="One launcher per node: `#SBATCH --ntasks-per-node=1` (and `srun torchrun --nproc-per-node=<GPUs>`), or "
    "drop torchrun and let srun start one task per GPU (`srun python train.py`).",
)
def launcher_inside_multi_task_srun(facts, ctx):
    shape = slurm_shape(facts, ctx)
    launcher, tasks = shape.launcher, shape.tasks_here
    ev = shape_evidence(shape, tasks_on_node=tasks, processes_per_task=shape.procs_per_task)
    if launcher not in SPAWNING_LAUNCHERS:
        return passed(
            f"the tasks run {launcher or 'a program'} directly, not a second launcher"
            if launcher
            else "no second launcher seen (give --launcher to check)",
            **ev,
        )
    if not tasks or tasks <= 1 or shape.srun_launch is False:
        return passed(f"{launcher} runs once per node and starts the ranks itself", **ev)
    per = shape.procs_per_task
    if per == 1:
        shared = shape.task_gpus or 0
        if shared > 1 and not _tasks_bound_to_own_gpus(shape):
            count = shape.gpus_per_node or shared
            fix = directive_fix(
                shape,
                facts,
                f"One {launcher} per node starting all ranks: --ntasks-per-node=1",  # the rest named below
                {"ntasks-per-node": "1", **same_cpus_per_node(shape, tasks, 1)},
            )
            flag = LAUNCHER_TABLE[launcher].process_count_flag
            if fix.safety is Safety.UNSAFE and flag and shape.script:  # the launcher's own count on the launch line
                extra: tuple[Action, ...] = (
                    Action(ActionKind.OVERRIDE_SET, shape.script, value=str(count), key=flag.lstrip("-")),
                )
                launch = getattr(ctx.sbatch, "launch", None)
                nnodes = str(shape.nodes or 1)
                if launch is not None and launch.nnodes and str(launch.nnodes) != nnodes:
                    # N one-process torchruns per node posed as N "nodes": one per node now, so --nnodes = nodes
                    extra += (Action(ActionKind.OVERRIDE_SET, shape.script, value=nnodes, key="nnodes"),)
                named = ", ".join(f"--{a.key}={a.value}" for a in extra)
                fix = Fix(f"{fix.title} and {launcher} {named}", fix.safety, fix.actions + extra)
            ev["why"] = (
                f"every task sees all {shared} GPUs and each {launcher} sets LOCAL_RANK=0, so ranks that select "
                "cuda:LOCAL_RANK all land on GPU 0 (NCCL 'Duplicate GPU detected'); only a script that picks its "
                "GPU from SLURM_LOCALID or RANK avoids it"
            )
            return warn(
                f"srun starts {tasks} one-worker {launcher}s per node, each with LOCAL_RANK=0: all on GPU 0",
                fix,
                **ev,
            )
        return passed(f"{launcher} starts one process in each of the {tasks} tasks per node", **ev)
    fix = _one_launcher_per_node(shape, facts, ctx, launcher, tasks, per)
    total = (
        f"{tasks} x {per} = {tasks * per}" if per else f"{tasks} x its {LAUNCHER_TABLE[launcher].process_count_flag}"
    )
    gpus = f" on {shape.gpus_per_node} GPU(s)" if shape.gpus_per_node else ""
    if shape.srun_launch is None:
        # srun takes the job's SLURM_NTASKS as its task count and ignores a lone --ntasks-per-node against it.
        nodes = shape.nodes or 1
        ev["start the launcher with"] = f"srun -N {nodes} -n {nodes} --ntasks-per-node=1"
        return warn(
            f"{tasks} tasks per node each start {launcher} under plain srun: {total} processes{gpus}", fix, **ev
        )
    ev["consequence"] = "separate worlds: NCCL 'Duplicate GPU detected', or the rendezvous hangs"
    return fail(f"srun starts {tasks} tasks per node, each a {launcher}: {total} processes{gpus}", fix, **ev)


def _one_launcher_per_node(shape: JobShape, facts, ctx, launcher: str, tasks: int, per: int | None) -> Fix:
    """--ntasks-per-node=1 with the CPUs of the node's tasks kept for its one launcher (issue 38: changing the
    task count alone left the launcher one task's CPUs): the job's own per-node CPUs when it states
    --cpus-per-task, else the node's CPUs where gpudoctor knows the node; else what to ask for, by hand."""
    cpus = same_cpus_per_node(shape, tasks, 1)
    if not cpus and not shape.directives.get("cpus-per-task"):
        node = known_node_cpus(facts, ctx)
        cpus = {"cpus-per-task": str(node)} if node else {}
        if not node:
            ranks = f"its {per} ranks" if per else "its ranks"
            return manual(
                f"One {launcher} per node: --ntasks-per-node=1, with --cpus-per-task for {ranks} "
                "(the node's CPUs are not known here)",
                "#SBATCH --ntasks-per-node=1",
                f"#SBATCH --cpus-per-task=<CPUs for {ranks}: (num_workers + 1) each>",
            )
    changes = {"ntasks-per-node": "1", **cpus}
    title = f"One {launcher} per node: " + " and ".join(f"--{k}={v}" for k, v in changes.items())
    return directive_fix(shape, facts, title, changes)


def _tasks_bound_to_own_gpus(shape: JobShape) -> bool:
    """SLURM gives each task only its own GPUs: --gpus-per-task, --ntasks-per-gpu, or a per-task --gpu-bind."""
    if shape.gpus_per_task:
        return True
    options = {**shape.directives, **(shape.srun_options or {})}
    if "ntasks-per-gpu" in options:
        return True
    bind = str(options.get("gpu-bind") or shape.evidence.get("SLURM_GPU_BIND") or "").split(",")[-1].strip()
    bind = bind.split("verbose,")[-1]
    return bind.startswith(("single:", "per_task:", "map_gpu:", "mask_gpu:"))


@check(
    id="GD-SLURM-012",
    name="multi-task-job-without-srun",
    category="slurm",
    title="A multi-node or multi-task job starts its tasks with srun",
    needs=[],
    requires=["sbatch"],
    scope="job",
    what="For --sbatch: when the job has several nodes, or several tasks running a plain Python script, "
    "checks that the training line starts with srun.",
    why="The batch script runs once, on the first node. Without srun the other nodes stay idle -- torchrun "
    "--nnodes=2 then waits for a node that never joins -- and a plain `python train.py` runs one process "
    "although N tasks were allocated.",
    fix="Start the training with srun: `srun torchrun ...` with --ntasks-per-node=1, or `srun python train.py` "
    "with one task per GPU.",
)
def multi_task_job_without_srun(facts, ctx):
    shape = slurm_shape(facts, ctx)
    if shape.launch_line is None:
        return skip("no training launch line found in the script")
    if shape.srun_launch:
        return passed(f"line {shape.launch_lineno} starts the training with srun", **shape_evidence(shape))
    nodes = shape.nodes or 1
    line = shape.launch_line.split()[0]
    # One launcher per node for launchers that start the ranks themselves; one task per rank otherwise.
    options = f"--nodes={nodes} --ntasks={nodes} --ntasks-per-node=1" if shape.launcher in SPAWNING_LAUNCHERS else ""
    fix = (
        Fix(
            f"Start line {shape.launch_lineno} with srun: `{_with_srun(shape.launch_line, options)} ...`",
            Safety.UNSAFE,
            (Action(ActionKind.SRUN_PREFIX, shape.script, value=options),),
        )
        if shape.script
        else manual(f"Prefix line {shape.launch_lineno} with srun", f"{_with_srun(shape.launch_line)} ...")
    )
    ev = shape_evidence(shape)
    python_not_ranked = shape.launcher == "python" and not one_rank_per_task_under_srun(shape)
    if python_not_ranked and nodes > 1:
        # srun would start one copy per task of a program not known to be distributed (README: do no harm)
        return warn(
            f"{nodes} nodes but line {shape.launch_lineno} starts `{line}` without srun: the other node(s) stay idle",
            manual(
                f"Request --nodes=1 if {line} is one process; start it with srun only if it is one rank per task",
                f"#SBATCH --nodes=1   (or `{_with_srun(shape.launch_line)} ...` for a distributed program)",
            ),
            **{**ev, "program": program_status(shape)},
        )
    if nodes > 1 and shape.launcher != "deepspeed":
        return fail(
            f"{nodes} nodes but line {shape.launch_lineno} starts `{line}` without srun: only the first node runs it"
            + ("; torchrun waits forever" if shape.launcher in ("torchrun", "torch.distributed.launch") else ""),
            fix,
            **ev,
        )
    tasks = shape.ntasks or 1
    if tasks > 1 and shape.launcher == "python":
        once = f"{tasks} tasks allocated but line {shape.launch_lineno} runs `{line}` once, without srun"
        ev["batch shell"] = "runs it once: one process with the CPUs the job holds on its first node"
        program = program_of(shape)
        if program is not None and program.known:
            ev["program"] = program.describe()
        if one_rank_per_task_under_srun(shape):
            return warn(f"{once}: {tasks - 1} rank(s) never start", fix, **ev)
        if wants_torchrun(shape):
            return warn(
                f"{once}: the program needs torchrun (srun does not set RANK/LOCAL_RANK)",
                manual(f"Start line {shape.launch_lineno} with torchrun --nproc-per-node=<GPUs>"),
                **ev,
            )
        if program is not None and program.known:
            # fits: the one process gets the CPUs of all the tasks on the first node (a note, shown by default)
            ev["with srun"] = f"srun would start {tasks} copies of it"
            return info(f"{once}: fits a one-process program, which gets the {tasks} tasks' CPUs", **ev)
        if not shape.gpus_per_node or shape.gpus_per_node < 2:  # tasks asked for their CPUs: one program may use them
            ev["no fix"] = unknown_note(shape, tasks)
            return info(f"{once}; the program is not known, so no fix", **ev)
        # Several GPUs and tasks, one process: inconsistent whatever the program does. One process that drives the
        # GPUs itself wants one task; one rank per task wants srun. Which is right is the program's, so both
        # corrections are said and none is made.
        return warn(
            f"{tasks} tasks but line {shape.launch_lineno} runs `{line}` once, without srun: the tasks or the srun is "
            "missing",
            manual(
                f"Either ask for one task (the program is one process), or start line {shape.launch_lineno} with srun "
                "(it is one rank per task)",
                "#SBATCH --ntasks=1",
                f"{_with_srun(shape.launch_line)} ...",
            ),
            note=f"{once}; {unknown_note(shape, tasks)}",
            **ev,
        )
    return passed(
        f"line {shape.launch_lineno} runs once in the batch shell, which fits this job ({shape.launcher or line})", **ev
    )


def _with_srun(line: str, options: str = "") -> str:
    """The launch line's first words with srun in front of its command: assignments written before the command
    (`CUDA_VISIBLE_DEVICES=0,1 python t.py`) stay in front of srun, whose environment its tasks get (srun(1)
    --export=ALL, the default); srun runs its first word as the program, so `srun NAME=V python` would not run."""
    words = line.split()
    lead = 0
    while lead < len(words) and re.match(r"[A-Za-z_][A-Za-z0-9_]*=", words[lead]):
        lead += 1
    srun = "srun " + (options + " " if options else "")
    return " ".join(words[:lead] + [srun.rstrip()] + words[lead : lead + 3])
