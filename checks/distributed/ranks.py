"""distributed checks of the launcher's rank variables (RANK, WORLD_SIZE, LOCAL_RANK, NODE_RANK):
well formed, consistent, set per task."""

from __future__ import annotations

import re

from gpudoctor.job.env import job_env
from gpudoctor.job.layout import env_int, in_srun_step, intended_launcher
from gpudoctor.model import (
    fail,
    info,
    manual,
    passed,
    skip,
    warn,
)
from gpudoctor.registry import check


def _rank_env(env: dict) -> dict:
    """The rank variables, without RANK/LOCAL_RANK=-1: HF and accelerate's convention for 'not distributed'."""
    return {k: v for k, v in env.items() if not (k in ("RANK", "LOCAL_RANK") and v.strip() == "-1")}


def _malformed(env: dict) -> list[str]:
    out = []
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK"):
        text = env.get(name)
        if text is None:
            continue
        n = env_int(env, name)
        if n is None:
            out.append(f"{name}={text!r} is not an integer (torch reads it with int())")
        elif n < 0 or (name.endswith("WORLD_SIZE") and n < 1):
            out.append(f"{name}={text!r} is out of range")
    return out


def _inconsistent(env: dict) -> list[str]:
    rank, world = env_int(env, "RANK"), env_int(env, "WORLD_SIZE")
    local, local_world = env_int(env, "LOCAL_RANK"), env_int(env, "LOCAL_WORLD_SIZE")
    out = []
    if rank is not None and world and rank >= world:
        out.append(f"RANK={rank} is not below WORLD_SIZE={world}")
    if local is not None and local_world and local >= local_world:
        out.append(f"LOCAL_RANK={local} is not below LOCAL_WORLD_SIZE={local_world}")
    if local_world and world and local_world > world:
        out.append(f"LOCAL_WORLD_SIZE={local_world} is larger than WORLD_SIZE={world}")
    if local is not None and rank is not None and local > rank:
        out.append(f"LOCAL_RANK={local} is larger than RANK={rank}")
    return out


