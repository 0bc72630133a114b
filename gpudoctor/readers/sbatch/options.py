"""sbatch/srun option tables and the getopt-style reading of options (sbatch and srun man pages).

Long options may be abbreviated to a unique prefix and take `--opt=value` or `--opt value`;
short options `-N2`, `-N 2`, `-N=2`; flags can be bundled (`-Hk`). Options with an optional
argument take a value only with '=' (getopt's optional_argument).
"""

from __future__ import annotations

from typing import NamedTuple

from gpudoctor.readers.sbatch.script import SbatchError
from gpudoctor.readers.sbatch.shell import Token

# Long options that take a value (sbatch and srun share most). Aliases map to one name.
VALUE_OPTIONS = frozenset(
    """account acctg-freq array batch bb bbf begin chdir clusters comment constraint container
    core-spec cores-per-socket cpu-bind cpu-freq cpus-per-gpu cpus-per-task deadline delay-boot
    dependency distribution error exclude export export-file extra extra-node-info gid gpu-bind
    gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task gres gres-flags hint input job-name
    licenses mail-type mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu mincpus mpi
    network nodefile nodelist nodes ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node
    ntasks-per-socket open-mode output partition power prefer priority profile qos reservation
    resv-ports signal sockets-per-node switches task-epilog task-prolog thread-spec threads-per-core
    time time-min tmp tres-per-task uid wckey wait-all-nodes het-group multi-prog
    slurmd-debug epilog prolog dependency cluster-constraint kill-on-invalid-dep wrap""".split()
)
# Options whose argument is optional: a value only with '=' (getopt's optional_argument).
OPTIONAL_VALUE = frozenset(
    "exclusive nice no-kill propagate kill-on-bad-exit x11 requeue bcast compress send-libs".split()
)
FLAG_OPTIONS = frozenset(
    """contiguous exact hold ignore-pbs no-requeue overcommit oversubscribe parsable quiet
    spread-job test-only use-min-nodes verbose wait overlap label unbuffered pty no-allocate
    disable-status immediate kill-on-bad-exit help usage get-user-env reboot version""".split()
)
ALIASES = {
    "tasks-per-node": "ntasks-per-node",
    "mem-per-gpus": "mem-per-gpu",
    "workdir": "chdir",
    "nodelist": "nodelist",
}
SHORT = {
    "A": "account",
    "a": "array",
    "B": "extra-node-info",
    "b": "begin",
    "C": "constraint",
    "c": "cpus-per-task",
    "D": "chdir",
    "d": "dependency",
    "e": "error",
    "G": "gpus",
    "i": "input",
    "J": "job-name",
    "L": "licenses",
    "M": "clusters",
    "m": "distribution",
    "N": "nodes",
    "n": "ntasks",
    "o": "output",
    "p": "partition",
    "q": "qos",
    "S": "core-spec",
    "t": "time",
    "w": "nodelist",
    "x": "exclude",
    "F": "nodefile",
}
SHORT_FLAGS = {
    "H": "hold",
    "k": "no-kill",
    "O": "overcommit",
    "s": "oversubscribe",
    "v": "verbose",
    "Q": "quiet",
    "W": "wait",
    "l": "label",
    "u": "unbuffered",
    "K": "kill-on-bad-exit",
    "I": "immediate",
    "h": "help",
}
# srun's own options that differ from sbatch's: --wait/-W take seconds (sbatch --wait is a flag),
# --jobid/--het-group name an existing allocation or component, -l/-u are flags.
SRUN_VALUE_OPTIONS = frozenset(
    "wait jobid het-group accel-bind cpu-bind mpi relative bcast-exclude msg-timeout threads".split()
)
SRUN_FLAG_OPTIONS = frozenset("external-launcher exact overlap whole multi-prog preserve-env quit-on-interrupt".split())
# NVIDIA pyxis (a SPANK plugin on most DGX clusters): srun --container-image IMAGE ... command.
PYXIS_VALUE_OPTIONS = frozenset(
    "container-image container-mounts container-workdir container-name container-save container-env".split()
)
PYXIS_FLAG_OPTIONS = frozenset(
    """container-mount-home no-container-mount-home container-remap-root no-container-remap-root
    container-entrypoint no-container-entrypoint container-writable container-readonly""".split()
)
SRUN_SHORT = {"W": "wait", "r": "relative", "T": "threads"}
# Directives whose values sbatch checks as whole numbers.
INTEGER_OPTIONS = ("ntasks", "ntasks-per-node", "cpus-per-task", "ntasks-per-gpu", "ntasks-per-socket", "mincpus")


def close_option(name: str) -> str | None:
    """The sbatch option an unknown one was probably meant to be ('ntask-per-node' -> 'ntasks-per-node')."""
    import difflib  # only when a directive is unknown

    known = sorted(VALUE_OPTIONS | OPTIONAL_VALUE | FLAG_OPTIONS | set(ALIASES))
    match = difflib.get_close_matches(name.lstrip("-").split("=")[0], known, n=1, cutoff=0.8)
    return ALIASES.get(match[0], match[0]) if match else None


_SRUN_ONLY = SRUN_VALUE_OPTIONS | SRUN_FLAG_OPTIONS | PYXIS_VALUE_OPTIONS | PYXIS_FLAG_OPTIONS


