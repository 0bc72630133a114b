"""From the coordinator's verdict to the gpudoctor.smoke/3 report and its verdicts (no torch)."""

from __future__ import annotations

import sys

from gpudoctor import __version__
from gpudoctor.model import Severity
from gpudoctor.sample_train.judge import baseline, correctness, figures, metrics, peaks, slowness, soak, transport
from gpudoctor.sample_train.judge.findings import failed, make, ranks_text
from gpudoctor.sanitize import json_text

SCHEMA = "gpudoctor.smoke/3"
LOSS_DROP = 0.05  # the last steps' mean loss must be at least 5% below the first steps'
LOSS_WINDOW = 3


def build(verdict, opts, launch: dict, wall_s: float) -> dict:
    """The whole report; verdict findings plus the ones judged from the measurements."""
    findings = list(verdict.findings)
    plan = verdict.plan or {}
    body: dict = {
        "ranks": [],
        "throughput": None,
        "step_time_s": None,
        "flops": None,
        "mfu": None,
        "allreduce": None,
        "memory": None,
        "loss": None,
        "params_identical": None,
        "stragglers": None,
        "nodes": None,
        "slowest_node": None,
        "parts": None,
        "links": None,
        "local_pairs": None,
        "expectations": None,
        "scaling": None,
        "exclude": None,
        "correctness": None,
        "soak": None,
        "nccl_transport": None,
        "next_steps": [],
    }
    refused = None
    if verdict.ok:
        body = _measurements(verdict, plan, opts)
        results = [verdict.results[r] for r in sorted(verdict.results)]
        sections, speed = _slowness(body, results, plan, opts)
        body.update(sections)
        findings += _judge(body, plan, opts) + speed
        body["correctness"], right = correctness.judge(body["ranks"], verdict.joins, results)
        body["soak"], held = soak.judge(body["ranks"], results, verdict.joins[0]["device_type"], opts.measure.soak or 0)
        body["nccl_transport"], linked = transport.judge(results, verdict.joins, body["allreduce"]["busbw_gbps"])
        linked += transport.judge_gpu_pairs(body["local_pairs"], verdict.joins)
        findings += right + held + linked
        body["exclude"] = slowness.exclude_from(findings, body["ranks"], body["nodes"])
        body["next_steps"] = slowness.next_steps([f.to_dict() for f in findings], body["ranks"], body["nodes"])
    ok = verdict.ok and not failed(findings)
    rep = {
        "schema": SCHEMA,
        "tool": {"name": "gpudoctor", "version": __version__},
        "ok": ok,
        "exit_code": 0 if ok else 1,
        "wall_s": round(wall_s, 3),
        "launch": launch,
        "placement": [verdict.joins[r] for r in sorted(verdict.joins)],
        "run": _run_section(plan, verdict, opts),
        **body,
        "floors": opts.floors.as_report(),
        "findings": [f.to_dict() for f in findings],
    }
    if opts.measure.baseline is not None and verdict.ok:
        refused = baseline.mismatch(opts.measure.baseline, rep)
    if refused:
        rep.update(ok=False, exit_code=2, refused=f"--baseline {opts.measure.baseline_path}: {refused}")
    return rep


def _run_section(plan: dict, verdict, opts) -> dict | None:
    if not plan.get("go"):
        return None
    first = verdict.results.get(0, {})
    return {
        "model": plan["model"],
        "precision": plan["precision"],
        "precision_reason": plan["precision_reason"],
        "optimizer": first.get("optimizer"),
        "compile": opts.train.compile,
        "quick": opts.measure.quick,
        "backend": first.get("backend"),
        "dataloader": first.get("dataloader"),
        "timeout_s": opts.train.timeout,
        "config_path": opts.train.config_path,
    }


