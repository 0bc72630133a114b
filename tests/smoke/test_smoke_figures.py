"""The seam of a new smoke figure: one row of the figure table (judge/figures.py) alone yields its JSON field,
its text line, its Prometheus sample, its baseline entry and its --min-... flag (docs/architecture.md "A new
smoke figure"). In-process: fake rank results, no training run started."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import jsonschema
from prometheus_client.parser import text_string_to_metric_families

from gpudoctor.report import prometheus
from gpudoctor.sample_train import cli
from gpudoctor.sample_train.judge import baseline, figures, report
from gpudoctor.sample_train.options import from_args
from tests.smoke.test_smoke import FALLING, fake_result, judged

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs" / "smoke.schema.json").read_text())
L2 = figures.Figure(
    "l2_cache_gbps",
    "L2 cache read",
    "GB/s",
    measured=("l2_cache", "gbps"),
    floor=figures.Floor("--min-l2bw", "min_l2bw_gbps", "GBPS", "fail a rank whose L2 cache read is below GB/s"),
    label="L2",
)


def _results(l2: dict[int, float]) -> list[dict]:
    out = []
    for rank, gbps in l2.items():
        r = fake_result(rank, FALLING)
        r["parts"] = {"l2_cache": {"bytes": 1 << 20, "gbps": gbps}}
        out.append(r)
    return out


def test_a_figure_row_alone_yields_its_json_text_prometheus_and_baseline(monkeypatch):
    monkeypatch.setattr(figures, "RANK", (*figures.RANK, L2))
    rep, _ = judged(_results({0: 40.0, 1: 42.0}), timeout=60.0)  # launch sets the timeout before a run

    assert [r["l2_cache_gbps"] for r in rep["ranks"]] == [40.0, 42.0]  # gpudoctor.smoke/3 ranks[]
    assert {"key": "l2_cache_gbps", "what": "L2 cache read", "unit": "GB/s"} in rep["parts"]["figures"]
    assert rep["parts"]["job_medians"]["l2_cache_gbps"] == 41.0
    assert "min_l2bw_gbps" in rep["floors"]

    out = io.StringIO()
    report.render_text(rep, file=out)
    text = out.getvalue()
    assert "L2 cache read 41.00 GB/s" in text  # the parts' median line
    assert "L2 40.00 GB/s" in text  # the rank's line

    families = {f.name: f for f in text_string_to_metric_families(prometheus.render_smoke(rep, 1764000000.0))}
    parts = {(s.labels["rank"], s.labels["part"]): s.value for s in families["gpudoctor_smoke_part"].samples}
    assert parts[("1", "l2_cache_gbps")] == 42.0

    assert baseline.from_report(rep)["figures"]["l2_cache_gbps"] == 41.0
    jsonschema.Draft202012Validator(SCHEMA).validate(json.loads(json.dumps(rep)))  # still gpudoctor.smoke/3


def test_a_figure_row_with_a_floor_is_a_flag_that_fails_the_run(monkeypatch):
    monkeypatch.setattr(figures, "RANK", (*figures.RANK, L2))
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert "--min-l2bw GBPS" in parser.format_help()
    opts = from_args(parser.parse_args(["--device", "cpu", "--min-l2bw", "41"]))
    assert opts.floors.parts["min_l2bw_gbps"] == 41.0

    rep, found = judged(_results({0: 40.0, 1: 42.0}), min_l2bw_gbps=41.0)
    assert found["GD-SMOKE-020"]["severity"] == "fail"
    assert "rank 0 on h: l2_cache_gbps 40 GB/s < --min-l2bw 41" in found["GD-SMOKE-020"]["message"]
    assert rep["floors"]["min_l2bw_gbps"] == 41.0 and not rep["ok"]


def test_every_figure_has_one_key_and_every_floor_one_flag():
    keys = [f.key for f in figures.RANK]
    assert len(keys) == len(set(keys)) and figures.COMPUTE in keys
    flags = [f.flag for f in figures.floors()]
    assert flags == ["--min-matmul-tflops", "--min-membw", "--min-hostbw"]
    assert figures.measured_parts() == ["ffn_gemm", "memory_copy", "h2d", "d2h"]


def test_each_measured_part_has_its_measurement_and_a_cpu_rank_runs_those_it_can(monkeypatch):
    import dataclasses

    import torch

    from gpudoctor.sample_train import parts
    from gpudoctor.sample_train.sizes import SIZES

    assert set(figures.measured_parts()) <= set(parts.MEASURE)
    monkeypatch.setattr(parts, "PART_SECONDS_CPU", 0.003)  # the dispatch, not the figures
    small = dataclasses.replace(SIZES["tiny"], d_model=16, seq_len=8, batch_size=1)
    found = parts.measure(torch.device("cpu"), torch.float32, small)
    assert list(found) == ["ffn_gemm", "memory_copy"]  # no GPU: no pinned host copies
    row = figures.from_parts(found)
    assert row["ffn_gemm_tflops"] > 0 and row["memory_copy_gbps"] > 0 and row["h2d_gbps"] is None
