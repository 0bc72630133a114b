"""GPU allocation checks: each task has a GPU of its own (GD-SLURM-002), every allocated GPU trains
(GD-SLURM-003), and CUDA_VISIBLE_DEVICES is left to SLURM (GD-SLURM-010).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gpudoctor import shellquote
from gpudoctor.checks.slurm._shared import (
    directive_fix,
    gpu_request,
    ranks_per_task,
    same_cpus_per_node,
    shape_evidence,
    slurm_shape,
)
from gpudoctor.job.env import probe_env
from gpudoctor.job.process_model import (
    drives_all_gpus,
    one_rank_per_task_under_srun,
    program_of,
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
    Outcome,
    Safety,
    fail,
    info,
    manual,
    passed,
    skip,
    warn,
)
from gpudoctor.registry import check

# ---------------------------------------------------------------- GD-SLURM-002


def _program_words(ctx) -> str:
    """The program a batch script's launch line runs (`python train.py`), for a message; `python` when unknown."""
    launch = ctx.sbatch.launch if ctx.sbatch is not None else None
    command = launch.python_command() if launch is not None else None
    return " ".join(command.split()[:2]) if command else "python"


@check(
    id="GD-SLURM-002",
    name="several-tasks-share-one-gpu",
    category="slurm",
    title="Each SLURM task has a GPU of its own",
    needs=["env"],
    requires=["slurm-job"],
    scope="job",
    what="Compares the tasks SLURM starts on a node (SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE, "
    "--ntasks-per-node) with the GPUs allocated per node (SLURM_GPUS_ON_NODE, SLURM_JOB_GPUS/SLURM_STEP_GPUS, "
    "--gres/--gpus*), and the GPUs each task can see (CUDA_VISIBLE_DEVICES).",
    why="With more tasks than GPUs, several DDP ranks select the same device: NCCL refuses it ('Duplicate GPU "
    "detected') or the ranks wait for each other forever. The classic case asks --gres=gpu:1 with "
    "--ntasks-per-node=8: all eight ranks get GPU 0 and the job hangs.",
    fix="Request one GPU per task (e.g. `#SBATCH --gres=gpu:h200:8` with `--ntasks-per-node=8`), or start one "
    "task per GPU you have (`--ntasks-per-node` = GPUs per node).",
)
def several_tasks_share_one_gpu(facts, ctx):
    shape = slurm_shape(facts, ctx)
    gpus, tasks = shape.gpus_per_node, shape.tasks_here
    if gpus is None:
        return skip(
            "the number of GPUs allocated per node is not known (no "
            "SLURM_GPUS_ON_NODE, SLURM_JOB_GPUS or GPU directive)",
            **shape_evidence(shape),
        )
    if gpus == 0:
        return skip("the job has no GPUs (see GD-SLURM-003)", **shape_evidence(shape))
    if tasks is None:
        return skip("the number of tasks per node is not known", **shape_evidence(shape))
    ev = shape_evidence(shape, tasks_on_node=tasks, gpus_per_node=gpus, gpus_each_task_sees=shape.task_gpus)
    declared = ctx.launcher == "srun"  # `--launcher srun`: the user says each task is a rank -- a fact, not a guess
    if (
        tasks > gpus
        and shape.launcher == "python"
        and shape.from_script
        and not declared
        and not one_rank_per_task_under_srun(shape)
    ):
        return _program_copies_share_gpus(shape, facts, ctx, tasks, gpus, ev)
    if tasks > gpus:
        return _ranks_share_gpus(shape, facts, tasks, gpus, ev)
    if shape.gpus_per_task:
        how = (
            "--gpus-per-task"
            if shape.from_script or "SLURM_GPUS_PER_TASK" in shape.evidence
            else "SLURM's per-task GPU binding"
        )
        return passed(f"{tasks} task(s) per node, each bound to {shape.gpus_per_task} GPU(s) of its own ({how})", **ev)
    see = (
        f"; every task sees all {shape.task_gpus} and must pick cuda:SLURM_LOCALID (Lightning and torchrun do)"
        if tasks > 1 and shape.task_gpus and shape.task_gpus > 1
        else ""
    )
    asked = max(shape.tasks_per_node or [shape.ntasks_per_node or tasks])
    one_process = (shape.procs_per_task or 1) == 1 and shape.launcher not in SPAWNING_LAUNCHERS
    if shape.from_script and shape.srun_launch is False and asked > tasks and one_process:
        # The directives ask for more tasks per node, but no srun starts them: only the batch shell runs the command.
        return info(
            f"--ntasks-per-node/--ntasks ask for {asked} task(s) per node, but the "
            "launch line has no srun: only the batch shell's one process runs the "
            f"training on the node's {gpus} GPU(s) (see GD-SLURM-012 and GD-SLURM-005)",
            **ev,
        )
    return passed(f"{tasks} task(s) per node for {gpus} GPU(s) per node{see}", **ev)


