"""Lightning under SLURM: devices and num_nodes against SLURM's tasks (GD-SLURM-005), and the job names that
switch Lightning's SLURM detection off (GD-SLURM-006).
"""

from __future__ import annotations

from gpudoctor.checks.slurm._shared import (
    directive_fix,
    gpu_request,
    lightning_major_or_current,
    same_cpus_per_node,
    shape_evidence,
    slurm_shape,
)
from gpudoctor.job.lightning import LightningPlan, lightning_plan
from gpudoctor.job.shape import JobShape
from gpudoctor.model import Fix, Outcome, fail, info, passed, skip, warn
from gpudoctor.registry import check

# ---------------------------------------------------------------- GD-SLURM-005


@check(
    id="GD-SLURM-005",
    name="lightning-devices-mismatch-slurm-tasks",
    category="slurm",
    title="Lightning's devices and num_nodes match SLURM's tasks",
    needs=["env", "slurm"],
    requires=["slurm-job"],
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
    shape = slurm_shape(facts, ctx)
    if shape.launcher != "lightning":
        return skip(
            f"not a Lightning job (launcher: {shape.launcher or 'unknown'}; give --launcher lightning to check)",
            **shape_evidence(shape),
        )
    major, assumed = lightning_major_or_current(facts)
    plan = lightning_plan(shape, major)
    version = (facts.slurm.get("packages") or {}) if facts.slurm else {}
    lv = version.get("lightning") or version.get("pytorch_lightning") or f"not known here (judged as {major}.x)"
    note = f" ({assumed})" if assumed else ""
    ev = shape_evidence(
        shape,
        lightning_version=lv,
        devices=plan.devices,
        num_nodes=plan.num_nodes,
        slurm_detected=plan.slurm_detected,
        SLURM_NTASKS=shape.ntasks if shape.ntasks_in_env else None,
    )
    per_node_fix = _per_task_fix(shape, facts, plan)
    if note:
        ev["lightning_version_judged"] = note.strip(" ()")
    if plan.errors:
        who = f"Lightning {major}.x" if major else "Lightning 2.x"
        ev["lightning_error"] = plan.errors  # Lightning's own words, with its HINT
        hints = "; ".join(e.split("HINT: ", 1)[-1].rstrip(".") for e in plan.errors)
        msg = f"{who} will refuse to start with a ValueError (its hint: {hints})"
        if plan.version_dependent:  # 1.x starts its own processes instead; which one is installed is not known
            ev["lightning_1x"] = f"would start its own {plan.devices} process(es) per task instead"
            return warn(f"{msg}; installed version unknown", per_node_fix, **ev)
        return fail(msg, per_node_fix, **ev)
    if plan.hang:
        return fail(plan.hang, per_node_fix, **ev)
    if not plan.slurm_detected:
        return _slurm_not_detected(shape, plan, ev)
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
        return _fewer_tasks_than_devices(shape, plan, major, per_node_fix, ev)
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


def _slurm_not_detected(shape: JobShape, plan: LightningPlan, ev: dict) -> Outcome:
    """Lightning does not see SLURM (no SLURM_NTASKS, or an interactive job name): it starts its own processes."""
    why = (
        f"the job name is '{shape.job_name}'"
        if shape.interactive_name
        else "SLURM_NTASKS is not set (no --ntasks/--ntasks-per-node)"
    )
    if (shape.tasks_here or 1) > 1:
        return skip(f"{why}: Lightning ignores SLURM's tasks (see GD-SLURM-006)", **ev)
    count = f"{plan.devices} process(es)" if plan.devices else "processes"
    return passed(f"{why}, so Lightning starts its own {count} per node ({plan.devices_source})", **ev)


def _fewer_tasks_than_devices(shape: JobShape, plan: LightningPlan, major: int, fix: Fix, ev: dict) -> Outcome:
    """SLURM starts fewer tasks per node than Lightning's devices: 2.x trains on that many GPUs (the world size is
    SLURM_NTASKS), 1.x started the rest itself."""
    ranks, wanted = plan.ranks_per_node, plan.devices
    ev["why"] = (
        f"SLURM starts {ranks} task(s) per node (world size SLURM_NTASKS={shape.ntasks}) and Lightning is given "
        f"{plan.devices_source}; Lightning 2.x takes the world size from SLURM_NTASKS"
    )
    if shape.srun_launch is not True and shape.ntasks_option is not None and (shape.nodes or 1) == 1:
        ev["or"] = (
            f"on one node, dropping --ntasks={shape.ntasks_option} (SLURM_NTASKS then stays unset) also lets "
            "Lightning start them"
        )
    if plan.spawns is None:
        return warn(
            f"Lightning 2.x would train on {ranks} of {wanted} GPU(s) per node (1.x starts the rest; version unknown)",
            fix,
            **ev,
        )
    return fail(f"Lightning {major}.x trains on {ranks} of {wanted} GPU(s) per node, silently", fix, **ev)


def _per_task_fix(shape: JobShape, facts, plan) -> Fix:
    auto = "devices" not in shape.lightning
    if shape.gpus_per_task and shape.gpus_per_node:  # Lightning wants every task to see the node's GPUs
        key, value = gpu_request(shape, shape.gpus_per_node)
        key = "gres" if key == "gpus-per-task" else key
        return directive_fix(
            shape,
            facts,
            f"Drop --gpus-per-task and request --{key}={value}: each task then sees all GPUs and picks its own",
            {"gpus-per-task": None, key: value},
        )
    if auto and shape.tasks_here and shape.gpus_per_node is not None and shape.tasks_here > shape.gpus_per_node:
        key, value = gpu_request(shape, shape.tasks_here)  # devices=auto follows the GPUs: request one per task
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
        key, value = gpu_request(shape, int(declared))
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
    changes.update(same_cpus_per_node(shape, 1 if shape.srun_launch is False else shape.tasks_here, int(devices)))
    nodes_text = f", --nodes={plan.num_nodes}" if plan.num_nodes is not None else ""
    cpus = f", --cpus-per-task={changes['cpus-per-task']}" if "cpus-per-task" in changes else ""  # same CPUs per node
    add_srun = shape.from_script and shape.srun_launch is False
    title = f"One SLURM task per GPU: --ntasks-per-node={devices}{nodes_text}{cpus}"
    if add_srun and shape.launch_line:  # a script's launch line is a command, never blank
        title += f", `srun` before line {shape.launch_lineno}"
    return directive_fix(shape, facts, title, changes, srun_prefix="" if add_srun else None)


# ---------------------------------------------------------------- GD-SLURM-006


@check(
    id="GD-SLURM-006",
    name="interactive-job-name-hides-slurm",
    category="slurm",
    title="The job name keeps Lightning's SLURM detection",
    needs=["env"],
    requires=["slurm-job"],
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
    shape = slurm_shape(facts, ctx)
    name = shape.job_name
    ev = shape_evidence(shape, SLURM_JOB_NAME=name)
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
        devices = lightning_plan(shape, lightning_major_or_current(facts)[0]).devices
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
