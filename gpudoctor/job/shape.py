"""The shape of a SLURM job -- tasks, nodes, GPUs, CPUs, launcher -- from either source:

- the live environment of a process inside the job (`srun gpudoctor check`, or a preflight
  line in the batch script), read from SLURM's variables; or
- a batch script before submission (`gpudoctor check --sbatch job.slurm`): what the job
  *will* get, from its #SBATCH directives and its launch line (srun options override the
  directives for the step, as srun does).

The slurm checks judge a JobShape (shape_record.py) and never care which source it came from. Every
number keeps the name of the variable or directive it came from, so verdicts can show evidence. This
module reads a batch script; shape_env.py the live environment; lightning.py adds Lightning's rules.

    shape = job_shape(facts, ctx)      # None outside SLURM without --sbatch
    shape.tasks_here, shape.gpus_per_node, shape.evidence
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from gpudoctor.job.lightning import lightning_hints, uses_lightning
from gpudoctor.job.shape_env import from_env
from gpudoctor.job.shape_record import JobShape, read_int
from gpudoctor.readers import slurmfmt

if TYPE_CHECKING:
    from gpudoctor.readers.sbatch import BatchScript, Launch


def _count_arg(value, gpus: int | None) -> int | None:
    """A launcher's process count: '8' -> 8; 'gpu'/'auto' -> one per visible GPU; '$X' -> unknown."""
    if value is None:
        return None
    text = str(value).strip()
    if re.fullmatch(r"\d+", text):
        return int(text)
    if text in ("gpu", "auto", "cuda"):
        return gpus
    if text == "cpu":
        return None
    return None


# ---------------------------------------------------------------- from a batch script


def from_sbatch(sb: BatchScript, ctx) -> JobShape:
    p: list[str] = []
    d = sb.options
    launch = sb.launch
    srun = dict(launch.srun.options) if launch and launch.srun else None
    exports = sb.exports
    shape = JobShape(
        source="sbatch",
        where=os.path.basename(sb.path or "the batch script"),
        script=sb.path,
        srun_launch=(srun is not None) if launch else None,
        job_name=sb.job_name,
        problems=p,
        directives=d,
        directive_lines=sb.directive_lines,
        srun_options=srun,
        launch_line=launch.text if launch else None,
        launch_lineno=launch.line if launch else None,
        cuda_visible_export=exports.get("CUDA_VISIBLE_DEVICES"),
        program=sb.program,
    )
    if sb.het_components > 1:
        shape.notes.append(
            f"heterogeneous job with {sb.het_components} components: judged component {sb.het_group}, "
            "where the training step runs"
        )
    ev = {f"#SBATCH --{k}": v for k, v in d.items() if k in _SHAPE_OPTIONS}
    step = dict(d)
    if srun:  # srun's own options shape the step
        for k, v in srun.items():
            if k in _SHAPE_OPTIONS:
                step[k] = v
                ev[f"srun --{k}"] = v
        if "ntasks" in srun and "ntasks-per-node" not in srun:
            step.pop("ntasks-per-node", None)
        _srun_keeps_job_ntasks(shape, d, srun, step)
    nodes_text = str(step.get("nodes", "1"))
    if "-" in nodes_text:
        nodes_text = nodes_text.split("-")[0]
        shape.notes.append(f"--nodes={step.get('nodes')} is a range; judged with the minimum, {nodes_text}")
    shape.nodes = (
        read_int(nodes_text, "--nodes", p, 1, slurmfmt.MAX_EXPANSION)
        if "nodes" in step
        # without --nodes SLURM allocates the nodes the tasks need (sbatch(1) -N): one task means one node
        else (1 if "ntasks" not in step or str(step["ntasks"]).strip() == "1" else None)
    )
    shape.ntasks_option = read_int(step.get("ntasks"), "--ntasks", p, 1)
    shape.ntasks_per_node = read_int(step.get("ntasks-per-node"), "--ntasks-per-node", p, 1)
    if shape.nodes and shape.ntasks_option and shape.nodes > shape.ntasks_option:
        # sbatch and srun lower the node count to the task count ("can't run 1 processes on 4 nodes, setting nnodes
        # to 1": slurm_opt.c, seen with sbatch 22.05): more nodes than tasks is never allocated. Both asked in the
        # directives: the job is not what the script says (a warning). srun's own -n on a larger job (its nodes
        # come from SLURM_NNODES): the step runs on fewer nodes, as a step per node in a loop means to.
        srun_set = srun is not None and ("ntasks" in srun or "nodes" in srun)
        said = (
            f"--nodes={step.get('nodes')} with --ntasks={shape.ntasks_option}: SLURM allocates "
            f"{shape.ntasks_option} node(s), not {step.get('nodes')}"
        )
        (shape.notes if srun_set else shape.problems).append(
            said.replace("allocates", "runs the step on") if srun_set else said
        )
        ev["nodes (lowered by SLURM)"] = str(shape.ntasks_option)
        shape.nodes = shape.ntasks_option
    _tasks_from_options(shape)
    # The batch shell has SLURM_NTASKS only with --ntasks or --ntasks-per-node; srun tasks always do.
    shape.ntasks_in_env = srun is not None or "ntasks" in d or "ntasks-per-node" in d
    _gpus_from_options(shape, step, p)
    _ntasks_per_gpu(shape, step, p)
    shape.cpus_per_task = read_int(d.get("cpus-per-task"), "--cpus-per-task", p, 1)
    exported = exports.get("SRUN_CPUS_PER_TASK")
    if srun and "cpus-per-task" in srun:
        shape.srun_cpus_per_task = read_int(srun["cpus-per-task"], "srun --cpus-per-task", p, 1)
    elif exported and exported.value:
        # -1: set, its value not a literal
        shape.srun_cpus_per_task = read_int(exported.value, "SRUN_CPUS_PER_TASK", [], 1) or -1
        ev["export SRUN_CPUS_PER_TASK"] = exported.value
    _launcher_from_script(shape, launch, ctx)
    if shape.cuda_visible_export:
        ev["export CUDA_VISIBLE_DEVICES"] = shape.cuda_visible_export.value
    ev.update(shape.evidence_extra)
    if shape.launch_line:
        ev["launch line"] = f"line {shape.launch_lineno}: {_short(shape.launch_line)}"
    if sb.program is not None and launch is not None and launch.launcher in ("python", "lightning", None):
        ev.update(sb.program.evidence())  # what the program itself does with processes and GPUs, and where
    shape.evidence = ev
    return shape


