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


def _label(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in labels.items()) + "}"


def render(findings: list[Finding], exit_code: int, timestamp: float, hostname: str | None = None) -> str:
    """The metrics of one check run: one gauge per check (its worst finding), counts, the exit code, the time."""
    worst: dict[str, Finding] = {}
    for f in findings:
        if f.id not in worst or f.severity.rank > worst[f.id].severity.rank:
            worst[f.id] = f
    ranks = ", ".join(f"{s.rank} {s.value}" for s in sorted(Severity, key=lambda s: s.rank))
    lines = [
        f"# HELP gpudoctor_check The worst verdict of each gpudoctor check ({ranks}).",
        "# TYPE gpudoctor_check gauge",
    ]
    for f in sorted(worst.values(), key=lambda f: f.id):
        labels = _labels(id=f.id, name=f.name, category=f.category, severity=f.severity.value)
        lines.append(f"gpudoctor_check{labels} {f.severity.rank}")
    lines += [
        "# HELP gpudoctor_check_problem 1 when the check's verdict is warn, fail or error, else 0 (for alerts).",
        "# TYPE gpudoctor_check_problem gauge",
    ]
    bad = (Severity.WARN, Severity.FAIL, Severity.ERROR)
    for f in sorted(worst.values(), key=lambda f: f.id):
        lines.append(f"gpudoctor_check_problem{_labels(id=f.id, category=f.category)} {int(f.severity in bad)}")
    counts = Counter(f.severity.value for f in findings)
    lines += ["# HELP gpudoctor_findings Findings of the last run by severity.", "# TYPE gpudoctor_findings gauge"]
    lines += [f"gpudoctor_findings{_labels(severity=s.value)} {counts.get(s.value, 0)}" for s in Severity]
    lines += [
        "# HELP gpudoctor_exit_code The exit code of the last `gpudoctor check` (0 ok, 1 a fail).",
        "# TYPE gpudoctor_exit_code gauge",
        f"gpudoctor_exit_code {int(exit_code)}",
        "# HELP gpudoctor_last_run_timestamp_seconds When the last check ran (Unix time).",
        "# TYPE gpudoctor_last_run_timestamp_seconds gauge",
        f"gpudoctor_last_run_timestamp_seconds {timestamp:.3f}",
    ]
    if hostname:
        lines += [
            "# HELP gpudoctor_info The host the facts were probed on.",
            "# TYPE gpudoctor_info gauge",
            f"gpudoctor_info{_labels(hostname=hostname)} 1",
        ]
    return "\n".join(lines) + "\n"
