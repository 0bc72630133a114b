"""nccl checks: NCCL in torch, and the NCCL_* / TORCH_NCCL_* variables read the way NCCL and torch read them.

How NCCL and torch read these variables: gpudoctor/readers/ncclenv.py (sources cited there).
"""

from __future__ import annotations

import re
from dataclasses import replace

from gpudoctor.job.env import job_env
from gpudoctor.job.layout import layout, mark_several_hosts, several_hosts_only
from gpudoctor.job.target import in_job_environment
from gpudoctor.model import fail, info, manual, passed, set_env, skip, unset_env, warn
from gpudoctor.readers.cudavis import from_facts as visible_devices
from gpudoctor.readers.ncclenv import (
    NCCL_DEBUG_LEVELS,
    hca_port_selected,
    name_matches,
    nccl_flag,
    nccl_problems,
    p2p_disabled,
    parse_prefix_list,
    select_names,
    torch_nccl_problems,
)
from gpudoctor.registry import check


def _usable_interfaces(facts) -> list[dict]:
    """Interfaces NCCL's socket code can use: up, with an IPv4/IPv6 address."""
    return [i for i in facts.network.get("interfaces") or [] if i.get("up") and i.get("addresses")]


_CONTAINER_BRIDGES = ("docker", "veth", "virbr", "br-", "cni", "flannel", "cali")


def _host_local_only(iface: dict) -> bool:
    return bool(iface.get("loopback")) or iface["name"].startswith(_CONTAINER_BRIDGES)


# --- GD-NCCL-001 ---------------------------------------------------------------------------


@check(
    id="GD-NCCL-001",
    name="nccl-missing-in-torch",
    category="nccl",
    title="torch has NCCL for multi-GPU training",
    needs=["torch", "env"],
    requires=["torch", "gpus-expected"],
    what="When the job runs more than one process on GPUs, torch must be built with torch.distributed "
    "and NCCL (torch.distributed.is_nccl_available()).",
    why="init_process_group('nccl') on a torch without NCCL raises 'Distributed package doesn't have NCCL "
    "built in' on every rank, after the allocation has started.",
    fix="Install a CUDA build of torch from download.pytorch.org (the Linux CUDA wheels ship NCCL), not a "
    "CPU-only or source build without USE_NCCL=1.",
)
def nccl_missing_in_torch(facts, ctx):
    t = facts.torch
    lay = layout(facts, ctx)
    evidence = {
        "torch": t.get("version"),
        "nccl": _fmt_nccl(t.get("nccl")),
        "nccl_available": t.get("nccl_available"),
        **lay.evidence(),
    }
    if not lay.multi_process:
        return skip(
            "a single process (no WORLD_SIZE, LOCAL_WORLD_SIZE or SLURM task layout above 1): NCCL is not used",
            **evidence,
        )
    if not t.get("cuda") and not t.get("hip"):
        return skip("torch is a CPU-only build (see the cuda checks)", **evidence)
    fix = manual(
        "Install a CUDA build of torch", "pip install torch --index-url https://download.pytorch.org/whl/cu124"
    )
    if t.get("distributed_available") is False:
        return fail(
            f"torch {t.get('version')} was built without torch.distributed: a multi-process job cannot start",
            fix,
            **evidence,
        )
    if not t.get("nccl_available"):
        return fail(
            f"torch {t.get('version')} has no NCCL: init_process_group('nccl') raises \"Distributed package doesn't "
            'have NCCL built in"',
            fix,
            **evidence,
        )
    return passed(f"torch {t.get('version')} has NCCL {_fmt_nccl(t.get('nccl'))}", **evidence)


def _fmt_nccl(v) -> str:
    return ".".join(str(p) for p in v) if isinstance(v, (list, tuple)) and v else "?"


# --- GD-NCCL-002 ---------------------------------------------------------------------------


