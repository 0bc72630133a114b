"""`accelerate launch`: the config file it reads and the values the launch really runs with.

What accelerate does (huggingface/accelerate 1.x, src/accelerate/commands/launch.py and
commands/config/config_args.py):

- `--config_file F` is read as JSON when F ends in `.json`, as YAML otherwise (load_config_from_file); a
  missing F stops the launch ("The passed configuration file `F` does not exist"), a config without
  `distributed_type` too ("A `distributed_type` must be specified"). F is opened relative to the launch's
  working directory: the job starts where sbatch was run (or in `#SBATCH --chdir`), then any `cd`.
- Without `--config_file`, accelerate reads `$HF_HOME/accelerate/default_config.yaml`
  (`~/.cache/huggingface/accelerate/default_config.yaml`) when that file exists on the node: unknown before
  submission.
- The command line wins: a config key is used only where its option is not given
  (_validate_launch_command: `getattr(args, name) is None`). `--rdzv_backend` defaults to "static" on the
  command line, so a config's `rdzv_backend` is never used; likewise `same_network`.
- Unset keys take ClusterConfig's defaults: num_machines 1, machine_rank 0, num_processes -1 (which stops
  the launch: "You need to manually pass in `--num_processes`"), except distributed_type NO, which means 1;
  main_process_ip None, which over several machines becomes the rendezvous host "None" (utils/launch.py
  prepare_multi_gpu_env: rdzv_endpoint = f"{main_process_ip}:{main_process_port}").
- Without a multi-process flag (--multi_gpu, --use_deepspeed, --use_fsdp, --use_megatron_lm), the
  config's distributed_type picks the launcher: MULTI_GPU (and the other MULTI_*), DEEPSPEED, FSDP,
  MEGATRON_LM start torch.distributed.run with num_processes // num_machines processes per machine
  (utils/launch.py prepare_multi_gpu_env), NO starts one process (simple_launcher).
- DEEPSPEED over several machines with a multinode launcher other than "standard" (pdsh by default) starts
  the ranks from one node over a hostfile, not per SLURM task: the processes per task are then not counted.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from types import MappingProxyType

from gpudoctor.readers.ints import whole_number
from gpudoctor.readers.sbatch.script import UNKNOWN_DIRECTORY, BatchScript, Launch, LauncherConfig

MAX_CONFIG_BYTES = 1024 * 1024  # `accelerate config` writes a few hundred bytes
DEFAULT_CONFIG = "~/.cache/huggingface/accelerate/default_config.yaml"
WHAT = "accelerate --config_file"
# The keys of a config that shape the launch (ClusterConfig fields); their line is kept for findings.
LAUNCH_KEYS = (
    "compute_environment",
    "distributed_type",
    "num_processes",
    "num_machines",
    "machine_rank",
    "main_process_ip",
    "main_process_port",
    "gpu_ids",
    "rdzv_backend",
    "same_network",
)
_MULTI_PROCESS_TYPES = {
    "MULTI_GPU": "multi_gpu",
    "MULTI_NPU": "multi_gpu",
    "MULTI_MLU": "multi_gpu",
    "MULTI_SDAA": "multi_gpu",
    "MULTI_MUSA": "multi_gpu",
    "MULTI_XPU": "multi_gpu",
    "MULTI_HPU": "multi_gpu",
    "MULTI_NEURON": "multi_gpu",
    "DEEPSPEED": "deepspeed",
    "FSDP": "fsdp",
    "MEGATRON_LM": "megatron_lm",
}
_FLAG_MODES = (
    ("multi-gpu", "multi_gpu"),
    ("use-deepspeed", "deepspeed"),
    ("use-fsdp", "fsdp"),
    ("use-megatron-lm", "megatron_lm"),
    ("tpu", "tpu"),
    ("cpu", "cpu"),
)


# ---------------------------------------------------------------- where the file is


def config_candidates(written: str, script_path: str | None, cwd: str | None, chdir: str | None) -> list[str] | None:
    """The paths the launch would open for `--config_file written`, most likely first; None when the path holds
    a value only the job's shell knows.

    The job starts in `#SBATCH --chdir` or else the directory sbatch is run from, which is unknown before
    submission: both the script's directory and the current directory are tried then."""
    if "$" in written or "`" in written or cwd == UNKNOWN_DIRECTORY:
        return None
    written = os.path.expanduser(written)
    if os.path.isabs(written):
        return [written]
    if cwd is not None and os.path.isabs(cwd):
        return [os.path.join(cwd, written)]
    start = [chdir] if chdir and os.path.isabs(str(chdir)) and "%" not in str(chdir) else None
    if start is None:
        if chdir:
            return None  # a relative or %-patterned --chdir: relative to the unknown submit directory
        script_dir = os.path.dirname(os.path.abspath(script_path)) if script_path else None
        start = list(dict.fromkeys(d for d in (script_dir, os.getcwd()) if d))
    rel = os.path.join(cwd, written) if cwd else written
    return [os.path.normpath(os.path.join(d, rel)) for d in start]


