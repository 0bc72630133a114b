"""The batch script as sbatch and bash read it: directives below the first command (GD-SLURM-011), a
backslash before a comment (GD-SLURM-013), bash syntax (GD-SLURM-014), a line that starts with an argument
(GD-SLURM-015), a training launch left in the background with nothing waiting for it (GD-SLURM-042).
"""

from __future__ import annotations

import re

from gpudoctor.job.shape import RESOURCE_OPTIONS
from gpudoctor.model import Action, ActionKind, Fix, Safety, fail, manual, passed, skip, warn
from gpudoctor.registry import check


@check(
    id="GD-SLURM-011",
    name="sbatch-directive-after-first-command",
    category="slurm",
    title="All #SBATCH directives come before the first command",
    needs=[],
    requires=["sbatch"],
    scope="job",
    what="Finds #SBATCH lines below the first command of a batch script (--sbatch).",
    why="sbatch stops reading directives at the first line that is not a comment or blank: a `module load` "
    "or `set -e` above them makes every later #SBATCH line a comment, and the job runs with the default "
    'resources -- often no GPU -- without a warning (sbatch man page: directives come "before any executable '
    'commands"; sbatch stops at the first non-comment, non-whitespace line, https://slurm.schedmd.com/sbatch.html).',
    fix="Move all #SBATCH lines directly under the #! line, before any command.",
)
def sbatch_directive_after_first_command(facts, ctx):
    late = ctx.sbatch.late_directives
    if not late:
        return passed("every #SBATCH directive is read")
    path = ctx.sbatch.path
    lines = [f"line {d.line}: {d.text}" for d in late]
    important = [d for d in late if any(f"--{o}" in d.text or _short_form(d.text, o) for o in RESOURCE_OPTIONS)]
    # Moving them makes sbatch read them: a resource line then changes what the job asks for (unsafe).
    fix = Fix(
        f"Move these #SBATCH lines above the first command of {path}: " + "; ".join(lines),
        Safety.UNSAFE if important else Safety.SAFE,
        tuple(Action(ActionKind.SBATCH_HOIST, path, value=d.text) for d in late),
    )
    sev = fail if important else warn
    first = ctx.sbatch.first_command_line
    stray = next((la for la in ctx.sbatch.lookalike_directives if la.form == "command" and la.line == first), None)
    cause = (
        f" (the first command is line {first}, `{stray.text}`: a directive with a stray character before "
        "#SBATCH, see GD-SLURM-025)"
        if stray
        else ""
    )
    return sev(
        f"sbatch ignores {len(late)} #SBATCH line(s) below the first command{cause}: " + "; ".join(lines),
        fix,
        ignored=lines,
    )


def _short_form(text: str, option: str) -> bool:
    from gpudoctor.readers.sbatch import SHORT

    return any(f" -{k}" in f" {text.split('#SBATCH', 1)[-1]}" for k, v in SHORT.items() if v == option)


# ---------------------------------------------------------------- GD-SLURM-013 / 014 (the script as bash reads it)


_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


@check(
    id="GD-SLURM-013",
    name="sbatch-backslash-before-comment",
    category="slurm",
    title="Every line continuation in the batch script continues the command",
    needs=[],
    requires=["sbatch"],
    scope="job",
    what="For --sbatch: finds a backslash followed by blanks (and often a `# comment`) at the end of a line "
    "of a command, e.g. `trainer.params.accelerator=gpu \\    # use GPU`.",
    why="Only a backslash directly before the newline continues a line (bash manual, 3.1.2.1 Escape Character: "
    "https://www.gnu.org/software/bash/manual/html_node/Escape-Character.html). A backslash before a blank "
    "escapes that blank, the `#` word then starts a comment that runs to the end of the line (3.1.3 Comments), "
    "and the newline ends the command: the launch runs without the arguments below it, and bash runs the next "
    "line as a command of its own -- `trainer.params.num_nodes=1: command not found`.",
    fix="Put nothing after the backslash: delete the blanks and move the comment to its own line above the command.",
)
def sbatch_backslash_before_comment(facts, ctx):
    broken = ctx.sbatch.broken_continuations
    if not broken:
        return passed("every line ending in a backslash continues its command")
    path = ctx.sbatch.path
    parts, commands, evidence = [], [], {}
    for b in broken:
        comment = " and a comment" if "#" in b.text.rsplit("\\", 1)[-1] else ""
        runs = (
            "as an assignment, not as part of the command"
            if _ASSIGNMENT.match(b.next_program)
            else f"as a command of its own: `{b.next_program[:40]}: command not found`"
        )
        parts.append(
            f"line {b.line} ends with a backslash and blanks{comment}, so the command ends there and bash runs "
            f"line {b.next_line} (`{b.next_text[:80]}`) {runs}"
        )
        commands.append(f"sed -i -E '{b.line}s/\\\\[[:blank:]]+(#.*)?$/\\\\/' {path}")
        evidence[f"line {b.line}"] = b.text
        evidence[f"line {b.next_line}"] = b.next_text
    fix = manual(
        f"Nothing after the backslash on line{'s' if len(broken) > 1 else ''} "
        + ", ".join(str(b.line) for b in broken)
        + " (comments go above)",
        *commands,
    )
    if path:
        # Structured: the arguments bash dropped then reach the program, which changes what the job runs (unsafe).
        fix = Fix(
            fix.title, Safety.UNSAFE, tuple(Action(ActionKind.CONTINUATION_REPAIR, path, value=b.text) for b in broken)
        )
    first = broken[0]
    lines = ", ".join(str(b.line) for b in broken)
    evidence["what bash does"] = parts
    return fail(
        f"line{'s' if len(broken) > 1 else ''} {lines}: a blank after the backslash ends the command, "
        f"so bash runs line {first.next_line} on its own",
        fix,
        **evidence,
    )


