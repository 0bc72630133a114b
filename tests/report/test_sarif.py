"""`--format sarif` (gpudoctor/report/sarif.py): a SARIF 2.1.0 log that validates against the OASIS schema
(tests/fixtures/sarif/, provenance in its README), one result per finding of the verdict at its line."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from tests.cliutil import run_gpudoctor_here
from tests.factsutil import FIXTURES

SCHEMA = json.loads((FIXTURES / "sarif" / "sarif-schema-2.1.0.json").read_text())
SCRIPTS = FIXTURES / "sbatch"
CASES = [
    SCRIPTS / "seed-guide-correct-approach.slurm",
    SCRIPTS / "seed-broken-gres1-ntasks8.slurm",
    SCRIPTS / "correct-srun-ntasks8-gres8.slurm",
    SCRIPTS / "realworld" / "localhost-master-addr-4nodes.slurm",
]


def _sarif(*args: str) -> dict:
    r = run_gpudoctor_here("check", *args, "--format", "sarif")
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_the_log_validates_and_holds_each_problem_at_its_line(path):
    log = _sarif("--sbatch", str(path))
    jsonschema.Draft4Validator(SCHEMA).validate(log)
    report = json.loads(run_gpudoctor_here("check", "--sbatch", str(path), "--json").stdout)
    outside = set(report["target"]["outside_verdict"])
    wanted = [
        f for f in report["findings"] if f["severity"] in ("fail", "warn", "error", "info") and f["id"] not in outside
    ]
    (run,) = log["runs"]
    assert len(run["results"]) == len(wanted)
    rules = run["tool"]["driver"]["rules"]
    for result, finding in zip(run["results"], wanted, strict=True):
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"] == finding["id"]
        assert result["message"]["text"] == finding["message"]
        line = (finding.get("location") or {}).get("line")
        if line:
            assert result["locations"][0]["physicalLocation"]["region"]["startLine"] == line


def test_a_file_name_with_blanks_and_escapes_stays_a_valid_uri(tmp_path):
    odd = tmp_path / "my job \x1b[31m.slurm"
    odd.write_text((SCRIPTS / "seed-broken-gres1-ntasks8.slurm").read_text())
    log = _sarif("--sbatch", str(odd))
    jsonschema.Draft4Validator(SCHEMA).validate(log)
    text = json.dumps(log)
    assert "\\u001b" not in text and "\x1b" not in text
    uri = log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    assert " " not in uri and Path(uri.replace("%20", " ")).name.startswith("my job")