def _srun_keeps_job_ntasks(shape: JobShape, job: dict, srun: dict, step: dict) -> None:
    """`srun --ntasks-per-node=1 torchrun ...` in a job of 8 tasks per node starts 8 tasks per node.

    srun takes SLURM_NTASKS from the batch environment as its task count; when that disagrees with
    its own --ntasks-per-node it prints "can't honor --ntasks-per-node ... Ignoring --ntasks-per-node"
    and starts them all (seen on SLURM 22.05 here, with and without -N; a report from a newer SLURM
    has an explicit -N make srun honour it, so with -N this stays unjudged rather than a false alarm).
    """
    if "ntasks-per-node" not in srun or "ntasks" in srun or "nodes" in srun:
        return
    if "ntasks" not in job and "ntasks-per-node" not in job:
        return  # no SLURM_NTASKS in the batch environment: srun's own option decides
    nodes = read_int(step.get("nodes", "1"), "--nodes", [], 1)  # srun gives no -N: the job's nodes
    job_per_node = read_int(job.get("ntasks-per-node"), "--ntasks-per-node", [], 1)
    inherited = read_int(job["ntasks"], "--ntasks", [], 1) if "ntasks" in job else (job_per_node or 0) * (nodes or 0)
    per_node = read_int(srun["ntasks-per-node"], "srun --ntasks-per-node", [], 1)
    if not inherited or not per_node or not nodes or per_node * nodes == inherited:
        return
    step["ntasks"] = inherited
    if job_per_node:
        step["ntasks-per-node"] = job["ntasks-per-node"]
    else:
        step.pop("ntasks-per-node", None)
    shape.notes.append(
        f"srun --ntasks-per-node={srun['ntasks-per-node']} is ignored: srun takes the job's SLURM_NTASKS={inherited} "
        'as its task count ("can\'t honor --ntasks-per-node"), '
        f"so the step starts {inherited} task(s); give srun -n/--ntasks too"
    )


