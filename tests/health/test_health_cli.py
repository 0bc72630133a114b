"""`gpudoctor health` without SLURM: which checks it runs, its verdict and exit codes, its reason line, bad input.

Facts come from the recorded and synthetic fixtures (tests/factsutil.py), written as real snapshots and
replayed by the real command (in this process: what it answers is the point); the probe path runs on this
machine (no GPU: --expect-gpus 0 is healthy, the default expectation of a GPU is not)."""

from __future__ import annotations

import json

import pytest

from gpudoctor.health import DEFAULT_BUDGET_S, node_checks
from gpudoctor.nodestate import MAX_REASON, NodeState, drain_reason, node_of_host, parse_state_line
from gpudoctor.registry import load_all
from tests.cliutil import run_gpudoctor, run_gpudoctor_here
from tests.factsutil import HEALTHY_GPU, RECORDED_CPU, make_facts


def snapshot(tmp_path, name="facts.json", **changes) -> str:
    path = tmp_path / name
    make_facts(**changes).dump(str(path))
    return str(path)


def ecc_failing(tmp_path) -> str:
    """The healthy H100 node with GPU 3's uncorrected ECC errors (GD-HW-001 fails)."""
    patch = {"nvidia.gpus.3.ecc.uncorrected_volatile": 2, "nvidia.gpus.3.ecc.uncorrected_aggregate": 2}
    return snapshot(tmp_path, "ecc.json", patch=patch)


# --- which checks ------------------------------------------------------------------------------------


def test_node_checks_are_the_machine_and_node_scoped_ones_judged_from_facts():
    chosen = node_checks(load_all().values())
    ids = {s.id for s in chosen}
    assert {"GD-DRV-001", "GD-HW-001", "GD-HOST-002", "GD-NCCL-002", "GD-CUDA-003"} <= ids
    assert all(s.scope in ("machine", "node") and s.source == "facts" for s in chosen)
    # about a job, not the node: its settings, all its ranks, the training config, smoke verdicts
    assert not ids & {"GD-SLURM-001", "GD-JOB-001", "GD-ALLOC-001", "GD-DL-001", "GD-SMOKE-008"}


# --- verdicts and exit codes --------------------------------------------------------------------------


