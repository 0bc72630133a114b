"""slurm check of a batch script against the cluster it is submitted to: do the partition's nodes have what
each node of the job asks for (GPUs of the requested type, CPUs, memory)?

The cluster facts come from the controller (gpudoctor/probe/cluster.py: `scontrol show partition` and
`scontrol show node`), so this is judged on the login node before submission. SLURM's own rule (sbatch man
page, https://slurm.schedmd.com/sbatch.html, and the job submit error "Requested node configuration is not
available"): a job whose per-node request no node of the partition can ever satisfy is refused at submission
(or, with --partition lists and some site settings, pends with reason ReqNodeNotAvail forever).
"""

from __future__ import annotations

import re

from gpudoctor.checks.slurm._shared import slurm_shape
from gpudoctor.job.shape import JobShape
from gpudoctor.model import fail, manual, passed, skip
from gpudoctor.registry import check

_MEM = re.compile(r"^(\d+)([KMGT]?)B?$", re.I)
_MEM_SCALE_MB = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def mem_mb(text) -> int | None:
    """--mem as sbatch reads it: a number with an optional K/M/G/T suffix, megabytes by default; 0 = all."""
    m = _MEM.match(str(text).strip()) if text is not None else None
    return int(int(m.group(1)) * _MEM_SCALE_MB[m.group(2).upper()]) if m else None


def _per_node_request(shape: JobShape) -> dict:
    """What one node of the job must have: GPUs (and type), CPUs, memory."""
    tasks = max(shape.tasks_per_node) if shape.tasks_per_node else (shape.ntasks_per_node or 1)
    cpus = (shape.cpus_per_task or 1) * tasks
    request = {
        "gpus": shape.gpus_per_node or 0,
        "gpu_type": shape.gpu_type,
        "cpus": cpus,
        "tasks_per_node": tasks,
        "cpus_per_task": shape.cpus_per_task or 1,
    }
    mem = mem_mb(shape.directives.get("mem"))
    if mem:  # --mem=0 asks for all of a node's memory: any node fits
        request["memory_mb"] = mem
    return request


def _short_type(t: dict) -> str:
    gpus = f"{t['gpus']}x {t['gpu_type'] or 'GPU'}" if t.get("gpus") else "no GPU"
    cpus = f"{t['cpus']} CPUs" if t.get("cpus") else "CPUs not known"
    memory = f"{t['memory_mb']} MB" if t.get("memory_mb") else "memory not known"
    return f"{t['count']} node(s) with {gpus}, {cpus}, {memory}"


def _misses(t: dict, want: dict) -> list[str]:
    out = []
    if want["gpus"] and (t.get("gpus") or 0) < want["gpus"]:
        out.append(f"{t.get('gpus') or 0} GPU(s) < {want['gpus']}")
    if (
        want["gpus"]
        and want.get("gpu_type")
        and t.get("gpu_type")
        and t["gpu_type"].lower() != want["gpu_type"].lower()
    ):
        out.append(f"GPU type {t['gpu_type']}, not {want['gpu_type']}")
    elif want["gpus"] and want.get("gpu_type") and not t.get("gpu_type") and t.get("gpus"):
        out.append(f"untyped GPUs, not {want['gpu_type']}")
    if t.get("cpus") and want["cpus"] > t["cpus"]:
        out.append(f"{t['cpus']} CPUs < {want['cpus']}")
    if want.get("memory_mb") and t.get("memory_mb") and want["memory_mb"] > t["memory_mb"]:
        out.append(f"{t['memory_mb']} MB memory < {want['memory_mb']}")
    return out


def snapshot_node_type(facts, wanted_type: str | None) -> dict:
    """The node a --node-snapshot recorded, as a node type: its GPUs (the GPU type counts as the requested one when
    the GPU's name contains it, as 'h100' in 'NVIDIA H100 80GB HBM3'), CPUs and memory."""
    gpus = facts.gpus
    names = sorted({str(g.get("name") or "") for g in gpus})
    squashed = " ".join(names).lower().replace(" ", "").replace("-", "")
    gpu_type = None
    if names:
        gpu_type = wanted_type if wanted_type and wanted_type.lower() in squashed else ", ".join(names)
    memory = facts.host.get("mem_total_bytes")
    return {
        "count": 1,
        "names": [facts.host.get("hostname") or "recorded node"],
        "gres": None,
        "gpus": len(gpus),
        "gpu_type": gpu_type,
        "cpus": facts.host.get("cpu_count_logical"),
        "memory_mb": int(memory / 2**20) if memory else None,
        "features": [],
    }


