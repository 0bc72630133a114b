"""Unit tests for the smoke run's pure parts: peaks, formulas, world detection, options,
placement verdicts and the judgement of measurements. The real runs are in test_smoke_run.py."""

from __future__ import annotations

import json
import time

import pytest

from gpudoctor.job import world
from gpudoctor.model import Severity
from gpudoctor.sample_train import coordinator as coordinator_module
from gpudoctor.sample_train.coordinator import Coordinator, Keys, Verdict, phase, plan_run
from gpudoctor.sample_train.faults import FaultSpecError, parse
from gpudoctor.sample_train.judge import metrics, peaks, placement, report
from gpudoctor.sample_train.options import LoaderSettings, OptionsError, SmokeOptions, loader_from_config, merge_loader


# -- spec peaks ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, model, tflops",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.4),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756.5),
        ("NVIDIA H100 NVL", "H100 NVL", 835.5),
        ("NVIDIA H200", "H200 SXM", 989.4),
        ("NVIDIA GH200 480GB", "GH200 96GB", 989.4),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM4 80GB", 312.0),
        ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB", 312.0),
        ("NVIDIA L40S", "L40S", 362.05),
        ("NVIDIA L4", "L4", 121.0),
        ("NVIDIA A10", "A10", 125.0),
        ("Tesla V100-SXM2-32GB", "V100 SXM2", 125.0),
        ("Tesla V100-PCIE-16GB", "V100 PCIe", 112.0),
        ("Tesla T4", "T4", 65.0),
        ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090", 165.2),
        ("NVIDIA B200", "B200", 2250.0),
    ],
)
def test_peak_table_matches_device_names(name, model, tflops):
    peak = peaks.lookup(name)
    assert peak is not None and (peak.model, peak.tflops) == (model, tflops)


@pytest.mark.parametrize("name", ["NVIDIA A10G", "NVIDIA H100", "NVIDIA H800", "AMD Instinct MI300X", None, ""])
def test_peak_table_does_not_guess(name):
    # A10G is not an A10; a bare "H100" does not say SXM or PCIe: no number beats a wrong one.
    assert peaks.lookup(name) is None


def test_volta_and_turing_peaks_are_fp16():
    assert peaks.lookup("Tesla T4").dtype == "float16"
    assert peaks.lookup("NVIDIA H100 80GB HBM3").dtype == "bfloat16"


# -- formulas ------------------------------------------------------------------------------
def test_busbw_is_nccl_tests_formula():
    algbw, busbw = metrics.bus_bandwidth(1_000_000_000, 0.01, 8)
    assert algbw == pytest.approx(100e9)
    assert busbw == pytest.approx(100e9 * 2 * 7 / 8)
    assert metrics.bus_bandwidth(100, 1.0, 2)[1] == pytest.approx(100.0)  # 2(n-1)/n == 1 for two ranks


def test_flops_per_token_counts_matmuls_and_attention():
    # L=2, d=64, V=128, S=64: N = 12*2*64^2 + 128*64; attention 12*L*d*S
    n = 12 * 2 * 64 * 64 + 128 * 64
    assert metrics.matmul_params(2, 64, 128) == n
    assert metrics.flops_per_token(2, 64, 64, 128) == 6 * n + 12 * 2 * 64 * 64


def test_percentile_interpolates():
    assert metrics.percentile([1, 2, 3, 4], 50) == 2.5
    assert metrics.percentile([5.0], 95) == 5.0
    assert metrics.percentile([], 50) is None
    assert metrics.percentile(list(range(101)), 95) == 95


# -- launcher worlds -----------------------------------------------------------------------
def test_no_launcher_means_spawn():
    assert world.detect({"PATH": "/usr/bin"}) is None


def test_torchrun_world():
    env = {
        "RANK": "3",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "n1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "abc",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": "1",
    }
    w = world.detect(env)
    assert (w.launcher, w.rank, w.world_size, w.local_rank, w.local_world_size) == ("torchrun", 3, 8, 1, 2)
    assert w.agent_store and (w.master_addr, w.master_port) == ("n1", 29500)
    assert w.namespace == "gpudoctor-smoke/abc/1"


