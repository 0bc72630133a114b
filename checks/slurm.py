"""slurm checks: does the SLURM allocation fit the launcher and the GPUs?

Every check judges a JobShape (gpudoctor.job.shape): the live job when gpudoctor runs inside
one (`srun gpudoctor check`, or a preflight line in the batch script), or a batch script
before submission (`gpudoctor check --sbatch job.slurm`). The same rule, the same words.

Fixes to a batch script are `sbatch_set` actions: key = the long #SBATCH option, value = its
new value (None: remove the directive), target = the script (when gpudoctor runs inside a
job, the batch script SLURM recorded for it, from `scontrol show job`).

Behaviour encoded here, and where it was verified:
- SLURM sets SLURM_NTASKS in the batch shell only with --ntasks or --ntasks-per-node, always
  in srun tasks; SLURM_NTASKS_PER_NODE only with --ntasks-per-node; without --gpus-per-task
  every task of a step sees all the step's GPUs (checked against slurm-wlm 22.05 in the tests).
- Lightning (lightning.fabric.plugins.environments.slurm): SLURM is "detected" when
  SLURM_NTASKS is set and SLURM_JOB_NAME is not 'bash' or 'interactive'; then SLURM must
  start every rank (world size = SLURM_NTASKS), `--ntasks>1` without `--ntasks-per-node`
  raises RuntimeError, and (2.x) tasks per node must equal `devices` and nodes `num_nodes`
  (ValueError). Lightning 1.x only let SLURM manage tasks when SLURM_NTASKS equalled
  devices x num_nodes (_is_slurm_managing_tasks) and started its own processes otherwise;
  2.x does not, so `--ntasks=1` with 8 GPUs trains on one GPU (Lightning issues 17252, 18950).
- SLURM 22.05 release notes: srun no longer reads SLURM_CPUS_PER_TASK; --cpus-per-task must
  be given to srun again or exported as SRUN_CPUS_PER_TASK. SLURM 23.11 walked this back: srun
  reads SLURM_CPUS_PER_TASK again (SRUN_CPUS_PER_TASK deprecated; site docs of ULHPC, NERSC/WarpX
  and CSCS changed their templates accordingly). So only 22.05 to 23.02 drop the CPUs.
"""

from __future__ import annotations

import re

from gpudoctor import shellquote, versions
from gpudoctor.job.env import job_env, probe_env
from gpudoctor.job.lightning import lightning_major, lightning_plan
from gpudoctor.job.process_model import (
    drives_all_gpus,
    one_rank_per_task_under_srun,
    program_of,
    program_status,
    python_processes,
    unknown_note,
    wants_torchrun,
)
from gpudoctor.job.shape import JobShape, job_shape
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
    set_env_reference,
    skip,
    warn,
)
from gpudoctor.readers import slurmfmt
from gpudoctor.registry import check

NOT_IN_SLURM = "not inside a SLURM job (no SLURM_JOB_ID) and no --sbatch script given"
FIXED_AGAIN = (23, 11)  # srun reads SLURM_CPUS_PER_TASK again (see the module docstring)


# ---------------------------------------------------------------- helpers


def _shape(facts, ctx):
    shape = job_shape(facts, ctx)
    return shape, (skip(NOT_IN_SLURM) if shape is None else None)


def _script(shape: JobShape, facts) -> str | None:
    """The batch script a directive fix edits: --sbatch, or the running job's (scontrol's Command)."""
    if shape.script:
        return shape.script
    job = (facts.slurm or {}).get("job") or {}
    if str(job.get("BatchFlag")) == "1" and job.get("Command"):
        return job["Command"].split()[0]
    return None


def directive_fix(
    shape: JobShape, facts, title: str, changes: dict, note: str | None = None, srun_prefix: str | None = None
) -> Fix:
    """#SBATCH changes as sbatch_set/sbatch_remove actions on the script (and, with srun_prefix, `srun` put
    before the launch line); a manual fix when no script is known.

    Always `unsafe`: every directive these checks change is a resource request (GPUs, tasks, nodes, CPUs)
    or the launch topology, which changes what the job does (issue 11: safe means meaning-preserving).
    """
    per_node = changes.get("ntasks-per-node")
    if per_node is not None and "ntasks" in shape.directives and "ntasks" not in changes:
        # With --ntasks the per-node count is only a maximum, and --ntasks=16 at 1 per node on 2 nodes
        # cannot be placed: drop --ntasks unless it equals nodes x ntasks-per-node.
        if not (str(per_node).isdigit() and shape.ntasks_option == int(per_node) * (shape.nodes or 0)):
            changes = {**changes, "ntasks": None}
    target = _script(shape, facts)
    if target:
        actions = tuple(
            Action(ActionKind.SBATCH_SET, target, value=v, key=k)
            if v is not None
            else Action(ActionKind.SBATCH_REMOVE, target, key=k)
            for k, v in changes.items()
        )
        if srun_prefix is not None:
            actions += (Action(ActionKind.SRUN_PREFIX, target, value=srun_prefix),)
        return Fix(title, Safety.UNSAFE, actions)
    lines = [f"#SBATCH --{k}={v}" if v is not None else f"remove #SBATCH --{k}" for k, v in changes.items()]
    if note:
        lines.append(note)
    return manual(title, *lines)


def _gpu_value(shape: JobShape, count: int) -> tuple[str, str]:
    """The directive and value asking for `count` GPUs per node, in the spelling the job already uses."""
    d = shape.directives
    if "gpus-per-node" in d or (not shape.from_script and shape.evidence.get("SLURM_GPUS_PER_NODE")):
        return "gpus-per-node", f"{shape.gpu_type}:{count}" if shape.gpu_type else str(count)
    if "gpus" in d and "gres" not in d:
        return "gpus", f"{shape.gpu_type}:{count * (shape.nodes or 1)}" if shape.gpu_type else str(
            count * (shape.nodes or 1)
        )
    return "gres", f"gpu:{shape.gpu_type}:{count}" if shape.gpu_type else f"gpu:{count}"


def _ev(shape: JobShape, **extra) -> dict:
    out = dict(shape.evidence)
    out.update({k: v for k, v in extra.items() if v is not None})
    return out


def _slurm_version(facts) -> tuple[int, ...] | None:
    return versions.parse((facts.slurm or {}).get("version"))


# Lightning 2.0 (March 2023) is the current major release; 1.x is end-of-life (no releases since 1.9.5).
CURRENT_LIGHTNING_MAJOR = 2


def _lightning_major(facts) -> tuple[int, str | None]:
    """The installed Lightning's major version; when it is not known here (a login node without the training
    env), the current major release, with the note that says so and how to be exact."""
    major = lightning_major(facts)
    if major is not None:
        return major, None
    return CURRENT_LIGHTNING_MAJOR, (
        f"judged as Lightning {CURRENT_LIGHTNING_MAJOR}.x, the current major "
        "release (1.x is end-of-life): the installed version is not known here; "
        "run with --python <the training env's python> to judge the one the job uses"
    )


def _ranks_per_task(shape: JobShape, facts) -> tuple[int | None, str]:
    """Processes each SLURM task becomes (1 for plain python), with the reason."""
    if shape.launcher == "lightning":
        major, assumed = _lightning_major(facts)
        plan = lightning_plan(shape, major)
        if plan.spawns:
            return plan.devices, f"Lightning starts {plan.devices} process(es) per task ({plan.devices_source})"
        if plan.spawns is False:
            note = " (version assumed, see GD-SLURM-005)" if assumed else ""
            return 1, f"Lightning {major}.x runs one rank per SLURM task{note}"
        return None, "depends on the Lightning version (see GD-SLURM-005)"
    if shape.launcher == "python" and shape.from_script:
        return python_processes(shape)  # a spawning program starts its own processes
    if shape.procs_per_task:
        return shape.procs_per_task, f"{shape.launcher} starts {shape.procs_per_task} per task"
    if shape.launcher == "python":
        return python_processes(shape)
    return None, "launcher unknown (give --launcher)"


# ---------------------------------------------------------------- GD-SLURM-001


