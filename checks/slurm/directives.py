"""directives checks: the #SBATCH lines sbatch really reads.

sbatch reads options from the lines that begin, at their first character and case-sensitively, with
`#SBATCH` (or the old `#SLURM`), and only above the first command (src/sbatch/opt.c,
_opt_batch_script: `xstrncmp(line, "#SBATCH", 7)`; a line whose first non-blank character is not `#`
ends the reading). Verified on sbatch 22.05.8 (tests/slurmcluster.py, `sbatch -H` then `scontrol show
job`): `#SBATCh`, `#SBTACH`, `# SBATCH`, `#  SBATCH`, `##SBATCH`, `  #SBATCH` set nothing; `!#SBATCH`
is a command (bash: "command not found") and the #SBATCH lines below it are ignored too; `#SLURM` is
read, with "error: Change from #SLURM to #SBATCH"; `#SBATCH--time=1` is read.
"""

from __future__ import annotations

from typing import Any

from gpudoctor.job.shape import RESOURCE_OPTIONS
from gpudoctor.model import Action, ActionKind, Fix, Safety, fail, info, passed, warn
from gpudoctor.readers.sbatch.lookalike import FORMS, options_after_marker
from gpudoctor.registry import check


def lost_effect(option: str, value: str | bool, lightning: bool) -> str:
    """What an option that sbatch never reads would have done."""
    if option == "signal":
        sig = str(value).split("@")
        when = f" {sig[1]} s" if len(sig) > 1 and sig[1].isdigit() else ""
        who = (
            "Lightning never gets its pre-timeout signal, so it neither saves a checkpoint nor requeues the job"
            if lightning
            else "a handler that saves a checkpoint on it never runs"
        )
        return f"the job gets no {sig[0].removeprefix('B:')}{when} before its time limit: {who}"
    return {
        "gres": "no such generic resources (GPUs) are requested",
        "gpus": "no such GPUs are requested",
        "gpus-per-node": "no such GPUs are requested",
        "gpus-per-task": "no such GPUs are requested",
        "nodes": "the job gets SLURM's default of one node (or what the tasks need)",
        "ntasks": "the job gets SLURM's default task count",
        "ntasks-per-node": "the job gets SLURM's default task count",
        "cpus-per-task": "each task gets one CPU",
        "mem": "the partition's default memory applies",
        "time": "the partition's default time limit applies",
        "partition": "the job goes to the default partition",
        "output": "the output goes to slurm-%j.out",
        "error": "errors go to the output file",
        "job-name": "the job is named after the script",
        "requeue": "the job is not requeued on node failure unless the cluster's default does",
        "exclusive": "the node is shared with other jobs",
        "array": "the job runs once, not as an array",
    }.get(option, "not applied")


def _options_text(options) -> str:
    return " ".join(f"--{k}" if v is True else f"--{k}={v}" for k, v in options)


