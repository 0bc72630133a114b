"""`check --prometheus FILE`: node_exporter's textfile format, read back by prometheus_client's own parser."""

from __future__ import annotations

import os

from prometheus_client.parser import text_string_to_metric_families

from tests.cliutil import run_gpudoctor_here
from tests.factsutil import FIXTURES

RECORDED_CPU = str(FIXTURES / "facts" / "recorded-cpu-debian12-torch2.13-nogpu.json")


def _families(path) -> dict:
    return {f.name: f for f in text_string_to_metric_families(path.read_text())}


def test_the_verdict_as_prometheus_metrics(tmp_path):
    out = tmp_path / "gpudoctor.prom"
    r = run_gpudoctor_here("check", "--snapshot", RECORDED_CPU, "--prometheus", str(out), "--json")
    assert r.returncode == 1, r.stderr  # the recorded CPU machine has no driver: a fail
    families = _families(out)
    checks = {s.labels["id"]: s for s in families["gpudoctor_check"].samples}
    assert families["gpudoctor_check"].type == "gauge"
    drv = checks["GD-DRV-001"]
    assert drv.labels["severity"] == "fail" and drv.labels["category"] == "driver" and drv.value == 5
    problems = {s.labels["id"]: s.value for s in families["gpudoctor_check_problem"].samples}
    assert problems["GD-DRV-001"] == 1 and all(v in (0, 1) for v in problems.values())
    import json

    findings = json.loads(r.stdout)["findings"]
    assert set(checks) == {f["id"] for f in findings}  # one gauge per check, the same checks as the report
    (exit_code,) = families["gpudoctor_exit_code"].samples
    assert exit_code.value == r.returncode
    (stamp,) = families["gpudoctor_last_run_timestamp_seconds"].samples
    assert stamp.value > 1.7e9
    counts = {s.labels["severity"]: s.value for s in families["gpudoctor_findings"].samples}
    assert counts["fail"] == sum(f["severity"] == "fail" for f in findings)


def test_the_file_is_replaced_whole_and_labels_are_escaped(tmp_path):
    from gpudoctor.model import Finding, Severity
    from gpudoctor.report import prometheus

    out = tmp_path / "gpudoctor.prom"
    out.write_text("old\n")
    os.chmod(out, 0o644)
    r = run_gpudoctor_here("check", "--snapshot", RECORDED_CPU, "--select", "host", "--prometheus", str(out))
    assert r.returncode in (0, 1) and "old" not in out.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["gpudoctor.prom"]  # no temporary file left beside it
    odd = Finding("ACME-X-1", "odd", "host", Severity.WARN, "t", "m")
    text = prometheus.document([odd], 0, 1.0, hostname='gpu"01\\\nx')
    (info,) = _families_text(text)["gpudoctor_info"].samples
    assert info.labels["hostname"] == 'gpu"01\\\nx'


def _families_text(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}
