"""nccl checks of peer-to-peer transfers between GPUs: disabled over NVLink, or on consumer GPUs where they hang."""

from __future__ import annotations

from typing import Any

from gpudoctor.job.env import job_env
from gpudoctor.model import info, passed, set_env, skip, unset_env, warn
from gpudoctor.readers.cudavis import from_facts as visible_devices
from gpudoctor.readers.ncclenv import (
    p2p_disabled,
)
from gpudoctor.registry import check


def _nvlink_gpus(facts) -> list[int]:
    vis = visible_devices(facts)
    indices = set(vis.gpus) if vis.gpus is not None else {g.get("index") for g in facts.gpus}
    return sorted(
        g["index"]
        for g in facts.gpus
        if g.get("index") in indices and any(link.get("active") for link in g.get("nvlink") or [])
    )


@check(
    id="GD-NCCL-004",
    name="nccl-p2p-disabled-on-nvlink",
    category="nccl",
    title="NCCL may use NVLink between this node's GPUs",
    needs=["env", "nvidia"],
    scope="node",
    what="Looks for NCCL_P2P_DISABLE=1 or NCCL_P2P_LEVEL=LOC (P2P off) when the visible GPUs have active NVLink links.",
    why="P2P is the transport that uses NVLink. With it off, NCCL moves every intra-node all-reduce through "
    "host shared memory, an order of magnitude less bandwidth than NVLink on A100/H100 boards. The "
    "setting is a common workaround copied from consumer-GPU machines whose PCIe P2P hangs; there it "
    "helps, on NVLink machines it only costs.",
    fix="Unset NCCL_P2P_DISABLE (and NCCL_P2P_LEVEL=LOC) on NVLink machines.",
)
def nccl_p2p_disabled_on_nvlink(facts, ctx):
    env = job_env(facts, ctx)
    if not facts.nvidia.get("available"):
        return skip("no NVIDIA driver (see GD-DRV-001)")
    setting = p2p_disabled(env)
    linked = _nvlink_gpus(facts)
    evidence: dict[str, Any] = {
        "NCCL_P2P_DISABLE": env.get("NCCL_P2P_DISABLE"),
        "NCCL_P2P_LEVEL": env.get("NCCL_P2P_LEVEL"),
        "nvlink_gpus": linked,
    }
    if setting is None:
        return passed("NCCL's P2P transport is not disabled", **evidence)
    name = setting.split("=", 1)[0]
    if len(linked) >= 2:
        return warn(
            f"{setting} turns off NCCL's P2P transport, but GPUs {', '.join(map(str, linked))} are connected by "
            "NVLink: intra-node all-reduce falls back to host shared memory, many times slower",
            unset_env(name),
            **evidence,
        )
    return info(
        f"{setting}: P2P over PCIe is off (no NVLink between the visible GPUs). Slower, but a known workaround "
        "where PCIe peer access hangs (consumer GPUs, some VMs); remove it if collectives work without it",
        **evidence,
    )


_GEFORCE = ("GeForce", "TITAN")


# Driver branches on which consumer GPUs report PCIe P2P as available while NCCL over it hangs, each with its report.
# 535 is left out on purpose: on the RTX 3090 of NVIDIA/nccl#1127 going back from 545 to 535 fixed the hang.
_P2P_HANG_BRANCHES = (
    (520, 529, "RTX 4090 with driver 525: all_reduce_perf hangs in cudaStreamQuery (NVIDIA/nccl-tests#117)"),
    (
        545,
        569,
        "RTX 3090 with 545 (535 works, NVIDIA/nccl#1127); NCCL hangs reproduced with 560, fixed with 570 "
        "(dmlc/xgboost#11242)",
    ),
)


def p2p_hang_report(branch: int) -> str | None:
    """The report of P2P hangs on consumer GPUs for this driver branch (major version), if there is one."""
    return next((why for low, high, why in _P2P_HANG_BRANCHES if low <= branch <= high), None)


@check(
    id="GD-NCCL-011",
    name="nccl-p2p-on-consumer-gpus",
    category="nccl",
    title="NCCL peer-to-peer over PCIe on GeForce GPUs is known to work with this driver",
    needs=["env", "nvidia"],
    requires=["job-gpus"],
    what="For jobs on two or more GeForce/TITAN GPUs whose driver reports PCIe peer-to-peer as supported, reads "
    "the driver branch and NCCL_P2P_DISABLE / NCCL_P2P_LEVEL.",
    why="On consumer GPUs, drivers that report PCIe P2P as available while it does not work make NCCL hang at the "
    "first all-reduce or return wrong data: RTX 4090 with the 525 branch (NVIDIA/nccl-tests#117), RTX 3090 with "
    "545 where 535 works (NVIDIA/nccl#1127), hangs reproduced with 560 and fixed with 570 (dmlc/xgboost#11242). "
    "Branches 520-529 and 545-569 are judged bad; nvidia-smi shows nothing wrong.",
    fix="Upgrade the driver (570 or newer), or set NCCL_P2P_DISABLE=1 (NCCL then copies through host memory) and "
    "confirm with nccl-tests' all_reduce_perf.",
)
def nccl_p2p_on_consumer_gpus(facts, ctx):
    from gpudoctor import versions
    from gpudoctor.readers.cudavis import job_gpus

    gpus = job_gpus(facts)
    consumer = [g for g in gpus if any(w.lower() in (g.get("name") or "").lower() for w in _GEFORCE)]
    env = job_env(facts, ctx)
    driver = facts.nvidia.get("driver_version")
    evidence: dict[str, Any] = {
        "gpus": {g["index"]: g.get("name") for g in consumer},
        "driver_version": driver,
        "NCCL_P2P_DISABLE": env.get("NCCL_P2P_DISABLE"),
        "NCCL_P2P_LEVEL": env.get("NCCL_P2P_LEVEL"),
    }
    if len(consumer) < 2:
        return passed("fewer than two GeForce/TITAN GPUs in the job", **evidence)
    idx = {g["index"] for g in consumer}
    pairs = [p for p in (facts.nvidia.get("p2p") or {}).get("pairs") or [] if set(p.get("gpus") or []) <= idx]
    pcie_ok = [p for p in pairs if p.get("read") == "ok" and p.get("nvlink") != "ok"]
    evidence["pcie_p2p_pairs"] = [p["gpus"] for p in pcie_ok]
    if p2p_disabled(env):
        return passed(f"{p2p_disabled(env)}: NCCL does not use peer-to-peer between the GeForce GPUs", **evidence)
    if not pairs:
        return skip("the driver's P2P status between the GPUs was not probed (older snapshot)", **evidence)
    if not pcie_ok:
        return passed(
            "the driver reports no PCIe peer-to-peer between these GeForce GPUs: NCCL copies through host memory",
            **evidence,
        )
    branch = (versions.parse(driver) or (0,))[0]
    fix = set_env("NCCL_P2P_DISABLE", "1", title="Turn NCCL peer-to-peer off (or upgrade the driver to 570+)")
    report = p2p_hang_report(branch)
    if report:
        return warn(
            f"driver {driver} reports PCIe P2P between GeForce GPUs {sorted(idx)}: on the {branch} branch NCCL hangs "
            f"or corrupts data over consumer-GPU P2P ({report})",
            fix,
            report=report,
            **evidence,
        )
    return info(
        f"driver {driver} reports PCIe P2P between GeForce GPUs {sorted(idx)}; if NCCL hangs at the first all-reduce, "
        "try NCCL_P2P_DISABLE=1",
        None,
        **evidence,
    )