@check(
    id="GD-SLURM-020",
    name="job-request-exceeds-partition-nodes",
    category="slurm",
    title="The partition has nodes that fit the job's per-node request",
    needs=["env", "cluster", "host", "nvidia"],
    requires=["sbatch"],
    scope="job",
    what="For --sbatch before submission: compares what each node of the job asks for (GPUs per node and their "
    "type from --gres/--gpus*, tasks per node x --cpus-per-task, --mem) with the node types of the partition the "
    "script names (or the cluster's default), as `scontrol show partition` and `scontrol show node` report "
    "them (Gres, CPUTot, RealMemory), and counts the nodes that fit against --nodes.",
    why="A request no node can satisfy is refused by sbatch ('Requested node configuration is not available') "
    "or pends forever; a GPU type the partition does not have (gpu:h200 on an A100 partition) is the classic "
    "copy-paste from another cluster's guide. Finding out on the login node costs nothing; finding out from "
    "the queue costs the wait.",
    fix="Ask for what the partition's nodes have (`sinfo -p PARTITION -o '%N %G %c %m'` lists them): the GPU "
    "type and count in --gres, fewer tasks or CPUs per task, less --mem; or submit to a partition that has such "
    "nodes (#SBATCH --partition).",
)
def job_request_exceeds_partition_nodes(facts, ctx):
    cluster = facts.cluster
    shape = slurm_shape(facts, ctx)
    if cluster.get("partition_missing"):
        name = cluster.get("partition")
        return fail(
            f"the cluster has no partition {name!r} ({cluster.get('reason')}): sbatch refuses the script "
            "('invalid partition specified')",
            manual("Pick a partition the cluster has", "sinfo -s"),
            partition=name,
        )
    if ctx.node_facts and facts.has("nvidia"):  # --node-snapshot: the node the job lands on, as recorded there
        cluster = {
            "partition": f"the node recorded in {ctx.node_facts}",
            "partition_source": "--node-snapshot",
            "node_types": [snapshot_node_type(facts, shape.gpu_type)],
        }
    elif not cluster.get("available"):
        why = cluster.get("reason") or cluster.get("error") or "not asked"
        return skip(f"the cluster could not say what its nodes have: {why}")
    types = cluster.get("node_types") or []
    if not types:
        return skip(f"partition {cluster.get('partition')}: {cluster.get('nodes_error') or 'no nodes listed'}")
    want = _per_node_request(shape)
    partition = cluster.get("partition")
    evidence = {
        "partition": f"{partition} ({cluster.get('partition_source')})",
        "per_node_request": want,
        "nodes_requested": shape.nodes,
        "node_types": [_short_type(t) for t in types],
    }
    fitting = [t for t in types if not _misses(t, want)]
    recorded = cluster.get("partition_source") == "--node-snapshot"
    if recorded:  # one recorded node stands for each node of the job: judge what one node asks
        if fitting:
            return passed(f"{partition} fits each node's request ({_short_type(fitting[0])})", **evidence)
        reasons = ", ".join(_misses(types[0], want))
        return fail(
            f"{partition} does not have what one node of the job asks for: {reasons}; on such nodes SLURM refuses "
            "the job ('Requested node configuration is not available') or it pends forever",
            manual("Request what the job's nodes have, or submit where the nodes have it", "sinfo -o '%P %N %G %c %m'"),
            **evidence,
        )
    have = sum(t["count"] for t in fitting)
    needed = shape.nodes or 1
    if fitting and have >= needed:
        example = fitting[0]
        return passed(
            f"{have} node(s) of partition {partition} fit each node's request "
            f"({example.get('gpus')}x {example.get('gpu_type') or 'GPU'}, {example.get('cpus')} CPUs)",
            **evidence,
        )
    if fitting:
        return fail(
            f"--nodes={needed} but only {have} node(s) of partition {partition} fit the per-node request: "
            "the job pends until more exist",
            manual(
                f"Ask for at most {have} node(s), or another partition", f"sinfo -p {partition} -o '%N %G %c %m %T'"
            ),
            **evidence,
        )
    reasons = "; ".join(f"{_short_type(t)}: {', '.join(_misses(t, want))}" for t in types[:3])
    asked = f"{want['gpus']}x {want['gpu_type'] or 'GPU'}, {want['cpus']} CPUs" + (
        f", {want['memory_mb']} MB" if want.get("memory_mb") else ""
    )
    return fail(
        f"no node of partition {partition} has what one node of the job asks for ({asked}): {reasons}; sbatch refuses "
        "it ('Requested node configuration is not available') or it pends forever",
        manual(
            "Request what the partition's nodes have, or submit to another partition",
            f"sinfo -p {partition} -o '%N %G %c %m %T'",
        ),
        **evidence,
    )
