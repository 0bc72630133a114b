"""The #SBATCH header as sbatch reads it, and the job its values ask SLURM for.

Directives are read as sbatch reads them (sbatch man page, "DESCRIPTION": options "may be
specified ... in the script as lines beginning with #SBATCH ... before any executable commands"):
`#SBATCH` at the very start of a line, short and long forms, `--opt=value` and `--opt value`, a
trailing `# comment` allowed; #SBATCH lines below the first command are ignored by sbatch and
reported as late_directives. Values sbatch itself would refuse raise SbatchError.
"""

from __future__ import annotations

import re

from gpudoctor.readers import slurmfmt
from gpudoctor.readers.sbatch.options import INTEGER_OPTIONS, directive_marker, directive_words, read_options
from gpudoctor.readers.sbatch.script import Directive, SbatchError, ScriptLine
from gpudoctor.readers.sbatch.shell import Source, unquote
from gpudoctor.redact import redact

# A directive number this long is refused outright (exit 2) rather than judged: Python's int() refuses
# over 4300 digits, and no SLURM value comes near. Shorter out-of-range counts are left to the checks.
_REFUSED_DIGITS = 100


def implied_slurm_env(directives: dict, job_name: str) -> dict[str, str]:
    """The SLURM_* values the directives give the batch shell (as far as they follow from them)."""
    env = {"SLURM_JOB_NAME": job_name}
    nodes = directives.get("nodes")
    if nodes and re.fullmatch(r"\d+", str(nodes)):
        env["SLURM_NNODES"] = env["SLURM_JOB_NUM_NODES"] = str(nodes)
    for opt, var in (
        ("ntasks", "SLURM_NTASKS"),
        ("ntasks-per-node", "SLURM_NTASKS_PER_NODE"),
        ("cpus-per-task", "SLURM_CPUS_PER_TASK"),
        ("gpus-per-node", "SLURM_GPUS_PER_NODE"),
        ("gpus-per-task", "SLURM_GPUS_PER_TASK"),
        ("gpus", "SLURM_GPUS"),
        ("cpus-per-gpu", "SLURM_CPUS_PER_GPU"),  # sbatch(1) OUTPUT ENVIRONMENT VARIABLES
        ("ntasks-per-gpu", "SLURM_NTASKS_PER_GPU"),
    ):
        if opt in directives and directives[opt] is not True:
            env[var] = str(directives[opt])
    if "ntasks" not in directives and "ntasks-per-node" in directives and "SLURM_NNODES" in env:
        try:
            env["SLURM_NTASKS"] = str(int(directives["ntasks-per-node"]) * int(env["SLURM_NNODES"]))
        except ValueError:
            pass
    gpn = gpus_per_node_requested(directives)
    if gpn is not None:
        env["SLURM_GPUS_ON_NODE"] = str(gpn.count)
    return env


