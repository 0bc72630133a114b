"""What the job's processes are given on their command line, against what the program and the world accept
(gpudoctor/job/model.py: each process's argv after every expansion and wrapper).

- GD-SLURM-039: every long option on the program's argv is one its argparse parser accepts (read from the program
  with ast: readers/program.Argparse). argparse (Python docs, "parse_args"): an option it does not define ends the
  program with "error: unrecognized arguments", exit 2; with allow_abbrev (the default) a unique prefix of a long
  option is that option, a prefix of several is "ambiguous option". torch.distributed.launch adds --local-rank.
- GD-SLURM-040: the parallel degrees a Megatron-style program is given (--tensor-model-parallel-size,
  --pipeline-model-parallel-size, --context-parallel-size) divide the world size the model computes: Megatron's
  initialize_model_parallel raises "world_size (W) is not divisible by tensor_model_parallel_size (T) x
  pipeline_model_parallel_size (P) x context_parallel_size (C)" -- after the job waited in the queue.
"""

from __future__ import annotations

import re
from collections import Counter

from gpudoctor.job.model import JobModel, job_model, known
from gpudoctor.model import fail, manual, passed, skip
from gpudoctor.registry import check


def _first_process(model: JobModel):
    return next(iter(model.processes()), None)


def _program_words(model: JobModel, argv: tuple[str, ...]) -> tuple[str, ...]:
    """The words after the program file (`python [opts] train.py WORDS`, `torchrun [opts] train.py WORDS`)."""
    script = model.launch.script if model.launch is not None else None
    if not script or script not in argv:
        return ()
    return argv[argv.index(script) + 1 :]


def _rejected(words: tuple[str, ...], options: frozenset[str], abbrev: bool) -> list[tuple[str, str]]:
    """(word, why) for each long option argparse would refuse."""
    out = []
    for word in words:
        if word == "--":
            break
        name = word.split("=", 1)[0]
        if not name.startswith("--") or "$" in name or "`" in name or len(name) < 3:
            continue
        if name in options:
            continue
        matches = [o for o in options if o.startswith(name) and o.startswith("--")] if abbrev else []
        if len(matches) == 1:
            continue
        out.append((word, f"ambiguous: {', '.join(sorted(matches)[:3])}" if matches else "unrecognized"))
    return out


@check(
    id="GD-SLURM-039",
    name="program-accepts-its-arguments",
    category="slurm",
    title="The program's argparse accepts the options the launch line gives it",
    needs=[],
    requires=["sbatch"],
    scope="job",
    what="Reads the long options each process gets on its argv (after the batch shell's expansion and the "
    "launcher's own, e.g. torch.distributed.launch's --local-rank) and the options the program's argparse parser "
    "defines (its add_argument calls, read with ast); fails on one argparse would refuse. Skipped where the parser "
    "may take options not read (parse_known_args, subparsers, options named at run time, other CLI libraries).",
    why="argparse ends the program with 'error: unrecognized arguments' (exit 2) on an option it does not define: "
    "every rank dies at start, after the job waited in the queue (Python docs, argparse parse_args).",
    fix="Spell the option as the program defines it (python train.py --help lists them).",
)
def program_accepts_its_arguments(facts, ctx):
    model = job_model(facts, ctx)
    if model is None or model.launch is None:
        return skip("no training launch line in the batch script")
    program = model.program
    parser = getattr(program, "argparse", None)
    if parser is None:
        return skip("the program's argparse parser was not read")
    if not parser.complete:
        return skip(f"the program may accept options not read here: {parser.why_incomplete}")
    first = _first_process(model)
    if first is None:
        return skip("the model lists no process")
    words = _program_words(model, first.argv)
    bad = _rejected(words, parser.options, parser.abbrev)
    ev = {"parse_args": parser.where, "options given": list(w for w in words if w.startswith("-"))[:20]}
    if not bad:
        return passed(f"the {sum(w.startswith('--') for w in words)} option(s) given are ones its parser defines", **ev)
    word, why = bad[0]
    shown = word if len(word) <= 40 else word[:37] + "..."
    return fail(
        f"line {model.launch.line}: {parser.where.split(':')[0]} does not define {shown} ({why}): argparse exits "
        "at start",
        manual("Use an option the program defines", f"python {model.launch.script} --help"),
        rejected=[f"{w} ({y})" for w, y in bad[:10]],
        defined=sorted(parser.options)[:40],
        **ev,
    )


_DEGREES = (
    ("tensor", re.compile(r"^--tensor[-_]model[-_]parallel[-_]size$")),
    ("pipeline", re.compile(r"^--pipeline[-_]model[-_]parallel[-_]size$")),
    ("context", re.compile(r"^--context[-_]parallel[-_]size$")),
)


def degrees(argv: tuple[str, ...]) -> dict[str, int]:
    """Megatron's parallel sizes on an argv (`--tensor-model-parallel-size 4`, `..._size=4`), literal ones only."""
    out: dict[str, int] = {}
    for i, word in enumerate(argv):
        name, eq, value = word.partition("=")
        for key, pattern in _DEGREES:
            if pattern.match(name):
                text = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
                if re.fullmatch(r"\d{1,6}", text):
                    out[key] = int(text)
    return out


@check(
    id="GD-SLURM-040",
    name="parallel-degrees-divide-the-world",
    category="slurm",
    title="The model-parallel sizes divide the job's world size",
    needs=[],
    requires=["sbatch"],
    scope="job",
    what="Reads Megatron's --tensor-model-parallel-size, --pipeline-model-parallel-size and --context-parallel-size "
    "on the processes' argv and the world size the job model computes (one world, its size known); fails when "
    "their product does not divide it.",
    why="Megatron's initialize_model_parallel raises 'world_size is not divisible by tensor_model_parallel_size x "
    "pipeline_model_parallel_size x context_parallel_size' at start, after the job waited in the queue.",
    fix="Choose sizes whose product divides the GPUs of the job (nodes x GPUs per node), or change the nodes.",
)
def parallel_degrees_divide_the_world(facts, ctx):
    model = job_model(facts, ctx)
    if model is None or model.launch is None:
        return skip("no training launch line in the batch script")
    first = _first_process(model)
    found = degrees(first.argv) if first is not None else {}
    if not found:
        return skip("no model-parallel size on the launch line")
    sizes = Counter(p.world_size for p in model.processes() if known(p.world_size))
    worlds = model.worlds()
    if len(worlds) != 1 or len(sizes) != 1:
        return skip("the job's world size is not one known number", **found)
    world = len(next(iter(worlds.values())))
    product = 1
    for value in found.values():
        product *= value
    shown = " x ".join(f"{k} {v}" for k, v in found.items())
    if product and world % product == 0:
        return passed(f"{shown} = {product} divides the world of {world}", world_size=world, **found)
    return fail(
        f"line {model.launch.line}: parallel sizes {shown} = {product} do not divide the world of {world} ranks",
        manual(f"Choose sizes whose product divides {world}"),
        world_size=world,
        **found,
    )
