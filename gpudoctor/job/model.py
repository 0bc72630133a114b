"""The job as it will run (issue 37): one model of a batch script's processes, built once per run and judged by
invariants instead of text patterns.

    model = build(script, env)             # script: readers.sbatch.BatchScript; env: the submit environment
    model = job_model(facts, ctx)          # ctx.job when the runner built it for ctx.sbatch, else built now
    model.allocation                       # Allocation: nodes, tasks per node, GPUs and CPUs per task
    model.tasks                            # Task per SLURM task (or the batch shell alone), node by node
    for p in model.processes():            # Process: node, hostname, procid, local rank, rank, world size,
        p.rank, p.world, p.visible_gpus    #          argv, env (with sources), visible GPUs, rendezvous
    model.unknown                          # what could not be read, said, never guessed

How each layer is read, and whose rule it follows:
- the allocation: job/shape.py's JobShape (#SBATCH as sbatch reads them, srun's options for the step);
- the batch shell runs once on node 0 as task 0 (SLURM_PROCID=SLURM_NODEID=SLURM_LOCALID=0, sbatch(1)): what it
  expands (`srun python train.py --rank=$SLURM_PROCID`) is the same text in every task. Only a single-quoted
  `bash -c '...'` that srun runs is expanded again per task, with that task's variables (srun(1) OUTPUT
  ENVIRONMENT VARIABLES; readers/sbatch/body.py keeps those references unexpanded);
- wrappers (srun, env, singularity/apptainer, docker/podman, enroot, conda/uv run, numactl, taskset, nsys,
  timeout, exec, `set -- ...; exec "$@"`) are peeled by readers/sbatch/launch.WRAPPERS, by their synopsis;
- each launcher's processes, as its own code starts them (LAUNCHER_RULES below): torchrun (torch/distributed/run.py:
  --nnodes MIN:MAX default 1:1, --nproc-per-node default 1, --node-rank default 0, --rdzv-backend default static at
  --master-addr (default 127.0.0.1):--master-port (default 29500), --standalone = c10d at localhost with a fresh run
  id; workers get RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT: a static rendezvous's,
  else the rank-0 agent's host and a free port it picks), torch.distributed.launch (the same, --local-rank on argv),
  deepspeed (one process per visible GPU by default, on its own node without a hostfile), accelerate
  (readers/accelerate.accelerate_plan), Lightning (one rank per SLURM task:
  lightning.fabric.plugins.environments.slurm), torch.multiprocessing.spawn in the program (readers/program.py), a
  plain program (one process per task);
- CUDA_VISIBLE_DEVICES as CUDA parses it (readers/cudavis.py): `export CUDA_VISIBLE_DEVICES=0, 1` is split by
  bash into `0,` (one GPU) and a failing `export 1`; srun replaces it in each task of a step that has GPUs
  (SLURM's gres/gpu plugin sets it per step), the batch shell keeps it;
- the rank a process uses is read as the program reads it: of RANK and SLURM_PROCID, the one its source reads
  first (ProgramModel.prefers); a `--rank`/`--node_rank` on its argv; torchrun's RANK otherwise;
- a rendezvous host resolves on the process's own node: `localhost` and 127.0.0.1 on node 3 are node 3, and
  `$(hostname)` is the node of the shell that expanded it (node 0 for the batch shell).

Pure: reads the BatchScript, the program model and the environment given; no I/O.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from gpudoctor.job.env import DIRECTIVES, JobEnv
from gpudoctor.job.shape_record import JobShape

MAX_PROCESSES = 100_000  # a job larger than this is a typo: the model says so rather than listing it

# The variables srun sets per task (srun(1) OUTPUT ENVIRONMENT VARIABLES), which a task's shell expands itself.
TASK_VARIABLES = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID")
_TASK_SHELL = "the task's shell (bash -c)"
BATCH_HOST = (
    "node-0-hostname-from-the-batch-shell"  # $(hostname) as the batch shell evaluated it, handed to a task's shell
)


@dataclass(frozen=True)
class Unknown:
    """A value the script does not decide before the job runs, and why."""

    why: str

    def __str__(self) -> str:
        return "?"


def known(value: object) -> bool:
    return not isinstance(value, Unknown)


@dataclass(frozen=True)
class Allocation:
    """What SLURM gives the training step: nodes, tasks on each, GPUs per node and per task, CPUs per task."""

    nodes: int | Unknown
    tasks_per_node: tuple[int, ...] | Unknown  # SLURM's placement, node by node
    gpus_per_node: int | Unknown
    gpus_per_task: int | None  # --gpus-per-task / --ntasks-per-gpu: each task bound to its own GPUs
    cpus_per_task: int | None
    srun: bool  # the training is started by srun (else the batch shell runs it once, on node 0)
    hostnames: tuple[str, ...] | None = None  # --nodelist, when it names every node
    notes: tuple[str, ...] = ()

    @property
    def ntasks(self) -> int | Unknown:
        per_node = self.tasks_per_node
        return per_node if isinstance(per_node, Unknown) else sum(per_node)


@dataclass(frozen=True)
class Endpoint:
    """Where a process looks for its rendezvous, and which node that is from its own node."""

    how: str  # "torchrun --rdzv-endpoint", "torchrun --master-addr", "torchrun's default", "MASTER_ADDR", ...
    host: str | Unknown  # as the process reads it
    port: int | Unknown | None
    reaches: int | str | Unknown  # a node index, a host outside the job's known node names, or unknown
    loopback: bool = False
    run_id: str | None = None  # torchrun --rdzv-id (c10d): agents meet only under the same id

    def describe(self) -> str:
        port = "" if self.port is None else f":{self.port}"
        return f"{self.host}{port} ({self.how})"


@dataclass(frozen=True)
class Launcher:
    """What one task's command starts: the launcher and its own view of the world."""

    kind: str  # torchrun | torch.distributed.launch | deepspeed | accelerate | lightning | python | unknown
    nproc: int | Unknown  # processes it starts on its node
    nnodes: tuple[int, int] | Unknown | None = None  # torchrun MIN:MAX (None: not a multi-node launcher)
    node_rank: int | Unknown | None = None
    standalone: bool = False
    backend: str | None = None  # static | c10d | etcd | ...
    rendezvous: Endpoint | None = None
    expects_world: int | Unknown | None = None  # the world size it will give its workers, when it says
    program: Any = None  # readers.program.ProgramModel of what it runs
    why_unknown: str | None = None  # kind == "unknown": what was not understood