def _spec_peak(verdict, opts) -> tuple[float | None, str | None, str | None]:
    """(TFLOP/s per device, what it is, why there is none)."""
    if opts.measure.peak_tflops:
        return opts.measure.peak_tflops, "--peak-tflops", None
    first = verdict.joins[0]
    if first["device_type"] == "cpu":
        return None, None, "CPU run: MFU against a GPU spec peak does not apply (the measured matmul peak does)"
    if (verdict.plan or {}).get("precision") == "fp32":
        return (
            None,
            None,
            (
                "fp32 run: the table holds bf16/fp16 tensor-core peaks, not fp32 ones (the measured "
                "fp32 matmul peak applies); pass --peak-tflops for your GPU's fp32 peak"
            ),
        )
    gpus = {(j.get("gpu_name"), j.get("gpu_memory_bytes")) for j in verdict.joins.values()}
    found = [peaks.identify(name, memory) for name, memory in gpus]
    if any(p is None for p in found):
        unknown = sorted({str(name) for (name, _), p in zip(gpus, found, strict=True) if p is None})
        return None, None, f"no spec peak known for {', '.join(map(str, unknown))}: pass --peak-tflops"
    slowest = min(found, key=lambda p: p.tflops)
    return slowest.tflops, f"{slowest.model} dense {slowest.dtype} ({slowest.source})", None


def _per_rank(r: dict, join: dict, flops_per_step: int, spec: float | None) -> dict:
    warmup = r["warmup"]
    steps, waits = r["step_times"][warmup:], r["data_waits"][warmup:]
    busy = sum(steps)
    achieved = flops_per_step * len(steps) / busy / 1e12
    return {
        "rank": r["rank"],
        "host": r.get("host"),
        "node_index": join.get("node_index"),
        "local_rank": r.get("local_rank"),
        "device": join.get("device"),
        "gpu_name": join.get("gpu_name"),
        "gpu_index": join.get("device_index"),
        "gpu_uuid": join.get("gpu_uuid"),
        "gpu_memory_bytes": join.get("gpu_memory_bytes"),
        "tokens_per_s": r["tokens_per_step"] * len(steps) / busy,
        "samples_per_s": r["samples_per_step"] * len(steps) / busy,
        "step_time_s": {"p50": metrics.percentile(steps, 50), "p95": metrics.percentile(steps, 95)},
        "data_wait_s_p50": metrics.median(waits),
        "local_compute_s_p50": metrics.median(r["local_compute_s"]),
        "achieved_tflops": achieved,
        "matmul_tflops": r["matmul"]["tflops"],
        **figures.from_parts(r.get("parts") or {}),
        # the best probe step: contention from outside slows a step, nothing makes a rank faster than it is
        "compute_tokens_per_s": metrics.ratio(r["tokens_per_step"], min(r["local_compute_s"], default=None)),
        "condition": r.get("condition"),
        "mfu_vs_spec": metrics.ratio(achieved, spec),
        "mfu_vs_measured_matmul": metrics.ratio(achieved, r["matmul"]["tflops"]),
        "first_allreduce_s": r["first_allreduce_s"],
        "peak_memory_bytes": r["peak_memory"]["bytes"],
        "loss_first": r["losses"][0],
        "loss_last": r["losses"][-1],
        "param_checksum": r["param_checksum"],
        "stage_seconds": r.get("stage_seconds"),
    }


