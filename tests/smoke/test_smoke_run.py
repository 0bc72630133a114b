"""Real smoke runs: gloo DDP on CPU processes, spawned by gpudoctor, under torchrun and under srun.

Every run is a real training run (torch.distributed, DataLoader, DDP); faults are injected
through GPUDOCTOR_SMOKE_FAULT, the worker's test-only hook. Each run carries a marker in its
environment so the test can prove that no process of it outlives it.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.cliutil import clean_env
from tests.thismachine import no_gpu_here

pytestmark = pytest.mark.ddp

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs" / "smoke.schema.json").read_text())
MARK = "GPUDOCTOR_TEST_RUN"


def validate(report: dict) -> None:
    jsonschema.Draft202012Validator(SCHEMA).validate(report)


def leftovers(marker: str) -> list[str]:
    """Processes (other than zombies) whose environment carries this run's marker."""
    found = []
    needle = f"{MARK}={marker}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needle in (proc / "environ").read_bytes():
                state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return found


def run(
    cmd: list[str], env: dict | None = None, timeout: float = 120, cwd=None
) -> tuple[subprocess.CompletedProcess, float, str]:
    marker = uuid.uuid4().hex
    full_env = clean_env(env, drop=("GPUDOCTOR_SMOKE_FAULT", "TORCHINDUCTOR_"))
    full_env[MARK] = marker
    start = time.monotonic()
    r = subprocess.run(
        cmd, env=full_env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, cwd=cwd
    )
    elapsed = time.monotonic() - start
    time.sleep(0.5)  # let killed processes be reaped
    return r, elapsed, marker


def smoke(*args: str, env: dict | None = None, timeout: float = 120, cwd=None):
    return run([sys.executable, "-m", "gpudoctor", "smoke", "--device", "cpu", "--json", *args], env, timeout, cwd)


def torchrun(*args: str, env: dict | None = None, timeout: float = 120):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "gpudoctor",
        "smoke",
        "--device",
        "cpu",
        "--json",
        *args,
    ]
    return run(cmd, env, timeout)


def report_of(r: subprocess.CompletedProcess) -> dict:
    try:
        return json.loads(r.stdout)  # exactly one JSON object: only the reporter prints
    except json.JSONDecodeError:
        pytest.fail(
            f"stdout is not one JSON report (rc {r.returncode}):\n{r.stdout[-2000:]}\nstderr:\n{r.stderr[-3000:]}"
        )


def findings(rep: dict) -> dict:
    return {f["id"]: f for f in rep["findings"]}


# The dataloader settings the shared runs take from a config file (not the defaults, so a test can tell).
DATALOADER_CONFIG = "dataloader:\n  params:\n    num_workers: 1\n    persistent_workers: true\n    batch_size: 4\n"


class HealthyRun:
    """One healthy spawned run that several tests read (each real run costs ~10 CPU-s here): 3 CPU ranks,
    default steps, --deep, the dataloader settings of a config file, run as `python -P -m gpudoctor` from a
    folder holding a `gpudoctor` package that raises on import (the workers must not import it), with a private
    TMPDIR (the run must leave it empty), saving a baseline and writing Prometheus gauges."""

    def __init__(self, root: Path):
        self.cwd, self.tmpdir = root / "cwd", root / "tmp"
        (self.cwd / "gpudoctor").mkdir(parents=True)
        (self.cwd / "gpudoctor" / "__init__.py").write_text("raise ImportError('the cwd copy was imported')\n")
        self.tmpdir.mkdir()
        self.config = root / "train.yaml"
        self.config.write_text(DATALOADER_CONFIG)
        self.baseline, self.prometheus = root / "base.json", root / "smoke.prom"
        cmd = [sys.executable, "-P", "-m", "gpudoctor", "smoke", "--device", "cpu", "--json", "--gpus", "3", "--deep"]
        cmd += ["--config", str(self.config), "--save-baseline", str(self.baseline)]
        cmd += ["--prometheus", str(self.prometheus)]
        self.result, self.elapsed, marker = run(cmd, {"TMPDIR": str(self.tmpdir)}, cwd=self.cwd)
        self.leftovers = leftovers(marker)
        self.report = report_of(self.result)


