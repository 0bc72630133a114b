"""The CLI as users and CI run it: exit codes, reports, one-line usage errors. The exit codes a shell sees (0, 1
and 2) come from real processes; the rest call the same command line in this process (tests/cliutil's
run_gpudoctor_here: same environment, cwd and captured output, no interpreter start). A live check probes this
machine (torch imported in a child): the tests reading the same check share one run of it."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from tests.cliutil import run_gpudoctor, run_gpudoctor_here
from tests.thismachine import no_gpu_here

ROOT = Path(__file__).resolve().parents[2]
REPORT_SCHEMA = json.loads((ROOT / "docs" / "report.schema.json").read_text())


def gpudoctor(*args, env=None, timeout=180):
    return run_gpudoctor(*args, env=env, timeout=timeout)


# the tests of one module fixture's live check run on one worker (pyproject.toml: --dist loadgroup)
shares_a_live_check = pytest.mark.xdist_group("cli-live-checks")


@pytest.fixture(scope="module")
def live_snapshot(tmp_path_factory):
    path = tmp_path_factory.mktemp("snap") / "facts.json"
    r = run_gpudoctor_here(
        "snapshot", "-o", str(path), env={"HF_TOKEN": "hf_secret_value", "MY_API_KEY": "k", "NCCL_DEBUG": "WARN"}
    )
    assert r.returncode == 0, r.stderr
    return path


@pytest.fixture(scope="module")
def passing_check():
    """A real process: `check --json --expect-gpus 0` on this machine."""
    return gpudoctor("check", "--json", "--expect-gpus", "0")


@pytest.fixture(scope="module")
def failing_check(tmp_path_factory):
    """A real process (exit 1 on any machine): `check --expect-gpus 64` with its JSON report and JUnit file."""
    junit = tmp_path_factory.mktemp("junit") / "junit.xml"
    return gpudoctor("check", "--json", "--junit", str(junit), "--expect-gpus", "64"), junit


@no_gpu_here
def test_check_on_this_gpu_less_machine_fails_on_the_driver():
    r = gpudoctor("check")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "GD-DRV-001" in r.stdout
    assert "no usable NVIDIA driver" in r.stdout
    assert "\x1b[" not in r.stdout  # not a terminal: no colour codes


@shares_a_live_check
def test_expect_gpus_0_exits_0(passing_check):
    r = passing_check
    assert r.returncode == 0, r.stdout + r.stderr


@shares_a_live_check
def test_json_report_validates_against_the_documented_schema(failing_check):
    r, _ = failing_check
    assert r.returncode == 1
    report = json.loads(r.stdout)
    jsonschema.validate(report, REPORT_SCHEMA)
    assert report["summary"]["fail"] >= 1
    ids = {f["id"] for f in report["findings"]}
    assert "GD-DRV-001" in ids


@shares_a_live_check
def test_snapshot_replay_gives_the_same_findings(live_snapshot, passing_check):
    live = json.loads(passing_check.stdout)["findings"]
    replay = json.loads(
        run_gpudoctor_here("check", "--json", "--expect-gpus", "0", "--snapshot", str(live_snapshot)).stdout
    )["findings"]

    def key(findings):
        # facts that change between two probes of the same machine (free memory, ports) aside,
        # every check must reach the same verdict
        return sorted((f["id"], f["severity"]) for f in findings)

    assert key(live) == key(replay)


@shares_a_live_check
def test_snapshot_excludes_credentials(live_snapshot):
    text = live_snapshot.read_text()
    assert "hf_secret_value" not in text and "MY_API_KEY" not in text and "HF_TOKEN" not in text
    assert json.loads(text)["env"]["vars"]["NCCL_DEBUG"] == "WARN"


@pytest.mark.parametrize(
    "content, words",
    [
        (None, "no such snapshot"),
        ("{not json", "corrupt snapshot"),
        ('{"schema": "other/9"}', "schema"),
        ('["a list"]', "not a gpudoctor facts object"),
    ],
)
def test_bad_snapshot_is_one_line_and_exit_2(tmp_path, content, words):
    path = tmp_path / "snap.json"
    if content is not None:
        path.write_text(content)
    r = run_gpudoctor_here("check", "--snapshot", str(path))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "run, args",
    [
        (run_gpudoctor_here, ["check", "--expect-gpus", "many"]),
        (run_gpudoctor_here, ["check", "--expect-gpus", "-1"]),
        (run_gpudoctor_here, ["check", "--select", "nosuchcategory"]),
        (run_gpudoctor_here, ["check", "--python", "/nonexistent/python"]),
        (run_gpudoctor_here, ["explain", "GD-NOPE-999"]),
        (run_gpudoctor, ["frobnicate"]),  # one real process: the status a shell sees for a usage error
    ],
)
def test_usage_errors_are_one_line_and_exit_2(run, args):
    r = run(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr


@shares_a_live_check
def test_junit_report_is_written(failing_check):
    r, out = failing_check
    assert r.returncode == 1
    root = ET.parse(out).getroot()
    assert root.tag == "testsuites"
    assert int(root.get("failures")) >= 1
    names = [c.get("name") for c in root.iter("testcase")]
    assert any(n.startswith("GD-DRV-001") for n in names)


def test_strict_turns_warnings_into_exit_1(tmp_path):
    # a facts file with one warning and no fail: a driver one CUDA minor version behind torch
    fixture = json.loads((ROOT / "tests/fixtures/facts/synthetic-h100x8-healthy.json").read_text())
    fixture["nvidia"]["cuda_driver_version"] = 12000
    fixture["torch"]["cuda"] = "12.4"
    path = tmp_path / "f.json"
    path.write_text(json.dumps(fixture))
    lenient = run_gpudoctor_here("check", "--snapshot", str(path), "--select", "GD-DRV-002")
    strict = run_gpudoctor_here("check", "--snapshot", str(path), "--select", "GD-DRV-002", "--strict")
    assert lenient.returncode == 0 and strict.returncode == 1


def test_list_and_explain():
    r = run_gpudoctor_here("list")
    assert r.returncode == 0 and "GD-DRV-001" in r.stdout
    r = run_gpudoctor_here("explain", "GD-DRV-002")
    assert r.returncode == 0
    for section in ("What it checks:", "Why it matters:", "How to fix:"):
        assert section in r.stdout
    assert run_gpudoctor_here("explain", "driver-too-old-for-torch-cuda").returncode == 0


def test_checks_doc_is_generated_from_the_registry_and_up_to_date():
    r = run_gpudoctor_here("docs")
    assert r.returncode == 0
    committed = (ROOT / "docs" / "checks.md").read_text()
    assert r.stdout == committed, "docs/checks.md is stale: run `gpudoctor docs -o docs/checks.md`"


def test_a_command_line_reads_only_the_plugged_commands_it_names():
    # the start of every gpudoctor run: a core command (or --version) imports no plugged command, a plugged one
    # only its own; --help and a mistyped name get them all (the list of commands names them)
    from gpudoctor import cli

    assert cli.plugged_for("check") == {} and cli.plugged_for("--version") == {}
    assert cli.plugged_for("fix") == {"fix": cli.plugged_commands()["fix"]}
    assert cli.plugged_for("--help") == cli.plugged_for("chek") == cli.plugged_for(None) == cli.plugged_commands()
    args = cli.build_parser({}).parse_args(["check", "--launcher", "torchrun", "--select", "host,nccl"])
    assert (args.command, args.launcher, args.select) == ("check", "torchrun", ["host", "nccl"])
