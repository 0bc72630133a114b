"""Variables the launched framework requires: a table of requirements, each with its source, and one check.

A framework that refuses to start without an environment variable does so after the job waited in the
queue. Each row of FRAMEWORK_REQUIREMENTS names the framework, how it is recognised on the launch line
(the program file or module it runs, or a package that program imports -- readers/program.py), the
arguments that make the requirement apply, the variable and value, what happens without it, and the
source file where the framework enforces it. Add a row only with such a source.

The job's value of the variable is the one the program will see: the job's environment (gpudoctor.job.env:
the submitting shell's, exported by sbatch, and the script's exports), an assignment in front of the launch
command (`CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun ...`: bash(1), SIMPLE COMMAND EXPANSION), or the program's
own `os.environ['NAME'] = "1"` before the framework reads it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from gpudoctor.job.env import job_env, probe_env
from gpudoctor.job.locate import LAUNCH_EVIDENCE
from gpudoctor.model import fail, info, passed, set_env, skip, warn
from gpudoctor.registry import check


@dataclass(frozen=True)
class FrameworkRequirement:
    framework: str
    programs: str  # regex over the program file's name or the module run with -m
    imports: tuple[str, ...]  # or: the program imports one of these top-level packages
    when: tuple[tuple[str, str], ...]  # (argument, condition) that must all hold: "given" | ">1"
    unless: tuple[str, ...]  # arguments that lift the requirement
    variable: str
    value: str
    effect: str  # what the framework does without it
    source: str
    blackwell_exempt: bool = False  # the source skips the requirement on compute capability 10 and later


_MEGATRON_PROGRAMS = r"^pretrain_\w+\.py$|^megatron(\.|$)"
_MEGATRON_FSDP = ("--use-torch-fsdp2", "--use-megatron-fsdp", "--use-custom-fsdp", "--overlap-moe-expert-parallel-comm")

FRAMEWORK_REQUIREMENTS: tuple[FrameworkRequirement, ...] = (
    FrameworkRequirement(
        framework="Megatron-LM / Megatron-DeepSpeed",
        programs=_MEGATRON_PROGRAMS,
        imports=("megatron",),
        when=(("--sequence-parallel", "given"), ("--tensor-model-parallel-size", ">1")),
        unless=(),
        variable="CUDA_DEVICE_MAX_CONNECTIONS",
        value="1",
        effect='validate_args raises RuntimeError "Using sequence parallelism requires setting the environment '
        'variable CUDA_DEVICE_MAX_CONNECTIONS to 1" at startup (sequence parallelism is switched off, with a '
        "warning, only when the tensor-parallel size is 1)",
        source="https://github.com/NVIDIA/Megatron-LM/blob/core_r0.5.0/megatron/arguments.py (validate_args); "
        "https://github.com/microsoft/Megatron-DeepSpeed/blob/main/megatron/arguments.py (validate_args)",
    ),
    FrameworkRequirement(
        framework="Megatron-LM",
        programs=_MEGATRON_PROGRAMS,
        imports=("megatron",),
        when=(("--tensor-model-parallel-size", ">1"),),
        unless=_MEGATRON_FSDP,
        variable="CUDA_DEVICE_MAX_CONNECTIONS",
        value="1",
        effect='validate_args fails an assertion at startup: "Using tensor model parallelism or context '
        'parallelism require setting the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1"',
        source="https://github.com/NVIDIA/Megatron-LM/blob/main/megatron/training/arguments.py (validate_args: "
        "tensor_model_parallel_size > 1 or context_parallel_size > 1, get_device_arch_version() < 10)",
        blackwell_exempt=True,
    ),
    FrameworkRequirement(
        framework="Megatron-LM",
        programs=_MEGATRON_PROGRAMS,
        imports=("megatron",),
        when=(("--context-parallel-size", ">1"),),
        unless=_MEGATRON_FSDP,
        variable="CUDA_DEVICE_MAX_CONNECTIONS",
        value="1",
        effect='validate_args fails an assertion at startup: "Using tensor model parallelism or context '
        'parallelism require setting the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1"',
        source="https://github.com/NVIDIA/Megatron-LM/blob/main/megatron/training/arguments.py (validate_args)",
        blackwell_exempt=True,
    ),
)


def _argument(args: tuple[str, ...], name: str) -> tuple[bool, str | None]:
    """(given, value) of `--name v` / `--name=v` on argv; argparse reads `--a-b` and `--a_b` alike here."""
    want = name.replace("_", "-")
    for i, word in enumerate(args):
        flag, eq, value = word.partition("=")
        if flag.replace("_", "-") != want:
            continue
        if eq:
            return True, value
        nxt = args[i + 1] if i + 1 < len(args) else None
        return True, nxt if nxt is not None and not nxt.startswith("--") else None
    return False, None


def _holds(args: tuple[str, ...], name: str, condition: str) -> bool | None:
    """True/False, or None when the argument's value is only known at run time."""
    given, value = _argument(args, name)
    if condition == "given":
        return given
    if not given:
        return False  # Megatron's parallel sizes default to 1
    if value is None or not re.fullmatch(r"\d+", value):
        return None
    return int(value) > 1


def _program_name(launch) -> str | None:
    if launch.script:
        return os.path.basename(launch.script)
    return launch.module