class JudgedRun:
    """A second run of the healthy run's kind (same ranks and config), --quick, judged against its baseline, with a
    throughput floor no CPU reaches, and rank 1's matmul chain and rank 2's memory test corrupted by the fault hook:
    one not-ok run that the baseline, the floor and the correctness tests read (each names what it is about)."""

    FAULT = "rank=1,at=selftest,do=corrupt;rank=2,at=memory,do=corrupt"

    def __init__(self, healthy: HealthyRun, cwd: Path):
        self.result, _, marker = smoke(
            "--gpus", "3", "--quick", "--config", str(healthy.config), "--baseline", str(healthy.baseline),
            "--min-tokens-per-s", "1e12", env={"GPUDOCTOR_SMOKE_FAULT": self.FAULT}, timeout=200, cwd=cwd,
        )  # fmt: skip
        self.leftovers = leftovers(marker)
        self.report = report_of(self.result)


# The tests reading the two runs (fixtures healthy_run and judged_run: tests/smoke/conftest.py) share a worker, so
# each runs once (pyproject.toml: --dist loadgroup).
shares_the_healthy_run = pytest.mark.xdist_group("healthy-spawned-run")


@shares_the_healthy_run
def test_three_spawned_cpu_ranks_train_and_report(healthy_run):
    r, rep = healthy_run.result, healthy_run.report
    validate(rep)
    assert r.returncode == 0 and rep["ok"], rep["findings"]
    assert healthy_run.elapsed < 60
    assert rep["launch"]["mode"] == "spawn" and rep["launch"]["world_size"] == 3
    assert [x["rank"] for x in rep["ranks"]] == [0, 1, 2]
    assert rep["loss"]["last"] < rep["loss"]["first"] * 0.95
    assert rep["params_identical"] is True
    assert rep["correctness"]["verdict"] == "pass" and findings(rep)["GD-SMOKE-021"]["severity"] == "pass"
    assert rep["throughput"]["tokens_per_s"] > 0 and rep["step_time_s"]["p95"] >= rep["step_time_s"]["p50"] > 0
    assert rep["allreduce"]["busbw_gbps"] > 0 and rep["allreduce"]["payload_bytes"] == 4 << 20
    assert rep["mfu"]["vs_spec"] is None and "CPU" in rep["mfu"]["vs_spec_missing_reason"]
    assert rep["mfu"]["vs_measured_matmul"] > 0  # no upper bound: CPU timings on a shared host are noise
    assert "6*N" in rep["flops"]["formula"]
    assert not healthy_run.leftovers  # the dataloader worker processes too


@shares_the_healthy_run
def test_deep_on_a_real_spawned_run_measures_every_pair_of_ranks(healthy_run):
    rep = healthy_run.report
    assert rep["ok"], [f["message"] for f in rep["findings"] if f["severity"] in ("warn", "fail")]
    (node,) = rep["local_pairs"]
    assert sorted(p["ranks"] for p in node["pairs"]) == [[0, 1], [0, 2], [1, 2]] and all(
        p["gbps"] > 0 for p in node["pairs"]
    )


@shares_the_healthy_run
def test_a_smoke_run_leaves_nothing_in_tmpdir(healthy_run):
    assert healthy_run.result.returncode == 0, healthy_run.result.stderr[-2000:]
    assert [p.name for p in healthy_run.tmpdir.iterdir()] == []  # no torchinductor_<user>, no gpudoctor-smoke-*


@shares_the_healthy_run
def test_a_gpudoctor_folder_in_the_working_directory_does_not_shadow_the_workers_package(healthy_run):
    # Found on a GPU machine: smoke run from a source checkout (whose gpudoctor/ folder lacks
    # sample_train) with a regular install had every worker fail to import.
    assert healthy_run.result.returncode == 0 and healthy_run.report["ok"], healthy_run.report["findings"]
    assert "the cwd copy was imported" not in healthy_run.result.stderr


