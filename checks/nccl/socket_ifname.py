"""nccl checks of NCCL_SOCKET_IFNAME and the other interface name lists, read as NCCL matches them
(gpudoctor/readers/ncclenv.py)."""

from __future__ import annotations

from typing import Any

from gpudoctor.checks.nccl._interfaces import host_local_only, ib_ports, usable_interfaces
from gpudoctor.job.env import job_env
from gpudoctor.job.layout import layout, mark_several_hosts
from gpudoctor.job.target import in_job_environment
from gpudoctor.model import fail, info, passed, set_env, skip, unset_env, warn
from gpudoctor.readers.ncclenv import (
    name_matches,
    parse_prefix_list,
    select_names,
)
from gpudoctor.registry import check


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
    usable = usable_interfaces(facts)
    evidence: dict[str, Any] = {
        "NCCL_SOCKET_IFNAME": value,
        "interfaces": {i["name"]: i.get("addresses") for i in usable},
    }
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
    reachable = [i["name"] for i in usable if i["name"] in chosen and not host_local_only(i)]
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
    usable = usable_interfaces(facts)
    chosen = select_names(value, [i["name"] for i in usable])
    local = [i["name"] for i in usable if i["name"] in chosen and host_local_only(i)]
    lay = layout(facts, ctx)
    evidence: dict[str, Any] = {
        "NCCL_SOCKET_IFNAME": value,
        "selected": chosen,
        "host_local_selected": local,
        **lay.evidence(),
    }
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
        "NCCL_SOCKET_IFNAME": [i["name"] for i in usable_interfaces(facts)],
        "NCCL_IB_HCA": sorted({str(p.get("device")) for p in ib_ports(facts)}),
    }
    set_vars = {k: env[k] for k in lists if env.get(k)}
    if not set_vars:
        return skip("neither NCCL_SOCKET_IFNAME nor NCCL_IB_HCA is set", **{k: None for k in lists})
    problems, fixes = [], []
    evidence: dict[str, Any] = dict(set_vars)
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
