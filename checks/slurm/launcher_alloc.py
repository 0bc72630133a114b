"""launcher_alloc checks: does the launcher start the ranks the allocation can hold, where the allocation is?

- GD-SLURM-027: a launcher's processes per task against the GPUs that task sees. torchrun
  (torch/distributed/run.py: --nproc-per-node, an int or gpu/auto), deepspeed (deepspeed/launcher/runner.py:
  --num_gpus N uses GPU ids [0:N) on each node, ignoring CUDA_VISIBLE_DEVICES when given) and accelerate
  (accelerate/commands/launch.py: --num_processes is the total over --num_machines; per machine it passes
  num_processes // num_machines to torchrun) start that many workers whatever the node has; each worker calls
  torch.cuda.set_device(LOCAL_RANK), and a rank past the last visible GPU dies with "CUDA error: invalid device
  ordinal" (NCCL also refuses two ranks on one GPU: "Duplicate GPU detected"). Fewer ranks than GPUs is
  GD-SLURM-003's.
- GD-SLURM-028: deepspeed's runner takes its nodes from a hostfile only (--hostfile, default /job/hostfile;
  runner.py fetch_hostfile/main, since 0.3.0, also with --launcher slurm, whose srun line is built from the
  hostfile's slots): without one it warns "Unable to find hostfile, will proceed with training with local
  resources only", forces master_addr 127.0.0.1, and with --num_nodes > 1 raises "Num nodes is >1 but no extra
  nodes available via hostfile".
- GD-SLURM-029: --gpus is the job's total; cons_tres places it node by node, each node taking as many as it can
  while leaving one for each node still to fill (src/plugins/select/cons_common/gres_select_filter.c, 22.05:
  _get_job_cnt, _set_job_bits1: max = gres_per_job - allocated - (remaining nodes - 1)), so the split need not
  be equal, and cannot be when the total is not a multiple of the nodes.
"""

from __future__ import annotations

import re

from gpudoctor.checks.slurm._shared import slurm_shape
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
from gpudoctor.readers import slurmfmt
from gpudoctor.registry import check


def _explicit_count(shape: JobShape, launch) -> str | None:
    """Where the processes-per-task count is written, when it is a fact (a number on the launch line, or
    LOCAL_WORLD_SIZE inside a torchrun worker); None when it is a default or an assumption."""
    if not shape.from_script:
        return "LOCAL_WORLD_SIZE" if "LOCAL_WORLD_SIZE" in shape.evidence else None
    if launch is None or shape.launcher is None or launch.launcher != shape.launcher:
        return None
    flag = LAUNCHER_TABLE[shape.launcher].process_count_flag
    value = launch.num_processes if shape.launcher == "accelerate" else launch.nproc_per_node
    if value is not None and re.fullmatch(r"\d+", str(value).strip()):
        machines = f" over {launch.nnodes} machines" if shape.launcher == "accelerate" and launch.nnodes else ""
        return f"{flag} {value}{machines}"
    return None


