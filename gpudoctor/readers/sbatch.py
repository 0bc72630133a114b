"""Reading a SLURM batch script without running it: #SBATCH directives and the launch line.

    sb = load_sbatch("train.slurm")
    sb["directives"]     {"gres": "gpu:h200:1", "ntasks-per-node": "8", ...}  (canonical long names)
    sb["launch"]         the training launch: srun options, launcher, its process counts
    sb["exports"]        {"CUDA_VISIBLE_DEVICES": {"value": ..., "line": n, "text": "export ..."}, ...}
    sb["commented_directives"]  '##SBATCH ...' lines (comments to sbatch)
    sb["het_components"], sb["het_group"]  a heterogeneous job (`#SBATCH hetjob`): directives are
                         those of the component the training step runs in (srun --het-group)

Launch lines are read through what real scripts wrap them in: variables holding the command
(`CMD="torchrun ..."; srun $CMD`), integer $((...)), `srun bash -c "..."` / `sh -xeuc '...'`,
shifter, pyxis's --container-* options and srun's own --jobid/--wait. The batch shell is task 0
on node 0, so `$SLURM_PROCID` there expands to 0.

Directives are read as sbatch reads them: `#SBATCH` at the very start of a line, short
and long forms, `--opt=value` and `--opt value`, a trailing `# comment` allowed, and
nothing after the first line that is not a comment or blank (sbatch ignores #SBATCH
lines below the first command; they are reported in "late_directives").

A script that cannot be read, or whose directive values sbatch itself would reject,
raises SbatchError (cli.py prints it as one line and exits 2).
"""

from __future__ import annotations

import os
import re
import shlex

from gpudoctor.readers import slurmfmt


class SbatchError(ValueError):
    """A batch script that cannot be used: one clear line, exit 2."""


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
OPTIONAL_VALUE = frozenset("exclusive nice no-kill propagate kill-on-bad-exit x11 requeue bcast compress send-libs".split())
FLAG_OPTIONS = frozenset(
    """contiguous exact hold ignore-pbs no-requeue overcommit oversubscribe parsable quiet
    spread-job test-only use-min-nodes verbose wait overlap label unbuffered pty no-allocate
    disable-status immediate kill-on-bad-exit help usage get-user-env reboot version""".split()
)
ALIASES = {"tasks-per-node": "ntasks-per-node", "mem-per-gpus": "mem-per-gpu", "workdir": "chdir", "nodelist": "nodelist"}
SHORT = {
    "A": "account", "a": "array", "B": "extra-node-info", "b": "begin", "C": "constraint", "c": "cpus-per-task",
    "D": "chdir", "d": "dependency", "e": "error", "G": "gpus", "i": "input", "J": "job-name", "L": "licenses",
    "M": "clusters", "m": "distribution", "N": "nodes", "n": "ntasks", "o": "output", "p": "partition", "q": "qos",
    "S": "core-spec", "t": "time", "w": "nodelist", "x": "exclude", "F": "nodefile",
}
SHORT_FLAGS = {"H": "hold", "k": "no-kill", "O": "overcommit", "s": "oversubscribe", "v": "verbose", "Q": "quiet",
               "W": "wait", "l": "label", "u": "unbuffered", "K": "kill-on-bad-exit", "I": "immediate", "h": "help"}
# srun's own options that differ from sbatch's: --wait/-W take seconds (sbatch --wait is a flag),
# --jobid/--het-group name an existing allocation or component, -l/-u are flags.
SRUN_VALUE_OPTIONS = frozenset("wait jobid het-group accel-bind cpu-bind mpi relative bcast-exclude msg-timeout threads".split())
SRUN_FLAG_OPTIONS = frozenset("external-launcher exact overlap whole multi-prog preserve-env quit-on-interrupt".split())
# NVIDIA pyxis (a SPANK plugin on most DGX clusters): srun --container-image IMAGE ... command.
PYXIS_VALUE_OPTIONS = frozenset("container-image container-mounts container-workdir container-name container-save container-env".split())
PYXIS_FLAG_OPTIONS = frozenset("""container-mount-home no-container-mount-home container-remap-root no-container-remap-root
    container-entrypoint no-container-entrypoint container-writable container-readonly""".split())