def _measurements(verdict, plan: dict, opts) -> dict:
    cfg = plan["model"]
    results = [verdict.results[r] for r in sorted(verdict.results)]
    tokens = results[0]["tokens_per_step"]
    flops_per_step = metrics.flops_per_token(cfg["n_layer"], cfg["d_model"], cfg["seq_len"], cfg["vocab"]) * tokens
    spec, spec_source, spec_missing = _spec_peak(verdict, opts)
    ranks = [_per_rank(r, verdict.joins[r["rank"]], flops_per_step, spec) for r in results]
    pids: dict = {}
    for j in verdict.joins.values():
        pids.setdefault(j.get("host"), set()).add(j.get("pid"))
    for row in ranks:
        row["job_pids"] = sorted(p for p in pids.get(row["host"], ()) if p is not None)
    warmup = results[0]["warmup"]
    world_steps = [max(step) for step in zip(*(r["step_times"][warmup:] for r in results), strict=False)]
    total_tflops = sum(r["achieved_tflops"] for r in ranks)
    total_matmul = sum(r["matmul_tflops"] for r in ranks)
    losses = [sum(step) / len(step) for step in zip(*(r["losses"] for r in results), strict=False)]
    checksums = {r["rank"]: r["param_checksum"] for r in ranks}
    return {
        "ranks": ranks,
        "throughput": {
            "tokens_per_s": sum(r["tokens_per_s"] for r in ranks),
            "samples_per_s": sum(r["samples_per_s"] for r in ranks),
            "tokens_per_step_per_rank": tokens,
            "measured_steps": len(world_steps),
            "warmup_steps": warmup,
        },
        "step_time_s": {
            "p50": metrics.percentile(world_steps, 50),
            "p95": metrics.percentile(world_steps, 95),
            "of": "the slowest rank's time for each step after warm-up",
        },
        "flops": {
            "formula": metrics.FLOP_FORMULA,
            "per_step_per_rank": flops_per_step,
            "achieved_tflops_total": total_tflops,
        },
        "mfu": {
            "vs_spec": metrics.ratio(total_tflops, spec * len(ranks)) if spec else None,
            "spec_peak_tflops_per_device": spec,
            "spec_source": spec_source,
            "vs_spec_missing_reason": spec_missing,
            "vs_measured_matmul": metrics.ratio(total_tflops, total_matmul),
            "measured_matmul_tflops_median": metrics.median([r["matmul_tflops"] for r in ranks]),
            "matmul": {k: results[0]["matmul"].get(k) for k in ("n", "dtype", "method", "best_shape")},
        },
        "allreduce": {**_allreduce(results, verdict), **_node_allreduce(results)},
        "memory": {
            "peak_bytes_max": max(r["peak_memory_bytes"] for r in ranks),
            "kind": results[0]["peak_memory"]["kind"],
            "reserved_peak_bytes_max": _max_or_none(r["peak_memory"].get("reserved_bytes") for r in results),
            "device_total_bytes": _max_or_none(r["peak_memory"].get("device_total_bytes") for r in results),
        },
        "loss": {
            "first": _mean(losses[:LOSS_WINDOW]),
            "last": _mean(losses[-LOSS_WINDOW:]),
            "window_steps": LOSS_WINDOW,
            "per_step_mean_over_ranks": losses,
        },
        "params_identical": len(set(checksums.values())) == 1,
        "param_checksums": checksums,
        "stragglers": _stragglers(ranks),
        **_nodes(ranks, tokens, results),
    }


def _slowness(body: dict, results: list[dict], plan: dict, opts) -> tuple[dict, list]:
    """The report sections and findings of slowness.judge; the job medians a --save-baseline keeps."""
    sections, findings = slowness.judge(body["ranks"], body["nodes"], results, plan, opts, body["step_time_s"]["p50"])
    medians = dict(sections["parts"]["job_medians"])
    links = sections["links"] or {}
    medians.update(
        tokens_per_s=body["throughput"]["tokens_per_s"],
        busbw_gbps=body["allreduce"].get("busbw_gbps"),
        inter_node_busbw_gbps=body["allreduce"].get("inter_node_busbw_gbps_min"),
        node_pair_gbps=links.get("median_gbps"),
        scaling=sections["scaling"]["efficiency"],
    )
    sections["expectations"]["job_medians"] = medians
    return sections, findings