@check(
    id="GD-SLURM-027",
    name="launcher-ranks-exceed-task-gpus",
    category="slurm",
    title="A launcher starts no more ranks per node than the GPUs it sees",
    needs=["env"],
    requires=["slurm-job"],
    scope="job",
    what="Compares the workers a launcher starts in each SLURM task -- torchrun/torch.distributed.launch "
    "--nproc-per-node, deepspeed --num_gpus, accelerate --num_processes divided by --num_machines -- with the "
    "GPUs that task sees (--gres/--gpus-per-node, --gpus-per-task). Counts of gpu/auto, and defaults, follow the "
    "GPUs and are fine.",
    why="The launcher starts the workers whatever the node has. Each worker selects cuda:LOCAL_RANK, and every "
    "rank past the last visible GPU dies at torch.cuda.set_device with 'CUDA error: invalid device ordinal' "
    "(deepspeed even drops SLURM's CUDA_VISIBLE_DEVICES when --num_gpus is given and asks for GPU ids 0..N-1); "
    "two ranks on one GPU are refused by NCCL ('Duplicate GPU detected'). `torchrun --nproc_per_node=4` in a job "
    "with --gres=gpu:2 never trains.",
    fix="Start one worker per GPU (`--nproc-per-node=gpu`, or the number of GPUs per node), or request as many "
    "GPUs per node as workers.",
)
def launcher_ranks_exceed_task_gpus(facts, ctx):
    shape = slurm_shape(facts, ctx)
    launch = getattr(ctx.sbatch, "launch", None) if shape.from_script else None
    if shape.launcher not in SPAWNING_LAUNCHERS:
        return skip(f"the launcher ({shape.launcher or 'not known'}) starts no workers of its own per task")
    per_task, gpus = shape.procs_per_task, shape.task_gpus
    ev = {**shape.evidence, "processes_per_task": per_task, "gpus_per_task": gpus}
    if gpus is None or per_task is None:
        return skip("the GPUs per task or the workers per task are not known", **ev)
    if gpus == 0:
        return skip("the job requests no GPU (GD-SLURM-003)", **ev)
    if shape.tasks_here and shape.tasks_here > 1 and shape.srun_launch is not False:
        # several launchers on a node, each starting its workers: GD-SLURM-009 names that (one cause, one finding)
        return skip(f"{shape.tasks_here} {shape.launcher} launchers per node: judged by GD-SLURM-009", **ev)
    written = _explicit_count(shape, launch)
    if per_task <= gpus or written is None:
        return passed(f"{shape.launcher} starts {per_task} worker(s) per task on {gpus} GPU(s)", **ev)
    flag = LAUNCHER_TABLE[shape.launcher].process_count_flag or ""
    where = f"line {launch.line}" if launch is not None else "this task"
    fix = manual(
        f"Start {gpus} worker(s) per task ({flag}={gpus}) or request {per_task} GPU(s) per node",
        f"{flag}={gpus}",
    )
    if launch is not None and shape.script:
        machines = int(launch.nnodes) if shape.launcher == "accelerate" and str(launch.nnodes).isdigit() else 1
        value = str(gpus * machines)
        fix = Fix(
            f"Start one worker per GPU: {flag}={value}"
            + (f" (the total over {machines} machines)" if machines > 1 else "")
            + f", or request {per_task} GPU(s) per node instead",
            Safety.UNSAFE,  # fewer ranks: a different world size and global batch
            (Action(ActionKind.OVERRIDE_SET, shape.script, value=value, key=flag.lstrip("-")),),
        )
    return fail(
        f"{where}: {shape.launcher} starts {per_task} worker(s) per task ({written}) but each task sees {gpus} "
        f"GPU(s): ranks {gpus}..{per_task - 1} of every node die at torch.cuda.set_device(LOCAL_RANK) "
        "('CUDA error: invalid device ordinal'), or NCCL refuses two ranks on one GPU (unless the workers do not "
        "use CUDA)",
        fix,
        **ev,
    )


# ---------------------------------------------------------------- GD-SLURM-028