def _program_copies_share_gpus(shape: JobShape, facts, ctx, tasks: int, gpus: int, ev: dict) -> Outcome:
    """More tasks than GPUs running `python` under srun: srun starts one copy of the program per task; ranks that
    hang on a shared GPU are a guess unless the program is known to be one rank per task (README: do no harm) --
    copies sharing a GPU on purpose are a pattern too."""
    program = program_of(shape)
    if program is not None and program.kind == "single" and not program.reads_task_variables:
        # a one-process program that never asks which task it is: every copy trains the same thing
        changes = {"ntasks-per-node": "1", **same_cpus_per_node(shape, tasks, 1)}
        title = "One task per node, with the same CPUs: " + " and ".join(f"--{k}={v}" for k, v in changes.items())
        return warn(
            f"srun starts {tasks} identical copies of a one-process program per node on the shared GPU(s)",
            directive_fix(shape, facts, title, changes),
            **{**ev, "program": f"{program.describe()}; it reads no task variable (SLURM_PROCID...)"},
        )
    what = (
        f"{program.describe()}, so these are {tasks} separate copies of it"
        if program is not None and program.known
        else unknown_note(shape, tasks)
    )
    ev = {**ev, "gpus": _gpu_words(shape), "program": what}
    return info(
        f"{tasks} tasks per node share {gpus} GPU(s): srun starts {tasks} copies of `{_program_words(ctx)}`", **ev
    )


def _ranks_share_gpus(shape: JobShape, facts, tasks: int, gpus: int, ev: dict) -> Outcome:
    """More ranks than GPUs on a node: ask one GPU per task (or one task per GPU where --ntasks-per-gpu is used)."""
    key, value = gpu_request(shape, tasks)
    fix = directive_fix(
        shape,
        facts,
        f"Request one GPU per task: --{key}={value}",  # the other way, fewer tasks: `explain GD-SLURM-002`
        {key: value},
    )
    if "ntasks-per-gpu" in {**shape.directives, **(shape.srun_options or {})}:  # it excludes --ntasks-per-node
        fix = directive_fix(shape, facts, "One task per GPU: --ntasks-per-gpu=1", {"ntasks-per-gpu": "1"})
    who = "all of them get GPU 0" if gpus == 1 else f"{tasks - gpus} of them must share"
    return fail(
        f"{tasks} tasks per node but only {gpus} GPU(s) per node ({_gpu_words(shape)}): {who}; DDP ranks on one "
        "GPU hang or stop with NCCL 'Duplicate GPU detected'",
        fix,
        **ev,
    )


def _gpu_words(shape: JobShape) -> str:
    for name in (
        "#SBATCH --gres",
        "srun --gres",
        "#SBATCH --gpus-per-node",
        "#SBATCH --gpus",
        "SLURM_GPUS_ON_NODE",
        "SLURM_JOB_GPUS",
        "SLURM_STEP_GPUS",
    ):
        if name in shape.evidence:
            return f"{name.replace('#SBATCH ', '')}={shape.evidence[name]}"
    return "the allocation"


# ---------------------------------------------------------------- GD-SLURM-003


def _every_gpu_fix(shape, facts, tasks: int, gpus: int):
    """One task per GPU with the same CPUs per node, started with srun where the line has none."""
    changes = {"ntasks-per-node": str(gpus), **same_cpus_per_node(shape, tasks, gpus)}
    add_srun = shape.srun_launch is False
    return directive_fix(
        shape,
        facts,
        "Use every GPU: "
        + ", ".join(f"--{k}={v}" for k, v in changes.items())
        + (", started with srun" if add_srun else ""),
        changes,
        srun_prefix="" if add_srun else None,
    )


