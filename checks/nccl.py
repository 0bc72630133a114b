"""nccl checks: NCCL in torch, and the NCCL_* / TORCH_NCCL_* variables read the way NCCL and torch read them.

How NCCL reads its variables (NCCL source, src/misc/param.cc, src/graph/paths.cc, src/debug.cc,
socket.cc; NCCL docs "Environment Variables"):
- integer parameters go through strtoll(value, NULL, 0): base 0 ('0x10' is 16, '010' is 8) and
  only the leading number counts ('4MB' is 4, 'true' is 0; recent releases fall back to the
  default when there is no number at all). NCCL_IB_DISABLE disables IB when non-zero;
  NCCL_P2P_DISABLE disables P2P only when it reads exactly 1.
- NCCL_P2P_LEVEL / NCCL_NET_GDR_LEVEL: case-sensitive path names (LOC, NVL, PIX, ...) or a
  legacy number; anything else is ignored.
- NCCL_DEBUG: VERSION, WARN, INFO, ABORT, TRACE, case-insensitive.
- NCCL_SOCKET_IFNAME / NCCL_IB_HCA: comma-separated prefixes; a leading '^' excludes, then a
  leading '=' makes every entry an exact name; ':port' suffixes are allowed.
torch's ProcessGroupNCCL reads TORCH_NCCL_* booleans as y/yes/t/true/1 or n/no/f/false/0 and
integers with std::stoi; anything else raises when the process group is created.
"""

from __future__ import annotations

import re
from dataclasses import replace

from gpudoctor.readers.cudavis import from_facts as visible_devices
from gpudoctor.job.layout import job_env, layout
from gpudoctor.model import fail, info, manual, passed, set_env, skip, unset_env, warn
from gpudoctor.registry import check


def c_strtoll(text: str) -> int | None:
    """The number C's strtoll(text, NULL, 0) reads at the start of text; None when there is none."""
    m = re.match(r"^\s*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)", text)
    if not m:
        return None
    digits = m.group(2)
    if digits[:2].lower() == "0x":
        n = int(digits, 16)
    elif digits.startswith("0") and len(digits) > 1:
        n = int(digits, 8)
    else:
        n = int(digits)
    return -n if m.group(1) == "-" else n


def is_plain_int(text: str) -> bool:
    """strtoll(text, NULL, 0) reads all of it (blanks aside): decimal, 0x hex or 0 octal."""
    return re.fullmatch(r"\s*[+-]?(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)\s*", text) is not None


def octal_surprise(text: str) -> int | None:
    """'010' is octal to strtoll's base 0: the number NCCL reads when it differs from the decimal one."""
    if re.fullmatch(r"\s*[+-]?0[0-7]+\s*", text) and c_strtoll(text) != int(text):
        return c_strtoll(text)
    return None


def nccl_flag(env: dict, name: str) -> int:
    """What NCCL makes of an integer flag: 0 when unset or when the value holds no number."""
    text = env.get(name)
    return 0 if text is None else (c_strtoll(text) or 0)


def p2p_disabled(env: dict) -> str | None:
    """Which setting turns NCCL's P2P transport (NVLink/PCIe peer access) off, if any."""
    text = env.get("NCCL_P2P_DISABLE")
    if text is not None and c_strtoll(text) == 1:
        return f"NCCL_P2P_DISABLE={text}"
    level = env.get("NCCL_P2P_LEVEL")
    if level == "LOC" or (level and level[0] in "0123456789" and c_strtoll(level) == 0):
        return f"NCCL_P2P_LEVEL={level}"
    return None


# --- interface and HCA lists ---------------------------------------------------------------


def parse_prefix_list(value: str) -> tuple[bool, bool, list[str]]:
    """NCCL_SOCKET_IFNAME / NCCL_IB_HCA -> (exclude, exact, names); ':port' suffixes dropped."""
    exclude = value.startswith("^")
    rest = value[1:] if exclude else value
    exact = rest.startswith("=")
    rest = rest[1:] if exact else rest
    names = [part.split(":", 1)[0] for part in rest.split(",")]
    return exclude, exact, [n for n in names if n]


def _matches(name: str, entries: list[str], exact: bool) -> bool:
    return any(name == e if exact else name.startswith(e) for e in entries)


