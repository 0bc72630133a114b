"""Invariants of the job as it will run (gpudoctor/job/model.py), judged over its processes, not its text.

- GD-SLURM-035: the processes form one world: every rank reaches the same rendezvous from its own node (a
  loopback host is each node itself: RFC 6761 6.3, RFC 1122 3.2.1.3), and the launchers that meet there agree
  on the node count (torchrun --nnodes MIN:MAX, default 1:1: torch/distributed/run.py; an agent past MAX is not
  admitted and fewer than MIN never start: torch.distributed.elastic.rendezvous) and, for torchrun's static
  rendezvous, on distinct --node-rank values;
- GD-SLURM-036: the ranks of a world are distinct and each process expects the world it is in: its rank and
  world size as the program reads them (torch.distributed.init_process_group: `rank` and `world_size`, or
  RANK/WORLD_SIZE for env://), after the batch shell expanded `$SLURM_PROCID` once (sbatch(1): the batch
  script runs as task 0 on the first node);
- GD-SLURM-037: a GPU per rank: each rank takes cuda:LOCAL_RANK of the GPUs it sees (CUDA_VISIBLE_DEVICES as
  CUDA parses it: CUDA C Programming Guide, "CUDA Environment Variables"), and a process past the last visible
  GPU dies with "invalid device ordinal"; torch.multiprocessing.spawn children in each worker share its GPUs;
- GD-SLURM-038: the launch line is read to its processes; a line that is not (a command only known at run
  time, a wrapper script not there) is said to be unknown, never passed as "no problems found".
"""

from __future__ import annotations

from collections import Counter

from gpudoctor.job.model import JobModel, Process, Task, Unknown, job_model, known, not_understood
from gpudoctor.model import fail, manual, passed, skip, warn
from gpudoctor.registry import check

# Checks that name the same broken world from their own angle: where one of them fails in this run, this
# module leaves the finding to it (one finding per problem).
_ENDPOINT_CHECKS = ("GD-SLURM-034", "GD-DIST-006", "GD-SLURM-012", "GD-SLURM-009", "GD-DIST-001")


def _model(facts, ctx) -> JobModel | None:
    return job_model(facts, ctx)


def _reported(ctx, ids: tuple[str, ...]) -> str | None:
    """The first of these checks that failed in this run (it names the problem already), or None."""
    for cid in ids:
        if any(o.severity.value == "fail" for o in ctx.deferred.get(cid, ())):
            return cid
    return None


def _evidence(model: JobModel, **extra) -> dict:
    alloc = model.allocation
    launch = model.launch
    per_node = alloc.tasks_per_node
    ev: dict[str, object] = {
        "nodes": str(alloc.nodes),
        "tasks per node": str(per_node)
        if isinstance(per_node, Unknown)
        else f"{per_node[0]} on each of {len(per_node)} node(s)"
        if len(set(per_node)) == 1
        else list(per_node),
        "GPUs per node": str(alloc.gpus_per_node),
    }
    if launch is not None:
        ev["launch line"] = f"line {launch.line}: {launch.text[:200]}"
    if model.unknown:
        ev["unknown"] = list(model.unknown[:5])
    ev.update(extra)
    return ev


def _distributed(model: JobModel) -> list[Process]:
    """The processes that join a distributed world (not one-process programs run once per task)."""
    return [p for p in model.processes() if not (known(p.world) and str(p.world).startswith("alone@"))]


def _line(model: JobModel) -> str:
    return f"line {model.launch.line}" if model.launch is not None else "the launch"


# ---------------------------------------------------------------- GD-SLURM-035


