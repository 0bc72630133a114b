"""Will it run fast: every rank's parts, node and link against the job's median, the GPU model's expectation and
a fleet baseline; the slow ones named with the reason their device gives, and the --exclude line (no torch).

In a synchronous DDP job every step waits for the slowest rank, so one slow part slows all of them. Each figure
is a rate (higher is better) measured by the rank itself before training (sample_train/worker.py): the square
matmul and the model's FFN matmul, a device memory copy, pinned host<->device copies (GPUs), and its own
forward+backward without the gradient all-reduce. Node pairs exchange in rounds (outliers.pair_rounds) to
name a slow node or link.
"""

from __future__ import annotations

from gpudoctor import shellquote
from gpudoctor.model import Severity
from gpudoctor.readers.slurmfmt import compress_hostlist
from gpudoctor.sample_train.judge import figures, metrics, outliers, peaks
from gpudoctor.sample_train.judge.findings import make, ranks_text

# The least shortfall below the job's median that names a part: GPUs of one model agree within a few per cent
# when healthy (the straggler rule's 1.15x); CPU ranks share cores with each other and the machine, and jitter
# far more (docs/benchmarks.md has the false-alarm runs behind these figures).
MIN_GAP = {"cuda": 0.13, "cpu": 0.6}
LINK_GAP = {"cuda": 0.25, "cpu": 0.75}
BASELINE_GAP = {"cuda": 0.13, "cpu": 0.6}
IDLE_REASONS = {"gpu_idle", "applications_clocks_setting", "display_clock_setting", "sync_boost"}


def judge(ranks: list[dict], nodes: list[dict], results: list[dict], plan: dict, opts, step_p50: float | None):
    """(report sections, findings)."""
    device = "cpu" if ranks[0].get("device") == "cpu" else "cuda"
    sections: dict = {}
    findings = []
    slow_parts, part_medians = _parts_vs_median(ranks, device)
    sections["parts"] = {
        "figures": [{"key": f.key, "what": f.what, "unit": f.unit} for f in figures.RANK],
        "job_medians": part_medians,
        "min_gap": MIN_GAP[device],
        "slow": slow_parts,
        "rule": "below the job's median by more than 3.5 robust deviations (1.4826 x MAD) and by min_gap",
    }
    findings.append(straggler_finding([s for s in slow_parts if s["part"] == figures.COMPUTE], len(ranks), device))
    findings.append(_slow_parts_finding([s for s in slow_parts if s["part"] != figures.COMPUTE], len(ranks), device))
    findings.append(slow_node_finding(nodes, device))
    links = _links(results, plan, nodes, device, opts)
    sections["links"] = links
    sections["local_pairs"] = _local_pairs(results, plan, nodes, device)
    findings.append(_links_finding(links, sections["local_pairs"]))
    expected = _expected(ranks, device, opts)
    sections["expectations"] = expected
    findings.append(_expectation_finding(expected, device))
    scaling = _scaling(ranks, step_p50, opts)
    sections["scaling"] = scaling
    findings.append(_scaling_finding(scaling, len(ranks)))
    floors = _floors(ranks, links, opts)
    if floors is not None:
        findings.append(floors)
    return sections, findings


# -- each rank's parts against the job's median --------------------------------------------------
def _parts_vs_median(ranks: list[dict], device: str) -> tuple[list[dict], dict]:
    slow, medians = [], {}
    for figure in figures.RANK:
        values = {r["rank"]: r.get(figure.key) for r in ranks}
        found, reference = outliers.slow_ones(values, MIN_GAP[device])
        medians[figure.key] = metrics.median([v for v in values.values() if v is not None])
        for s in found:
            row = next(r for r in ranks if r["rank"] == s.key)
            slow.append(
                {
                    **identity(row),
                    "part": figure.key,
                    "what": figure.what,
                    "unit": figure.unit,
                    "value": s.value,
                    "job_median": reference,
                    "shortfall": s.shortfall,
                    "reason": reason(row),
                }
            )
    return slow, medians


def identity(row: dict) -> dict:
    return {k: row.get(k) for k in ("rank", "host", "node_index", "device", "gpu_index", "gpu_uuid")}