SRUN_SHORT = {"W": "wait", "r": "relative", "T": "threads"}
# Directives whose values sbatch checks as whole numbers.
INTEGER_OPTIONS = ("ntasks", "ntasks-per-node", "cpus-per-task", "ntasks-per-gpu", "ntasks-per-socket", "mincpus")

LAUNCHERS = ("torchrun", "torch.distributed.launch", "deepspeed", "accelerate", "python", "lightning")
_PY = re.compile(r"^python(\d+(\.\d+)?)?$")
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")
# Commands in front of the real one: `exec`, `time`, `nohup`, `env A=1`, `stdbuf -oL` ...
_PREFIX_COMMANDS = {"exec", "time", "nohup", "command", "builtin", "nice", "stdbuf", "env", "numactl", "taskset", "unbuffer"}
_NOT_TRAINING = {"hostname", "nvidia-smi", "echo", "printf", "mkdir", "cd", "ls", "cat", "sleep", "date", "true", "env",
                 "module", "source", "conda", "pip", "export", "rm", "cp", "mv", "tee", "scontrol", "squeue", "sacct", "hostname"}


def close_option(name: str) -> str | None:
    """The sbatch option an unknown one was probably meant to be ('ntask-per-node' -> 'ntasks-per-node')."""
    import difflib

    known = sorted(VALUE_OPTIONS | OPTIONAL_VALUE | FLAG_OPTIONS | set(ALIASES))
    match = difflib.get_close_matches(name.lstrip("-").split("=")[0], known, n=1, cutoff=0.8)
    return ALIASES.get(match[0], match[0]) if match else None


def canonical(name: str, srun: bool = False) -> str | None:
    """'tasks-per-node' -> 'ntasks-per-node'; a unique prefix ('--ntasks-per-n') -> the option; else None."""
    name = ALIASES.get(name, name)
    srun_only = SRUN_VALUE_OPTIONS | SRUN_FLAG_OPTIONS | PYXIS_VALUE_OPTIONS | PYXIS_FLAG_OPTIONS
    known = VALUE_OPTIONS | OPTIONAL_VALUE | FLAG_OPTIONS | (srun_only if srun else frozenset())
    if name in known:
        return name
    matches = sorted(k for k in known | set(ALIASES) if k.startswith(name))
    matches = sorted({ALIASES.get(m, m) for m in matches})
    return matches[0] if len(matches) == 1 else None


def parse_options(tokens: list[str], stop_at_command: bool = True, srun: bool = False) -> tuple[dict, list[str], list[str]]:
    """sbatch/srun options -> ({canonical: value or True}, unknown options, remaining tokens).

    Stops at the first token that is not an option (srun's command) when stop_at_command.
    srun=True reads srun's own options too (--jobid ID, --wait=SECONDS, -W SECONDS).
    Raises SbatchError for an option that needs a value and has none.
    """
    values = VALUE_OPTIONS | SRUN_VALUE_OPTIONS | PYXIS_VALUE_OPTIONS if srun else VALUE_OPTIONS
    shorts = {**SHORT, **SRUN_SHORT} if srun else SHORT
    short_flags = {k: v for k, v in SHORT_FLAGS.items() if not (srun and k in SRUN_SHORT)}
    opts: dict = {}
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
                value = tokens[i + 1]
                i += 1
            opts[canon] = value if eq or canon in values else True
            i += 1
            continue
        if tok.startswith("-") and len(tok) > 1 and not tok[1].isdigit():
            letter, rest = tok[1], tok[2:]
            if letter in shorts:
                if rest.startswith("="):
                    rest = rest[1:]
                if not rest:
                    if i + 1 >= len(tokens):
                        raise SbatchError(f"option -{letter} needs a value")
                    rest = tokens[i + 1]
                    i += 1
                opts[shorts[letter]] = rest
            elif letter in short_flags and all(c in short_flags for c in tok[1:]):
                for c in tok[1:]:
                    opts[short_flags[c]] = True
            else:
                unknown.append(tok)
            i += 1
            continue
        if stop_at_command:
            break
        unknown.append(tok)
        i += 1
    return opts, unknown, tokens[i:]


def _split(text: str, lineno: int, path: str) -> list[str]:
    try:
        lex = shlex.shlex(text, posix=True)
        lex.whitespace_split = True
        lex.commenters = "#"
        return list(lex)
    except ValueError as e:
        raise SbatchError(f"{path}:{lineno}: cannot split {text.strip()!r} into words ({e})") from None


