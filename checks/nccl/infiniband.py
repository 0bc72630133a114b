"""nccl checks of the inter-node transport: InfiniBand ports that are there, up, and used."""

from __future__ import annotations

from dataclasses import replace

from gpudoctor.checks.nccl._interfaces import ib_ports, port_name
from gpudoctor.job.env import job_env
from gpudoctor.job.layout import layout
from gpudoctor.model import info, manual, passed, skip, unset_env, warn
from gpudoctor.readers.ncclenv import (
    hca_port_selected,
    nccl_flag,
    select_names,
)
from gpudoctor.registry import check


def _inter_node_outcome(env: dict, ports: list[dict], active: list[dict]):
    ib_disable = env.get("NCCL_IB_DISABLE")
    net = (env.get("NCCL_NET") or "").strip().lower()
    if active and ib_disable is not None and nccl_flag(env, "NCCL_IB_DISABLE") != 0:
        return warn(
            f"NCCL_IB_DISABLE={ib_disable} but {len(active)} InfiniBand/RoCE port(s) are active "
            f"({', '.join(map(port_name, active))}): "
            "inter-node all-reduce goes over TCP sockets instead, typically several times slower",
            unset_env("NCCL_IB_DISABLE"),
        )
    if active and net == "socket":
        return warn(
            f"NCCL_NET={env['NCCL_NET']} forces TCP sockets although InfiniBand/RoCE ports are active",
            unset_env("NCCL_NET"),
        )
    hca = env.get("NCCL_IB_HCA")
    if active and hca and not select_names(hca, sorted({p["device"] for p in active})):
        return warn(
            f"NCCL_IB_HCA={hca!r} selects none of the active devices "
            f"({', '.join(sorted({p['device'] for p in active}))}): NCCL falls back to TCP sockets",
            unset_env("NCCL_IB_HCA"),
        )
    if ports and not active:
        states = ", ".join(f"{port_name(p)} {p.get('state')}" for p in ports)
        return warn(
            f"this host has InfiniBand/RoCE ports but none is ACTIVE ({states}): NCCL will send inter-node traffic "
            "over TCP sockets",
            manual("Check the fabric: port state, cable, subnet manager", "ibstat"),
        )
    if not ports:
        note = " (NCCL_IB_DISABLE=1 is harmless here, but not needed)" if ib_disable else ""
        return info(f"no InfiniBand/RoCE ports on this host: NCCL sends inter-node traffic over TCP sockets{note}")
    return passed(f"NCCL can use {len(active)} active InfiniBand/RoCE port(s) between nodes")


@check(
    id="GD-NCCL-003",
    name="nccl-inter-node-falls-back-to-sockets",
    category="nccl",
    title="NCCL uses InfiniBand/RoCE between nodes where the host has it",
    needs=["env", "network"],
    requires="several-hosts",
    scope="node",
    what="On a multi-node job, compares the host's InfiniBand/RoCE ports (/sys/class/infiniband) with "
    "NCCL_IB_DISABLE, NCCL_NET and NCCL_IB_HCA. Single-node jobs are not affected: NCCL uses NVLink, PCIe "
    "or shared memory inside a node.",
    why="With IB disabled (or no port ACTIVE, or NCCL_IB_HCA naming the wrong devices) NCCL silently falls back "
    "to TCP sockets, which are typically several times slower than InfiniBand for gradient all-reduce. "
    "Guides that say 'export NCCL_IB_DISABLE=1' mean hosts without InfiniBand, where NCCL falls back by "
    "itself anyway; on an InfiniBand cluster the same line costs most of the inter-node bandwidth.",
    fix="Unset NCCL_IB_DISABLE (and NCCL_NET=Socket) on hosts with active InfiniBand/RoCE ports; check ports "
    "that are not ACTIVE with `ibstat`.",
)
def nccl_inter_node_falls_back_to_sockets(facts, ctx):
    env = job_env(facts, ctx)
    lay = layout(facts, ctx)
    ports = ib_ports(facts)
    active = [p for p in ports if str(p.get("state") or "").upper() == "ACTIVE"]
    evidence = {
        "NCCL_IB_DISABLE": env.get("NCCL_IB_DISABLE"),
        "NCCL_NET": env.get("NCCL_NET"),
        "NCCL_IB_HCA": env.get("NCCL_IB_HCA"),
        "ib_ports": {
            port_name(p): f"{p.get('state')} {p.get('link_layer') or ''} {p.get('rate') or ''}".strip() for p in ports
        },
        **lay.evidence(),
    }
    if facts.network.get("error"):
        return skip(f"the network probe failed: {facts.network['error']}", **evidence)
    outcome = _inter_node_outcome(env, ports, active)
    return replace(outcome, evidence=evidence)


