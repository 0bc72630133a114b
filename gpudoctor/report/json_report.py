"""The gpudoctor.report/1 JSON object (docs/report.schema.json)."""

from __future__ import annotations

import json
import platform

from gpudoctor import __version__
from gpudoctor.model import Finding
from gpudoctor.runner import summarize

SCHEMA = "gpudoctor.report/1"


def build(findings: list[Finding], facts_meta: dict | None = None, extra: dict | None = None) -> dict:
    tool = {"name": "gpudoctor", "version": __version__, "python": platform.python_version()}
    report = {
        "schema": SCHEMA,
        "tool": tool,
        "source": facts_meta or {},
        "summary": summarize(findings),
        "findings": [f.to_dict() for f in findings],
    }
    if extra:
        report.update(extra)
    return report


def render(findings: list[Finding], facts_meta: dict | None = None, extra: dict | None = None) -> str:
    # default=str: evidence quoted from a YAML config may hold dates, sets or bytes
    return json.dumps(build(findings, facts_meta, extra), indent=2, default=str) + "\n"