@check(
    id="GD-SLURM-028",
    name="deepspeed-without-hostfile-on-several-nodes",
    category="slurm",
    title="A multi-node deepspeed launch is given the allocation's hosts",
    needs=[],
    requires=["sbatch"],
    scope="job",
    what="For --sbatch: a `deepspeed` launch line in a job of several nodes, or with --num_nodes above 1, that "
    "gives no --hostfile.",
    why="DeepSpeed's runner learns its nodes only from a hostfile (default /job/hostfile, which SLURM does not "
    "write), also with --launcher slurm. Without one it prints 'Unable to find hostfile, will proceed with "
    "training with local resources only' and sets master_addr to 127.0.0.1: run once, it trains on the first "
    "node while the others idle; run by srun on every node, each node trains a world of its own. With "
    "--num_nodes above 1 it stops: 'Num nodes is >1 but no extra nodes available via hostfile'.",
    fix='Write the hostfile from the allocation and pass it: `scontrol show hostnames "$SLURM_JOB_NODELIST" | '
    "sed 's/$/ slots=<GPUs per node>/' > hostfile` and `deepspeed --hostfile hostfile --num_nodes <N> ...` "
    "(DeepSpeed reaches the nodes by ssh/pdsh, or by srun with --launcher slurm).",
)
def deepspeed_without_hostfile_on_several_nodes(facts, ctx):
    sb = ctx.sbatch
    launch = sb.launch
    if launch is None or launch.launcher != "deepspeed":
        return skip("the training is not launched with deepspeed")
    shape = slurm_shape(facts, ctx)
    nodes = shape.nodes
    asked = int(launch.nnodes) if launch.nnodes and str(launch.nnodes).isdigit() else None
    ev = {"launch line": f"line {launch.line}: {launch.text[:160]}", "nodes": nodes, "--num_nodes": launch.nnodes}
    if launch.hostfile:
        return passed(f"line {launch.line} gives deepspeed a hostfile ({launch.hostfile}; its hosts are not read here)")
    if not (asked and asked > 1) and not (nodes and nodes > 1):
        return passed(f"one node: deepspeed uses the node's own GPUs (line {launch.line})", **ev)
    gpus = shape.gpus_per_node if shape.gpus_per_node else "<GPUs per node>"
    fix = manual(
        "Give deepspeed the allocation's hosts in a hostfile",
        f"scontrol show hostnames \"$SLURM_JOB_NODELIST\" | sed 's/$/ slots={gpus}/' > hostfile",
        f"deepspeed --hostfile hostfile --num_nodes {asked or nodes} ...   (add --launcher slurm to start the nodes "
        "with srun instead of ssh/pdsh)",
    )
    via = (
        f" (--launcher {launch.deepspeed_launcher} also takes its hosts from the hostfile)"
        if (launch.deepspeed_launcher)
        else ""
    )
    if asked and asked > 1:
        ev["deepspeed"] = (
            f"stops with 'Num nodes is >1 but no extra nodes available via hostfile': it reads nodes only from a "
            f"hostfile, default /job/hostfile, which SLURM does not write{via}"
        )
        return fail(f"line {launch.line}: deepspeed --num_nodes {asked} without --hostfile stops at start", fix, **ev)
    if launch.srun is not None:
        ev["deepspeed"] = "proceeds 'with local resources only' and master_addr 127.0.0.1 on each node"
        return fail(
            f"line {launch.line}: srun starts deepspeed on {nodes} nodes without a hostfile: each trains alone",
            fix,
            **ev,
        )
    return fail(
        f"line {launch.line}: deepspeed without a hostfile in a {nodes}-node job: it proceeds 'with local resources "
        f"only' on the first node, and the other {nodes - 1} node(s) stay idle",
        fix,
        **ev,
    )


# ---------------------------------------------------------------- GD-SLURM-029