def applies(row: FrameworkRequirement, launch, program) -> tuple[bool | None, str]:
    """Whether the row applies to this launch (None: an argument's value is not known), and how it was seen."""
    name = _program_name(launch)
    by_name = bool(name and re.search(row.programs, name))
    imports: frozenset[str] = getattr(program, "imports", None) or frozenset()
    by_import = next((i for i in row.imports if i in imports), None)
    if not by_name and not by_import:
        return False, ""
    args = tuple(launch.script_args)
    if any(_argument(args, u)[0] for u in row.unless):
        return False, ""
    states = [_holds(args, arg, cond) for arg, cond in row.when]
    if any(s is False for s in states):
        return False, ""
    seen = f"{name} ({'imports ' + by_import if by_import and not by_name else 'the program run'})"
    shown = " ".join(f"{arg}" + ("" if cond == "given" else " >1") for arg, cond in row.when)
    return (None if None in states else True), f"{seen} with {shown}"


def _prefix_value(launch, variable: str) -> str | None:
    """VAR=value written in front of the command on the launch line (or inside its `bash -c` string)."""
    m = re.search(rf"(?:^|[\s;&|\"'(]){re.escape(variable)}=(\S*)", launch.expanded or "")
    return m.group(1).strip("\"'") if m else None


def _blackwell_or_later(facts, ctx) -> bool | None:
    """The job's GPUs are compute capability 10+ (Blackwell); None when the job's GPUs are not seen here."""
    if ctx.sbatch is not None and not ctx.node_facts and "SLURM_JOB_ID" not in probe_env(facts):
        return None  # before submission this machine's GPUs are not the job's
    majors = []
    for gpu in facts.gpus:
        cap = gpu.get("compute_capability") if isinstance(gpu, dict) else None
        if isinstance(cap, list | tuple) and cap:
            majors.append(int(cap[0]))
    return all(m >= 10 for m in majors) if majors else None


@check(
    id="GD-SLURM-030",
    name="framework-required-variable-missing",
    category="slurm",
    title="Variables the launched framework requires are set",
    needs=["env"],
    scope="job",
    what="Matches the launch line against a table of framework requirements (checks/slurm/framework.py, each row with "
    "the source file that enforces it): Megatron-LM's pretrain_*.py (or a program importing megatron) with "
    "--sequence-parallel, or a tensor/context-parallel size above 1, needs CUDA_DEVICE_MAX_CONNECTIONS=1. The "
    "value is the job's: its environment and exports, an assignment in front of the command, or the program's "
    "own os.environ['NAME'] = ... before the framework reads it.",
    why="The framework checks the variable in its argument validation and stops with an assertion before the "
    "first step, after the job waited in the queue. With one hardware work queue, the tensor-parallel "
    "communication kernels are scheduled in the order they are issued, which their overlap with compute relies on.",
    fix="`export CUDA_DEVICE_MAX_CONNECTIONS=1` in the batch script before the launch line.",
)
def framework_required_variable_missing(facts, ctx):
    sb = ctx.sbatch
    if sb is None or sb.launch is None:
        return skip("no --sbatch script with a launch line: no framework to match")
    launch, program = sb.launch, sb.program
    env = job_env(facts, ctx)
    out = []
    seen: set[str] = set()
    for row in FRAMEWORK_REQUIREMENTS:
        if row.variable in seen:
            continue  # one finding per variable: the first row that applies
        applies_here, how = applies(row, launch, program)
        if applies_here is False:
            continue
        seen.add(row.variable)
        ev: dict[str, Any] = {
            "framework": row.framework,
            "detected": how,
            "source": row.source,
            LAUNCH_EVIDENCE: f"line {launch.line}",
        }
        value, where = env.get(row.variable), env.source(row.variable)
        prefix = _prefix_value(launch, row.variable)
        if prefix is not None:
            value, where = prefix, f"line {launch.line}, in front of the command"
        own = getattr(program, "env_sets", {}) or {}
        if row.variable in own:
            value, where = own[row.variable], f"{os.path.basename(program.path or 'the program')} sets it"
        ev[row.variable] = f"{value} ({where})" if value is not None else "not set"
        if value == row.value:
            out.append(passed(f"{row.variable}={row.value} ({where}) as {row.framework} needs", **ev))
            continue
        if value is not None and re.search(r"[$`]", value):
            out.append(
                info(f"{row.variable}={value} ({where}) is only known at run time; {how} needs {row.value}", **ev)
            )
            continue
        fix = set_env(row.variable, row.value, f"export {row.variable}={row.value} before the launch line")
        state = f"{row.variable}={value} ({where})" if value is not None else f"{row.variable} is not set"
        msg = f"{state}, and {row.framework} needs {row.variable}={row.value}"
        ev["effect"] = row.effect
        late = _blackwell_or_later(facts, ctx)
        if applies_here is None:
            ev["unknown"] = "an argument's value is only known at run time"
            out.append(warn(msg, fix, **ev))
        elif row.blackwell_exempt and late is not False:
            # this source skips the requirement from Blackwell on: a failure only where the GPUs are seen to be older
            ev["blackwell"] = (
                "the job's GPUs are Blackwell or later, where it is skipped" if late else "GPUs not seen here"
            )
            out.append((info if late else warn)(f"{msg} on GPUs before Blackwell", fix, **ev))
        elif late:
            ev["blackwell"] = "current Megatron-LM skips it on Blackwell GPUs like this job's"
            out.append(warn(msg, fix, **ev))
        else:
            out.append(fail(msg, fix, **ev))
    return out or skip("no launched framework in the requirements table (checks/slurm/framework.py)")