def _max_or_none(values) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _allreduce(results: list[dict], verdict) -> dict:
    n = len(results)
    backend = results[0]["backend"]
    if backend == "nccl":
        algo = verdict.joins[0].get("nccl_algo")
        algorithm = (
            f"NCCL_ALGO={algo}" if algo else "chosen by NCCL per message size (Ring/Tree/NVLS/CollNet; NCCL_ALGO unset)"
        )
    else:
        algorithm = "gloo's own (torch does not report it)"
    if n < 2:
        return {
            "backend": backend,
            "algorithm": algorithm,
            "busbw_gbps": None,
            "algbw_gbps": None,
            "reason": "a single rank has nothing to all-reduce with",
            "formula": metrics.BUSBW_FORMULA,
        }
    bench = [r["allreduce"] for r in results]
    slowest = max(b["seconds"] for b in bench)
    algbw, busbw = metrics.bus_bandwidth(bench[0]["payload_bytes"], slowest, n)
    return {
        "backend": backend,
        "algorithm": algorithm,
        "payload_bytes": bench[0]["payload_bytes"],
        "dtype": bench[0]["dtype"],
        "iterations": bench[0]["iterations"],
        "seconds_per_allreduce": slowest,
        "algbw_gbps": algbw / 1e9,
        "busbw_gbps": busbw / 1e9,
        "ranks": n,
        "formula": metrics.BUSBW_FORMULA + "; time = the slowest rank's mean",
        "reason": None,
    }


def _stragglers(ranks: list[dict]) -> dict | None:
    """None with one rank: no straggler probe runs (no other rank to wait for)."""
    times = {r["rank"]: r["local_compute_s_p50"] for r in ranks if r["local_compute_s_p50"] is not None}
    if not times:
        return None
    med = metrics.median(list(times.values()))
    slowest = max(times, key=lambda rank: times[rank])
    return {
        "metric": "each rank's own forward+backward time without the gradient all-reduce (DDP no_sync), median of 3",
        "slowest_rank": slowest,
        "slowest_s": times[slowest],
        "median_s": med,
        "slowest_vs_median": metrics.ratio(times[slowest], med),
    }


def _judge(body: dict, plan: dict, opts) -> list:
    out = []
    loss = body["loss"]
    fell = loss["last"] < loss["first"] * (1 - LOSS_DROP)
    out.append(
        make(
            "GD-SMOKE-006",
            Severity.PASS if fell else Severity.FAIL,
            f"loss {loss['first']:.3f} -> {loss['last']:.3f} "
            f"(mean of the first and last {LOSS_WINDOW} steps over ranks)"
            + (
                ""
                if fell
                else f": it did not fall by {LOSS_DROP:.0%}; training is broken (NaN/inf, a wrong gradient sync, data)"
            ),
            first=loss["first"],
            last=loss["last"],
        )
    )
    identical = body["params_identical"]
    groups: dict[str, list[int]] = {}
    for rank, checksum in body["param_checksums"].items():
        groups.setdefault(checksum, []).append(rank)
    out.append(
        make(
            "GD-SMOKE-007",
            Severity.PASS if identical else Severity.FAIL,
            f"all {len(body['ranks'])} ranks hold bit-identical parameters"
            if identical
            else "ranks disagree after training: "
            + "; ".join(f"{ranks_text(r)} -> {c}" for c, r in groups.items())
            + ". DDP keeps replicas identical; divergence means a rank updated differently (non-deterministic "
            "hardware, a broken all-reduce, silent data corruption)",
            checksums=body["param_checksums"],
        )
    )
    out += _floors(body, opts)
    precision = plan["precision"]
    out.append(make("GD-SMOKE-011", Severity.PASS if precision == "bf16" else Severity.INFO, plan["precision_reason"]))
    return out