def canonical(name: str, srun: bool = False) -> str | None:
    """'tasks-per-node' -> 'ntasks-per-node'; a unique prefix ('--ntasks-per-n') -> the option; else None."""
    name = ALIASES.get(name, name)
    known = VALUE_OPTIONS | OPTIONAL_VALUE | FLAG_OPTIONS | (_SRUN_ONLY if srun else frozenset())
    if name in known:
        return name
    matches = sorted({ALIASES.get(m, m) for m in known | set(ALIASES) if m.startswith(name)})
    return matches[0] if len(matches) == 1 else None


class OptionHit(NamedTuple):
    """One option read from a list of words, and where its parts are."""

    option: str  # canonical long name
    value: str | bool
    written: str  # "-N", "--ntasks"
    word: int  # index of the option's word
    value_word: int | None  # index of the word holding the value (None for a flag)
    value_offset: int  # where the value starts inside that word (as written, before quote removal)


def read_options(
    tokens: list[str],
    stop_at_command: bool = True,
    srun: bool = False,
) -> tuple[list[OptionHit], list[str], list[str]]:
    """sbatch/srun options -> (options read, unknown options, remaining words).

    Stops at the first word that is not an option (srun's command) when stop_at_command.
    srun=True reads srun's own options too (--jobid ID, --wait=SECONDS, -W SECONDS).
    Raises SbatchError for an option that needs a value and has none.
    """
    values = VALUE_OPTIONS | SRUN_VALUE_OPTIONS | PYXIS_VALUE_OPTIONS if srun else VALUE_OPTIONS
    shorts = {**SHORT, **SRUN_SHORT} if srun else SHORT
    short_flags = {k: v for k, v in SHORT_FLAGS.items() if not (srun and k in SRUN_SHORT)}
    hits: list[OptionHit] = []
    unknown: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok == "--":
            i += 1
            break
        if tok.startswith("--") and len(tok) > 2:
            name, eq, value = tok[2:].partition("=")
            canon = canonical(name, srun)
            if canon is None:
                unknown.append(tok)
                i += 1
                continue
            if canon in values and not eq:
                if i + 1 >= len(tokens):
                    raise SbatchError(f"option --{name} needs a value")
                hits.append(OptionHit(canon, tokens[i + 1], f"--{name}", i, i + 1, 0))
                i += 2
                continue
            if eq or canon in values:
                hits.append(OptionHit(canon, value, f"--{name}", i, i, len(name) + 3))
            else:
                hits.append(OptionHit(canon, True, f"--{name}", i, None, 0))
            i += 1
            continue
        if tok.startswith("-") and len(tok) > 1 and not tok[1].isdigit():
            letter, rest = tok[1], tok[2:]
            if letter in shorts:
                offset = 2
                if rest.startswith("="):
                    rest, offset = rest[1:], 3
                if rest:
                    hits.append(OptionHit(shorts[letter], rest, f"-{letter}", i, i, offset))
                else:
                    if i + 1 >= len(tokens):
                        raise SbatchError(f"option -{letter} needs a value")
                    hits.append(OptionHit(shorts[letter], tokens[i + 1], f"-{letter}", i, i + 1, 0))
                    i += 1
            elif letter in short_flags and all(c in short_flags for c in tok[1:]):
                hits.extend(OptionHit(short_flags[c], True, f"-{c}", i, None, 0) for c in tok[1:])
            else:
                unknown.append(tok)
            i += 1
            continue
        if stop_at_command:
            break
        unknown.append(tok)
        i += 1
    return hits, unknown, tokens[i:]


def parse_options(
    tokens: list[str], stop_at_command: bool = True, srun: bool = False
) -> tuple[dict, list[str], list[str]]:
    """sbatch/srun options -> ({canonical: value or True}, unknown options, remaining words)."""
    hits, unknown, rest = read_options(tokens, stop_at_command, srun)
    return {h.option: h.value for h in hits}, unknown, rest


# -- the directive lines: their marker and words, as sbatch reads them (src/sbatch/opt.c) --------------------
DIRECTIVE_MARKERS = ("#SBATCH", "#SLURM")


def directive_marker(raw: str) -> str | None:
    """The directive word a line starts with, as sbatch matches it; None for any other line."""
    return next((m for m in DIRECTIVE_MARKERS if raw.startswith(m)), None)


def directive_words(rest: str) -> list[Token]:
    """An #SBATCH line's words as sbatch splits them: at blanks, quotes kept together, a word starting with `#`
    ending the line. No shell operators: `--constraint=a100&ib|h100` is one word to sbatch."""
    words: list[Token] = []
    i, n = 0, len(rest)
    while i < n:
        if rest[i] in " \t\n":
            i += 1
            continue
        if rest[i] == "#":
            break
        start, quote = i, None
        while i < n and (quote or rest[i] not in " \t\n"):
            c = rest[i]
            if c == "\\" and quote != "'":
                i += 2
                continue
            if quote and c == quote:
                quote = None
            elif not quote and c in "'\"":
                quote = c
            i += 1
        words.append(Token("word", rest[start:i], start, min(i, n), quote is not None))
    return words
