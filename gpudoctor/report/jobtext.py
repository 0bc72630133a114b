"""The text report of a job judged across its ranks (`gpudoctor compare`, `gpudoctor check --job`): each problem
once, with the nodes and ranks it is on. The text format's layout for a Result of kind "job"."""

from __future__ import annotations

from collections import defaultdict

from gpudoctor.report.result import Result
from gpudoctor.report.screen import finding_head, terminal_width, wrap


def render(result: Result) -> str:
    """One report for the whole job: each problem once, with where it is ('fail on gpu-017 (ranks 8–15)')."""
    findings, job, header = result.findings, result.job or {}, result.view.header
    verbose = result.detail == "all"
    members = job.get("members", [])
    nodes = sorted({m["node"] for m in members})
    lines: list[str] = []

    width = result.width or terminal_width()

    def say(text: str, indent: int = 0, hang: int = 2) -> None:  # wrap() cleans: node names come from elsewhere
        lines.extend(line + "\n" for line in wrap(text, width, indent, hang))

    say(header + f" · {len(members)} rank(s) on {len(nodes)} node(s)")
    order = {"fail": 0, "error": 1, "warn": 2, "info": 3, "pass": 4, "skip": 5}
    for f in sorted(findings, key=lambda f: (order[f.severity.value], f.id)):
        sev = f.severity.value
        if sev in ("pass", "skip") and not verbose:
            continue
        say(finding_head(f), 0, 4)
        if f.evidence.get("detail"):  # the rest of a long message: which node has what (two lines; all with -v)
            rows = wrap(str(f.evidence["detail"]), width, 4, 6)
            lines.extend(r + "\n" for r in rows[: None if verbose else 2])
            if len(rows) > 2 and not verbose:
                lines[-1] = lines[-1].rstrip("\n")[: width - 6] + " (-v)\n"
        if f.fix:
            say(f"fix ({f.fix.safety.value}): {f.fix.title}", 2, 6)
    counts: dict = defaultdict(int)
    for f in findings:
        counts[f.severity.value] += 1
    verdict = "problems found" if counts["fail"] else ("warnings" if counts["warn"] else "no problems found")
    summary = ", ".join(f"{counts[s]} {s}" for s in ("fail", "warn", "error", "info", "pass", "skip") if counts[s])
    lines.append("\n")
    say(f"{verdict}: {summary or 'no checks ran'}; {nodes_summary(nodes, findings)}")
    return "".join(lines)


def nodes_summary(nodes: list[str], findings) -> str:
    """How many nodes pass, have only warnings, or fail: a warn is not a failed node."""
    worst = {node: _node_worst(node, findings) for node in nodes}
    passing = sum(1 for w in worst.values() if w is None)
    warned = sum(1 for w in worst.values() if w == "warn")
    failing = len(nodes) - passing - warned
    parts = [f"pass on {passing} of {len(nodes)} node(s)"] if passing or not nodes else []
    if warned:
        parts.append(f"{warned} node{'s' if warned > 1 else ''} with warnings")
    if failing:
        parts.append(f"{failing} node{'s' if failing > 1 else ''} failing")
    return ", ".join(parts)


def _node_worst(node: str, findings) -> str | None:
    """'fail' (a fail or error names the node), 'warn' (only warnings do) or None."""
    named = {
        f.severity.value
        for f in findings
        if f.severity.value in ("fail", "error", "warn") and node in (f.evidence.get("nodes") or [])
    }
    if named & {"fail", "error"}:
        return "fail"
    return "warn" if "warn" in named else None