_OPERATORS = {";", "&&", "||", "|", "&", ";;", "(", ")", "|&"}


def _commands(line: str) -> list[list[str]]:
    """A shell line split into simple commands at ; && || | &, quotes respected.

    A body line that is not valid shell on its own (a heredoc's text, an unclosed quote)
    holds no launch line gpudoctor can read: it yields nothing instead of failing.
    """
    try:
        lex = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
        lex.whitespace_split = True
        lex.commenters = "#"
        tokens = list(lex)
    except ValueError:
        return []
    out, cur = [], []
    for tok in tokens:
        if tok in _OPERATORS or set(tok) <= set(";&|()"):
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append(tok)
    if cur:
        out.append(cur)
    return out


def _logical_lines(text: str):
    """(first line number, joined text) with backslash-newline continuations joined."""
    buf, start = [], None
    for n, line in enumerate(text.splitlines(), 1):
        if start is None:
            start = n
        if line.endswith("\\") and not line.endswith("\\\\"):
            buf.append(line[:-1])
            continue
        buf.append(line)
        yield start, " ".join(buf)
        buf, start = [], None
    if buf:
        yield start, " ".join(buf)


_ARITH = re.compile(r"\$\(\(([^()]*)\)\)")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _arithmetic(expr: str, known: dict[str, str]) -> str | None:
    """$(( SLURM_NNODES * GPUS_PER_NODE )) -> '16' when every name is a known integer; else None."""
    expr = _VAR.sub(lambda m: known.get(m.group(1) or m.group(3), m.group(0)), expr)
    expr = _NAME.sub(lambda m: known.get(m.group(0), m.group(0)), expr)
    if not re.fullmatch(r"[\d\s+\-*/%()]+", expr) or "**" in expr or len(expr) > 200:
        return None
    try:
        value = eval(expr.replace("/", "//"), {"__builtins__": {}}, {})  # digits and + - * / % only
    except (SyntaxError, ZeroDivisionError, TypeError, ValueError):
        return None
    return str(value) if isinstance(value, int) else None


# Set per task by srun: the batch shell's value (task 0) is not what a task's own shell sees.
PER_TASK_VARS = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID")


def _deferred_segments(text: str) -> list[tuple[str, bool]]:
    """(piece, deferred): '...'-quoted text and \\$VAR are not expanded by the batch shell but later,
    by the shell each task runs (`srun bash -c '... $SLURM_NODEID ...'`)."""
    out: list[tuple[str, bool]] = []
    start, i, in_double = 0, 0, False
    while i < len(text):
        c = text[i]
        if c == "\\" and text[i + 1 : i + 2] == "$":
            out.append((text[start:i], False))
            m = _VAR.match(text, i + 1)
            end = m.end() if m else i + 2
            out.append((text[i + 1 : end], True))  # the shell drops the backslash
            start = i = end
            continue
        if c == "\\":
            i += 2
            continue
        if c == '"':
            in_double = not in_double
        elif c == "'" and not in_double:
            close = text.find("'", i + 1)
            end = len(text) if close < 0 else close + 1
            out.append((text[start:i], False))
            out.append((text[i:end], True))
            start = i = end
            continue
        i += 1
    out.append((text[start:], False))
    return [(piece, deferred) for piece, deferred in out if piece]


def expand_vars(text: str, known: dict[str, str]) -> str:
    """$X, ${X}, ${X:-default} and integer $((...)) from the variables known; unknown ones stay as written.

    In single quotes and after a backslash the per-task SLURM variables stay as written: each task's
    shell expands them to its own values.
    """
    task_known = {k: v for k, v in known.items() if k not in PER_TASK_VARS}
    return "".join(_expand(piece, task_known if deferred else known) for piece, deferred in _deferred_segments(text))


def _expand(text: str, known: dict[str, str]) -> str:
    text = _ARITH.sub(lambda m: _arithmetic(m.group(1), known) or m.group(0), text)

    def sub(m):
        name = m.group(1) or m.group(3)
        if name in known:
            return known[name]
        if m.group(2) is not None:
            return m.group(2)
        return m.group(0)

    return _VAR.sub(sub, text)


# ---------------------------------------------------------------- launch lines


