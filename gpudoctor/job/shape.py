"""The shape of a SLURM job -- tasks, nodes, GPUs, CPUs, launcher -- from either source:

- the live environment of a process inside the job (`srun gpudoctor check`, or a preflight
  line in the batch script), read from SLURM's variables; or
- a batch script before submission (`gpudoctor check --sbatch job.slurm`): what the job
  *will* get, from its #SBATCH directives and its launch line (srun options override the
  directives for the step, as srun does).

The slurm checks judge a JobShape and never care which source it came from. Every number
keeps the name of the variable or directive it came from, so verdicts can show evidence.

    shape = job_shape(facts, ctx)      # None outside SLURM without --sbatch
    shape.tasks_here, shape.gpus_per_node, shape.evidence
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpudoctor.readers import slurmfmt
from gpudoctor.readers.ints import small_int

if TYPE_CHECKING:
    from gpudoctor.readers.sbatch import BatchScript, Launch

INTERACTIVE_JOB_NAMES = ("bash", "interactive")  # Lightning: SLURM not managing tasks under these names


@dataclass
class JobShape:
    source: str  # "env" (inside a SLURM job) | "sbatch" (a batch script, before submission)
    where: str  # said in messages: "this srun step" / "train.slurm"
    script: str | None = None  # the batch script, target of sbatch_set fixes
    srun_launch: bool | None = None  # the training is started by srun (None: unknown, e.g. a batch-shell preflight)
    job_name: str | None = None
    nodes: int | None = None
    ntasks: int | None = None  # tasks of the (training) step
    ntasks_in_env: bool = False  # SLURM_NTASKS will be in the training process's environment
    ntasks_option: int | None = None  # --ntasks / -n as given (job or srun)
    ntasks_per_node: int | None = None  # --ntasks-per-node as given (SLURM_NTASKS_PER_NODE)
    tasks_per_node: list[int] | None = None  # SLURM's placement, one count per node, when known
    tasks_here: int | None = None  # tasks on this node (env) or the most on any node (sbatch)
    gpus_per_node: int | None = None
    gpu_type: str | None = None
    gpus_per_task: int | None = None  # --gpus-per-task: each task bound to its own GPUs
    task_gpus: int | None = None  # GPUs one task can see
    cpus_per_task: int | None = None  # --cpus-per-task of the job (SLURM_CPUS_PER_TASK)
    srun_cpus_per_task: int | None = None  # srun -c / SRUN_CPUS_PER_TASK
    launcher: str | None = (
        None  # what each task runs: torchrun, torch.distributed.launch, deepspeed, accelerate, python, lightning
    )
    launcher_source: str | None = None
    procs_per_task: int | None = None  # processes a task starts itself (torchrun --nproc-per-node); 1 for python
    lightning: dict = field(default_factory=dict)  # devices / num_nodes the job gives Lightning, with sources
    launch_line: str | None = None  # sbatch: the training command as written
    launch_lineno: int | None = None
    cuda_visible_export: Any = None  # sbatch: `export CUDA_VISIBLE_DEVICES=...` (readers.sbatch.Assignment)
    directives: dict = field(default_factory=dict)  # sbatch: the #SBATCH options
    directive_lines: dict = field(default_factory=dict)
    srun_options: dict | None = None  # sbatch: options on the launch line's srun
    evidence: dict = field(default_factory=dict)  # name -> value for every input used
    evidence_extra: dict = field(default_factory=dict)  # read while working out the launcher, merged into evidence
    problems: list[str] = field(default_factory=list)  # values that could not be read
    notes: list[str] = field(default_factory=list)  # readable, but judged with an assumption
    program: Any = None  # readers.program.ProgramModel of the launched program (sbatch; None: not looked for)

    @property
    def from_script(self) -> bool:
        return self.source == "sbatch"

    @property
    def interactive_name(self) -> bool:
        return (self.job_name or "") in INTERACTIVE_JOB_NAMES

    def opt(self, name: str) -> str:
        """How the user spells a SLURM option here: '#SBATCH --x' (script) or '--x' (env)."""
        return f"#SBATCH --{name}" if self.from_script else f"--{name}"


# ---------------------------------------------------------------- shared helpers


def _int(value, what: str, problems: list[str], minimum: int = 0, maximum: int | None = None) -> int | None:
    if value is None or value is True:
        return None
    try:
        n = slurmfmt.parse_int(value, what, minimum)
    except slurmfmt.SlurmFormatError as e:
        problems.append(str(e))
        return None
    if maximum is not None and n > maximum:
        problems.append(f"{what}: {n} is implausibly large")
        return None
    return n


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


def _lightning_from_config(config: dict | None) -> dict:
    """trainer.devices / trainer.num_nodes in a training config (plain, Hydra `params`, LightningCLI)."""
    out: dict = {}
    if not isinstance(config, dict):
        return out
    trainer = config.get("trainer")
    if not isinstance(trainer, dict):
        return out
    for section, path in (
        (trainer, "trainer"),
        (trainer.get("params"), "trainer.params"),
        (trainer.get("init_args"), "trainer.init_args"),
    ):
        if isinstance(section, dict):
            for key in ("devices", "num_nodes", "accelerator", "strategy"):
                if key in section and key not in out:
                    out[key] = (section[key], f"{path}.{key}")
    return out


def _lightning_hints(shape: JobShape, ctx, launch_hints: dict | None) -> dict:
    """devices/num_nodes Lightning will be given, each as (value, source); value None: not known.

    A literal in the program's own Trainer(...) call is what Lightning gets (no command line reaches it); an
    expression there (`devices=args.devices`, `Trainer(**cfg)`) takes the launch line's or the config's value.
    """
    hints: dict = {}
    program = shape.program if shape.program is not None and shape.program.kind == "lightning" else None
    if program is not None:
        for key, (value, where) in program.lightning.items():
            if key in ("devices", "num_nodes", "accelerator", "strategy") and value is not None:
                hints[key] = (value, where)
    for key, (value, where) in _lightning_from_config(ctx.config).items():
        hints[key] = (value, f"{ctx.config_path or 'config'}: {where}")
    for key, value in (launch_hints or {}).items():
        if key in ("devices", "num_nodes", "accelerator", "strategy"):
            hints.setdefault(key, (value, "launch line"))
    if "devices" not in hints and ctx.expect_gpus:
        hints["devices"] = (ctx.expect_gpus, "--expect-gpus")
    if program is not None:
        for key, (_value, where) in program.lightning.items():
            if key in ("devices", "num_nodes") and key not in hints:
                hints[key] = (None, f"{where}: not a literal, so not known here")
    return hints


def _lightning_default(shape: JobShape, key: str) -> tuple:
    """(value, source) of a Trainer argument nobody visible sets: Lightning's default when the program's own
    Trainer call is read and leaves it out; otherwise not known (None) for num_nodes -- the program may set it --
    and the default 'auto', marked as assumed, for devices."""
    default = {"devices": "auto", "num_nodes": 1}[key]
    program = shape.program
    if program is not None and program.kind == "lightning" and not program.lightning_cli:
        call = program.lightning.get("**") or program.lightning.get("_call")
        if "**" not in program.lightning:
            return default, f"Lightning's default: the Trainer call at {call[1] if call else '?'} does not set it"
        return None, f"not known: {call[1] if call else 'the Trainer call'} passes its arguments from a mapping"
    why = program.describe() if program is not None else "the program was not read"
    if key == "num_nodes":
        return None, f"not known: the program sets it and is not shown ({why})"
    return default, f"default, assumed: the program may set it ({why})"


def _uses_lightning(ctx, launch_hints: dict | None) -> tuple[bool, str | None]:
    if ctx.launcher == "lightning":
        return True, "--launcher lightning"
    if ctx.launcher:
        return False, None
    if _lightning_from_config(ctx.config):
        return True, f"a trainer section in {ctx.config_path or 'the config'}"
    if launch_hints:
        return True, "trainer.* arguments on the launch line"
    return False, None


# ---------------------------------------------------------------- from the environment


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
    shape.nodes = _int(
        get("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
        if in_step
        else get("SLURM_JOB_NUM_NODES", "SLURM_NNODES"),
        "nodes",
        p,
        1,
    )
    shape.ntasks_in_env = "SLURM_NTASKS" in env or in_step
    shape.ntasks = _int(
        get("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS") if in_step else get("SLURM_NTASKS"), "SLURM_NTASKS", p, 1
    )
    shape.ntasks_option = shape.ntasks if "SLURM_NTASKS" in env else None
    shape.ntasks_per_node = _int(get("SLURM_NTASKS_PER_NODE"), "SLURM_NTASKS_PER_NODE", p, 1)
    tpn_name = "SLURM_STEP_TASKS_PER_NODE" if in_step and "SLURM_STEP_TASKS_PER_NODE" in env else "SLURM_TASKS_PER_NODE"
    if tpn_name in env:
        used[tpn_name] = env[tpn_name]
        try:
            shape.tasks_per_node = slurmfmt.parse_tasks_per_node(env[tpn_name], tpn_name)
        except slurmfmt.SlurmFormatError as e:
            p.append(str(e))
    node = _int(get("SLURM_NODEID"), "SLURM_NODEID", p) or 0
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
    shape.cpus_per_task = _int(get("SLURM_CPUS_PER_TASK"), "SLURM_CPUS_PER_TASK", p, 1)
    shape.srun_cpus_per_task = _int(get("SRUN_CPUS_PER_TASK"), "SRUN_CPUS_PER_TASK", p, 1)
    _launcher_from_env(shape, env, ctx, used)
    light, why = _uses_lightning(ctx, None)
    if light:
        shape.launcher = "lightning" if shape.launcher in (None, "python") else shape.launcher
        shape.launcher_source = shape.launcher_source or why
        shape.lightning = _lightning_hints(shape, ctx, None)
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
        _int(nodes_text, "--nodes", p, 1, slurmfmt.MAX_EXPANSION)
        if "nodes" in step
        # without --nodes SLURM allocates the nodes the tasks need (sbatch(1) -N): one task means one node
        else (1 if "ntasks" not in step or str(step["ntasks"]).strip() == "1" else None)
    )
    shape.ntasks_option = _int(step.get("ntasks"), "--ntasks", p, 1)
    shape.ntasks_per_node = _int(step.get("ntasks-per-node"), "--ntasks-per-node", p, 1)
    _tasks_from_options(shape)
    # The batch shell has SLURM_NTASKS only with --ntasks or --ntasks-per-node; srun tasks always do.
    shape.ntasks_in_env = srun is not None or "ntasks" in d or "ntasks-per-node" in d
    _gpus_from_options(shape, step, p)
    _ntasks_per_gpu(shape, step, p)
    shape.cpus_per_task = _int(d.get("cpus-per-task"), "--cpus-per-task", p, 1)
    exported = exports.get("SRUN_CPUS_PER_TASK")
    if srun and "cpus-per-task" in srun:
        shape.srun_cpus_per_task = _int(srun["cpus-per-task"], "srun --cpus-per-task", p, 1)
    elif exported and exported.value:
        shape.srun_cpus_per_task = _int(exported.value, "SRUN_CPUS_PER_TASK", [], 1) or -1  # -1: set, value not literal
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
    nodes = _int(step.get("nodes", "1"), "--nodes", [], 1)  # srun gives no -N: the job's nodes
    job_per_node = _int(job.get("ntasks-per-node"), "--ntasks-per-node", [], 1)
    inherited = _int(job["ntasks"], "--ntasks", [], 1) if "ntasks" in job else (job_per_node or 0) * (nodes or 0)
    per_node = _int(srun["ntasks-per-node"], "srun --ntasks-per-node", [], 1)
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
    per_gpu = _int(step.get("ntasks-per-gpu"), "--ntasks-per-gpu", p, 1)
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
    light, why = _uses_lightning(ctx, light_hints)
    program = shape.program
    if not light and not ctx.launcher and program is not None and program.kind == "lightning":
        light, why = True, program.describe()
    if light:
        if shape.launcher in (None, "python"):
            shape.launcher, shape.launcher_source = "lightning", why
            shape.procs_per_task = None  # decided by Lightning's rules, see lightning_plan()
        shape.lightning = _lightning_hints(shape, ctx, light_hints)


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
        return from_sbatch(ctx.sbatch, ctx)
    env = facts.env
    if in_slurm_job(env):
        return from_env(env, ctx, facts)
    return None


# ---------------------------------------------------------------- Lightning's SLURM rules


def lightning_major(facts) -> int | None:
    """Major version of the installed Lightning (lightning or pytorch_lightning); None when unknown or mixed."""
    pkgs = (facts.slurm or {}).get("packages") or {}
    majors = set()
    for name in ("lightning", "pytorch_lightning"):
        v = pkgs.get(name)
        if isinstance(v, str) and (m := re.match(r"^(\d+)", v)):
            majors.add(int(m.group(1)))
    return majors.pop() if len(majors) == 1 else None


def _as_int(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        n = small_int(value)
        return n if n is not None and n >= 0 else None
    if isinstance(value, (list, tuple)):
        return len(value)  # devices=[0, 1]
    return None


@dataclass
class LightningPlan:
    """What Lightning will do with this job (SLURMEnvironment / _is_slurm_managing_tasks rules)."""

    devices: int | None
    devices_source: str
    num_nodes: int | None  # None: the program sets it and is not shown
    num_nodes_source: str
    slurm_detected: bool  # SLURM_NTASKS set and the job name is not bash/interactive
    spawns: bool | None  # Lightning starts its own processes (None: depends on the version)
    ranks_per_node: int | None  # processes that will train on a node
    errors: list[str] = field(default_factory=list)  # Lightning refuses to start (with its message)
    hang: str | None = None  # Lightning starts but waits forever
    version_dependent: bool = False  # Lightning 1.x would start its own processes here instead (version unknown)
    notes: list[str] = field(default_factory=list)
    devices_assumed: bool = False  # devices is Lightning's default 'auto' only because the program is not shown
    unknown: list[str] = field(default_factory=list)  # checks Lightning makes that cannot be judged here


def lightning_plan(shape: JobShape, major: int | None) -> LightningPlan:
    hints = shape.lightning
    raw_devices, dev_src = hints.get("devices") or _lightning_default(shape, "devices")
    devices_assumed = "devices" not in hints and dev_src.startswith("default, assumed")
    devices = _as_int(raw_devices)
    if raw_devices is None:
        dev_src = f"devices {dev_src}"
    elif devices is None and str(raw_devices) in ("auto", "-1", "None"):
        devices, dev_src = (
            shape.task_gpus,
            f"devices={raw_devices}: the {shape.task_gpus} GPU(s) a task sees ({dev_src})",
        )
    elif devices is not None:
        dev_src = f"devices={devices} ({dev_src})"
    raw_nodes, nodes_src = hints.get("num_nodes") or _lightning_default(shape, "num_nodes")
    num_nodes = _as_int(raw_nodes) or 1 if raw_nodes is not None else None
    nodes_src = f"num_nodes={num_nodes} ({nodes_src})" if num_nodes is not None else f"num_nodes {nodes_src}"
    detected = shape.ntasks_in_env and not shape.interactive_name
    plan = LightningPlan(devices, dev_src, num_nodes, nodes_src, detected, None, None)
    plan.devices_assumed = devices_assumed
    ntasks = shape.ntasks
    if not detected:
        plan.spawns = True
        per_task = devices
        plan.ranks_per_node = (shape.tasks_here or 1) * per_task if per_task else None
        return plan
    requested = devices * num_nodes if devices and num_nodes else None
    if major is not None and major < 2:
        # 1.x: _is_slurm_managing_tasks() -- SLURM manages only when its task count matches.
        plan.spawns = not (ntasks is not None and requested is not None and ntasks == requested)
        if plan.spawns:
            plan.notes.append(
                f"Lightning {major}.x starts its own processes because SLURM_NTASKS={ntasks} differs from devices x "
                f"num_nodes = {requested}"
            )
    else:
        plan.spawns = (
            False
            if major is not None
            else (None if ntasks is not None and requested is not None and ntasks != requested else False)
        )
        # 1.x would start `devices` processes in every task: right with one task per node, duplicates with more
        plan.version_dependent = plan.spawns is None and (shape.tasks_here or 1) == 1
    if plan.spawns:
        plan.ranks_per_node = (shape.tasks_here or 1) * devices if devices else None
        return plan
    plan.ranks_per_node = 1 if shape.srun_launch is False else shape.tasks_here
    if shape.srun_launch is False and (ntasks or 1) > 1:
        plan.hang = (
            f"Lightning takes the world size from SLURM_NTASKS={ntasks} but without srun only the batch shell's "
            "one process starts: rank 0 waits for ranks that never come"
        )
    if (ntasks or 1) > 1 and shape.ntasks_per_node is None:
        plan.errors.append(
            f"You set `--ntasks={ntasks}` in your SLURM bash script, but this variable is not supported. "
            f"HINT: Use `--ntasks-per-node={ntasks}` instead."
        )
    if shape.ntasks_per_node is not None and devices is not None and shape.ntasks_per_node != devices:
        # devices is the program's: a mismatch is certain only when no devices value can match (a task sees fewer
        # GPUs than there are tasks per node, so devices=ntasks-per-node would ask for GPUs it cannot see)
        if plan.devices_assumed and not (shape.task_gpus is not None and shape.ntasks_per_node > shape.task_gpus):
            plan.unknown.append(
                f"Lightning refuses to start unless devices={shape.ntasks_per_node} (tasks per node); {dev_src}"
            )
        else:
            plan.errors.append(
                f"You set `devices={devices}` in Lightning, but the number of tasks per node configured in SLURM "
                f"`--ntasks-per-node={shape.ntasks_per_node}` does not match. "
                f"HINT: Set `devices={shape.ntasks_per_node}`."
            )
    if num_nodes is None:
        if shape.nodes is not None and shape.nodes > 1:  # on one node the default 1 fits
            plan.unknown.append(f"Lightning refuses to start unless num_nodes={shape.nodes}; {nodes_src}")
    elif shape.nodes is not None and shape.nodes != num_nodes:
        plan.errors.append(
            f"You set `num_nodes={num_nodes}` in Lightning, but the number of nodes configured in SLURM "
            f"`--nodes={shape.nodes}` does not match. HINT: Set `num_nodes={shape.nodes}`."
        )
    return plan