@check(
    id="GD-SLURM-014",
    name="sbatch-script-bash-syntax",
    category="slurm",
    title="bash can parse the batch script",
    needs=[],
    requires=["sbatch"],
    scope="job",
    what="For --sbatch: runs `bash -n` on the script (syntax only, nothing is executed; bounded by a timeout, in "
    "its own process group).",
    why="sbatch does not parse the script: a missing `fi`, `done` or quote is found only when the job starts, "
    "after it waited in the queue, and the job then fails at once (bash manual, 6.1 Invoking Bash: `-n` reads "
    "commands without executing them, https://www.gnu.org/software/bash/manual/html_node/Invoking-Bash.html; "
    "sbatch man page: the script is run by the interpreter of its #! line, https://slurm.schedmd.com/sbatch.html).",
    fix="Correct the syntax error bash names (line numbers count from the #! line), then re-run `bash -n SCRIPT`.",
)
def sbatch_script_bash_syntax(facts, ctx):
    result = ctx.sbatch.bash_syntax
    if result is None:
        return skip("the script's syntax was not checked (read without `bash -n`)")
    if result.ok is None:
        return skip(result.message)
    if result.ok:
        return passed("bash -n reads the script without a syntax error")
    path = ctx.sbatch.path
    return fail(
        f"bash cannot parse the script: {result.message}; the job would fail as soon as it starts",
        manual("Correct the syntax error, then check again", f"bash -n {path}"),
        bash_n=result.message,
    )


@check(
    id="GD-SLURM-015",
    scope="job",
    name="sbatch-line-runs-as-missing-command",
    category="slurm",
    title="No line of the batch script starts with an argument instead of a command",
    needs=[],
    requires=["sbatch"],
    what="For --sbatch: finds lines whose first word is an option or an override (`--lr 1e-4`, "
    "`trainer.devices=8`), which bash runs as a command of that name.",
    why="A newline ends a command unless a backslash is right before it (bash manual, 3.1.2.1 Escape Character, "
    "https://www.gnu.org/software/bash/manual/html_node/Escape-Character.html). When a line of a long launch "
    "command loses its backslash, the launch runs without the arguments below, and bash then looks the next "
    "line's first word up as a command (3.7.2 Command Search and Execution): `--lr: command not found`. "
    "A dotted name is no shell assignment (3.4 Shell Parameters: a name is letters, digits and underscores).",
    fix="End the line above with a backslash (nothing after it), so the arguments belong to the launch command.",
)
def sbatch_line_runs_as_missing_command(facts, ctx):
    stray = ctx.sbatch.stray_arguments
    if not stray:
        return passed("every command of the script starts with a command name")
    parts, evidence = [], {}
    for a in stray:
        above = f"; line {a.previous_line} above ends the command without a backslash" if a.previous_line else ""
        parts.append(
            f"line {a.line} starts with `{a.program[:40]}`, which bash runs as a command: "
            f"`{a.program[:40]}: command not found`{above}"
        )
        evidence[f"line {a.line}"] = a.text
    lines = ", ".join(f"line {a.previous_line}" for a in stray if a.previous_line)
    fix = manual(
        f"End {lines} with a backslash" if lines else "Join these arguments to the command they belong to",
        *(f"line {a.line}: {a.text[:120]}" for a in stray),
    )
    return fail("; ".join(parts), fix, **evidence)


@check(
    id="GD-SLURM-042",
    name="training-in-background-without-wait",
    category="slurm",
    title="The batch script waits for the training it starts in the background",
    needs=[],
    requires=["sbatch"],
    scope="job",
    what="For --sbatch: finds training launch lines ended by `&` (run in the background) with no `wait` after "
    "them in the batch script.",
    why="bash runs a command ended by `&` in the background and goes on at once (bash(1), Lists); when the batch "
    "script reaches its end, the job is complete and SLURM ends it, killing every step and process it started "
    "(sbatch(1): the job runs the batch script; its exit ends the job). With no `wait`, the training is killed "
    "seconds after it starts; the job's state says COMPLETED.",
    fix="Add `wait` after the last command started with `&` (it waits for all of them), or run the launch in the "
    "foreground.",
)
def training_in_background_without_wait(facts, ctx):
    sb = ctx.sbatch
    background = [la for la in sb.launches if la.background]
    if not background:
        return passed("no training launch runs in the background")
    last = background[-1]
    if any(w > last.line for w in sb.wait_lines):
        return passed(f"line {last.line} runs in the background and a `wait` follows it")
    lines = ", ".join(str(la.line) for la in background)
    blocking = [la for la in sb.launches if not la.background and la.line > last.line]
    if blocking:
        # a launch in the foreground keeps the script, and so the job, alive while it runs (a helper such as
        # tensorboard started with `&` before the training is the common case): not judged
        return passed(f"line {blocking[-1].line} runs in the foreground after the `&` of line {lines}")
    return fail(
        f"line {lines} starts the training with `&` and nothing waits: the script ends, and SLURM ends the job",
        manual("Wait for the training before the script ends", "wait   # after the last `... &` line"),
        background_lines=[la.line for la in background],
        wait_lines=list(sb.wait_lines),
    )