@check(
    id="GD-SLURM-035",
    name="processes-form-one-world",
    category="slurm",
    title="The job's processes form one distributed world",
    needs=[],
    requires=["sbatch"],
    scope="job",
    defers_to=list(_ENDPOINT_CHECKS),
    what="Builds the job as it will run (gpudoctor/job/model.py): every task's command after the shell that "
    "expands it and the wrappers around it, each launcher's processes and the rendezvous each reaches from its own "
    "node. Fails when they split into several worlds: a loopback endpoint (localhost, 127.0.0.1, "
    "tcp://localhost) on several nodes, torchrun --standalone on several nodes, more or fewer agents than "
    "--nnodes (default 1), or two static agents with one --node-rank.",
    why="Every rank must meet the others at one rendezvous. localhost is each node itself, --standalone is a "
    "one-node world, and torchrun without --nnodes is a world of one node: each node trains alone or waits "
    "forever for the others (torch/distributed/run.py; torch.distributed.elastic rendezvous).",
    fix="Give every node the same reachable endpoint (the first node: `scontrol show hostnames "
    '"$SLURM_JOB_NODELIST" | head -n 1`), --nnodes=$SLURM_NNODES and the c10d backend with one --rdzv-id.',
)
def processes_form_one_world(facts, ctx):
    model = _model(facts, ctx)
    if model is None or model.launch is None:
        return skip("no training launch line in the batch script")
    procs = _distributed(model)
    worlds: dict[str, list[Process]] = {}
    for p in procs:
        if known(p.world):
            worlds.setdefault(str(p.world), []).append(p)
    problem = _split(model, worlds) or _agents(model)
    if problem is None and not procs:
        return skip("the model lists no distributed process", **_evidence(model))
    if problem is None:
        if not worlds:
            return skip("which world the processes join is not known", **_evidence(model))
        if len(worlds) > 1:
            return passed(
                f"{len(worlds)} independent runs: their program arguments differ per task", **_evidence(model)
            )
        size = sum(len(w) for w in worlds.values())
        return passed(f"the {size} processes meet at one rendezvous", **_evidence(model))
    other = _reported(ctx, _ENDPOINT_CHECKS)
    if other is not None:
        return passed(f"the split world is {other}'s finding", **_evidence(model))
    message, remedy = problem
    return fail(
        message,
        manual("Give every node one rendezvous it can reach", *remedy),
        **_evidence(model, worlds={k: len(v) for k, v in list(worlds.items())[:8]}),
    )


_REMEDY = (
    'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
    "srun torchrun --nnodes=$SLURM_NNODES --nproc-per-node=<GPUs per node> --rdzv-backend=c10d "
    "--rdzv-endpoint=$MASTER_ADDR:29500 --rdzv-id=$SLURM_JOB_ID train.py",
)


def _program_args(model: JobModel, p: Process | Task) -> tuple[str, ...]:
    """The words the program gets after its file (launcher options left out), of a process or a task's command."""
    script = model.launch.script if model.launch is not None else None
    return p.argv[p.argv.index(script) + 1 :] if script and script in p.argv else p.argv


def independent_runs(model: JobModel, worlds: dict[str, list[Process]]) -> bool:
    """Separate worlds whose programs get different arguments (`--seed $SLURM_PROCID` expanded per task): runs
    started apart on purpose (a sweep), not one job split by mistake."""
    args = {_program_args(model, w[0]) for w in worlds.values()}
    return len(args) == len(worlds)


def _split(model: JobModel, worlds: dict[str, list[Process]]) -> tuple[str, tuple[str, ...]] | None:
    if len(worlds) < 2 or independent_runs(model, worlds):
        return None
    first = next(iter(worlds.values()))[0]
    endpoint = first.rendezvous
    nodes = len({p.node for p in model.processes()})
    where = _line(model)
    if endpoint is not None and endpoint.how == "torchrun --standalone":
        each = f"each of {nodes} nodes" if nodes > 1 else f"each of {len(model.tasks)} tasks"
        return f"{where}: torchrun --standalone on {each} starts {len(worlds)} separate worlds, not one", _REMEDY
    if endpoint is not None and endpoint.loopback:
        return (
            f"{where}: rendezvous {endpoint.describe()} is each node itself: {len(worlds)} worlds on {nodes} nodes",
            _REMEDY,
        )
    if endpoint is not None:
        return (
            f"{where}: the ranks reach {len(worlds)} different rendezvous ({endpoint.describe()} on node {first.node})",
            _REMEDY,
        )
    return f"{where}: the {len(model.tasks)} tasks start {len(worlds)} separate worlds", _REMEDY