def test_srun_world_takes_rank0_host_from_the_step_nodelist():
    env = {
        "SLURM_PROCID": "5",
        "SLURM_STEP_NUM_TASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "2",
        "SLURM_STEP_TASKS_PER_NODE": "2(x3),1",
        "SLURM_STEP_NODELIST": "gpu[07-09,12]",
        "SLURM_JOB_ID": "77",
        "SLURM_STEP_ID": "3",
    }
    w = world.detect(env)
    assert (w.launcher, w.rank, w.world_size, w.local_rank, w.local_world_size) == ("srun", 5, 8, 1, 2)
    assert w.master_addr == "gpu07" and not w.agent_store
    assert 20000 <= w.master_port < 30000
    assert world.detect({**env, "SLURM_STEP_ID": "4"}).master_port != w.master_port  # steps do not collide


def test_batch_script_is_not_an_srun_world():
    # Inside sbatch, SLURM_PROCID=0 and SLURM_NTASKS=8 are set but no step is running: spawn.
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "gpu01"}
    assert world.detect(env) is None


@pytest.mark.parametrize(
    "env, words",
    [
        ({"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"}, "RANK='x'"),
        ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"}, "not within"),
        ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR is not"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "99999"}, "outside"),
        (
            {
                "RANK": "0",
                "WORLD_SIZE": "2",
                "LOCAL_RANK": "0",
                "LOCAL_WORLD_SIZE": "4",
                "MASTER_ADDR": "a",
                "MASTER_PORT": "1",
            },
            "4 local ranks on this node do not fit a world of 2",
        ),
        ({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "gpu[01-"}, "gpu\\[01-"),
    ],
)
def test_bad_launcher_variables_are_one_clear_error(env, words):
    with pytest.raises(world.WorldError, match=words):
        world.detect(env)


# -- options and the user's dataloader settings --------------------------------------------
def test_config_settings_come_from_the_training_loader():
    config = {
        "dataloader": {"params": {"batch_size": 22, "num_workers": 6, "pin_memory": True}},
        "val_dataloader": {"num_workers": 1, "batch_size": 64},
    }
    loader = loader_from_config(config, "train.yaml")
    assert (loader.batch_size, loader.num_workers, loader.pin_memory) == (22, 6, True)
    assert loader.source["num_workers"] == "config:dataloader.params.num_workers"


def test_flags_win_over_config():
    loader = merge_loader(
        LoaderSettings(num_workers=6, source={"num_workers": "config:x"}), {"num_workers": 2, "batch_size": None}
    )
    assert loader.num_workers == 2 and loader.source["num_workers"] == "--num-workers"


@pytest.mark.parametrize(
    "config, words",
    [
        ({"dataloader": {"num_workers": "many"}}, "not a number"),
        ({"dataloader": {"batch_size": 0}}, "at least 1"),
    ],
)
def test_unreadable_config_values_are_usage_errors(config, words):
    with pytest.raises(OptionsError, match=words):
        loader_from_config(config, "c.yaml")


def test_a_flag_replaces_a_config_value_gpudoctor_cannot_read():
    config = {"dataloader": {"num_workers": "auto", "batch_size": 4}}
    with pytest.raises(OptionsError, match="'auto'.*pass --num-workers"):
        loader_from_config(config, "c.yaml")
    loader = loader_from_config(config, "c.yaml", overridden=frozenset({"num_workers"}))
    assert loader.num_workers is None and loader.batch_size == 4


def test_prefetch_without_workers_is_refused_like_torch_does():
    with pytest.raises(OptionsError, match="prefetch_factor=4 needs num_workers > 0"):
        merge_loader(
            LoaderSettings(num_workers=0, prefetch_factor=4, source={"num_workers": "config:a.num_workers"}), {}
        )


def test_options_travel_as_json():
    opts = SmokeOptions.of(
        device="cpu", nprocs=2, loader=LoaderSettings(num_workers=1, source={"num_workers": "--num-workers"})
    )
    back = SmokeOptions.from_json(opts.to_json())
    assert back == opts


def test_fault_specs():
    assert parse("rank=1,at=start,do=hang;rank=0,at=step:3,do=crash")[1].at == "step:3"
    with pytest.raises(FaultSpecError):
        parse("rank=1,at=start,do=explode")
    with pytest.raises(FaultSpecError):
        parse("at=start")


# -- placement before any collective --------------------------------------------------------
def gpu_rank(rank, uuid, host="n1", local_rank=None, **extra):
    record = {
        "rank": rank,
        "local_rank": rank if local_rank is None else local_rank,
        "host": host,
        "device_type": "cuda",
        "device_index": 0,
        "device": "cuda:0",
        "gpu_uuid": uuid,
        "gpu_name": "NVIDIA H100 80GB HBM3",
        "visible_count": 1,
        "cuda_visible_devices": "0",
    }
    record.update(extra)
    return record


def by_id(findings):
    return {f.id: f for f in findings}