@check(
    id="GD-SLURM-001",
    name="slurm-job-values-unreadable",
    category="slurm",
    title="SLURM job variables and directives are readable and consistent",
    needs=["env"],
    scope="job",
    what="Parses the job's SLURM values in SLURM's own formats -- SLURM_TASKS_PER_NODE ('2(x3),1'), "
    "node lists ('gpu[01-04,07]'), GPU counts and index lists (SLURM_GPUS_ON_NODE, SLURM_JOB_GPUS, "
    "'gpu:h200:1' gres strings) -- or a batch script's #SBATCH directives, and checks that the task, node "
    "and GPU counts agree with each other.",
    why="Launchers (Lightning, torchrun wrappers, submitit) compute ranks and world sizes from these values; "
    "a hand-exported SLURM_NTASKS or a mistyped directive gives a world size that does not match the "
    "processes that start, and the job hangs at the first collective. sbatch rejects unknown options.",
    fix="Do not export SLURM_* variables yourself; let sbatch/srun set them. Correct the directive the message names.",
)
def slurm_job_values_unreadable(facts, ctx):
    shape, out = _shape(facts, ctx)
    if out:
        return out
    problems = list(shape.problems)
    site_options: list[str] = []
    if shape.from_script:
        problems_, site_options = _unknown_directives(ctx.sbatch)
        problems += problems_
    else:
        problems += _env_inconsistencies(probe_env(facts))
    summary = _summary(shape)
    if problems:
        fix = manual("Let sbatch/srun set SLURM_* variables (do not export them), and correct the directives named")
        renames = _typo_renames(ctx.sbatch) if shape.from_script and shape.script and not shape.problems else []
        if renames and len(renames) == len(problems):
            # sbatch refuses the script as written; the option meant changes what the job asks for (unsafe)
            title = "Correct the option name(s): " + ", ".join(f"{a.key} -> --{a.value}" for a in renames)
            actions = tuple(Action(ActionKind.SBATCH_RENAME, shape.script, value=a.value, key=a.key) for a in renames)
            fix = Fix(title, Safety.UNSAFE, actions)
        return warn(
            f"{len(problems)} SLURM value(s) could not be read or disagree: " + "; ".join(problems),
            fix,
            problems=problems,
            **_ev(shape),
        )
    notes = shape.notes + site_options
    if notes:
        return info(f"{shape.where}: {summary}; " + "; ".join(notes), **_ev(shape, notes=notes))
    return passed(f"{shape.where}: {summary}", **_ev(shape))


def _typo_renames(sb) -> list[Action]:
    """Each unknown #SBATCH option that is a near miss of a real one (key: the name written, value: the one meant)."""
    from gpudoctor.readers.sbatch import close_option

    out = []
    for u in sb.unknown_directives if sb is not None else ():
        for opt in u.options:
            meant = close_option(opt)
            if meant:
                out.append(Action(ActionKind.SBATCH_RENAME, sb.path, value=meant, key=opt.split("=", 1)[0]))
    return out


def _unknown_directives(sb) -> tuple[list[str], list[str]]:
    """(likely typos, which sbatch refuses; other unknown options, which a site plugin may add)."""
    from gpudoctor.readers.sbatch import close_option

    typos, site = [], []
    for u in sb.unknown_directives if sb is not None else ():
        for opt in u.options:
            meant = close_option(opt)
            if not re.fullmatch(r"--?[A-Za-z][\w.-]*(=.*)?", opt, re.S):  # `#SBATCHx`, `#SBATCH =====`: no option
                said = (
                    f"unrecognized option '{opt}'"
                    if opt.startswith("-")
                    else f"Invalid directive found in batch script: {opt}"
                )
                typos.append(f"line {u.line}: '{opt}' is not an option; sbatch refuses the script ('{said}')")
            elif meant:
                typos.append(
                    f"line {u.line}: {opt} is not an sbatch option (did you mean --{meant}?); sbatch refuses the script"
                )
            else:
                site.append(
                    f"line {u.line}: {opt} is not a standard sbatch option: sbatch refuses it unless a site plugin "
                    "(SPANK) on this cluster adds it"
                )
    return typos, site


def _summary(shape: JobShape) -> str:
    parts = [f"{shape.nodes if shape.nodes is not None else '?'} node(s)"]
    if shape.tasks_per_node:
        parts.append(f"tasks per node {shape.tasks_per_node}")
    elif shape.ntasks:
        parts.append(f"{shape.ntasks} task(s)")
    gpus = "?" if shape.gpus_per_node is None else shape.gpus_per_node
    parts.append(f"{gpus} GPU(s) per node" + (f" ({shape.gpu_type})" if shape.gpu_type else ""))
    if shape.cpus_per_task:
        parts.append(f"{shape.cpus_per_task} CPU(s) per task")
    return ", ".join(parts)


def _env_inconsistencies(env: dict) -> list[str]:
    out = []
    in_step = "SLURM_STEP_ID" in env or "SLURM_STEPID" in env
    tasks_var = "SLURM_STEP_NUM_TASKS" if in_step else "SLURM_NTASKS"
    tpn_var = "SLURM_STEP_TASKS_PER_NODE" if in_step else "SLURM_TASKS_PER_NODE"
    nodes_var = "SLURM_STEP_NUM_NODES" if in_step else "SLURM_JOB_NUM_NODES"
    list_var = "SLURM_STEP_NODELIST" if in_step else "SLURM_JOB_NODELIST"
    counts = hosts = None
    try:
        if env.get(tpn_var):
            counts = slurmfmt.parse_tasks_per_node(env[tpn_var], tpn_var)
    except slurmfmt.SlurmFormatError:
        pass  # already reported by the shape
    try:
        if env.get(list_var):
            hosts = slurmfmt.expand_nodelist(env[list_var])
    except slurmfmt.SlurmFormatError as e:
        out.append(f"{list_var}: {e}")
    ntasks = _env_int(env, tasks_var)
    nodes = _env_int(env, nodes_var)
    if counts is not None and ntasks is not None and sum(counts) != ntasks:
        out.append(f"{tasks_var}={ntasks} but {tpn_var}={env[tpn_var]} adds up to {sum(counts)}")
    if counts is not None and nodes is not None and len(counts) != nodes:
        out.append(f"{nodes_var}={nodes} but {tpn_var}={env[tpn_var]} lists {len(counts)} node(s)")
    if hosts is not None and nodes is not None and len(hosts) != nodes:
        out.append(f"{nodes_var}={nodes} but {list_var}={env[list_var]} names {len(hosts)} host(s)")
    for name in ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS"):
        if env.get(name):
            try:
                slurmfmt.parse_index_list(env[name], name)
            except slurmfmt.SlurmFormatError as e:
                out.append(str(e))
    return out