def _agents(model: JobModel) -> tuple[str, tuple[str, ...]] | None:
    """Launcher agents at one rendezvous against their --nnodes, and static node ranks."""
    groups: dict[str, list] = {}
    for t in model.tasks:
        la = t.launcher
        if la.kind in ("torchrun", "torch.distributed.launch", "accelerate") and la.rendezvous is not None:
            if not la.standalone and known(la.rendezvous.reaches) and known(la.rendezvous.port):
                groups.setdefault(f"{la.rendezvous.reaches}:{la.rendezvous.port}#{la.rendezvous.run_id}", []).append(t)
    where = _line(model)
    for tasks in groups.values():
        la = tasks[0].launcher
        if not known(la.nnodes) or la.nnodes is None:
            continue
        lo, hi = la.nnodes
        flag = "--num_machines" if la.kind == "accelerate" else "--nnodes"
        said = f"{flag}={lo}" if lo == hi else f"{flag}={lo}:{hi}"
        if len(tasks) > hi:
            default = " (the default)" if la.kind != "accelerate" and model.launch.nnodes is None else ""
            return (
                f"{where}: {len(tasks)} {la.kind} agents meet at one rendezvous but {said}{default}: not one world",
                _REMEDY,
            )
        ranks = Counter(t.launcher.node_rank for t in tasks if known(t.launcher.node_rank))
        if la.backend == "static" and len(tasks) > 1 and ranks and max(ranks.values()) > 1:
            rank, count = ranks.most_common(1)[0]
            flag = "--machine_rank" if la.kind == "accelerate" else "--node-rank"
            return (
                f"{where}: {count} of the {len(tasks)} nodes run {la.kind} with {flag}={rank}: the rendezvous never "
                "completes",
                (
                    "expand the node rank in each task: srun bash -c '... "
                    + ("--machine_rank=$SLURM_NODEID" if la.kind == "accelerate" else "--node-rank=$SLURM_NODEID")
                    + " ...'",
                ),
            )
    return _more_nodes_than_nnodes(model)


def _more_nodes_than_nnodes(model: JobModel) -> tuple[str, tuple[str, ...]] | None:
    """torchrun on more nodes than its --nnodes MAX (default 1:1), one agent per node, the same command on each:
    wrong wherever the agents meet. At one endpoint the rendezvous closes at MAX nodes and the others are refused
    or wait; at different ones (a loopback or per-node endpoint, the static default 127.0.0.1) each node trains
    alone, a copy of the same run (torch/distributed/run.py: --nnodes, default 1:1). The endpoint may be unknown."""
    agents = [t for t in model.tasks if t.launcher.kind in ("torchrun", "torch.distributed.launch")]
    if len(agents) < 2 or any(t.launcher.standalone or not known(t.launcher.nnodes) for t in agents):
        return None
    nnodes = agents[0].launcher.nnodes
    if not isinstance(nnodes, tuple) or any(t.launcher.nnodes != nnodes for t in agents):
        return None
    nodes = {t.node for t in agents}
    if len(nodes) != len(agents) or len(nodes) <= nnodes[1]:
        return None
    args = {_program_args(model, t) for t in agents}
    if len(args) == len(agents):
        return None  # each node runs its own arguments: separate runs on purpose (a sweep)
    lo, hi = nnodes
    said = f"--nnodes={lo}" if lo == hi else f"--nnodes={lo}:{hi}"
    default = " (the default)" if model.launch is not None and model.launch.nnodes is None else ""
    return (
        f"{_line(model)}: torchrun runs on {len(nodes)} nodes with {said}{default}: never one world of {len(nodes)}",
        _REMEDY,
    )


# ---------------------------------------------------------------- GD-SLURM-036


@check(
    id="GD-SLURM-036",
    name="ranks-unique-in-their-world",
    category="slurm",
    title="Every process of the job takes its own rank of the world it expects",
    needs=[],
    requires=["sbatch"],
    scope="job",
    defers_to=["GD-DIST-001", "GD-SLURM-009", "GD-SLURM-035"],
    what="Reads each process's rank and world size as its program reads them (--rank on its argv; of RANK and "
    "SLURM_PROCID the one its source reads first; torchrun's RANK otherwise) after the batch shell expanded the "
    "line once as task 0, and fails on two processes with one rank or a world size unlike the processes there.",
    why="init_process_group waits until world_size distinct ranks have joined: two rank 0s collide on the store, "
    "and a rank that expects a world of 1 trains alone. `srun python train.py --rank=$SLURM_PROCID` gives every "
    "task 0 (sbatch(1): the batch script runs as task 0), as does SLURM_PROCID read inside torchrun's workers.",
    fix="Expand per-task values in each task: `srun bash -c 'python train.py --rank=$SLURM_PROCID'`, or read "
    "RANK/WORLD_SIZE under torchrun.",
)
def ranks_unique_in_their_world(facts, ctx):
    model = _model(facts, ctx)
    if model is None or model.launch is None:
        return skip("no training launch line in the batch script")
    procs = [p for p in _distributed(model) if known(p.rank)]
    if len(procs) < 2:
        return skip("fewer than two processes with a known rank", **_evidence(model))
    groups: dict[str, list[Process]] = {}
    for p in procs:
        key = str(p.world) if known(p.world) else "the step"
        groups.setdefault(key, []).append(p)
    for members in groups.values():
        problem = _duplicates(model, members) or _sizes(model, members)
        if problem is not None:
            other = _reported(ctx, ("GD-DIST-001", "GD-SLURM-009", "GD-SLURM-035"))
            if other is not None:
                return passed(f"the colliding ranks are {other}'s finding", **_evidence(model))
            message, advice, ev = problem
            return fail(message, manual(*advice), **_evidence(model, **ev))
    return passed(f"{len(procs)} processes, each its own rank of the world it expects", **_evidence(model))