def where(row: dict) -> str:
    text = f"rank {row['rank']} on {row.get('host')}"
    if row.get("gpu_index") is not None:
        text += f" GPU {row['gpu_index']}"
    if row.get("gpu_uuid"):
        text += f" ({row['gpu_uuid']})"
    return text


# The software power cap holds clocks at the board's power limit: what every GPU does at full load (the recorded
# H200 at 691 of 700 W, reasons 0x4), not a cause by itself; a lowered limit is named on its own.
NORMAL_AT_LOAD = {"sw_power_cap"}


def causes(row: dict) -> dict:
    """What the device says about itself at that moment, sorted by what can be done about it: other processes on
    its GPU and CPU limits (the user's to stop or raise), a lowered power limit (the administrator's), clocks held
    down by the hardware or a degraded PCIe link (the node's), and notes that are no cause (the power cap)."""
    condition = row.get("condition") or {}
    gpu, cpu = condition.get("gpu"), condition.get("cpu")
    out: dict = {"others": [], "throttle": [], "clock": None, "pcie": [], "power_limit": None, "cpu": [], "notes": []}
    if gpu and not gpu.get("error"):
        active = [r for r in (gpu.get("throttle_reasons") or {}).get("active", []) if r not in IDLE_REASONS]
        out["throttle"] = [r for r in active if r not in NORMAL_AT_LOAD]
        if any(r in NORMAL_AT_LOAD for r in active):
            out["notes"].append("at its power cap (sw_power_cap: normal at full load, not a cause by itself)")
        clock, top = gpu.get("sm_clock_mhz"), gpu.get("sm_clock_max_mhz")
        if clock and top and clock < 0.9 * top:
            out["clock"] = f"SM clock {clock} of {top} MHz"
        pcie = gpu.get("pcie") or {}
        if pcie.get("width_current") and pcie.get("width_max") and pcie["width_current"] < pcie["width_max"]:
            out["pcie"].append(f"PCIe link x{pcie['width_current']} of x{pcie['width_max']}")
        if pcie.get("gen_current") and pcie.get("gen_max") and pcie["gen_current"] < pcie["gen_max"]:
            out["pcie"].append(f"PCIe gen {pcie['gen_current']} of {pcie['gen_max']}")
        limit, default = gpu.get("power_limit_w"), gpu.get("power_limit_default_w")
        if limit and default and limit < 0.95 * default:
            out["power_limit"] = f"power limit {limit:.0f} W of its default {default:.0f} W"
        out["others"] = [p for p in gpu.get("processes") or [] if p.get("pid") not in row.get("job_pids", ())]
    if cpu:
        if cpu.get("cpu_limit") and cpu["cpu_limit"] < 1:
            out["cpu"].append(f"its cgroup's CPU quota is {cpu['cpu_limit']:g} CPU")
        if cpu.get("load_1m") and cpu.get("affinity_cpus") and cpu["load_1m"] > 2 * cpu["affinity_cpus"]:
            out["cpu"].append(f"load {cpu['load_1m']:g} on its {cpu['affinity_cpus']} CPU(s)")
    return out


def reason(row: dict) -> str | None:
    """Why the device is slow, as it says itself at that moment, the likeliest cause first; None when it gives
    no reason."""
    c = causes(row)
    said = []
    if c["others"]:
        said.append(f"other processes on the GPU: PID {', '.join(str(p['pid']) for p in c['others'])}")
    if c["throttle"]:
        said.append("clocks held down: " + ", ".join(c["throttle"]))
    if c["clock"]:
        said.append(c["clock"] + (f" ({c['notes'][0]})" if c["notes"] and not c["throttle"] else ""))
    said += c["pcie"] + ([c["power_limit"]] if c["power_limit"] else []) + c["cpu"]
    return "; ".join(said) or None


def _pids_text(others: list[dict]) -> str:
    def one(p: dict) -> str:
        used = p.get("used_memory_bytes")
        return f"PID {p['pid']}" + (f" ({used / 2**30:.1f} GiB)" if used else "")

    return ", ".join(one(p) for p in others)


