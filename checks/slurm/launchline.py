"""launch-line checks: does the training line still name a program once bash has expanded it?

`CMD="$LAUNCHER $PYTHON_FILE $ARGS"; srun $CMD` with PYTHON_FILE never set: bash(1) "Parameter Expansion"
expands an unset variable to nothing, and word splitting drops the empty word, so the launcher gets no
program -- the next argument takes its place, or none is left. torchrun (torch/distributed/run.py: the
positional `training_script`), `accelerate launch` (`training_script`) and deepspeed (`user_script`) stop with
an argparse usage error on every node; a bare `python` reads its program from stdin, which is /dev/null in a
batch job, and exits 0 having run nothing.

Whether the variable reaches the job from outside the script is the submission's business: sbatch passes the
submitting shell's environment by default (sbatch(1) "--export": ALL), none of it with --export=NONE (or NIL),
only the SLURM_* variables. So a variable the script never sets (readers/sbatch/names.py: any assignment,
loop, read, ${X:=...}) is a fail only under --export=NONE with no sourced file, eval or module that could set
it; otherwise a warn that names it.
"""

from __future__ import annotations

import re

from gpudoctor.job.env import script_argument_note
from gpudoctor.model import fail, info, manual, passed, skip, warn
from gpudoctor.registry import check

# Launchers whose first positional argument is the program to run.
_TAKES_A_PROGRAM = {"torchrun", "torch.distributed.launch", "accelerate", "deepspeed", "python"}
# A program word that is one reference left unexpanded by the reader: the variable is not set in the script.
_REFERENCE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*|[1-9][0-9]*|[@*])\}?")
_NO_INHERIT = ("NONE", "NIL")


def _unset_reference(word: str, sb) -> bool:
    """A word that is one reference to a variable the script never sets: bash drops it too."""
    m = _REFERENCE.fullmatch(word)
    return m is not None and not m.group(1).isdigit() and m.group(1) not in sb.assigned_names


def _inherited(export: object, name: str) -> bool:
    """Whether sbatch may pass name from the submitting shell: --export=ALL (the default) or a list naming it."""
    if export is None or export is True:
        return True
    items = [i.strip() for i in str(export).split(",") if i.strip()]
    if not items or items[0].upper() not in _NO_INHERIT:
        return True  # ALL, or a list of NAME / NAME=value: ALL unless it begins with NONE/NIL
    return any(i.split("=", 1)[0] == name for i in items[1:])


def _consequence(launcher: str, following: str | None) -> str:
    if launcher == "python":
        return (
            "python then runs "
            + (f"`{following}` as its program" if following and not following.startswith("-") else "no program")
            + " (with none, it reads its program from stdin, /dev/null in a batch job, and exits 0 having "
            "trained nothing)"
        )
    took = f" (`{following}` takes its place)" if following else ""
    return f"{launcher} gets no program{took}: a usage error when the job starts, on every node"


@check(
    id="GD-SLURM-021",
    name="launch-program-unset",
    category="slurm",
    title="The launch line names a program after expansion",
    needs=[],
    requires=["sbatch"],
    scope="job",
    what="For --sbatch: the training line of torchrun, torch.distributed.launch, accelerate launch, deepspeed or "
    "python, expanded as bash expands it; is its program a variable the script never sets (`$PYTHON_FILE` in "
    '`CMD="$LAUNCHER $PYTHON_FILE $ARGS"`), and can the job inherit it (#SBATCH --export)?',
    why="bash expands an unset variable to nothing and drops the empty word: the launcher starts without its "
    "program and stops with a usage error (torchrun, accelerate and deepspeed all require one), or the next "
    "argument is run as the program; a bare python reads stdin and exits having trained nothing. sbatch passes "
    "the submitting shell's variables by default, none with --export=NONE.",
    fix="Set the variable in the script before the launch line (`PYTHON_FILE=train.py`), or write the program on "
    "the line itself.",
)
def launch_program_unset(facts, ctx):
    sb = ctx.sbatch
    launch = sb.launch
    if launch is None or launch.launcher not in _TAKES_A_PROGRAM:
        return skip("no torchrun, accelerate, deepspeed or python launch line in the script")
    if launch.module or launch.inline or (launch.script and not _REFERENCE.fullmatch(launch.script)):
        shown = f"-m {launch.module}" if launch.module else "-c ..." if launch.inline else launch.script
        return passed(f"line {launch.line} runs {shown}", launch_line=f"line {launch.line}: {launch.text}")
    ev = {"launch line": f"line {launch.line}: {launch.text}", "expanded": launch.expanded}
    if launch.script is None:
        return skip(f"no program read on line {launch.line} (an option gpudoctor does not know may hide it)", **ev)
    name = launch.script.strip("${}")  # one reference: the passed() above took every other program word
    following = next((a for a in launch.script_args if not _unset_reference(a, sb)), None)
    argument = script_argument_note(launch.script, (sb.path or "job.slurm").rsplit("/", 1)[-1])
    if argument:
        if sb.arguments is None:
            return info(f"line {launch.line}'s program is {launch.script}: {argument}", **ev)
        return passed(f"line {launch.line} runs the program given as {launch.script}", **ev)
    if name in sb.assigned_names:
        return passed(f"line {launch.line} runs ${name}, which the script sets (its value is known when it runs)", **ev)
    export = sb.options.get("export")
    ev["#SBATCH --export"] = export if export is not None else "ALL (the default)"
    if sb.other_sources:
        ev["lines that may set it"] = list(sb.other_sources)
    fix = manual(f"Set {name} in the script before the launch line, or write the program on the line")
    consequence = _consequence(launch.launcher, following)
    also = sorted({a.strip("${}") for a in launch.script_args if _unset_reference(a, sb)})
    if also:
        consequence += f" (${', $'.join(also)} on the line {'is' if len(also) == 1 else 'are'} set nowhere either)"
        ev["also unset"] = also
    ev["then"] = f"it expands to nothing, so {consequence}"
    if not _inherited(export, name) and not sb.other_sources:
        return fail(
            f"line {launch.line}'s program is ${name}, set nowhere and not passed (--export={export}): it runs nothing",
            fix,
            **ev,
        )
    where = (
        f"no line sets it, but line{'s' if len(sb.other_sources) > 1 else ''} "
        f"{', '.join(map(str, sb.other_sources))} (source, eval, module) may"
        if sb.other_sources
        else "the script never sets it"
    )
    ev["where"] = where
    ev["unless"] = "the submitting shell exports it (sbatch passes its environment, --export=ALL by default)"
    return warn(
        f"line {launch.line}'s program is ${name}, which no line sets: empty unless your shell exports it",
        fix,
        **ev,
    )