def _missing(env: dict, exported: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """env:// initialisation needs all four of these once any rank variable is set.

    exported: names a --sbatch script exports with a value only known at run time ($(hostname)).
    """
    needed = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    # torch's env:// handler treats an empty value as unset ("expected, but not set")
    present = [n for n in needed if env.get(n) or n in exported]
    if not any(n in env for n in ("RANK", "WORLD_SIZE")):
        return []
    if (env_int(env, "WORLD_SIZE") or 2) <= 1:  # one process: scripts usually skip init_process_group
        return []
    return [n for n in needed if n not in present]


# Launchers that give each worker RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (torch/distributed/run.py;
# accelerate launch and deepspeed start their workers through it or set the same variables).
_SETS_RANKS = ("torchrun", "torch.distributed.launch", "accelerate", "deepspeed")

_SLURM_PAIRS = (("RANK", "SLURM_PROCID"), ("WORLD_SIZE", "SLURM_NTASKS"), ("LOCAL_RANK", "SLURM_LOCALID"))


def _disagrees_with_slurm(env: dict) -> list[str]:
    """When srun starts each rank as a task, the rank variables must be that task's SLURM values."""
    if not in_srun_step(env) or "TORCHELASTIC_RUN_ID" in env or (env_int(env, "SLURM_NTASKS") or 1) < 2:
        return []
    out = []
    for ours, slurm in _SLURM_PAIRS:
        a, b = env_int(env, ours), env_int(env, slurm)
        if a is not None and b is not None and a != b:
            out.append(f"{ours}={a} but {slurm}={b}")
    return out


def _script_exports(ctx) -> dict:
    """--sbatch's `export NAME=...` lines that set a value (not `unset`)."""
    return {k: v for k, v in (ctx.sbatch.exports if ctx.sbatch is not None else {}).items() if v.value is not None}


_PROGRAM_UNKNOWN = "<your training command>"


def _per_task_ranks(ctx, names: str) -> str:
    """`srun bash -c 'RANK=$SLURM_PROCID ... <the script's own python command>'`: the program the batch script
    runs, never a placeholder file name (issue 25); said to be unknown where no script names it."""
    import shlex

    launch = ctx.sbatch.launch if ctx.sbatch is not None else None
    command = (launch.python_command() if launch is not None else None) or _PROGRAM_UNKNOWN
    return f"srun bash -c {shlex.quote(f'{names} {command}')}"


def _rank_exported_before_srun(facts, ctx):
    """`export RANK=$SLURM_PROCID` in the batch shell: every srun task inherits the batch shell's 0."""
    if not ctx.sbatch:
        return None
    from gpudoctor.job.shape import job_shape

    shape = job_shape(facts, ctx)
    if shape is None:  # none without a batch script
        return None
    exports = _script_exports(ctx)
    names = [
        n
        for n in ("RANK", "LOCAL_RANK", "NODE_RANK")
        # an export above the launch, or the launch's own `RANK=$SLURM_PROCID srun ...`: the batch shell expands both
        if n in exports and (exports[n].line < (shape.launch_lineno or 0) or exports[n].command_only)
    ]
    if not names or not shape.srun_launch or shape.launcher not in ("python", "lightning") or (shape.ntasks or 1) < 2:
        return None  # torchrun/accelerate/deepspeed set RANK and LOCAL_RANK for their workers themselves
    from gpudoctor.job.model import job_model
    from gpudoctor.readers.sbatch.launch import lightning_cli_args

    model = job_model(facts, ctx)
    program = model.program if model is not None else None
    read = program is not None and program.kind is not None
    lightning = shape.launcher == "lightning" or (program is not None and program.kind == "lightning")
    if not read and ctx.sbatch.launch is not None:
        lightning = lightning or lightning_cli_args(ctx.sbatch.launch.script_args)
    if lightning or (program is not None and program.passes_rank):
        # Lightning picks its cluster environment in order, SLURMEnvironment first (SLURM_NTASKS set under srun:
        # lightning/fabric/connector.py _choose_cluster_environment), takes the rank from SLURM_PROCID and passes it
        # to init_process_group itself; a program that passes its own rank likewise: an exported RANK is not read.
        return None
    lines = [f"line {exports[n].line}: {exports[n].text or n + '=' + exports[n].value}" for n in names]
    values = ", ".join(f"{n}={exports[n].value}" for n in names)
    return fail(
        f"{', '.join(names)} exported once in the batch shell: all {shape.ntasks} srun tasks get {values} and collide",
        manual(
            "Set the rank variables inside each task, not in the batch shell",
            _per_task_ranks(ctx, "RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS"),
        ),
        exported=lines,
        launch_line=f"line {shape.launch_lineno}: {shape.launch_line}",
        srun_tasks=shape.ntasks,
        why="the batch shell is task 0: every task inherits its values",
    )


def _node_rank_same_on_every_node(facts, ctx):
    """`srun torchrun --node_rank=$SLURM_NODEID` over several nodes: the batch shell (node 0) expands the
    variable once, before srun copies the line to every node, so every node claims node rank 0."""
    launch = ctx.sbatch.launch if ctx.sbatch is not None else None
    if launch is None:
        return None
    launcher = launch.launcher
    if not launch.srun or launcher not in ("torchrun", "torch.distributed.launch", "accelerate") or launch.standalone:
        return None
    if (launch.rdzv_backend or "static") != "static":
        return None  # c10d/etcd rendezvous hands out node ranks itself
    rank, nnodes, from_config = launch.node_rank, str(launch.nnodes or ""), None
    if launcher != "accelerate" and not nnodes:
        return None  # torchrun's --nnodes defaults to 1: one world per node, GD-SLURM-035's finding, not node ranks
    if launcher == "accelerate" and launch.config_file:
        from gpudoctor.readers.accelerate import accelerate_plan

        plan = accelerate_plan(launch)
        config_rdzv = str((plan.config.values if plan.config else {}).get("rdzv_backend") or "static")
        if plan.machine_rank.value is None or not plan.multi_process or config_rdzv != "static":
            # not read; one process per machine; or a config rendezvous accelerate 1.x ignores (its command line's
            # default 'static' wins) though its maintainers document it: unknown, so not judged
            return None
        rank, nnodes = str(plan.machine_rank.value), str(plan.num_machines.value or "")
        if plan.machine_rank.source != "launch line":
            from_config = plan.machine_rank.source
    if rank is not None and not re.fullmatch(r"\d+", str(rank)):
        return None  # left for each task's shell to expand ('$SLURM_NODEID' in single quotes)
    from gpudoctor.job.shape import job_shape

    shape = job_shape(facts, ctx)
    if shape is None or (shape.nodes or 1) < 2 or (nnodes.isdigit() and int(nnodes) < 2):
        return None
    option = "--machine_rank" if launcher == "accelerate" else "--node_rank"
    given = f"{option}={rank}" if rank is not None else f"no {option} (default 0)"
    why = (
        "; a $SLURM_NODEID on the srun line is expanded once, by the batch shell, which runs on node 0"
        if rank is not None
        else ""
    )
    if from_config:
        given = f"machine_rank: {rank} from {from_config} (no --machine_rank on the line)"
        why = "; the config file is the same on every node"
    return fail(
        f"line {shape.launch_lineno}: every one of {shape.nodes} nodes starts {launcher} as node rank {rank or 0}: "
        "the rendezvous never completes",
        manual(
            "Let each task expand its own node rank, or let the rendezvous assign it",
            f"srun bash -c '{launcher if launcher != 'torch.distributed.launch' else 'torchrun'} "
            f"... {option}=$SLURM_NODEID ...'   (single quotes)",
            "or: --rdzv_backend c10d (node ranks assigned by the rendezvous at --main_process_ip:--main_process_port)"
            if launcher == "accelerate"
            else "or: --rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:29500 (node ranks assigned by the rendezvous)",
        ),
        launch_line=f"line {shape.launch_lineno}: {shape.launch_line}",
        nodes=shape.nodes,
        node_rank=rank,
        given=given + why,
        rdzv_backend=launch.rdzv_backend or "static (default)",
        **({"machine_rank_from": from_config} if from_config else {}),
    )


@check(
    id="GD-DIST-001",
    name="rank-variables-inconsistent",
    category="distributed",
    title="Rank variables present, integer and consistent",
    needs=["env"],
    scope="job",
    what="Reads RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE (and GROUP_RANK, NODE_RANK) as torch "
    "does: each must be an integer, 0 <= RANK < WORLD_SIZE, LOCAL_RANK < LOCAL_WORLD_SIZE <= "
    "WORLD_SIZE; once a rank variable is set, env:// initialisation also needs MASTER_ADDR and "
    "MASTER_PORT. Inside an srun step with several tasks (and no torchrun), RANK, WORLD_SIZE and "
    "LOCAL_RANK must equal SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID. With --sbatch, a multi-node `srun "
    "torchrun`/`srun accelerate launch` on a static rendezvous must give each node its own --node_rank / "
    "--machine_rank. Before a launch (no rank variables set) there is nothing to check.",
    why="init_process_group(init_method='env://') raises on a non-integer or missing variable, and hangs "
    "until its timeout when ranks disagree: two processes that both think they are rank 0, or a "
    "WORLD_SIZE no process count reaches. The classic SLURM mistake is `export RANK=$SLURM_PROCID` in the "
    "batch script, before srun: every task then inherits the batch step's RANK=0; likewise "
    "`srun torchrun --node_rank=$SLURM_NODEID` gives every node node rank 0, since the batch shell expands it.",
    fix="Let the launcher set these variables (torchrun, Lightning, accelerate do). Under srun, set them "
    "inside each task, e.g. `srun bash -c 'RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID "
    "WORLD_SIZE=$SLURM_NTASKS python train.py'`, never in the batch script before srun; the same for "
    "`--node_rank=$SLURM_NODEID` (single quotes), or use torchrun's c10d rendezvous, which assigns node ranks.",
)
def rank_variables_inconsistent(facts, ctx):
    batch_rank = _rank_exported_before_srun(facts, ctx) or _node_rank_same_on_every_node(facts, ctx)
    if batch_rank is not None:
        return batch_rank
    env = _rank_env(job_env(facts, ctx))
    evidence = {
        k: env[k]
        for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        if k in env
    }
    evidence.update({k: env[k] for k in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID") if k in env})
    problems = _malformed(env) + _inconsistent(env) + _disagrees_with_slurm(env)
    if problems:
        return fail(
            "; ".join(problems) + ": init_process_group will raise or hang",
            manual(
                "Let the launcher set the rank variables (per task, inside srun)",
                "env | grep -E '^(RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|SLURM_PROCID)='",
            ),
            **evidence,
        )
    missing = _missing(env, set(_script_exports(ctx)))
    launch = ctx.sbatch.launch if ctx.sbatch is not None else None
    if missing and launch is not None and launch.launcher in _SETS_RANKS:
        missing = []  # the batch script's launcher sets RANK, WORLD_SIZE, MASTER_* for every worker it starts
    evidence = {
        **evidence,
        "srun": "starts one task per rank: the script takes its rank from SLURM_PROCID (as Lightning and most "
        "cluster examples do) or sets RANK inside each task",
    }
    if missing and (_per_task_srun_launch(ctx) and missing == ["RANK"]):
        return info(
            f"WORLD_SIZE={env.get('WORLD_SIZE')} is exported but RANK is not: the program must read SLURM_PROCID",
            manual(
                "Map the rank per task if the script expects RANK",
                _per_task_ranks(ctx, "RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID"),
            ),
            **evidence,
        )
    if missing:
        empty = [n for n in missing if n in env]
        shown = ", ".join(f"{n} (set but empty)" if n in empty else n for n in missing)
        return warn(
            f"rank variables are set but {shown} {'is' if len(missing) == 1 else 'are'} not: "
            "init_process_group('env://') raises unless the script passes them itself",
            manual("Export the missing variables, or launch with torchrun, which sets all of them"),
            missing=missing,
            **evidence,
        )
    if not any(k in env for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")):
        if intended_launcher(ctx) == "srun" and in_srun_step(env) and (env_int(env, "SLURM_NTASKS") or 1) > 1:
            return info(
                "srun sets SLURM_PROCID, not RANK/LOCAL_RANK/WORLD_SIZE: init_process_group('env://') needs them",
                manual(
                    "Map them per task",
                    _per_task_ranks(ctx, "RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS"),
                ),
                **evidence,
            )
        return skip("no rank variables set (a preflight before the launcher runs): nothing to check", **evidence)
    return passed(
        f"RANK={env.get('RANK', '-')} LOCAL_RANK={env.get('LOCAL_RANK', '-')} WORLD_SIZE={env.get('WORLD_SIZE', '-')} "
        f"LOCAL_WORLD_SIZE={env.get('LOCAL_WORLD_SIZE', '-')} are consistent",
        **evidence,
    )


def _per_task_srun_launch(ctx) -> bool:
    """--sbatch's training line is `srun python ...`: every task is one rank."""
    launch = ctx.sbatch.launch if ctx.sbatch is not None else None
    return launch is not None and launch.srun is not None and launch.launcher in ("python", "lightning")