@check(
    id="GD-NCCL-002",
    name="nccl-socket-ifname-matches-nothing",
    category="nccl",
    title="NCCL_SOCKET_IFNAME selects a usable network interface",
    needs=["env", "network"],
    scope="node",
    what="Applies NCCL_SOCKET_IFNAME the way NCCL does (comma-separated prefixes, '^' to exclude, '=' for "
    "exact names) to this host's interfaces that are up and have an IP address. On a multi-node job the "
    "selection must include an interface other nodes can reach (not only loopback or container bridges).",
    why="NCCL's bootstrap uses these interfaces even on one node: if none matches, every communicator fails "
    "with 'Bootstrap : no socket interface found'. Selecting only 'lo' on a multi-node job makes ranks "
    "connect to themselves and hang until the timeout. Interface names differ between machines, so a "
    "value copied from another cluster often matches nothing.",
    fix="Name an interface this host has (see `ip -br addr`), e.g. NCCL_SOCKET_IFNAME=eth0 or a prefix such "
    "as 'ib' or 'en'; or unset it and let NCCL choose.",
)
def nccl_socket_ifname_matches_nothing(facts, ctx):
    value = job_env(facts, ctx).get("NCCL_SOCKET_IFNAME")
    usable = _usable_interfaces(facts)
    evidence = {"NCCL_SOCKET_IFNAME": value, "interfaces": {i["name"]: i.get("addresses") for i in usable}}
    if value is None:
        return skip(
            "NCCL_SOCKET_IFNAME is not set: NCCL chooses interfaces itself (preferring ib*, avoiding lo and docker*)",
            **evidence,
        )
    if facts.network.get("error"):
        return skip(f"the network probe failed: {facts.network['error']}", **evidence)
    lay = layout(facts, ctx)
    evidence.update(lay.evidence())
    chosen = select_names(value, [i["name"] for i in usable])
    evidence["selected"] = chosen
    if not chosen:
        msg = (
            f"NCCL_SOCKET_IFNAME={value!r} selects none of this host's usable interfaces "
            f"({', '.join(evidence['interfaces']) or 'none'}): NCCL fails with 'no socket interface found'"
        )
        # In the job's own environment (an allocation, or rank variables set) NCCL will run here: it fails.
        in_job = in_job_environment(job_env(facts, ctx))
        sev = fail if (in_job or lay.multi_process) and ctx.gpus_expected else warn
        return sev(msg, unset_env("NCCL_SOCKET_IFNAME"), **evidence)
    reachable = [i["name"] for i in usable if i["name"] in chosen and not _host_local_only(i)]
    if lay.multi_node and not reachable:
        return mark_several_hosts(
            fail(
                f"NCCL_SOCKET_IFNAME={value!r} selects only {', '.join(chosen)} on a {lay.nodes.value}-node job: "
                "loopback and container bridges are not reachable from other nodes",
                unset_env("NCCL_SOCKET_IFNAME"),
                **evidence,
            )
        )
    exclude, exact, entries = parse_prefix_list(value)
    unmatched = [] if exclude else [e for e in entries if not _matches_any(e, usable, exact)]
    if unmatched:
        return info(
            f"NCCL_SOCKET_IFNAME={value!r} selects {', '.join(chosen)}; "
            f"{', '.join(unmatched)} matches no interface here",
            **evidence,
        )
    return passed(f"NCCL_SOCKET_IFNAME={value!r} selects {', '.join(chosen)}", **evidence)


def _matches_any(entry: str, usable: list[dict], exact: bool) -> bool:
    return any(name_matches(i["name"], [entry], exact) for i in usable)


# --- GD-NCCL-003 ---------------------------------------------------------------------------


def _ib_ports(facts) -> list[dict]:
    """Ports NCCL's IB transport can use (InfiniBand or RoCE); AWS EFA goes through its own plug-in."""
    return [p for p in facts.network.get("infiniband") or [] if not str(p.get("device", "")).startswith("efa")]


def _port_name(p: dict) -> str:
    return f"{p.get('device')}:{p.get('port')}"