@shares_the_healthy_run
def test_save_a_baseline_then_judge_against_it_and_refuse_another_kind(healthy_run, judged_run, tmp_path):
    from gpudoctor.sample_train.judge import baseline
    from tests.cliutil import run_gpudoctor

    base, r = healthy_run.baseline, healthy_run.result
    assert r.returncode == 0, r.stderr[-2000:]
    families = {f.name: f for f in text_string_to_metric_families(healthy_run.prometheus.read_text())}
    assert families["gpudoctor_smoke_ok"].samples[0].value == 1
    parts = {(s.labels["rank"], s.labels["part"]) for s in families["gpudoctor_smoke_part"].samples}
    assert ("1", "memory_copy_gbps") in parts and ("0", "matmul_tflops") in parts
    assert any(s.labels["id"] == "GD-SMOKE-016" for s in families["gpudoctor_smoke_check"].samples)
    assert f"baseline saved to {base}" in r.stderr
    saved = baseline.load(str(base))
    assert saved["kind"] == {**saved["kind"], "device_type": "cpu", "world_size": 3, "model": "tiny"}
    assert saved["figures"]["memory_copy_gbps"] > 0 and saved["figures"]["compute_tokens_per_s"] > 0

    rep = judged_run.report
    checked = rep["expectations"]["checked"]
    assert {c["source"] for c in checked} == {"baseline"} and {c["rank"] for c in checked} == {0, 1, 2}
    assert {c["part"] for c in checked} >= {"matmul_tflops", "memory_copy_gbps", "compute_tokens_per_s"}
    assert rep["findings"] and any(f["id"] == "GD-SMOKE-017" for f in rep["findings"])

    r = run_gpudoctor("smoke", "--device", "cpu", "--gpus", "2", "--baseline", str(base), timeout=60, cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        f"gpudoctor smoke: --baseline {base}: the baseline is from another kind of run (world_size 3 there, 2 here): "
        "save one from this kind of run with --save-baseline"
    ]


def test_torchrun_world_is_joined_and_rank0_reports():
    r, _, marker = torchrun()
    rep = report_of(r)
    validate(rep)
    assert r.returncode == 0 and rep["ok"], rep["findings"]
    assert rep["launch"]["mode"] == "torchrun" and rep["launch"]["world_size"] == 2
    assert rep["launch"]["reporter"] == {**rep["launch"]["reporter"], "role": "rank", "rank": 0}
    assert sorted(p["rank"] for p in rep["placement"]) == [0, 1]
    assert not leftovers(marker)


@pytest.mark.world
def test_spawned_rank_that_never_starts_is_named_within_the_timeout():
    # 10 s: rank 0 must have joined by then (a CPU torch imports in 1-3 s on a busy 2-core machine; give a
    # CUDA build more where this runs on a GPU machine).
    r, elapsed, marker = smoke(
        "--gpus", "2", "--timeout", "10", env={"GPUDOCTOR_SMOKE_FAULT": "rank=1,at=start,do=hang"}
    )
    rep = report_of(r)
    validate(rep)
    f = findings(rep)["GD-SMOKE-001"]
    assert r.returncode == 1 and f["severity"] == "fail"
    if 0 in f["evidence"]["missing_ranks"]:  # rank 0 too: its torch import outlasted the 10 s on a busy machine
        pytest.skip(f"could not measure: rank 0 did not join within 10 s either (the machine is busy): {f['message']}")
    assert f["evidence"]["missing_ranks"] == [1] and "rank 1 never joined the rendezvous" in f["message"]
    assert elapsed < 10 + 15
    assert not leftovers(marker)


@pytest.mark.world
def test_torchrun_rank_that_never_starts_is_named_by_rank0():
    r, elapsed, marker = torchrun("--timeout", "6", env={"GPUDOCTOR_SMOKE_FAULT": "rank=1,at=start,do=hang"})
    rep = report_of(r)
    f = findings(rep)["GD-SMOKE-001"]
    if 0 in f["evidence"]["missing_ranks"]:  # rank 0 too: its torch import outlasted the 6 s on a busy machine
        pytest.skip(f"could not measure: rank 0 did not join within 6 s either (the machine is busy): {f['message']}")
    assert r.returncode != 0 and f["severity"] == "fail" and f["evidence"]["missing_ranks"] == [1]
    assert rep["launch"]["reporter"]["rank"] == 0
    assert elapsed < 6 + 20
    assert not leftovers(marker)


@pytest.mark.world
def test_torchrun_stopping_the_job_still_gets_a_report_naming_the_rank():
    # Rank 1 dies at once; torchrun then SIGTERMs rank 0, which reports before it goes.
    r, _, marker = torchrun("--timeout", "30", env={"GPUDOCTOR_SMOKE_FAULT": "rank=1,at=start,do=exit"})
    rep = report_of(r)
    validate(rep)
    f = findings(rep)["GD-SMOKE-004"]
    assert r.returncode != 0 and f["severity"] == "fail" and f["evidence"]["failed_ranks"] == [1]
    assert "the launcher stopped the run (SIGTERM" in f["message"]
    assert not leftovers(marker)