def _strip_prefixes(tokens: list[str]) -> list[str]:
    """Drop VAR=value assignments and wrapper commands in front of the real command."""
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if _ASSIGN.match(tok):
            i += 1
        elif os.path.basename(tok) in _PREFIX_COMMANDS:
            i += 1
            while i < len(tokens) and tokens[i].startswith("-"):  # wrapper options (stdbuf -oL, nice -n 5)
                i += 2 if tokens[i] in ("-n", "-C", "--cpunodebind", "--membind", "-c") else 1
        else:
            break
    return tokens[i:]


def _take(args: list[str], names: tuple[str, ...], flags: tuple[str, ...] = ()) -> tuple[dict, list[str]]:
    """Launcher options (`--x v`, `--x=v`, flags) up to the first positional -> (options, rest)."""
    opts, i = {}, 0
    while i < len(args):
        tok = args[i]
        if not tok.startswith("-") or tok == "-":
            break
        name, eq, value = tok.partition("=")
        key = name.lstrip("-").replace("_", "-")
        if key in names:
            if not eq:
                value = args[i + 1] if i + 1 < len(args) else ""
                i += 1
            opts[key] = value
        elif key in flags:
            opts[key] = True
        elif not eq and i + 1 < len(args) and not args[i + 1].startswith("-") and key not in ("m", "module"):
            i += 1  # an unknown option with a separate value: skip the value too
        i += 1
    return opts, args[i:]


_TORCHRUN_VALUES = ("nproc-per-node", "nnodes", "node-rank", "rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf",
                    "master-addr", "master-port", "max-restarts", "monitor-interval", "start-method", "role", "log-dir",
                    "redirects", "r", "tee", "t", "local-addr", "local-ranks-filter", "logs-specs")
_TORCHRUN_FLAGS = ("standalone", "use-env", "module", "m", "no-python", "run-path")


def _lightning_args(args: list[str]) -> dict:
    """devices/num_nodes passed to a Lightning script: Hydra `trainer.devices=8`, LightningCLI `--trainer.devices 8`."""
    found = {}
    for i, tok in enumerate(args):
        key, eq, value = tok.lstrip("+-").partition("=")
        if not eq and tok.startswith("--") and i + 1 < len(args):
            value = args[i + 1]
        parts = key.split(".")
        if parts[0] == "trainer" and parts[-1] in ("devices", "num_nodes", "gpus", "accelerator", "strategy"):
            found[parts[-1]] = value
        elif parts[0] == "trainer":
            found.setdefault("mentioned", True)
    return found


def _describe_python(args: list[str]) -> dict:
    """python [opts] (-m module | script) args."""
    i = 0
    while i < len(args):
        tok = args[i]
        if tok == "-m" and i + 1 < len(args):
            return {"module": args[i + 1], "args": args[i + 2 :]}
        if tok.startswith("-m") and len(tok) > 2:
            return {"module": tok[2:], "args": args[i + 1 :]}
        if tok == "-c":
            return {"inline": True, "args": args[i + 2 :]}
        if tok in ("-X", "-W", "-Q"):
            i += 2
            continue
        if tok.startswith("-"):
            i += 1
            continue
        return {"script": tok, "args": args[i + 1 :]}
    return {}


_SHELLS = {"bash", "sh", "zsh", "dash", "ksh"}


def _shell_command_string(args: list[str]) -> str | None:
    """The command string of `bash -c '...'` / `sh -xeuc '...'`; None for `bash script.sh`."""
    i = 0
    while i < len(args):
        tok = args[i]
        if tok in ("-o", "+o", "-O", "+O", "--rcfile", "--init-file"):
            i += 2
            continue
        if tok.startswith("-") and not tok.startswith("--") and "c" in tok[1:]:
            return args[i + 1] if i + 1 < len(args) else None
        if tok.startswith(("-", "+")):
            i += 1
            continue
        return None
    return None


def _inner_launch(text: str) -> list[str] | None:
    """The command inside a `bash -c` string that starts the training (the last launcher, else the last program)."""
    cmds = [c for c in _commands(text) if _strip_prefixes(c)]
    described = [(c, describe_command(c)) for c in cmds]
    for c, d in reversed(described):
        if d.get("launcher"):
            return c
    for c, d in reversed(described):
        if d.get("program") and d["program"] not in _NOT_TRAINING and not d["program"].startswith("$"):
            return c
    return None


