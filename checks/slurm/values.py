"""GD-SLURM-001: the job's SLURM values, read in SLURM's own formats, and whether they agree."""

from __future__ import annotations

import re
from collections.abc import Mapping

from gpudoctor.checks.slurm._shared import env_int, shape_evidence, slurm_shape
from gpudoctor.job.env import probe_env
from gpudoctor.job.shape import JobShape
from gpudoctor.model import Action, ActionKind, Fix, Safety, info, manual, passed, warn
from gpudoctor.readers import slurmfmt
from gpudoctor.registry import check


@check(
    id="GD-SLURM-001",
    name="slurm-job-values-unreadable",
    category="slurm",
    title="SLURM job variables and directives are readable and consistent",
    needs=["env"],
    requires=["slurm-job"],
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
    shape = slurm_shape(facts, ctx)
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
        first = problems[0] if len(problems) == 1 else f"{len(problems)} SLURM values could not be read or disagree"
        return warn(first, fix, problems=problems, **shape_evidence(shape, job=summary))
    notes = shape.notes + site_options
    if notes:  # the note is the point; the job's shape is evidence
        more = f" (and {len(notes) - 1} more)" if len(notes) > 1 else ""
        return info(notes[0] + more, **shape_evidence(shape, notes=notes, job=summary))
    return passed(f"{shape.where}: {summary}", **shape_evidence(shape))


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


def _env_inconsistencies(env: Mapping[str, str]) -> list[str]:
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
    ntasks = env_int(env, tasks_var)
    nodes = env_int(env, nodes_var)
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