@dataclass(frozen=True)
class Task:
    """One SLURM task (or the batch shell, when no srun starts the training) and the command it runs."""

    node: int
    procid: int
    localid: int
    argv: tuple[str, ...]  # after every expansion that happens before it runs, and after the wrappers
    wrappers: tuple[str, ...]
    launcher: Launcher
    visible_gpus: tuple[str, ...] | Unknown  # CUDA_VISIBLE_DEVICES as CUDA reads it, per node's GPU numbering
    env: Mapping[str, str]
    env_sources: Mapping[str, str]
    per_task: bool = False  # the command was expanded by the task's own shell (single-quoted bash -c)


@dataclass(frozen=True)
class Process:
    """One process of the job: where it runs, what it is given and which rank of which world it takes."""

    node: int
    hostname: str | None
    procid: int  # SLURM_PROCID in its environment (the task that started it)
    local_rank: int | Unknown
    rank: int | Unknown  # as the program reads it
    world_size: int | Unknown  # as the program reads it
    rank_source: str  # "RANK (torchrun)", "SLURM_PROCID", "--rank on argv", ...
    argv: tuple[str, ...]
    env: Mapping[str, str]
    env_sources: Mapping[str, str]
    visible_gpus: tuple[str, ...] | Unknown
    rendezvous: Endpoint | None
    world: str | Unknown  # processes with one world key meet in one world
    launcher: str
    spawned: bool = False  # started by the program itself (torch.multiprocessing.spawn)

    @property
    def gpu(self) -> str | Unknown | None:
        """The GPU it uses by the one-GPU-per-rank convention (cuda:LOCAL_RANK of what it sees); None: none there."""
        if not known(self.visible_gpus) or not known(self.local_rank):
            return Unknown("its GPUs or local rank are unknown")
        gpus: tuple[str, ...] = self.visible_gpus  # type: ignore[assignment]
        local: int = self.local_rank  # type: ignore[assignment]
        return gpus[local] if 0 <= local < len(gpus) else None


@dataclass(frozen=True)
class JobModel:
    script: Any  # the readers.sbatch.BatchScript it was built from (identity: ctx.job belongs to ctx.sbatch)
    shape: JobShape
    allocation: Allocation
    tasks: tuple[Task, ...]
    unknown: tuple[str, ...] = ()  # what the model could not read, in words
    notes: tuple[str, ...] = ()
    launch: Any = None  # readers.sbatch.Launch of the training
    program: Any = None  # readers.program.ProgramModel of the launched program
    _processes: tuple[Process, ...] = field(default=(), repr=False)

    def processes(self) -> Iterator[Process]:
        """Every process, node by node, task by task (spawned children after their parent)."""
        return iter(self._processes)

    @property
    def understood(self) -> bool:
        """The training launch is read to a launcher or program (every task's, where the tasks are listed)."""
        if self.tasks:
            return all(t.launcher.kind != "unknown" for t in self.tasks)
        return self.launch is not None and bool(self.launch.launcher)

    def worlds(self) -> dict[str, list[Process]]:
        """Processes by the world they join (known world keys only)."""
        out: dict[str, list[Process]] = {}
        for p in self._processes:
            if known(p.world):
                out.setdefault(str(p.world), []).append(p)
        return out

    def on_node(self, node: int) -> list[Process]:
        return [p for p in self._processes if p.node == node]

    def to_dict(self) -> dict:
        """Plain data (JSON-ready; an Unknown as {"unknown": why}): what a harness compares with a real run."""
        return {
            "allocation": _plain(self.allocation),
            "understood": self.understood,
            "unknown": list(self.unknown),
            "notes": list(self.notes),
            "processes": [
                {
                    "node": p.node,
                    "hostname": p.hostname,
                    "procid": p.procid,
                    "local_rank": _plain(p.local_rank),
                    "rank": _plain(p.rank),
                    "world_size": _plain(p.world_size),
                    "rank_source": p.rank_source,
                    "argv": list(p.argv),
                    "env": dict(p.env),
                    "visible_gpus": _plain(p.visible_gpus),
                    "rendezvous": _plain(p.rendezvous),
                    "world": _plain(p.world),
                    "launcher": p.launcher,
                    "spawned": p.spawned,
                }
                for p in self._processes
            ],
        }


def _plain(value: object):
    if isinstance(value, Unknown):
        return {"unknown": value.why}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        return {k: _plain(getattr(value, k)) for k in value.__dataclass_fields__}
    return value


# ---------------------------------------------------------------- building


def job_model(facts, ctx) -> JobModel | None:
    """The model of ctx's batch script: the one the runner built for this run (ctx.job), else built now."""
    sb = getattr(ctx, "sbatch", None)
    if sb is None:
        return None
    built = getattr(ctx, "job", None)
    if built is not None and built.script is sb:
        return built
    from gpudoctor.job.env import job_env

    return build(sb, job_env(facts, ctx), ctx)


def build(script, env: JobEnv | Mapping[str, str] | None = None, ctx=None) -> JobModel:
    """The model of a batch script (readers.sbatch.BatchScript).

    env: the job's environment at the launch as job/env.job_env gives it (a JobEnv), or the environment sbatch
    is run from (a plain mapping, None: empty), on which the script's directives and exports are then applied.
    ctx: the Context (--launcher); None: one with this script alone."""
    from gpudoctor.job.shape import from_sbatch
    from gpudoctor.model import Context

    ctx = ctx if ctx is not None else Context(sbatch=script)
    if not isinstance(env, JobEnv):  # the submit environment: the script's directives and exports go on top
        from gpudoctor.facts import Facts
        from gpudoctor.job.env import job_env

        env = job_env(Facts(sections={"env": {"vars": dict(env or {})}}), replace(ctx, sbatch=script))
    shape = from_sbatch(script, ctx)
    return _Builder(script, shape, env).model()


def _host_names(nodelist: object, nodes: int | Unknown) -> tuple[str, ...] | None:
    if not isinstance(nodelist, str) or not known(nodes):
        return None
    from gpudoctor.readers.slurmfmt import SlurmFormatError, expand_nodelist

    try:
        names = tuple(expand_nodelist(nodelist))
    except SlurmFormatError:
        return None
    return names if len(names) == nodes else None


