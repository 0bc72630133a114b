"""The job view: every rank's facts reduced to small comparable aspects, grouped, and judged as one job.

Used twice, with one data shape (the "job" facts section, docs/facts.md):
- offline, `gpudoctor compare A.json B.json ...`: every snapshot is one member of the job;
- live, `gpudoctor check --job` (gpudoctor/commands/check_job.py): every rank sends the digests of its aspects through
  the rendezvous store and rank 0 fetches the full aspect only from one rank of each group that
  differs.
The commands themselves live in gpudoctor/commands/ (compare.py, check_job.py); the job's text report in
gpudoctor/report/jobtext.py. This module only reads: it runs no check and renders nothing.

An aspect is the part of the facts that must agree across a job (versions, GPU models, env
settings ...), with everything that legitimately differs between nodes (host names, temperatures,
free memory, rank numbers) left out, so equal digests mean "agrees" and unequal ones name a drift.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpudoctor.facts import Facts
from gpudoctor.job.layout import SEVERAL_HOSTS_ONLY, env_int
from gpudoctor.sanitize import clean_tree

# Environment settings every rank of a job must share (issue 12; NCCL reads its NCCL_* settings per
# process, so one node's other NCCL_SOCKET_IFNAME or NCCL_IB_HCA splits the job's transports).
SHARED_ENV_PREFIXES = ("NCCL_", "PYTORCH_", "TORCH_", "MASTER_")
SHARED_ENV_NAMES = frozenset({"OMP_NUM_THREADS"})

# Aspects probed once per node (by local rank 0) and once per rank.
NODE_ASPECTS = ("versions", "gpus", "sizes", "findings")
RANK_ASPECTS = ("env", "rank_findings")
DIGEST_CHARS = 16  # 64 bits of SHA-256: a collision among a job's few distinct groups is not a concern


def digest(content) -> str:
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]


def _nccl_version(torch: dict):
    v = torch.get("nccl")
    return ".".join(str(x) for x in v) if isinstance(v, list) else v


def versions_of(facts: Facts) -> dict:
    """Versions that must be the same on every node (None: not known there)."""
    torch, nvidia, slurm = facts.torch, facts.nvidia, facts.slurm
    raw = slurm.get("packages")
    packages: dict = raw if isinstance(raw, dict) else {}
    out = {
        "driver": nvidia.get("driver_version"),
        "cuda_driver": nvidia.get("cuda_driver_version"),
        "torch": facts.torch_version(),
        "cuda_runtime": torch.get("cuda"),
        "nccl": _nccl_version(torch),
        "cudnn": torch.get("cudnn"),
        "python": torch.get("python_version") or (facts.host.get("python") or {}).get("version"),
    }
    for name, version in sorted(packages.items()):
        if name != "error":
            out[name] = version
    return out


def gpus_of(facts: Facts) -> dict:
    """GPU models and memory of the node, as NVML lists them (no UUIDs: those differ by design)."""
    gpus = [g for g in facts.gpus if not g.get("error")]
    return {"models": sorted(f"{g.get('name')} ({_gib(g.get('memory_total_bytes'))})" for g in gpus)}


def _gib(n) -> str:
    return f"{n / 2**30:.0f} GiB" if isinstance(n, (int, float)) else "? GiB"


def sizes_of(facts: Facts, ranks_here: int | None) -> dict:
    """GPUs and CPUs per node, and how many ranks the launcher put there."""
    host = facts.host
    return {
        "gpus": len([g for g in facts.gpus if not g.get("error")]) if facts.nvidia.get("available") else 0,
        "cpus": host.get("cpus_allowed_count") or host.get("cpu_count_logical"),
        "ranks": ranks_here,
    }


def env_of(facts: Facts) -> dict:
    return {k: v for k, v in sorted(facts.env.items()) if k.startswith(SHARED_ENV_PREFIXES) or k in SHARED_ENV_NAMES}


def findings_of(findings) -> list[dict]:
    """A node's own verdicts, reduced to what is not a pass (the report groups them by node)."""
    keep = [f for f in findings if f.severity.value in ("warn", "fail", "error")]
    return [_finding_item(f) for f in keep]


def _finding_item(f) -> dict:
    item = {"id": f.id, "severity": f.severity.value, "title": f.title, "message": f.message}
    if f.evidence.get(SEVERAL_HOSTS_ONLY):
        item[SEVERAL_HOSTS_ONLY] = True
    return item


# --- members: one rank (live) or one snapshot (compare) -------------------------------------------------


def node_index(env: Mapping[str, str]) -> int | None:
    """The launcher's own node number: torchrun's GROUP_RANK, srun's SLURM_NODEID, Lightning's NODE_RANK.

    Two nodes of one host name (two torchrun agents on one machine, or containers) stay two nodes.
    """
    for name in ("GROUP_RANK", "SLURM_NODEID", "NODE_RANK"):
        n = env_int(env, name)
        if n is not None:
            return n
    return None


def rank_of(env: dict) -> int | None:
    for name in ("RANK", "SLURM_PROCID"):
        n = env_int(env, name)
        if n is not None:
            return n
    return None


@dataclass
class Member:
    """One rank's report: who it is and the digests (and, where known, the contents) of its aspects."""

    rank: int
    node: str  # label (host name, disambiguated by node index or snapshot file)
    hostname: str | None
    node_index: int | None
    local_rank: int | None = None
    leader: bool = True  # reports the node-wide aspects
    gpu: str | None = None  # UUID of the GPU this rank trains on
    master: dict | None = None  # MASTER_ADDR as this node sees it
    source: str | None = None  # snapshot file
    digests: dict = field(default_factory=dict)
    contents: dict = field(default_factory=dict)  # aspect -> content, where this side has it

    def to_wire(self) -> dict:
        d = {
            "rank": self.rank,
            "node": self.node,
            "hostname": self.hostname,
            "node_index": self.node_index,
            "local_rank": self.local_rank,
            "leader": self.leader,
            "gpu": self.gpu,
            "digests": self.digests,
        }
        if self.master is not None:
            d["master"] = self.master
        if self.source:
            d["source"] = self.source
        return d