def next_steps(findings: list[dict], ranks: list[dict], nodes: list[dict]) -> list[dict]:
    """What to do about each rank or node a warning or failure named, matched to its cause: another process on
    the GPU -> that PID and how to see and stop it; CPU limits -> the limit; a lowered power limit or clocks held
    down by the hardware -> the reason; a slow node or link, or a slow rank without a reason -> leave its host out,
    but never every host of the run (nothing would be left to run on)."""
    by_rank = {r["rank"]: r for r in ranks}
    named_ranks, slow_hosts = _named(findings, by_rank, nodes)
    steps: list[dict] = []
    for rank in sorted(named_ranks):
        row = by_rank[rank]
        base = {"rank": rank, "host": row.get("host"), "gpu_index": row.get("gpu_index")}
        found = _cause_steps(row, causes(row))
        steps += [{**base, "checks": sorted(named_ranks[rank]), **step} for step in found]
        if not any(step["cause"] in LOCAL_CAUSES for step in found):  # the node's own fault, or no reason given
            slow_hosts.setdefault(str(row.get("host")), set()).update(named_ranks[rank])
    if slow_hosts:
        steps.append(_leave_out(slow_hosts, sorted({str(r.get("host")) for r in ranks}), bool(steps)))
    return steps


def _named(findings: list[dict], by_rank: dict, nodes: list[dict]) -> tuple[dict[int, set[str]], dict[str, set[str]]]:
    """(rank -> the checks that named it, host of a named node -> the checks that named it), from warnings and
    failures."""
    host_of_node = {n["node"]: n["host"] for n in nodes}
    named_ranks: dict[int, set[str]] = {}
    slow_hosts: dict[str, set[str]] = {}
    for f in findings:
        if f.get("severity") not in ("warn", "fail"):
            continue
        evidence = f.get("evidence") or {}
        for rank in evidence.get("ranks", []):
            if rank in by_rank:
                named_ranks.setdefault(rank, set()).add(f["id"])
        for node in evidence.get("slow_nodes", []):
            if node in host_of_node:
                slow_hosts.setdefault(host_of_node[node], set()).add(f["id"])
    return named_ranks, slow_hosts


# Causes the user (or the administrator) can remove on the host itself; the others leave the host out.
LOCAL_CAUSES = ("other_process", "cpu", "power_limit")


def _cause_steps(row: dict, c: dict) -> list[dict]:
    """One step per cause the device gives, in the order of `causes`."""
    at = where(row)
    steps = []
    if c["others"]:
        steps.append(
            {
                "cause": "other_process",
                "text": f"{at} shares its GPU with another process ({_pids_text(c['others'])}): see what it is and "
                "whose, then stop it (or wait for it) and run smoke again",
                "commands": [
                    "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv",
                    f"ps -o user,cmd -p {','.join(str(p['pid']) for p in c['others'])}",
                ],
                "pids": [p["pid"] for p in c["others"]],
            }
        )
    if c["cpu"]:
        steps.append({"cause": "cpu", "text": f"{at}: {'; '.join(c['cpu'])}", "commands": ["nproc", "uptime"]})
    if c["power_limit"]:
        text = f"{at}: {c['power_limit']} (set by an administrator or a tool)"
        steps.append({"cause": "power_limit", "text": text, "commands": ["nvidia-smi -q -d POWER"]})
    if c["throttle"] or c["pcie"]:
        said = (["clocks held down: " + ", ".join(c["throttle"])] if c["throttle"] else []) + c["pcie"]
        text = f"{at}: {'; '.join(said)} (cooling, power delivery or the PCIe slot)"
        steps.append(
            {"cause": "hardware", "text": text, "commands": ["nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER,PCIE"]}
        )
    return steps


def _leave_out(slow_hosts: dict[str, set[str]], every: list[str], causes_given: bool) -> dict:
    """The --exclude step for the named hosts, unless they are every host of the run."""
    hosts = sorted(slow_hosts)
    checks = sorted(set().union(*slow_hosts.values()))
    keep = [h for h in every if h not in slow_hosts]
    if keep:
        line = f"--exclude={compress_hostlist(hosts)}"
        return {
            "cause": "slow_host",
            "hosts": hosts,
            "checks": checks,
            "sbatch": line,
            "text": f"leave out the slow host(s): sbatch {line} ... (hosts to keep: {' '.join(keep)})",
            "commands": [],
        }
    advice = (
        "see the causes above, or run smoke on more nodes to compare them"
        if causes_given
        else "run smoke again (a passing load may have caused it), with --baseline from a known-good node, or on more "
        "nodes to compare them"
    )
    return {
        "cause": "every_host",
        "hosts": hosts,
        "checks": checks,
        "text": "every host of this run was named, so excluding them leaves nothing to run on: " + advice,
        "commands": [],
    }