def _rate_gbps(rate: str | None) -> float | None:
    try:
        return float(str(rate).split()[0])
    except (ValueError, IndexError):
        return None


@check(
    id="GD-NCCL-009",
    name="ib-port-down-on-multi-node-job",
    category="nccl",
    title="Every InfiniBand/RoCE rail of a multi-node job is ACTIVE at full rate",
    needs=["env", "network", "nvidia"],
    requires="several-hosts",
    scope="node",
    what="On a multi-node job where NCCL uses InfiniBand/RoCE (NCCL_IB_DISABLE and NCCL_NET=Socket unset), compares "
    "the ports NCCL may use (all, or those NCCL_IB_HCA selects, read as NCCL does: prefixes, '=' exact names, "
    "':port', '^' exclusions) of one link layer, from /sys/class/infiniband/*/ports/*/{state,phys_state,rate}: "
    "ports that are not ACTIVE while others are, and ACTIVE ports at a lower rate than the others.",
    why="NCCL takes only the ports ACTIVE when it starts (ncclIbInit in NCCL's src/transport/net_ib.cc skips the "
    "others) and pairs each GPU with its nearest NIC; with one rail down its GPUs' traffic "
    "crosses PCIe/CPU to another NIC and shares it, and the all-reduce of the whole job runs at the pace of the "
    "slowest rail (NCCL docs, NCCL_IB_HCA; `ibstat`). A port that negotiated a lower rate (a bad cable) does the same.",
    fix="Check the port with `ibstat` / `ibstatus` (cable, switch port, subnet manager); drain the node until the "
    "rail is back, or restrict NCCL_IB_HCA to the healthy ports knowingly.",
)
def ib_port_down_on_multi_node_job(facts, ctx):
    env = job_env(facts, ctx)
    lay = layout(facts, ctx)
    if facts.network.get("error"):
        return skip(f"the network probe failed: {facts.network['error']}")
    if nccl_flag(env, "NCCL_IB_DISABLE") != 0 or str(env.get("NCCL_NET") or "").lower() == "socket":
        return skip(
            "NCCL does not use InfiniBand/RoCE here (NCCL_IB_DISABLE / NCCL_NET=Socket; see GD-NCCL-003)",
            NCCL_IB_DISABLE=env.get("NCCL_IB_DISABLE"),
            NCCL_NET=env.get("NCCL_NET"),
        )
    hca = env.get("NCCL_IB_HCA")
    ports = [p for p in ib_ports(facts) if hca_port_selected(hca, str(p.get("device")), p.get("port"))]
    ports = [p for p in ports if str(p.get("phys_state") or "").lower() != "disabled"]  # switched off on purpose
    from gpudoctor.readers.cudavis import job_gpus

    gpus = len(job_gpus(facts))
    evidence = {
        "ports": {
            port_name(p): f"{p.get('state')} {p.get('rate') or ''} {p.get('link_layer') or ''}".strip() for p in ports
        },
        "NCCL_IB_HCA": hca,
        "gpus": gpus,
        **lay.evidence(),
    }
    problems = []
    for layer in sorted({str(p.get("link_layer") or "?") for p in ports}):
        group = [p for p in ports if str(p.get("link_layer") or "?") == layer]
        active = [p for p in group if str(p.get("state") or "").upper() == "ACTIVE"]
        down = [p for p in group if p not in active]
        if not active:
            continue  # no rail at all: GD-NCCL-003 says so
        # A rail-optimised node has a NIC per GPU; an extra, uncabled port beside as many rails as GPUs is no loss.
        if down and (hca or len(active) < max(gpus, 2)):
            names = ", ".join(f"{port_name(p)} {p.get('state')}" for p in down)
            problems.append(f"{layer} port(s) {names} not ACTIVE while {len(active)} are")
        rates = {port_name(p): _rate_gbps(p.get("rate")) for p in active}
        best = max((r for r in rates.values() if r), default=None)
        slow = [f"{n} {r:g} Gb/s" for n, r in rates.items() if r and best and r < best]
        if slow:
            problems.append(f"{layer} port(s) at a lower rate than the others ({best:g} Gb/s): {', '.join(slow)}")
    if problems:
        return warn(
            "; ".join(problems) + ": this node's share of the all-reduce runs on fewer or slower rails",
            manual("Check the ports (cable, switch, subnet manager)", "ibstat"),
            **evidence,
        )
    return passed(
        f"{sum(1 for p in ports if str(p.get('state') or '').upper() == 'ACTIVE')} InfiniBand/RoCE port(s) ACTIVE, "
        "none down or slow",
        **evidence,
    )