def aspects(facts: Facts, findings=None, ranks_here: int | None = None, leader: bool = True) -> dict:
    out: dict[str, Any] = {"env": env_of(facts)}
    if leader:
        out.update(versions=versions_of(facts), gpus=gpus_of(facts), sizes=sizes_of(facts, ranks_here))
        out["findings"] = findings_of(findings or [])
    else:
        out["rank_findings"] = findings_of(findings or [])
    return out


def label_nodes(members: list[Member]) -> None:
    """Host names that several nodes share get the node index (or the snapshot file) added."""
    keys_by_host = defaultdict(set)
    for m in members:
        keys_by_host[m.hostname].add((m.node_index, m.source if m.node_index is None else None))
    for m in members:
        base = m.hostname or "?"
        if len(keys_by_host[m.hostname]) > 1:
            m.node = f"{base}#{m.node_index}" if m.node_index is not None else f"{base} ({m.source})"
        else:
            m.node = base


def view(
    members: list[Member],
    *,
    source: str,
    world_size: int | None = None,
    missing: list[int] | None = None,
    errors: list[dict] | None = None,
) -> dict:
    """The "job" facts section built from the members' digests and whatever contents are known."""
    contents: dict = defaultdict(dict)
    for m in members:
        for aspect, content in m.contents.items():
            contents[aspect].setdefault(m.digests.get(aspect) or digest(content), content)
    return {
        "source": source,
        "world_size": world_size,
        "members": [m.to_wire() for m in sorted(members, key=lambda m: m.rank)],
        "contents": {a: dict(c) for a, c in sorted(contents.items())},
        "missing_ranks": sorted(missing or []),
        "errors": errors or [],
    }


# --- reading the view (used by checks/job.py) --------------------------------------------------------------


def ranks_text(ranks) -> str:
    """[8, 9, 10, 11, 13] -> 'ranks 8–11, 13'."""
    ranks = sorted(set(ranks))
    if not ranks:
        return "no ranks"
    spans, start, prev = [], ranks[0], ranks[0]
    for r in ranks[1:]:
        if r != prev + 1:
            spans.append(str(start) if start == prev else f"{start}–{prev}")
            start = r
        prev = r
    spans.append(str(start) if start == prev else f"{start}–{prev}")
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(spans)


def where_text(members: list[dict]) -> str:
    """'gpu-017 (ranks 8–15)', 'gpu-017, gpu-018 (ranks 8–23)', or snapshot files for compare."""
    nodes = sorted({m["node"] for m in members})
    if all(m.get("source") for m in members):  # compare: one member per snapshot file
        # the node label already names the file where several snapshots share a host name
        named = sorted(m["node"] if m["source"] in m["node"] else f"{m['node']} ({m['source']})" for m in members)
        return ", ".join(named[:4]) + (f" and {len(named) - 4} more" if len(named) > 4 else "")
    shown = ", ".join(nodes[:4]) + (f" and {len(nodes) - 4} more nodes" if len(nodes) > 4 else "")
    return f"{shown} ({ranks_text(m['rank'] for m in members)})"


def groups(job: dict, aspect: str) -> list[tuple[str, list[dict]]]:
    """(digest, members) for each distinct value of an aspect, the largest group first."""
    by: dict = defaultdict(list)
    for m in job.get("members", []):
        d = m.get("digests", {}).get(aspect)
        if d is not None:
            by[d].append(m)
    return sorted(by.items(), key=lambda kv: (-len(kv[1]), min(m["rank"] for m in kv[1])))


def content(job: dict, aspect: str, d: str):
    return job.get("contents", {}).get(aspect, {}).get(d)


def differing_keys(values: list[dict]) -> list[str]:
    keys = sorted({k for v in values if isinstance(v, dict) for k in v})
    return [k for k in keys if len({json.dumps((v or {}).get(k), sort_keys=True) for v in values}) > 1]


# --- compare: snapshots -> view -> findings -> report --------------------------------------------------------

_SAFE_NAME = re.compile(r"[^\w.@+-]")


def members_from_snapshots(paths: list[str], facts_list: list[Facts], findings_list: list) -> list[Member]:
    members = []
    for i, (path, facts, findings) in enumerate(zip(paths, facts_list, findings_list, strict=True)):
        env = facts.env
        parts = aspects(facts, findings, ranks_here=None, leader=True)
        rdzv = facts.sections.get("rendezvous") or {}
        m = Member(
            rank=i,
            node="",
            hostname=clean_tree(facts.host.get("hostname")),  # recorded on another machine: shown cleaned
            node_index=node_index(env),
            local_rank=env_int(env, "LOCAL_RANK"),
            source=path,
            gpu=None,
            master=_master_from_rendezvous(env, rdzv),
        )
        m.digests = {a: digest(c) for a, c in parts.items()}
        m.contents = clean_tree(parts)
        members.append(m)
    label_nodes(members)
    return members


def _master_from_rendezvous(env: dict, rdzv: dict) -> dict | None:
    addr = env.get("MASTER_ADDR")
    if not addr:
        return None
    out = {"addr": addr, "port": env.get("MASTER_PORT")}
    raw = rdzv.get("resolve")
    resolve: dict = raw if isinstance(raw, dict) else {}
    if resolve.get("error"):
        out["error"] = resolve["error"]
    return out
