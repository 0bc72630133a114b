"""job checks: every rank's view of one job compared (gpudoctor check --job, gpudoctor compare).

They read the "job" facts section (gpudoctor/job/compare.py builds it): one member per rank (or per
snapshot) with the digests of its aspects, and the contents of each distinct digest. A drift is
reported where it is: "on gpu-017 (ranks 8–15): torch=2.12.0 where gpu-001 ... (ranks 0–7) have 2.13.0".
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from gpudoctor.job.compare import content, differing_keys, groups, ranks_text, where_text
from gpudoctor.job.layout import SEVERAL_HOSTS_ONLY
from gpudoctor.model import Outcome, Severity, fail, manual, passed, skip, warn
from gpudoctor.registry import check


def _members(job: dict) -> list[dict]:
    return job.get("members") or []


# Host names that several machines may carry (an unconfigured image): they do not prove one machine.
_GENERIC_HOSTNAMES = frozenset({"localhost", "localhost.localdomain", "(none)", ""})


def one_host(job: dict) -> str | None:
    """The host every rank of the job reported, when all arrived and share one (NCCL too tells nodes apart
    by host name); None when several hosts, a missing rank or an unknown or generic host name."""
    members = _members(job)
    hosts = {m.get("hostname") for m in members}
    if not members or job.get("missing_ranks") or len(hosts) != 1:
        return None
    host = hosts.pop()
    return host if host and host.lower() not in _GENERIC_HOSTNAMES else None


def _on_nodes(job: dict, nodes: set[str]) -> list[dict]:
    """Every rank on these nodes: a node-wide aspect is reported by one rank per node, but holds for all."""
    return [m for m in _members(job) if m["node"] in nodes]


def _nodes_text(job: dict) -> str:
    nodes = {m["node"] for m in _members(job)}
    return (
        f"{len(nodes)} node(s), {len(_members(job))} rank(s)" if len(nodes) > 1 or len(_members(job)) > 1 else "1 rank"
    )


def _value_text(value) -> str:
    return "unset" if value is None else str(value)


def _drift(job: dict, aspect: str, what: str, severity_of, node_wide: bool = True) -> list[Outcome]:
    """One outcome per group that differs from the largest group (ties: the group of rank 0)."""
    found = groups(job, aspect)
    if not found:
        return [skip(f"no rank reported {what}")]
    base_digest, base_members = found[0]
    base = content(job, aspect, base_digest)
    if len(found) == 1:
        return [passed(f"{what} agree on {_nodes_text(job)}", **({aspect: base} if base else {}))]
    base_nodes = {m["node"] for m in base_members}
    base_where = where_text(_on_nodes(job, base_nodes) if node_wide else base_members)
    out = []
    for d, members in found[1:]:
        nodes = {m["node"] for m in members}
        where = where_text(_on_nodes(job, nodes) if node_wide else members)
        theirs = content(job, aspect, d)
        if theirs is None or base is None:
            out.append(
                Outcome(
                    Severity.WARN,
                    f"on {where}: {what} differ from {base_where} (contents not gathered)",
                    {"nodes": sorted(nodes), "digest": d, "majority_digest": base_digest},
                )
            )
            continue
        keys = differing_keys([base, theirs])
        severity = max((severity_of(k) for k in keys), key=lambda s: s.rank, default=Severity.WARN)
        diffs = "; ".join(
            f"{k}={_value_text(theirs.get(k))} where {base_where} ha{'s' if len(base_nodes) == 1 else 've'} "
            f"{_value_text(base.get(k))}"
            for k in keys
        )
        out.append(
            Outcome(
                severity,
                f"on {where}: {diffs}",
                {
                    "nodes": sorted(nodes),
                    "differs": {k: theirs.get(k) for k in keys},
                    "majority": {k: base.get(k) for k in keys},
                    "majority_nodes": sorted(base_nodes)[:16],
                },
            )
        )
    return out


# --- GD-JOB-001 ---------------------------------------------------------------------------------------------


def _missing_where_text(job: dict) -> str:
    """': node gpu-017 missing entirely (ranks 8–15), by SLURM's block distribution' (gpudoctor/job/rankmap.py)."""
    where = job.get("missing_where")
    if not where:  # a view without the launcher's layout: only the node indices no rank of arrived from
        nodes = job.get("missing_nodes") or []
        return f"; no rank of node index {', '.join(map(str, nodes))} arrived" if nodes else ""
    if where.get("unknown"):
        return f"; which node: unknown ({where['unknown']})"
    named = [
        f"node {n['node']} missing entirely ({ranks_text(n['ranks'])})"
        if n.get("whole")
        else f"{ranks_text(n['ranks'])} on node {n['node']}"
        for n in where.get("nodes") or []
    ]
    return f": {'; '.join(named)}, by {where.get('rule')}" if named else ""


