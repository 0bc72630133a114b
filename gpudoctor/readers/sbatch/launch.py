"""What a launch line starts: srun's options, the launcher (torchrun, deepspeed, accelerate, python,
Lightning/Fabric) and its process counts, read through the wrappers real scripts put around it
(env/exec/time/nohup/numactl..., `bash -c "..."`, shifter, apptainer, uv/conda run).

Wrappers are peeled in a loop and shell command strings are followed at most MAX_SHELL_DEPTH
deep, so a line of 1500 nested wrappers is read without recursion (issue 13 B7).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from gpudoctor.model import SCRIPT_LAUNCHERS
from gpudoctor.readers.sbatch.options import parse_options
from gpudoctor.readers.sbatch.shell import split_commands

LAUNCHERS = SCRIPT_LAUNCHERS  # model.LAUNCHER_TABLE, the one launcher table
MAX_SHELL_DEPTH = 8
_PY = re.compile(r"^python(\d+(\.\d+)?)?$")
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
# Commands in front of the real one: `exec`, `time`, `nohup`, `env A=1`, `stdbuf -oL` ...
_PREFIX_COMMANDS = {
    "exec",
    "time",
    "nohup",
    "command",
    "builtin",
    "nice",
    "stdbuf",
    "env",
    "unbuffer",
}
NOT_TRAINING = {
    "hostname",
    "nvidia-smi",
    "echo",
    "printf",
    "mkdir",
    "cd",
    "ls",
    "cat",
    "sleep",
    "date",
    "true",
    "env",
    "module",
    "source",
    "conda",
    "pip",
    "export",
    "rm",
    "cp",
    "mv",
    "tee",
    "scontrol",
    "squeue",
    "sacct",
}


_WRAPPER_VALUE_OPTIONS = {"-n", "-C", "--cpunodebind", "--membind", "-c"}
_ENV_VALUE_OPTIONS = {"-u", "--unset", "--chdir"}


def _strip_prefixes(tokens: list[str]) -> list[str]:
    """Drop VAR=value assignments and wrapper commands in front of the real command."""
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if _ASSIGN.match(tok):
            i += 1
        elif os.path.basename(tok) in _PREFIX_COMMANDS:
            # wrapper options (stdbuf -oL, nice -n 5, env -u CUDA_VISIBLE_DEVICES: coreutils env(1) -u NAME)
            with_value = _WRAPPER_VALUE_OPTIONS | (_ENV_VALUE_OPTIONS if os.path.basename(tok) == "env" else set())
            i += 1
            while i < len(tokens) and tokens[i].startswith("-"):
                i += 2 if tokens[i] in with_value else 1
        else:
            break
    return tokens[i:]


def command_environment(tokens: list[str]) -> tuple[list[tuple[int, str, str | None]], bool]:
    """The environment a command line gives the program it runs, beyond what it inherits: `NAME=value` words in
    front of a command (bash(1) SIMPLE COMMAND EXPANSION: "the variables are added to the environment of the
    executed command and do not affect the current shell environment"), and env(1)'s `NAME=value`, `-u NAME`,
    `-i` (coreutils env: "-i, --ignore-environment: start with an empty environment"), in front of the command
    and after srun's options. Returns ([(word index, name, value or None for unset)], cleared by env -i)."""
    found: list[tuple[int, str, str | None]] = []
    cleared = False
    i, n = 0, len(tokens)
    while i < n:
        tok = tokens[i]
        if m := _ASSIGN.match(tok):
            found.append((i, m.group(1), m.group(2)))
            i += 1
            continue
        prog = os.path.basename(tok)
        if prog == "srun":
            _, _, rest = parse_options(tokens[i + 1 :], srun=True)
            i = n - len(rest)
            continue
        if prog not in _PREFIX_COMMANDS:
            break
        i += 1
        is_env = prog == "env"
        with_value = _WRAPPER_VALUE_OPTIONS | (_ENV_VALUE_OPTIONS if is_env else set())
        while i < n and tokens[i].startswith("-"):
            opt = tokens[i]
            if is_env and opt in ("-i", "--ignore-environment", "-"):
                cleared = True
                found.clear()  # what was given before the clearing is gone too
            elif is_env and opt in ("-u", "--unset") and i + 1 < n:
                found.append((i + 1, tokens[i + 1], None))
            elif is_env and opt.startswith("--unset="):
                found.append((i, opt.split("=", 1)[1], None))
            elif is_env and opt.startswith("-u") and len(opt) > 2:
                found.append((i, opt[2:], None))
            i += 2 if opt in with_value else 1
    return found, cleared


def _take(args: list[str], names: tuple[str, ...], flags: tuple[str, ...] = ()) -> tuple[dict, list[str]]:
    """Launcher options (`--x v`, `--x=v`, flags) up to the first positional -> (options, rest)."""
    opts: dict[str, str | bool] = {}
    i = 0
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


_TORCHRUN_VALUES = (
    "nproc-per-node",
    "nnodes",
    "node-rank",
    "rdzv-backend",
    "rdzv-endpoint",
    "rdzv-id",
    "rdzv-conf",
    "master-addr",
    "master-port",
    "max-restarts",
    "monitor-interval",
    "start-method",
    "role",
    "log-dir",
    "redirects",
    "r",
    "tee",
    "t",
    "local-addr",
    "local-ranks-filter",
    "logs-specs",
)
_TORCHRUN_FLAGS = ("standalone", "use-env", "module", "m", "no-python", "run-path")


def _lightning_args(args: list[str]) -> dict[str, str | bool]:
    """devices/num_nodes passed to a Lightning script: Hydra `trainer.devices=8`, LightningCLI `--trainer.devices 8`."""
    found: dict[str, str | bool] = {}
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
_LIGHTNING_CLI_SUBCOMMANDS = frozenset({"fit", "validate", "test", "predict"})


def lightning_cli_args(args) -> bool:
    """`fit --config cfg.yaml`: LightningCLI's subcommands (fit, validate, test, predict) with its --config (Lightning
    docs, "Configure hyperparameters from the CLI"): the program runs Lightning's Trainer."""
    subcommand = any(a in _LIGHTNING_CLI_SUBCOMMANDS for a in args if not a.startswith("-"))
    return subcommand and any(a.split("=")[0] in ("--config", "-c") for a in args)


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


def _inner_launch(text: str, depth: int) -> list[str] | None:
    """The command inside a `bash -c` string that starts the training (the last launcher, else the last program)."""
    cmds = [c for c in split_commands(text) if _strip_prefixes(c)]
    described = [(c, describe_command(c, depth)) for c in cmds]
    for c, d in reversed(described):
        if d.get("launcher"):
            return c
    for c, d in reversed(described):
        if d.get("program") and d["program"] not in NOT_TRAINING and not d["program"].startswith("$"):
            return c
    return None


def describe_command(tokens: list[str], depth: int = 0) -> dict:
    """What a command (after srun, if any) launches: launcher and its process counts."""
    wrappers: list[str] = []
    while True:
        stripped = _strip_prefixes(tokens)
        wrappers.extend(os.path.basename(t) for t in tokens[: len(tokens) - len(stripped)] if not _ASSIGN.match(t))
        tokens = stripped
        if not tokens:
            return {"program": None}
        prog = os.path.basename(tokens[0])
        args = tokens[1:]
        rest = _unwrap(prog, args)
        if rest is None:
            break
        if not rest:
            return {"program": prog, "launcher": None}
        wrappers.append(prog)
        tokens = rest
    out: dict = {"program": prog, "launcher": None, "argv": tuple(tokens), "wrappers": tuple(wrappers)}
    if prog in _SHELLS:
        inner = _shell_command_string(args)
        picked = _inner_launch(inner, depth + 1) if inner and depth < MAX_SHELL_DEPTH else None
        if picked:  # srun bash -c "RANK=\$SLURM_PROCID python train.py": judge what the shell runs
            inner_desc = describe_command(picked, depth + 1)
            return {
                **inner_desc,
                "via_shell": f"{prog} -c",
                "task_command": inner_desc.get("task_command") or inner,
                "wrappers": (*out["wrappers"], f"{prog} -c", *inner_desc.get("wrappers", ())),
            }
        return out
    if prog == "torchrun":
        return {**out, "launcher": "torchrun", **_torchrun(args)}
    if _PY.match(prog):
        py = _describe_python(args)
        module = py.get("module")
        if module in ("torch.distributed.run", "torch.distributed.launch"):
            launcher = "torchrun" if module.endswith("run") else "torch.distributed.launch"
            return {**out, "launcher": launcher, "module": module, **_torchrun(py.get("args", []))}
        if module in ("accelerate.commands.launch",):
            return {**out, **_read_launcher(_ACCELERATE, py.get("args", []))}
        if module == "deepspeed" or (module or "").startswith("deepspeed.launcher"):
            return {**out, **_read_launcher(_DEEPSPEED, py.get("args", []))}
        if module == "gpudoctor" or (py.get("script") or "").endswith("gpudoctor"):
            return {**out, "launcher": None, "gpudoctor": True}
        res = {
            **out,
            "launcher": "python",
            **{k: v for k, v in py.items() if k != "args"},
            "script_args": py.get("args", []),
        }
        light = _lightning_args(py.get("args", []))
        if light:
            res["lightning"] = light
        return res
    if prog == "accelerate" and args[:1] == ["launch"]:
        return {**out, **_read_launcher(_ACCELERATE, args[1:])}
    if prog == "deepspeed":
        return {**out, **_read_launcher(_DEEPSPEED, args)}
    fabric_args = (
        args[2:]
        if prog == "lightning" and args[:2] == ["run", "model"]
        else args[1:]
        if prog == "fabric" and args[:1] == ["run"]
        else None
    )
    if fabric_args is not None:  # `lightning run model` / `fabric run`: Fabric's own launcher
        opts, rest = _take(
            fabric_args,
            ("devices", "num-nodes", "accelerator", "strategy", "precision", "node-rank", "main-address", "main-port"),
        )
        return {
            **out,
            "launcher": "lightning",
            "nproc_per_node": opts.get("devices"),
            "nnodes": opts.get("num-nodes"),
            "script": rest[0] if rest else None,
        }
    if prog == "gpudoctor":
        return {**out, "gpudoctor": True}
    if prog.endswith(".py") and "$" not in tokens[0]:  # `srun ./train.py`: an executable Python file (its #! line)
        py = {"launcher": "python", "script": tokens[0], "script_args": args}
        light = _lightning_args(args)
        return {**out, **py, **({"lightning": light} if light else {})}
    light = _lightning_args(args)
    if lightning_cli_args(args):
        # `mytool fit --config cfg.yaml`: LightningCLI's subcommands and --config (Lightning docs, "Configure
        # hyperparameters from the CLI"): a console script running Lightning's Trainer
        return {
            **out,
            "launcher": "lightning",
            "lightning": light or {"mentioned": True},
            "console_script": True,
            "script_args": args,
        }
    if light.get("devices") is not None or light.get("num_nodes") is not None:
        # a console script given Lightning's Trainer settings as overrides (Hydra `trainer.devices=8`, LightningCLI
        # `--trainer.devices 8`): whatever its name, it runs Lightning's Trainer
        return {**out, "launcher": "lightning", "lightning": light, "console_script": True, "script_args": args}
    return out


@dataclass(frozen=True)
class Wrapper:
    """How a command that runs another command reads its line (its documented synopsis): the subcommand it needs
    (`run`, `exec`), its options that take a separate value, and how many operands (an image, a duration, a CPU
    mask) come before the command it runs. An option written `--x=v` is one word; any other option is a flag."""

    subcommands: tuple[str, ...] = ()  # one of these first ("exec", "run"); () when none
    values: frozenset[str] = frozenset()  # options whose value is the next word
    operands: int = 0  # words before the command (singularity's image, timeout's duration, taskset's mask)
    all_options_take_values: bool = False  # nsys profile: every option is `-o FILE` / `--trace X`
    source: str = ""


def _opts(text: str) -> frozenset[str]:
    return frozenset(text.split())


# The wrappers real batch scripts put around the launcher, by their own synopsis (the man page or --help named).
WRAPPERS: dict[str, Wrapper] = {
    "shifter": Wrapper(values=_opts("--image --volume -V --env -e --module -m --workdir"), source="shifter(1)"),
    "uv": Wrapper(
        ("run",),
        _opts("--with --with-requirements --python -p --project --directory --package --extra --group --env-file"),
        source="uv run --help",
    ),
    "poetry": Wrapper(("run",), source="poetry run"),
    "pipenv": Wrapper(("run",), source="pipenv run"),
    "pixi": Wrapper(("run",), _opts("--environment -e --manifest-path"), source="pixi run"),
    "conda": Wrapper(("run",), _opts("-n --name -p --prefix --cwd"), source="conda run --help"),
    "mamba": Wrapper(("run",), _opts("-n --name -p --prefix --cwd"), source="mamba run"),
    "micromamba": Wrapper(("run",), _opts("-n --name -p --prefix --cwd"), source="micromamba run"),
    "singularity": Wrapper(
        ("exec", "run"),
        _opts("-B --bind --env -H --home --pwd -W --workdir --env-file -o --overlay --mount --security --network"),
        1,
        source="singularity exec [options] <container> <command>",
    ),
    "apptainer": Wrapper(
        ("exec", "run"),
        _opts("-B --bind --env -H --home --pwd -W --workdir --env-file -o --overlay --mount --security --network"),
        1,
        source="apptainer exec [options] <container> <command>",
    ),
    "docker": Wrapper(
        ("run",),
        _opts(
            "-v --volume -e --env --env-file --name -w --workdir --gpus --network --net --ipc -u --user --entrypoint "
            "--mount --device --runtime --cpus -m --memory --shm-size --ulimit --cap-add --hostname -h -p --publish "
            "--label -l --security-opt --pid --platform --cpuset-cpus --add-host"
        ),
        1,
        source="docker run [OPTIONS] IMAGE [COMMAND] [ARG...]",
    ),
    "podman": Wrapper(
        ("run",),
        _opts(
            "-v --volume -e --env --env-file --name -w --workdir --gpus --network --net --ipc -u --user --entrypoint "
            "--mount --device --runtime --cpus -m --memory --shm-size --ulimit --cap-add --hostname -h -p --publish "
            "--label -l --security-opt --pid --platform --cpuset-cpus --add-host"
        ),
        1,
        source="podman run [options] image [command [arg ...]]",
    ),
    "enroot": Wrapper(
        ("start",), _opts("-c --conf -e --env -m --mount"), 1, source="enroot start [options] NAME [COMMAND]"
    ),
    "nsys": Wrapper(("profile",), all_options_take_values=True, source="nsys profile [options] <application>"),
    "timeout": Wrapper(values=_opts("-s --signal -k --kill-after"), operands=1, source="timeout(1)"),
    "taskset": Wrapper(values=_opts("-a"), operands=1, source="taskset(1): taskset [options] mask command"),
    "numactl": Wrapper(
        values=_opts("-C --physcpubind -N --cpunodebind -m --membind -i --interleave -p --preferred"),
        source="numactl(8)",
    ),
}


def unwrap(prog: str, args: list[str]) -> list[str] | None:
    """The command a wrapper runs (WRAPPERS; [] when none is named); None when prog is no wrapper."""
    wrapper = WRAPPERS.get(prog)
    if wrapper is None or (wrapper.subcommands and args[:1] not in [[c] for c in wrapper.subcommands]):
        return None
    rest = args[1:] if wrapper.subcommands else list(args)
    i = 0
    while i < len(rest) and rest[i].startswith("-") and rest[i] != "-":
        word = rest[i]
        if word == "--":
            i += 1
            break
        takes = "=" not in word and (wrapper.all_options_take_values or word in wrapper.values)
        i += 2 if takes else 1
    return rest[i + wrapper.operands :]


_unwrap = unwrap


@dataclass(frozen=True)
class _LauncherLine:
    """How a launcher's command line reads: its options that take a value, its flags, and which of them the
    launch description keeps, under which key."""

    launcher: str | None  # None: the caller names it (torchrun or torch.distributed.launch)
    values: tuple[str, ...]
    flags: tuple[str, ...]
    keys: tuple[tuple[str, str], ...]  # (description key, option)


_TORCHRUN = _LauncherLine(
    None,
    _TORCHRUN_VALUES,
    _TORCHRUN_FLAGS,
    (
        ("nproc_per_node", "nproc-per-node"),
        ("nnodes", "nnodes"),
        ("rdzv_backend", "rdzv-backend"),
        ("rdzv_endpoint", "rdzv-endpoint"),
        ("node_rank", "node-rank"),
        ("master_port", "master-port"),
        ("rdzv_id", "rdzv-id"),
    ),
)
_ACCELERATE = _LauncherLine(
    "accelerate",
    (
        "num-processes",
        "num-machines",
        "machine-rank",
        "main-process-ip",
        "main-process-port",
        "gpu-ids",
        "mixed-precision",
        "config-file",
        "dynamo-backend",
        "rdzv-backend",
        "rdzv-conf",
        "num-cpu-threads-per-process",
        "deepspeed-multinode-launcher",
        "deepspeed-hostfile",
    ),
    (
        "multi-gpu",
        "use-deepspeed",
        "use-fsdp",
        "use-megatron-lm",
        "tpu",
        "cpu",
        "same-network",
        "module",
        "m",
        "no-python",
    ),
    (
        ("num_processes", "num-processes"),
        ("nnodes", "num-machines"),
        ("node_rank", "machine-rank"),
        ("rdzv_backend", "rdzv-backend"),
        ("config_file", "config-file"),
        ("master_port", "main-process-port"),
    ),
)
_DEEPSPEED = _LauncherLine(
    "deepspeed",
    (
        "num-gpus",
        "num-nodes",
        "hostfile",
        "include",
        "exclude",
        "master-port",
        "master-addr",
        "launcher",
        "launcher-args",
        "node-rank",
        "ssh-port",
        "venv-script",
    ),
    (
        "no-python",
        "no-local-rank",
        "force-multi",
        "module",
        "elastic-training",
        "bind-cores-to-rank",
        "no-ssh",
        "no-ssh-check",
    ),
    (
        ("nproc_per_node", "num-gpus"),
        ("nnodes", "num-nodes"),
        ("deepspeed_launcher", "launcher"),
        ("hostfile", "hostfile"),
        ("master_port", "master-port"),
    ),
)


def _read_launcher(line: _LauncherLine, args: list[str]) -> dict:
    """The launcher's options, the values the description keeps, and the script it runs with its arguments."""
    opts, rest = _take(args, line.values, line.flags)
    return {
        **({"launcher": line.launcher} if line.launcher else {}),
        "launcher_options": opts,
        **{key: opts.get(option) for key, option in line.keys},
        "script": rest[0] if rest else None,
        "script_args": rest[1:],
    }


def _torchrun(args: list[str]) -> dict:
    res = _read_launcher(_TORCHRUN, args)
    res["standalone"] = bool(res["launcher_options"].get("standalone"))
    light = _lightning_args(res["script_args"])
    if light:
        res["lightning"] = light
    return res


_ALL_ARGUMENTS = frozenset({"$@", "${@}", "$*", "${*}"})


def describe_launch(tokens: list[str]) -> dict | None:
    """A body command that starts a program under srun or a known launcher; None otherwise.

    Raises SbatchError (without the file position) for an srun option that lacks its value.
    """
    tokens = _strip_prefixes(tokens)
    if not tokens:
        return None
    srun = None
    if os.path.basename(tokens[0]) == "srun":
        sopts, unknown, cmd = parse_options(tokens[1:], srun=True)
        # `srun "$@" cmd ...` with the script's arguments unknown: they are srun's options (`sh job.sh --jobid N`),
        # not its command
        while cmd[:1] and cmd[0] in _ALL_ARGUMENTS and len(cmd) > 1:
            unknown = [*unknown, cmd[0]]
            cmd = cmd[1:]
        srun = {"options": sopts, "unknown": unknown}
        tokens = cmd
        if not tokens:
            return None
    desc = describe_command(tokens)
    if srun is None and not desc.get("launcher") and not desc.get("gpudoctor"):
        return None
    return {"srun": srun, **desc}


def trains(launch: dict) -> bool:
    """The training launch, not a preflight (gpudoctor), a probe (python -c) or `srun hostname`."""
    if launch.get("gpudoctor") or launch.get("inline"):
        return False
    if launch.get("launcher"):
        return True
    prog = launch.get("program") or ""
    return bool(prog) and prog not in NOT_TRAINING


def side_step(launch: dict, before: list[dict]) -> bool:
    """One plain python process (`python plot.py`, `srun -n 1 python eval.py`) after an srun training
    step: evaluation or post-processing run on purpose, not the training the job is sized for."""
    if launch.get("launcher") != "python" or not any(b.get("srun") is not None and trains(b) for b in before):
        return False
    srun = launch.get("srun")
    return srun is None or str(srun["options"].get("ntasks")) == "1"