def _duplicates(model: JobModel, members: list[Process]):
    counts = Counter(p.rank for p in members)
    rank, count = counts.most_common(1)[0]
    if count < 2:
        return None
    p = next(p for p in members if p.rank == rank)
    how = p.rank_source
    advice: tuple[str, ...]
    if how.startswith("RANK ("):
        return None  # the launcher numbers its workers: two at one rank means two agents at one node rank (035's)
    if how.startswith("--rank"):
        why = "the batch shell expanded --rank once, as task 0"
        advice = (
            "Expand it in each task's own shell",
            f"srun bash -c '{_argv_text(p)}'",
        )
    elif how.startswith("SLURM_PROCID") and p.launcher not in ("python", "lightning"):
        why = f"the program reads SLURM_PROCID before RANK, one value per {p.launcher} agent"
        advice = ("Read RANK, LOCAL_RANK and WORLD_SIZE first under torchrun (they are set per worker)",)
    else:
        why = f"from {how}"
        advice = ("Give each process its own rank (RANK=$SLURM_PROCID inside each task)",)
    return (
        f"{_line(model)}: {count} processes take rank {rank}: {why}",
        advice,
        {"rank source": how, "processes with that rank": count},
    )


def _sizes(model: JobModel, members: list[Process]):
    sizes = Counter(p.world_size for p in members if known(p.world_size))
    if not sizes:
        return None
    size, _ = sizes.most_common(1)[0]
    if size == len(members) or any(not known(p.world_size) for p in members):
        return None
    if any(p.spawned for p in members):
        return None
    return (
        f"{_line(model)}: {len(members)} processes join but each expects a world of {size}",
        ("Give the program the world size the launcher sets (WORLD_SIZE), not a fixed or SLURM count",),
        {"world size expected": size, "processes": len(members)},
    )


def _argv_text(p: Process) -> str:
    import re
    import shlex

    words = [re.sub(r"^(--?rank[=\s]?)0$", r"\1$SLURM_PROCID", w) for w in p.argv[:8]]
    return " ".join(shlex.quote(w) if "$" not in w else w for w in words)


# ---------------------------------------------------------------- GD-SLURM-037


@check(
    id="GD-SLURM-037",
    name="gpu-per-rank",
    category="slurm",
    title="Each rank of the job has a GPU of its own",
    needs=[],
    requires=["sbatch"],
    scope="job",
    defers_to=["GD-SLURM-027", "GD-SLURM-002"],
    what="Counts, node by node, the processes the model lists against the GPUs each sees (CUDA_VISIBLE_DEVICES "
    "as CUDA parses it after the script's exports, or SLURM's per task) and the GPU each takes by the one-rank-"
    "per-GPU convention (cuda:LOCAL_RANK); children a program starts with torch.multiprocessing.spawn included.",
    why="A rank past the last visible GPU fails with 'invalid device ordinal', and two ranks on one GPU are refused "
    "by NCCL ('Duplicate GPU detected') or halve each other's memory.",
    fix="Start as many processes per node as the GPUs they see: drop a narrowing CUDA_VISIBLE_DEVICES, or set "
    "--nproc-per-node to the GPUs; a program that spawns its own processes is started once per node.",
)
def gpu_per_rank(facts, ctx):
    model = _model(facts, ctx)
    if model is None or model.launch is None:
        return skip("no training launch line in the batch script")
    procs = [p for p in _distributed(model) if p.launcher != "python" or p.spawned]
    if not procs:
        return skip("no launcher or spawning program whose ranks take a GPU each", **_evidence(model))
    if not known(model.allocation.gpus_per_node) or not model.allocation.gpus_per_node:
        return skip("the job's GPUs per node are not known", **_evidence(model))
    problem = _spawned_share(model, procs) or _past_last_gpu(model, procs)
    if problem is None:
        return passed("every rank has a GPU of its own", **_evidence(model))
    if _reported(ctx, ("GD-SLURM-027", "GD-SLURM-002")):
        return passed("the ranks without a GPU are another check's finding", **_evidence(model))
    message, advice, ev = problem
    return fail(message, manual(*advice), **_evidence(model, **ev))


