"""Secrets inside values (issue 13 B5): real processes with real environments; no credential in any output."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from gpudoctor.facts import collectable_env
from gpudoctor.probe import rendezvous
from gpudoctor.readers.dlconfig import find_settings
from gpudoctor.redact import is_credential_name, redact_value
from tests.cliutil import run_gpudoctor, run_gpudoctor_here

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_gpudoctor(*args, env=env, drop=("HF_",), cwd=ROOT)


def _run_here(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """_run's answer without its process, for what the command writes."""
    return run_gpudoctor_here(*args, env=env, drop=("HF_",), cwd=ROOT)


@pytest.mark.parametrize(
    "value, kept",
    [
        ("https://alice:pa/ss_SECRET@mirror.internal/x", "@mirror.internal/x"),  # '/' in the password
        ("https://alice:p@ss_SECRET@mirror.internal", "@mirror.internal"),  # '@' in the password
        ("https://hub.internal/api?token=SECRET&rev=main", "rev=main"),
        ("https://bucket.s3/x?X-Amz-Signature=SECRET&X-Amz-Date=1", "https://bucket.s3/x?"),
        ("https://host/x?access_token=SECRET#frag", "#frag"),
        ("alice:SECRET@10.0.0.7", "@10.0.0.7"),  # MASTER_ADDR with credentials, no scheme
        ("http://a:SECRET@h1,http://b:SECRET@h2", "@h2"),
    ],
)
def test_credentials_inside_values_are_blanked(value, kept):
    out = redact_value(value)
    assert "SECRET" not in out and kept in out


@pytest.mark.parametrize("value", ["10.0.0.1", "http://host:8080/x", "/usr/lib:/opt/lib", "user@host", "node[01-03]"])
def test_plain_settings_are_left_alone(value):
    assert redact_value(value) == value


def test_redaction_is_linear_on_hostile_values():
    # this process's CPU time, not the wall clock, which a loaded machine stretches; a quadratic reading of these
    # 120,000-character values would take minutes
    started = time.process_time()
    for value in ("a:b@" * 30_000, "a://b@" * 30_000, "a:b," * 30_000 + "@", "?" + "token=x&" * 30_000):
        redact_value(value)
    assert time.process_time() - started < 2


@pytest.mark.parametrize("name", ["DB_PASS", "SMTP_PWD", "LDAP_PW", "PASS", "MY_PASSWORD", "GCS_SIGNATURE"])
def test_pass_and_pwd_names_are_credentials(name):
    assert is_credential_name(name)


@pytest.mark.parametrize("name", ["PWD", "OLDPWD", "TORCH_COMPILE_PASSES", "NCCL_BYPASS_X", "NCCL_IB_PKEY"])
def test_words_that_only_look_like_passwords_are_not(name):
    assert not is_credential_name(name)


def test_pass_named_settings_never_reach_a_snapshot():
    got = collectable_env({"NCCL_DB_PASS": "SECRET", "TORCH_PWD": "SECRET", "NCCL_DEBUG": "INFO"})
    assert got == {"NCCL_DEBUG": "INFO"}


def test_master_addr_credentials_stay_out_of_the_snapshot(tmp_path):
    out = tmp_path / "facts.json"
    r = _run_here("snapshot", "-o", str(out), env={"MASTER_ADDR": "alice:SECRET_pw@127.0.0.1", "MASTER_PORT": "29500"})
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert "SECRET" not in text
    facts = json.loads(text)
    assert facts["rendezvous"]["master_addr"] == "<redacted>@127.0.0.1"
    assert facts["env"]["vars"]["MASTER_ADDR"] == "<redacted>@127.0.0.1"


def test_an_invalid_master_addr_is_a_fact_not_a_thread_traceback():
    out = rendezvous.probe({"MASTER_ADDR": "a..b", "MASTER_PORT": "29500"})
    assert "not a valid host name" in out["resolve"]["error"] and out["resolved"] == []
    r = _run("snapshot", env={"MASTER_ADDR": "a..b"})
    assert r.returncode == 0 and "Traceback" not in r.stderr and "Exception in thread" not in r.stderr, r.stderr


def test_a_config_reading_a_token_from_the_environment_never_prints_it(tmp_path):
    loader = {"num_workers": "${oc.env:HF_TOKEN}", "batch_size": "${oc.env:MY_VAR}"}
    settings = find_settings(
        {"train_dataloader": loader}, "train.yaml", {"HF_TOKEN": "hf_SECRET", "MY_VAR": "not_a_number_SECRET"}
    )
    problems = " ".join(f.problem or "" for f in settings.found.values())
    assert "SECRET" not in problems and "${oc.env:HF_TOKEN}" in problems and "${oc.env:MY_VAR}" in problems
    cfg = tmp_path / "train.yaml"
    cfg.write_text("train_dataloader:\n  num_workers: ${oc.env:HF_TOKEN}\n  pin_memory: ${oc.env:HF_HOME}\n")
    snap = tmp_path / "snap.json"  # a snapshot never holds HF_TOKEN; a setting can still hold what is no setting
    snap.write_text(json.dumps({"schema": "gpudoctor.facts/1", "env": {"vars": {"HF_HOME": "/x/hf_SECRET"}}}))
    for fmt in ([], ["--json"], ["-v"]):
        r = _run_here(
            "check",
            "--snapshot",
            str(snap),
            "--config",
            str(cfg),
            "--select",
            "dataloader",
            *fmt,
            env={"HF_TOKEN": "hf_SECRET"},
        )
        assert r.returncode in (0, 1), r.stderr
        assert "SECRET" not in r.stdout + r.stderr


def test_smoke_under_a_launcher_never_shows_master_addr_credentials():
    env = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "alice:SECRET@127.0.0.1",
        "MASTER_PORT": "29555",
    }
    r = _run("smoke", "--device", "cpu", "--json", env=env)
    assert r.returncode == 1, r.stderr
    assert "SECRET" not in r.stdout + r.stderr and "<redacted>@127.0.0.1" in r.stdout


@pytest.mark.parametrize("name", ["NCCL_DB_PASS", "TORCH_PWD", "HF_PW_FILE", "PWD", "TORCH_COMPILE_PASSES"])
def test_the_schema_guard_agrees_with_the_collector_on_pass_names(name):
    from gpudoctor.factschema import first_problem
    from tests.factsutil import HEALTHY_GPU, load_fixture

    data = load_fixture(HEALTHY_GPU)
    data["env"]["vars"] = {name: "x"}
    assert (first_problem(data) is not None) == is_credential_name(name)


def test_a_batch_script_never_shows_a_pass_named_value():
    from gpudoctor.readers.sbatch import reader

    assert reader.redact("export DB_PASS=SECRET; cd $PWD") == "export DB_PASS=<redacted>; cd $PWD"
