"""launch-flag checks: an option given twice on the training line.

`torchrun --nproc_per_node=$X ... --nproc_per_node=2 train.py`: torchrun, `accelerate launch`, deepspeed and
a program's own options are read with Python's argparse, where an option given twice keeps its last value
(docs.python.org/3/library/argparse.html, action 'store': "the last value wins" is how repeated store options
behave), silently. Whoever added the second one meant it, or forgot the first: either way the line says two
things and does one, so it is said -- a warning when the values differ, a note when the same value is
repeated. `--x v`, `--x=v` and `--x_y`/`--x-y` (argparse's dest) are the same option.
"""

from __future__ import annotations

import shlex

from gpudoctor.model import info, passed, skip, warn
from gpudoctor.registry import check


def _options(words: list[str] | tuple[str, ...]) -> list[tuple[str, str, str | None]]:
    """(dest, as written, value) for each `--option[=value]` among words; a value is the next word when it
    is not an option itself (how argparse reads `--x v` for an option that takes one)."""
    found: list[tuple[str, str, str | None]] = []
    for i, word in enumerate(words):
        if not word.startswith("--") or word == "--":
            continue
        name, eq, written = word.partition("=")
        value: str | None = written
        if not eq:
            nxt = words[i + 1] if i + 1 < len(words) else None
            value = nxt if nxt is not None and not nxt.startswith("-") else None
        found.append((name.lstrip("-").replace("-", "_"), name, value))
    return found


def repeated(words) -> list[tuple[str, list[str | None]]]:
    """(option as written, its values in order) for each option given more than once."""
    seen: dict[str, tuple[str, list]] = {}
    for dest, name, value in _options(list(words)):
        seen.setdefault(dest, (name, []))[1].append(value)
    return [(name, values) for name, values in seen.values() if len(values) > 1]


@check(
    id="GD-SLURM-041",
    name="launch-option-given-twice",
    category="slurm",
    title="No option is given twice on the launch line",
    needs=[],
    requires=["sbatch"],
    scope="job",
    what="For --sbatch: reads the training line's launcher options (torchrun, accelerate launch, deepspeed) and "
    "the program's own arguments, and names an option given more than once.",
    why="argparse keeps the last value of an option given twice and says nothing: "
    "`--nproc_per_node=$GPUS ... --nproc_per_node=2` starts 2 processes whatever $GPUS is, and the line reads "
    "as if it did both.",
    fix="Keep one: delete the occurrence you did not mean (argparse uses the last one).",
)
def launch_option_given_twice(facts, ctx):
    launch = getattr(ctx.sbatch, "launch", None)
    if launch is None or not launch.launcher:
        return skip("no launch line read in the script")
    try:
        words = shlex.split(launch.text, comments=False)
    except ValueError:
        return skip(f"line {launch.line} is not read as words (an open quote)")
    script = launch.script
    cut = words.index(script) if script in words else len(words)
    program = (launch.program or launch.launcher or "").rsplit("/", 1)[-1]
    start = next((i for i, w in enumerate(words[:cut]) if w.rsplit("/", 1)[-1] == program), 0)
    launcher_words = words[start:cut]  # srun's own options before it are srun's business
    # a launcher's options are argparse 'store' options: the last wins; a program's may append (a note only)
    found: list[tuple[str | None, str, list[str | None]]] = [
        ("the launcher", *r) for r in repeated(launcher_words) if launch.launcher != "python"
    ]
    found += [(None, *r) for r in repeated(list(launch.script_args))]
    ev: dict = {"launch line": f"line {launch.line}: {launch.text[:160]}"}
    if not found:
        return passed(f"line {launch.line} gives each option once", **ev)
    who, name, values = found[0]
    shown = " then ".join(f"{name}={v}" if v is not None else name for v in values)
    ev["given twice"] = [f"{w or 'the program'}: {n} " + " then ".join(str(v) for v in vs) for w, n, vs in found]
    differ = len(set(values)) > 1
    last = values[-1]
    message = f"line {launch.line} gives {who or 'the program'} {shown}: argparse keeps the last" + (
        f", {name}={last}" if differ and last is not None else ""
    )
    if len(message) > 120:
        message = f"line {launch.line} gives {name} {len(values)} times: argparse keeps the last value"
    if who is None:
        ev["unless"] = "the program's option appends its values (argparse action='append')"
    return (warn if differ and who is not None else info)(message, None, **ev)