def _hang_finding(rep: dict, timeout: str) -> dict:
    """GD-SMOKE-005 of a run whose training step was made to hang. That hang can only be named once the ranks
    train: on a busy machine they may still be joining, or starting (importing torch, building DDP and the
    optimizer), when the timeout ends, and the run rightly names that instead (GD-SMOKE-001: never joined; or
    GD-SMOKE-005 in that phase). The test then could not measure what it is about."""
    found = findings(rep)
    joined = found.get("GD-SMOKE-001", {})
    if "GD-SMOKE-005" not in found and joined.get("severity") == "fail":
        pytest.skip(
            f"could not measure: the ranks had not joined at {timeout} (the machine is busy): {joined['message']}"
        )
    assert "GD-SMOKE-005" in found, rep["findings"]
    f = found["GD-SMOKE-005"]
    phase = str(f["evidence"].get("phase", ""))
    if not phase.startswith("step "):
        pytest.skip(f"could not measure: the ranks were still in {phase!r} at {timeout} (the machine is busy)")
    return f


@pytest.mark.world
def test_hang_in_a_step_names_the_rank_and_the_step():
    r, elapsed, marker = smoke(
        "--gpus", "2", "--timeout", "16", env={"GPUDOCTOR_SMOKE_FAULT": "rank=1,at=step:2,do=hang"}
    )
    rep = report_of(r)
    validate(rep)
    f = _hang_finding(rep, "--timeout 16 s")
    assert r.returncode == 1 and f["severity"] == "fail"
    assert f["evidence"]["stuck_ranks"] == [1] and f["evidence"]["phase"] == "step 2 (forward)"
    assert "(rank 0 in step 2 (forward))" in f["message"]  # DDP's bucket rebuild broadcasts in step 2's forward
    assert any("faults.py" in frame for frame in f["evidence"]["stacks"]["rank1"])
    assert elapsed < 16 + 15
    assert not leftovers(marker)


@pytest.mark.world
def test_a_single_rank_hung_in_its_own_work_is_not_blamed_on_a_collective():
    # As seen on a real H100 (NCCL, one rank): a hang in the forward pass is not a network problem.
    r, elapsed, marker = smoke(
        "--gpus", "1", "--timeout", "14", env={"GPUDOCTOR_SMOKE_FAULT": "rank=0,at=step:3,do=hang"}
    )
    rep = report_of(r)
    f = _hang_finding(rep, "--timeout 14 s")
    assert r.returncode == 1 and f["severity"] == "fail"
    assert "rank 0 stuck in step 3 (forward)" in f["message"] and "outside any collective" in f["message"]
    assert "network" not in f["message"]
    assert elapsed < 14 + 15
    assert not leftovers(marker)


@pytest.mark.world
def test_a_crashing_rank_is_named_with_its_phase_and_error():
    r, _, marker = smoke("--gpus", "2", env={"GPUDOCTOR_SMOKE_FAULT": "rank=1,at=first-allreduce,do=crash"})
    rep = report_of(r)
    validate(rep)
    f = findings(rep)["GD-SMOKE-004"]
    assert r.returncode == 1 and f["evidence"]["failed_ranks"] == [1]
    assert "rank 1 on" in f["message"] and "failed in first all-reduce: RuntimeError: injected fault" in f["message"]
    assert not leftovers(marker)


@shares_the_healthy_run
def test_throughput_floor_fails_and_config_dataloader_settings_are_used(judged_run):
    r, rep = judged_run.result, judged_run.report
    validate(rep)
    found = findings(rep)
    assert r.returncode == 1 and not rep["ok"]
    assert found["GD-SMOKE-009"]["severity"] == "fail" and found["GD-SMOKE-006"]["severity"] == "pass"
    loader = rep["run"]["dataloader"]
    assert (loader["num_workers"], loader["persistent_workers"]) == (1, True)
    assert loader["source"]["num_workers"] == "config:dataloader.params.num_workers"
    assert rep["run"]["model"]["batch_size"] == 4
    assert not judged_run.leftovers  # the dataloader worker processes too