def straggler_finding(slow: list[dict], n: int, device: str):
    """GD-SMOKE-010: a rank whose own forward+backward (DDP no_sync: no waiting for others) is an outlier."""
    hint = (
        "; look at its GPU's clocks, temperature and power (nvidia-smi -q -d PERFORMANCE)"
        if device == "cuda"
        else "; look at its CPU share (cgroup quota, other processes on its cores)"
    )
    return _below_median_finding(
        "GD-SMOKE-010",
        slow,
        n,
        device,
        alone="one rank: nothing to compare",
        within="every rank's own forward+backward",
        named=lambda s: f"{where(s)}: own forward+backward at {_num(s['value'])} tokens/s, {_below(s)}",
        tail=": every step waits for it" + hint,
    )


def _below_median_finding(check_id: str, slow: list[dict], n: int, device: str, *, alone, within, named, tail):
    """A check of ranks against the job's median: skipped with one rank, else the slow ones named."""
    if n < 2:
        return make(check_id, Severity.SKIP, alone)
    if not slow:
        gap = MIN_GAP[device]
        return make(check_id, Severity.PASS, f"{within} within {gap:.0%} of the job's median (or its usual spread)")
    return make(
        check_id,
        Severity.WARN,
        "; ".join(named(s) for s in slow) + tail,
        slow=slow,
        ranks=sorted({s["rank"] for s in slow}),
    )


def slow_node_finding(nodes: list[dict], device: str):
    """GD-SMOKE-015: a node whose ranks' own compute, summed, is an outlier among nodes."""
    if len(nodes) < 2:
        return make("GD-SMOKE-015", Severity.SKIP, "one node: nothing to compare")
    found, reference = outliers.slow_ones({n["node"]: n["compute_tokens_per_s"] for n in nodes}, MIN_GAP[device])
    if not found:
        return make(
            "GD-SMOKE-015",
            Severity.PASS,
            f"{len(nodes)} nodes' own compute within {MIN_GAP[device]:.0%} of the median node (or its usual spread)",
        )
    by_name = {n["node"]: n for n in nodes}
    text = "; ".join(
        f"node {s.key} ({ranks_text(by_name[s.key]['ranks'])}): {_num(s.value)} compute tokens/s, "
        f"{s.shortfall:.0%} below the median node ({_num(reference)})"
        for s in found
    )
    return make(
        "GD-SMOKE-015",
        Severity.WARN,
        text + ": the whole job runs at its pace",
        slow_nodes=[s.key for s in found],
        below_median={s.key: s.shortfall for s in found},
    )


def _slow_parts_finding(slow: list[dict], n: int, device: str):
    """GD-SMOKE-016: a rank's part (a row of the figure table) below the job's median."""
    return _below_median_finding(
        "GD-SMOKE-016",
        slow,
        n,
        device,
        alone="one rank: no job median to compare with",
        within="every rank's parts",
        named=lambda s: f"{where(s)}: {s['what']} {_num(s['value'])} {s['unit']}, {_below(s)}",
        tail=": every step waits for the slowest rank",
    )


def _below(s: dict) -> str:
    """How far a slow part is below the job's median, and its device's reason."""
    return f"{s['shortfall']:.0%} below the job's median {_num(s['job_median'])}" + (
        f" ({s['reason']})" if s["reason"] else ""
    )