def test_two_ranks_on_one_gpu_fail_before_nccl():
    # The seed's hang: --gres=gpu:1 with 8 tasks; every task sees the same single GPU.
    joins = {r: gpu_rank(r, "GPU-aaaa") for r in range(8)}
    f = by_id(placement.check(joins))["GD-SMOKE-002"]
    assert f.severity is Severity.FAIL
    assert "ranks 0, 1, 2, 3, 4, 5, 6, 7 on n1 all use GPU-aaaa" in f.message


def test_distinct_gpus_pass():
    joins = {r: gpu_rank(r, f"GPU-{r}", device_index=r, visible_count=8) for r in range(8)}
    found = by_id(placement.check(joins))
    assert found["GD-SMOKE-002"].severity is Severity.PASS
    assert found["GD-SMOKE-003"].severity is Severity.PASS


def test_rank_without_a_gpu_fails():
    joins = {
        0: gpu_rank(0, "GPU-0"),
        1: gpu_rank(
            1, None, device_index=None, device="cuda?", device_error="local rank 1 has no GPU: only 1 are visible"
        ),
    }
    f = by_id(placement.check(joins))["GD-SMOKE-003"]
    assert f.severity is Severity.FAIL and "rank 1 (host n1, local rank 1): local rank 1 has no GPU" in f.message


def test_rank_beyond_its_slurm_allocation_fails():
    # SLURM allocated 2 GPUs but CUDA_VISIBLE_DEVICES was exported by hand to all 8; rank 5 uses cuda:5.
    joins = {
        r: gpu_rank(
            r,
            f"GPU-{r}",
            device_index=r,
            visible_count=8,
            cuda_visible_devices="0,1,2,3,4,5,6,7",
            slurm_gpus_var="SLURM_STEP_GPUS",
            slurm_gpus=["2", "3"],
        )
        for r in (0, 5)
    }
    f = by_id(placement.check(joins))["GD-SMOKE-003"]
    assert f.severity is Severity.FAIL
    assert "rank 5" in f.message and "beyond its allocation" in f.message and "SLURM_STEP_GPUS=2,3" in f.message


def test_seeing_more_gpus_than_allocated_warns_only():
    joins = {0: gpu_rank(0, "GPU-0", visible_count=8, slurm_gpus_var="SLURM_STEP_GPUS", slurm_gpus=["4"])}
    assert by_id(placement.check(joins))["GD-SMOKE-003"].severity is Severity.WARN


def test_cgroup_renumbered_gpus_are_not_a_false_alarm():
    # Under ConstrainDevices, CUDA numbers from 0 while SLURM_STEP_GPUS keeps global ids (6,7).
    joins = {
        r: gpu_rank(
            r,
            f"GPU-{r}",
            local_rank=r,
            device_index=r,
            visible_count=2,
            cuda_visible_devices="0,1",
            slurm_gpus_var="SLURM_STEP_GPUS",
            slurm_gpus=["6", "7"],
        )
        for r in (0, 1)
    }
    assert by_id(placement.check(joins))["GD-SMOKE-003"].severity is Severity.PASS


def test_no_cuda_is_its_own_finding():
    joins = {0: gpu_rank(0, None, device_error="torch sees no CUDA GPU", no_cuda=True, torch="2.13.0+cpu")}
    f = by_id(placement.check(joins))["GD-SMOKE-012"]
    assert f.severity is Severity.FAIL and "--device cpu" in f.evidence["next"]


def test_cpu_world_skips_gpu_placement():
    joins = {0: {"rank": 0, "local_rank": 0, "host": "h", "device_type": "cpu"}}
    assert {f.severity for f in placement.check(joins)} == {Severity.SKIP}


def test_plan_sizes_the_model_from_the_smallest_gpu_and_falls_back_to_fp16():
    opts = SmokeOptions.of(device="cuda")
    h100 = {**gpu_rank(0, "a"), "gpu_memory_bytes": 80 * 2**30, "bf16_native": True}
    t4 = {**gpu_rank(1, "b"), "gpu_name": "Tesla T4", "gpu_memory_bytes": 16 * 2**30, "bf16_native": False}
    assert plan_run({0: h100}, opts)["model"]["name"] == "large"
    plan = plan_run({0: h100, 1: t4}, opts)
    assert plan["model"]["name"] == "small" and plan["precision"] == "fp16" and "GradScaler" in plan["precision_reason"]