@check(
    id="GD-JOB-001",
    name="job-ranks-missing",
    category="job",
    scope="job",
    needs=["job"],
    title="Every rank of the job reported",
    what="That every rank the launcher promised (WORLD_SIZE, srun's SLURM_STEP_NUM_TASKS) reported its view "
    "to rank 0 within --timeout, and names the ranks that did not, the ranks that reported an error, and the "
    "ranks whose entry this gpudoctor cannot read (gpudoctor/job/exchange.py: a versioned format, each entry's "
    "size, encoding and field types checked; the usual cause is another gpudoctor version on a node, or another "
    "program on the store's port), which count as not reported. "
    "The node of a missing rank comes from the launcher's own layout, so a node none of whose ranks "
    "started is named too: srun's SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE and SLURM_DISTRIBUTION "
    "(srun(1) -m/--distribution: block, the default, or cyclic), or torchrun's contiguous ranks per "
    "agent (GROUP_RANK x LOCAL_WORLD_SIZE).",
    why="torch.distributed.init_process_group waits for all WORLD_SIZE ranks: one rank that never starts, "
    "or cannot reach the rendezvous store, makes every other rank hang until the NCCL/gloo timeout "
    "(torch.distributed docs, 'Initialization': all processes must call init_process_group; "
    "https://pytorch.org/docs/stable/distributed.html).",
    fix="Look at the named ranks' nodes: the task's log (srun --output=%t), a crashed or never-scheduled "
    "process, a firewall between the node and MASTER_ADDR:MASTER_PORT, a wrong MASTER_PORT.",
)
def ranks_missing(facts, ctx):
    job = facts.sections["job"]
    world = job.get("world_size")
    missing, errors = job.get("missing_ranks") or [], job.get("errors") or []
    if world is None:
        return skip("no world size to compare with (snapshots, not a live job)")
    arrived = len(_members(job))
    parts = []
    if missing:
        parts.append(
            f"{ranks_text(missing)} of a world of {world} never reported within "
            f"{job.get('timeout_s', 0):g} s ({arrived} arrived)" + _missing_where_text(job)
        )
    for e in errors:
        parts.append(f"rank {e.get('rank')} on {e.get('node', '?')}: {e.get('error')}")
    if parts:
        return fail(
            "; ".join(parts),
            missing_ranks=missing,
            missing_where=job.get("missing_where"),
            errors=errors,
            world_size=world,
            arrived=arrived,
        )
    return passed(f"all {world} rank(s) reported", world_size=world)


# --- GD-JOB-002 ---------------------------------------------------------------------------------------------

# A different torch, CUDA runtime, NCCL, cuDNN or Python on one node: pickled collectives, NCCL's wire
# protocol and compiled kernels are not promised to be compatible across versions. Drivers and
# launcher packages may differ without breaking a run, but make one node behave unlike the others.
_MUST_MATCH = frozenset({"torch", "cuda_runtime", "nccl", "cudnn", "python"})


