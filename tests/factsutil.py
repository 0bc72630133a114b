"""Test helpers: facts fixtures (data, not mocks) and running one check over them."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from gpudoctor.facts import Facts
from gpudoctor.model import Context, Severity
from gpudoctor.registry import load_all
from gpudoctor.runner import run_check

FIXTURES = Path(__file__).parent / "fixtures"
HEALTHY_GPU = "synthetic-h100x8-healthy"
RECORDED_CPU = "recorded-cpu-debian12-torch2.13-nogpu"


def load_fixture(name: str) -> dict:
    return json.loads((FIXTURES / "facts" / f"{name}.json").read_text())


def _set(data, dotted: str, value) -> None:
    keys = dotted.split(".")
    node = data
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node.setdefault(k, {})
    last = keys[-1]
    if isinstance(node, list):
        node[int(last)] = value
    elif value is _DELETE:
        node.pop(last, None)
    else:
        node[last] = value


_DELETE = object()
DELETE = _DELETE  # patch value that removes the key


def make_facts(
    base: str = HEALTHY_GPU, env: dict | None = None, patch: dict | None = None, each_gpu: dict | None = None
) -> Facts:
    """A fixture with changes: env vars replace the fixture's, patch sets dotted paths,
    each_gpu sets keys on every GPU ("pcie.width_current": 8)."""
    data = copy.deepcopy(load_fixture(base))
    if env is not None:
        data.setdefault("env", {})["vars"] = dict(env)
    for dotted, value in (patch or {}).items():
        _set(data, dotted, value)
    for gpu in range(len(data.get("nvidia", {}).get("gpus", []))):
        for dotted, value in (each_gpu or {}).items():
            _set(data, f"nvidia.gpus.{gpu}.{dotted}", value)
    return Facts.from_dict(data)


def run(check_id: str, facts: Facts, **ctx):
    """The findings of one check; most checks give exactly one."""
    spec = load_all()[check_id]
    return run_check(spec, facts, Context(**ctx))


def severity(check_id: str, facts: Facts, **ctx) -> Severity:
    findings = run(check_id, facts, **ctx)
    return max(findings, key=lambda f: f.severity.rank).severity


def said(finding) -> str:
    """All a finding says in words: its one-sentence message and the rest of a longer one, which
    gpudoctor.runner.one_sentence keeps as the `detail` evidence (a Finding, or its JSON dict)."""
    if isinstance(finding, dict):
        message, evidence = finding.get("message", ""), finding.get("evidence") or {}
    else:
        message, evidence = finding.message, finding.evidence or {}
    rest = " ".join(str(v) for v in evidence.values())
    return f"{message} {rest}"