def allocation_of(shape: JobShape) -> Allocation:
    notes: list[str] = []
    nodes: int | Unknown = shape.nodes if shape.nodes else Unknown("the node count is not a number the script gives")
    per_node: tuple[int, ...] | Unknown
    if shape.srun_launch is False or shape.srun_launch is None:
        per_node = (1,)  # the batch shell runs the command once, on the first node
    elif shape.tasks_per_node:
        per_node = tuple(shape.tasks_per_node)
    elif shape.ntasks and known(nodes) and shape.ntasks % nodes == 0:  # type: ignore[operator]
        per_node = (shape.ntasks // nodes,) * nodes  # type: ignore[operator]
        notes.append(f"--ntasks={shape.ntasks} over {nodes} nodes: taken as {per_node[0]} per node (SLURM's choice)")
    elif shape.ntasks and not known(nodes):
        # --ntasks without --nodes: SLURM picks the nodes; the tasks are listed on one node, and nothing that
        # depends on the node count is judged from it (allocation.nodes stays unknown)
        per_node = (shape.ntasks,)
        notes.append(f"--ntasks={shape.ntasks} without --nodes: SLURM chooses the nodes; listed as one node")
    else:
        per_node = Unknown(f"SLURM places the {shape.ntasks or '?'} tasks over {nodes} nodes as it finds room")
    gpus: int | Unknown = (
        shape.gpus_per_node if shape.gpus_per_node is not None else Unknown("GPUs per node are not given per node")
    )
    return Allocation(
        nodes=nodes,
        tasks_per_node=per_node,
        gpus_per_node=gpus,
        gpus_per_task=shape.gpus_per_task or (1 if "ntasks-per-gpu" in (shape.directives or {}) else None),
        cpus_per_task=shape.srun_cpus_per_task if shape.srun_cpus_per_task and shape.srun_cpus_per_task > 0 else None,
        srun=bool(shape.srun_launch),
        hostnames=_host_names((shape.directives or {}).get("nodelist"), nodes),
        notes=tuple(notes + shape.notes),
    )


_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
# Host expressions the shell evaluates on the node it runs on.
_THIS_HOST = re.compile(
    r"^(\$\(\s*hostname(\s+-[sfA-Za-z]+)*\s*\)|`\s*hostname(\s+-[sfA-Za-z]+)*\s*`|\$\{?HOSTNAME\}?|\$\{?SLURMD_NODENAME\}?|"
    r"\$\(\s*hostname\s+-[iI]\s*(\|.*)?\))$"
)
# Host expressions that name the first node of the allocation wherever they are evaluated.
_FIRST_NODE = re.compile(
    r"(scontrol\s+show\s+hostnames?|SLURM_LAUNCH_NODE_IPADDR|SLURM_SUBMIT_HOST(?!\w)|head\s+-n\s*1|head\s+-1|"
    r"nodelist\[0\]|\$\{?nodes_array\[0\]|\$\{?nodes\[0\]|\$\{?head_node)"
)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1, localhost (RFC 1122 3.2.1.3, RFC 4291 2.5.3, RFC 6761 6.3)."""
    text = host.strip().strip("[]").lower()
    if text in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False


def resolve_host(host: str | Unknown, node: int, evaluated_on: int) -> tuple[int | str | Unknown, bool]:
    """The node a rendezvous host reaches from a process on `node`, when its text was expanded by a shell on node
    `evaluated_on`; and whether it is a loopback name. Unknown where the host is computed in a way not read."""
    if not known(host):
        return host, False
    text = str(host).strip().strip("'\"")
    if text == BATCH_HOST:
        return 0, False
    if is_loopback(text) or text in ("0.0.0.0", "::"):
        return node, True
    if _THIS_HOST.match(text):
        return evaluated_on, False
    if _FIRST_NODE.search(text):
        return 0, False
    if "$" in text or "`" in text:
        return Unknown(f"{text} is computed when the job runs"), False
    return text, False


def _program_url(program) -> re.Match | None:
    """The tcp://HOST:PORT the program passes init_process_group literally (readers/program.py)."""
    url = getattr(program, "init_method", None)
    return _TCP_URL.search(url) if url else None


_TCP_URL = re.compile(r"tcp://(\[[^\]]+\]|[^:/\s]+):(\d+)")


def _int(text: object) -> int | None:
    s = str(text).strip() if text is not None else ""
    return int(s) if re.fullmatch(r"\d{1,9}", s) else None


def _nnodes(text: str | None) -> tuple[int, int] | Unknown:
    """torchrun --nnodes: 'N' or 'MIN:MAX' (torch.distributed.run parse_min_max_nnodes); default 1:1."""
    if text is None:
        return (1, 1)
    lo, _, hi = str(text).partition(":")
    a, b = _int(lo), _int(hi) if hi else _int(lo)
    if a is None or b is None:
        return Unknown(f"--nnodes {text} is only known at run time")
    return (a, b)


def _split_endpoint(text: str, default_port: int) -> tuple[str, int | Unknown]:
    host, sep, port = text.rpartition(":") if text.count(":") == 1 or text.startswith("[") else ("", "", "")
    if not sep:
        return text, default_port
    value = _int(port)
    return host.strip("[]"), value if value is not None else Unknown(f"port {port} is only known at run time")


def _option(opts: Mapping[str, object] | None, *names: str) -> str | None:
    for name in names:
        value = (opts or {}).get(name)
        if value is not None and value is not True:
            return str(value)
    return None


_RANK_ARG = re.compile(r"^--?(rank|global[_-]rank|node[_-]rank|local[_-]rank|world[_-]size)(=(.*))?$")


def argv_ranks(argv: tuple[str, ...]) -> dict[str, str]:
    """`--rank 3`, `--node_rank=$X`, `--world-size 8` on a program's argv (dashes read as underscores)."""
    out: dict[str, str] = {}
    for i, word in enumerate(argv):
        m = _RANK_ARG.match(word)
        if not m:
            continue
        value = m.group(3) if m.group(2) else (argv[i + 1] if i + 1 < len(argv) else None)
        if value is not None:
            out[m.group(1).replace("-", "_")] = value
    return out


class _Builder:
    def __init__(self, script, shape: JobShape, env: Mapping[str, str]) -> None:
        self.sb, self.shape = script, shape
        self.launch = script.launch
        self.program = getattr(script, "program", None)
        self.env = env
        self.sources = {k: (env.source(k) if isinstance(env, JobEnv) else None) or "environment" for k in env}
        self.unknown: list[str] = []
        self.notes: list[str] = []
        self._groups: dict[int, tuple[dict[int, int], int | Unknown, int]] = {}
        self._expanded: dict[tuple, tuple[Any, dict[str, str]]] = {}

    def model(self) -> JobModel:
        alloc = allocation_of(self.shape)
        tasks = self._tasks(alloc)
        self._launcher_into_shape(tasks)
        processes: list[Process] = []
        if tasks:
            processes = self._processes(alloc, tasks)
        return JobModel(
            script=self.sb,
            shape=self.shape,
            allocation=alloc,
            tasks=tuple(tasks),
            unknown=tuple(dict.fromkeys(self.unknown)),
            notes=tuple(dict.fromkeys(list(alloc.notes) + self.notes)),
            launch=self.launch,
            program=self.program,
            _processes=tuple(processes),
        )

    def _launcher_into_shape(self, tasks: list[Task]) -> None:
        """A launcher the model found inside a script srun runs (`srun ./run.sh` -> accelerate) is the shape's
        launcher too, so the checks that count processes per task see it (one place decides the launcher)."""
        task_script = getattr(self.sb, "task_script", None)
        if self.shape.launcher is not None or task_script is None or not tasks:
            return
        kinds = {t.launcher.kind for t in tasks}
        counts = {t.launcher.nproc for t in tasks}
        if len(kinds) != 1 or len(counts) != 1 or "unknown" in kinds:
            return
        count = next(iter(counts))
        self.shape.launcher = next(iter(kinds))
        self.shape.launcher_source = f"{os.path.basename(task_script[0])}, run by line {self.launch.line}"
        self.shape.procs_per_task = count if isinstance(count, int) else None

    # ------------------------------------------------------------ tasks

    def _tasks(self, alloc: Allocation) -> list[Task]:
        if self.launch is None:
            unread = getattr(self.sb, "unread_commands", ())
            self.unknown.append(
                f"line {unread[-1][0]} runs `{unread[-1][1][:60]}`, which gpudoctor does not read"
                if unread
                else "the script starts no training command that gpudoctor can find"
            )
            return []
        if not known(alloc.tasks_per_node):
            self.unknown.append(str(alloc.tasks_per_node.why))  # type: ignore[union-attr]
            return []
        per_node: tuple[int, ...] = alloc.tasks_per_node  # type: ignore[assignment]
        if sum(per_node) > MAX_PROCESSES:
            self.unknown.append(f"{sum(per_node)} tasks: too many to list")
            return []
        tasks = []
        procid = 0
        ntasks = sum(per_node)
        for node, count in enumerate(per_node):
            for local in range(count):
                tasks.append(self._task(alloc, node, procid, local, ntasks, len(per_node)))
                procid += 1
        return tasks

    def _task_env(self, alloc: Allocation, node: int, procid: int, local: int, ntasks: int, nodes: int):
        env = dict(self.env)
        sources = dict(self.sources)
        if alloc.srun:
            for name, value in (
                ("SLURM_PROCID", procid),
                ("SLURM_LOCALID", local),
                ("SLURM_NODEID", node),
                ("SLURM_NTASKS", ntasks),
                ("SLURM_STEP_NUM_TASKS", ntasks),
                ("SLURM_STEP_NUM_NODES", nodes),
            ):
                env[name], sources[name] = str(value), "srun (per task)"
        else:  # the batch step: task 0 on node 0 (sbatch(1) OUTPUT ENVIRONMENT VARIABLES)
            for name in TASK_VARIABLES:
                env[name], sources[name] = "0", "the batch step"
            if "SLURM_NTASKS" in env:
                sources["SLURM_NTASKS"] = sources.get("SLURM_NTASKS") or DIRECTIVES
        return env, sources

    def _task(self, alloc: Allocation, node: int, procid: int, local: int, ntasks: int, nodes: int) -> Task:
        launch = self.launch
        env, sources = self._task_env(alloc, node, procid, local, ntasks, nodes)
        per_task = False
        wrappers = tuple(launch.wrappers)
        task_script = getattr(self.sb, "task_script", None)
        if task_script is not None:  # `srun ./run.sh ARGS`: each task's shell runs the script with $1... from the line
            key = ("script", *_task_key(task_script[1], env))
            if key not in self._expanded:
                self._expanded[key] = _script_launch(task_script, launch, env, self.sb.variables, per_task=alloc.srun)
            inner, inner_env = self._expanded[key]
            if inner is not None:
                launch, per_task = inner, alloc.srun
                wrappers = (*wrappers, os.path.basename(task_script[0]), *inner.wrappers)
                for name, value in inner_env.items():
                    env[name], sources[name] = value, f"{os.path.basename(task_script[0])} (each task)"
        elif launch.task_command and re.search(r"\$|`", launch.task_command):  # the shell it starts expands it
            key = ("bash -c", *_task_key(launch.task_command, env))
            if key not in self._expanded:  # tasks that see the same values expand the string alike
                self._expanded[key] = self._expand_per_task(launch, env)
            launch, inner_env = self._expanded[key]
            per_task = alloc.srun
            for name, value in inner_env.items():
                env[name], sources[name] = value, _TASK_SHELL
        visible = self._visible(alloc, local, env)
        gpus = alloc.gpus_per_node
        if known(visible) and known(gpus) and gpus and (alloc.srun or "CUDA_VISIBLE_DEVICES" not in env):
            # SLURM's gres/gpu plugin sets it in the batch step and in every step with GPUs, over an export
            # (seen on slurm-wlm 22.05: tests/job/test_model_reality.py)
            env["CUDA_VISIBLE_DEVICES"] = ",".join(visible)  # type: ignore[arg-type]
            sources["CUDA_VISIBLE_DEVICES"] = "SLURM (gres/gpu)"
        return Task(
            node=node,
            procid=procid,
            localid=local,
            argv=tuple(launch.argv) or tuple(launch.expanded.split()),
            wrappers=wrappers,
            launcher=self._launcher(launch, env, node, visible, evaluated_on=node if per_task else 0, task=procid),
            visible_gpus=visible,
            env=MappingProxyType(env),
            env_sources=MappingProxyType(sources),
            per_task=per_task,
        )

    def _expand_per_task(self, launch, env: Mapping[str, str]):
        """_per_task_launch for one task. Without arithmetic in the string, it is expanded once with a marker for
        each task variable and the markers are replaced by the task's values (linear in tasks, not in expansions);
        with arithmetic ($((SLURM_PROCID + 1))) it is expanded for the task itself."""
        if re.search(r"\(\(|\$\[", launch.task_command):
            return _per_task_launch(launch, env, self.sb.variables)
        if "template" not in self._expanded:
            marked = {**env, **{name: _MARK[name] for name in TASK_VARIABLES}}
            self._expanded["template"] = _per_task_launch(launch, marked, self.sb.variables)  # type: ignore[index]
        template, inner_env = self._expanded["template"]  # type: ignore[index]
        values = {_MARK[name]: env.get(name, "") for name in TASK_VARIABLES}
        return _fill(template, values), {k: _fill_text(v, values) for k, v in inner_env.items()}

    def _visible(self, alloc: Allocation, local: int, env: Mapping[str, str]) -> tuple[str, ...] | Unknown:
        """CUDA_VISIBLE_DEVICES of a task: SLURM's per step (srun with GPUs), else the script's export."""
        gpus = alloc.gpus_per_node
        slurm_sets = alloc.srun and known(gpus) and gpus  # the gres/gpu plugin sets it in every step with GPUs
        value = env.get("CUDA_VISIBLE_DEVICES")
        if value is not None and not slurm_sets:
            if "$" in value or "`" in value:
                return Unknown(f"CUDA_VISIBLE_DEVICES={value} is only known at run time")
            from gpudoctor.readers.cudavis import parse_visible_devices

            vis = parse_visible_devices(value)
            return tuple(e.text.strip() if e.gpu is None else str(e.gpu) for e in vis.accepted)
        if not known(gpus):
            return gpus  # type: ignore[return-value]
        count: int = gpus  # type: ignore[assignment]
        per = alloc.gpus_per_task
        if alloc.srun and per:
            return tuple(str(i) for i in range(local * per, min((local + 1) * per, count)))
        return tuple(str(i) for i in range(count))

    # ------------------------------------------------------------ launchers

    def _launcher(
        self, launch, env: Mapping[str, str], node: int, visible, evaluated_on: int, task: int = 0
    ) -> Launcher:
        kind = launch.launcher
        program = self.program
        gpus = len(visible) if known(visible) else None
        if kind in ("torchrun", "torch.distributed.launch"):
            return self._torchrun(launch, node, gpus, evaluated_on, program, task)
        if kind == "deepspeed":
            n = _count(launch.nproc_per_node, gpus)
            if launch.hostfile or _option(launch.launcher_options, "num-nodes", "include", "exclude"):
                nproc: int | Unknown = Unknown("deepspeed reads its hostfile when the job runs")
            else:
                nproc = n if n is not None else Unknown("deepspeed starts one process per visible GPU, not known here")
            addr = _option(launch.launcher_options, "master-addr")
            endpoint = self._endpoint(
                "deepspeed --master_addr" if addr else "deepspeed (its own node)",
                addr or "localhost",
                launch.master_port or "29500",
                node,
                evaluated_on,
            )
            return Launcher("deepspeed", nproc, rendezvous=endpoint, program=program)
        if kind == "accelerate":
            return self._accelerate(launch, node, evaluated_on, program)
        if kind == "lightning" or (kind in ("python", None) and self.shape.launcher == "lightning"):
            return Launcher("lightning", 1, program=program)
        if kind == "python":
            if program is None or not program.known:
                why = program.describe() if program is not None else "the program was not read"
                self.unknown.append(f"what the program does with its rank is unknown: {why}")
            return Launcher("python", 1, program=program)
        why = not_understood(launch)
        self.unknown.append(why)
        return Launcher("unknown", Unknown(why), why_unknown=why)

    def _torchrun(self, launch, node: int, gpus: int | None, evaluated_on: int, program, task: int = 0) -> Launcher:
        opts = launch.launcher_options or {}
        nnodes = _nnodes(launch.nnodes)
        n = _count(launch.nproc_per_node, gpus) if launch.nproc_per_node is not None else 1
        nproc: int | Unknown = n if n is not None else Unknown(f"--nproc-per-node {launch.nproc_per_node}")
        if launch.standalone:  # torch/distributed/run.py: c10d at localhost:<free port>, a fresh run id
            run = f"standalone@{node}.{task}"
            endpoint = Endpoint("torchrun --standalone", "localhost", None, node, True, run_id=run)
            return Launcher(launch.launcher, nproc, nnodes, None, True, "c10d", endpoint, program=program)
        backend = launch.rdzv_backend or "static"
        if backend == "static" or not launch.rdzv_endpoint:
            addr = _option(opts, "master-addr")
            port = launch.master_port or "29500"
            if launch.rdzv_endpoint:
                host, p = _split_endpoint(launch.rdzv_endpoint, 29500)
                endpoint = self._endpoint("torchrun --rdzv-endpoint", host, p, node, evaluated_on)
            elif addr:
                endpoint = self._endpoint("torchrun --master-addr", addr, port, node, evaluated_on)
            else:
                endpoint = self._endpoint("torchrun's default --master-addr", "127.0.0.1", port, node, evaluated_on)
        else:
            host, p = _split_endpoint(launch.rdzv_endpoint, 29400)
            endpoint = self._endpoint("torchrun --rdzv-endpoint", host, p, node, evaluated_on)
            endpoint = Endpoint(**{**endpoint.__dict__, "run_id": launch.rdzv_id or "none"})
        rank_text = launch.node_rank
        node_rank: int | Unknown | None = None
        if backend == "static":
            node_rank = 0 if rank_text is None else _int(rank_text)
            if node_rank is None:
                node_rank = Unknown(f"--node-rank {rank_text} is only known at run time")
        return Launcher(launch.launcher, nproc, nnodes, node_rank, False, backend, endpoint, program=program)

    def _accelerate(self, launch, node: int, evaluated_on: int, program) -> Launcher:
        from gpudoctor.readers.accelerate import accelerate_plan

        plan = accelerate_plan(launch)
        per = plan.procs_per_machine
        machines = plan.num_machines.value
        total = plan.num_processes.value
        rank = plan.machine_rank.value
        opts = launch.launcher_options or {}
        config = launch.launcher_config.values if launch.launcher_config is not None else {}
        addr = _option(opts, "main-process-ip") or (
            str(config.get("main_process_ip")) if config.get("main_process_ip") else None
        )
        port = launch.master_port or (
            str(config.get("main_process_port")) if config.get("main_process_port") else "29500"
        )
        nmachines = _int(machines) if machines is not None else 1
        backend = launch.rdzv_backend or _str(config.get("rdzv_backend")) or "static"
        endpoint = self._endpoint(
            "accelerate --main_process_ip" if addr else "accelerate's default (this node)",
            addr or "127.0.0.1",
            port,
            node,
            evaluated_on,
        )
        return Launcher(
            "accelerate",
            per if isinstance(per, int) else Unknown("accelerate's processes per machine are not known"),
            (nmachines, nmachines) if nmachines is not None else Unknown(f"--num_machines {machines}"),
            None
            if backend != "static"
            else (_int(rank) if _int(rank) is not None else Unknown(f"--machine_rank {rank}"))
            if rank is not None
            else 0,
            False,
            backend,
            endpoint,
            expects_world=_int(total) if total is not None and _int(total) is not None else None,
            program=program,
        )

    def _endpoint(self, how: str, host: str, port: object, node: int, evaluated_on: int) -> Endpoint:
        value = _int(port) if port is not None else None
        p: int | Unknown | None = value if value is not None else Unknown(f"port {port} is only known at run time")
        reaches, loop = resolve_host(host, node, evaluated_on)
        return Endpoint(how, host, p, reaches, loop)

    # ------------------------------------------------------------ processes

    def _processes(self, alloc: Allocation, tasks: list[Task]) -> list[Process]:
        out: list[Process] = []
        agents = self._agents(tasks)
        for task in tasks:
            kind = task.launcher.kind
            if kind in ("torchrun", "torch.distributed.launch", "accelerate", "deepspeed"):
                out.extend(self._workers(alloc, task, agents))
            elif kind in ("python", "lightning"):
                out.extend(self._plain(alloc, task, len(tasks)))
            if len(out) > MAX_PROCESSES:
                self.unknown.append(f"more than {MAX_PROCESSES} processes: not listed")
                return []
        return self._spawned(out)

    def _agents(self, tasks: list[Task]) -> dict[str, list[Task]]:
        """Launcher tasks by the rendezvous they meet at (torchrun agents, accelerate machines)."""
        out: dict[str, list[Task]] = {}
        for t in tasks:
            key = _world_key(t.launcher.rendezvous, t.launcher)
            if known(key):
                out.setdefault(str(key), []).append(t)
        return out

    def _hostname(self, alloc: Allocation, node: int) -> str | None:
        return alloc.hostnames[node] if alloc.hostnames and node < len(alloc.hostnames) else None

    def _workers(self, alloc: Allocation, task: Task, agents: dict[str, list[Task]]) -> list[Process]:
        la = task.launcher
        if not known(la.nproc):
            self.unknown.append(f"task {task.procid}: {la.nproc.why}")  # type: ignore[union-attr]
            return []
        nproc: int = la.nproc  # type: ignore[assignment]
        key = _world_key(la.rendezvous, la)
        url = _program_url(self.program)
        program_endpoint = None
        if url is not None:  # init_process_group(init_method="tcp://...") in each worker: the ranks meet there
            reaches, loop = resolve_host(url.group(1), task.node, 0)
            program_endpoint = Endpoint("init_method in the program", url.group(1), _int(url.group(2)), reaches, loop)
        group = agents.get(str(key), [task]) if known(key) else [task]
        world_size, base = self._launcher_world(task, group)
        out = []
        env_base = dict(task.env)
        for local in range(nproc):
            rank = base + local if known(base) else base  # type: ignore[operator]
            env = dict(env_base)
            sources = dict(task.env_sources)
            given = {
                "RANK": rank,
                "LOCAL_RANK": local,
                "WORLD_SIZE": world_size,
                "LOCAL_WORLD_SIZE": nproc,
                "MASTER_ADDR": la.rendezvous.host if la.rendezvous else None,
                "MASTER_PORT": la.rendezvous.port if la.rendezvous else None,
            }
            if la.rendezvous is not None and (la.standalone or (la.backend or "static") != "static"):
                # c10d (and --standalone, a c10d rendezvous on the node): the rank-0 agent picks a free port and
                # gives its own socket.getfqdn() (torch/distributed/elastic/rendezvous/api.py
                # RendezvousStoreInfo.build); seen with torch 2.13 (tests/job/test_job_reality.py)
                here = self._hostname(alloc, task.node) if la.standalone else None
                given["MASTER_ADDR"] = here or Unknown("the host of the agent the rendezvous makes rank 0")
                given["MASTER_PORT"] = Unknown("a free port the rank-0 agent picks")
            for name, value in given.items():
                if value is not None and known(value):
                    env[name], sources[name] = str(value), la.kind
                elif value is not None:
                    env.pop(name, None)
                    sources[name] = f"{la.kind} (assigned at the rendezvous)"
            argv = task.argv
            if la.kind == "torch.distributed.launch" and not (self.launch.launcher_options or {}).get("use-env"):
                argv = (*argv, f"--local-rank={local}")  # torch.distributed.launch passes it unless --use-env
            r, w, how = self._program_rank(env, argv, rank, world_size, f"RANK ({la.kind})")
            out.append(
                Process(
                    node=task.node,
                    hostname=self._hostname(alloc, task.node),
                    procid=task.procid,
                    local_rank=local,
                    rank=r,
                    world_size=w,
                    rank_source=how,
                    argv=argv,
                    env=MappingProxyType(env),
                    env_sources=MappingProxyType(sources),
                    visible_gpus=task.visible_gpus,
                    rendezvous=program_endpoint or la.rendezvous,
                    world=_world_key(program_endpoint, la) if program_endpoint is not None else key,
                    launcher=la.kind,
                )
            )
        return out

    def _launcher_world(self, task: Task, group: list[Task]) -> tuple[int | Unknown, int | Unknown]:
        """(world size, this agent's first rank) as the launcher gives them to its workers."""
        la = task.launcher
        if la.standalone or not known(la.nnodes) or la.nnodes is None:
            total = la.nproc if la.standalone else Unknown("the launcher's node count is unknown")
            return (total, 0) if la.standalone else (total, Unknown("its node rank is unknown"))
        lo, hi = la.nnodes  # type: ignore[misc]
        first, size, admitted = self._group(group, hi)
        index = first.get(id(task))
        if index is None:  # agents past MAX are not admitted (torch.distributed.elastic rendezvous)
            return Unknown(f"more than {hi} agent(s) meet at this rendezvous"), Unknown("not admitted")
        if admitted < lo or not known(size):
            return Unknown(f"{admitted} of the {lo} node(s) the launcher waits for"), Unknown("no world forms")
        if la.expects_world is not None:
            size = la.expects_world
        if la.backend == "static" and known(la.node_rank):
            return size, la.node_rank * la.nproc  # type: ignore[operator]
        if la.backend == "static":
            return size, Unknown("its node rank is unknown")
        # c10d/etcd: the rendezvous numbers the agents; taken here in node order (any order is one world)
        return size, index

    def _group(self, group: list[Task], hi: int) -> tuple[dict[int, int], int | Unknown, int]:
        """For the agents at one rendezvous: each admitted agent's first rank (by id), the world size they make,
        and how many are admitted; computed once per group (a job of thousands of nodes stays linear)."""
        cached = self._groups.get(id(group))
        if cached is not None:
            return cached
        agents = group[:hi]
        first: dict[int, int] = {}
        total: int | Unknown = 0
        for t in agents:
            if isinstance(t.launcher.nproc, Unknown) or isinstance(total, Unknown):
                total = Unknown("a launcher's process count is unknown")
                first[id(t)] = 0
                continue
            first[id(t)] = total
            total += t.launcher.nproc
        out = (first, total, len(agents))
        self._groups[id(group)] = out
        return out

    def _program_rank(
        self, env: Mapping[str, str], argv: tuple[str, ...], rank, world, default: str
    ) -> tuple[int | Unknown, int | Unknown, str]:
        """The rank and world size the program uses: --rank on its argv, else the variables it reads first."""
        args = argv_ranks(argv)
        r, w, how = rank, world, default
        if "rank" in args:
            value = _int(args["rank"])
            r, how = (value if value is not None else Unknown(f"--rank {args['rank']}")), "--rank on its argv"
        elif self._computes("RANK", "SLURM_PROCID"):
            value = _int(env.get("SLURM_PROCID"))
            r, how = (value if value is not None else Unknown("SLURM_PROCID is not set")), "SLURM_PROCID (its program)"
        if "world_size" in args:
            value = _int(args["world_size"])
            w = value if value is not None else Unknown(f"--world_size {args['world_size']}")
        elif self._computes("WORLD_SIZE", "SLURM_NTASKS"):
            value = _int(env.get("SLURM_NTASKS"))
            w = value if value is not None else Unknown("SLURM_NTASKS is not set")
        return r, w, how

    def _computes(self, launcher_name: str, slurm_name: str) -> bool:
        """The program passes init_process_group a value it computes, reading SLURM's variable before the
        launcher's (`rank=int(os.environ.get("SLURM_PROCID", os.environ.get("RANK")))`)."""
        program = self.program
        return program is not None and program.passes_rank and program.prefers(launcher_name, slurm_name) == slurm_name

    def _plain(self, alloc: Allocation, task: Task, ntasks: int) -> list[Process]:
        """A plain program (or Lightning) in each task: one process, its rank as the program reads it."""
        program = self.program
        lightning = task.launcher.kind == "lightning" or (program is not None and program.kind == "lightning")
        env = dict(task.env)
        if lightning and alloc.srun:
            rank: int | Unknown = task.procid
            world: int | Unknown = ntasks
            how = "SLURM_PROCID (Lightning's SLURMEnvironment)"
            key: str | Unknown = "lightning-slurm"
        elif lightning:
            rank, world, how = (
                Unknown("Lightning starts its own processes"),
                Unknown("Lightning's devices"),
                "Lightning",
            )
            key = f"lightning@{task.node}"
        else:
            rank, world, how = self._plain_rank(env, task)
            key = self._plain_world(env, task)
        r, w, how = self._program_rank(env, task.argv, rank, world, how)
        endpoint = None
        url = next((m for word in task.argv if (m := _TCP_URL.search(word))), None) or _program_url(self.program)
        if url is not None:  # init_method=tcp://HOST:PORT given on its argv (--dist-url, --init-method)
            reaches, loop = resolve_host(url.group(1), task.node, 0)
            port = _int(url.group(2))
            endpoint = Endpoint("tcp:// on its argv", url.group(1), port, reaches, loop)
            key = _world_key(endpoint, task.launcher) if not lightning else key
        elif "MASTER_ADDR" in env:
            shell = task.node if task.env_sources.get("MASTER_ADDR") == _TASK_SHELL else 0
            reaches, loop = resolve_host(env["MASTER_ADDR"], task.node, shell)
            endpoint = Endpoint("MASTER_ADDR", env["MASTER_ADDR"], _int(env.get("MASTER_PORT")), reaches, loop)
        return [
            Process(
                node=task.node,
                hostname=self._hostname(alloc, task.node),
                procid=task.procid,
                local_rank=_local_rank(env, task.localid),
                rank=r,
                world_size=w,
                rank_source=how,
                argv=task.argv,
                env=MappingProxyType(env),
                env_sources=task.env_sources,
                visible_gpus=task.visible_gpus,
                rendezvous=endpoint,
                world=key,
                launcher=task.launcher.kind,
            )
        ]

    def _plain_rank(self, env: Mapping[str, str], task: Task) -> tuple[int | Unknown, int | Unknown, str]:
        program = self.program
        if program is None or not program.known:
            why = program.describe() if program is not None else "the program was not read"
            return Unknown(why), Unknown(why), "unknown (the program was not read)"
        if program.kind in ("single", "one_process_many_gpus"):
            return 0, 1, "one process, no distributed world"
        name = program.prefers("RANK", "SLURM_PROCID") or (
            "RANK" if program.rank_source == "launcher" else "SLURM_PROCID"
        )
        world_name = "SLURM_NTASKS" if name == "SLURM_PROCID" else "WORLD_SIZE"
        rank = _int(env.get(name))
        world = _int(env.get(world_name))
        return (
            rank if rank is not None else Unknown(f"{name} is not set for it"),
            world if world is not None else Unknown(f"{world_name} is not set for it"),
            name,
        )

    def _plain_world(self, env: Mapping[str, str], task: Task) -> str | Unknown:
        program = self.program
        if program is None or not program.known:
            return Unknown("the program was not read")
        if program.kind in ("single", "one_process_many_gpus"):
            return f"alone@{task.procid}"
        if "MASTER_ADDR" not in env:
            return "env://"  # the program's own init decides; judged by GD-DIST-001/006
        shell = task.node if task.env_sources.get("MASTER_ADDR") == _TASK_SHELL else 0
        reaches, _ = resolve_host(env["MASTER_ADDR"], task.node, shell)
        return (
            Unknown("MASTER_ADDR is computed at run time")
            if not known(reaches)
            else f"{reaches}:{env.get('MASTER_PORT')}"
        )

    def _spawned(self, processes: list[Process]) -> list[Process]:
        """torch.multiprocessing.spawn in the program: every process starts nprocs children (readers/program.py)."""
        program = self.program
        if program is None or program.kind != "spawn":
            return processes
        out = []
        for p in processes:
            n = program.processes
            seen = p.visible_gpus
            count = len(seen) if n == "visible GPUs" and not isinstance(seen, Unknown) else n
            if not isinstance(count, int):
                self.unknown.append(f"{program.describe()}: how many processes it starts is unknown")
                return processes
            for child in range(count):
                out.append(
                    Process(
                        node=p.node,
                        hostname=p.hostname,
                        procid=p.procid,
                        local_rank=child,
                        rank=Unknown("mp.spawn gives it an index; its rank is the program's arithmetic"),
                        world_size=Unknown("the program computes it"),
                        rank_source="torch.multiprocessing.spawn",
                        argv=p.argv,
                        env=p.env,
                        env_sources=p.env_sources,
                        visible_gpus=p.visible_gpus,
                        rendezvous=p.rendezvous,
                        world=p.world,
                        launcher=f"{p.launcher} + mp.spawn",
                        spawned=True,
                    )
                )
        return out


def _world_key(endpoint: Endpoint | None, launcher: Launcher) -> str | Unknown:
    if endpoint is None:
        return Unknown("no rendezvous")
    if not known(endpoint.reaches) or not known(endpoint.port):
        return Unknown("its rendezvous endpoint is computed at run time")
    port = "" if endpoint.port is None else f":{endpoint.port}"
    where = f"node{endpoint.reaches}" if isinstance(endpoint.reaches, int) else str(endpoint.reaches)
    run = f"#{endpoint.run_id}" if endpoint.run_id else ""
    return f"{launcher.kind}@{where}{port}{run}"


def _count(value: object, gpus: int | None) -> int | None:
    """A launcher's process count: '8' -> 8; gpu/auto -> one per visible GPU (None where unknown)."""
    if value is None:
        return None
    text = str(value).strip()
    if re.fullmatch(r"\d{1,6}", text):
        return int(text)
    if text in ("gpu", "auto", "cuda"):
        return gpus
    return None


def not_understood(launch) -> str:
    """Why a launch line's processes cannot be told."""
    first = (launch.argv or launch.expanded.split() or ["?"])[0]
    shown = first if len(first) <= 40 else first[:37] + "..."
    if "$" in first or "`" in first:
        return f"line {launch.line} runs {shown}, known only at run time"
    return f"line {launch.line} runs {shown}, not a launcher or program gpudoctor reads"


def _per_task_launch(launch, env: Mapping[str, str], variables: Mapping[str, str]):
    """The launch of `srun bash -c '...'` as one task's shell runs it: its string expanded with the task's own
    variables, read again; and what the string exports before the launcher (`export MASTER_ADDR=...; torchrun`)."""
    from gpudoctor.readers.sbatch.launch import describe_command
    from gpudoctor.readers.sbatch.shell import Expander, split_commands

    known_vars = _batch_values({**{k: v for k, v in env.items() if "$" not in v}, **variables})
    known_vars.update({k: env[k] for k in TASK_VARIABLES if k in env})
    command = launch.task_command
    for part in launch.batch_evaluated:  # what the batch shell already evaluated is node 0's, not the task's
        if _THIS_HOST.match(part.strip()):
            command = command.replace(part, BATCH_HOST)
        elif part.startswith(("$(", "`")) and any(v in part for v in TASK_VARIABLES):
            command = command.replace(part, "computed-by-the-batch-shell")
    expanded = Expander().expand(command, known_vars, frozenset())
    inner_env: dict[str, str] = {}
    for words in split_commands(expanded):
        if words[:1] == ["export"] or (words and all(re.match(r"^[A-Za-z_]\w*=", w) for w in words)):
            for w in words[1:] if words[0] == "export" else words:
                name, eq, value = w.partition("=")
                if eq:
                    inner_env[name] = value
    desc = describe_command(["bash", "-c", expanded])
    if not desc.get("launcher") and not desc.get("program"):
        return launch, inner_env
    return (
        replace(
            launch,
            launcher=desc.get("launcher"),
            nproc_per_node=_str(desc.get("nproc_per_node")),
            nnodes=_str(desc.get("nnodes")),
            node_rank=_str(desc.get("node_rank")),
            standalone=bool(desc.get("standalone")),
            rdzv_backend=desc.get("rdzv_backend"),
            rdzv_endpoint=desc.get("rdzv_endpoint"),
            rdzv_id=_str(desc.get("rdzv_id")),
            master_port=_str(desc.get("master_port")),
            launcher_options=MappingProxyType(dict(desc.get("launcher_options") or {})),
            script_args=tuple(desc.get("script_args") or ()),
            argv=tuple(desc.get("argv") or ()),
            expanded=expanded,
        ),
        inner_env,
    )


def _local_rank(env: Mapping[str, str], local: int) -> int | Unknown:
    """LOCAL_RANK as the environment gives it (an export), else the task's SLURM_LOCALID."""
    if "LOCAL_RANK" not in env:
        return local
    value = _int(env["LOCAL_RANK"])
    return value if value is not None else Unknown(f"LOCAL_RANK={env['LOCAL_RANK']}")


# Markers standing for a task's own variables in a string expanded once for every task (_expand_per_task).
_MARK = {name: f"\x00{name}\x00" for name in TASK_VARIABLES}
_FILLED = ("nproc_per_node", "nnodes", "node_rank", "rdzv_endpoint", "rdzv_id", "master_port", "expanded", "program")


def _fill_text(text, values: Mapping[str, str]):
    if not isinstance(text, str) or "\x00" not in text:
        return text
    for mark, value in values.items():
        text = text.replace(mark, value)
    return text


def _fill(launch, values: Mapping[str, str]):
    """The launch with each marker replaced by the task's value, in every field a marker can reach."""
    changes: dict[str, Any] = {f: _fill_text(getattr(launch, f), values) for f in _FILLED}
    changes["argv"] = tuple(_fill_text(w, values) for w in launch.argv)
    changes["script_args"] = tuple(_fill_text(w, values) for w in launch.script_args)
    if launch.launcher_options is not None:
        changes["launcher_options"] = MappingProxyType(
            {k: _fill_text(v, values) for k, v in launch.launcher_options.items()}
        )
    return replace(launch, **changes)


def _task_key(text: str, env: Mapping[str, str]) -> tuple:
    """The task's own values a shell text can expand ($SLURM_PROCID, $SLURM_NODEID, $SLURM_LOCALID): tasks with
    the same ones get the same expansion."""
    return tuple(env.get(name) if name in text else None for name in TASK_VARIABLES)


def _batch_values(values: Mapping[str, str]) -> dict[str, str]:
    """Variables as the batch shell left them, for a task's shell to expand: a host the batch shell evaluated
    ($(hostname) there) is node 0's, written as the marker BATCH_HOST, never evaluated again per task."""
    out = {}
    for name, value in values.items():
        if _THIS_HOST.match(value.strip()):
            value = BATCH_HOST
        elif ("$(" in value or "`" in value) and any(v in value for v in TASK_VARIABLES):
            value = f"{name}-as-the-batch-shell-computed-it"  # one value for every task, not re-expanded
        out[name] = value
    return out


def _script_launch(
    task_script: tuple[str, str], launch, env: Mapping[str, str], variables: Mapping[str, str], per_task: bool
):
    """The training launch of a shell script a task runs, read as bash runs it in that task (readers/sbatch/body.py
    with the task's variables and $1... from the launch line), and what the script exports; (None, {}) when the
    script starts no training command."""
    from gpudoctor.readers.sbatch import SbatchError
    from gpudoctor.readers.sbatch.body import Body, positional_parameters
    from gpudoctor.readers.sbatch.launch import side_step, trains
    from gpudoctor.readers.sbatch.shell import Source, commands, tokenize

    path, text = task_script
    argv = list(launch.argv)
    if os.path.basename(argv[0]) in ("bash", "sh") and len(argv) > 1:
        argv = argv[1:]
    args = tuple(argv[1:])
    known_vars = _batch_values({**{k: v for k, v in env.items() if "$" not in v and "`" not in v}, **variables})
    known_vars.update({k: env[k] for k in TASK_VARIABLES if k in env})
    known_vars.update(positional_parameters(args))
    body = Body(Source(text), path, known_vars, args)
    try:
        body.read(commands(tokenize(text)))
    except (SbatchError, RecursionError):
        return None, {}
    descs = [d for _, d in body.launches]
    training = [i for i, d in enumerate(descs) if trains(d)]
    main = next((i for i in reversed(training) if not side_step(descs[i], descs[:i])), None)
    if main is None:
        return None, {}
    exported = {
        a.name: str(a.value)
        for a in body.assignments
        if a.exported and a.value is not None and not a.redacted and "$" not in str(a.value)
    }
    return body.launches[main][0], exported


def _str(value: object) -> str | None:
    return None if value is None else str(value)
