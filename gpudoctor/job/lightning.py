"""Lightning's SLURM rules: what devices/num_nodes a Trainer will be given in this job, and what Lightning
then does with it (SLURMEnvironment / _is_slurm_managing_tasks: start its own processes, refuse to start, or
wait forever).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpudoctor.job.shape_record import JobShape
from gpudoctor.readers.ints import small_int


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


def lightning_hints(shape: JobShape, ctx, launch_hints: dict | None) -> dict:
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


def uses_lightning(ctx, launch_hints: dict | None) -> tuple[bool, str | None]:
    if ctx.launcher == "lightning":
        return True, "--launcher lightning"
    if ctx.launcher:
        return False, None
    if _lightning_from_config(ctx.config):
        return True, f"a trainer section in {ctx.config_path or 'the config'}"
    if launch_hints:
        return True, "trainer.* arguments on the launch line"
    return False, None


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
        plan.hang = (  # the world size is SLURM_NTASKS; without srun only the batch shell's one process starts
            f"without srun 1 of the SLURM_NTASKS={ntasks} ranks Lightning waits for starts: rank 0 waits forever"
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