@check(
    id="GD-SLURM-003",
    name="allocated-gpus-left-idle",
    category="slurm",
    title="Every allocated GPU gets a training process",
    needs=["env"],
    requires=["slurm-job"],
    scope="job",
    what="Counts the processes that will train on a node -- SLURM tasks times the processes each task "
    "starts (torchrun --nproc-per-node, deepspeed --num_gpus, accelerate --num_processes, Lightning's own "
    "launcher) -- and compares them with the GPUs allocated per node. Also flags a GPU job that requests "
    "no GPU.",
    why="An idle GPU is paid for and wasted: a job that asks for 8 GPUs and starts one process trains at 1/8 "
    "of the expected speed without any error. A job without a GPU request gets no GPU at all on clusters "
    "that constrain devices.",
    fix="Start one process per GPU: `--ntasks-per-node=<GPUs>` with `srun`, or one task per node running "
    "`torchrun --nproc-per-node=<GPUs>`; or request only the GPUs the job uses.",
)
def allocated_gpus_left_idle(facts, ctx):
    shape = slurm_shape(facts, ctx)
    gpus = shape.gpus_per_node
    if not ctx.gpus_expected and not gpus:
        return skip("no GPUs expected (--expect-gpus 0)", **shape_evidence(shape))
    unread = [p for p in shape.problems if "GPU" in p]
    if gpus is None and unread:  # a GPU value SLURM would refuse: GD-SLURM-001 names it; none allocated is no fact
        return skip(f"the number of GPUs allocated per node is not known: {unread[0]}", **shape_evidence(shape))
    if gpus == 0 or (gpus is None and not shape.from_script and "CUDA_VISIBLE_DEVICES" not in probe_env(facts)):
        return _no_gpu_requested(shape, facts, ctx)
    if gpus is None:
        return skip("the number of GPUs allocated per node is not known", **shape_evidence(shape))
    tasks = shape.tasks_here
    per_task, why = ranks_per_task(shape, facts)
    ev = shape_evidence(shape, tasks_on_node=tasks, gpus_per_node=gpus, processes_per_task=per_task)
    if tasks is None or per_task is None:
        if tasks is not None and tasks < gpus:
            return info(
                f"{tasks} task(s) per node for {gpus} GPU(s): each task "
                f"must use {gpus // max(tasks, 1)} GPU(s) itself; {why}",
                **ev,
            )
        return skip(f"cannot count the processes per node: {why}", **ev)
    ranks = tasks * per_task
    if ranks < gpus and drives_all_gpus(shape) and per_task == 1:
        return passed(
            f"{ranks} process(es) per node for {gpus} GPU(s): {program_of(shape).describe()}",
            **ev,
            **_program_ev(shape),
        )
    if ranks < gpus and shape.launcher == "python" and shape.from_script:
        return _python_leaves_gpus_idle(shape, facts, tasks, per_task, gpus, why, ev)
    if ranks < gpus:
        ev["processes"] = f"{tasks} task(s); {why}"
        return warn(
            f"{ranks} process(es) per node for {gpus} GPU(s): {gpus - ranks} idle unless the program drives several",
            _idle_gpus_fix(shape, facts, tasks, per_task, gpus),
            **ev,
        )
    if ranks > gpus:
        ev["more processes than GPUs"] = "see GD-SLURM-002, GD-SLURM-009 and GD-SLURM-027"
    return passed(f"{ranks} process(es) per node for {gpus} GPU(s) ({tasks} task(s))", processes=why, **ev)


def _gpus_may_come_unasked(shape: JobShape) -> bool:
    """No GPU requested, but the cluster may give a node's GPUs with it (--exclusive, a GPU feature or partition):
    the job's GPU count is then not known to be 0 (GD-SLURM-003 says which)."""
    d = shape.directives
    return bool(d.get("exclusive")) or any(
        re.search(r"(?i)(?<![a-z0-9])gpu", str(d.get(k) or "")) for k in ("constraint", "partition")
    )