def test_a_precision_asked_for_is_not_explained_as_a_hardware_fallback():
    cpu = {0: {"rank": 0, "local_rank": 0, "host": "h", "device_type": "cpu", "bf16_native": False}}
    assert "no native bf16" in plan_run(cpu, SmokeOptions.of(device="cpu"))["precision_reason"]
    for precision in ("fp16", "fp32"):
        plan = plan_run(cpu, SmokeOptions.of(device="cpu", precision=precision))
        assert plan["precision"] == precision and "asked for with --precision" in plan["precision_reason"]
    h100 = {0: {**gpu_rank(0, "a"), "gpu_memory_bytes": 80 * 2**30, "bf16_native": True}}
    assert "asked for" in plan_run(h100, SmokeOptions.of(device="cuda", precision="fp16"))["precision_reason"]


class DictStore:
    """The few TCPStore calls the coordinator makes, over a dict."""

    def __init__(self, values: dict):
        self.values = {k: json.dumps(v) for k, v in values.items()}

    def check(self, keys):
        return all(k in self.values for k in keys)

    def get(self, key):
        return self.values[key]

    def set(self, key, value):
        self.values[key] = value


def test_a_launcher_stop_is_reported_as_such_not_as_a_crash(monkeypatch):
    # torchrun SIGTERMs every rank: rank 1 dies silently, rank 0's all-reduce then fails for want of it.
    monkeypatch.setattr(coordinator_module, "SETTLE_S", 0.0)
    keys = Keys("ns")
    step = phase("training", 7, "backward + gradient all-reduce")
    store = DictStore(
        {
            keys.join(0): {"host": "h"},
            keys.join(1): {"host": "h"},
            keys.state(0): {**step, "beat": 9},
            keys.state(1): {**step, "beat": 9},
            keys.error(0): {"phase": step["label"], "error": "RuntimeError: Connection reset by peer"},
        }
    )
    c = Coordinator(
        store, keys, 2, time.monotonic() + 60, SmokeOptions.of(device="cpu", timeout=60), terminated=lambda: True
    )
    c.joins = {0: {"host": "h"}, 1: {"host": "h"}}
    with pytest.raises(coordinator_module._Stop) as stop:
        c._watch("result")
    assert "the launcher stopped the run (SIGTERM" in stop.value.finding.message


def test_a_rank_that_writes_its_result_and_exits_between_two_reads_is_not_called_gone(monkeypatch):
    # Found in a full suite run: the coordinator read the results (rank 0's not yet there), rank 0 then wrote its
    # result and exited 0, and the exit was judged against the older read: "exited before reporting a result".
    monkeypatch.setattr(coordinator_module, "SETTLE_S", 0.0)
    keys = Keys("ns")
    result = {"rank": 0, "param_checksum": "c0ffee"}
    store = DictStore({keys.join(0): {"host": "h"}, keys.state(0): {**phase("parameter checksum"), "beat": 3}})

    def exits():  # the rank's last act: its result in the store, then exit 0
        store.set(keys.result(0), json.dumps(result))
        return {0: 0}

    c = Coordinator(store, keys, 1, time.monotonic() + 60, SmokeOptions.of(device="cpu", timeout=60), exits=exits)
    c.joins = {0: {"host": "h"}}
    c._watch("result")  # no _Stop: the rank finished
    assert c.results == {0: result}
    # a rank that exits 0 without any result is still named
    silent = Coordinator(
        DictStore({keys.join(0): {"host": "h"}}), keys, 1, time.monotonic() + 60, SmokeOptions.of(device="cpu"),
        exits=lambda: {0: 0},
    )  # fmt: skip
    with pytest.raises(coordinator_module._Stop) as stop:
        silent._watch("result")
    assert "exited before reporting a result" in stop.value.finding.message


# -- judging a finished run -----------------------------------------------------------------
def fake_result(rank, losses, checksum="c0ffee", step=0.1):
    return {
        "rank": rank,
        "host": "h",
        "local_rank": rank,
        "backend": "gloo",
        "warmup": 1,
        "losses": losses,
        "step_times": [step] * len(losses),
        "data_waits": [0.001] * len(losses),
        "local_compute_s": [0.05] * 3,
        "matmul": {"n": 256, "dtype": "float32", "tflops": 0.1},
        "first_allreduce_s": 0.01,
        "allreduce": {"payload_bytes": 4 << 20, "dtype": "float32", "iterations": 5, "seconds": 0.004},
        "peak_memory": {"bytes": 1 << 28, "kind": "rss"},
        "param_checksum": checksum,
        "tokens_per_step": 512,
        "samples_per_step": 8,
        "optimizer": "AdamW (fused)",
        "dataloader": {},
    }


