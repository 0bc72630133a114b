"""Cluster facts: the partition a job will run in and the kind of nodes it has, as the SLURM controller
describes them (`scontrol show partition <p> --oneliner`, `scontrol show node --oneliner <nodes>`).

This is what a login node can know about the nodes a batch script will land on: their GPUs (the
Gres field: 'gpu:h200:8(S:0-1)'), CPUs, memory and features. Bounded by a timeout per command;
nothing here raises. Where SLURM is absent or the controller does not answer, the section says why.
Nodes are folded into node types (same GPUs, CPUs, memory, features) so a cluster of thousands of
nodes is a few lines.
"""

from __future__ import annotations

import os
import re
import shutil

from gpudoctor.probe.slurm import _run, parse_scontrol_record
from gpudoctor.readers.ints import small_int

COMMAND_TIMEOUT = 5.0  # a controller that answered once: the node listing may be large
FIRST_TIMEOUT = 1.5  # the first question: a controller answers it in milliseconds, a hook must stay fast
# A controller that did not answer is not asked again in this process (the pre-commit hook checks many
# scripts in one): its reason, said once, then reused; kept per SLURM_CONF (the controller it names).
_unreachable: dict[str, str] = {}
_UNREACHABLE = re.compile(r"did not answer within|Unable to contact slurm controller|Could not establish", re.I)
PARTITION_FIELDS = (
    "PartitionName",
    "Default",
    "State",
    "Nodes",
    "TotalNodes",
    "TotalCPUs",
    "MaxTime",
    "MaxNodes",
    "DefMemPerCPU",
    "DefMemPerNode",
    "MaxMemPerNode",
    "DefCpuPerGPU",
    "OverSubscribe",
    "TRES",
)
MAX_NAMES = 8  # node names kept per node type (evidence, not an inventory)


def _records(text: str) -> list[dict]:
    return [parse_scontrol_record(line) for line in text.splitlines() if line.strip()]


def _one_line(text: str) -> str:
    """scontrol's stderr as one line: its last (usually fatal) message without the 'scontrol: error:' prefix."""
    lines = [re.sub(r"^\S+: (?:error|fatal): ", "", line).strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def _partition(name: str | None) -> tuple[dict | None, str | None]:
    """(partition record, error). name None: the cluster's default partition (Default=YES)."""
    conf = os.environ.get("SLURM_CONF", "")
    if conf in _unreachable:
        return None, _unreachable[conf]
    cmd = ["scontrol", "show", "partition", "--oneliner"] + ([name] if name else [])
    rc, out, err = _run(cmd, FIRST_TIMEOUT)
    if rc != 0 or not out.strip():
        error = _one_line(err or out) or f"{' '.join(cmd)} exited {rc}"
        if _UNREACHABLE.search(error):
            _unreachable[conf] = f"{error} (not asked again in this run)"
        return None, error
    records = _records(out)
    if name:
        return records[0], None
    default = [r for r in records if r.get("Default") == "YES"]
    if not default:
        return None, "the cluster has no default partition (Default=YES) and the script names none"
    return default[0], None


def _gres_gpus(gres: str) -> tuple[int | None, str | None]:
    """'gpu:h200:8(S:0-1),shard:8' -> (8, 'h200'); (0, None) without a GPU gres; (None, None) if unreadable."""
    if not gres or gres == "(null)":
        return 0, None
    from gpudoctor.readers.slurmfmt import SlurmFormatError, parse_gres

    try:
        req = parse_gres(re.sub(r"\([^)]*\)", "", gres))
    except SlurmFormatError:
        return None, None
    return (req.count, req.type) if req is not None else (0, None)


def node_type(record: dict) -> dict:
    """The part of a node record that says what a job gets there."""
    gpus, gpu_type = _gres_gpus(record.get("Gres", ""))
    features = record.get("AvailableFeatures") or record.get("Features") or ""
    return {
        "gres": record.get("Gres") if record.get("Gres") not in (None, "(null)") else None,
        "gpus": gpus,
        "gpu_type": gpu_type,
        "cpus": small_int(record.get("CPUTot")),
        "memory_mb": small_int(record.get("RealMemory")),
        "features": [] if features in ("", "(null)") else sorted(features.split(",")),
    }


def fold_nodes(records: list[dict]) -> list[dict]:
    """Nodes with the same GPUs, CPUs, memory and features as one type: count, a few names, their states."""
    types: dict[tuple, dict] = {}
    for rec in records:
        kind = node_type(rec)
        key = (kind["gres"], kind["cpus"], kind["memory_mb"], tuple(kind["features"]))
        entry = types.setdefault(key, {**kind, "count": 0, "names": [], "states": {}})
        entry["count"] += 1
        if len(entry["names"]) < MAX_NAMES:
            entry["names"].append(rec.get("NodeName", "?"))
        state = (rec.get("State") or "UNKNOWN").split("+")[0]
        entry["states"][state] = entry["states"].get(state, 0) + 1
    return sorted(types.values(), key=lambda t: -t["count"])


def probe(partition: str | None = None) -> dict:
    """The partition (the given one, else SBATCH_PARTITION, else the default) and its node types."""
    if not shutil.which("scontrol"):
        return {"available": False, "reason": "no scontrol on PATH (not a SLURM login node)"}
    source = "given" if partition else None
    if partition is None and os.environ.get("SBATCH_PARTITION"):
        partition, source = os.environ["SBATCH_PARTITION"].split(",")[0], "SBATCH_PARTITION"
    first = partition.split(",")[0] if partition else None  # sbatch -p a,b: the job starts in whichever frees first
    record, error = _partition(first)
    if record is None:
        missing: dict = {"available": False, "partition": first, "reason": f"scontrol show partition: {error}"}
        if first and re.search(r"\bnot found\b", error or "", re.I):
            missing["partition_missing"] = True  # the controller answered: no such partition
        return missing
    out: dict = {
        "available": True,
        "partition": record.get("PartitionName"),
        "partition_source": source or "the cluster's default partition",
        "partition_record": {k: record[k] for k in PARTITION_FIELDS if k in record},
    }
    nodes = record.get("Nodes")
    if not nodes or nodes == "(null)":
        out["node_types"] = []
        return out
    rc, text, err = _run(["scontrol", "show", "node", "--oneliner", nodes], COMMAND_TIMEOUT)
    if rc != 0:
        out["nodes_error"] = _one_line(err or text) or f"scontrol show node exited {rc}"
        return out
    out["node_types"] = fold_nodes(_records(text))
    return out