def describe_command(tokens: list[str]) -> dict:
    """What a command (after srun, if any) launches: launcher and its process counts."""
    tokens = _strip_prefixes(tokens)
    if not tokens:
        return {"program": None}
    prog = os.path.basename(tokens[0])
    args = tokens[1:]
    out: dict = {"program": prog, "launcher": None}
    if prog in _SHELLS:
        inner = _shell_command_string(args)
        picked = _inner_launch(inner) if inner else None
        if picked:  # srun bash -c "RANK=\$SLURM_PROCID python train.py": judge what the shell runs
            return {**describe_command(picked), "via_shell": f"{prog} -c"}
        return out
    if prog == "shifter":  # NERSC's container wrapper: shifter --image=X [--env=A=B] command
        rest = list(args)
        while rest and rest[0].startswith("-"):
            rest = rest[1:] if "=" in rest[0] else rest[2:]
        return describe_command(rest) if rest else out
    if prog in ("uv", "poetry", "pipenv", "pixi") and args[:1] == ["run"]:
        return describe_command(args[1:])
    if prog == "conda" and args[:1] == ["run"]:
        rest = args[1:]
        while rest and rest[0].startswith("-"):
            rest = rest[2:] if rest[0] in ("-n", "--name", "-p", "--prefix") else rest[1:]
        return describe_command(rest)
    if prog in ("apptainer", "singularity") and args[:1] in (["exec"], ["run"]):
        rest = args[1:]
        while rest and rest[0].startswith("-"):
            rest = rest[2:] if rest[0] in ("-B", "--bind", "--env", "--home", "-H", "--pwd") else rest[1:]
        return describe_command(rest[1:]) if rest else out  # rest[0] is the image
    if prog == "torchrun":
        return {**out, "launcher": "torchrun", **_torchrun(args)}
    if _PY.match(prog):
        py = _describe_python(args)
        module = py.get("module")
        if module in ("torch.distributed.run", "torch.distributed.launch"):
            launcher = "torchrun" if module.endswith("run") else "torch.distributed.launch"
            return {**out, "launcher": launcher, "module": module, **_torchrun(py.get("args", []))}
        if module in ("accelerate.commands.launch",):
            return {**out, **_accelerate(py.get("args", []))}
        if module == "deepspeed" or (module or "").startswith("deepspeed.launcher"):
            return {**out, **_deepspeed(py.get("args", []))}
        if module == "gpudoctor" or (py.get("script") or "").endswith("gpudoctor"):
            return {**out, "launcher": None, "gpudoctor": True}
        res = {**out, "launcher": "python", **{k: v for k, v in py.items() if k != "args"}, "script_args": py.get("args", [])}
        light = _lightning_args(py.get("args", []))
        if light:
            res["lightning"] = light
        return res
    if prog == "accelerate" and args[:1] == ["launch"]:
        return {**out, **_accelerate(args[1:])}
    if prog == "deepspeed":
        return {**out, **_deepspeed(args)}
    fabric_args = args[2:] if prog == "lightning" and args[:2] == ["run", "model"] else args[1:] if prog == "fabric" and args[:1] == ["run"] else None
    if fabric_args is not None:  # `lightning run model` / `fabric run`: Fabric's own launcher
        opts, rest = _take(fabric_args, ("devices", "num-nodes", "accelerator", "strategy", "precision", "node-rank", "main-address", "main-port"))
        return {**out, "launcher": "lightning", "nproc_per_node": opts.get("devices"), "nnodes": opts.get("num-nodes"), "script": rest[0] if rest else None}
    if prog == "gpudoctor":
        return {**out, "gpudoctor": True}
    return out


def _torchrun(args: list[str]) -> dict:
    opts, rest = _take(args, _TORCHRUN_VALUES, _TORCHRUN_FLAGS)
    res = {
        "nproc_per_node": opts.get("nproc-per-node"),
        "nnodes": opts.get("nnodes"),
        "standalone": bool(opts.get("standalone")),
        "rdzv_backend": opts.get("rdzv-backend"),
        "rdzv_endpoint": opts.get("rdzv-endpoint"),
        "node_rank": opts.get("node-rank"),
        "script": rest[0] if rest else None,
        "script_args": rest[1:],
    }
    light = _lightning_args(rest[1:])
    if light:
        res["lightning"] = light
    return res


