"""Which node each rank of a job runs on, from the launcher's own layout: rank 0 can name the node of a
rank that never reported without that rank reporting anything.

Pure: reads rank 0's environment only.

- srun (one task per rank, rank = SLURM_PROCID): the step's nodes (SLURM_STEP_NODELIST, else
  SLURM_JOB_NODELIST) in order, the task count of each (SLURM_STEP_TASKS_PER_NODE, else
  SLURM_TASKS_PER_NODE) and the first field of SLURM_DISTRIBUTION (srun(1), -m/--distribution):
  "block" (also "*", unset: srun's default) puts consecutive tasks on one node, filling each node's
  count in node order; "cyclic" deals tasks round-robin over the nodes that still have a task to
  take. plane and arbitrary (SLURM_HOSTFILE) are not reconstructed: "unknown".
  Cyclic assumes no --overcommit: srun deals past a node's CPUs only when every node is full.
- torchrun: every agent starts LOCAL_WORLD_SIZE workers and numbers them contiguously in the order of
  its GROUP_RANK (torch.distributed.elastic.agent.server.api, SimpleElasticAgent._assign_worker_ranks:
  base global rank = group rank x local world size), so node = rank // LOCAL_WORLD_SIZE
  when WORLD_SIZE = GROUP_WORLD_SIZE x LOCAL_WORLD_SIZE (all agents have one --nproc-per-node);
  otherwise "unknown".

    locate_missing(layout_of(env, "srun", 16), missing=[8, ..., 15], arrived={0: 0, ...})
      -> Located(rule="SLURM's block distribution", nodes=[MissingOnNode("gpu-017", 1, (8, ..., 15), whole=True)])
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpudoctor.job.layout import env_int
from gpudoctor.readers.slurmfmt import SlurmFormatError, expand_nodelist, parse_tasks_per_node

MAX_RANKS = 1_000_000  # a world larger than this is a typo: do not build a list of it


@dataclass(frozen=True)
class RankLayout:
    """nodes[i] names node i; node_of[r] is the node index of rank r; rule says how it was derived.
    by_index: nodes[i] is the launcher's index only (torchrun: no host names in rank 0's environment);
    the report names such a node by the host its arrived ranks reported, else by the index."""

    nodes: tuple[str, ...]
    node_of: tuple[int, ...]
    rule: str
    by_index: bool = False


@dataclass(frozen=True)
class Unknown:
    """Why the launcher's layout cannot be rebuilt here."""

    reason: str


@dataclass(frozen=True)
class MissingOnNode:
    node: str  # as the report names it: a host name, or "1 (torchrun's group rank 1)"
    index: int  # the launcher's node index (SLURM_NODEID, GROUP_RANK)
    ranks: tuple[int, ...]  # its ranks that never reported
    whole: bool  # no rank of this node reported


@dataclass(frozen=True)
class Located:
    rule: str
    nodes: tuple[MissingOnNode, ...]


# --- the distributions -------------------------------------------------------------------------------------


def block_order(counts: list[int]) -> list[int]:
    """[2, 1, 1] -> [0, 0, 1, 2]: consecutive tasks share a node (srun -m block)."""
    return [node for node, count in enumerate(counts) for _ in range(count)]


def cyclic_order(counts: list[int]) -> list[int]:
    """[2, 1, 1] -> [0, 1, 2, 0]: one task per node per round, skipping nodes already full (srun -m cyclic)."""
    left = list(counts)
    out: list[int] = []
    while any(left):
        for node, n in enumerate(left):
            if n:
                out.append(node)
                left[node] -= 1
    return out


_ORDERS = {"block": block_order, "cyclic": cyclic_order}


def slurm_layout(
    nodelist: str | None, tasks_per_node: str | None, distribution: str | None, world_size: int
) -> RankLayout | Unknown:
    """srun's rank -> node map from the step's variables; Unknown (with the reason) where it cannot be rebuilt."""
    # SLURM_DISTRIBUTION is "block", "cyclic:fcyclic", "block,Pack", "plane", ...: nodes are the first level
    method = (distribution or "").split(",")[0].split(":")[0].strip().lower() or "*"
    method = "block" if method == "*" else method
    if method not in _ORDERS:
        return Unknown(f"SLURM_DISTRIBUTION={distribution} (only block and cyclic are rebuilt)")
    if not nodelist or not tasks_per_node:
        return Unknown("no SLURM_STEP_NODELIST/SLURM_STEP_TASKS_PER_NODE")
    try:
        hosts = expand_nodelist(nodelist)
        counts = parse_tasks_per_node(tasks_per_node, "SLURM_STEP_TASKS_PER_NODE")
    except SlurmFormatError as e:
        return Unknown(str(e))
    if len(hosts) != len(counts):
        return Unknown(f"{len(hosts)} node(s) in {nodelist!r} but {len(counts)} task count(s) in {tasks_per_node!r}")
    if sum(counts) != world_size:
        return Unknown(f"the task counts {tasks_per_node!r} add up to {sum(counts)}, not the world size {world_size}")
    return RankLayout(tuple(hosts), tuple(_ORDERS[method](counts)), f"SLURM's {method} distribution")