def _floors(body: dict, opts) -> list:
    out = []
    if opts.floors.min_mfu is not None:
        mfu = body["mfu"]["vs_spec"]
        basis = "spec peak"
        if mfu is None:
            mfu, basis = body["mfu"]["vs_measured_matmul"], "measured matmul peak (no spec peak here)"
        good = mfu is not None and mfu >= opts.floors.min_mfu
        out.append(
            make(
                "GD-SMOKE-008",
                Severity.PASS if good else Severity.FAIL,
                f"MFU {mfu:.1%} against the {basis}; floor {opts.floors.min_mfu:.1%}",
                mfu=mfu,
                basis=basis,
            )
        )
    if opts.floors.min_busbw_gbps is not None:
        busbw = body["allreduce"]["busbw_gbps"]
        good = busbw is not None and busbw >= opts.floors.min_busbw_gbps
        shown = "not measured (one rank)" if busbw is None else f"{busbw:.2f} GB/s"
        out.append(
            make(
                "GD-SMOKE-014",
                Severity.PASS if good else Severity.FAIL,
                f"all-reduce bus bandwidth {shown} over {body['allreduce'].get('ranks') or 1} rank(s); "
                f"floor {opts.floors.min_busbw_gbps:g} GB/s",
                busbw_gbps=busbw,
                floor=opts.floors.min_busbw_gbps,
            )
        )
    if opts.floors.min_tokens_per_s is not None:
        tps = body["throughput"]["tokens_per_s"]
        good = tps >= opts.floors.min_tokens_per_s
        out.append(
            make(
                "GD-SMOKE-009",
                Severity.PASS if good else Severity.FAIL,
                f"{tps:,.0f} tokens/s over all ranks; floor {opts.floors.min_tokens_per_s:,.0f}",
                tokens_per_s=tps,
                floor=opts.floors.min_tokens_per_s,
            )
        )
    return out


def _group_busbw(results: list[dict], key: str) -> list[dict]:
    """One entry per group of a subgroup all-reduce (ranks in it, busbw from the slowest member's mean)."""
    groups: dict = {}
    for r in results:
        b = r.get(key)
        if b:
            groups.setdefault(tuple(b["group"]), []).append(b)
    out = []
    for ranks, members in sorted(groups.items()):
        slowest = max(m["seconds"] for m in members)
        algbw, busbw = metrics.bus_bandwidth(members[0]["payload_bytes"], slowest, len(ranks))
        out.append(
            {
                "ranks": list(ranks),
                "seconds_per_allreduce": slowest,
                "algbw_gbps": algbw / 1e9,
                "busbw_gbps": busbw / 1e9,
            }
        )
    return out


def _node_allreduce(results: list[dict]) -> dict:
    """Inside nodes and across nodes measured apart (only with two nodes or more; nothing added otherwise)."""
    if not any("allreduce_inter_node" in r for r in results):
        return {}
    intra, inter = _group_busbw(results, "allreduce_intra_node"), _group_busbw(results, "allreduce_inter_node")
    summary = {
        "intra_node_busbw_gbps_min": min((g["busbw_gbps"] for g in intra), default=None),
        "inter_node_busbw_gbps_min": min((g["busbw_gbps"] for g in inter), default=None),
        "inter_node_groups": inter,
        "node_formula": "intra: each node's ranks all-reduce together (all nodes at once); inter: the i-th rank of "
        "every node all-reduce together; busbw per group with n = its ranks, the slowest member's time",
    }
    return summary