def _accelerate(args: list[str]) -> dict:
    opts, rest = _take(
        args,
        ("num-processes", "num-machines", "machine-rank", "main-process-ip", "main-process-port", "gpu-ids",
         "mixed-precision", "config-file", "dynamo-backend", "rdzv-backend", "num-cpu-threads-per-process"),
        ("multi-gpu", "use-deepspeed", "use-fsdp", "cpu", "module", "m", "no-python"),
    )
    return {"launcher": "accelerate", "num_processes": opts.get("num-processes"), "nnodes": opts.get("num-machines"),
            "node_rank": opts.get("machine-rank"), "rdzv_backend": opts.get("rdzv-backend"), "config_file": opts.get("config-file"),
            "script": rest[0] if rest else None, "script_args": rest[1:]}


def _deepspeed(args: list[str]) -> dict:
    opts, rest = _take(
        args,
        ("num-gpus", "num-nodes", "hostfile", "include", "exclude", "master-port", "master-addr", "launcher",
         "launcher-args", "node-rank", "ssh-port", "venv-script"),
        ("no-python", "no-local-rank", "force-multi", "module", "elastic-training", "bind-cores-to-rank", "no-ssh", "no-ssh-check"),
    )
    return {"launcher": "deepspeed", "nproc_per_node": opts.get("num-gpus"), "nnodes": opts.get("num-nodes"),
            "deepspeed_launcher": opts.get("launcher"), "script": rest[0] if rest else None, "script_args": rest[1:]}


def _launch(tokens: list[str], lineno: int, text: str, path: str) -> dict | None:
    """A body line that starts a program under srun or a known launcher; None otherwise."""
    tokens = _strip_prefixes(tokens)
    if not tokens:
        return None
    first = os.path.basename(tokens[0])
    srun = None
    if first == "srun":
        try:
            sopts, unknown, cmd = parse_options(tokens[1:], srun=True)
        except SbatchError as e:
            raise SbatchError(f"{path}:{lineno}: srun: {e}") from None
        srun = {"options": sopts, "unknown": unknown}
        tokens = cmd
        if not tokens:
            return None
    desc = describe_command(tokens)
    if srun is None and not desc.get("launcher") and not desc.get("gpudoctor"):
        return None
    return {"line": lineno, "text": text.strip(), "srun": srun, **desc}


# ---------------------------------------------------------------- the job SLURM will create


def implied_slurm_env(directives: dict, job_name: str) -> dict[str, str]:
    """The SLURM_* values the directives give the batch shell (as far as they follow from them)."""
    env = {"SLURM_JOB_NAME": job_name}
    nodes = directives.get("nodes")
    if nodes and re.fullmatch(r"\d+", str(nodes)):
        env["SLURM_NNODES"] = env["SLURM_JOB_NUM_NODES"] = str(nodes)
    for opt, var in (("ntasks", "SLURM_NTASKS"), ("ntasks-per-node", "SLURM_NTASKS_PER_NODE"), ("cpus-per-task", "SLURM_CPUS_PER_TASK"),
                     ("gpus-per-node", "SLURM_GPUS_PER_NODE"), ("gpus-per-task", "SLURM_GPUS_PER_TASK"), ("gpus", "SLURM_GPUS")):
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
    for opt, parse in (("gres", slurmfmt.parse_gres), ("gpus", slurmfmt.parse_gpus), ("gpus-per-node", slurmfmt.parse_gpus),
                       ("gpus-per-task", slurmfmt.parse_gpus)):
        if opt in directives:
            try:
                parse(str(directives[opt]))
            except slurmfmt.SlurmFormatError as e:
                raise SbatchError(f"{path}:{lines.get(opt, '?')}: #SBATCH --{opt}={directives[opt]}: {e}") from None


