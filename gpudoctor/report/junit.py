"""JUnit XML for CI systems: one testsuite per category, one testcase per finding."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import replace

from gpudoctor.model import Finding, Severity
from gpudoctor.report.result import Result
from gpudoctor.sanitize import clean

# Characters XML 1.0 cannot hold (most control characters, lone surrogates): one in a message,
# e.g. from an environment value, would make the whole report unparsable for the CI.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml(text: str) -> str:
    return _NOT_XML.sub("\ufffd", text)


def render(result: Result) -> str:
    """Those outside the verdict as skipped, saying why and what they found, so the JUnit failures match the
    exit code."""
    outside = {id(f) for f in result.outside}
    host = result.target.hostname if result.target is not None else "this machine"
    shown = []
    for f in result.findings:
        if id(f) in outside and f.severity is not Severity.SKIP:
            f = replace(
                f,
                severity=Severity.SKIP,
                message=f"about {host}, not where the job runs ({f.severity.value}): {f.message}",
            )
        shown.append(f)
    return document(shown, strict=result.strict)


def document(findings: list[Finding], strict: bool = False) -> str:
    by_cat: dict[str, list[Finding]] = defaultdict(list)
    for f in findings:
        by_cat[f.category].append(f)
    root = ET.Element("testsuites", name="gpudoctor")
    totals: defaultdict[str, int] = defaultdict(int)
    for cat, items in by_cat.items():
        suite = ET.SubElement(root, "testsuite", name=f"gpudoctor.{cat}")
        counts: defaultdict[str, int] = defaultdict(int)
        for f in items:
            case = ET.SubElement(suite, "testcase", classname=f"gpudoctor.{cat}", name=f"{f.id} {f.name}")
            message = _xml(clean(f.message))
            text = message + (f"\nfix: {_xml(clean(f.fix.title))}" if f.fix else "")
            failing = f.severity is Severity.FAIL or (strict and f.severity is Severity.WARN)
            if failing:
                ET.SubElement(case, "failure", message=message, type=f.severity.value).text = text
                counts["failures"] += 1
            elif f.severity is Severity.ERROR:
                ET.SubElement(case, "error", message=message, type="error").text = text
                counts["errors"] += 1
            elif f.severity is Severity.SKIP:
                ET.SubElement(case, "skipped", message=message)
                counts["skipped"] += 1
            else:
                ET.SubElement(case, "system-out").text = f"{f.severity.value}: {text}"
        for k in ("failures", "errors", "skipped"):
            suite.set(k, str(counts[k]))
            totals[k] += counts[k]
        suite.set("tests", str(len(items)))
        totals["tests"] += len(items)
    for k, v in totals.items():
        root.set(k, str(v))
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