def read_config(written: str, candidates: list[str] | None) -> LauncherConfig:
    """The config at the first candidate that exists, read bounded; never raises."""
    from gpudoctor.fileio import FileIOError, read_input
    from gpudoctor.readers.trainconfig import ConfigError, parse_config, text_key_lines

    if candidates is None:
        argument = re.search(r"\$\{?([1-9@*])", written)
        why = (
            f"the script's argument ${argument.group(1)} (given as `sbatch SCRIPT ARGS`, unknown before submission)"
            if argument
            else "a value only the job's shell knows (a variable or a `cd` not known here)"
        )
        return LauncherConfig(written, None, "unresolved", problem=f"the path {written!r} depends on {why}")
    path = next((p for p in candidates if os.path.lexists(p)), None)
    if path is None:
        looked = " or ".join(os.path.dirname(p) or "." for p in candidates)
        return LauncherConfig(written, candidates[0], "missing", problem=f"no such file in {looked}")
    try:
        text = read_input(path, WHAT, MAX_CONFIG_BYTES)
        data = parse_config(text, path, WHAT)
    except (FileIOError, ConfigError) as e:
        return LauncherConfig(written, path, "unreadable", problem=str(e))
    lines = text_key_lines(text)
    values = {k: data[k] for k in LAUNCH_KEYS if k in data}
    multinode = (data.get("deepspeed_config") or {}) if isinstance(data.get("deepspeed_config"), dict) else {}
    if "deepspeed_multinode_launcher" in multinode:
        values["deepspeed_multinode_launcher"] = multinode["deepspeed_multinode_launcher"]
    return LauncherConfig(
        written,
        path,
        "read",
        MappingProxyType(values),
        MappingProxyType({k: lines[k] for k in LAUNCH_KEYS if k in lines}),
    )


# ---------------------------------------------------------------- what the launch runs with


@dataclass(frozen=True)
class Setting:
    value: object  # None: not known before submission
    source: str  # "launch line", "accel.yaml:4", "accelerate's default", ...


@dataclass(frozen=True)
class AcceleratePlan:
    """The values `accelerate launch` runs with, each with its source."""

    mode: Setting  # multi_gpu | deepspeed | fsdp | megatron_lm | tpu | cpu | single (one process) | None
    num_processes: Setting  # over all machines
    num_machines: Setting
    machine_rank: Setting
    main_process_ip: Setting
    main_process_port: Setting
    gpu_ids: Setting
    procs_per_machine: int | None  # processes one `accelerate launch` starts; None when not known
    config: LauncherConfig | None
    notes: tuple[str, ...] = ()
    stops: tuple[str, ...] = field(default_factory=tuple)  # accelerate refuses to launch, with its message

    @property
    def multi_process(self) -> bool:
        return self.mode.value in ("multi_gpu", "deepspeed", "fsdp", "megatron_lm")