def parse_sbatch(text: str, path: str = "<script>") -> dict:
    """The parsed script (see the module docstring); raises SbatchError."""
    components: list[tuple[dict, dict]] = [({}, {})]  # a heterogeneous job: one (directives, lines) per component
    directives, lines = components[0]
    unknown: list[dict] = []
    late: list[dict] = []
    commented: list[dict] = []
    body: list[tuple[int, str]] = []
    in_header = True
    for lineno, raw in _logical_lines(text):
        stripped = raw.strip()
        if raw.startswith("#SBATCH"):
            entry = {"line": lineno, "text": stripped}
            if not in_header:
                late.append(entry)
                continue
            rest = raw[len("#SBATCH"):]
            if rest and not rest[0].isspace():
                unknown.append(entry)  # '#SBATCHx' is a comment to sbatch
                continue
            if rest.split()[:1] in (["hetjob"], ["packjob"]):  # the next component of a heterogeneous job
                components.append(({}, {}))
                directives, lines = components[-1]
                continue
            try:
                opts, bad, extra = parse_options(_split(rest, lineno, path), stop_at_command=False)
            except SbatchError as e:
                raise SbatchError(f"{path}:{lineno}: #SBATCH: {e}") from None
            for k, v in opts.items():
                directives[k] = v
                lines[k] = lineno
            if bad:
                unknown.append({**entry, "options": bad})
            continue
        if re.match(r"\s*#+\s*SBATCH\s", raw) and in_header:
            commented.append({"line": lineno, "text": stripped})  # '##SBATCH' / '# SBATCH' / '  #SBATCH': a comment to sbatch
        if not stripped or stripped.startswith("#"):
            continue
        in_header = False
        body.append((lineno, raw))
    for d, ln in components:
        _validate(d, ln, path)
    directives, lines = components[0]
    job_name = str(directives.get("job-name") or os.path.basename(path))
    known = implied_slurm_env(directives, job_name)
    # The batch shell is task 0 on node 0: `export RANK=$SLURM_PROCID` there gives every srun task RANK=0.
    batch_shell = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
    known.update(batch_shell)
    exports: dict = {}
    launches: list[dict] = []
    branches = _Branches()
    for lineno, raw in body:
        for tokens in _commands(expand_vars(raw, known)):
            tokens = branches.feed(tokens)
            if not tokens or not branches.may_run:
                continue
            segment = " ".join(tokens)
            if tokens[0] == "export":
                for tok in tokens[1:]:
                    m = _ASSIGN.match(tok)
                    if m:
                        known[m.group(1)] = m.group(2)
                        exports[m.group(1)] = {"value": m.group(2), "line": lineno, "text": raw.strip()}
                continue
            if tokens[0] == "unset":
                for tok in tokens[1:]:
                    exports[tok] = {"value": None, "line": lineno, "unset": True}
                    known.pop(tok, None)
                continue
            if len(tokens) >= 1 and all(_ASSIGN.match(t) for t in tokens):
                for tok in tokens:
                    m = _ASSIGN.match(tok)
                    known[m.group(1)] = m.group(2)
                continue
            launch = _launch(tokens, lineno, segment, path)
            if launch:
                launches.append(launch)
    training = [i for i, launch in enumerate(launches) if _trains(launch)]
    main = next((i for i in reversed(training) if not _side_step(launches[i], launches[: i])), training[-1] if training else None)
    group = _het_group(launches[main] if main is not None else None, len(components))
    directives, lines = components[group]
    if group:
        directives = {"job-name": components[0][0].get("job-name"), **directives} if components[0][0].get("job-name") else directives
    return {
        "path": path,
        "job_name": job_name,
        "directives": directives,
        "directive_lines": lines,
        "het_components": len(components),
        "het_group": group,
        "unknown_directives": unknown,
        "late_directives": late,
        "commented_directives": commented,
        "exports": exports,
        "variables": {k: v for k, v in known.items() if not k.startswith("SLURM_") and k not in batch_shell},
        "launches": launches,
        "launch": launches[main] if main is not None else None,
    }


_INT_TESTS = {"-eq": int.__eq__, "-ne": int.__ne__, "-gt": int.__gt__, "-ge": int.__ge__, "-lt": int.__lt__, "-le": int.__le__}


def _test(words: list[str]) -> bool | None:
    """`[ 2 -gt 1 ]`, `[[ a == b ]]`, `test ...` on values known after expansion; None when it cannot be told."""
    if words[:1] in (["["], ["[["]) and words[-1:] in (["]"], ["]]"]):
        words = words[1:-1]
    elif words[:1] == ["test"]:
        words = words[1:]
    else:
        return None
    negate = words[:1] == ["!"]
    words = words[1:] if negate else words
    if len(words) != 3 or any("$" in w or "`" in w for w in (words[0], words[2])):
        return None
    a, op, b = words
    if op in _INT_TESTS and re.fullmatch(r"-?\d+", a) and re.fullmatch(r"-?\d+", b):
        result = _INT_TESTS[op](int(a), int(b))
    elif op in ("=", "==", "!=") and not any(c in a + b for c in "*?["):
        result = (a == b) == (op != "!=")
    else:
        return None
    return result != negate