def _nodes(ranks: list[dict], tokens_per_step: int, results: list[dict] | None = None) -> dict:
    """The per-node table: a node is the launcher's (GROUP_RANK/SLURM_NODEID/NODE_RANK), else a host.

    compute tokens/s: each rank's tokens per step over its own forward+backward time (no all-reduce wait),
    summed over the node's ranks. Under DDP every rank steps at the slowest rank's pace, so this, not the
    step time, shows which node is slow.
    """
    by_node: dict = {}
    hosts_of: dict = {}
    for r in ranks:
        key = (r.get("host"), r.get("node_index"))
        by_node.setdefault(key, []).append(r)
        hosts_of.setdefault(r.get("host"), set()).add(r.get("node_index"))
    rows = []
    for (host, index), members in sorted(by_node.items(), key=lambda kv: min(m["rank"] for m in kv[1])):
        shared = len(hosts_of[host]) > 1
        compute = [tokens_per_step / m["local_compute_s_p50"] for m in members if m["local_compute_s_p50"]]
        rows.append(
            {
                "node": f"{host}#{index}" if shared and index is not None else host,
                "host": host,
                "node_index": index,
                "ranks": [m["rank"] for m in members],
                "tokens_per_s": sum(m["tokens_per_s"] for m in members),
                "step_time_s_p50": metrics.median([m["step_time_s"]["p50"] for m in members]),
                "local_compute_s_p50": metrics.median([m["local_compute_s_p50"] for m in members]),
                "compute_tokens_per_s": sum(compute) if compute else None,
                "intra_busbw_gbps": next(
                    (
                        g["busbw_gbps"]
                        for g in _group_busbw(results or [], "allreduce_intra_node")
                        if set(g["ranks"]) == {m["rank"] for m in members}
                    ),
                    None,
                ),
            }
        )
    known = [n for n in rows if n["compute_tokens_per_s"]]
    if len(known) < 2:
        return {"nodes": rows, "slowest_node": None}
    med = metrics.median([n["compute_tokens_per_s"] for n in known])
    slow = min(known, key=lambda n: n["compute_tokens_per_s"])
    return {
        "nodes": rows,
        "slowest_node": {
            "node": slow["node"],
            "ranks": slow["ranks"],
            "compute_tokens_per_s": slow["compute_tokens_per_s"],
            "median_compute_tokens_per_s": med,
            "below_median": 1 - slow["compute_tokens_per_s"] / med,
            "metric": "tokens per step over each rank's own forward+backward time, summed over the node's ranks",
        },
    }


# -- text output ---------------------------------------------------------------------------
def _fmt(value, unit: str = "", scale: float = 1.0, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value * scale:,.{digits}f}{unit}"


def render_text(report: dict, file=None) -> None:
    from rich.console import Console
    from rich.markup import escape

    from gpudoctor.model import Finding
    from gpudoctor.report import text

    console = Console(file=file or sys.stdout, highlight=False, soft_wrap=True)
    launch = report["launch"]
    if launch["world_size"]:
        console.print(
            escape(
                f"gpudoctor smoke · {launch['world_size']} rank(s) via {launch['mode']} · backend "
                f"{launch.get('backend') or 'not chosen'} · {report['wall_s']:.1f} s"
            )
        )
    else:
        console.print(escape(f"gpudoctor smoke · no rank started · {report['wall_s']:.1f} s"))
    run = report.get("run")
    if run:
        m = run["model"]
        console.print(
            escape(
                f"model {m['name']}: {m['n_layer']} layers, d={m['d_model']}, seq {m['seq_len']}, "
                f"vocab {m['vocab']}, {m['params_matmul'] / 1e6:.1f}M matmul params, batch {m['batch_size']}/rank, "
                f"{m['steps']} steps ({m['warmup']} warm-up) · {run['precision']}"
                + (f" · {run['optimizer']}" if run["optimizer"] else "")
                + (" · compiled" if run["compile"] else "")
                + (" · --quick" if run.get("quick") else "")
            )
        )
    if report.get("throughput"):
        _print_metrics(console, report, escape)
    text.write([Finding.from_dict(f) for f in report["findings"]], file=file or sys.stdout)
    steps = report.get("next_steps")
    if steps is None and report.get("ranks"):  # a report written before next_steps: derived from what it holds
        steps = slowness.next_steps(report.get("findings") or [], report["ranks"], report.get("nodes") or [])
    for i, step in enumerate(steps or []):
        console.print(escape(("next: " if i == 0 else "      ") + step["text"]), style="bold" if i == 0 else None)
        for command in step.get("commands") or []:
            console.print(escape(f"        {command}"))
    console.print("[bold green]smoke run passed[/]" if report["ok"] else "[bold red]smoke run failed[/]")