def test_healthy_node_exits_0(tmp_path):
    r = run_gpudoctor_here("health", "--snapshot", snapshot(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("gpudoctor health: gpu-node-01 healthy")


def test_ecc_errors_make_the_node_unhealthy_with_the_check_named(tmp_path):
    r = run_gpudoctor_here("health", "--snapshot", ecc_failing(tmp_path))
    assert r.returncode == 1, r.stdout + r.stderr
    first = r.stdout.splitlines()[0]
    assert "UNHEALTHY: GD-HW-001" in first
    assert "fail GD-HW-001 ecc-uncorrected-errors" in r.stdout


def test_a_warn_does_not_take_the_node_out_of_service(tmp_path):
    path = snapshot(tmp_path, patch={"nvidia.gpus.3.ecc.uncorrected_aggregate": 5})  # GD-HW-001 warns
    r = run_gpudoctor_here("health", "--snapshot", path)
    assert r.returncode == 0, r.stdout
    assert "warn GD-HW-001" in r.stdout


def test_a_node_that_lost_a_gpu_is_unhealthy_with_expect_gpus(tmp_path):
    r = run_gpudoctor_here("health", "--expect-gpus", "9", "--snapshot", snapshot(tmp_path))  # the node has 8
    assert r.returncode == 1 and "UNHEALTHY: GD-DEV-002" in r.stdout, r.stdout


def test_job_settings_are_not_judged(tmp_path):
    """A broken job environment (GD-ALLOC-001, GD-DIST-002) says nothing about the node's health."""
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:maybe", "MASTER_PORT": "99999"}
    path = snapshot(tmp_path, env=env)
    assert run_gpudoctor_here("check", "--snapshot", path).returncode == 1  # check judges the job: fails
    r = run_gpudoctor_here("health", "--snapshot", path)
    assert r.returncode == 0, r.stdout


def test_json_has_the_health_part(tmp_path):
    r = run_gpudoctor_here("health", "--json", "--snapshot", ecc_failing(tmp_path))
    assert r.returncode == 1
    report = json.loads(r.stdout)
    assert report["schema"] == "gpudoctor.report/1"
    health = report["health"]
    assert health["healthy"] is False and health["budget_seconds"] == DEFAULT_BUDGET_S
    assert health["reason"].startswith("gpudoctor GD-HW-001: ")
    assert {f["id"] for f in report["findings"] if f["severity"] == "fail"} == {"GD-HW-001"}


def test_probing_this_machine_within_the_budget():
    """No GPU here: healthy for a CPU node (--expect-gpus 0), unhealthy for a GPU node (GD-DRV-001). The budget is
    the largest (55 s): torch's import alone, 2.5 CPU-s here, took most of the default 10 s on the 2-core machine
    under the suite's load once; a probe past its budget has its own test below."""
    cpu = run_gpudoctor_here("health", "--expect-gpus", "0", "--json", "--budget", "55")
    assert cpu.returncode == 0, cpu.stdout + cpu.stderr
    health = json.loads(cpu.stdout)["health"]
    assert health["healthy"] and health["seconds"] < 55 and health["overrun"] == []
    gpu = run_gpudoctor_here("health", "--budget", "55")
    assert gpu.returncode == 1 and "GD-DRV-001" in gpu.stdout.splitlines()[0]


def test_a_probe_past_the_budget_is_a_failure():
    """torch's import (a child process) cannot finish in 50 ms: the node does not answer in time."""
    r = run_gpudoctor("health", "--expect-gpus", "0", "--budget", "0.05", "--json")  # its late probes die with it
    assert r.returncode == 1, r.stdout + r.stderr
    health = json.loads(r.stdout)["health"]
    assert "torch" in health["overrun"]
    assert health["reason"].startswith("gpudoctor ")


@pytest.mark.parametrize(
    "args, says",
    [
        (["--budget", "0"], "--budget"),
        (["--budget", "nan"], "--budget"),
        (["--budget", "120"], "60 s"),
        (["--node", "a b"], "--node"),
        (["--node", "n1 State=RESUME"], "--node"),
        (["--snapshot", "/nonexistent/facts.json"], "/nonexistent/facts.json"),
        (["--select", "no-such-check"], "no-such-check"),
        (["--select", "slurm,GD-JOB-001"], "none of these checks is about the node"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, says):
    r = run_gpudoctor_here("health", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in r.stderr


# --- the reason and SLURM's answers (pure) -------------------------------------------------------------


def test_reason_names_the_check_first_on_one_short_line():
    reason = drain_reason("GD-HW-001", 'GPU [3]: 2 uncorrected\nECC "errors" `x` \\ y' + " z" * 200, more=2)
    assert reason.startswith("gpudoctor GD-HW-001: GPU [3]: 2 uncorrected ECC errors x y z")
    assert reason.endswith("z... (+2 more)") and MAX_REASON - 1 <= len(reason) <= MAX_REASON
    assert not set(reason) & set("\"'`\\\n\r\t")
    assert drain_reason("GD-DRV-001", "short") == "gpudoctor GD-DRV-001: short"


def test_node_of_host_reads_sinfo_node_and_host_names():
    listing = "gdnode1 vm\ngdnode2 other.example.org\n"
    assert node_of_host(listing, "vm") == "gdnode1"
    assert node_of_host(listing, "other.example.org") == "gdnode2"
    assert node_of_host(listing, "other") is None and node_of_host("", "vm") is None


def test_node_state_says_offline_and_whose_reason():
    ours = parse_state_line("n1", "drained|gpudoctor GD-HW-001: ECC")
    assert ours.offline and ours.ours and ours.reason == "gpudoctor GD-HW-001: ECC"
    theirs = parse_state_line("n1", "draining|disk swap | by admin")
    assert theirs.offline and not theirs.ours and theirs.reason == "disk swap | by admin"
    assert not parse_state_line("n1", "idle|none").offline and parse_state_line("n1", "idle|none").reason == ""
    assert NodeState("n1", "down*", "Not responding").offline
    assert not NodeState("n1", "mixed", "").offline


def test_cpu_fixture_is_healthy_for_a_cpu_node(tmp_path):
    path = snapshot(tmp_path, base=RECORDED_CPU)
    assert run_gpudoctor_here("health", "--expect-gpus", "0", "--snapshot", path).returncode == 0
    assert run_gpudoctor_here("health", "--snapshot", path).returncode == 1  # a GPU node without a driver
    assert HEALTHY_GPU  # the default base of snapshot()