class _Branches:
    """if/elif/else/fi in the body: commands in a branch that cannot run for this job are skipped.

    A condition is judged only when it is a plain test of values known from the directives
    (`if [ "$SLURM_NNODES" -gt 1 ]` with --nodes=2); any other branch may run.
    """

    def __init__(self) -> None:
        self.frames: list[dict] = []  # per open `if`: this branch runs (True/False/None), an earlier one surely/maybe ran
        self.condition_open = False  # the last command was `if`/`elif`: the next must be `then ...`

    @property
    def may_run(self) -> bool:
        return all(f["runs"] is not False for f in self.frames)

    def _enter(self, runs: bool | None) -> None:
        f = self.frames[-1]
        runs = False if f["taken"] else (None if f["maybe"] and runs is not False else runs)
        f.update(runs=runs, taken=f["taken"] or runs is True, maybe=f["maybe"] or runs is None)

    def feed(self, tokens: list[str]) -> list[str]:
        """The command without its if/then/else/fi keyword; [] when none is left."""
        word = tokens[0]
        if self.condition_open and word != "then" and self.frames:
            self.frames[-1].update(runs=None, taken=False, maybe=True)  # `if [ a ] && [ b ]`: not judged
        self.condition_open = word in ("if", "elif")
        if word == "if":
            self.frames.append({"runs": None, "taken": False, "maybe": False})
            self._enter(_test(tokens[1:]))
            return []
        if word == "elif" and self.frames:
            self._enter(_test(tokens[1:]))
            return []
        if word == "else" and self.frames:
            self._enter(True)
            return tokens[1:]
        if word == "fi":
            if self.frames:
                self.frames.pop()
            return []
        if word in ("then", "do", "{"):
            return tokens[1:]
        return tokens


def _het_group(launch: dict | None, components: int) -> int:
    """The heterogeneous-job component the training step runs in (srun --het-group=N; 0 by default)."""
    if components <= 1 or not launch or not launch.get("srun"):
        return 0
    value = str((launch["srun"].get("options") or {}).get("het-group", "0"))
    first = re.match(r"\d+", value)
    n = int(first.group(0)) if first else 0
    return n if n < components else 0


def _trains(launch: dict) -> bool:
    """The training launch, not a preflight (gpudoctor), a probe (python -c) or `srun hostname`."""
    if launch.get("gpudoctor") or launch.get("inline"):
        return False
    if launch.get("launcher"):
        return True
    prog = launch.get("program") or ""
    return bool(prog) and prog not in _NOT_TRAINING


def _side_step(launch: dict, before: list[dict]) -> bool:
    """One plain python process (`python plot.py`, `srun -n 1 python eval.py`) after an srun training
    step: evaluation or post-processing run on purpose, not the training the job is sized for."""
    if launch.get("launcher") != "python" or not any(b.get("srun") is not None and _trains(b) for b in before):
        return False
    srun = launch.get("srun")
    return srun is None or str(srun["options"].get("ntasks")) == "1"


def load_sbatch(path: str) -> dict:
    """Read and parse a batch script; SbatchError for a missing, unreadable or malformed one."""
    try:
        # sbatch reads bytes: a stray Latin-1 byte in a comment is no reason to refuse the script.
        # newline="": keep \r\n, which sbatch refuses.
        with open(path, encoding="utf-8", errors="replace", newline="") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise SbatchError(f"--sbatch {path}: no such file") from None
    except IsADirectoryError:
        raise SbatchError(f"--sbatch {path}: is a directory, not a batch script") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SbatchError(f"--sbatch {path}: cannot read ({e})") from None
    if "\x00" in text:
        raise SbatchError(f"--sbatch {path}: a binary file, not a batch script")
    _check_sbatch_accepts(text, path)
    return parse_sbatch(text, path)


def _check_sbatch_accepts(text: str, path: str) -> None:
    """The whole-file checks sbatch makes before it reads any directive."""
    if not text.strip():
        raise SbatchError(f"--sbatch {path}: the script is {'empty' if not text else 'only whitespace'}; sbatch refuses it")
    if not text.startswith("#!"):
        raise SbatchError(f"--sbatch {path}: the first line must start with #! and an interpreter (#!/bin/bash); sbatch refuses it")
    if "\r\n" in text:
        raise SbatchError(f"--sbatch {path}: DOS line breaks (\\r\\n); sbatch refuses it: run dos2unix {path}")