def _inter_node_outcome(env: dict, ports: list[dict], active: list[dict]):
    ib_disable = env.get("NCCL_IB_DISABLE")
    net = (env.get("NCCL_NET") or "").strip().lower()
    if active and ib_disable is not None and nccl_flag(env, "NCCL_IB_DISABLE") != 0:
        return warn(
            f"NCCL_IB_DISABLE={ib_disable} but {len(active)} InfiniBand/RoCE port(s) are active "
            f"({', '.join(map(_port_name, active))}): "
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
        states = ", ".join(f"{_port_name(p)} {p.get('state')}" for p in ports)
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
@several_hosts_only
def nccl_inter_node_falls_back_to_sockets(facts, ctx):
    env = job_env(facts, ctx)
    lay = layout(facts, ctx)
    ports = _ib_ports(facts)
    active = [p for p in ports if str(p.get("state") or "").upper() == "ACTIVE"]
    evidence = {
        "NCCL_IB_DISABLE": env.get("NCCL_IB_DISABLE"),
        "NCCL_NET": env.get("NCCL_NET"),
        "NCCL_IB_HCA": env.get("NCCL_IB_HCA"),
        "ib_ports": {
            _port_name(p): f"{p.get('state')} {p.get('link_layer') or ''} {p.get('rate') or ''}".strip() for p in ports
        },
        **lay.evidence(),
    }
    if facts.network.get("error"):
        return skip(f"the network probe failed: {facts.network['error']}", **evidence)
    if not lay.multi_node:
        nodes = lay.nodes.value or "unknown"
        return skip(
            f"not a multi-node job (nodes: {nodes}): inside a node NCCL uses NVLink, PCIe or shared memory", **evidence
        )
    outcome = _inter_node_outcome(env, ports, active)
    return replace(outcome, evidence=evidence)


# --- GD-NCCL-004 ---------------------------------------------------------------------------


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
    evidence = {
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


# --- GD-NCCL-005 ---------------------------------------------------------------------------


@check(
    id="GD-NCCL-005",
    name="nccl-debug-logging-left-on",
    category="nccl",
    title="NCCL debug logging off for production runs",
    needs=["env"],
    scope="job",
    what="Reads NCCL_DEBUG and NCCL_DEBUG_SUBSYS.",
    why="NCCL_DEBUG=INFO prints dozens of lines per rank at every communicator set-up: right for debugging a "
    "hang, noise in a long run. With NCCL_DEBUG_SUBSYS including COLL (or ALL), NCCL logs every "
    "collective: millions of lines and measurable overhead. WARN is the level for production.",
    fix="export NCCL_DEBUG=WARN (or unset it) once the set-up works; keep INFO only while debugging.",
)
def nccl_debug_logging_left_on(facts, ctx):
    env = job_env(facts, ctx)
    value = env.get("NCCL_DEBUG")
    subsys = env.get("NCCL_DEBUG_SUBSYS") or ""
    evidence = {
        "NCCL_DEBUG": value,
        "NCCL_DEBUG_SUBSYS": env.get("NCCL_DEBUG_SUBSYS"),
        "NCCL_DEBUG_FILE": env.get("NCCL_DEBUG_FILE"),
    }
    level = (value or "").strip().upper()
    if value is None or level in ("VERSION", "WARN", "ABORT"):
        return passed(f"NCCL_DEBUG={value or 'unset'}", **evidence)
    if level not in NCCL_DEBUG_LEVELS:
        return passed(
            f"NCCL_DEBUG={value!r} is not a level NCCL knows, so it logs nothing (see GD-NCCL-006)", **evidence
        )
    per_collective = {s.strip().upper() for s in subsys.lstrip("^").split(",")} & {
        "COLL",
        "ALL",
    } and not subsys.startswith("^")
    where = f" to {env['NCCL_DEBUG_FILE']}" if env.get("NCCL_DEBUG_FILE") else ""
    if per_collective:
        return warn(
            f"NCCL_DEBUG={value} with NCCL_DEBUG_SUBSYS={subsys} logs "
            f"every collective{where}: huge logs and a slower run",
            set_env("NCCL_DEBUG", "WARN"),
            **evidence,
        )
    return info(
        f"NCCL_DEBUG={value} is on{where}: verbose set-up logs from "
        "every rank; fine while debugging, use WARN in production",
        set_env("NCCL_DEBUG", "WARN"),
        **evidence,
    )


# --- GD-NCCL-006 ---------------------------------------------------------------------------


@check(
    id="GD-NCCL-006",
    name="nccl-env-malformed",
    category="nccl",
    title="NCCL_* and TORCH_NCCL_* values are ones NCCL and torch understand",
    needs=["env"],
    scope="job",
    what="Reads the NCCL_* variables as NCCL parses them (integers with C's strtoll, case-sensitive path "
    "levels, NCCL_DEBUG levels) and torch's TORCH_NCCL_* variables as ProcessGroupNCCL does.",
    why="NCCL never rejects a bad value: 'NCCL_IB_DISABLE=true' reads as 0 and leaves InfiniBand on, "
    "'NCCL_BUFFSIZE=4MB' reads as 4 bytes, 'NCCL_P2P_LEVEL=nvl' is ignored. The setting looks applied and "
    "is not. torch is the opposite: a TORCH_NCCL_* boolean or integer it cannot parse makes "
    "init_process_group raise on every rank.",
    fix="Use plain integers for NCCL's numeric variables (1 to disable), upper-case path levels (NVL, PIX, "
    "SYS...), and 1/0 for TORCH_NCCL_* switches.",
)
def nccl_env_malformed(facts, ctx):
    env = job_env(facts, ctx)
    names = sorted(k for k in env if k.startswith(("NCCL_", "TORCH_NCCL_")))
    evidence = {k: env[k] for k in names}
    fatal, ignored = torch_nccl_problems(env), nccl_problems(env)
    fix = manual("Correct the values", *(f"env | grep {p.split('=', 1)[0]}" for p in (fatal + ignored)[:3]))
    if fatal:
        return fail("; ".join(fatal + ignored), fix, **evidence)
    if ignored:
        return warn("; ".join(ignored), fix, **evidence)
    if not names:
        return passed("no NCCL_* or TORCH_NCCL_* variables set", **evidence)
    return passed(f"{len(names)} NCCL variable(s) set, all well-formed", **evidence)


# --- issue 13: interface lists that select more than meant, rails down, virtual NICs, consumer-GPU P2P ----------


@check(
    id="GD-NCCL-007",
    name="nccl-socket-ifname-exclusion-keeps-loopback",
    category="nccl",
    title="An NCCL_SOCKET_IFNAME exclusion list still leaves out lo and container bridges",
    needs=["env", "network"],
    scope="node",
    what="For NCCL_SOCKET_IFNAME values that start with '^' (exclude), lists the interfaces still selected. NCCL's "
    "default ('^docker,lo') is replaced by the user's list, so lo and docker/virtual bridges are back in play.",
    why="NCCL takes the interfaces in the kernel's order and bootstraps over the first one that matches (NCCL "
    "maintainers on NVIDIA/nccl#286 and #519: the default is ^lo,docker; a user list replaces it). lo has "
    "interface index 1, so `NCCL_SOCKET_IFNAME=^eth1` makes a multi-node job bootstrap on 127.0.0.1 and hang; "
    "a docker or libvirt bridge has an address no other node can reach.",
    fix="Name the interface to use (NCCL_SOCKET_IFNAME=eth0, or '=eth0' for exactly that name), or add lo and "
    "docker to the exclusions: NCCL_SOCKET_IFNAME=^lo,docker,virbr,eth1.",
)
def nccl_socket_ifname_exclusion_keeps_loopback(facts, ctx):
    value = job_env(facts, ctx).get("NCCL_SOCKET_IFNAME")
    if value is None or not value.startswith("^"):
        return skip("NCCL_SOCKET_IFNAME is not an exclusion list ('^...')", NCCL_SOCKET_IFNAME=value)
    if facts.network.get("error"):
        return skip(f"the network probe failed: {facts.network['error']}")
    usable = _usable_interfaces(facts)
    chosen = select_names(value, [i["name"] for i in usable])
    local = [i["name"] for i in usable if i["name"] in chosen and _host_local_only(i)]
    lay = layout(facts, ctx)
    evidence = {"NCCL_SOCKET_IFNAME": value, "selected": chosen, "host_local_selected": local, **lay.evidence()}
    if not local:
        return passed(
            f"NCCL_SOCKET_IFNAME={value!r} selects {', '.join(chosen) or 'nothing'} (no loopback or bridge)", **evidence
        )
    if len(local) == len(chosen):
        return skip(
            f"NCCL_SOCKET_IFNAME={value!r} leaves only {', '.join(local)}: GD-NCCL-002 reports that", **evidence
        )
    fixed = "^" + ",".join(dict.fromkeys(["lo", "docker", *parse_prefix_list(value)[2]]))
    fix = set_env("NCCL_SOCKET_IFNAME", fixed, title="Exclude lo and docker too")
    if not lay.multi_node:
        return passed(
            f"NCCL_SOCKET_IFNAME={value!r} leaves {', '.join(local)} selected; harmless on one node", **evidence
        )
    return mark_several_hosts(_exclusion_keeps_host_local(value, usable, local, lay, fix, evidence))


def _exclusion_keeps_host_local(value, usable, local, lay, fix, evidence):
    if any(i["name"] == n and i.get("loopback") for i in usable for n in local):
        return fail(
            f"NCCL_SOCKET_IFNAME={value!r} replaces NCCL's default exclusions and leaves the loopback interface "
            f"selected ({', '.join(local)}): NCCL bootstraps over the first match, lo, and the "
            f"{lay.nodes.value}-node job hangs",
            fix,
            **evidence,
        )
    return warn(
        f"NCCL_SOCKET_IFNAME={value!r} leaves host-local bridge(s) {', '.join(local)} selected: NCCL may open "
        "connections on addresses other nodes cannot reach",
        fix,
        **evidence,
    )


def _prefix_overreach(value: str, names: list[str]) -> dict[str, list[str]]:
    """Entries of a non-'=' list that name an interface exactly but also prefix-match others: {entry: others}."""
    _, exact, entries = parse_prefix_list(value)
    if exact:
        return {}
    out = {}
    for e in entries:
        others = [n for n in names if n != e and n.startswith(e)]
        if e in names and others:
            out[e] = others
    return out


@check(
    id="GD-NCCL-008",
    name="nccl-name-list-prefix-matches-more",
    category="nccl",
    title="NCCL_SOCKET_IFNAME / NCCL_IB_HCA names select only the named devices",
    needs=["env", "network"],
    scope="node",
    what="Finds entries of NCCL_SOCKET_IFNAME and NCCL_IB_HCA that are the full name of an interface or HCA but, "
    "without the '=' prefix, also match longer names as a prefix: bond0 also selects bond0.2093, mlx5_1 also "
    "selects mlx5_10 to mlx5_17.",
    why="NCCL treats each entry as a prefix unless the list starts with '=' (NCCL docs, NCCL_SOCKET_IFNAME and "
    "NCCL_IB_HCA; NVIDIA/nccl#177 and nccl-tests#9: bond0 picking a VLAN sub-interface no other node can use). The "
    "job then uses HCAs or interfaces it was meant to avoid: traffic on the wrong rail, or a hang on an "
    "unroutable VLAN.",
    fix="Prefix the list with '=' for exact names (NCCL_SOCKET_IFNAME==bond0, NCCL_IB_HCA==mlx5_1; after '^' "
    "for exclusions: ^=bond0).",
)
def nccl_name_list_prefix_matches_more(facts, ctx):
    env = job_env(facts, ctx)
    if facts.network.get("error"):
        return skip(f"the network probe failed: {facts.network['error']}")
    lists = {
        "NCCL_SOCKET_IFNAME": [i["name"] for i in _usable_interfaces(facts)],
        "NCCL_IB_HCA": sorted({str(p.get("device")) for p in _ib_ports(facts)}),
    }
    set_vars = {k: env[k] for k in lists if env.get(k)}
    if not set_vars:
        return skip("neither NCCL_SOCKET_IFNAME nor NCCL_IB_HCA is set", **{k: None for k in lists})
    problems, fixes, evidence = [], [], dict(set_vars)
    for name, value in set_vars.items():
        over = _prefix_overreach(value, lists[name])
        if not over:
            continue
        exclude, _, entries = parse_prefix_list(value)
        verb = "excludes" if exclude else "selects"
        evidence[f"{name}_overreach"] = over
        problems.append(
            f"{name}={value!r} also {verb} " + "; ".join(f"{', '.join(o)} (prefix {e!r})" for e, o in over.items())
        )
        if all(e in lists[name] for e in entries):  # every entry an exact name: '=' keeps the meaning
            fixes.append(
                set_env(
                    name,
                    ("^" if exclude else "") + "=" + value[1 if exclude else 0 :],
                    title=f"Match {name} entries exactly",
                )
            )
    if not problems:
        return passed("every NCCL_SOCKET_IFNAME / NCCL_IB_HCA entry selects only what it names", **evidence)
    return warn(
        "; ".join(problems) + ": NCCL reads entries as prefixes unless the list starts with '='",
        fixes[0] if fixes else None,
        **evidence,
    )


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
@several_hosts_only
def ib_port_down_on_multi_node_job(facts, ctx):
    env = job_env(facts, ctx)
    lay = layout(facts, ctx)
    if facts.network.get("error"):
        return skip(f"the network probe failed: {facts.network['error']}")
    if not lay.multi_node:
        return skip(f"not a multi-node job (nodes: {lay.nodes.value or 'unknown'})", **lay.evidence())
    if nccl_flag(env, "NCCL_IB_DISABLE") != 0 or str(env.get("NCCL_NET") or "").lower() == "socket":
        return skip(
            "NCCL does not use InfiniBand/RoCE here (NCCL_IB_DISABLE / NCCL_NET=Socket; see GD-NCCL-003)",
            NCCL_IB_DISABLE=env.get("NCCL_IB_DISABLE"),
            NCCL_NET=env.get("NCCL_NET"),
        )
    hca = env.get("NCCL_IB_HCA")
    ports = [p for p in _ib_ports(facts) if hca_port_selected(hca, str(p.get("device")), p.get("port"))]
    ports = [p for p in ports if str(p.get("phys_state") or "").lower() != "disabled"]  # switched off on purpose
    from gpudoctor.readers.cudavis import job_gpus

    gpus = len(job_gpus(facts))
    evidence = {
        "ports": {
            _port_name(p): f"{p.get('state')} {p.get('rate') or ''} {p.get('link_layer') or ''}".strip() for p in ports
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
            names = ", ".join(f"{_port_name(p)} {p.get('state')}" for p in down)
            problems.append(f"{layer} port(s) {names} not ACTIVE while {len(active)} are")
        rates = {_port_name(p): _rate_gbps(p.get("rate")) for p in active}
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


# Interfaces NCCL's default list ('^docker,lo') still accepts but no other node can reach, or that are not the
# cluster network: libvirt/container/overlay bridges, VPN tunnels, the USB "host interface" of a BMC (usb0, 169.254.x).
_VIRTUAL_NICS = (
    "virbr",
    "veth",
    "br-",
    "cni",
    "flannel",
    "cali",
    "vxlan",
    "tailscale",
    "wg",
    "tun",
    "tap",
    "zt",
    "usb",
    "enx",
    "vmnet",
    "lxc",
    "podman",
    "kube",
)

# NCCL 2.28.3 (release notes; src/misc/socket.cc findInterfaces): interfaces without IFF_RUNNING are no longer
# candidates (NVIDIA/nccl#1798: an interface that is down was chosen) and virbr* is tried only after docker* and lo.
# Before it, any interface holding an address counted, up or not, a libvirt bridge included.
NCCL_SKIPS_DEAD_AND_VIRBR = (2, 28, 3)
# NCCL 2.29 inverted the subnet test that, with NCCL_COMM_ID set and no ib* interface, picks the interface in the
# COMM_ID address's subnet: the right one is refused and another (lo) bound (NVIDIA/nccl#2047; src/os/linux.cc
# matchSubnet, inverted in the v2.29.2-1..v2.29.7-1 tags, right again in v2.30.3-1).
NCCL_SUBNET_MATCH_INVERTED = ((2, 29, 0), (2, 30, 3))


def _virtual_nic(iface: dict) -> bool:
    name = iface["name"]
    link_local = all(a.startswith(("169.254.", "fe80:")) for a in iface.get("addresses") or [])
    return name.startswith(_VIRTUAL_NICS) or (link_local and not iface.get("loopback"))


def _running(iface: dict) -> bool:
    """IFF_RUNNING as getifaddrs reports it: up, and an operational state of up or unknown (no carrier: down)."""
    return bool(iface.get("up")) and iface.get("operstate") in (None, "up", "unknown")


def _nccl_version(facts) -> tuple[int, ...] | None:
    """The NCCL torch was built with (torch.cuda.nccl.version()); a 4th item is a suffix."""
    numbers = tuple(v for v in (facts.torch.get("nccl") or ())[:3] if isinstance(v, int))
    return numbers if len(numbers) == 3 else None


def nccl_default_interfaces(interfaces: list[dict], nccl: tuple[int, ...] | None) -> list[dict]:
    """The interfaces NCCL chooses among with NCCL_SOCKET_IFNAME unset, in the order it meets them (ncclFindInterfaces:
    ib* first, else all but docker*/lo*; getifaddrs lists IPv4 addresses first, by interface index). The bootstrap
    takes the first one. An unknown NCCL version is judged as the older, wider choice."""
    newer = nccl is not None and nccl >= NCCL_SKIPS_DEAD_AND_VIRBR
    ordered = [i for i in _socket_order(interfaces) if _running(i) or not newer]
    ib = [i for i in ordered if i["name"].startswith("ib")]
    if ib:
        return ib
    skipped = ("docker", "lo", "virbr") if newer else ("docker", "lo")
    return [i for i in ordered if not i.get("loopback") and not i["name"].startswith(skipped)]


def _unreachable(iface: dict, newer: bool) -> str | None:
    if _virtual_nic(iface):
        return "virtual, tunnel, USB or link-local"
    if not newer and not _running(iface):
        return f"no link ({iface.get('operstate') or 'down'})"
    return None


@check(
    id="GD-NCCL-010",
    name="nccl-default-interfaces-include-virtual-nics",
    category="nccl",
    title="NCCL's own interface choice cannot land on a virtual, USB or dead NIC",
    needs=["env", "network", "torch"],
    scope="node",
    what="With NCCL_SOCKET_IFNAME unset on a multi-node job, applies NCCL's default choice for torch's NCCL version "
    "(ib* interfaces first, else every interface with an address but lo* and docker*, in interface-index order; "
    "the bootstrap binds the first) and looks for libvirt/container/overlay bridges, VPN tunnels, USB NICs "
    "(enx*, usb0) and link-local-only ones (a BMC's 169.254.x.x) among the candidates, and, before NCCL 2.28.3, "
    "interfaces without link.",
    why="NCCL lists the interfaces with an address and picks the first that matches its filter (NCCL maintainers "
    "on NVIDIA/nccl#519: a veth with an IPv6 address was picked); the socket transport uses every match. An "
    "address on virbr0, a tunnel or a USB NIC is not reachable from the other nodes: bootstrap hangs or the "
    "all-reduce fails with 'connection refused' / timeouts (horovod#98 shows NCCL using docker0, br-* and veth*; "
    "uccl-project/uccl#1034: a GH200's link-local 169.254.3.1 NIC chosen, 'Connection refused' on two nodes). "
    "NCCL before 2.28.3 also takes interfaces that are down or have no carrier, and virbr* like any other "
    "(NVIDIA/nccl#1798; NCCL 2.28.3 release notes: only IFF_RUNNING interfaces, virbr* last). NCCL 2.29 with "
    "NCCL_COMM_ID set refuses the interface in that address's subnet and may bind lo (NVIDIA/nccl#2047, right "
    "again in 2.30.3).",
    fix="Set NCCL_SOCKET_IFNAME to the cluster interface (e.g. NCCL_SOCKET_IFNAME=eth0, or ib for IPoIB), or "
    "exclude the virtual ones: NCCL_SOCKET_IFNAME=^lo,docker,virbr,veth,usb.",
)
@several_hosts_only
def nccl_default_interfaces_include_virtual_nics(facts, ctx):
    env = job_env(facts, ctx)
    if env.get("NCCL_SOCKET_IFNAME") is not None:
        return skip("NCCL_SOCKET_IFNAME is set (see GD-NCCL-002/007/008)", NCCL_SOCKET_IFNAME=env["NCCL_SOCKET_IFNAME"])
    if facts.network.get("error"):
        return skip(f"the network probe failed: {facts.network['error']}")
    lay = layout(facts, ctx)
    if not lay.multi_node:
        return skip(
            f"not a multi-node job (nodes: {lay.nodes.value or 'unknown'}): one node needs no reachable interface",
            **lay.evidence(),
        )
    nccl = _nccl_version(facts)
    newer = nccl is not None and nccl >= NCCL_SKIPS_DEAD_AND_VIRBR
    candidates = nccl_default_interfaces(facts.network.get("interfaces") or [], nccl)
    bad = {i["name"]: why for i in candidates if (why := _unreachable(i, newer))}
    version = f"NCCL {'.'.join(map(str, nccl))}" if nccl else "NCCL (version unknown, judged as before 2.28.3)"
    evidence = {
        "nccl": version,
        "candidates": [i["name"] for i in candidates],
        "unreachable": bad,
        "virtual_or_usb": sorted(n for n, why in bad.items() if not why.startswith("no link")),
        **lay.evidence(),
    }
    low, fixed = NCCL_SUBNET_MATCH_INVERTED
    ib_first = bool(candidates) and candidates[0]["name"].startswith("ib")
    if env.get("NCCL_COMM_ID") and nccl and low <= nccl < fixed and not ib_first:
        real = [n for n in evidence["candidates"] if n not in bad]
        return warn(
            f"{version} with NCCL_COMM_ID={env['NCCL_COMM_ID']} and no ib* interface: this release's subnet match "
            "is inverted (NVIDIA/nccl#2047, right again in 2.30.3), so the bootstrap refuses the interface in "
            "NCCL_COMM_ID's subnet and may bind another one, lo included",
            set_env("NCCL_SOCKET_IFNAME", real[0], title="Name the interface")
            if real
            else manual("Set NCCL_SOCKET_IFNAME to the interface in NCCL_COMM_ID's subnet"),
            NCCL_COMM_ID=env["NCCL_COMM_ID"],
            **evidence,
        )
    if not bad:
        return passed(
            f"{version} would choose among {', '.join(evidence['candidates']) or 'no interface'}: "
            "no virtual, USB or dead NIC",
            **evidence,
        )
    real = [n for n in evidence["candidates"] if n not in bad]
    named = ", ".join(f"{n} ({why})" for n, why in bad.items())
    fix = set_env(
        "NCCL_SOCKET_IFNAME",
        real[0] if len(real) == 1 else "^lo,docker," + ",".join(sorted(set(bad))),
        title="Tell NCCL which interface to use",
    )
    first = evidence["candidates"][0]
    active_ib = [p for p in _ib_ports(facts) if str(p.get("state") or "").upper() == "ACTIVE"]
    if active_ib and real and first not in bad:
        # data goes over InfiniBand/RoCE; only the bootstrap uses the first socket interface, here a real one
        return info(
            f"NCCL_SOCKET_IFNAME is unset and {version}'s bootstrap candidates include {named} beside "
            f"{', '.join(real)}; with InfiniBand/RoCE active only the first one ({first}) is used - set "
            "NCCL_SOCKET_IFNAME if the bootstrap hangs",
            fix,
            **evidence,
        )
    where = f"its bootstrap binds {first}, the first of them" if first in bad else "its socket transport uses them all"
    return warn(
        f"NCCL_SOCKET_IFNAME is unset and {version}'s default choice includes {named} beside "
        f"{', '.join(real) or 'nothing else'}: {where}, and other nodes cannot reach it",
        fix,
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
    evidence = {
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


# NCCL 2.18.5 began keeping PCI devices under a CPU sorted by bus id (src/graph/xml.cc, "Issue #820"); the sort
# reads the 'busid' of every sibling, and the <nic> node NCCL hangs off the first CPU for a network device that is
# not on PCI (USB, virtio, virtual: ncclTopoFillNet, "is not a PCI device ... Attaching to first CPU") has none, so
# the next PCI device added there fails init with "Attribute busid of node nic not found" (NVIDIA/nccl#1125, a USB
# NIC on one node; fixed in v2.20.3-1, which skips siblings without a busid).
NCCL_TOPO_BUSID_SORT_BUG = ((2, 18, 5), (2, 20, 3))
_USB_NAME = re.compile(r"^(enx[0-9a-f]{12}|usb\d+|en\S*u\d+(?:u\d+)*)$")


def _not_on_pci(iface: dict) -> str | None:
    """Why NCCL's topology would hang this interface off the first CPU: its device is not on PCI."""
    if "bus" in iface:  # probed: the device's subsystem, as NCCL reads it
        bus = iface["bus"]
        return None if bus == "pci" else (f"a {bus} device" if bus else "no device (virtual)")
    if _USB_NAME.match(iface["name"]):  # older snapshots: systemd's names for USB NICs (enx<MAC>, ...u<port>)
        return "a USB NIC by its name"
    return None


@check(
    id="GD-NCCL-012",
    name="nccl-non-pci-nic-first-breaks-init",
    category="nccl",
    title="NCCL's socket devices do not start with a USB or virtual NIC (NCCL 2.18.5-2.20.2 init failure)",
    needs=["env", "network", "torch"],
    scope="node",
    what="For torch's NCCL between 2.18.5 and 2.20.2, when NCCL would use TCP sockets (no active InfiniBand/RoCE "
    "port, or NCCL_IB_DISABLE / NCCL_NET=Socket), lists the interfaces NCCL's socket transport takes, in its own "
    "order (NCCL_SOCKET_IFNAME, else ib* first, else all but lo*/docker* in getifaddrs order) and reads the bus "
    "of each one's device (/sys/class/net/<if>/device/subsystem): a USB (enx*, usb0), virtio or deviceless NIC "
    "before a PCI one is flagged, on one node as on several.",
    why="NCCL adds every socket device to its topology at communicator init, on a single node too. A device that "
    "is not on PCI is hung off the first CPU as a <nic> without a bus id; from 2.18.5 NCCL keeps the PCI devices "
    "under a CPU sorted by bus id and reads every sibling's, so the next PCI device fails init: 'Attribute busid "
    "of node nic not found', ncclInternalError (NVIDIA/nccl#1125: a USB NIC, init failing with 1 or 2 GPUs; "
    "src/graph/xml.cc ncclTopoGetXmlFromSys, fixed in 2.20.3).",
    fix="Keep the USB/virtual NIC out of NCCL's list (NCCL_SOCKET_IFNAME=^docker,lo,<its name>, or name the "
    "PCI interface), or use a torch whose NCCL is 2.20.3 or newer.",
)
def nccl_non_pci_nic_first_breaks_init(facts, ctx):
    env = job_env(facts, ctx)
    nccl = _nccl_version(facts)
    if facts.network.get("error"):
        return skip(f"the network probe failed: {facts.network['error']}")
    lay = layout(facts, ctx)
    from gpudoctor.readers.cudavis import job_gpus

    if not lay.multi_process and len(job_gpus(facts)) < 2:
        return skip("one process on one GPU: no NCCL communicator", **lay.evidence())
    low, fixed = NCCL_TOPO_BUSID_SORT_BUG
    version = f"NCCL {'.'.join(map(str, nccl))}" if nccl else None
    if nccl is not None and not low <= nccl < fixed:
        return passed(f"{version} is outside 2.18.5-2.20.2, whose topology detection this concerns", nccl=version)
    active_ib = [p for p in _ib_ports(facts) if str(p.get("state") or "").upper() == "ACTIVE"]
    socket_forced = nccl_flag(env, "NCCL_IB_DISABLE") != 0 or str(env.get("NCCL_NET") or "").lower() == "socket"
    if active_ib and not socket_forced:
        return passed("NCCL uses InfiniBand/RoCE here: its socket interfaces are not network devices in its topology")
    interfaces = facts.network.get("interfaces") or []
    ifname = env.get("NCCL_SOCKET_IFNAME")
    if ifname:
        chosen = set(select_names(ifname, [i["name"] for i in interfaces]))
        ordered = [i for i in _socket_order(interfaces) if i["name"] in chosen]
    else:
        ordered = nccl_default_interfaces(interfaces, nccl)
    evidence = {
        "nccl": version,
        "socket_devices": [i["name"] for i in ordered],
        "buses": {i["name"]: i.get("bus", "not probed") for i in ordered},
        "NCCL_SOCKET_IFNAME": ifname,
    }
    first_pci = next((n for n, i in enumerate(ordered) if _not_on_pci(i) is None), None)
    before = [(i, why) for i in ordered[: first_pci or 0] if (why := _not_on_pci(i))]
    if first_pci is None or not before:
        return passed(
            f"{version or 'NCCL'}'s socket devices ({', '.join(evidence['socket_devices']) or 'none'}) do not put a "
            "USB or virtual NIC before a PCI one",
            **evidence,
        )
    names = [i["name"] for i, _ in before]
    what = ", ".join(f"{i['name']} ({why})" for i, why in before)
    fix = set_env(
        "NCCL_SOCKET_IFNAME", "^docker,lo," + ",".join(names), title=f"Keep {', '.join(names)} out of NCCL's list"
    )
    if version is None:
        return info(
            f"NCCL's socket devices start with {what} before {ordered[first_pci]['name']}: NCCL 2.18.5-2.20.2 fail "
            "init on that ('Attribute busid of node nic not found', NVIDIA/nccl#1125); torch's NCCL version is "
            "unknown here",
            fix,
            **evidence,
        )
    return warn(
        f"{version} would use {what} as a socket network device before {ordered[first_pci]['name']}: its topology "
        "detection hangs a non-PCI NIC off the first CPU without a bus id, and a PCI device added under that CPU "
        "afterwards fails communicator init with 'Attribute busid of node nic not found' (NVIDIA/nccl#1125, fixed "
        "in 2.20.3) - on a single node too",
        fix,
        **evidence,
    )


def _socket_order(interfaces: list[dict]) -> list[dict]:
    """getifaddrs order (IPv4 addresses first, by interface index), as NCCL walks it; interfaces with an address."""

    def order(i: dict):
        ipv4 = any("." in a and ":" not in a for a in i.get("addresses") or [])
        return (not ipv4, i.get("ifindex") is None, i.get("ifindex") or 0, i["name"])

    return sorted((i for i in interfaces if i.get("addresses")), key=order)