def _print_metrics(console, report: dict, escape) -> None:
    t, st, mfu, ar, mem, loss = (report[k] for k in ("throughput", "step_time_s", "mfu", "allreduce", "memory", "loss"))
    lines = [
        f"throughput: {t['tokens_per_s']:,.0f} tokens/s, {t['samples_per_s']:,.1f} samples/s over all ranks",
        f"step time: p50 {_fmt(st['p50'], ' ms', 1e3)}, p95 {_fmt(st['p95'], ' ms', 1e3)} "
        f"({t['measured_steps']} steps after {t['warmup_steps']} warm-up)",
        f"compute: {report['flops']['achieved_tflops_total']:.2f} TFLOP/s achieved; "
        f"MFU {_fmt(mfu['vs_spec'], '%', 100)} of spec"
        + (f" ({mfu['spec_source']})" if mfu["spec_source"] else f" ({mfu['vs_spec_missing_reason']})")
        + f", {_fmt(mfu['vs_measured_matmul'], '%', 100)} of the measured {mfu['matmul']['dtype']} matmul peak "
        f"({_fmt(mfu['measured_matmul_tflops_median'], ' TFLOP/s', digits=2)} median, "
        + (
            "maximum achievable matmul, best shape " + "x".join(map(str, mfu["matmul"]["best_shape"])) + ")"
            if mfu["matmul"].get("best_shape")
            else f"n={mfu['matmul']['n']})"
        ),
        "all-reduce: "
        + (
            f"busbw {ar['busbw_gbps']:.2f} GB/s, algbw {ar['algbw_gbps']:.2f} GB/s "
            f"at {ar['payload_bytes'] / 2**20:.0f} MiB "
            f"{ar['dtype']} ({ar['algorithm']})"
            if ar["busbw_gbps"] is not None
            else ar["reason"]
        )
        + (f"; NCCL transport: {transport.describe(report['nccl_transport'])}" if report.get("nccl_transport") else ""),
        f"memory: peak {mem['peak_bytes_max'] / 2**20:,.0f} MiB ({mem['kind']})"
        + (
            f", {mem['reserved_peak_bytes_max'] / 2**20:,.0f} MiB reserved by the caching allocator"
            if mem.get("reserved_peak_bytes_max")
            else ""
        )
        + (f", of {mem['device_total_bytes'] / 2**20:,.0f} MiB on the GPU" if mem.get("device_total_bytes") else ""),
        f"loss: {loss['first']:.3f} -> {loss['last']:.3f}; parameters identical on all ranks: "
        + {True: "yes", False: "no", None: "not compared"}.get(
            report["params_identical"], str(report["params_identical"])
        ),
    ]
    for line in lines:
        console.print("  " + escape(line))
    nodes = report.get("nodes") or []
    if len(nodes) > 1:
        for n in nodes:
            step, own = _fmt(n["step_time_s_p50"], " ms", 1e3), _fmt(n["local_compute_s_p50"], " ms", 1e3)
            console.print(
                escape(
                    f"  node {n['node']} ({ranks_text(n['ranks'])}): {n['tokens_per_s']:,.0f} tok/s, step p50 {step}, "
                    f"own fwd+bwd p50 {own}, all-reduce inside the node "
                    f"{_fmt(n.get('intra_busbw_gbps'), ' GB/s', digits=2)} busbw"
                )
            )
        ar = report["allreduce"] or {}
        if "inter_node_busbw_gbps_min" in ar:
            across = _fmt(ar["inter_node_busbw_gbps_min"], " GB/s", digits=2)
            inside = _fmt(ar["intra_node_busbw_gbps_min"], " GB/s", digits=2)
            console.print(
                escape(
                    f"  all-reduce across nodes: busbw {across} (slowest group), inside nodes {inside} (slowest node)"
                )
            )
    right = report.get("correctness")
    if right:
        memory = [r["memory"]["bytes"] for r in right["per_rank"] if (r.get("memory") or {}).get("bytes")]
        lines_right = f"correctness: {right['verdict']} ({right['compared']}"
        if memory:
            lines_right += f"; device memory patterns over {min(memory) / 2**20:,.0f} MiB or more per rank"
        console.print("  " + escape(lines_right + ")"))
    for line in _speed_lines(report) + _soak_lines(report.get("soak")):
        console.print("  " + escape(line))
    slow = {s["rank"] for s in (report.get("parts") or {}).get("slow", [])}
    for r in report["ranks"]:
        console.print(
            escape(
                f"    rank {r['rank']} {r['host']} {r['device']}: {r['tokens_per_s']:,.0f} tok/s, "
                f"step p50 {_fmt(r['step_time_s']['p50'], ' ms', 1e3)}, "
                f"{r['achieved_tflops']:.2f} TFLOP/s, {_figures_text(r)}"
                + f", data wait p50 {_fmt(r['data_wait_s_p50'], ' ms', 1e3)}"
                + (" <- slow" if r["rank"] in slow else "")
            ),
            style="bold" if r["rank"] in slow else "dim",
        )