def judged(results, **opt):
    opts = SmokeOptions.of(device="cpu", **opt)
    joins = {
        r["rank"]: {"rank": r["rank"], "local_rank": r["rank"], "host": "h", "device_type": "cpu", "device": "cpu"}
        for r in results
    }
    plan = plan_run(joins, opts)
    verdict = Verdict(True, [], joins, {r["rank"]: r for r in results}, {}, plan)
    rep = report.build(
        verdict,
        opts,
        {"mode": "spawn", "world_size": len(results), "backend": "gloo", "reporter": {"role": "spawner", "pid": 1}},
        1.0,
    )
    return rep, {f["id"]: f for f in rep["findings"]}


FALLING = [4.8, 4.5, 4.2, 3.0, 2.5, 2.0]


def test_a_good_run_passes_and_reports_the_numbers():
    rep, found = judged([fake_result(0, FALLING), fake_result(1, FALLING)])
    assert rep["ok"] and rep["exit_code"] == 0
    assert found["GD-SMOKE-006"]["severity"] == "pass" and found["GD-SMOKE-007"]["severity"] == "pass"
    assert rep["throughput"]["tokens_per_s"] == pytest.approx(2 * 512 / 0.1)
    assert rep["allreduce"]["busbw_gbps"] == pytest.approx((4 << 20) / 0.004 / 1e9)  # two ranks: busbw == algbw
    assert rep["mfu"]["vs_spec"] is None and "CPU run" in rep["mfu"]["vs_spec_missing_reason"]


def test_loss_that_does_not_fall_fails():
    flat = [4.8, 4.8, 4.8, 4.79, 4.8, 4.8]
    rep, found = judged([fake_result(0, flat), fake_result(1, flat)])
    assert not rep["ok"] and found["GD-SMOKE-006"]["severity"] == "fail"


def test_diverged_ranks_fail_and_are_named():
    rep, found = judged([fake_result(0, FALLING, "aaaa"), fake_result(1, FALLING, "bbbb")])
    assert not rep["ok"] and found["GD-SMOKE-007"]["severity"] == "fail"
    assert "rank 0 -> aaaa" in found["GD-SMOKE-007"]["message"] and "rank 1 -> bbbb" in found["GD-SMOKE-007"]["message"]


def test_floors():
    rep, found = judged([fake_result(0, FALLING)], min_tokens_per_s=1e9, min_mfu=0.01)
    assert found["GD-SMOKE-009"]["severity"] == "fail" and rep["exit_code"] == 1
    assert found["GD-SMOKE-008"]["severity"] == "pass"  # against the measured matmul on CPU
    rep, found = judged([fake_result(0, FALLING)], min_tokens_per_s=10.0)
    assert found["GD-SMOKE-009"]["severity"] == "pass" and rep["ok"]


def test_a_straggler_rank_is_named_with_its_host_and_the_exclude_line():
    slow = fake_result(1, FALLING)
    slow["local_compute_s"] = [0.2] * 3  # 4x the others' 0.05 s: past the CPU ranks' 60 % gap
    rep, found = judged([fake_result(0, FALLING), slow, fake_result(2, FALLING)])
    f = found["GD-SMOKE-010"]
    assert f["severity"] == "warn" and f["evidence"]["ranks"] == [1] and "rank 1 on h" in f["message"]
    assert "75% below the job's median" in f["message"]
    assert rep["exclude"]["sbatch"] == "--exclude=h" and rep["exclude"]["because"] == {"h": ["GD-SMOKE-010"]}
    healthy = fake_result(1, FALLING)
    healthy["local_compute_s"] = [0.06] * 3  # 17 % slower: CPU jitter, nobody named
    rep, found = judged([fake_result(0, FALLING), healthy, fake_result(2, FALLING)])
    assert found["GD-SMOKE-010"]["severity"] == "pass" and rep["exclude"] is None


def test_precision_verdict_says_which_precision_ran_and_why():
    rep, found = judged([fake_result(0, FALLING), fake_result(1, FALLING)])
    verdict = found["GD-SMOKE-011"]
    # bf16 is a pass; any fallback (fp32 on a CPU without native bf16) is info carrying the reason.
    assert verdict["severity"] == ("pass" if rep["run"]["precision"] == "bf16" else "info")
    assert verdict["message"] == rep["run"]["precision_reason"] and verdict["category"] == "precision"


def test_building_the_cli_does_not_import_torch():
    # gpudoctor's parser imports the smoke CLI on every command: `gpudoctor check` must stay cheap.
    import subprocess
    import sys

    code = "import sys; from gpudoctor.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
