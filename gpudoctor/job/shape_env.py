"""The shape of the SLURM job this process runs in (`srun gpudoctor check`, or a preflight line in the batch
script), read from SLURM's variables.
"""

from __future__ import annotations

from gpudoctor.job.lightning import lightning_hints, uses_lightning
from gpudoctor.job.shape_record import JobShape, read_int
from gpudoctor.readers import slurmfmt


def from_env(env: dict, ctx, facts=None) -> JobShape:
    p: list[str] = []
    in_step = "SLURM_STEP_ID" in env or "SLURM_STEPID" in env
    used = {}

    def get(*names):
        for n in names:
            if n in env:
                used[n] = env[n]
                return env[n]
        return None

    shape = JobShape(
        source="env",
        where="this srun step" if in_step else "this SLURM job's batch shell",
        srun_launch=True if in_step or ctx.launcher == "srun" else None,
        problems=p,
    )
    shape.job_name = get("SLURM_JOB_NAME")
    shape.nodes = read_int(
        get("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
        if in_step
        else get("SLURM_JOB_NUM_NODES", "SLURM_NNODES"),
        "nodes",
        p,
        1,
    )
    shape.ntasks_in_env = "SLURM_NTASKS" in env or in_step
    shape.ntasks = read_int(
        get("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS") if in_step else get("SLURM_NTASKS"), "SLURM_NTASKS", p, 1
    )
    shape.ntasks_option = shape.ntasks if "SLURM_NTASKS" in env else None
    shape.ntasks_per_node = read_int(get("SLURM_NTASKS_PER_NODE"), "SLURM_NTASKS_PER_NODE", p, 1)
    tpn_name = "SLURM_STEP_TASKS_PER_NODE" if in_step and "SLURM_STEP_TASKS_PER_NODE" in env else "SLURM_TASKS_PER_NODE"
    if tpn_name in env:
        used[tpn_name] = env[tpn_name]
        try:
            shape.tasks_per_node = slurmfmt.parse_tasks_per_node(env[tpn_name], tpn_name)
        except slurmfmt.SlurmFormatError as e:
            p.append(str(e))
    node = read_int(get("SLURM_NODEID"), "SLURM_NODEID", p) or 0
    if shape.tasks_per_node and node < len(shape.tasks_per_node):
        shape.tasks_here = shape.tasks_per_node[node]
    elif shape.ntasks_per_node:
        shape.tasks_here = shape.ntasks_per_node
    _gpus_from_env(shape, env, used, p, in_step)
    tres = ((facts.slurm if facts is not None else {}) or {}).get("job") or {}
    if tres.get("TresPerNode") and shape.gpu_type is None:  # the GPU type is only in the controller's record
        try:
            req = slurmfmt.parse_gres(tres["TresPerNode"])
        except slurmfmt.SlurmFormatError:
            req = None
        if req is not None and req.type:
            shape.gpu_type = req.type
            used["scontrol TresPerNode"] = tres["TresPerNode"]
    shape.cpus_per_task = read_int(get("SLURM_CPUS_PER_TASK"), "SLURM_CPUS_PER_TASK", p, 1)
    shape.srun_cpus_per_task = read_int(get("SRUN_CPUS_PER_TASK"), "SRUN_CPUS_PER_TASK", p, 1)
    _launcher_from_env(shape, env, ctx, used)
    light, why = uses_lightning(ctx, None)
    if light:
        shape.launcher = "lightning" if shape.launcher in (None, "python") else shape.launcher
        shape.launcher_source = shape.launcher_source or why
        shape.lightning = lightning_hints(shape, ctx, None)
    shape.evidence = dict(sorted(used.items()))
    return shape


def _gpus_from_env(shape: JobShape, env: dict, used: dict, p: list[str], in_step: bool) -> None:
    order = ["SLURM_GPUS_ON_NODE", "SLURM_STEP_GPUS" if in_step else "SLURM_JOB_GPUS", "SLURM_GPUS_PER_NODE"]
    for name in order:
        if name in env and env[name].strip():
            used[name] = env[name]
            try:
                req = slurmfmt.parse_gpu_env(name, env[name])
            except slurmfmt.SlurmFormatError as e:
                p.append(str(e))
                continue
            if name == "SLURM_STEP_GPUS" and "SLURM_GPUS_PER_TASK" in env:
                continue  # with --gpus-per-task this lists only this task's GPUs
            shape.gpus_per_node = req.count
            shape.gpu_type = shape.gpu_type or req.type
            break
    if "SLURM_GPUS_PER_TASK" in env:
        used["SLURM_GPUS_PER_TASK"] = env["SLURM_GPUS_PER_TASK"]
        try:
            shape.gpus_per_task = slurmfmt.parse_gpus(env["SLURM_GPUS_PER_TASK"]).count
        except slurmfmt.SlurmFormatError as e:
            p.append(f"SLURM_GPUS_PER_TASK: {e}")
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        from gpudoctor.readers.cudavis import parse_visible_devices

        used["CUDA_VISIBLE_DEVICES"] = cvd
        seen = parse_visible_devices(cvd).count
        if in_step or not shape.gpus_per_task:  # the batch shell sees all the job's GPUs
            shape.task_gpus = seen
        if shape.gpus_per_node is None and not shape.gpus_per_task and seen:
            shape.gpus_per_node = seen  # older SLURM: no SLURM_GPUS_ON_NODE, but the gres plugin set this
    if in_step and not shape.gpus_per_task:
        _per_task_binding(shape, env, used)
    if shape.task_gpus is None and shape.gpus_per_task:
        shape.task_gpus = shape.gpus_per_task


def _per_task_binding(shape: JobShape, env: dict, used: dict) -> None:
    """SLURM bound this task to its own GPUs (--gpus-per-task, --ntasks-per-gpu, --gpu-bind=single:1 ...).

    srun does not put SLURM_GPUS_PER_TASK in the tasks' environment (slurm 22.05); the sign is that
    SLURM_STEP_GPUS then lists only this task's GPUs, the same ones as CUDA_VISIBLE_DEVICES, fewer
    than SLURM_GPUS_ON_NODE. A CUDA_VISIBLE_DEVICES narrowed by hand leaves SLURM_STEP_GPUS whole.
    """
    from gpudoctor.readers.cudavis import parse_visible_devices

    try:
        step = (
            len(slurmfmt.parse_index_list(env.get("SLURM_STEP_GPUS", ""), "SLURM_STEP_GPUS"))
            if env.get("SLURM_STEP_GPUS")
            else None
        )
    except slurmfmt.SlurmFormatError:
        return
    seen = parse_visible_devices(env["CUDA_VISIBLE_DEVICES"]).count if "CUDA_VISIBLE_DEVICES" in env else None
    if step and seen == step and shape.gpus_per_node and step < shape.gpus_per_node:
        shape.gpus_per_task = step
        used["SLURM_STEP_GPUS"] = env["SLURM_STEP_GPUS"]
        used["per-task GPU binding"] = (
            f"SLURM_STEP_GPUS={env['SLURM_STEP_GPUS']} of SLURM_GPUS_ON_NODE={shape.gpus_per_node}"
        )


def _launcher_from_env(shape: JobShape, env: dict, ctx, used: dict) -> None:
    if "TORCHELASTIC_RUN_ID" in env or ("LOCAL_WORLD_SIZE" in env and "GROUP_RANK" in env):
        shape.launcher, shape.launcher_source = "torchrun", "TORCHELASTIC_RUN_ID/LOCAL_WORLD_SIZE in the environment"
        for n in ("TORCHELASTIC_RUN_ID", "LOCAL_WORLD_SIZE"):
            if n in env:
                used[n] = env[n]
        try:
            shape.procs_per_task = int(env.get("LOCAL_WORLD_SIZE", ""))
        except ValueError:
            pass
    elif ctx.launcher and ctx.launcher != "srun":
        shape.launcher, shape.launcher_source = ctx.launcher, f"--launcher {ctx.launcher}"
    elif ctx.launcher == "srun":
        shape.launcher, shape.launcher_source, shape.procs_per_task = "python", "--launcher srun", 1
    if shape.launcher in ("torchrun", "deepspeed", "accelerate") and shape.procs_per_task is None and ctx.expect_gpus:
        shape.procs_per_task = ctx.expect_gpus if shape.tasks_here in (None, 1) else None
