"""smoke's next step matches the cause: a stray process -> its PID and how to see/stop it; the power cap at full
load is no cause; a slow host -> --exclude, but never every host of the run. Uses the report recorded on a
real H200 while another process ran matmuls on the same GPU (tests/fixtures/smoke, recorded there)."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path

import pytest

from gpudoctor.sample_train.judge import report, slowness

RECORDED = Path(__file__).parent.parent / "fixtures/smoke/recorded-h200-smoke-stray-compute-process.json"


def _recorded() -> dict:
    return json.loads(RECORDED.read_text())


def test_the_stray_process_is_the_cause_named_first_and_the_power_cap_is_not_one():
    rank0 = _recorded()["ranks"][0]
    why = slowness.reason(rank0)
    assert why.startswith("other processes on the GPU: PID 1052"), why
    assert "clocks held down" not in why  # sw_power_cap alone, at 693 of 700 W
    assert "SM clock 1650 of 1980 MHz (at its power cap (sw_power_cap: normal at full load" in why


def test_the_recorded_h200_next_step_is_the_process_not_excluding_the_only_host():
    rep = _recorded()
    steps = slowness.next_steps(rep["findings"], rep["ranks"], rep["nodes"])
    assert [s["cause"] for s in steps] == ["other_process"], steps
    (step,) = steps
    assert step["pids"] == [1052] and "PID 1052 (1.0 GiB)" in step["text"]
    assert step["commands"] == [
        "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv",
        "ps -o user,cmd -p 1052",
    ]
    out = io.StringIO()
    rep.pop("next_steps", None)  # recorded before next_steps existed: derived from the report itself
    report.render_text(rep, file=out)
    text = out.getvalue()
    assert "next: rank 0 on vm GPU 0" in text and "ps -o user,cmd -p 1052" in text
    assert "--exclude" not in text.split("next:")[1]


def test_hardware_throttling_names_the_reason_and_a_slow_host_is_left_out_when_others_remain():
    rep = _recorded()
    rows = []
    for rank, host in enumerate(("a", "b", "c")):
        row = copy.deepcopy(rep["ranks"][0])
        row.update(rank=rank, host=host, job_pids=[100 + rank])
        row["condition"]["gpu"]["processes"] = [{"pid": 100 + rank}]
        rows.append(row)
    rows[1]["condition"]["gpu"]["throttle_reasons"] = {"raw": 0x48, "active": ["hw_slowdown", "sw_power_cap"]}
    finding = {"id": "GD-SMOKE-016", "severity": "warn", "evidence": {"ranks": [1]}}
    steps = slowness.next_steps([finding], rows, [])
    assert [s["cause"] for s in steps] == ["hardware", "slow_host"]
    assert "clocks held down: hw_slowdown" in steps[0]["text"] and "sw_power_cap" not in steps[0]["text"]
    assert steps[1]["sbatch"] == "--exclude=b" and "hosts to keep: a c" in steps[1]["text"]
    # the same on a one-host run: the reason, and no --exclude of the only host
    alone = slowness.next_steps([finding], [rows[1]], [])
    assert [s["cause"] for s in alone] == ["hardware", "every_host"]
    assert all("sbatch" not in s for s in alone)


def test_a_slow_link_on_a_multi_node_run_is_an_exclude():
    rows = [{"rank": r, "host": h, "condition": {}} for r, h in enumerate(("n1", "n2", "n3"))]
    nodes = [{"node": i, "host": h} for i, h in enumerate(("n1", "n2", "n3"))]
    link = {"id": "GD-SMOKE-018", "severity": "warn", "evidence": {"slow_nodes": [2]}}
    (step,) = slowness.next_steps([link], rows, nodes)
    assert step["cause"] == "slow_host" and step["sbatch"] == "--exclude=n3"


def test_the_report_with_its_next_steps_follows_the_smoke_schema():
    import jsonschema

    schema = json.loads((Path(__file__).resolve().parents[2] / "docs" / "smoke.schema.json").read_text())
    rep = _recorded()  # recorded as gpudoctor.smoke/1: given the sections /2 and /3 added (not run then: null)
    rep.update(schema="gpudoctor.smoke/3", correctness=None, soak=None, nccl_transport=None)
    rep["next_steps"] = slowness.next_steps(rep["findings"], rep["ranks"], rep["nodes"])
    jsonschema.Draft202012Validator(schema).validate(rep)
    rows = [{"rank": r, "host": h, "condition": {}} for r, h in enumerate(("n1", "n2"))]
    rep["next_steps"] = slowness.next_steps(
        [{"id": "GD-SMOKE-010", "severity": "warn", "evidence": {"ranks": [1]}}], rows, []
    )
    assert rep["next_steps"][0]["cause"] == "slow_host"
    jsonschema.Draft202012Validator(schema).validate(rep)


def test_an_exclude_line_of_a_bracketed_hostlist_is_shell_quoted_and_follows_the_schema():
    """Two slow nodes compress to node[2-3], whose brackets a shell would glob: the line is quoted (seen in a CI
    rehearsal, where the schema's pattern refused the quoted form)."""
    import jsonschema

    from gpudoctor import shellquote

    schema = json.loads((Path(__file__).resolve().parents[2] / "docs" / "smoke.schema.json").read_text())
    pattern = schema["properties"]["exclude"]["properties"]["sbatch"]
    line = shellquote.quote("--exclude=gw1node[2-3]")
    assert line == "'--exclude=gw1node[2-3]'"
    jsonschema.validate(line, pattern)
    jsonschema.validate("--exclude=n3", pattern)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate("--exclude=a b", pattern)