def _figure(value: float | None, unit: str) -> str:
    return _fmt(value, " " + unit, digits=2 if value is not None and value < 100 else 0)


def _figures_text(row: dict) -> str:
    """A rank's figures that have a label in the figure table; one it did not measure (no GPU: no host copy)
    is left out."""
    shown = [f for f in figures.RANK if f.label and row.get(f.key) is not None]
    return ", ".join(f"{f.label} {_figure(row[f.key], f.unit)}" for f in shown)


def _speed_lines(report: dict) -> list[str]:
    """The parts' medians, the node pairs and the scaling, one line each."""
    lines = []
    parts = report.get("parts")
    if parts:
        med = parts["job_medians"]
        shown = [
            f"{f['what']} {_figure(med[f['key']], f['unit'])}"
            for f in parts["figures"]
            if med.get(f["key"]) is not None
        ]
        lines.append("parts (median over ranks): " + ", ".join(shown))
    links = report.get("links")
    if links:
        pairs = ", ".join(f"{p['nodes'][0]}-{p['nodes'][1]} {p['gbps']:.3g}" for p in links["pairs"])
        lines.append(f"node pairs (GB/s each way, {links['rounds']} round(s)): {pairs}")
    scaling = report.get("scaling")
    if scaling and scaling.get("efficiency") is not None:
        lines.append(
            f"scaling: {scaling['efficiency']:.0%} of each step is the rank's own compute "
            f"({scaling['communication_share']:.0%} waiting, all-reduce, data, optimizer)"
        )
    return lines


def _soak_lines(section: dict | None) -> list[str]:
    """Each rank's figures over the soak: its first and last samples' matmul, and its clock or CPU share then."""
    if not section:
        return []
    lines = [
        f"soak: {section['duration_s']:g} s, {section['samples_per_rank']} samples per rank ({section['reference']})"
    ]
    for r in section["per_rank"]:
        first, last = r["samples"][0], r["samples"][-1]
        clock = (
            f", SM clock {first.get('sm_clock_mhz')} -> {last.get('sm_clock_mhz')} MHz, "
            f"{first.get('temperature_c')} -> {last.get('temperature_c')} °C"
            if first.get("sm_clock_mhz") is not None
            else ""
        )
        lines.append(
            f"  rank {r['rank']}: matmul {first['matmul_tflops']:.3g} -> {last['matmul_tflops']:.3g} TFLOP/s, "
            f"memory copy {first['memory_copy_gbps']:.3g} -> {last['memory_copy_gbps']:.3g} GB/s{clock}"
        )
    return lines


def print_json(report: dict, file=None) -> None:
    from gpudoctor.report.json_report import strict_json  # NaN/Infinity (a diverged loss) as strings: strict JSON

    out = file or sys.stdout
    out.write(json_text(strict_json(report), indent=2, default=str, allow_nan=False) + "\n")
    out.flush()