def _no_gpu_requested(shape: JobShape, facts, ctx) -> Outcome:
    """A job that requests no GPU (or, inside a job, has none allocated): ask for one GPU per training process of
    a node (4 tasks need 4 GPUs, not 1), unless the user said how many; said, not failed, where the cluster may
    hand out GPUs without a request (--exclusive, a GPU node feature)."""
    per_task = ranks_per_task(shape, facts)[0] if shape.tasks_here else None
    want = ctx.expect_gpus or max(1, (shape.tasks_here or 1) * (per_task or 1))
    key, value = gpu_request(shape, want)
    fix = directive_fix(shape, facts, f"Request the GPUs: --{key}={value}", {key: value})
    fix = _gpu_lookalike_repair(ctx.sbatch) or fix  # the request the user wrote, made readable (GD-SLURM-025)
    unread = _unread_gpu_directives(ctx.sbatch)
    msg = (
        "no GPU requested (--gres=gpu, --gpus*): the job runs without one"
        + ("; its GPU line is not read" if unread else "")
        if shape.from_script
        else "this SLURM job has no GPU allocated (no SLURM_GPUS_ON_NODE, SLURM_JOB_GPUS or CUDA_VISIBLE_DEVICES)"
    )
    ev_gpu = shape_evidence(shape, **({"unread GPU request": unread.lstrip("; ")} if unread else {}))
    if shape.from_script and shape.directives.get("exclusive"):
        ev_gpu["unless"] = "this cluster hands out a whole node's GPUs with --exclusive and no GPU request"
        return warn(msg + ", unless --exclusive gives a node's GPUs", fix, **ev_gpu)
    partition = str(shape.directives.get("partition") or "")
    if shape.from_script and re.search(r"(?i)(?<![a-z0-9])gpu", partition):
        # A GPU partition whose nodes may come with their GPUs unasked (sites that allocate whole nodes, e.g.
        # TACC's gpu-a100 queues) or may need --gres (most): which one is this cluster's, the script cannot say.
        ev_gpu["unless"] = f"partition {partition} gives its nodes' GPUs without a GPU request"
        return warn(msg + f", unless partition {partition} gives its GPUs unasked", fix, **ev_gpu)
    feature = str(shape.directives.get("constraint") or "")
    if shape.from_script and re.search(r"(?i)(?<![a-z0-9])gpu", feature):
        # Sites that select GPU nodes by feature (Cray/CSCS: --constraint=gpu) configure no GPU GRES: the node's
        # GPUs come with it. Elsewhere the request is missing; which one is this cluster's, the script cannot say.
        ev_gpu["unless"] = (
            f"this cluster's nodes with the feature in --constraint={feature} give their GPUs without a "
            "GPU request (as sites that select GPU nodes by feature do); `scontrol show node` shows a Gres= line "
            "where GPUs must be requested"
        )
        msg += f", unless --constraint={feature} nodes give theirs unasked"
        ask = manual(
            "See whether this cluster's GPU nodes must be asked for their GPUs (a Gres=gpu line: add --gres=gpu:N)",
            f"sinfo --Node --format='%N %f %G' | grep -i {shellquote.quote(feature)}",
        )
        return warn(msg, ask, **ev_gpu)
    return (fail if shape.from_script else warn)(msg, fix, **ev_gpu)


