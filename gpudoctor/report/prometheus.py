"""The verdict in node_exporter's textfile-collector format, for a cron job or systemd timer that refreshes
it (`gpudoctor check --prometheus /var/lib/node_exporter/textfile/gpudoctor.prom`).

Prometheus text exposition format 0.0.4: `# HELP`/`# TYPE` lines, then `name{label="value"} number`; label
values escape backslash, double quote and newline. node_exporter reads every *.prom file in its directory
on each scrape, so the file is replaced atomically (gpudoctor.fileio.write_output: a temporary file and a
rename in the same directory), never seen half-written.

    gpudoctor_check{id="GD-DRV-001",name="nvidia-driver-unusable",category="driver",severity="fail"} 5
    gpudoctor_check_problem{id="GD-DRV-001",category="driver"} 1
    gpudoctor_findings{severity="fail"} 1
    gpudoctor_exit_code 1
    gpudoctor_last_run_timestamp_seconds 1.7640e+09
"""

from __future__ import annotations

from collections import Counter

from gpudoctor.model import Finding, Severity
from gpudoctor.report.result import Result


def _label(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in labels.items()) + "}"


def render(result: Result) -> str:
    return document(result.verdict, result.exit_code, result.judged_at, result.hostname, result.metric_prefix)


def document(
    findings: list[Finding], exit_code: int, timestamp: float, hostname: str | None = None, prefix: str = "gpudoctor"
) -> str:
    """The metrics of one check run: one gauge per check (its worst finding), counts, the exit code, the time.
    prefix: the metric names' (gpudoctor_smoke for a smoke run's verdicts)."""
    worst: dict[str, Finding] = {}
    for f in findings:
        if f.id not in worst or f.severity.rank > worst[f.id].severity.rank:
            worst[f.id] = f
    ranks = ", ".join(f"{s.rank} {s.value}" for s in sorted(Severity, key=lambda s: s.rank))
    lines = [
        f"# HELP {prefix}_check The worst verdict of each gpudoctor check ({ranks}).",
        f"# TYPE {prefix}_check gauge",
    ]
    for f in sorted(worst.values(), key=lambda f: f.id):
        labels = _labels(id=f.id, name=f.name, category=f.category, severity=f.severity.value)
        lines.append(f"{prefix}_check{labels} {f.severity.rank}")
    lines += [
        f"# HELP {prefix}_check_problem 1 when the check's verdict is warn, fail or error, else 0 (for alerts).",
        f"# TYPE {prefix}_check_problem gauge",
    ]
    bad = (Severity.WARN, Severity.FAIL, Severity.ERROR)
    for f in sorted(worst.values(), key=lambda f: f.id):
        lines.append(f"{prefix}_check_problem{_labels(id=f.id, category=f.category)} {int(f.severity in bad)}")
    counts = Counter(f.severity.value for f in findings)
    lines += [f"# HELP {prefix}_findings Findings of the last run by severity.", f"# TYPE {prefix}_findings gauge"]
    lines += [f"{prefix}_findings{_labels(severity=s.value)} {counts.get(s.value, 0)}" for s in Severity]
    lines += [
        f"# HELP {prefix}_exit_code The exit code of the last run (0 ok, 1 a fail).",
        f"# TYPE {prefix}_exit_code gauge",
        f"{prefix}_exit_code {int(exit_code)}",
        f"# HELP {prefix}_last_run_timestamp_seconds When the last run ended (Unix time).",
        f"# TYPE {prefix}_last_run_timestamp_seconds gauge",
        f"{prefix}_last_run_timestamp_seconds {timestamp:.3f}",
    ]
    if hostname:
        lines += [
            f"# HELP {prefix}_info The host the facts were probed on.",
            f"# TYPE {prefix}_info gauge",
            f"{prefix}_info{_labels(hostname=hostname)} 1",
        ]
    return "\n".join(lines) + "\n"


def _gauge(name: str, help_text: str, samples: list[tuple[dict, float | None]]) -> list[str]:
    known = [(labels, value) for labels, value in samples if value is not None]
    if not known:
        return []
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    return lines + [f"{name}{_labels(**labels) if labels else ''} {float(value):.6g}" for labels, value in known]


def render_smoke(report: dict, timestamp: float) -> str:
    """A smoke run's figures (gpudoctor.smoke/3 report) as gauges, then its verdicts as document() writes them."""
    throughput, mfu = report.get("throughput") or {}, report.get("mfu") or {}
    allreduce, scaling = report.get("allreduce") or {}, report.get("scaling") or {}
    parts = []
    for row in report.get("ranks") or []:
        where = {"rank": str(row["rank"]), "host": str(row.get("host")), "gpu": str(row.get("gpu_uuid") or "")}
        for f in (report.get("parts") or {}).get("figures", []):
            parts.append(({**where, "part": f["key"], "unit": f["unit"]}, row.get(f["key"])))
    links = [
        ({"a": p["nodes"][0], "b": p["nodes"][1]}, p["gbps"]) for p in (report.get("links") or {}).get("pairs", [])
    ]
    excluded: list[tuple[dict, float | None]] = [
        ({"host": h}, 1.0) for h in (report.get("exclude") or {}).get("hosts", [])
    ]
    lines = [
        *_gauge("gpudoctor_smoke_ok", "1 when the smoke run passed.", [({}, float(bool(report.get("ok"))))]),
        *_gauge(
            "gpudoctor_smoke_tokens_per_second",
            "Tokens per second over all ranks.",
            [({}, throughput.get("tokens_per_s"))],
        ),
        *_gauge(
            "gpudoctor_smoke_mfu",
            "Model FLOP utilisation against the spec peak and the measured matmul peak.",
            [({"basis": "spec"}, mfu.get("vs_spec")), ({"basis": "measured_matmul"}, mfu.get("vs_measured_matmul"))],
        ),
        *_gauge(
            "gpudoctor_smoke_busbw_gbps",
            "All-reduce bus bandwidth (nccl-tests' busbw), GB/s.",
            [({}, allreduce.get("busbw_gbps"))],
        ),
        *_gauge(
            "gpudoctor_smoke_scaling_efficiency",
            "Own compute over the synchronised step.",
            [({}, scaling.get("efficiency"))],
        ),
        *_gauge("gpudoctor_smoke_part", "Each rank's measured parts (see the unit label).", parts),
        *_gauge("gpudoctor_smoke_link_gbps", "Send/recv between two nodes, GB/s each way.", links),
        *_gauge("gpudoctor_smoke_excluded", "1 for a host the run says to exclude.", excluded),
    ]
    findings = [Finding.from_dict(f) for f in report.get("findings") or []]
    return "\n".join(lines) + "\n" + document(findings, report.get("exit_code", 1), timestamp, prefix="gpudoctor_smoke")
