"""The facts contract gpudoctor.facts/1 (docs/facts.schema.json, docs/facts.md) holds for
every fixture and for a snapshot taken live on this machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from gpudoctor.facts import SCHEMA, SECTIONS, collectable_env
from gpudoctor.redact import is_credential_name

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_DOC = json.loads((ROOT / "docs" / "facts.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA_DOC)
FIXTURES = sorted((ROOT / "tests" / "fixtures" / "facts").glob("*.json"))
META_KEYS = {"schema", "tool", "collected_at", "probe_seconds", "synthetic"}


def problems(data) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path)) or '<top>'}: {e.message[:300]}" for e in VALIDATOR.iter_errors(data)]


def snapshot(tmp_path, *args) -> dict:
    out = tmp_path / "facts.json"
    r = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "snapshot", "-o", str(out), *args],
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text())


def assert_contract(data) -> None:
    assert problems(data) == []
    # secrets policy: only allow-listed, non-credential names are recorded
    if isinstance(data.get("env"), dict) and "vars" in data["env"]:
        env = data["env"]["vars"]
        assert collectable_env(env) == env


def test_schema_is_valid_draft_2020_12():
    jsonschema.Draft202012Validator.check_schema(SCHEMA_DOC)
    assert SCHEMA_DOC["properties"]["schema"]["const"] == SCHEMA


def test_schema_and_doc_cover_exactly_the_fact_sections():
    documented = set(SCHEMA_DOC["properties"]) - META_KEYS
    assert documented == set(SECTIONS)
    doc = (ROOT / "docs" / "facts.md").read_text()
    for section in SECTIONS:
        assert f"## `{section}`" in doc, section


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_fixture_follows_the_facts_contract(path):
    data = json.loads(path.read_text())
    assert_contract(data)
    # a misspelt section would be kept as metadata and silently ignored by the checks
    assert set(data) <= set(SECTIONS) | META_KEYS


def test_live_snapshot_follows_the_facts_contract(tmp_path):
    data = snapshot(tmp_path)
    assert_contract(data)
    # "job" is built from every rank's facts by check --job / compare, never probed on one machine
    assert set(SECTIONS) - {"job"} <= set(data), "a full snapshot probes every section"


def test_live_snapshot_with_a_torch_timeout_follows_the_contract(tmp_path):
    data = snapshot(tmp_path, "--torch-timeout", "0.01")
    assert data["torch"]["status"] == "timeout"
    assert_contract(data)


def _healthy() -> dict:
    return json.loads((ROOT / "tests" / "fixtures" / "facts" / "synthetic-h100x8-healthy.json").read_text())


@pytest.mark.parametrize(
    "change, where",
    [
        (lambda d: d.update(schema="gpudoctor.facts/2"), "schema"),
        (lambda d: d.pop("schema"), "<top>"),
        (lambda d: d.update(torch="2.3.1"), "torch"),
        (lambda d: d.update(nvidia=[]), "nvidia"),
        (lambda d: d["torch"].update(cudnn="8.9.2"), "torch/cudnn"),
        (lambda d: d["torch"].update(status="weird"), "torch"),
        (lambda d: d.update(torch={"status": "timeout", "python": "/usr/bin/python3"}), "torch"),
        (lambda d: d["nvidia"]["gpus"][0].update(compute_capability="9.0"), "nvidia"),
        (lambda d: d["nvidia"]["gpus"][0].pop("pcie"), "nvidia"),
        (lambda d: d["nvidia"].update(available=False, error=None), "nvidia"),
        (lambda d: d["host"].update(mem_total_bytes="2 TiB"), "host"),
        (lambda d: d["env"]["vars"].update(HF_TOKEN="hf_xxx"), "env"),
        (lambda d: d["env"]["vars"].update(CUDA_VISIBLE_DEVICES=0), "env"),
        (lambda d: d["libraries"]["found"]["nccl"][0].update(source="pip"), "libraries"),
    ],
    ids=[
        "wrong-version",
        "no-version",
        "torch-not-object",
        "nvidia-not-object",
        "cudnn-string",
        "capability-string",
        "gpu-without-pcie",
        "torch-bad-status",
        "failed-torch-without-error",
        "nvidia-down-without-error",
        "memory-string",
        "credential-env",
        "env-not-string",
        "library-source",
    ],
)
def test_schema_rejects_drift(change, where):
    data = _healthy()
    assert problems(data) == []
    change(data)
    found = problems(data)
    assert found, "the schema accepted a broken snapshot"
    assert any(p.startswith(where) for p in found), found


@pytest.mark.parametrize(
    "section, value",
    [
        ("host", {"error": "probe timed out", "timed_out": True}),
        ("nvidia", {"available": False, "error": "NVML: NVML Shared Library Not Found", "gpus": []}),
        (
            "torch",
            {
                "python": "/opt/py",
                "status": "crashed",
                "signal": "SIGSEGV",
                "stage": "cuda_init",
                "error": "the torch probe died with SIGSEGV",
                "stderr_tail": [],
            },
        ),
        ("torch_meta", {"error": "cannot ask /opt/py for torch's version: timed out", "python": "/opt/py"}),
    ],
)
def test_schema_accepts_documented_error_facts(section, value):
    data = _healthy()
    data[section] = value
    assert problems(data) == []


def test_schema_accepts_growth_and_old_snapshots():
    data = _healthy()
    data["nvidia"]["gpus"][0]["clocks_mhz"] = {"sm": 1980}  # a probe that grows a field
    data["torch"]["nccl"] = [2, 21, 5, "a0"]  # torch.cuda.nccl.version() adds NCCL's suffix
    data["nvidia"]["gpus"].append({"index": 8, "error": "Insufficient Permissions", "inaccessible": True})
    for section in ("host", "libraries", "network"):
        del data[section]  # --select probes only what the chosen checks need
    assert problems(data) == []


@pytest.mark.parametrize(
    "name", ["HF_TOKEN", "WANDB_API_KEY", "NCCL_SOCKET_IFNAME", "aws_secret", "PYTORCH_CUDA_ALLOC_CONF"]
)
def test_schema_credential_guard_agrees_with_the_collector(name):
    data = _healthy()
    data["env"]["vars"] = {name: "x"}
    assert (problems(data) != []) == is_credential_name(name)