def select_names(value: str, names: list[str]) -> list[str]:
    """The names an NCCL prefix list selects, in order."""
    exclude, exact, entries = parse_prefix_list(value)
    return [n for n in names if _matches(n, entries, exact) != exclude]


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
    evidence = {"torch": t.get("version"), "nccl": _fmt_nccl(t.get("nccl")), "nccl_available": t.get("nccl_available"), **lay.evidence()}
    if not lay.multi_process:
        return skip("a single process (no WORLD_SIZE, LOCAL_WORLD_SIZE or SLURM task layout above 1): NCCL is not used", **evidence)
    if not t.get("cuda") and not t.get("hip"):
        return skip("torch is a CPU-only build (see the cuda checks)", **evidence)
    fix = manual("Install a CUDA build of torch", "pip install torch --index-url https://download.pytorch.org/whl/cu124")
    if t.get("distributed_available") is False:
        return fail(f"torch {t.get('version')} was built without torch.distributed: a multi-process job cannot start", fix, **evidence)
    if not t.get("nccl_available"):
        return fail(
            f"torch {t.get('version')} has no NCCL: init_process_group('nccl') raises \"Distributed package doesn't have NCCL built in\"",
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
        return skip("NCCL_SOCKET_IFNAME is not set: NCCL chooses interfaces itself (preferring ib*, avoiding lo and docker*)", **evidence)
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
        sev = fail if (lay.multi_process and ctx.gpus_expected) else warn
        return sev(msg, unset_env("NCCL_SOCKET_IFNAME"), **evidence)
    reachable = [i["name"] for i in usable if i["name"] in chosen and not _host_local_only(i)]
    if lay.multi_node and not reachable:
        return fail(
            f"NCCL_SOCKET_IFNAME={value!r} selects only {', '.join(chosen)} on a {lay.nodes.value}-node job: "
            "loopback and container bridges are not reachable from other nodes",
            unset_env("NCCL_SOCKET_IFNAME"),
            **evidence,
        )
    exclude, exact, entries = parse_prefix_list(value)
    unmatched = [] if exclude else [e for e in entries if not _matches_any(e, usable, exact)]
    if unmatched:
        return info(f"NCCL_SOCKET_IFNAME={value!r} selects {', '.join(chosen)}; {', '.join(unmatched)} matches no interface here", **evidence)
    return passed(f"NCCL_SOCKET_IFNAME={value!r} selects {', '.join(chosen)}", **evidence)


def _matches_any(entry: str, usable: list[dict], exact: bool) -> bool:
    return any(_matches(i["name"], [entry], exact) for i in usable)


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
            f"NCCL_IB_DISABLE={ib_disable} but {len(active)} InfiniBand/RoCE port(s) are active ({', '.join(map(_port_name, active))}): "
            "inter-node all-reduce goes over TCP sockets instead, typically several times slower",
            unset_env("NCCL_IB_DISABLE"),
        )
    if active and net == "socket":
        return warn(f"NCCL_NET={env['NCCL_NET']} forces TCP sockets although InfiniBand/RoCE ports are active", unset_env("NCCL_NET"))
    hca = env.get("NCCL_IB_HCA")
    if active and hca and not select_names(hca, sorted({p["device"] for p in active})):
        return warn(
            f"NCCL_IB_HCA={hca!r} selects none of the active devices ({', '.join(sorted({p['device'] for p in active}))}): NCCL falls back to TCP sockets",
            unset_env("NCCL_IB_HCA"),
        )
    if ports and not active:
        states = ", ".join(f"{_port_name(p)} {p.get('state')}" for p in ports)
        return warn(
            f"this host has InfiniBand/RoCE ports but none is ACTIVE ({states}): NCCL will send inter-node traffic over TCP sockets",
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
def nccl_inter_node_falls_back_to_sockets(facts, ctx):
    env = job_env(facts, ctx)
    lay = layout(facts, ctx)
    ports = _ib_ports(facts)
    active = [p for p in ports if str(p.get("state") or "").upper() == "ACTIVE"]
    evidence = {
        "NCCL_IB_DISABLE": env.get("NCCL_IB_DISABLE"),
        "NCCL_NET": env.get("NCCL_NET"),
        "NCCL_IB_HCA": env.get("NCCL_IB_HCA"),
        "ib_ports": {_port_name(p): f"{p.get('state')} {p.get('link_layer') or ''} {p.get('rate') or ''}".strip() for p in ports},
        **lay.evidence(),
    }
    if facts.network.get("error"):
        return skip(f"the network probe failed: {facts.network['error']}", **evidence)
    if not lay.multi_node:
        nodes = lay.nodes.value or "unknown"
        return skip(f"not a multi-node job (nodes: {nodes}): inside a node NCCL uses NVLink, PCIe or shared memory", **evidence)
    outcome = _inter_node_outcome(env, ports, active)
    return replace(outcome, evidence=evidence)


# --- GD-NCCL-004 ---------------------------------------------------------------------------


def _nvlink_gpus(facts) -> list[int]:
    vis = visible_devices(facts)
    indices = set(vis.gpus) if vis.gpus is not None else {g.get("index") for g in facts.gpus}
    return sorted(
        g["index"] for g in facts.gpus if g.get("index") in indices and any(link.get("active") for link in g.get("nvlink") or [])
    )


@check(
    id="GD-NCCL-004",
    name="nccl-p2p-disabled-on-nvlink",
    category="nccl",
    title="NCCL may use NVLink between this node's GPUs",
    needs=["env", "nvidia"],
    scope="node",
    what="Looks for NCCL_P2P_DISABLE=1 or NCCL_P2P_LEVEL=LOC (P2P off) when the visible GPUs have active "
    "NVLink links.",
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
    evidence = {"NCCL_P2P_DISABLE": env.get("NCCL_P2P_DISABLE"), "NCCL_P2P_LEVEL": env.get("NCCL_P2P_LEVEL"), "nvlink_gpus": linked}
    if setting is None:
        return passed("NCCL's P2P transport is not disabled", **evidence)
    name = setting.split("=", 1)[0]
    if len(linked) >= 2:
        return warn(
            f"{setting} turns off NCCL's P2P transport, but GPUs {', '.join(map(str, linked))} are connected by NVLink: "
            "intra-node all-reduce falls back to host shared memory, many times slower",
            unset_env(name),
            **evidence,
        )
    return info(
        f"{setting}: P2P over PCIe is off (no NVLink between the visible GPUs). Slower, but a known workaround "
        "where PCIe peer access hangs (consumer GPUs, some VMs); remove it if collectives work without it",
        **evidence,
    )


# --- GD-NCCL-005 ---------------------------------------------------------------------------

NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "ABORT", "TRACE")


@check(
    id="GD-NCCL-005",
    name="nccl-debug-logging-left-on",
    category="nccl",
    title="NCCL debug logging off for production runs",
    needs=["env"],
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
    evidence = {"NCCL_DEBUG": value, "NCCL_DEBUG_SUBSYS": env.get("NCCL_DEBUG_SUBSYS"), "NCCL_DEBUG_FILE": env.get("NCCL_DEBUG_FILE")}
    level = (value or "").strip().upper()
    if value is None or level in ("VERSION", "WARN", "ABORT"):
        return passed(f"NCCL_DEBUG={value or 'unset'}", **evidence)
    if level not in NCCL_DEBUG_LEVELS:
        return passed(f"NCCL_DEBUG={value!r} is not a level NCCL knows, so it logs nothing (see GD-NCCL-006)", **evidence)
    per_collective = {s.strip().upper() for s in subsys.lstrip("^").split(",")} & {"COLL", "ALL"} and not subsys.startswith("^")
    where = f" to {env['NCCL_DEBUG_FILE']}" if env.get("NCCL_DEBUG_FILE") else ""
    if per_collective:
        return warn(
            f"NCCL_DEBUG={value} with NCCL_DEBUG_SUBSYS={subsys} logs every collective{where}: huge logs and a slower run",
            set_env("NCCL_DEBUG", "WARN"),
            **evidence,
        )
    return info(f"NCCL_DEBUG={value} is on{where}: verbose set-up logs from every rank; fine while debugging, use WARN in production", set_env("NCCL_DEBUG", "WARN"), **evidence)


# --- GD-NCCL-006 ---------------------------------------------------------------------------

NCCL_FLAGS = ("NCCL_IB_DISABLE", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_NET_GDR_READ", "NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE")
NCCL_RANGES = {  # name: (low, high, what)
    "NCCL_IB_TIMEOUT": (1, 31, "the IB verbs timeout exponent (4.096 us x 2^value)"),
    "NCCL_IB_RETRY_CNT": (0, 7, "the IB verbs retry count"),
    "NCCL_BUFFSIZE": (1, None, "a size in bytes"),
    "NCCL_MIN_NCHANNELS": (1, None, "a channel count"),
    "NCCL_MAX_NCHANNELS": (1, None, "a channel count"),
    "NCCL_NSOCKS_PERTHREAD": (1, None, "a socket count"),
    "NCCL_SOCKET_NTHREADS": (1, None, "a thread count"),
}
NCCL_NTHREADS_VALUES = (64, 128, 256, 512)
P2P_LEVELS = ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS")

TORCH_NCCL_INTS = ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC")
TORCH_NCCL_BOOLS = (
    "TORCH_NCCL_BLOCKING_WAIT",
    "NCCL_BLOCKING_WAIT",
    "TORCH_NCCL_DESYNC_DEBUG",
    "NCCL_DESYNC_DEBUG",
    "TORCH_NCCL_ENABLE_TIMING",
    "NCCL_ENABLE_TIMING",
    "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_NCCL_ENABLE_MONITORING",
    "TORCH_NCCL_RETHROW_CUDA_ERRORS",
    "TORCH_NCCL_NAN_CHECK",
    "TORCH_NCCL_HIGH_PRIORITY",
    "TORCH_NCCL_AVOID_RECORD_STREAMS",
)
NCCL_ALGOS = ("Tree", "Ring", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT", "CollNet")  # CollNet: NCCL < 2.14
NCCL_PROTOS = ("LL", "LL128", "Simple")
NCCL_FUNCS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce", "SendRecv")


def unknown_list_tokens(value: str, known: tuple[str, ...]) -> list[str]:
    """Names NCCL's parseList (src/graph/tuning.cc) would not recognise in NCCL_ALGO / NCCL_PROTO:
    'a,b' or '^a' or 'a,b;allreduce:^c' - comparisons are case-insensitive."""
    lower_known = {k.lower() for k in known}
    lower_funcs = {f.lower() for f in NCCL_FUNCS}
    bad = []
    for part in filter(None, value.split(";")):
        prefix, _, items = part.rpartition(":")
        if prefix and prefix.strip().lower() not in lower_funcs:
            bad.append(prefix.strip())
        for item in items.lstrip("^").split(","):
            if item.strip() and item.strip().lower() not in lower_known:
                bad.append(item.strip())
    return bad


STOI_MAX = 2**31 - 1  # torch reads TORCH_NCCL_* integers with std::stoi, which throws beyond int
TORCH_BOOL_WORDS = ("y", "yes", "1", "t", "true", "n", "no", "0", "f", "false")


def _nccl_flag_problem(name: str, text: str) -> str | None:
    n = c_strtoll(text)
    if n is None:
        return f"{name}={text!r}: NCCL reads integers, so this is 0 (or the default) and does NOT turn the feature off; use 1"
    if not is_plain_int(text):
        return f"{name}={text!r}: NCCL reads only the leading number ({n})"
    if octal_surprise(text) is not None:
        return f"{name}={text!r}: a leading 0 makes NCCL read it as octal, i.e. {n}"
    if name == "NCCL_P2P_DISABLE" and n not in (0, 1):
        return f"{name}={text!r}: only 1 disables P2P; {n} leaves it on"
    return None


def _nccl_range_problem(name: str, text: str) -> str | None:
    low, high, what = NCCL_RANGES[name]
    n = c_strtoll(text)
    if n is None:
        return f"{name}={text!r} is not a number ({what}): NCCL ignores it"
    if not is_plain_int(text):
        return f"{name}={text!r}: NCCL reads only the leading number, {n} ({what})"
    if octal_surprise(text) is not None:
        return f"{name}={text!r}: a leading 0 makes NCCL read it as octal, i.e. {n} ({what})"
    if n < low or (high is not None and n > high):
        return f"{name}={n} is outside {low}-{high if high is not None else 'max'} ({what})"
    return None


def nccl_problems(env: dict) -> list[str]:
    out = []
    for name in NCCL_FLAGS:
        if name in env:
            out.append(_nccl_flag_problem(name, env[name]))
    for name in NCCL_RANGES:
        if name in env:
            out.append(_nccl_range_problem(name, env[name]))
    if "NCCL_NTHREADS" in env:
        text = env["NCCL_NTHREADS"]
        if c_strtoll(text) not in NCCL_NTHREADS_VALUES or not is_plain_int(text):
            read = f" (NCCL reads {c_strtoll(text)})" if c_strtoll(text) is not None and octal_surprise(text) is not None else ""
            out.append(f"NCCL_NTHREADS={text!r}: accepted values are 64, 128, 256 and 512{read}")
    for name in ("NCCL_P2P_LEVEL", "NCCL_NET_GDR_LEVEL"):
        text = env.get(name)
        if text is not None and text not in P2P_LEVELS and not (text and text[0] in "0123456789"):  # NCCL: '0' <= str[0] <= '9'
            hint = f" (values are case-sensitive: {text.upper()})" if text.upper() in P2P_LEVELS else ""
            out.append(f"{name}={text!r} is not a level NCCL knows ({', '.join(P2P_LEVELS)}){hint}: NCCL ignores it")
    debug = env.get("NCCL_DEBUG")
    if debug is not None and debug.strip().upper() not in NCCL_DEBUG_LEVELS:
        out.append(f"NCCL_DEBUG={debug!r} is not a level ({', '.join(NCCL_DEBUG_LEVELS)}): NCCL logs nothing, not even warnings")
    for name in TORCH_NCCL_INTS:
        text = env.get(name)
        if text is not None and "ASYNC_ERROR_HANDLING" in name and re.match(r"^\s*[+-]?[0-9]", text):
            mode = int(re.match(r"^\s*([+-]?[0-9]+)", text).group(1))
            if not 0 <= mode <= 3:
                # torch casts the number to its mode enum without checking: no error, and no mode applies
                out.append(
                    f"{name}={text!r} is not a mode (0 none, 1 tear down, 2 clean up only, 3 skip clean-up, the default): "
                    "torch accepts it without a word and then neither tears down nor cleans up on a NCCL error"
                )
    for name, known in (("NCCL_ALGO", NCCL_ALGOS), ("NCCL_PROTO", NCCL_PROTOS)):
        if env.get(name):
            unknown = unknown_list_tokens(env[name], known)
            if unknown:
                out.append(
                    f"{name}={env[name]!r}: {', '.join(map(repr, unknown))} is not one of {', '.join(known)} "
                    "(case-insensitive, '^' to exclude, 'allreduce:...' per collective): recent NCCL releases fail "
                    "communicator creation with 'invalid usage', older ones ignore the name"
                )
    family = env.get("NCCL_SOCKET_FAMILY")
    if family is not None and family not in ("AF_INET", "AF_INET6"):
        out.append(f"NCCL_SOCKET_FAMILY={family!r} is neither AF_INET nor AF_INET6: NCCL ignores it")
    return [p for p in out if p]


def torch_nccl_problems(env: dict) -> list[str]:
    """Values that make torch's ProcessGroupNCCL raise when it is created."""
    out = []
    for name in TORCH_NCCL_INTS:
        text = env.get(name)
        number = re.match(r"^\s*[+-]?[0-9]+", text) if text is not None else None
        if text is not None and not number:
            out.append(f"{name}={text!r} is not an integer: creating the NCCL process group raises 'Invalid value for environment variable'")
        elif number and abs(int(number.group(0))) > STOI_MAX:
            out.append(f"{name}={text!r} does not fit in an int (at most {STOI_MAX}): torch's std::stoi fails, so creating the NCCL "
                       "process group raises 'Invalid value for environment variable'")
    for name in TORCH_NCCL_BOOLS:
        text = env.get(name)
        if text is not None and text.lower() not in TORCH_BOOL_WORDS:
            out.append(f"{name}={text!r} is not a boolean (1/0, true/false, yes/no): creating the NCCL process group raises")
    return out


@check(
    id="GD-NCCL-006",
    name="nccl-env-malformed",
    category="nccl",
    title="NCCL_* and TORCH_NCCL_* values are ones NCCL and torch understand",
    needs=["env"],
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
