"""Checks on where the ranks landed, made from their rendezvous reports before any collective.

A join record (one per rank) holds: rank, local_rank, host, device_type (cuda|cpu),
device_index, device_error, gpu_uuid, gpu_name, visible_count, cuda_visible_devices,
slurm_gpus_var and slurm_gpus (the GPUs SLURM allocated, as it lists them).
"""

from __future__ import annotations

from collections import defaultdict

from gpudoctor.model import Severity, manual
from gpudoctor.sample_train.judge.findings import make, ranks_text, visible_text


def check(joins: dict[int, dict]) -> list:
    records = [joins[r] for r in sorted(joins)]
    types = {r["device_type"] for r in records}
    if types == {"cpu"}:
        reason = "CPU run: there are no GPUs to place"
        return [make("GD-SMOKE-002", Severity.SKIP, reason), make("GD-SMOKE-003", Severity.SKIP, reason)]
    blind = [r for r in records if r.get("no_cuda")]
    findings = [_shared_gpus(records), _outside_allocation([r for r in records if not r.get("no_cuda")], types)]
    if blind:
        findings.insert(
            0,
            make(
                "GD-SMOKE-012",
                Severity.FAIL,
                f"{ranks_text(r['rank'] for r in blind)} on {', '.join(sorted({r['host'] for r in blind}))}: torch "
                f"sees no CUDA GPU ({visible_text(blind[0].get('cuda_visible_devices'))}, "
                f"torch {blind[0].get('torch')})",
                ranks=[r["rank"] for r in blind],
                next="run `gpudoctor check` there for the cause, or pass --device cpu to test the CPU/gloo path",
            ),
        )
    return findings


def _where(r: dict) -> str:
    return f"rank {r['rank']} (host {r['host']}, local rank {r['local_rank']})"


def _gpu_identity(r: dict) -> str | None:
    """The GPU's UUID; else its PCI address on its host (older torch builds report no UUID)."""
    if r.get("gpu_uuid"):
        return r["gpu_uuid"]
    if r.get("pci_bus_id"):
        return f"{r['host']} PCI {r['pci_bus_id']}"
    return None


def _shared_gpus(records: list[dict]):
    by_uuid = defaultdict(list)
    unknown = []
    for r in records:
        if r.get("device_error"):
            continue  # no GPU at all: GD-SMOKE-003 reports it
        identity = _gpu_identity(r)
        if identity:
            by_uuid[identity].append(r)
        else:
            unknown.append(r["rank"])
    shared = {u: rs for u, rs in by_uuid.items() if len(rs) > 1}
    if not shared and unknown:
        return make(
            "GD-SMOKE-002",
            Severity.INFO,
            f"cannot tell whether ranks share a GPU: torch reported neither a UUID nor a PCI address for "
            f"{ranks_text(unknown)}",
            ranks=unknown,
        )
    if not shared:
        return make("GD-SMOKE-002", Severity.PASS, f"{len(by_uuid)} ranks on {len(by_uuid)} distinct GPUs")
    parts = [f"{ranks_text(r['rank'] for r in rs)} on {rs[0]['host']} all use {u}" for u, rs in shared.items()]
    sample = next(iter(shared.values()))[0]
    return make(
        "GD-SMOKE-002",
        Severity.FAIL,
        "; ".join(parts) + ". NCCL cannot run two ranks of one communicator on one GPU: the run would hang or "
        "fail at the first all-reduce. Give each task its own GPU (e.g. --gpus-per-task=1 or "
        "--ntasks-per-node equal to the GPUs per node, with --gres=gpu:N) or launch one process per node "
        "with torchrun --nproc-per-node N.",
        fix=manual("Give each rank its own GPU", "srun --ntasks-per-node=N --gpus-per-task=1 ..."),
        shared={u: [r["rank"] for r in rs] for u, rs in shared.items()},
        cuda_visible_devices=sample.get("cuda_visible_devices"),
    )


def _outside_allocation(records: list[dict], types: set):
    fails, warns, evidence = [], [], {}
    if len(types) > 1:
        cpu_ranks = [r["rank"] for r in records if r["device_type"] == "cpu"]
        fails.append(f"{ranks_text(cpu_ranks)} run on the CPU while the others use GPUs")
    for r in records:
        if r.get("device_error"):
            fails.append(f"{_where(r)}: {r['device_error']}")
            evidence[f"rank{r['rank']}"] = {
                "cuda_visible_devices": r.get("cuda_visible_devices"),
                "visible": r.get("visible_count"),
            }
            continue
        allocated = r.get("slurm_gpus")
        if allocated is None or r.get("visible_count") is None or r["visible_count"] <= len(allocated):
            continue
        # SLURM's lists are global ids, CUDA's are renumbered under cgroups: compare counts only.
        where = (
            f"{_where(r)} sees {r['visible_count']} GPUs (CUDA_VISIBLE_DEVICES={r.get('cuda_visible_devices')}) "
            f"but SLURM allocated {len(allocated)} ({r['slurm_gpus_var']}={','.join(allocated)})"
        )
        evidence[f"rank{r['rank']}"] = {
            "visible": r["visible_count"],
            r["slurm_gpus_var"]: allocated,
            "device_index": r["device_index"],
        }
        if r["device_index"] >= len(allocated):
            fails.append(where + f", and it runs on cuda:{r['device_index']}, beyond its allocation")
        else:
            warns.append(where + ": it may share a GPU with another job")
    if not fails and not warns:
        return make("GD-SMOKE-003", Severity.PASS, "every rank runs on a GPU within what its launcher gave it")
    tail = (
        " A CUDA_VISIBLE_DEVICES set by hand inside a SLURM job overrides SLURM's assignment; leave it to SLURM."
        if any(r.get("slurm_gpus") for r in records)
        else ""
    )
    severity = Severity.FAIL if fails else Severity.WARN
    return make("GD-SMOKE-003", severity, "; ".join(fails + warns) + "." + tail, **evidence)