@check(
    id="GD-SLURM-029",
    name="gpus-total-split-unevenly-over-nodes",
    category="slurm",
    title="Each node of a multi-node job gets the same number of GPUs",
    needs=[],
    requires=["sbatch"],
    scope="job",
    what="For --sbatch: a job of several nodes that asks for its GPUs as a total (--gpus/-G) and not per node "
    "(--gpus-per-node, --gres=gpu:N, --gpus-per-task).",
    why="--gpus is the job's total, and SLURM's cons_tres fills the nodes one by one, each taking as many GPUs as "
    "it has free while leaving one for each node still to fill (gres_select_filter.c: _get_job_cnt): --gpus=8 "
    "over 2 nodes can be 7+1, and --gpus=8 over 3 nodes is never equal. torchrun, deepspeed and accelerate start "
    "one fixed number of workers per node, and srun the same tasks per node: a node with fewer GPUs than "
    "workers fails at set_device, one with more leaves GPUs idle.",
    fix="Ask per node: `#SBATCH --gpus-per-node=<N>` (or --gres=gpu:<N>) instead of --gpus.",
)
def gpus_total_split_unevenly_over_nodes(facts, ctx):
    sb = ctx.sbatch
    shape = slurm_shape(facts, ctx)
    opts = dict(sb.options)
    if shape.srun_options:
        opts.update({k: v for k, v in shape.srun_options.items() if k in ("gpus", "nodes", "gres", "gpus-per-node")})
    total_text = opts.get("gpus")
    if not total_text or any(opts.get(k) for k in ("gres", "gpus-per-node", "gpus-per-task")):
        return passed("the GPUs are requested per node or per task, or not as a total")
    nodes = shape.nodes
    if not nodes or nodes <= 1:
        return passed("one node: --gpus is that node's GPUs")
    try:
        total = slurmfmt.parse_gpus(str(total_text))
    except slurmfmt.SlurmFormatError:
        return skip(f"--gpus={total_text} is not read here (GD-SLURM-001)")
    line = sb.directive("gpus").line if sb.directive("gpus") is not None else None
    ev = {"--gpus": total_text, "nodes": nodes, "line": line}
    typed = f"{total.type}:" if total.type else ""
    fixed = _fixed_workers_per_node(shape, sb.launch)
    if total.count % nodes:
        low, high = total.count // nodes, -(-total.count // nodes)
        fix = manual(
            f"Ask for the GPUs per node: --gpus-per-node={typed}{low} or {typed}{high} (instead of --gpus)",
            f"#SBATCH --gpus-per-node={typed}{high}",
        )
        msg = (
            f"--gpus={total_text} (line {line}) over {nodes} nodes cannot be split equally: some node gets "
            f"{low} or fewer and another {high} or more"
        )
        verdict, consequence = fail, ""  # some node surely gets fewer GPUs than workers
    else:
        per = total.count // nodes
        fix = Fix(
            f"Ask for {per} GPU(s) on every node: --gpus-per-node={typed}{per} instead of --gpus={total_text}",
            Safety.UNSAFE,  # a resource request changes
            (
                Action(ActionKind.SBATCH_SET, sb.path, value=f"{typed}{per}", key="gpus-per-node"),
                Action(ActionKind.SBATCH_REMOVE, sb.path, key="gpus"),
            ),
        )
        msg = (
            f"--gpus={total_text} (line {line}) is a total over {nodes} nodes: SLURM fills nodes one by one, so the "
            f"split need not be {per} each (8 over 2 free 8-GPU nodes can be 7+1)"
        )
        verdict, consequence = warn, ": a node with fewer GPUs fails at set_device"
    if fixed:
        return verdict(f"{msg}, but {fixed}{consequence}", fix, **ev)
    return info(f"{msg}; {_follows(shape)}", fix, **ev)


def _follows(shape: JobShape) -> str:
    if shape.launcher in ("torchrun", "torch.distributed.launch"):
        # torch/distributed/elastic/agent/server/api.py, _assign_worker_ranks: agents of unequal local world sizes
        return (
            "torchrun's workers follow each node's GPUs here and its elastic agent ranks unequal nodes, so it runs, "
            "with more ranks on some nodes than on others"
        )
    return "how the program copes with unequal GPUs per node is not known here"


def _fixed_workers_per_node(shape: JobShape, launch) -> str | None:
    """'torchrun starts 4 per node' when the workers per node are one number written in the script; None when
    they follow the GPUs each node has (gpu/auto, deepspeed's default) or are not known."""
    per, tasks = shape.procs_per_task, shape.tasks_here
    if shape.launcher in SPAWNING_LAUNCHERS and per and tasks and _explicit_count(shape, launch):
        return f"{shape.launcher} starts {per * tasks} worker(s) on every node"
    if shape.launcher in ("python", "lightning") and tasks and tasks > 1 and shape.srun_launch:
        return f"srun starts {tasks} task(s) on every node, one per GPU"
    return None