def accelerate_plan(launch: Launch) -> AcceleratePlan:
    """What `accelerate launch` does with its line and its config file (rules: the module docstring)."""
    opts = dict(launch.launcher_options or {})
    config = launch.launcher_config
    read = config is not None and config.status == "read"
    values = dict(config.values) if read and config is not None else {}
    where = os.path.basename(config.path or config.written) if config is not None else ""
    notes: list[str] = []
    stops: list[str] = []
    if config is None and "num-processes" not in opts:
        notes.append(
            f"no --config_file: accelerate also reads {DEFAULT_CONFIG} when it exists on the node (not known "
            "before submission); judged from the launch line and accelerate's own defaults"
        )
    elif config is not None and not read:
        notes.append(f"--config_file {config.written} was not read ({config.problem}): its values are unknown")
    foreign = read and str(values.get("compute_environment", "LOCAL_MACHINE")) != "LOCAL_MACHINE"
    if foreign:  # SageMaker: accelerate hands the job to another service; nothing here is started per task
        notes.append(f"{where}: compute_environment {values['compute_environment']}: not a local launch")
        values = {}

    def setting(key: str, default, default_source: str = "accelerate's default") -> Setting:
        option = key.replace("_", "-")
        if option in opts:
            return Setting(opts[option], "launch line")
        if key in values:
            line = config.lines.get(key) if config is not None else None
            return Setting(values[key], f"{where}:{line}" if line else where)
        if config is not None and not read:
            return Setting(None, f"{config.written} (not read)")
        return Setting(default, default_source)

    flag = next((mode for name, mode in _FLAG_MODES if opts.get(name) is True), None)
    if foreign:
        mode = Setting(None, where)
    elif flag:
        mode = Setting(flag, "launch line")
    elif read and "distributed_type" in values:
        dtype = str(values["distributed_type"]).upper()
        mode = Setting(
            _MULTI_PROCESS_TYPES.get(dtype, "single" if dtype == "NO" else dtype.lower()),
            f"{where}:{config.lines.get('distributed_type')}"
            if config and config.lines.get("distributed_type")
            else where,
        )
    elif read:
        mode = Setting(None, where)
        stops.append(f"{where} has no distributed_type: accelerate stops ('A `distributed_type` must be specified')")
    else:
        mode = Setting(None, "not known")
    single = mode.value == "single"
    num_processes = setting("num_processes", 1 if single else None, "distributed_type NO" if single else "not given")
    if read and not foreign and num_processes.source == "not given" and not stops:
        stops.append(
            f"neither the launch line nor {where} gives num_processes: accelerate stops ('You need to manually "
            "pass in `--num_processes` using this config yaml')"
        )
    num_machines = setting("num_machines", 1 if (read or config is None) else None)
    machine_rank = setting("machine_rank", 0 if (read or config is None) else None)
    port = setting("main_process_port", 29500)
    main_ip = setting("main_process_ip", None)
    machines_given = whole_number(num_machines.value)
    if read and not foreign and machines_given and machines_given > 1 and main_ip.value is None and not stops:
        # prepare_multi_gpu_env: rdzv_endpoint = f"{main_process_ip}:{main_process_port}" -> "None:29500"
        stops.append(
            f"num_machines {machines_given} ({num_machines.source}) but no main_process_ip on the launch line or in "
            f"{where}: accelerate points every machine's rendezvous at the host 'None'"
        )
    per_machine = None
    total, machines = whole_number(num_processes.value), whole_number(num_machines.value)
    if mode.value in ("single", "cpu"):
        per_machine = 1
    elif mode.value in ("multi_gpu", "fsdp", "megatron_lm", "deepspeed") and total and machines:
        per_machine = total // machines if machines > 1 else total
        multinode = str(
            values.get("deepspeed_multinode_launcher") or opts.get("deepspeed-multinode-launcher") or "pdsh"
        )
        if mode.value == "deepspeed" and machines > 1 and multinode != "standard":
            per_machine = None
            notes.append(
                f"DeepSpeed over {machines} machines with the '{multinode}' multinode launcher: deepspeed starts the "
                "ranks from one node over its hostfile, not one launcher per SLURM task"
            )
    elif mode.value is None and total:
        # the line's own count: a launch line that counts its processes means to start them (accelerate turns
        # --multi_gpu on by itself for more than one process and GPU); only a config it could not read says otherwise
        per_machine = total // machines if machines and machines > 1 else total
    return AcceleratePlan(
        mode,
        num_processes,
        num_machines,
        machine_rank,
        main_ip,
        port,
        setting("gpu_ids", "all"),
        per_machine,
        config,
        tuple(notes),
        tuple(stops),
    )


def with_config_files(script: BatchScript) -> BatchScript:
    """The script with each `accelerate launch --config_file F` line's F read (I/O: load_sbatch and fix's
    re-read of an edited script both call this, so check and fix judge the same launch)."""
    from dataclasses import replace

    chdir = script.options.get("chdir")
    read: dict[tuple[str, str | None], LauncherConfig] = {}
    launches = []
    for launch in script.launches:
        if launch.launcher == "accelerate" and launch.config_file and launch.launcher_config is None:
            key = (launch.config_file, launch.cwd)
            if key not in read:
                candidates = config_candidates(
                    launch.config_file, script.path, launch.cwd, chdir if isinstance(chdir, str) else None
                )
                read[key] = read_config(launch.config_file, candidates)
            launch = replace(launch, launcher_config=read[key])
        launches.append(launch)
    if not read:
        return script
    main = script.launches.index(script.launch) if script.launch is not None else None
    return replace(script, launches=tuple(launches), launch=launches[main] if main is not None else None)