def _idle_gpus_fix(shape: JobShape, facts, tasks: int, per_task: int, gpus: int) -> Fix:
    """Use every GPU rather than shrink the job: one task per GPU, or the launcher's count; else request only the
    GPUs the processes use."""
    ranks = tasks * per_task
    if per_task == 1 and shape.launcher not in SPAWNING_LAUNCHERS and shape.from_script:
        return _every_gpu_fix(shape, facts, tasks, gpus)
    launcher = shape.launcher
    if (
        launcher in ("torchrun", "torch.distributed.launch", "deepspeed")
        and shape.script
        and tasks
        and gpus % tasks == 0
    ):
        flag = LAUNCHER_TABLE[launcher].process_count_flag
        if flag:  # each of these launchers has its count flag
            return Fix(
                f"Use every GPU: {launcher} {flag}={gpus // tasks}",
                Safety.UNSAFE,
                (Action(ActionKind.OVERRIDE_SET, shape.script, value=str(gpus // tasks), key=flag.lstrip("-")),),
            )
    key, value = gpu_request(shape, ranks)  # the processes' own count is the program's: ask for what they use
    return directive_fix(
        shape, facts, f"Request only the {ranks} GPU(s) the processes use: --{key}={value}", {key: value}
    )


def _program_ev(shape: JobShape) -> dict:
    program = program_of(shape)
    return {k: v for k, v in program.evidence().items() if k not in shape.evidence} if program is not None else {}


def _python_leaves_gpus_idle(shape: JobShape, facts, tasks: int, per_task: int, gpus: int, why: str, ev: dict):
    """Fewer `python` processes than GPUs in a batch script: judged by what the program is (job/process_model.py);
    a fix that adds tasks or srun only when the program is known to be one rank per task under srun."""
    ranks = tasks * per_task
    program = program_of(shape)
    ev = {**ev, **_program_ev(shape)}
    idle = f"{ranks} process(es) per node for {gpus} allocated GPU(s): {gpus - ranks} stay idle"
    ev = {**ev, "processes": f"{tasks} task(s); {why}"}
    if program is None or not program.known or (program.kind == "spawn" and program.processes is None):
        ev["no fix"] = unknown_note(shape, gpus)
        return info(f"{ranks} process(es) per node for {gpus} GPU(s): the program is not known, so no fix", **ev)
    if one_rank_per_task_under_srun(shape):
        fix = _every_gpu_fix(shape, facts, tasks, gpus)
        return warn(idle, fix, **ev)
    if wants_torchrun(shape) and (shape.nodes or 1) == 1 and shape.script is not None:
        entry = program.path.rsplit("/", 1)[-1] if program.path else "the program"
        fix = manual(
            f"Start {entry} with torchrun, one process per GPU (it reads torchrun's RANK/LOCAL_RANK, which srun "
            "does not set)",
            f"torchrun --standalone --nproc-per-node={gpus} {entry} ...  (line {shape.launch_lineno})",
        )
        return warn(idle, fix, **ev)
    key, value = gpu_request(shape, ranks)
    fix = directive_fix(shape, facts, f"Request only the GPU(s) the program uses: --{key}={value}", {key: value})
    return warn(f"{idle}: {gpus - ranks} GPU(s) stay idle", fix, **ev)


_GPU_OPTION = re.compile(r"(--gres[= ]\S*gpu|--gpus(-per-(node|task|socket))?[= ]|\s-G\s*\d)")


def _unread_gpu_directives(sb) -> str:
    """'; line 10 (#SBATCH --gres=gpu:4) is below the first command ...' for GPU requests sbatch will not read."""
    parts = []
    if sb is None:
        return ""
    for d in sb.late_directives:
        if _GPU_OPTION.search(" " + d.text):
            parts.append(f"line {d.line} ({d.text}) is below the first command, so sbatch ignores it (GD-SLURM-011)")
    for d in sb.commented_directives:  # '##SBATCH' / '# SBATCH' / '  #SBATCH' (GD-SLURM-025 names each slip)
        if _GPU_OPTION.search(" " + d.text):
            how = (
                "is indented: sbatch reads only lines that begin with #SBATCH"
                if d.text.startswith("#SBATCH")
                else "is commented out"
            )
            parts.append(f"line {d.line} ({d.text}) {how}")
    return "; " + "; ".join(parts) if parts else ""


def _gpu_lookalike_repair(sb) -> Fix | None:
    """The repair of header lines that ask for GPUs but that sbatch does not read (`# SBATCH --gres=gpu:4`,
    `!#SBATCH ...` hiding the request below it): the GPUs the user asked for, not a count guessed here."""
    if sb is None or not sb.path:
        return None
    gpu = ("gres", "gpus", "gpus-per-node", "gpus-per-task")
    late = {d.line: d.text for d in sb.late_directives}
    lines = [
        la
        for la in getattr(sb, "lookalike_directives", ())
        if la.repairable
        and (any(k in gpu for k, _ in la.options) or any(_GPU_OPTION.search(" " + late.get(n, "")) for n in la.hides))
    ]
    if not lines:
        return None
    return Fix(
        "Make sbatch read the GPU request written: " + "; ".join(f"line {la.line} as `{la.repaired}`" for la in lines),
        Safety.UNSAFE,  # sbatch then reads a resource request
        tuple(Action(ActionKind.DIRECTIVE_REPAIR, sb.path, value=la.text) for la in lines),
    )


# ---------------------------------------------------------------- GD-SLURM-010


@check(
    id="GD-SLURM-010",
    name="cuda-visible-devices-overrides-slurm",
    category="slurm",
    title="CUDA_VISIBLE_DEVICES is left to SLURM",
    needs=["env"],
    requires=["slurm-job"],
    scope="job",
    what="Compares CUDA_VISIBLE_DEVICES with the GPUs SLURM allocated: an `export CUDA_VISIBLE_DEVICES=...` in "
    "the batch script, or, inside the job, a value naming more or fewer GPUs than SLURM_GPUS_ON_NODE / "
    "SLURM_STEP_GPUS.",
    why="SLURM sets CUDA_VISIBLE_DEVICES to the GPUs it gave the job. Overwriting it with fixed indices "
    "(0,1,...,7) points the job at GPUs it was not given on a shared node -- another job's GPUs -- or, "
    "where cgroups hide the others, CUDA stops at the first missing index and the job sees fewer GPUs.",
    fix="Delete the `export CUDA_VISIBLE_DEVICES=...` line and request the GPUs with --gres/--gpus instead.",
)
def cuda_visible_devices_overrides_slurm(facts, ctx):
    shape = slurm_shape(facts, ctx)
    if shape.from_script:
        return _exported_in_script(shape, ctx.sbatch.path)
    return _visible_to_this_task(shape, probe_env(facts))  # the GPUs SLURM gave this task


def _exported_in_script(shape: JobShape, script: str) -> Outcome:
    """The batch script's own CUDA_VISIBLE_DEVICES, against the GPUs the job gets per node."""
    gpus = shape.gpus_per_node
    exp = shape.cuda_visible_export
    if not exp or exp.value is None:
        return passed("the script leaves CUDA_VISIBLE_DEVICES to SLURM", **shape_evidence(shape))
    from gpudoctor.job.env import script_argument_note
    from gpudoctor.readers.cudavis import parse_visible_devices

    argument = script_argument_note(exp.value, shape.where.rsplit("/", 1)[-1])
    named = None if argument else parse_visible_devices(exp.value).count
    # Dropping the export is meaning-preserving only when it named exactly the GPUs the job gets per node.
    same = named is not None and named == gpus
    what = "the export" if not exp.command_only else "the assignment"
    fix = Fix(
        f"Drop line {exp.line}'s {what.removeprefix('the ')} of CUDA_VISIBLE_DEVICES; SLURM sets it",
        Safety.SAFE if same else Safety.UNSAFE,
        (Action(ActionKind.EXPORT_REMOVE, script, key="CUDA_VISIBLE_DEVICES"),),
    )
    ev = shape_evidence(shape, gpus_named=named, gpus_per_node=gpus)
    if gpus and named == 0:  # CUDA: an empty (or invalid first) entry hides every device
        return fail(
            f"line {exp.line} {exp.described()}: it names no GPU, so the program sees none of the {gpus} the job "
            "gets per node (torch.cuda.device_count() is 0)",
            fix,
            **ev,
        )
    if gpus is not None and named is not None and named > gpus and not (gpus == 0 and _gpus_may_come_unasked(shape)):
        return fail(
            f"line {exp.line} {exp.described()} ({named} GPUs) but the job gets {gpus} per node: it points at "
            "GPUs not given to it",
            fix,
            **ev,
        )
    if argument:
        return warn(
            f"line {exp.line} {exp.described()}: {argument}. Whatever it names replaces "
            "the GPUs SLURM assigns (on a shared node, indices can be another job's GPUs), and an empty value "
            "hides every GPU from the program",
            fix,
            **ev,
        )
    ev = {**ev, "export": f"line {exp.line} {exp.described()}"}
    return warn(
        f"line {exp.line} sets CUDA_VISIBLE_DEVICES over SLURM's choice: on a shared node, another job's GPUs",
        fix,
        **ev,
    )


def _visible_to_this_task(shape: JobShape, env: Mapping[str, str]) -> Outcome:
    """Inside the job: the GPUs CUDA_VISIBLE_DEVICES names, against those SLURM allocated to the task."""
    gpus = shape.gpus_per_node
    if "CUDA_VISIBLE_DEVICES" not in env:
        return passed(
            "CUDA_VISIBLE_DEVICES is not set"
            + ("" if not gpus else " (SLURM normally sets it: check that gres.conf names the GPU device files)"),
            **shape_evidence(shape),
        )
    if gpus is None:
        return skip("no GPU allocation to compare CUDA_VISIBLE_DEVICES with", **shape_evidence(shape))
    from gpudoctor.readers.cudavis import parse_visible_devices

    seen = parse_visible_devices(env["CUDA_VISIBLE_DEVICES"]).count
    expected = shape.gpus_per_task or gpus
    ev = shape_evidence(shape, gpus_visible=seen, gpus_expected_per_task=expected)
    if seen is not None and seen > expected:
        return fail(
            f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']} names {seen} GPU(s) but SLURM allocated {expected}: "
            "it was overwritten and points at GPUs the job was not given",
            manual("Do not set CUDA_VISIBLE_DEVICES in the job; SLURM sets it"),
            **ev,
        )
    if (
        seen is not None
        and seen < expected
        and "SLURM_GPUS_PER_TASK" not in env
        and "--gpu-bind" not in str(env.get("SLURM_GPU_BIND", ""))
    ):
        return warn(
            f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']} shows {seen} of the {expected} GPU(s) SLURM "
            "allocated: the rest stay idle",
            manual("Do not narrow CUDA_VISIBLE_DEVICES in the job; request fewer GPUs instead"),
            **ev,
        )
    return passed(f"CUDA_VISIBLE_DEVICES shows the {seen} GPU(s) SLURM allocated to this task", **ev)