def torchrun_layout(
    world_size: int, local_world_size: int | None, group_world_size: int | None
) -> RankLayout | Unknown:
    """torchrun's rank -> node (group rank) map, where every agent runs the same number of workers."""
    if not local_world_size or local_world_size < 1 or not group_world_size or group_world_size < 1:
        return Unknown("no LOCAL_WORLD_SIZE/GROUP_WORLD_SIZE")
    if local_world_size * group_world_size != world_size:
        return Unknown(
            f"WORLD_SIZE={world_size} is not GROUP_WORLD_SIZE={group_world_size} x LOCAL_WORLD_SIZE="
            f"{local_world_size} (agents with different --nproc-per-node)"
        )
    nodes = tuple(f"torchrun's group rank {i}" for i in range(group_world_size))
    return RankLayout(
        nodes,
        tuple(r // local_world_size for r in range(world_size)),
        f"torchrun's rank order ({local_world_size} per agent)",
        by_index=True,
    )


def layout_of(env: Mapping[str, str], launcher: str, world_size: int) -> RankLayout | Unknown:
    """The layout the launcher that started this job used, read from rank 0's environment."""
    if not 0 < world_size <= MAX_RANKS:
        return Unknown(f"world size {world_size}")
    if launcher == "torchrun":
        return torchrun_layout(world_size, env_int(env, "LOCAL_WORLD_SIZE"), env_int(env, "GROUP_WORLD_SIZE"))
    step_tasks = env_int(env, "SLURM_STEP_NUM_TASKS")
    # srun's tasks are the ranks: srun itself, or a wrapper that exported RANK=$SLURM_PROCID
    procid = env_int(env, "SLURM_PROCID")
    one_task_per_rank = step_tasks == world_size and (
        launcher == "srun" or (procid is not None and env_int(env, "RANK") == procid)
    )
    if not one_task_per_rank:
        return Unknown("the ranks were not started by torchrun or as srun's tasks: no layout to read")
    return slurm_layout(
        env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST"),
        env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE"),
        env.get("SLURM_DISTRIBUTION"),
        world_size,
    )


# --- the missing ranks, by node --------------------------------------------------------------------------


def locate_missing(
    layout: RankLayout | Unknown,
    missing: list[int],
    arrived: Mapping[int, int | None],
    hosts: Mapping[int, str] | None = None,
) -> Located | Unknown:
    """Group the missing ranks by node. arrived maps each rank that reported to the node index it
    reported (SLURM_NODEID, GROUP_RANK): a rank whose own index disagrees with the layout means the
    layout was rebuilt wrongly, and then no node is named rather than a wrong one. hosts: node index ->
    the host its arrived ranks reported, added where the layout names nodes by index only."""
    if isinstance(layout, Unknown):
        return layout
    n = len(layout.node_of)
    if any(not 0 <= r < n for r in missing):
        return Unknown(f"a missing rank is outside the world of {n}")
    for rank, index in sorted(arrived.items()):
        if index is not None and 0 <= rank < n and layout.node_of[rank] != index:
            return Unknown(
                f"rank {rank} reported node index {index} where {layout.rule} puts it on node {layout.node_of[rank]}"
            )
    by_node: dict[int, list[int]] = {}
    for r in sorted(set(missing)):
        by_node.setdefault(layout.node_of[r], []).append(r)
    reported = {layout.node_of[r] for r in arrived if 0 <= r < n}
    return Located(
        layout.rule,
        tuple(
            MissingOnNode(_name(layout, i, hosts or {}), i, tuple(ranks), whole=i not in reported)
            for i, ranks in sorted(by_node.items())
        ),
    )


def _name(layout: RankLayout, index: int, hosts: Mapping[int, str]) -> str:
    """'gpu-017'; torchrun: '1 (torchrun's group rank 1)', or 'gpu-017 (torchrun's group rank 1)' once a rank
    of that node reported its host."""
    if layout.by_index:
        return f"{hosts.get(index) or index} ({layout.nodes[index]})"
    return layout.nodes[index]


def to_facts(located: Located | Unknown) -> dict:
    """The job section's "missing_where" (docs/facts.md)."""
    if isinstance(located, Unknown):
        return {"rule": None, "unknown": located.reason, "nodes": []}
    return {
        "rule": located.rule,
        "unknown": None,
        "nodes": [{"node": m.node, "index": m.index, "ranks": list(m.ranks), "whole": m.whole} for m in located.nodes],
    }