def _past_last_gpu(model: JobModel, procs: list[Process]):
    without = [p for p in procs if p.gpu is None]
    if not without:
        return None
    p = without[0]
    seen: tuple[str, ...] = () if isinstance(p.visible_gpus, Unknown) else p.visible_gpus
    per_node = sum(1 for q in procs if q.node == p.node and q.procid == p.procid)
    source = p.env_sources.get("CUDA_VISIBLE_DEVICES")
    shows = f"CUDA_VISIBLE_DEVICES={p.env.get('CUDA_VISIBLE_DEVICES')} shows" if source else "it sees"
    return (
        f"{_line(model)}: {p.launcher} starts {per_node} ranks but {shows} {len(seen)} GPU(s): {len(without)} rank(s) "
        "get none",
        (f"Match the ranks to the GPUs: --nproc-per-node={len(seen)} or leave CUDA_VISIBLE_DEVICES to SLURM",),
        {"visible GPUs": list(seen), "CUDA_VISIBLE_DEVICES source": source, "ranks without a GPU": len(without)},
    )


def _spawned_share(model: JobModel, procs: list[Process]):
    spawned = [p for p in procs if p.spawned]
    if not spawned:
        return None
    per_node = Counter(p.node for p in spawned)
    node, count = per_node.most_common(1)[0]
    gpus = model.allocation.gpus_per_node
    if count <= gpus:  # type: ignore[operator]
        return None
    parents = len({(p.procid, p.argv) for p in spawned if p.node == node})
    workers = count // max(1, len({p.local_rank for p in spawned}))
    program = model.program.describe() if model.program is not None else "the program"
    return (
        f"{_line(model)}: {workers} {spawned[0].launcher.split(' +')[0]} workers each spawn a process per GPU: "
        f"{count} processes on {gpus} GPUs",
        (f"Start the spawning program once per node (plain `python`, not {spawned[0].launcher.split(' +')[0]})",),
        {"program": program, "processes on a node": count, "parents": parents},
    )


# ---------------------------------------------------------------- GD-SLURM-038


@check(
    id="GD-SLURM-038",
    name="launch-line-understood",
    category="slurm",
    title="gpudoctor can read what the launch line starts",
    needs=[],
    requires=["sbatch"],
    scope="job",
    what="Reads the training launch through srun, the shell that expands it and its wrappers (container, "
    'environment, profiler, `set -- ...; exec "$@"`) to a launcher or a Python program. Where it cannot -- a '
    "command only known at run time, a wrapper script or console script it cannot see into -- the job's "
    "processes are unknown and nothing about them was judged; that is said, never passed.",
    why="A verdict of 'no problems found' over a launch line that was not understood would judge a job nobody "
    "read (issue 37).",
    fix="Write the launcher on the srun line (`srun torchrun ...`, `srun python train.py`), or pass gpudoctor "
    "the launcher (--launcher torchrun).",
)
def launch_line_understood(facts, ctx):
    model = _model(facts, ctx)
    if model is None:
        return skip("no batch script given (--sbatch)")
    unread = getattr(model.script, "unread_commands", ())
    if model.launch is None and unread:
        line, text = unread[-1]
        shown = text if len(text) <= 40 else text[:37] + "..."
        return warn(
            f"line {line} runs `{shown}`, which gpudoctor does not read: the job's processes were not judged",
            manual("Check it inside the job, or name the launcher on the script's own line", "srun gpudoctor check"),
            unread=[f"line {n}: {t[:200]}" for n, t in unread[-5:]],
        )
    if model.launch is None:
        return skip("no training launch line in the batch script")
    if model.understood:
        kind = model.tasks[0].launcher.kind if model.tasks else model.launch.launcher
        return passed(f"{_line(model)} starts {kind}", **_evidence(model))
    why = next((t.launcher.why_unknown for t in model.tasks if t.launcher.why_unknown), None) or not_understood(
        model.launch
    )
    return warn(
        f"{why}: its ranks and GPUs were not judged",
        manual("Name the launcher on the srun line, or tell gpudoctor (--launcher torchrun|srun|accelerate)"),
        **_evidence(model),
    )
