"""`--format sarif`: the verdict as a SARIF 2.1.0 log (OASIS, https://docs.oasis-open.org/sarif/sarif/v2.1.0/),
which GitHub code scanning and other viewers read, as ruff and other linters offer it.

One run, its tool gpudoctor with one rule per check the findings come from; one result per finding of the
verdict (Result.verdict: a note too, as "note"), at the line it is about (report/annotations.where: the
finding's own location, else line 1 of the job's script or config, else no location). The fix's title and
safety ride in the result's properties: a SARIF `fix` needs byte replacements, which `gpudoctor fix` makes.
Every text goes through the one sanitiser (gpudoctor.sanitize.clean). tests/report/test_sarif.py validates the
output against the OASIS schema (tests/fixtures/sarif/sarif-schema-2.1.0.json).
"""

from __future__ import annotations

import json
from urllib.parse import quote

from gpudoctor import __version__
from gpudoctor.model import Finding, Severity
from gpudoctor.report.annotations import where
from gpudoctor.report.result import Result
from gpudoctor.sanitize import clean

SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
LEVEL = {Severity.FAIL: "error", Severity.ERROR: "error", Severity.WARN: "warning", Severity.INFO: "note"}


def _location(finding: Finding, result: Result) -> list[dict]:
    loc = where(finding, result.ctx)
    if loc is None:
        return []
    region = {
        k: v
        for k, v in (
            ("startLine", loc.line or 1),
            ("startColumn", loc.column),
            ("endLine", loc.end_line),
            ("endColumn", loc.end_column),
        )
        if v is not None
    }
    uri = quote(clean(loc.file), safe="/:._-~")
    return [{"physicalLocation": {"artifactLocation": {"uri": uri}, "region": region}}]


def render(result: Result) -> str:
    findings = [f for f in result.verdict if f.severity in LEVEL]
    ids = sorted({f.id for f in findings})
    by_id = {f.id: f for f in findings}
    rules = [
        {
            "id": cid,
            "name": by_id[cid].name,
            "shortDescription": {"text": clean(by_id[cid].title)},
            "help": {"text": f"gpudoctor explain {cid}"},
        }
        for cid in ids
    ]
    results = []
    for f in findings:
        entry: dict = {
            "ruleId": f.id,
            "ruleIndex": ids.index(f.id),
            "level": LEVEL[f.severity],
            "message": {"text": clean(f.message)},
            "locations": _location(f, result),
        }
        if f.fix is not None:
            entry["properties"] = {"fix": clean(f.fix.title), "safety": f.fix.safety.value}
        results.append(entry)
    log = {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "gpudoctor",
                        "version": __version__,
                        "rules": rules,
                    }
                },
                "results": results,
            }
        ],
    }
    return json.dumps(log, indent=2) + "\n"