def _env_int(env: dict, name: str) -> int | None:
    try:
        return slurmfmt.parse_int(env[name], name) if name in env else None
    except slurmfmt.SlurmFormatError:
        return None


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
    shape, out = _shape(facts, ctx)
    if out:
        return out
    gpus, tasks = shape.gpus_per_node, shape.tasks_here
    if gpus is None:
        return skip(
            "the number of GPUs allocated per node is not known (no "
            "SLURM_GPUS_ON_NODE, SLURM_JOB_GPUS or GPU directive)",
            **_ev(shape),
        )
    if gpus == 0:
        return skip("the job has no GPUs (see GD-SLURM-003)", **_ev(shape))
    if tasks is None:
        return skip("the number of tasks per node is not known", **_ev(shape))
    ev = _ev(shape, tasks_on_node=tasks, gpus_per_node=gpus, gpus_each_task_sees=shape.task_gpus)
    declared = ctx.launcher == "srun"  # `--launcher srun`: the user says each task is a rank -- a fact, not a guess
    if (
        tasks > gpus
        and shape.launcher == "python"
        and shape.from_script
        and not declared
        and not one_rank_per_task_under_srun(shape)
    ):
        # srun starts one copy of the program per task; ranks that hang on a shared GPU are a guess unless the program
        # is known to be one rank per task (README: do no harm) -- copies sharing a GPU on purpose are a pattern too
        program = program_of(shape)
        if program is not None and program.kind == "single" and not program.reads_task_variables:
            # a one-process program that never asks which task it is: every copy trains the same thing
            changes = {"ntasks-per-node": "1", **_same_cpus_per_node(shape, tasks, 1)}
            return warn(
                f"srun starts {tasks} identical copies of a one-process program per node ({_gpu_words(shape)}): "
                f"{program.describe()} and reads no task variable (SLURM_PROCID...), so each copy trains the same "
                "thing on the shared GPU",
                directive_fix(shape, facts, "One task per node, with the same CPUs: --ntasks-per-node=1", changes),
                **ev,
            )
        what = (
            f"{program.describe()}, so these are {tasks} separate copies of it"
            if program is not None and program.known
            else unknown_note(shape, tasks)
        )
        return info(
            f"{tasks} tasks per node share {gpus} GPU(s) per node ({_gpu_words(shape)}): srun starts {tasks} copies of "
            f"`{_program_words(ctx)}` on them; {what}",
            **ev,
        )
    if tasks > gpus:
        key, value = _gpu_value(shape, tasks)
        fix = directive_fix(
            shape,
            facts,
            f"Request one GPU per task: --{key}={value} (or --ntasks-per-node={gpus} to match the {gpus} GPU(s))",
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
    changes = {"ntasks-per-node": str(gpus), **_same_cpus_per_node(shape, tasks, gpus)}
    add_srun = shape.srun_launch is False
    return directive_fix(
        shape,
        facts,
        f"Use every GPU: --ntasks-per-node={gpus}" + (", started with srun" if add_srun else ""),
        changes,
        srun_prefix="" if add_srun else None,
    )


@check(
    id="GD-SLURM-003",
    name="allocated-gpus-left-idle",
    category="slurm",
    title="Every allocated GPU gets a training process",
    needs=["env"],
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
    shape, out = _shape(facts, ctx)
    if out:
        return out
    gpus = shape.gpus_per_node
    if not ctx.gpus_expected and not gpus:
        return skip("no GPUs expected (--expect-gpus 0)", **_ev(shape))
    unread = [p for p in shape.problems if "GPU" in p]
    if gpus is None and unread:  # a GPU value SLURM would refuse: GD-SLURM-001 names it; none allocated is no fact
        return skip(f"the number of GPUs allocated per node is not known: {unread[0]}", **_ev(shape))
    if gpus == 0 or (gpus is None and not shape.from_script and "CUDA_VISIBLE_DEVICES" not in probe_env(facts)):
        # One GPU per training process of a node (4 tasks need 4 GPUs, not 1), unless the user said how many.
        per_task = _ranks_per_task(shape, facts)[0] if shape.tasks_here else None
        want = ctx.expect_gpus or max(1, (shape.tasks_here or 1) * (per_task or 1))
        key, value = _gpu_value(shape, want)
        fix = directive_fix(shape, facts, f"Request the GPUs: --{key}={value}", {key: value})
        fix = _gpu_lookalike_repair(ctx.sbatch) or fix  # the request the user wrote, made readable (GD-SLURM-025)
        msg = (
            f"{shape.where} requests no GPU (no --gres=gpu, --gpus, --gpus-per-node or "
            "--gpus-per-task): the job will run without one" + _unread_gpu_directives(ctx.sbatch)
            if shape.from_script
            else "this SLURM job has no GPU allocated (no SLURM_GPUS_ON_NODE, SLURM_JOB_GPUS or CUDA_VISIBLE_DEVICES)"
        )
        if shape.from_script and shape.directives.get("exclusive"):
            msg += " -- unless this cluster hands out a whole node's GPUs with --exclusive and no GPU request"
            return warn(msg, fix, **_ev(shape))
        feature = str(shape.directives.get("constraint") or "")
        if shape.from_script and re.search(r"(?i)(?<![a-z0-9])gpu", feature):
            # Sites that select GPU nodes by feature (Cray/CSCS: --constraint=gpu) configure no GPU GRES: the node's
            # GPUs come with it. Elsewhere the request is missing; which one is this cluster's, the script cannot say.
            msg += (
                f" -- unless this cluster's nodes with the feature in --constraint={feature} give their GPUs without a "
                "GPU request (as sites that select GPU nodes by feature do); `scontrol show node` shows a Gres= line "
                "where GPUs must be requested"
            )
            ask = manual(
                "See whether this cluster's GPU nodes must be asked for their GPUs (a Gres=gpu line: add --gres=gpu:N)",
                f"sinfo --Node --format='%N %f %G' | grep -i {shellquote.quote(feature)}",
            )
            return warn(msg, ask, **_ev(shape))
        return (fail if shape.from_script else warn)(msg, fix, **_ev(shape))
    if gpus is None:
        return skip("the number of GPUs allocated per node is not known", **_ev(shape))
    tasks = shape.tasks_here
    per_task, why = _ranks_per_task(shape, facts)
    ev = _ev(shape, tasks_on_node=tasks, gpus_per_node=gpus, processes_per_task=per_task)
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
        hint = (
            f"--ntasks-per-node={gpus}"
            if per_task == 1
            else f"{shape.launcher} with {gpus // max(tasks, 1)} process(es) per task"
        )
        fix = directive_fix(
            shape,
            facts,
            f"Use every GPU ({hint}), or request only {ranks}",
            {_gpu_value(shape, ranks)[0]: _gpu_value(shape, ranks)[1]},
        )
        # Prefer using what the job asks for over shrinking it: one task per GPU, or the launcher's count.
        if per_task == 1 and shape.launcher not in SPAWNING_LAUNCHERS and shape.from_script:
            fix = _every_gpu_fix(shape, facts, tasks, gpus)
        elif (
            shape.launcher in ("torchrun", "torch.distributed.launch", "deepspeed")
            and shape.script
            and tasks
            and gpus % tasks == 0
        ):
            flag = LAUNCHER_TABLE[shape.launcher].process_count_flag
            fix = Fix(
                f"Use every GPU: {shape.launcher} {flag}={gpus // tasks}",
                Safety.UNSAFE,
                (Action(ActionKind.OVERRIDE_SET, shape.script, value=str(gpus // tasks), key=flag.lstrip("-")),),
            )
        return warn(
            f"only {ranks} process(es) per node will train on {gpus} allocated GPU(s) ({tasks} task(s); {why}): "
            f"{gpus - ranks} GPU(s) stay idle unless the program drives several GPUs itself",
            fix,
            **ev,
        )
    more = " (more processes than GPUs: see GD-SLURM-002, GD-SLURM-009 and GD-SLURM-027)" if ranks > gpus else ""
    return passed(f"{ranks} process(es) per node for {gpus} GPU(s) ({tasks} task(s); {why}){more}", **ev)


def _program_ev(shape: JobShape) -> dict:
    program = program_of(shape)
    return {k: v for k, v in program.evidence().items() if k not in shape.evidence} if program is not None else {}


def _python_leaves_gpus_idle(shape: JobShape, facts, tasks: int, per_task: int, gpus: int, why: str, ev: dict):
    """Fewer `python` processes than GPUs in a batch script: judged by what the program is (job/process_model.py);
    a fix that adds tasks or srun only when the program is known to be one rank per task under srun."""
    ranks = tasks * per_task
    program = program_of(shape)
    ev = {**ev, **_program_ev(shape)}
    idle = f"only {ranks} process(es) per node will train on {gpus} allocated GPU(s) ({tasks} task(s); {why})"
    if program is None or not program.known or (program.kind == "spawn" and program.processes is None):
        return info(f"{ranks} process(es) per node for {gpus} allocated GPU(s): {unknown_note(shape, gpus)}", **ev)
    if one_rank_per_task_under_srun(shape):
        fix = _every_gpu_fix(shape, facts, tasks, gpus)
        return warn(f"{idle}: {gpus - ranks} GPU(s) stay idle", fix, **ev)
    if wants_torchrun(shape) and (shape.nodes or 1) == 1 and shape.script is not None:
        entry = program.path.rsplit("/", 1)[-1] if program.path else "the program"
        fix = manual(
            f"Start {entry} with torchrun, one process per GPU (it reads torchrun's RANK/LOCAL_RANK, which srun "
            "does not set)",
            f"torchrun --standalone --nproc-per-node={gpus} {entry} ...  (line {shape.launch_lineno})",
        )
        return warn(f"{idle}: {gpus - ranks} GPU(s) stay idle", fix, **ev)
    key, value = _gpu_value(shape, ranks)
    fix = directive_fix(shape, facts, f"Request only the GPU(s) the program uses: --{key}={value}", {key: value})
    return warn(f"{idle}: {gpus - ranks} GPU(s) stay idle", fix, **ev)


# ---------------------------------------------------------------- GD-SLURM-004


@check(
    id="GD-SLURM-004",
    name="ntasks-without-ntasks-per-node",
    category="slurm",
    title="Tasks are placed per node explicitly",
    needs=["env"],
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
    shape, out = _shape(facts, ctx)
    if out:
        return out
    nt = shape.ntasks_option if shape.from_script else shape.ntasks
    default_placement = not shape.from_script and shape.tasks_per_node and set(shape.tasks_per_node) == {1}
    if shape.ntasks_per_node is not None or not nt or nt <= 1 or default_placement:
        return passed(
            "tasks per node are set explicitly"
            if shape.ntasks_per_node
            else "no --ntasks above 1 without --ntasks-per-node",
            **_ev(shape),
        )
    ev = _ev(shape, ntasks=nt)
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


# ---------------------------------------------------------------- GD-SLURM-005


@check(
    id="GD-SLURM-005",
    name="lightning-devices-mismatch-slurm-tasks",
    category="slurm",
    title="Lightning's devices and num_nodes match SLURM's tasks",
    needs=["env", "slurm"],
    scope="job",
    what="For a Lightning job (--launcher lightning, a trainer section in --config, or trainer.* arguments on "
    "the launch line), applies Lightning's own SLURM rules: SLURM is detected when SLURM_NTASKS is set and "
    "the job name is not 'bash'/'interactive'; then SLURM must start every rank, tasks per node must equal "
    "`devices`, nodes must equal `num_nodes`, and --ntasks>1 needs --ntasks-per-node. The installed "
    "Lightning version decides what happens when SLURM starts fewer tasks than devices x num_nodes.",
    why="Lightning 2.x takes the world size from SLURM_NTASKS: with `--ntasks=1` and 8 GPUs it trains on one "
    "GPU and says nothing (Lightning 1.x started the other processes itself, which is why that recipe "
    "once worked). A tasks-per-node/devices mismatch stops Lightning with a ValueError after the job "
    "waited in the queue; a batch script without srun leaves rank 0 waiting for ranks that never start.",
    fix="One task per GPU: `#SBATCH --ntasks-per-node=<devices>`, `#SBATCH --nodes=<num_nodes>`, and launch with "
    "`srun python train.py`. Or, on one node, drop --ntasks/--ntasks-per-node so Lightning starts its own "
    "processes.",
)
def lightning_devices_mismatch_slurm_tasks(facts, ctx):
    shape, out = _shape(facts, ctx)
    if out:
        return out
    if shape.launcher != "lightning":
        return skip(
            f"not a Lightning job (launcher: {shape.launcher or 'unknown'}; give --launcher lightning to check)",
            **_ev(shape),
        )
    major, assumed = _lightning_major(facts)
    plan = lightning_plan(shape, major)
    version = (facts.slurm.get("packages") or {}) if facts.slurm else {}
    lv = version.get("lightning") or version.get("pytorch_lightning") or f"not known here (judged as {major}.x)"
    note = f" ({assumed})" if assumed else ""
    ev = _ev(
        shape,
        lightning_version=lv,
        devices=plan.devices,
        num_nodes=plan.num_nodes,
        slurm_detected=plan.slurm_detected,
        SLURM_NTASKS=shape.ntasks if shape.ntasks_in_env else None,
    )
    per_node_fix = _per_task_fix(shape, facts, plan)
    if plan.errors:
        who = f"Lightning {major}.x" if major else "Lightning 2.x"
        msg = f"{who} will refuse to start: " + " / ".join(f"'{e}'" for e in plan.errors)
        if plan.version_dependent:  # 1.x starts its own processes instead; which one is installed is not known
            return warn(
                msg
                + (
                    f" (Lightning 1.x would start its own {plan.devices} process(es) per task instead; installed "
                    "version unknown)"
                ),
                per_node_fix,
                **ev,
            )
        return fail(msg + note, per_node_fix, **ev)
    if plan.hang:
        return fail(plan.hang + note, per_node_fix, **ev)
    if not plan.slurm_detected:
        why = (
            f"the job name is '{shape.job_name}'"
            if shape.interactive_name
            else "SLURM_NTASKS is not set (no --ntasks/--ntasks-per-node)"
        )
        if (shape.tasks_here or 1) > 1:
            return skip(f"{why}: Lightning ignores SLURM's tasks (see GD-SLURM-006)", **ev)
        count = f"{plan.devices} process(es)" if plan.devices else "processes"
        return passed(f"{why}, so Lightning starts its own {count} per node ({plan.devices_source})", **ev)
    ranks = plan.ranks_per_node
    wanted = plan.devices
    if plan.spawns:
        return info(
            " ".join(plan.notes)
            + "; with Lightning 2.x this job would train on fewer GPUs, so prefer --ntasks-per-node",
            per_node_fix,
            **ev,
        )
    if wanted is not None and ranks is not None and ranks < wanted:
        detail = (
            f"SLURM starts {ranks} task(s) per node (world size SLURM_NTASKS={shape.ntasks}) but Lightning is given "
            f"{plan.devices_source}"
        )
        if shape.srun_launch is not True and shape.ntasks_option is not None and (shape.nodes or 1) == 1:
            alt = (
                f"; on one node, dropping --ntasks={shape.ntasks_option} (SLURM_NTASKS then stays unset) also lets "
                "Lightning start them"
            )
        else:
            alt = ""
        if plan.spawns is None:
            return warn(
                f"{detail}: Lightning 1.x would start the {wanted} processes itself, Lightning 2.x trains on {ranks} "
                f"GPU(s) per node and leaves the rest idle (installed version unknown){alt}",
                per_node_fix,
                **ev,
            )
        return fail(
            f"{detail}: Lightning {major}.x uses SLURM_NTASKS as the world size and trains on {ranks} of {wanted} "
            f"GPU(s) per node, silently{alt}{note}",
            per_node_fix,
            **ev,
        )
    if plan.unknown:  # a Trainer argument the program sets, not shown here: a note, never a guessed failure
        return info(
            f"SLURM starts {ranks} task(s) per node on {shape.nodes} node(s); not judged: " + "; ".join(plan.unknown),
            **ev,
        )
    return passed(
        f"SLURM starts {ranks} task(s) per node for {plan.devices_source} and {shape.nodes} node(s) "
        f"for {plan.num_nodes_source}",
        **ev,
    )


def _same_cpus_per_node(shape: JobShape, old_tasks: int | None, new_tasks: int) -> dict:
    """{'cpus-per-task': N} keeping the CPUs the job asks per node when its tasks per node change
    (1 task x 128 CPUs becomes 8 tasks x 16, not 8 x 128); {} when it cannot be kept exactly."""
    cpt = shape.directives.get("cpus-per-task") if shape.from_script else None
    if cpt is None or not str(cpt).isdigit() or not old_tasks or not new_tasks:
        return {}
    total = int(cpt) * old_tasks
    if total % new_tasks or total < new_tasks or total // new_tasks == int(cpt):
        return {}
    return {"cpus-per-task": str(total // new_tasks)}


def _per_task_fix(shape: JobShape, facts, plan) -> Fix:
    auto = "devices" not in shape.lightning
    if shape.gpus_per_task and shape.gpus_per_node:  # Lightning wants every task to see the node's GPUs
        key, value = _gpu_value(shape, shape.gpus_per_node)
        key = "gres" if key == "gpus-per-task" else key
        return directive_fix(
            shape,
            facts,
            f"Drop --gpus-per-task and request --{key}={value}: each task then sees all GPUs and picks its own",
            {"gpus-per-task": None, key: value},
        )
    if auto and shape.tasks_here and shape.gpus_per_node is not None and shape.tasks_here > shape.gpus_per_node:
        key, value = _gpu_value(shape, shape.tasks_here)  # devices=auto follows the GPUs: request one per task
        return directive_fix(
            shape,
            facts,
            f"Request one GPU per task (--{key}={value}); Lightning's devices=auto then matches",
            {key: value},
        )
    declared = str(shape.directives.get("ntasks-per-node") or "") if shape.from_script else ""
    if (
        auto
        and shape.srun_launch is False
        and declared.isdigit()
        and shape.gpus_per_node is not None
        and int(declared) > shape.gpus_per_node
    ):
        # The script asks for N tasks per node but starts no srun: keep the N ranks it asked for (one GPU each,
        # started by srun) rather than shrink the job to the GPUs it happened to request.
        key, value = _gpu_value(shape, int(declared))
        return directive_fix(
            shape,
            facts,
            f"One GPU per task (--{key}={value}) and start training with `srun` (line {shape.launch_lineno})",
            {key: value},
            srun_prefix="",
        )
    devices = plan.devices or shape.gpus_per_node or 1
    changes: dict[str, str | None] = {"ntasks-per-node": str(devices)}
    if plan.num_nodes is not None:  # an unknown num_nodes leaves the job's nodes as they are
        changes["nodes"] = str(plan.num_nodes)
    if shape.ntasks_option is not None:
        changes["ntasks"] = None
    changes.update(_same_cpus_per_node(shape, 1 if shape.srun_launch is False else shape.tasks_here, int(devices)))
    nodes_text = f", --nodes={plan.num_nodes}" if plan.num_nodes is not None else ""
    title = f"One SLURM task per GPU: --ntasks-per-node={devices}{nodes_text}, and start training with `srun`"
    if "cpus-per-task" in changes:
        title += f" (--cpus-per-task={changes['cpus-per-task']}: the same CPUs per node)"
    add_srun = shape.from_script and shape.srun_launch is False
    if add_srun and shape.launch_line:  # a script's launch line is a command, never blank
        title += f" (line {shape.launch_lineno}: `srun {shape.launch_line.split()[0]} ...`)"
    return directive_fix(shape, facts, title, changes, srun_prefix="" if add_srun else None)


# ---------------------------------------------------------------- GD-SLURM-006


@check(
    id="GD-SLURM-006",
    name="interactive-job-name-hides-slurm",
    category="slurm",
    title="The job name keeps Lightning's SLURM detection",
    needs=["env"],
    scope="job",
    what="Looks at the job name (SLURM_JOB_NAME, --job-name, or the script's file name). Lightning treats "
    "'bash' and 'interactive' as an interactive session and then ignores SLURM's tasks.",
    why="Under those names each srun task runs Lightning's own launcher: 8 tasks x 8 devices start 64 "
    "processes on 8 GPUs; on several nodes Lightning no longer knows the other nodes and waits. The names "
    "come from `srun --pty bash` and `salloc`, and from scripts named after them.",
    fix="Give batch jobs a real name (`#SBATCH --job-name=train`). In an interactive allocation, start a "
    "single process per node and let Lightning launch the rest.",
)
def interactive_job_name_hides_slurm(facts, ctx):
    shape, out = _shape(facts, ctx)
    if out:
        return out
    name = shape.job_name
    ev = _ev(shape, SLURM_JOB_NAME=name)
    if not shape.interactive_name:
        return passed(f"job name '{name}' leaves Lightning's SLURM detection on", **ev)
    if shape.launcher not in ("lightning", None):
        return passed(f"job name '{name}' only matters to Lightning; this job runs {shape.launcher}", **ev)
    fix = directive_fix(
        shape, facts, "Give the job a name Lightning does not treat as interactive", {"job-name": "train"}
    )
    tasks = shape.tasks_here or 1
    if shape.launcher is None:
        return info(
            f"job name '{name}': if this job runs Lightning, Lightning "
            "will ignore SLURM and start its own processes in every task",
            fix,
            **ev,
        )
    if tasks > 1:
        devices = lightning_plan(shape, _lightning_major(facts)[0]).devices
        total = f"{tasks} x {devices} = {tasks * devices}" if devices else f"{tasks} x devices"
        return fail(
            f"job name '{name}': Lightning ignores SLURM's {tasks} tasks per node and each starts its own processes: "
            f"{total} processes on {shape.gpus_per_node if shape.gpus_per_node is not None else '?'} GPU(s)",
            fix,
            **ev,
        )
    if (shape.nodes or 1) > 1:
        return fail(
            f"job name '{name}' on {shape.nodes} nodes: Lightning ignores SLURM, so it does not learn the other nodes "
            "(no MASTER_ADDR/NODE_RANK) and the ranks wait for each other",
            fix,
            **ev,
        )
    return info(
        f"job name '{name}': Lightning ignores SLURM and starts its own processes on this one node, which works here",
        **ev,
    )


# ---------------------------------------------------------------- GD-SLURM-007


@check(
    id="GD-SLURM-007",
    scope="job",
    name="srun-drops-cpus-per-task",
    category="slurm",
    title="srun tasks get the CPUs per task the job asked for",
    needs=["env", "slurm", "host"],
    what="For a job with --cpus-per-task above 1 whose training starts with srun: is SRUN_CPUS_PER_TASK "
    "exported or `srun --cpus-per-task` given; which SLURM version runs (`srun --version`); and, inside a "
    "task, how many CPUs the task may really use (sched_getaffinity).",
    why="SLURM 22.05 to 23.02 srun no longer reads SLURM_CPUS_PER_TASK (release notes 22.05; 23.11 reads it again): a "
    "step started with plain `srun` gets the default of one CPU per task, and with CPU binding every rank and all its "
    "DataLoader workers run on one core. The job runs, many times slower.",
    fix="In the batch script, before srun: `export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK` (harmless on "
    "older SLURM), or `srun --cpus-per-task=$SLURM_CPUS_PER_TASK ...`.",
)
def srun_drops_cpus_per_task(facts, ctx):
    shape, out = _shape(facts, ctx)
    if out:
        return out
    cpt = shape.cpus_per_task
    version = _slurm_version(facts)
    raw_version = (facts.slurm or {}).get("version")
    ev = _ev(shape, slurm_version=raw_version)
    if not cpt or cpt <= 1:
        return passed("no --cpus-per-task above 1 to pass on", **ev)
    if shape.srun_launch is False:
        return passed(f"the training runs in the batch shell (no srun), which has the job's {cpt} CPUs per task", **ev)
    if shape.from_script and not shape.srun_launch and not ctx.sbatch.srun_lines:
        # A finding only where its cause is (issue 25): no srun, no srun step, nothing to inherit.
        return passed(
            f"the script starts no srun step itself (srun appears nowhere in it): its commands run in the batch shell, "
            f"which has the job's {cpt} CPUs per task",
            **ev,
        )
    fix = set_env_reference(
        "SRUN_CPUS_PER_TASK",
        "SLURM_CPUS_PER_TASK",
        title="export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK before srun (or srun --cpus-per-task)",
    )
    allowed = facts.host.get("cpus_allowed_count")
    in_task = not shape.from_script and ("SLURM_STEP_ID" in (here := probe_env(facts)) or "SLURM_STEPID" in here)
    if in_task and isinstance(allowed, int):
        ev["cpus_this_task_may_use"] = allowed
        if allowed < cpt:
            if version is not None and (22, 5) <= version < FIXED_AGAIN:
                cause = (
                    f"SLURM {raw_version} srun does not inherit --cpus-per-task unless SRUN_CPUS_PER_TASK is exported"
                )
            else:
                # srun was told, or inherits it: the node gave fewer (binding, or fewer CPUs than slurm.conf declares)
                cause = (
                    "the step was given fewer CPUs than asked (srun's "
                    "--cpus-per-task, CPU binding, or the node's real CPUs)"
                )
            return fail(
                f"this task may use {allowed} CPU(s) (its affinity mask) but the job asked "
                f"--cpus-per-task={cpt}: {cause}",
                fix,
                **ev,
            )
        return passed(f"this task may use {allowed} CPU(s) for --cpus-per-task={cpt}", **ev)
    if shape.srun_cpus_per_task:
        told = (
            "srun --cpus-per-task"
            if shape.srun_options and "cpus-per-task" in shape.srun_options
            else "SRUN_CPUS_PER_TASK"
        )
        value = "" if shape.srun_cpus_per_task == -1 else f"={shape.srun_cpus_per_task}"
        return passed(f"{told}{value} passes --cpus-per-task={cpt} on to srun", **ev)
    if version is not None and version < (22, 5):
        return passed(f"SLURM {raw_version} srun still inherits --cpus-per-task={cpt} (changed in 22.05)", **ev)
    if version is not None and version >= FIXED_AGAIN:
        return passed(
            f"SLURM {raw_version} srun inherits --cpus-per-task={cpt} again (SLURM_CPUS_PER_TASK is read since 23.11)",
            **ev,
        )
    where = f"line {shape.launch_lineno}: srun" if shape.from_script and shape.launch_lineno else "srun"
    if version is None:
        return info(
            f"SLURM version not known here: on SLURM 22.05 to 23.02 {where} does not inherit --cpus-per-task={cpt} "
            "(SRUN_CPUS_PER_TASK is not set) and each task may get 1 CPU; 23.11 and later inherit it again",
            fix,
            **ev,
        )
    which = f"SLURM {raw_version}"
    if not shape.from_script and not shape.srun_launch and (shape.tasks_here or 1) <= 1 and (shape.nodes or 1) <= 1:
        return info(
            f"{which}: if the training is started with srun from this shell, srun will not inherit "
            f"--cpus-per-task={cpt}; export SRUN_CPUS_PER_TASK",
            fix,
            **ev,
        )
    return warn(
        f"{which}: {where} does not inherit --cpus-per-task={cpt} and SRUN_CPUS_PER_TASK is not set, so each task "
        "may get 1 CPU for its rank and DataLoader workers",
        fix,
        **ev,
    )


# ---------------------------------------------------------------- GD-SLURM-008


@check(
    id="GD-SLURM-008",
    name="cpus-per-task-too-few-for-workers",
    category="slurm",
    title="Each SLURM task has CPUs for its DataLoader workers",
    needs=["env"],
    scope="job",
    what="Compares the CPUs a SLURM task gets (--cpus-per-task / SLURM_CPUS_PER_TASK, else SLURM_CPUS_ON_NODE "
    "over the tasks) with what its ranks need: (num_workers + 1) per rank, times the ranks the task starts "
    "(torchrun --nproc-per-node, Lightning's own launcher). num_workers comes from --config.",
    why="Every rank runs its main process plus num_workers loader processes; squeezed onto fewer CPUs they "
    "take turns and the GPUs wait for data. SLURM gives one CPU per task unless asked for more.",
    fix="Ask for enough CPUs: `#SBATCH --cpus-per-task=<ranks per task x (num_workers + 1)>`, or lower num_workers.",
)
def cpus_per_task_too_few_for_workers(facts, ctx):
    shape, out = _shape(facts, ctx)
    if out:
        return out
    workers = _num_workers(ctx, job_env(facts, ctx))
    if workers is None:
        return skip("num_workers is not known (give the training config with --config)", **_ev(shape))
    per_task, why = _ranks_per_task(shape, facts)
    per_task = per_task or 1
    need = per_task * (workers + 1)
    cpus, source = _task_cpus(shape, probe_env(facts))
    ev = _ev(
        shape,
        num_workers=workers,
        ranks_per_task=per_task,
        cpus_per_task_needed=need,
        cpus_per_task=cpus,
        cpus_source=source,
    )
    if cpus is None:
        fix = directive_fix(shape, facts, f"Ask for {need} CPUs per task", {"cpus-per-task": str(need)})
        return warn(
            f"no --cpus-per-task: SLURM's default is 1 CPU per task (unless the cluster sets DefCpuPerGPU), "
            f"for {per_task} rank(s) x ({workers} workers + 1) = {need} processes",
            fix,
            **ev,
        )
    if cpus < need:
        fix = directive_fix(
            shape, facts, f"Ask for {need} CPUs per task (or lower num_workers)", {"cpus-per-task": str(need)}
        )
        return warn(
            f"{cpus} CPU(s) per task ({source}) for {per_task} rank(s) x ({workers} workers + 1) = {need} processes: "
            "the loaders will starve the GPUs",
            fix,
            **ev,
        )
    return passed(
        f"{cpus} CPU(s) per task ({source}) for {per_task} rank(s) x ({workers} workers + 1) = {need} processes", **ev
    )


def _num_workers(ctx, env: dict) -> int | None:
    from gpudoctor.readers import dlconfig

    settings = dlconfig.from_context(ctx, env)
    value = settings.value("num_workers") if settings else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _task_cpus(shape: JobShape, env: dict) -> tuple[int | None, str | None]:
    if shape.srun_launch and shape.srun_cpus_per_task and shape.srun_cpus_per_task > 0:
        return shape.srun_cpus_per_task, "srun --cpus-per-task / SRUN_CPUS_PER_TASK"
    if shape.cpus_per_task:
        return shape.cpus_per_task, "--cpus-per-task" if shape.from_script else "SLURM_CPUS_PER_TASK"
    if not shape.from_script and env.get("SLURM_CPUS_ON_NODE") and shape.tasks_here:
        n = _env_int(env, "SLURM_CPUS_ON_NODE")
        if n:
            return n // max(shape.tasks_here, 1), f"SLURM_CPUS_ON_NODE={n} over {shape.tasks_here} task(s)"
    return None, None


# ---------------------------------------------------------------- GD-SLURM-009


@check(
    id="GD-SLURM-009",
    name="launcher-inside-multi-task-srun",
    category="slurm",
    title="Only one launcher starts the ranks",
    needs=["env"],
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
    shape, out = _shape(facts, ctx)
    if out:
        return out
    launcher, tasks = shape.launcher, shape.tasks_here
    ev = _ev(shape, tasks_on_node=tasks, processes_per_task=shape.procs_per_task)
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
                f"One {launcher} per node starting all ranks: --ntasks-per-node=1 and "
                f"--nproc-per-node={count} (or bind each task to its GPU with --gpus-per-task=1)",
                {"ntasks-per-node": "1", **_same_cpus_per_node(shape, tasks, 1)},
            )
            flag = LAUNCHER_TABLE[launcher].process_count_flag
            if fix.safety is Safety.UNSAFE and flag and shape.script:  # the launcher's own count on the launch line
                extra = (Action(ActionKind.OVERRIDE_SET, shape.script, value=str(count), key=flag.lstrip("-")),)
                launch = getattr(ctx.sbatch, "launch", None)
                nnodes = str(shape.nodes or 1)
                if launch is not None and launch.nnodes and str(launch.nnodes) != nnodes:
                    # N one-process torchruns per node posed as N "nodes": one per node now, so --nnodes = nodes
                    extra += (Action(ActionKind.OVERRIDE_SET, shape.script, value=nnodes, key="nnodes"),)
                fix = Fix(fix.title, fix.safety, fix.actions + extra)
            return warn(
                f"srun starts {tasks} tasks per node, each a {launcher} with one worker, and "
                f"every task sees all {shared} GPUs: each {launcher} sets LOCAL_RANK=0, so "
                "ranks that select cuda:LOCAL_RANK all land on GPU 0 (NCCL 'Duplicate GPU "
                "detected'); only a script that picks its GPU from SLURM_LOCALID or RANK avoids it",
                fix,
                **ev,
            )
        return passed(f"{launcher} starts one process in each of the {tasks} tasks per node", **ev)
    fix = directive_fix(
        shape,
        facts,
        f"One {launcher} per node: --ntasks-per-node=1 (and --cpus-per-task for all its ranks)",
        {"ntasks-per-node": "1"},
    )
    total = (
        f"{tasks} x {per} = {tasks * per}" if per else f"{tasks} x its {LAUNCHER_TABLE[launcher].process_count_flag}"
    )
    gpus = f" on {shape.gpus_per_node} GPU(s)" if shape.gpus_per_node else ""
    if shape.srun_launch is None:
        # srun takes the job's SLURM_NTASKS as its task count and ignores a lone --ntasks-per-node against it.
        nodes = shape.nodes or 1
        return warn(
            f"{tasks} tasks per node and the launcher is {launcher}: started with plain srun, that is {total} "
            f"processes{gpus}; start the launcher with `srun -N {nodes} -n {nodes} --ntasks-per-node=1`",
            fix,
            **ev,
        )
    return fail(
        f"srun starts {tasks} tasks per node and each runs {launcher}: {total} processes{gpus} in separate worlds "
        "(NCCL 'Duplicate GPU detected', or the rendezvous hangs)",
        fix,
        **ev,
    )


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


# ---------------------------------------------------------------- GD-SLURM-010


@check(
    id="GD-SLURM-010",
    name="cuda-visible-devices-overrides-slurm",
    category="slurm",
    title="CUDA_VISIBLE_DEVICES is left to SLURM",
    needs=["env"],
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
    shape, out = _shape(facts, ctx)
    if out:
        return out
    gpus = shape.gpus_per_node
    if shape.from_script:
        exp = shape.cuda_visible_export
        if not exp or exp.value is None:
            return passed("the script leaves CUDA_VISIBLE_DEVICES to SLURM", **_ev(shape))
        from gpudoctor.job.env import script_argument_note
        from gpudoctor.readers.cudavis import parse_visible_devices

        argument = script_argument_note(exp.value, shape.where.rsplit("/", 1)[-1])
        named = None if argument else parse_visible_devices(exp.value).count
        # Dropping the export is meaning-preserving only when it named exactly the GPUs the job gets per node.
        same = named is not None and named == gpus
        what = "the export" if not exp.command_only else "the assignment"
        fix = Fix(
            f"Drop {what} of CUDA_VISIBLE_DEVICES={exp.value} (line {exp.line} of {shape.where}); SLURM sets it",
            Safety.SAFE if same else Safety.UNSAFE,
            (Action(ActionKind.EXPORT_REMOVE, shape.script, key="CUDA_VISIBLE_DEVICES"),),
        )
        ev = _ev(shape, gpus_named=named, gpus_per_node=gpus)
        if gpus and named == 0:  # CUDA: an empty (or invalid first) entry hides every device
            return fail(
                f"line {exp.line} {exp.described()}: it names no GPU, so the program sees none of the {gpus} the job "
                "gets per node (torch.cuda.device_count() is 0)",
                fix,
                **ev,
            )
        if gpus is not None and named is not None and named > gpus:
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
        return warn(
            f"line {exp.line} {exp.described()}, replacing the GPUs SLURM assigns: on a shared node those indices "
            "can be another job's GPUs",
            fix,
            **ev,
        )
    env = probe_env(facts)  # the GPUs SLURM gave this task
    if "CUDA_VISIBLE_DEVICES" not in env:
        return passed(
            "CUDA_VISIBLE_DEVICES is not set"
            + ("" if not gpus else " (SLURM normally sets it: check that gres.conf names the GPU device files)"),
            **_ev(shape),
        )
    if gpus is None:
        return skip("no GPU allocation to compare CUDA_VISIBLE_DEVICES with", **_ev(shape))
    from gpudoctor.readers.cudavis import parse_visible_devices

    seen = parse_visible_devices(env["CUDA_VISIBLE_DEVICES"]).count
    expected = shape.gpus_per_task or gpus
    ev = _ev(shape, gpus_visible=seen, gpus_expected_per_task=expected)
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


# ---------------------------------------------------------------- GD-SLURM-011 / 012 (batch scripts)

RESOURCE_OPTIONS = (
    "nodes",
    "ntasks",
    "ntasks-per-node",
    "gres",
    "gpus",
    "gpus-per-node",
    "gpus-per-task",
    "cpus-per-task",
    "mem",
    "mem-per-cpu",
    "mem-per-gpu",
    "time",
    "partition",
    "constraint",
    "exclusive",
    "account",
    "qos",
)


@check(
    id="GD-SLURM-011",
    name="sbatch-directive-after-first-command",
    category="slurm",
    title="All #SBATCH directives come before the first command",
    needs=[],
    scope="job",
    what="Finds #SBATCH lines below the first command of a batch script (--sbatch).",
    why="sbatch stops reading directives at the first line that is not a comment or blank: a `module load` "
    "or `set -e` above them makes every later #SBATCH line a comment, and the job runs with the default "
    'resources -- often no GPU -- without a warning (sbatch man page: directives come "before any executable '
    'commands"; sbatch stops at the first non-comment, non-whitespace line, https://slurm.schedmd.com/sbatch.html).',
    fix="Move all #SBATCH lines directly under the #! line, before any command.",
)
def sbatch_directive_after_first_command(facts, ctx):
    if ctx.sbatch is None:
        return skip("no --sbatch script given")
    late = ctx.sbatch.late_directives
    if not late:
        return passed("every #SBATCH directive is read")
    path = ctx.sbatch.path
    lines = [f"line {d.line}: {d.text}" for d in late]
    important = [d for d in late if any(f"--{o}" in d.text or _short_form(d.text, o) for o in RESOURCE_OPTIONS)]
    # Moving them makes sbatch read them: a resource line then changes what the job asks for (unsafe).
    fix = Fix(
        f"Move these #SBATCH lines above the first command of {path}: " + "; ".join(lines),
        Safety.UNSAFE if important else Safety.SAFE,
        tuple(Action(ActionKind.SBATCH_HOIST, path, value=d.text) for d in late),
    )
    sev = fail if important else warn
    first = ctx.sbatch.first_command_line
    stray = next((la for la in ctx.sbatch.lookalike_directives if la.form == "command" and la.line == first), None)
    cause = (
        f" (the first command is line {first}, `{stray.text}`: a directive with a stray character before "
        "#SBATCH, see GD-SLURM-025)"
        if stray
        else ""
    )
    return sev(
        f"sbatch ignores {len(late)} #SBATCH line(s) below the first command{cause}: " + "; ".join(lines),
        fix,
        ignored=lines,
    )


def _short_form(text: str, option: str) -> bool:
    from gpudoctor.readers.sbatch import SHORT

    return any(f" -{k}" in f" {text.split('#SBATCH', 1)[-1]}" for k, v in SHORT.items() if v == option)


@check(
    id="GD-SLURM-012",
    name="multi-task-job-without-srun",
    category="slurm",
    title="A multi-node or multi-task job starts its tasks with srun",
    needs=[],
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
    if ctx.sbatch is None:
        return skip("no --sbatch script given")
    shape = job_shape(facts, ctx)
    if shape.launch_line is None:
        return skip("no training launch line found in the script")
    if shape.srun_launch:
        return passed(f"line {shape.launch_lineno} starts the training with srun", **_ev(shape))
    nodes = shape.nodes or 1
    line = shape.launch_line.split()[0]
    # One launcher per node for launchers that start the ranks themselves; one task per rank otherwise.
    options = f"--nodes={nodes} --ntasks={nodes} --ntasks-per-node=1" if shape.launcher in SPAWNING_LAUNCHERS else ""
    fix = (
        Fix(
            f"Start line {shape.launch_lineno} with srun: "
            f"`srun {(options + ' ') if options else ''}{_first_words(shape.launch_line)} ...`",
            Safety.UNSAFE,
            (Action(ActionKind.SRUN_PREFIX, shape.script, value=options),),
        )
        if shape.script
        else manual(f"Prefix line {shape.launch_lineno} with srun", f"srun {_first_words(shape.launch_line)} ...")
    )
    ev = _ev(shape)
    python_not_ranked = shape.launcher == "python" and not one_rank_per_task_under_srun(shape)
    if python_not_ranked and nodes > 1:
        # srun would start one copy per task of a program not known to be distributed (README: do no harm)
        return warn(
            f"{nodes} nodes but line {shape.launch_lineno} starts `{line}` without srun: it runs on the first node "
            f"only and the other node(s) stay idle; {program_status(shape)}",
            manual(
                f"Request --nodes=1 if {line} is one process; start it with srun only if it is one rank per task",
                f"#SBATCH --nodes=1   (or `srun {_first_words(shape.launch_line)} ...` for a distributed program)",
            ),
            **ev,
        )
    if nodes > 1 and shape.launcher != "deepspeed":
        return fail(
            f"{nodes} nodes but line {shape.launch_lineno} starts `{line}` without srun: it runs on the first node only"
            + (
                "; torchrun waits for the other nodes forever"
                if shape.launcher in ("torchrun", "torch.distributed.launch")
                else ""
            ),
            fix,
            **ev,
        )
    tasks = shape.ntasks or 1
    if tasks > 1 and shape.launcher == "python":
        once = (
            f"{tasks} tasks allocated but line {shape.launch_lineno} runs plain `{line}` without srun: the batch "
            "shell runs it once, one process with the CPUs the job holds on its first node"
        )
        program = program_of(shape)
        if one_rank_per_task_under_srun(shape):
            return warn(f"{once}; {program.describe()}, so {tasks - 1} rank(s) never start", fix, **ev)
        if wants_torchrun(shape):
            return warn(
                f"{once}; {program.describe()}: start it with torchrun (srun does not set RANK/LOCAL_RANK)",
                manual(f"Start line {shape.launch_lineno} with torchrun --nproc-per-node=<GPUs>"),
                **ev,
            )
        if program is not None and program.known:
            return info(
                f"{once}, which fits the program: {program.describe()} (srun would start {tasks} copies of it)",
                **ev,
            )
        return info(f"{once}; {unknown_note(shape, tasks)}", **ev)
    return passed(
        f"line {shape.launch_lineno} runs once in the batch shell, which fits this job ({shape.launcher or line})", **ev
    )


def _first_words(text: str, n: int = 3) -> str:
    return " ".join(text.split()[:n])


# ---------------------------------------------------------------- GD-SLURM-013 / 014 (the script as bash reads it)


_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


@check(
    id="GD-SLURM-013",
    name="sbatch-backslash-before-comment",
    category="slurm",
    title="Every line continuation in the batch script continues the command",
    needs=[],
    scope="job",
    what="For --sbatch: finds a backslash followed by blanks (and often a `# comment`) at the end of a line "
    "of a command, e.g. `trainer.params.accelerator=gpu \\    # use GPU`.",
    why="Only a backslash directly before the newline continues a line (bash manual, 3.1.2.1 Escape Character: "
    "https://www.gnu.org/software/bash/manual/html_node/Escape-Character.html). A backslash before a blank "
    "escapes that blank, the `#` word then starts a comment that runs to the end of the line (3.1.3 Comments), "
    "and the newline ends the command: the launch runs without the arguments below it, and bash runs the next "
    "line as a command of its own -- `trainer.params.num_nodes=1: command not found`.",
    fix="Put nothing after the backslash: delete the blanks and move the comment to its own line above the command.",
)
def sbatch_backslash_before_comment(facts, ctx):
    if ctx.sbatch is None:
        return skip("no --sbatch script given")
    broken = ctx.sbatch.broken_continuations
    if not broken:
        return passed("every line ending in a backslash continues its command")
    path = ctx.sbatch.path
    parts, commands, evidence = [], [], {}
    for b in broken:
        comment = " and a comment" if "#" in b.text.rsplit("\\", 1)[-1] else ""
        runs = (
            "as an assignment, not as part of the command"
            if _ASSIGNMENT.match(b.next_program)
            else f"as a command of its own: `{b.next_program[:40]}: command not found`"
        )
        parts.append(
            f"line {b.line} ends with a backslash and blanks{comment}, so the command ends there and bash runs "
            f"line {b.next_line} (`{b.next_text[:80]}`) {runs}"
        )
        commands.append(f"sed -i -E '{b.line}s/\\\\[[:blank:]]+(#.*)?$/\\\\/' {path}")
        evidence[f"line {b.line}"] = b.text
        evidence[f"line {b.next_line}"] = b.next_text
    fix = manual(
        "Delete what follows the backslash on "
        + ", ".join(f"line {b.line}" for b in broken)
        + " (move the comment above the command)",
        *commands,
    )
    if path:
        # Structured: the arguments bash dropped then reach the program, which changes what the job runs (unsafe).
        fix = Fix(
            fix.title, Safety.UNSAFE, tuple(Action(ActionKind.CONTINUATION_REPAIR, path, value=b.text) for b in broken)
        )
    return fail("; ".join(parts), fix, **evidence)


@check(
    id="GD-SLURM-014",
    name="sbatch-script-bash-syntax",
    category="slurm",
    title="bash can parse the batch script",
    needs=[],
    scope="job",
    what="For --sbatch: runs `bash -n` on the script (syntax only, nothing is executed; bounded by a timeout, in "
    "its own process group).",
    why="sbatch does not parse the script: a missing `fi`, `done` or quote is found only when the job starts, "
    "after it waited in the queue, and the job then fails at once (bash manual, 6.1 Invoking Bash: `-n` reads "
    "commands without executing them, https://www.gnu.org/software/bash/manual/html_node/Invoking-Bash.html; "
    "sbatch man page: the script is run by the interpreter of its #! line, https://slurm.schedmd.com/sbatch.html).",
    fix="Correct the syntax error bash names (line numbers count from the #! line), then re-run `bash -n SCRIPT`.",
)
def sbatch_script_bash_syntax(facts, ctx):
    if ctx.sbatch is None:
        return skip("no --sbatch script given")
    result = ctx.sbatch.bash_syntax
    if result is None:
        return skip("the script's syntax was not checked (read without `bash -n`)")
    if result.ok is None:
        return skip(result.message)
    if result.ok:
        return passed("bash -n reads the script without a syntax error")
    path = ctx.sbatch.path
    return fail(
        f"bash cannot parse the script: {result.message}; the job would fail as soon as it starts",
        manual("Correct the syntax error, then check again", f"bash -n {path}"),
        bash_n=result.message,
    )


@check(
    id="GD-SLURM-015",
    scope="job",
    name="sbatch-line-runs-as-missing-command",
    category="slurm",
    title="No line of the batch script starts with an argument instead of a command",
    needs=[],
    what="For --sbatch: finds lines whose first word is an option or an override (`--lr 1e-4`, "
    "`trainer.devices=8`), which bash runs as a command of that name.",
    why="A newline ends a command unless a backslash is right before it (bash manual, 3.1.2.1 Escape Character, "
    "https://www.gnu.org/software/bash/manual/html_node/Escape-Character.html). When a line of a long launch "
    "command loses its backslash, the launch runs without the arguments below, and bash then looks the next "
    "line's first word up as a command (3.7.2 Command Search and Execution): `--lr: command not found`. "
    "A dotted name is no shell assignment (3.4 Shell Parameters: a name is letters, digits and underscores).",
    fix="End the line above with a backslash (nothing after it), so the arguments belong to the launch command.",
)
def sbatch_line_runs_as_missing_command(facts, ctx):
    if ctx.sbatch is None:
        return skip("no --sbatch script given")
    stray = ctx.sbatch.stray_arguments
    if not stray:
        return passed("every command of the script starts with a command name")
    parts, evidence = [], {}
    for a in stray:
        above = f"; line {a.previous_line} above ends the command without a backslash" if a.previous_line else ""
        parts.append(
            f"line {a.line} starts with `{a.program[:40]}`, which bash runs as a command: "
            f"`{a.program[:40]}: command not found`{above}"
        )
        evidence[f"line {a.line}"] = a.text
    lines = ", ".join(f"line {a.previous_line}" for a in stray if a.previous_line)
    fix = manual(
        f"End {lines} with a backslash" if lines else "Join these arguments to the command they belong to",
        *(f"line {a.line}: {a.text[:120]}" for a in stray),
    )
    return fail("; ".join(parts), fix, **evidence)