@pytest.mark.parametrize(
    "args, env, words",
    [
        (["--min-mfu", "2"], {}, "fraction"),
        (["--config", "/nonexistent/train.yaml"], {}, "no such file"),
        (["--steps", "12", "--warmup", "10"], {}, "fewer than 3"),
        (["--steps", "4"], {}, "expected 10 or more"),
        (["--quick", "--deep"], {}, "--quick and --deep"),
        (["--num-workers", "0", "--prefetch-factor", "2"], {}, "prefetch_factor=2 needs num_workers > 0"),
        (
            [],
            {
                "RANK": "0",
                "WORLD_SIZE": "2",
                "LOCAL_WORLD_SIZE": "4",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29999",
            },
            "do not fit a world of 2",
        ),
        ([], {"GPUDOCTOR_SMOKE_FAULT": "nonsense"}, "GPUDOCTOR_SMOKE_FAULT"),
        ([], {"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR is not"),
        (
            ["--gpus", "4"],
            {
                "RANK": "0",
                "WORLD_SIZE": "2",
                "LOCAL_RANK": "0",
                "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29999",
            },
            "drop --gpus",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, env, words):
    r, _, _ = smoke(*args, env=env, timeout=60)
    assert r.returncode == 2, r.stderr
    assert words in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@no_gpu_here
def test_no_gpu_is_a_clear_failure():
    r, _, _ = run([sys.executable, "-m", "gpudoctor", "smoke", "--json"])
    rep = report_of(r)
    validate(rep)
    f = findings(rep)["GD-SMOKE-012"]
    assert r.returncode == 1 and f["severity"] == "fail" and "--device cpu" in f["evidence"]["next"]
    assert "CUDA_VISIBLE_DEVICES unset" in f["message"] or "CUDA_VISIBLE_DEVICES=" in f["message"]  # never None


def test_unresolvable_master_addr_fails_at_once():
    env = {
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "no-such-host.invalid",
        "MASTER_PORT": "29999",
    }
    r, elapsed, marker = smoke("--timeout", "60", env=env)
    rep = report_of(r)
    validate(rep)
    f = findings(rep)["GD-SMOKE-001"]
    assert r.returncode == 1 and "does not resolve" in f["message"] and "no-such-host.invalid" in f["message"]
    assert elapsed < 30  # not the whole --timeout
    assert not leftovers(marker)


def test_busy_master_port_is_named_by_the_rank_that_hosts_the_store():
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        env = {
            "RANK": "0",
            "WORLD_SIZE": "2",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(busy.getsockname()[1]),
        }
        r, _, _ = smoke("--timeout", "20", env=env)
    rep = report_of(r)
    f = findings(rep)["GD-SMOKE-001"]
    assert r.returncode == 1 and "could not host the rendezvous store" in f["message"]


@pytest.mark.world
def test_a_rank_whose_rank0_never_starts_gives_up_within_the_timeout():
    # TCPStore's own connect retries for about twice its timeout; the run's bound is --timeout.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    r, elapsed, marker = smoke("--timeout", "5", env=env)
    assert r.returncode == 1 and "rank 1 could not reach the rendezvous store" in r.stderr
    assert elapsed < 5 + 10
    assert not leftovers(marker)


@pytest.mark.world
def test_sigterm_to_the_spawner_stops_every_rank_at_once():
    marker = uuid.uuid4().hex
    env = clean_env({MARK: marker})
    cmd = [
        sys.executable,
        "-m",
        "gpudoctor",
        "smoke",
        "--device",
        "cpu",
        "--json",
        "--steps",
        "5000",
        "--timeout",
        "60",
    ]
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL
    )
    until = time.monotonic() + 30
    while len(leftovers(marker)) < 3 and time.monotonic() < until:  # the spawner and its 2 ranks
        time.sleep(0.2)
    proc.terminate()
    out, err = proc.communicate(timeout=15)
    time.sleep(0.5)
    # SIGTERM exits 128 + 15 with one line (issue 10); Ctrl-C keeps 130 and "interrupted"
    assert proc.returncode == 143 and out == "" and err.strip().splitlines()[-1] == "gpudoctor: terminated (SIGTERM)"
    assert not leftovers(marker)


@pytest.mark.slurm
def test_srun_tasks_join_the_step_world(slurm_cluster):
    with socket.socket() as s:  # a free port: test clusters restart job ids at 1
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    marker = uuid.uuid4().hex
    r = slurm_cluster.srun(
        ["--ntasks=2", *slurm_cluster.python_command(), "smoke", "--device", "cpu", "--json"],
        env={"MASTER_PORT": str(port), MARK: marker},
        timeout=180,
    )
    rep = report_of(r)
    validate(rep)
    assert r.returncode == 0 and rep["ok"], rep["findings"]
    assert rep["launch"]["mode"] == "srun" and rep["launch"]["world_size"] == 2
    assert rep["launch"]["reporter"]["rank"] == 0
    assert sorted(p["local_rank"] for p in rep["placement"]) == [0, 1]
    time.sleep(0.5)
    assert not leftovers(marker)
