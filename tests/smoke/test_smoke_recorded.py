"""Smoke reports recorded on a real H200 (tests/fixtures/smoke/README.md) follow the schema and render as text."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from gpudoctor.sample_train.judge import report

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "smoke"
SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs" / "smoke.schema.json").read_text())


@pytest.mark.parametrize("name", ["recorded-h200-smoke3-healthy.json", "recorded-h200-smoke3-memory-held.json"])
def test_a_recorded_h200_report_follows_the_schema_and_renders(name, capsys):
    rep = json.loads((FIXTURES / name).read_text())
    jsonschema.Draft202012Validator(SCHEMA).validate(rep)
    report.render_text(rep)
    out = capsys.readouterr().out
    assert "MFU" in out and "maximum achievable matmul" in out
    assert "NCCL transport: no connection (one rank); network plug-in: Socket" in out


def test_the_recorded_run_beside_a_memory_holder_names_it_and_ran_small():
    rep = json.loads((FIXTURES / "recorded-h200-smoke3-memory-held.json").read_text())
    held = next(f for f in rep["findings"] if f["id"] == "GD-SMOKE-023")
    assert held["severity"] == "warn" and "PID 1052" in held["message"]
    assert rep["run"]["model"]["name"] == "small" and rep["ok"]