def gpus_per_node_requested(directives: dict) -> slurmfmt.GpuRequest | None:
    """GPUs per node the directives ask for (--gres, --gpus-per-node, --gpus over --nodes); None if none named."""
    try:
        if directives.get("gres"):
            req = slurmfmt.parse_gres(directives["gres"])
            if req is not None:
                return req
        if directives.get("gpus-per-node"):
            return slurmfmt.parse_gpus(directives["gpus-per-node"])
        if directives.get("gpus"):
            total = slurmfmt.parse_gpus(directives["gpus"])
            nodes = directives.get("nodes")
            if nodes is None or str(nodes) == "1":
                return total
            if re.fullmatch(r"\d+", str(nodes)) and int(nodes) > 0 and total.count % int(nodes) == 0:
                return slurmfmt.GpuRequest(total.count // int(nodes), total.type)
    except slurmfmt.SlurmFormatError:
        return None
    return None


def _validate(directives: dict, lines: dict, path: str) -> None:
    """Values sbatch itself would refuse: one clear line instead of a wrong verdict."""
    for opt in INTEGER_OPTIONS:
        if opt in directives:
            value = directives[opt]
            if value is True or not re.fullmatch(r"\s*\d+\s*", str(value)):
                raise SbatchError(f"{path}:{lines.get(opt, '?')}: #SBATCH --{opt}={value}: expected a whole number")
    nodes = directives.get("nodes")
    if nodes is not None and not re.fullmatch(r"\d+(-\d+)?", str(nodes)):
        raise SbatchError(f"{path}:{lines.get('nodes', '?')}: #SBATCH --nodes={nodes}: expected N or MIN-MAX")
    for opt, parse in (
        ("gres", slurmfmt.parse_gres),
        ("gpus", slurmfmt.parse_gpus),
        ("gpus-per-node", slurmfmt.parse_gpus),
        ("gpus-per-task", slurmfmt.parse_gpus),
    ):
        if opt in directives:
            try:
                parse(str(directives[opt]))
            except slurmfmt.SlurmFormatError as e:
                raise SbatchError(f"{path}:{lines.get(opt, '?')}: #SBATCH --{opt}={directives[opt]}: {e}") from None


def _check_ranges(directives: dict, lines: dict, path: str) -> None:
    """Numbers of over _REFUSED_DIGITS digits refused before any int() can meet them."""
    for opt, value in directives.items():
        if value is True:
            continue
        for digits in re.findall(r"\d+", str(value)):
            if len(digits) > _REFUSED_DIGITS:
                shown = f"{digits[:12]}... ({len(digits)} digits)"
                raise SbatchError(f"{path}:{lines.get(opt, '?')}: #SBATCH --{opt}: the number {shown} is out of range")


def component_values(components: list[list[Directive]], path: str) -> list[dict]:
    """Each component's options {option: value}; SbatchError where sbatch would refuse a value."""
    values = []
    for directives in components:
        opts = {d.option: d.value for d in directives}
        lines = {d.option: d.line for d in directives}
        _check_ranges(opts, lines, path)
        _validate(opts, lines, path)
        values.append(opts)
    return values


def read_header(src: Source, path: str):
    """(components [(directives, lines)], unknown, late, commented, first command offset)."""
    components: list[list[Directive]] = [[]]
    unknown: list[ScriptLine] = []
    late: list[ScriptLine] = []
    commented: list[ScriptLine] = []
    first_command: int | None = None
    offset = 0
    text = src.text
    for lineno, raw in enumerate(text.split("\n"), 1):
        start, offset = offset, offset + len(raw) + 1
        marker = directive_marker(raw)
        if first_command is not None and marker is None:
            continue  # below the first command only #SBATCH lines matter (sbatch ignores them)
        stripped = redact(raw.strip())  # shown in findings: a credential in `--export=...,TOKEN=x` never is
        line_span = src.span(start, start + len(raw))
        if marker is not None:
            entry = ScriptLine(lineno, stripped, line_span)
            if first_command is not None:
                late.append(entry)
                continue
            rest = raw[len(marker) :]
            # sbatch splits what follows the marker into words whether or not a blank comes first:
            # `#SBATCH--time=1:00` is read, `#SBATCHx` makes it refuse the script ("Invalid directive ... x")
            if rest.split()[:1] in (["hetjob"], ["packjob"]):  # the next component of a heterogeneous job
                components.append([])
                continue
            directives, bad = _directive_line(src, lineno, start + len(marker), rest, raw, line_span, path)
            components[-1].extend(directives)
            if bad:
                unknown.append(ScriptLine(lineno, stripped, line_span, tuple(bad)))
            continue
        if first_command is None and re.match(r"\s*#+\s*SBATCH\s", raw):
            commented.append(ScriptLine(lineno, stripped, line_span))  # '##SBATCH' / '# SBATCH' / '  #SBATCH'
        if not stripped or stripped.startswith("#"):
            continue
        if first_command is None:
            first_command = start
    return components, unknown, late, commented, first_command


# The words sbatch takes as directives at the very start of a line (src/sbatch/opt.c, _opt_batch_script,
# case-sensitive xstrncmp); #SLURM is still read in 22.05 and later, with "error: Change from #SLURM to #SBATCH".
def _directive_line(src: Source, lineno: int, base: int, rest: str, raw: str, line_span, path: str):
    tokens = directive_words(rest)
    if any(t.unterminated for t in tokens):
        raise SbatchError(f"{path}:{lineno}: cannot split {raw.strip()!r} into words (No closing quotation)")
    words = [unquote(t.text) for t in tokens]
    try:
        hits, bad, _ = read_options(words, stop_at_command=False)
    except SbatchError as e:
        raise SbatchError(f"{path}:{lineno}: #SBATCH: {e}") from None
    out = []
    for h in hits:
        opt_tok = tokens[h.word]
        end_tok = tokens[h.value_word] if h.value_word is not None else opt_tok
        value_span = None
        if h.value_word is not None:
            vt = tokens[h.value_word]
            value_span = src.span(base + vt.start + h.value_offset, base + vt.end)
        value = h.value if isinstance(h.value, bool) else redact(h.value)
        out.append(
            Directive(
                h.option,
                value,
                h.written,
                lineno,
                redact(raw.strip()),
                src.span(base + opt_tok.start, base + end_tok.end),
                value_span,
                line_span,
            )
        )
    return out, bad