def _num(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


# -- node pairs --------------------------------------------------------------------------------
def _links(results: list[dict], plan: dict, nodes: list[dict], device: str, opts) -> dict | None:
    node_of = {rank: i for i, ranks in enumerate(plan.get("nodes") or []) for rank in ranks}
    rates = _pair_rates(results, "node_pairs", node_of.__getitem__)
    if not rates:
        return None
    names = [n["node"] for n in nodes]
    found = outliers.localise(rates, LINK_GAP[device])
    below_floor = [
        p for p, v in rates.items() if opts.floors.min_linkbw_gbps is not None and v < opts.floors.min_linkbw_gbps
    ]
    return {
        "metric": "send and receive at once between the i-th ranks of two nodes; GB/s each way, the slowest end",
        "rounds": len(plan.get("node_rounds") or []),
        "pairs": [{"nodes": [names[a], names[b]], "gbps": v} for (a, b), v in sorted(rates.items())],
        "median_gbps": metrics.median(list(rates.values())),
        "min_gap": LINK_GAP[device],
        "slow_nodes": [
            {
                "node": names[s.key],
                "host": nodes[s.key]["host"],
                "best_gbps": s.value,
                "others_median_gbps": s.reference,
            }
            for s in found.slow_nodes
        ],
        "slow_links": [
            {"nodes": [names[a], names[b]], "gbps": v, "ends_reach_gbps": reach}
            for (a, b), v, reach in found.slow_links
        ],
        "undecided": [{"nodes": [names[a], names[b]], "gbps": rates[(a, b)]} for a, b in found.undecided],
        "below_floor": [{"nodes": [names[a], names[b]], "gbps": rates[(a, b)]} for a, b in sorted(below_floor)],
    }


def _pair_rates(results: list[dict], key: str, end_of) -> dict[tuple[int, int], float]:
    """Each pair's rate from the exchanges the ranks wrote under key, a pair's ends being end_of(rank) (a node,
    or the rank itself): its slowest path's, the end that received slowest, on the slowest local position."""
    measured: dict[tuple[int, int], list[float]] = {}
    for r in results:
        for e in r.get(key) or []:
            if e.get("gbps") is not None:
                a, b = sorted((end_of(r["rank"]), end_of(e["peer"])))
                measured.setdefault((a, b), []).append(e["gbps"])
    return {pair: min(v) for pair, v in measured.items()}


def _local_pairs(results: list[dict], plan: dict, nodes: list[dict], device: str) -> list[dict] | None:
    """--deep: every pair of ranks inside each node (GPU to GPU: NVLink or PCIe P2P through NCCL), and the pairs
    or ranks of a node that are slow against that node's other pairs (outliers.localise over local ranks)."""
    if not plan.get("local_rounds"):
        return None
    out = []
    for index, ranks in enumerate(plan.get("nodes") or []):
        rates = _pair_rates([r for r in results if r["rank"] in ranks], "local_pairs", lambda rank: rank)
        found = outliers.localise(rates, LINK_GAP[device])
        out.append(
            {
                "node": nodes[index]["node"],
                "pairs": [{"ranks": list(pair), "gbps": v} for pair, v in sorted(rates.items())],
                "slow_ranks": [s.key for s in found.slow_nodes],
                "slow_pairs": [list(pair) for pair, _, _ in found.slow_links],
            }
        )
    return out


def _links_finding(links: dict | None, local: list[dict] | None):
    if links is None and not local:
        return make("GD-SMOKE-018", Severity.SKIP, "one node: no link between nodes to measure")
    links = links or {"slow_nodes": [], "slow_links": [], "pairs": [], "undecided": [], "rounds": 0}
    parts, ranks = [], []
    for s in links["slow_nodes"]:
        parts.append(
            f"node {s['node']} is slow with every partner: at best {s['best_gbps']:.3g} GB/s, the other nodes reach "
            f"{s['others_median_gbps']:.3g} GB/s (median)"
        )
    for s in links["slow_links"]:
        a, b = s["nodes"]
        parts.append(
            f"the link between {a} and {b} runs at {s['gbps']:.3g} GB/s while both reach {s['ends_reach_gbps']:.3g} "
            "GB/s with other partners: the path between them (a switch port, a cable, routing), not either node"
        )
    for node in local or []:
        for rank in node["slow_ranks"]:
            parts.append(f"inside node {node['node']}, rank {rank} is slow with every peer (send/recv between ranks)")
            ranks.append(rank)
        for a, b in node["slow_pairs"]:
            parts.append(f"inside node {node['node']}, ranks {a} and {b} exchange slower than either does with others")
    if parts:
        named = {
            "slow_nodes": [s["node"] for s in links["slow_nodes"]],
            "slow_links": [s["nodes"] for s in links["slow_links"]],
            "ranks": sorted(ranks),
        }
        return make("GD-SMOKE-018", Severity.WARN, "; ".join(parts), **{k: v for k, v in named.items() if v})
    said = []
    if links["pairs"]:
        said.append(
            f"{len(links['pairs'])} node pair(s) in {links['rounds']} round(s): {links['median_gbps']:.3g} GB/s "
            "median, none slower than both its ends reach elsewhere"
        )
    if local:
        said.append(f"{sum(len(n['pairs']) for n in local)} rank pair(s) inside nodes, none slow")
    text = "; ".join(said)
    if links["undecided"]:
        text += (
            "; with two nodes the data cannot tell a slow node from a slow link or say which end is at fault "
            "(judge the pair against a baseline or --min-linkbw)"
        )
    return make("GD-SMOKE-018", Severity.PASS, text)


# -- expectations: the GPU model's reference and the fleet baseline ------------------------------
def _expected(ranks: list[dict], device: str, opts) -> dict:
    rows, missing = [], set()
    for r in ranks:
        ref = (
            peaks.identify(r.get("gpu_name"), r.get("gpu_memory_bytes"), _power_limit(r)) if device == "cuda" else None
        )
        for figure in figures.RANK:
            row = _expect_row(r, figure, device, ref, opts)
            if isinstance(row, dict):
                rows.append(row)
            elif row == NO_REFERENCE:
                missing.add(r.get("gpu_name") or "?")
    return {
        "checked": rows,
        "below": [row for row in rows if row["below"]],
        "baseline": opts.measure.baseline_path,
        "no_reference": sorted(missing),
        "job_medians": {},  # filled by report: the figures a --save-baseline keeps
    }


NO_REFERENCE = "no reference"


def _expect_row(r: dict, figure: figures.Figure, device: str, ref, opts) -> dict | str | None:
    """A rank's figure against the fleet baseline, else its GPU model's reference; None where neither applies,
    NO_REFERENCE where the GPU model has none."""
    value = r.get(figure.key)
    if value is None:
        return None
    base = ((opts.measure.baseline or {}).get("figures") or {}).get(figure.key)
    if base:
        gap = BASELINE_GAP[device]
        basis = f"baseline {opts.measure.baseline_path}: {_num(base)} {figure.unit}, less {gap:.0%}"
        expected, source = base * (1 - gap), "baseline"
    elif device != "cuda" or figure.reference is None:
        return None
    else:
        expect = peaks.expectation(ref, figure.reference) if ref else None
        if expect is None:
            return NO_REFERENCE
        expected, basis, source = expect.value, expect.basis, "reference"
    return {
        **identity(r),
        "part": figure.key,
        "what": figure.what,
        "unit": figure.unit,
        "value": value,
        "expected_at_least": expected,
        "basis": basis,
        "source": source,
        "below": value < expected,
        "reason": reason(r),
    }


def _power_limit(row: dict) -> float | None:
    gpu = (row.get("condition") or {}).get("gpu") or {}
    return gpu.get("power_limit_default_w") or gpu.get("power_limit_w")


def _expectation_finding(expected: dict, device: str):
    below = expected["below"]
    if below:
        text = "; ".join(
            f"{where(b)}: {b['what']} {_num(b['value'])} {b['unit']}, below the {_num(b['expected_at_least'])} "
            f"expected ({b['basis']})" + (f" ({b['reason']})" if b["reason"] else "")
            for b in below
        )
        return make("GD-SMOKE-017", Severity.WARN, text, below=below, ranks=sorted({b["rank"] for b in below}))
    if expected["checked"]:
        sources = sorted({c["source"] for c in expected["checked"]})
        return make(
            "GD-SMOKE-017",
            Severity.PASS,
            f"{len(expected['checked'])} figure(s) at or above what is expected ({' and '.join(sources)})",
        )
    if device == "cpu":
        return make(
            "GD-SMOKE-017",
            Severity.SKIP,
            "CPU ranks: no reference figures for CPUs; compare with a fleet baseline (--baseline)",
        )
    names = ", ".join(expected["no_reference"]) or "this GPU"
    return make(
        "GD-SMOKE-017",
        Severity.INFO,
        f"no reference for {names}: give --baseline (saved with --save-baseline on a known-good node) or --peak-tflops",
    )


# -- scaling -----------------------------------------------------------------------------------
def _scaling(ranks: list[dict], step_p50: float | None, opts) -> dict:
    own = metrics.median([r["local_compute_s_p50"] for r in ranks if r.get("local_compute_s_p50")])
    efficiency = metrics.ratio(own, step_p50)
    return {
        "own_compute_s_p50": own,
        "step_s_p50": step_p50,
        "efficiency": min(1.0, efficiency) if efficiency is not None else None,
        "communication_share": max(0.0, 1 - efficiency) if efficiency is not None else None,
        "floor": opts.floors.min_scaling,
        "metric": "the median rank's own forward+backward (no gradient all-reduce) over the synchronised step time "
        "(the slowest rank's, p50): the 1 -> N efficiency; the rest of the step is waiting for others, the "
        "all-reduce, data and the optimizer",
    }


def _scaling_finding(s: dict, n: int):
    eff = s["efficiency"]
    if eff is None:
        return make("GD-SMOKE-019", Severity.SKIP, "no step timings to compare")
    text = (
        f"scaling efficiency {eff:.0%}: own forward+backward {s['own_compute_s_p50'] * 1e3:.1f} ms of a "
        f"{s['step_s_p50'] * 1e3:.1f} ms step over {n} rank(s) ({s['communication_share']:.0%} waiting, "
        "all-reduce, data, optimizer)"
    )
    if s["floor"] is None:
        return make("GD-SMOKE-019", Severity.PASS if n > 1 else Severity.INFO, text, efficiency=eff)
    good = eff >= s["floor"]
    return make(
        "GD-SMOKE-019",
        Severity.PASS if good else Severity.FAIL,
        text + f"; floor {s['floor']:.0%}",
        efficiency=eff,
        floor=s["floor"],
    )


# -- floors on the parts -------------------------------------------------------------------------
def _floors(ranks: list[dict], links: dict | None, opts):
    """GD-SMOKE-020: each figure of the table with a floor given (its --min-... flag), and the node pairs."""
    asked = [(f, opts.floors.parts.get(f.floor.option)) for f in figures.RANK if f.floor is not None]
    asked = [(f, floor) for f, floor in asked if floor is not None]
    if not asked and opts.floors.min_linkbw_gbps is None:
        return None
    below, measured = [], 0
    for figure, floor in asked:
        for r in ranks:
            if r.get(figure.key) is None:
                continue
            measured += 1
            if r[figure.key] < floor:
                below.append(
                    f"{where(r)}: {figure.key} {_num(r[figure.key])} {figure.unit} < {figure.floor.flag} {floor:g}"
                )
    linkbw = opts.floors.min_linkbw_gbps
    if linkbw is not None and links:  # _links compared each pair with the floor
        measured += len(links["pairs"])
        below += [
            f"nodes {p['nodes'][0]} - {p['nodes'][1]}: {p['gbps']:.3g} GB/s < --min-linkbw {linkbw:g}"
            for p in links["below_floor"]
        ]
    if below:
        return make("GD-SMOKE-020", Severity.FAIL, "; ".join(below), below=below)
    if not measured:
        return make("GD-SMOKE-020", Severity.SKIP, "the floors given apply to nothing this run measures")
    return make("GD-SMOKE-020", Severity.PASS, f"{measured} figure(s) at or above their floors")


# -- what to exclude -----------------------------------------------------------------------------
def _exclude(named: dict[str, set[str]], ranks: list[dict]) -> dict | None:
    if not named:
        return None
    hosts = sorted(named)
    every = sorted({r["host"] for r in ranks})
    keep = [h for h in every if h not in named]
    return {
        "hosts": hosts,
        # shell text, copy-pasted: quoted when a list's brackets (node[1-3]) would glob or a name is odd
        "sbatch": shellquote.quote(f"--exclude={compress_hostlist(hosts)}"),
        "keep_hosts": keep,
        "because": {h: sorted(named[h]) for h in hosts},
        "note": None if keep else "every host of this run was named: nothing is left to run on",
    }


def exclude_from(findings: list, ranks: list[dict], nodes: list[dict]) -> dict | None:
    """The --exclude line from every finding that named a rank or a node (GD-SMOKE-010/015/016/017/018/020)."""
    by_rank = {r["rank"]: r for r in ranks}
    named_ranks, named = _named([f.to_dict() for f in findings], by_rank, nodes)
    for rank, ids in named_ranks.items():
        named.setdefault(by_rank[rank]["host"], set()).update(ids)
    return _exclude(named, ranks)