@check(
    id="GD-JOB-002",
    name="job-versions-differ",
    category="job",
    scope="job",
    needs=["job"],
    title="Every node runs the same driver, CUDA, torch, NCCL, cuDNN, Python and launcher packages",
    what="The NVIDIA driver and its CUDA version, torch, its CUDA runtime, NCCL and cuDNN, the Python "
    "version and the launcher/framework packages (Lightning, accelerate, deepspeed) of every node.",
    why="NCCL requires the same NCCL version on all ranks of a communicator ('NCCL version mismatch' in NCCL's "
    "troubleshooting guide, https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html); "
    "torch.distributed pickles objects across ranks (all_gather_object, the c10d store) and its wire formats "
    "are only tested between identical builds. A node that picked up another environment (a PYTHONPATH, "
    "another conda env, an older image) runs different code under the same job.",
    fix="Run every node from one image or environment: activate the same env in the batch script before srun, "
    "pin versions, and drain or reimage the node whose driver differs.",
)
def versions_differ(facts, ctx):
    return _drift(
        facts.sections["job"], "versions", "versions", lambda k: Severity.FAIL if k in _MUST_MATCH else Severity.WARN
    )


# --- GD-JOB-003 ---------------------------------------------------------------------------------------------


@check(
    id="GD-JOB-003",
    name="job-gpu-models-differ",
    category="job",
    scope="job",
    needs=["job"],
    title="Every node has the same GPU model and memory",
    what="The GPU models and their memory (NVML's name and total memory) on every node.",
    why="Data-parallel training runs at the pace of its slowest GPU and fits only what the smallest memory "
    "holds: a node with another model or a smaller memory makes the whole job slower or OOM on that node "
    "alone (NVML device queries, https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceQueries.html).",
    fix="Constrain the job to one GPU type (sbatch --constraint=..., --gres=gpu:h100:8) or exclude the node "
    "(--exclude).",
)
def gpu_models_differ(facts, ctx):
    return _drift(facts.sections["job"], "gpus", "GPU models", lambda k: Severity.WARN)


# --- GD-JOB-004 ---------------------------------------------------------------------------------------------


@check(
    id="GD-JOB-004",
    name="job-node-sizes-differ",
    category="job",
    scope="job",
    needs=["job"],
    title="Every node has the same number of GPUs, CPUs and ranks",
    what="GPUs NVML sees, CPUs the job may use (the affinity mask) and ranks the launcher started, per node.",
    why="torchrun and srun lay ranks out assuming uniform nodes (--nproc-per-node, --ntasks-per-node): a node "
    "with a GPU missing (fallen off the bus) or fewer CPUs starves its ranks or fails device selection "
    "(torchrun docs, https://pytorch.org/docs/stable/elastic/run.html; SLURM srun --ntasks-per-node, "
    "https://slurm.schedmd.com/srun.html).",
    fix="Drain the node that differs (scontrol update nodename=... state=drain reason=...) or request "
    "uniform nodes (--gres=gpu:8 --exclusive).",
)
def node_sizes_differ(facts, ctx):
    return _drift(
        facts.sections["job"],
        "sizes",
        "GPUs, CPUs and ranks per node",
        lambda k: Severity.FAIL if k == "gpus" else Severity.WARN,
    )


# --- GD-JOB-005 ---------------------------------------------------------------------------------------------


@check(
    id="GD-JOB-005",
    name="job-env-differs",
    category="job",
    scope="job",
    needs=["job"],
    title="Every rank has the same NCCL_*, PYTORCH_*, TORCH_*, MASTER_* and OMP_NUM_THREADS settings",
    what="The environment variables that configure NCCL, torch and the rendezvous, and OMP_NUM_THREADS, of every rank.",
    why="NCCL reads its settings in each process (NCCL environment variables, "
    "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html): one node with another "
    "NCCL_SOCKET_IFNAME, NCCL_IB_HCA or NCCL_PROTO picks other transports than its peers, and ranks with "
    "different MASTER_ADDR/MASTER_PORT meet at different stores and wait forever (torch.distributed env:// "
    "initialisation). OMP_NUM_THREADS that differs makes one node's CPU work slower (torchrun sets it to 1 "
    "unless given).",
    fix="Export the settings once in the batch script before srun (srun propagates the environment, "
    "--export=ALL), not in a node-specific profile; unset the stray one on the named node.",
)
def env_differs(facts, ctx):
    return _drift(facts.sections["job"], "env", "NCCL/torch/rendezvous settings", _env_severity, node_wide=False)