# The requests that decide a step's nodes, tasks, GPUs and CPUs (srun's own override the job's for the step).
_STEP_REQUESTS = "nodes ntasks ntasks-per-node gres gpus gpus-per-node gpus-per-task cpus-per-task ntasks-per-gpu"
_SHAPE_OPTIONS = frozenset(f"{_STEP_REQUESTS} job-name gpu-bind".split())
# Options whose loss changes the allocation (nodes, tasks, GPUs, CPUs, memory, time, where it runs): a fix that
# makes sbatch read them changes what the job asks for (unsafe: GD-SLURM-011's hoist, GD-SLURM-025's repair).
RESOURCE_OPTIONS = frozenset(
    f"""{_STEP_REQUESTS} cpus-per-gpu mem mem-per-cpu mem-per-gpu time partition constraint exclusive account qos
    nodelist exclude array reservation""".split()
)


def _short(text: str, limit: int = 160) -> str:
    text = re.sub(r"\s+", " ", text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _tasks_from_options(shape: JobShape) -> None:
    nodes, nt, ntpn = shape.nodes, shape.ntasks_option, shape.ntasks_per_node
    if ntpn is not None and nodes is not None:
        shape.tasks_per_node = [ntpn] * nodes
        shape.ntasks = nt if nt is not None else ntpn * nodes
        shape.tasks_here = ntpn
    elif nt is not None and nodes == 1:
        shape.tasks_per_node, shape.ntasks, shape.tasks_here = [nt], nt, nt
    elif nt is not None:
        shape.ntasks = nt  # placement across nodes is SLURM's choice
        if nodes:
            shape.tasks_here = -(-nt // nodes)  # at least this many on some node
    else:  # neither: one task per node
        shape.tasks_per_node = [1] * (nodes or 1)
        shape.ntasks, shape.tasks_here = nodes or 1, 1
    if shape.srun_launch is False:  # no srun: only the batch shell runs the command, once, on the first node
        shape.tasks_here = 1


def _gpus_from_options(shape: JobShape, step: dict, p: list[str]) -> None:
    from gpudoctor.readers.sbatch import gpus_per_node_requested

    req = gpus_per_node_requested(step)
    if req is None and step.get("gpus-per-task"):
        try:
            per_task = slurmfmt.parse_gpus(step["gpus-per-task"])
            shape.gpus_per_task, shape.gpu_type = per_task.count, per_task.type
            if shape.tasks_here:
                req = slurmfmt.GpuRequest(
                    per_task.count * max(shape.tasks_per_node or [shape.tasks_here]), per_task.type
                )
        except slurmfmt.SlurmFormatError as e:
            p.append(str(e))
    elif step.get("gpus-per-task"):
        try:
            shape.gpus_per_task = slurmfmt.parse_gpus(step["gpus-per-task"]).count
        except slurmfmt.SlurmFormatError as e:
            p.append(str(e))
    if req is None and step.get("gres"):
        for spec in slurmfmt.split_top_level(str(step["gres"])):
            name = spec.strip().split(":")[0]
            if name != "gpu" and name.lower().rstrip("s") == "gpu":  # gres names are exact: 'gpus'/'GPU' are not 'gpu'
                p.append(
                    f"--gres={step['gres']}: '{name}' is not the GPU gres (it is named 'gpu'): sbatch refuses the "
                    f"script ('Invalid generic resource (gres) specification'); write --gres=gpu:..."
                )
    if req is None and step.get("gpus") and shape.nodes and shape.nodes > 1:
        shape.notes.append(
            f"--gpus={step['gpus']} over {shape.nodes} nodes: SLURM may place them unevenly, GPUs per node unknown"
        )
    if req is not None:
        shape.gpus_per_node, shape.gpu_type = req.count, shape.gpu_type or req.type
    elif not any(k in step for k in ("gres", "gpus", "gpus-per-node", "gpus-per-task")):
        shape.gpus_per_node = 0
    shape.task_gpus = shape.gpus_per_task if shape.gpus_per_task else shape.gpus_per_node


def _ntasks_per_gpu(shape: JobShape, step: dict, p: list[str]) -> None:
    """--ntasks-per-gpu=N (sbatch man page): with GPUs and no --ntasks SLURM starts N tasks per GPU;
    with --ntasks and no GPUs it allocates ntasks/N GPUs. Each task is bound to one GPU."""
    per_gpu = read_int(step.get("ntasks-per-gpu"), "--ntasks-per-gpu", p, 1)
    if per_gpu is None:
        return
    if shape.gpus_per_node == 0 and shape.ntasks_option is not None:  # GPUs follow the tasks; per node only on one node
        shape.gpus_per_node = -(-shape.ntasks_option // per_gpu) if shape.nodes == 1 else None
    elif shape.gpus_per_node and shape.ntasks_option is None and shape.ntasks_per_node is None:
        shape.tasks_here = 1 if shape.srun_launch is False else shape.gpus_per_node * per_gpu
        shape.tasks_per_node = [shape.gpus_per_node * per_gpu] * (shape.nodes or 1)
        shape.ntasks = sum(shape.tasks_per_node)
    shape.task_gpus = 1


def _launcher_from_script(shape: JobShape, launch: Launch | None, ctx) -> None:
    light_hints = dict(launch.lightning) if launch and launch.lightning else None
    launcher = launch.launcher if launch else None
    if ctx.launcher and ctx.launcher != "srun":
        shape.launcher, shape.launcher_source = ctx.launcher, f"--launcher {ctx.launcher}"
    elif launch is not None and launcher:
        shape.launcher, shape.launcher_source = launcher, f"launch line {launch.line}"
    elif ctx.launcher == "srun":
        shape.launcher, shape.launcher_source = "python", "--launcher srun"
    if (
        launch is not None
        and shape.launcher in ("torchrun", "torch.distributed.launch", "deepspeed", "lightning")
        and launcher == shape.launcher
    ):
        shape.procs_per_task = _count_arg(launch.nproc_per_node, shape.task_gpus)
        if launcher == "deepspeed" and launch.nproc_per_node is None:
            shape.procs_per_task = shape.task_gpus  # deepspeed defaults to every visible GPU
        if launcher == "torchrun" and launch.nproc_per_node is None:
            shape.procs_per_task = 1  # torchrun's default is one process
    elif launch is not None and shape.launcher == "accelerate" and launcher == "accelerate":
        _accelerate_counts(shape, launch)
    elif shape.launcher == "python":
        shape.procs_per_task = 1
    light, why = uses_lightning(ctx, light_hints)
    program = shape.program
    if not light and not ctx.launcher and program is not None and program.kind == "lightning":
        light, why = True, program.describe()
    if light:
        if shape.launcher in (None, "python"):
            shape.launcher, shape.launcher_source = "lightning", why
            shape.procs_per_task = None  # decided by Lightning's rules, see lightning_plan()
        shape.lightning = lightning_hints(shape, ctx, light_hints)


def _accelerate_counts(shape: JobShape, launch: Launch) -> None:
    """accelerate's processes per launch from its line and its --config_file (readers/accelerate.py)."""
    from gpudoctor.readers.accelerate import accelerate_plan

    plan = accelerate_plan(launch)
    shape.procs_per_task = plan.procs_per_machine
    for name in ("mode", "num_processes", "num_machines", "machine_rank"):
        setting = getattr(plan, name)
        if setting.source != "launch line" and setting.value is not None:
            shape.evidence_extra[f"accelerate {name}"] = f"{setting.value} ({setting.source})"
    config = launch.launcher_config
    if config is None or config.status == "read":  # an unread config file is GD-SLURM-033's finding
        shape.notes.extend(plan.notes)


# ---------------------------------------------------------------- entry point


def in_slurm_job(env: dict) -> bool:
    return "SLURM_JOB_ID" in env or "SLURM_JOBID" in env


def job_shape(facts, ctx) -> JobShape | None:
    """The batch script's shape when --sbatch is given, else the live job's; None outside SLURM."""
    if ctx.sbatch is not None:
        built = getattr(ctx, "job", None)  # the runner's model of this script holds its shape (job/model.py)
        return built.shape if built is not None and built.script is ctx.sbatch else from_sbatch(ctx.sbatch, ctx)
    env = facts.env
    if in_slurm_job(env):
        return from_env(env, ctx, facts)
    return None