@check(
    id="GD-SLURM-025",
    name="sbatch-directive-lookalike-not-read",
    category="slurm",
    title="Every line meant as an #SBATCH directive is read by sbatch",
    needs=[],
    requires=["sbatch"],
    scope="job",
    what="Finds header lines of a batch script (--sbatch) that look like #SBATCH directives but that sbatch does "
    "not read: indented (`  #SBATCH`), a blank after the '#' (`# SBATCH`), a misspelt or lower-case marker "
    "(`#SBATCh`, `#SBTACH`), or a stray character before it (`!#SBATCH`, which bash runs as a command). "
    "`##SBATCH`, the usual way to switch a directive off, is only named in the pass message. A line counts only when "
    "all its words are sbatch options, so prose and usage notes (`# sbatch --array=0-9 job.sh`) are not.",
    why="sbatch matches `#SBATCH` exactly, at the first character of a line (src/sbatch/opt.c, "
    "_opt_batch_script): any other spelling is a comment and its option is silently lost -- a lost "
    "`--signal=SIGUSR1@90` means Lightning never gets its pre-timeout signal and a 48 h job dies without a "
    "checkpoint; a lost `--gres` runs the job without GPUs. `!#SBATCH` is worse: it is the first command, so "
    "sbatch stops reading there and ignores every #SBATCH line below it, and bash prints 'command not found'.",
    fix="Write the directive as `#SBATCH --option=value` at the start of the line (`gpudoctor fix` rewrites the "
    "marker and keeps the options as written). Leave `##SBATCH` lines alone when they are switched off on purpose.",
)
def sbatch_directive_lookalike_not_read(facts, ctx):
    sb = ctx.sbatch
    found = list(getattr(sb, "lookalike_directives", ()))
    legacy = [d.line for d in sb.directives if d.text.startswith("#SLURM")]
    slips = [la for la in found if la.repairable]
    disabled = [la for la in found if not la.repairable]
    lightning = getattr(sb.launch, "lightning", None) is not None or ctx.launcher == "lightning"
    parts, lost_resources = [], False
    for la in slips:
        effects = "; ".join(f"--{k}: {lost_effect(k, v, lightning)}" for k, v in la.options)
        lost_resources |= any(k in RESOURCE_OPTIONS for k, _ in la.options)
        text = f"line {la.line} `{la.text}` {FORMS[la.form]}, so {_options_text(la.options)} is lost ({effects})"
        if la.form == "command" and la.hides:
            text += (
                f"; sbatch also skips the #SBATCH line(s) below it, up to the next command (line(s) "
                f"{', '.join(map(str, la.hides))}: GD-SLURM-011)"
            )
            below = [d for d in sb.late_directives if d.line in la.hides]
            lost_resources |= any(_names_resource(d.text) for d in below)
        parts.append(text)
    ev: dict[str, Any] = {"lines": [f"line {la.line}: {la.text}" for la in found]}
    if slips:
        path = sb.path
        fix = Fix(
            "Write " + "; ".join(f"line {la.line} as `{la.repaired}`" for la in slips),
            Safety.UNSAFE if lost_resources else Safety.SAFE,
            tuple(Action(ActionKind.DIRECTIVE_REPAIR, path, value=la.text) for la in slips),
        )
        # A lost GPU request with none left that sbatch reads: the job runs without a GPU (GD-SLURM-003 fails it too).
        # Other losses change what the job gets, but whether it still runs as meant depends on the rest: a warn.
        lost_gpus = any(
            k in GPU_OPTIONS and (k != "gres" or "gpu" in str(v)) for la in slips for k, v in la.options
        ) or any(_names_gpus(d.text) for la in slips for d in sb.late_directives if d.line in la.hides)
        sev = fail if lost_gpus and not any(d.option in GPU_OPTIONS for d in sb.directives) else warn
        ev["why"] = parts
        lost = ", ".join(f"line {la.line}" for la in slips)
        return sev(f"sbatch does not read {lost}, written as #SBATCH: its options are lost", fix, **ev)
    # `##SBATCH` is how directives are switched off: said in the pass message, never a finding to act on
    off = [f"line {la.line} `{la.text}` ({_options_text(la.options)} not applied)" for la in disabled]
    said = f"; switched off with a second '#': {'; '.join(off)}" if off else ""
    if legacy:
        return info(
            f"line(s) {', '.join(map(str, legacy))} use the old #SLURM marker: sbatch still reads them but prints "
            f"'error: Change from #SLURM to #SBATCH'{said}",
            **ev,
        )
    return passed(f"every line written as an #SBATCH directive is read by sbatch{said}", **ev)


GPU_OPTIONS = frozenset({"gres", "gpus", "gpus-per-node", "gpus-per-task"})


def _names_gpus(text: str) -> bool:
    return any(
        k in GPU_OPTIONS and (k != "gres" or "gpu" in str(v))
        for k, v in options_after_marker(text.split("#SBATCH", 1)[-1])
    )


def _names_resource(text: str) -> bool:
    return any(k in RESOURCE_OPTIONS for k, _ in options_after_marker(text.split("#SBATCH", 1)[-1]))