# Logging only: one node debugging more than the others changes no behaviour.
_LOGGING = frozenset(
    {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "TORCH_CPP_LOG_LEVEL", "TORCH_SHOW_CPP_STACKTRACES"}
)


def _env_severity(name: str) -> Severity:
    if name.startswith("MASTER_"):
        return Severity.FAIL
    return Severity.INFO if name in _LOGGING else Severity.WARN


# --- GD-JOB-006 ---------------------------------------------------------------------------------------------


@check(
    id="GD-JOB-006",
    name="job-ranks-share-gpu",
    category="job",
    scope="job",
    needs=["job"],
    title="No two ranks train on the same GPU",
    what="The UUID of the GPU each rank will use (CUDA_VISIBLE_DEVICES resolved against NVML, indexed by "
    "LOCAL_RANK when a rank sees several).",
    why="NCCL refuses two ranks of one communicator on one GPU ('Duplicate GPU detected', NCCL "
    "troubleshooting, https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html), and "
    "under gloo they halve each other's speed and memory.",
    fix="Give each task its own GPU: srun --gpus-per-task=1 (or --gpu-bind=single:1), or torchrun "
    "--nproc-per-node equal to the GPUs of the node, and call torch.cuda.set_device(LOCAL_RANK).",
)
def ranks_share_gpu(facts, ctx):
    job = facts.sections["job"]
    by_gpu = defaultdict(list)
    for m in _members(job):
        if m.get("gpu"):
            by_gpu[m["gpu"]].append(m)
    if not by_gpu:
        return skip("no rank reported a GPU of its own (CPU job, or no GPUs visible)")
    shared = {g: ms for g, ms in by_gpu.items() if len(ms) > 1}
    if not shared:
        return passed(f"{len(by_gpu)} rank(s), each on a GPU of its own")
    out = []
    for gpu, ms in sorted(shared.items()):
        out.append(
            fail(
                f"on {where_text(ms)}: {ranks_text(m['rank'] for m in ms)} all use GPU {gpu}",
                manual("one GPU per rank: srun --gpus-per-task=1, or torch.cuda.set_device(LOCAL_RANK)"),
                nodes=sorted({m["node"] for m in ms}),
                gpu=gpu,
                ranks=[m["rank"] for m in ms],
            )
        )
    return out


# --- GD-JOB-007 ---------------------------------------------------------------------------------------------


@check(
    id="GD-JOB-007",
    name="job-ranks-exceed-node-gpus",
    category="job",
    scope="job",
    needs=["job"],
    title="Each node runs as many ranks as it has GPUs",
    what="The ranks that reported from each node against the GPUs NVML sees there.",
    why="More ranks than GPUs puts two ranks on one GPU (NCCL refuses it; see GD-JOB-006); fewer leaves GPUs "
    "idle that the allocation pays for (the seed's DDP hang was a SLURM task/GPU mismatch; srun "
    "--ntasks-per-node and --gpus-per-node, https://slurm.schedmd.com/srun.html).",
    fix="Match the launcher to the node: torchrun --nproc-per-node=<GPUs per node>, or sbatch "
    "--ntasks-per-node equal to --gpus-per-node.",
)
def ranks_exceed_gpus(facts, ctx):
    job = facts.sections["job"]
    if job.get("source") != "live":
        return skip("ranks per node are only known in a live job (check --job)")
    ranks_on = defaultdict(list)
    for m in _members(job):
        ranks_on[m["node"]].append(m)
    gpus_on = {}
    for d, members in groups(job, "sizes"):
        sizes = content(job, "sizes", d) or {}
        for m in members:
            gpus_on[m["node"]] = sizes.get("gpus")
    if not any(gpus_on.values()):
        return skip("no node has a GPU (a CPU job)")
    out = []
    for node, members in sorted(ranks_on.items()):
        gpus, n = gpus_on.get(node), len(members)
        if not gpus or n == gpus:
            continue
        where = where_text(members)
        if n > gpus:
            out.append(fail(f"on {where}: {n} ranks share {gpus} GPU(s)", nodes=[node], ranks=n, gpus=gpus))
        else:
            out.append(
                warn(
                    f"on {where}: {n} rank(s) use {gpus} GPU(s); {gpus - n} stay idle", nodes=[node], ranks=n, gpus=gpus
                )
            )
    return out or passed(f"every node runs one rank per GPU ({_nodes_text(job)})")


