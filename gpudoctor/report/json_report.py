"""The gpudoctor.report/1 JSON object (docs/report.schema.json)."""

from __future__ import annotations

import math
import platform

from gpudoctor import __version__
from gpudoctor.model import Finding
from gpudoctor.report.result import Result
from gpudoctor.runner import summarize
from gpudoctor.sanitize import json_text

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


def render(result: Result) -> str:
    return document(result.findings, result.source, result.extra)


def document(findings: list[Finding], facts_meta: dict | None = None, extra: dict | None = None) -> str:
    # default=str: evidence quoted from a YAML config may hold dates, sets or bytes.
    # allow_nan=False: NaN/Infinity are not JSON (RFC 8259); strict parsers (jq, JSON.parse, Go) reject them.
    return json_text(strict_json(build(findings, facts_meta, extra)), indent=2, default=str, allow_nan=False) + "\n"


NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def strict_json(value):
    """value with every non-finite float as the string JSON parsers that allow them would read ('NaN',
    'Infinity', '-Infinity'), and every string cleared of lone surrogates (no UTF-8 encodes them)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else NON_FINITE[repr(value)]
    if isinstance(value, str):
        return _clean_text(value)
    if isinstance(value, dict):
        return {strict_json(k) if isinstance(k, (str, float)) else k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def _clean_text(text: str) -> str:
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