# --- GD-JOB-008 ---------------------------------------------------------------------------------------------


@check(
    id="GD-JOB-008",
    name="job-master-unreachable",
    category="job",
    scope="job",
    needs=["job"],
    title="MASTER_ADDR:MASTER_PORT is reachable from every node",
    what="Whether each node resolves MASTER_ADDR and (live) opens a TCP connection to MASTER_ADDR:MASTER_PORT, "
    "bounded by a few seconds.",
    why="env:// initialisation connects every rank to the store at MASTER_ADDR:MASTER_PORT (torch.distributed "
    "docs, 'Environment variable initialization', https://pytorch.org/docs/stable/distributed.html); a node "
    "that cannot resolve or reach it waits until the timeout while the others hang in the rendezvous.",
    fix="Set MASTER_ADDR to an address every node resolves (the first host of the allocation, "
    "$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)), and open MASTER_PORT between the nodes.",
)
def master_unreachable(facts, ctx):
    job = facts.sections["job"]
    by_node: dict[str, Any] = {}
    for m in _members(job):
        if m.get("master"):
            by_node.setdefault(m["node"], m["master"])
    if not by_node:
        return skip("MASTER_ADDR is not set on any rank")
    bad = {n: mm for n, mm in by_node.items() if mm.get("error")}
    if not bad:
        addrs = sorted({f"{mm.get('addr')}:{mm.get('port')}" for mm in by_node.values()})
        return passed(f"{', '.join(addrs)} reached from {len(by_node)} node(s)", nodes=len(by_node))
    return [
        fail(
            f"on {where_text(_on_nodes(job, {n}))}: {mm.get('addr')}:{mm.get('port')}: {mm['error']}",
            nodes=[n],
            master=mm,
        )
        for n, mm in sorted(bad.items())
    ]


# --- GD-JOB-009 ---------------------------------------------------------------------------------------------


@check(
    id="GD-JOB-009",
    name="job-node-checks-fail",
    category="job",
    scope="job",
    needs=["job"],
    title="Every node passes its own checks",
    what="The verdicts of the ordinary checks (driver, CUDA, NCCL, devices, ...) run on each node, gathered "
    "and grouped: each problem once, with the nodes and ranks where it was found.",
    why="One report instead of one per task: 'fail on gpu-017 (ranks 8–15)' is found at a glance, where "
    "srun printing 16 full reports hides it.",
    fix="See the named check (gpudoctor explain ID) and run `gpudoctor check` on the named node for its evidence.",
)
def node_checks(facts, ctx):
    job = facts.sections["job"]
    host = one_host(job)
    problems: dict = {}
    moot: set[str] = set()
    for aspect, node_wide in (("findings", True), ("rank_findings", False)):
        for d, members in groups(job, aspect):
            for item in content(job, aspect, d) or []:
                if host and item.get(SEVERAL_HOSTS_ONLY):
                    moot.add(item["id"])
                    continue
                key = (item["id"], item["severity"])
                entry = problems.setdefault(key, {"item": item, "members": {}})
                holders = _on_nodes(job, {m["node"] for m in members}) if node_wide else members
                for m in holders:
                    entry["members"][m["rank"]] = m
    if not problems:
        nodes = {m["node"] for m in _members(job)}
        note = f" ({', '.join(sorted(moot))}: not a problem, every rank runs on {host})" if moot else ""
        return passed(f"pass on {len(nodes)} node(s){note}", **({"one_host": host} if moot else {}))
    out = []
    for (cid, sev), entry in sorted(problems.items(), key=lambda kv: (-Severity(kv[0][1]).rank, kv[0][0])):
        members = list(entry["members"].values())
        item = entry["item"]
        out.append(
            Outcome(
                Severity(sev) if sev != "error" else Severity.WARN,
                f"{sev} on {where_text(members)}: {cid} {item['title']}: {item['message']}",
                {"nodes": sorted({m["node"] for m in members}), "check": cid},
            )
        )
    return out
