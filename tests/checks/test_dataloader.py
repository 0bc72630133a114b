import json
from pathlib import Path

import pytest

from gpudoctor.model import Safety, Severity
from gpudoctor.readers.dlconfig import find_settings
from gpudoctor.readers.trainconfig import load_config
from tests.cliutil import run_gpudoctor_here
from tests.factsutil import HEALTHY_GPU, load_fixture, make_facts, run, said, severity

CONFIGS = Path(__file__).parents[1] / "fixtures" / "configs"
EIGHT_RANKS = {"LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "8"}
BOTH = frozenset({"GD-DL-001", "GD-SLURM-008"})  # a run with both CPU-shortage checks (e.g. no --select)
DOCKER_SHM = {"total_bytes": 64 * 1024 * 1024, "free_bytes": 64 * 1024 * 1024}


def cfg(name: str) -> dict:
    path = CONFIGS / name
    return {"config": load_config(str(path)), "config_path": str(path)}


def inline(config: dict) -> dict:
    return {"config": config, "config_path": "inline.yaml"}


# --- finding the settings ------------------------------------------------------------------


def test_navsim_seed_settings_are_found_under_dataloader_params():
    s = find_settings(load_config(str(CONFIGS / "seed-navsim-h200-dataloader.yaml")))
    assert s.value("num_workers") == 16 and s.where("num_workers") == "dataloader.params.num_workers"
    assert s.value("batch_size") == 256 and s.value("prefetch_factor") == 4
    assert s.value("pin_memory") is True and s.value("persistent_workers") is True and s.value("drop_last") is True


def test_mimic_seed_uses_hf_style_names():
    s = find_settings(load_config(str(CONFIGS / "seed-mimic-l4-training.yaml")))
    assert (s.value("num_workers"), s.where("num_workers")) == (12, "training.dataloader_num_workers")
    assert (s.value("batch_size"), s.where("batch_size")) == (16, "training.batch_size_per_gpu")
    assert s.value("gradient_accumulation_steps") == 4


def test_training_loader_wins_and_validation_only_settings_stay_unknown():
    s = find_settings(load_config(str(CONFIGS / "synthetic-lightning-cli.yaml")))
    assert s.value("num_workers") == 6  # ${data.init_args.workers}
    assert s.where("num_workers") == "data.init_args.train_dataloader.num_workers"
    assert s.value("batch_size") == 64
    assert s.value("pin_memory") is False
    assert s.value("persistent_workers") is None  # only the val loader states it


def test_hf_trainer_arguments():
    s = find_settings(load_config(str(CONFIGS / "synthetic-hf-trainer-args.yaml")))
    assert s.value("num_workers") == 0 and s.where("num_workers") == "dataloader_num_workers"
    assert s.value("batch_size") == 16 and s.where("batch_size") == "per_device_train_batch_size"
    assert s.value("pin_memory") is True


def test_deepspeed_train_batch_size_is_the_global_batch():
    s = find_settings(load_config(str(CONFIGS / "synthetic-deepspeed-good.json")))
    assert s.value("global_batch_size") == 256 and s.value("batch_size") == 4
    # Without DeepSpeed's keys next to it, train_batch_size is a per-device batch (diffusers) and not global.
    assert find_settings({"train_batch_size": 8}).value("global_batch_size") is None


def test_keys_that_are_not_the_dataloaders_are_ignored():
    config = {"scaling_config": {"num_workers": 8, "use_gpu": True}, "server": {"workers": 4}, "model": {"workers": 2}}
    assert find_settings(config).value("num_workers") is None
    assert find_settings({"workers": 8}).value("num_workers") == 8  # YOLO-style top-level key
    assert find_settings({"data": {"workers": 6}}).value("num_workers") == 6


def test_env_interpolation_and_unreadable_values():
    config = {"loader": {"num_workers": "${oc.env:WORKERS,4}", "pin_memory": "maybe", "batch_size": "${nope.x}"}}
    s = find_settings(config, env={"WORKERS": "10"})
    assert s.value("num_workers") == 10
    assert find_settings(config).value("num_workers") == 4
    assert s.value("pin_memory") is None and "not a boolean" in s.found["pin_memory"].problem
    assert s.value("batch_size") is None and "not in the config" in s.found["batch_size"].problem


# --- GD-DL-001 -----------------------------------------------------------------------------


def test_navsim_seed_workers_oversubscribe_a_128_cpu_allocation():
    facts = make_facts(env={}, patch={"host.cpus_allowed_count": 128})
    (f,) = run("GD-DL-001", facts, expect_gpus=8, **cfg("seed-navsim-h200-dataloader.yaml"))
    assert f.severity is Severity.WARN
    assert "per rank" in said(f) and "136 processes" in said(f) and "128 CPUs" in said(f)
    assert f.fix.safety is Safety.UNSAFE
    (action,) = f.fix.actions
    assert (action.kind, action.key, action.value) == ("yaml_set", "dataloader.params.num_workers", 15)


def test_good_config_fits_a_224_cpu_node():
    (f,) = run("GD-DL-001", make_facts(env=EIGHT_RANKS), **cfg("synthetic-good-dataloader.yaml"))
    assert f.severity is Severity.PASS
    assert "8 rank(s) x (8 workers + 1 main process) = 72 processes on 224 CPUs" in said(f)


def test_srun_task_cpu_set_is_per_rank():
    env = {
        "SLURM_JOB_ID": "9",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "2",
        "SLURM_LOCALID": "2",
        "SLURM_NTASKS": "4",
        "SLURM_TASKS_PER_NODE": "4",
        "SLURM_NNODES": "1",
    }
    # --cpus-per-task=8 with binding: each task sees 8 of the job's 32 CPUs on the node.
    facts = make_facts(env={**env, "SLURM_CPUS_ON_NODE": "32"}, patch={"host.cpus_allowed_count": 8})
    # mimic seed: 12 workers per rank in an 8-CPU task. Inside the SLURM job GD-SLURM-008 warns about
    # the same shortage (8 CPUs per task for 13 processes), so GD-DL-001 says so as info, not a second warning.
    (f,) = run("GD-DL-001", facts, launcher="srun", running=BOTH, **cfg("seed-mimic-l4-training.yaml"))
    assert f.severity is Severity.INFO and "1 rank(s) x (12 workers" in said(f) and "GD-SLURM-008 warns" in said(f)
    assert "GD-SLURM-008" in f.evidence["reported_by"]
    assert severity("GD-SLURM-008", facts, launcher="srun", **cfg("seed-mimic-l4-training.yaml")) is Severity.WARN
    assert f.evidence["ranks_sharing_cpus"] == "1 (srun task bound to 8 of the node's 32 CPUs)"
    facts16 = make_facts(env={**env, "SLURM_CPUS_ON_NODE": "64"}, patch={"host.cpus_allowed_count": 16})
    assert severity("GD-DL-001", facts16, launcher="srun", **cfg("seed-mimic-l4-training.yaml")) is Severity.PASS
    # Without binding every task sees the job's 32 CPUs, shared by the 4 tasks: 4 x 13 > 32.
    unbound = make_facts(env={**env, "SLURM_CPUS_ON_NODE": "32"}, patch={"host.cpus_allowed_count": 32})
    (f,) = run("GD-DL-001", unbound, launcher="srun", running=BOTH, **cfg("seed-mimic-l4-training.yaml"))
    assert f.severity is Severity.INFO and "4 rank(s) x (12 workers" in said(f)
    # Without GD-SLURM-008 in the run (--select GD-DL-001, audit_dataloader) the warning stays here.
    assert severity("GD-DL-001", unbound, launcher="srun", **cfg("seed-mimic-l4-training.yaml")) is Severity.WARN


def test_slurm_shortage_is_warned_once_but_a_container_quota_still_warns_here():
    config = {"data": {"num_workers": 12}}
    env = {
        "SLURM_JOB_ID": "42",
        "SLURM_NNODES": "1",
        "SLURM_NTASKS": "1",
        "SLURM_CPUS_PER_TASK": "32",
        "SLURM_CPUS_ON_NODE": "32",
        "SLURM_TASKS_PER_NODE": "1",
        "SLURM_PROCID": "0",
        "SLURM_STEP_ID": "0",
        "LOCAL_WORLD_SIZE": "8",
        "WORLD_SIZE": "8",
        "TORCHELASTIC_RUN_ID": "1",
    }
    facts = make_facts(env=env, patch={"host.cpus_allowed_count": 32})
    # torchrun, 8 ranks in one 32-CPU task: 8 x 13 = 104 processes. SLURM-008 warns; DL-001 points at it.
    assert severity("GD-SLURM-008", facts, launcher="torchrun", **inline(config)) is Severity.WARN
    (f,) = run("GD-DL-001", facts, launcher="torchrun", running=BOTH, **inline(config))
    assert f.severity is Severity.INFO and "104 processes" in said(f) and f.fix.safety is Safety.UNSAFE
    assert (
        severity("GD-DL-001", facts, launcher="torchrun", running=frozenset({"GD-DL-001"}), **inline(config))
        is Severity.WARN
    )
    # Outside SLURM the same numbers are DL-001's own warning.
    plain = make_facts(env={"LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "8"}, patch={"host.cpus_allowed_count": 32})
    assert severity("GD-DL-001", plain, running=BOTH, **inline(config)) is Severity.WARN
    # A container quota below SLURM's grant is a cause SLURM-008 does not see: DL-001 keeps its warning.
    quota = make_facts(env=env, patch={"host.cpus_allowed_count": 32, "host.container.cpu_limit": 16.0})
    (f,) = run("GD-DL-001", quota, launcher="torchrun", running=BOTH, **inline(config))
    assert f.severity is Severity.WARN and "container CPU quota 16" in said(f)
    # When SLURM grants enough, both pass.
    small = {"data": {"num_workers": 2}}
    assert severity("GD-DL-001", facts, launcher="torchrun", **inline(small)) is Severity.PASS


def test_container_cpu_quota_is_the_budget():
    facts = make_facts(env=EIGHT_RANKS, patch={"host.container.cpu_limit": 32.0})
    (f,) = run("GD-DL-001", facts, **cfg("synthetic-good-dataloader.yaml"))
    assert f.severity is Severity.WARN and "container CPU quota 32" in said(f)


def test_worker_check_skips_without_a_config():
    assert severity("GD-DL-001", make_facts()) is Severity.SKIP
    assert severity("GD-DL-001", make_facts(), **inline({"lr": 0.1})) is Severity.SKIP


# --- GD-DL-002 / 003 / 004 -----------------------------------------------------------------


def test_no_workers_on_gpu_training_warns():
    (f,) = run("GD-DL-002", make_facts(env=EIGHT_RANKS), **cfg("synthetic-hf-trainer-args.yaml"))
    assert f.severity is Severity.WARN
    assert "dataloader_num_workers" in said(f)
    assert f.fix.safety is Safety.UNSAFE and f.fix.actions[0].key == "dataloader_num_workers"


def test_no_workers_is_fine_on_a_cpu_job():
    assert severity("GD-DL-002", make_facts(), expect_gpus=0, **cfg("synthetic-hf-trainer-args.yaml")) is Severity.SKIP


def test_workers_pass():
    assert severity("GD-DL-002", make_facts(), **cfg("synthetic-good-dataloader.yaml")) is Severity.PASS


def test_unpinned_memory_is_info():
    (f,) = run("GD-DL-003", make_facts(), **cfg("synthetic-lightning-cli.yaml"))
    assert f.severity is Severity.INFO
    assert "data.init_args.train_dataloader.pin_memory" in said(f)
    assert severity("GD-DL-003", make_facts(), **cfg("synthetic-good-dataloader.yaml")) is Severity.PASS


def test_non_persistent_workers_is_info():
    config = {"dataloader": {"num_workers": 4, "persistent_workers": False}}
    assert severity("GD-DL-004", make_facts(), **inline(config)) is Severity.INFO
    assert severity("GD-DL-004", make_facts(), **cfg("synthetic-good-dataloader.yaml")) is Severity.PASS
    assert (
        severity("GD-DL-004", make_facts(), **cfg("synthetic-lightning-cli.yaml")) is Severity.SKIP
    )  # not stated for train


# --- GD-DL-005 -----------------------------------------------------------------------------


def test_docker_default_shm_is_too_small_for_workers():
    facts = make_facts(env=EIGHT_RANKS, patch={"host.shm": DOCKER_SHM, "host.container.in_container": True})
    (f,) = run("GD-DL-005", facts, **cfg("synthetic-good-dataloader.yaml"))
    assert f.severity is Severity.WARN
    assert "128 batches in flight" in said(f) and "Bus error" in said(f)
    assert "--shm-size" in f.fix.actions[0].target


def test_large_shm_passes_even_for_the_navsim_seed():
    (f,) = run("GD-DL-005", make_facts(env=EIGHT_RANKS), **cfg("seed-navsim-h200-dataloader.yaml"))
    assert f.severity is Severity.PASS and "512 batches in flight" in said(f)


def test_no_workers_do_not_need_shm():
    facts = make_facts(patch={"host.shm": DOCKER_SHM})
    assert severity("GD-DL-005", facts, **cfg("synthetic-hf-trainer-args.yaml")) is Severity.PASS


# --- GD-DL-006 -----------------------------------------------------------------------------


def test_omp_threads_times_ranks_over_cpus_warns():
    (f,) = run("GD-DL-006", make_facts(env={**EIGHT_RANKS, "OMP_NUM_THREADS": "32"}))
    assert f.severity is Severity.WARN
    assert "256 threads on 224 CPUs" in said(f)
    assert (f.fix.actions[0].target, f.fix.actions[0].value) == ("OMP_NUM_THREADS", "28")


def test_unset_omp_under_torchrun_is_one_thread():
    assert severity("GD-DL-006", make_facts(env=EIGHT_RANKS), launcher="torchrun") is Severity.PASS
    assert severity("GD-DL-006", make_facts(env={**EIGHT_RANKS, "TORCHELASTIC_RUN_ID": "1"})) is Severity.PASS


def test_unset_omp_with_lightning_spawned_ranks_is_info():
    (f,) = run("GD-DL-006", make_facts(env={}), launcher="lightning", expect_gpus=8)
    assert f.severity is Severity.INFO and "1792 on 224 CPUs" in said(f)


def test_omp_threads_fitting_pass_and_malformed_warns():
    assert severity("GD-DL-006", make_facts(env={**EIGHT_RANKS, "OMP_NUM_THREADS": "4"})) is Severity.PASS
    assert severity("GD-DL-006", make_facts(env={**EIGHT_RANKS, "OMP_NUM_THREADS": "16,2"})) is Severity.PASS
    assert severity("GD-DL-006", make_facts(env={"OMP_NUM_THREADS": "auto"})) is Severity.WARN


# --- GD-DL-007 -----------------------------------------------------------------------------


def test_deepspeed_global_batch_not_divisible_fails():
    (f,) = run("GD-DL-007", make_facts(env=EIGHT_RANKS), **cfg("synthetic-deepspeed-bad-batch.json"))
    assert f.severity is Severity.FAIL
    assert "train_batch_size=250" in said(f) and "DeepSpeed refuses to start" in said(f)
    (action,) = f.fix.actions  # 4 per GPU x 8 steps x 8 ranks
    assert (action.key, action.value) == ("train_batch_size", 256)


def test_deepspeed_consistent_batch_passes():
    (f,) = run("GD-DL-007", make_facts(env=EIGHT_RANKS), **cfg("synthetic-deepspeed-good.json"))
    assert (
        f.severity is Severity.PASS
        and "train_batch_size=256 = train_micro_batch_size_per_gpu=4 x gradient_accumulation_steps=8 x 8 ranks"
        in said(f)
    )


def test_deepspeed_micro_times_accumulation_mismatch_fails():
    config = {"train_batch_size": 128, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8}
    (f,) = run("GD-DL-007", make_facts(env=EIGHT_RANKS), **inline(config))
    assert f.severity is Severity.FAIL and "= 256" in said(f)


def test_tensor_parallel_divides_the_world_first():
    # 8 GPUs with tensor parallel 2: 4 data-parallel ranks; 36 divides by 4 but not by 8.
    config = {"global_batch_size": 36, "micro_batch_size": 9, "tensor_model_parallel_size": 2}
    assert severity("GD-DL-007", make_facts(env=EIGHT_RANKS), **inline(config)) is Severity.PASS
    assert (
        severity("GD-DL-007", make_facts(env=EIGHT_RANKS), **inline({**config, "tensor_model_parallel_size": 1}))
        is Severity.FAIL
    )


def test_plain_global_batch_not_divisible_warns():
    assert severity("GD-DL-007", make_facts(env=EIGHT_RANKS), **inline({"global_batch_size": 100})) is Severity.WARN


def test_global_batch_without_world_size_skips():
    assert severity("GD-DL-007", make_facts(env={}), **inline({"global_batch_size": 100})) is Severity.SKIP
    assert severity("GD-DL-007", make_facts(env=EIGHT_RANKS), **cfg("seed-mimic-l4-training.yaml")) is Severity.SKIP


# --- GD-DL-008 / 009 -----------------------------------------------------------------------


def test_prefetch_and_persistent_without_workers_are_rejected_by_torch():
    (f,) = run("GD-DL-008", make_facts(), **cfg("synthetic-prefetch-without-workers.yaml"))
    assert f.severity is Severity.WARN
    assert "persistent_workers=True" in said(f) and "prefetch_factor=2" in said(f) and "ValueError" in said(f)


def test_prefetch_2_without_workers_was_allowed_before_torch_2():
    f = make_facts(patch={"torch_meta.version": "1.13.1", "torch.version": "1.13.1"})
    (finding,) = run("GD-DL-008", f, **cfg("synthetic-prefetch-without-workers.yaml"))
    assert "prefetch_factor" not in finding.message and "persistent_workers" in said(finding)


def test_accepted_arguments_pass():
    assert severity("GD-DL-008", make_facts(), **cfg("seed-navsim-h200-dataloader.yaml")) is Severity.PASS


def test_non_distributed_sampler_on_several_ranks():
    config = {"dataloader": {"sampler": "torch.utils.data.sampler.RandomSampler"}}
    assert severity("GD-DL-009", make_facts(env=EIGHT_RANKS), **inline(config)) is Severity.WARN
    assert severity("GD-DL-009", make_facts(env=EIGHT_RANKS), launcher="lightning", **inline(config)) is Severity.INFO
    distributed = {"dataloader": {"sampler": {"_target_": "torch.utils.data.distributed.DistributedSampler"}}}
    assert severity("GD-DL-009", make_facts(env=EIGHT_RANKS), **inline(distributed)) is Severity.PASS
    assert severity("GD-DL-009", make_facts(env={}), **inline(config)) is Severity.SKIP


# --- the CLI with --config -----------------------------------------------------------------


@pytest.fixture()
def small_node_snapshot(tmp_path):
    data = load_fixture(HEALTHY_GPU)
    data["host"]["cpus_allowed_count"] = 64
    data["host"]["shm"] = dict(DOCKER_SHM)
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(data))
    return path


def test_cli_gives_verdicts_from_the_config(small_node_snapshot):
    config = CONFIGS / "seed-navsim-h200-dataloader.yaml"
    r = run_gpudoctor_here(
        "check",
        "--snapshot",
        str(small_node_snapshot),
        "--config",
        str(config),
        "--select",
        "dataloader",
        "--expect-gpus",
        "8",
        "--json",
    )
    assert r.returncode == 0, r.stderr  # warnings only
    by_id = {f["id"]: f for f in json.loads(r.stdout)["findings"]}
    assert by_id["GD-DL-001"]["severity"] == "warn"
    assert by_id["GD-DL-001"]["evidence"]["num_workers"] == {"value": 16, "path": "dataloader.params.num_workers"}
    assert by_id["GD-DL-001"]["fix"]["safety"] == "unsafe"
    assert by_id["GD-DL-005"]["severity"] == "warn"
    assert by_id["GD-DL-002"]["severity"] == "pass"


def test_cli_config_fails_on_a_broken_deepspeed_batch(small_node_snapshot):
    config = CONFIGS / "synthetic-deepspeed-bad-batch.json"
    r = run_gpudoctor_here(
        "check",
        "--snapshot",
        str(small_node_snapshot),
        "--config",
        str(config),
        "--select",
        "GD-DL-007",
        "--expect-gpus",
        "8",
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "DeepSpeed refuses to start" in " ".join(r.stdout.split())  # as wrapped to the terminal


def test_cli_broken_yaml_is_one_line_and_exit_2(small_node_snapshot):
    r = run_gpudoctor_here(
        "check", "--snapshot", str(small_node_snapshot), "--config", str(CONFIGS / "synthetic-broken.yaml")
    )
    assert r.returncode == 2
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1
    assert "broken YAML at line" in r.stderr and "Traceback" not in r.stderr


def test_cli_missing_config_is_exit_2():
    r = run_gpudoctor_here("check", "--expect-gpus", "0", "--config", "/nonexistent/train.yaml")
    assert r.returncode == 2 and "no such file" in r.stderr


def test_batch_script_torchrun_line_gives_the_ranks_per_node():
    from gpudoctor.readers.sbatch import parse_sbatch

    sb = parse_sbatch(
        "#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --gres=gpu:8\nexport OMP_NUM_THREADS=64\n"
        "srun torchrun --nproc-per-node=8 train.py\n",
        "job.slurm",
    )
    (f,) = run("GD-DL-006", make_facts(env={"SLURM_JOB_ID": "3"}), sbatch=sb)
    assert f.severity is Severity.WARN and "OMP_NUM_THREADS=64 x 8 rank(s) = 512 threads" in said(f)
    assert f.evidence["ranks_on_node"] == "8 (ranks per node on the batch script's launch line)"


# --- rules checked against real framework behaviour (see tests/readers/test_configs_realworld.py) ----


def test_deepspeed_derives_the_missing_value_then_asserts_equality():
    # DeepSpeed: micro batch given, accumulation derived as 96 // 8 // 8 = 1, and 8 x 1 x 8 != 96.
    micro_only = {"train_batch_size": 96, "train_micro_batch_size_per_gpu": 8}
    (f,) = run("GD-DL-007", make_facts(env=EIGHT_RANKS), **inline(micro_only))
    assert (
        f.severity is Severity.FAIL
        and "not a multiple of train_micro_batch_size_per_gpu=8 x 8 data-parallel ranks = 64" in said(f)
    )
    assert f.fix.actions[0].value in (64, 128)
    assert (
        severity("GD-DL-007", make_facts(env={"WORLD_SIZE": "4"}), **inline(micro_only)) is Severity.PASS
    )  # 96 = 8 x 3 x 4
    # Accumulation given: micro = 96 // 8 // 4 = 3 and 3 x 4 x 8 == 96.
    accum_only = {"train_batch_size": 96, "gradient_accumulation_steps": 4, "zero_optimization": {"stage": 1}}
    assert severity("GD-DL-007", make_facts(env=EIGHT_RANKS), **inline(accum_only)) is Severity.PASS
    assert (
        severity("GD-DL-007", make_facts(env=EIGHT_RANKS), **inline({**accum_only, "gradient_accumulation_steps": 5}))
        is Severity.FAIL
    )


def test_deepspeed_auto_is_filled_in_consistently():
    config = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
    }
    (f,) = run("GD-DL-007", make_facts(env=EIGHT_RANKS), **inline(config))
    assert f.severity is Severity.PASS and "auto" in said(f)
    # An explicit global batch with "auto" parts: only the divisibility by the ranks is known.
    assert (
        severity("GD-DL-007", make_facts(env=EIGHT_RANKS), **inline({**config, "train_batch_size": 100}))
        is Severity.FAIL
    )


def test_megatron_accumulation_is_derived_not_read_from_the_trainer():
    config = {"trainer": {"accumulate_grad_batches": 1}, "model": {"micro_batch_size": 4, "global_batch_size": 256}}
    (f,) = run("GD-DL-007", make_facts(env=EIGHT_RANKS), **inline(config))
    assert f.severity is Severity.PASS and "8 micro-batches accumulated per step" in said(f)
    bad = {"model": {"micro_batch_size": 4, "global_batch_size": 48, "context_parallel_size": 2}}
    (f,) = run("GD-DL-007", make_facts(env=EIGHT_RANKS), **inline(bad))  # dp = 8 / 2 = 4, 48 % 16 == 0
    assert f.severity is Severity.PASS and "context 2" in f.evidence["data_parallel"]
    assert (
        severity(
            "GD-DL-007",
            make_facts(env=EIGHT_RANKS),
            **inline({"model": {"micro_batch_size": 4, "global_batch_size": 48}}),
        )
        is Severity.FAIL
    )


def test_unknown_values_say_why_they_are_skipped():
    cases = {
        "auto": "the framework chooses the value",
        "${oc.decode:${oc.env:W,4}}": "interpolation gpudoctor does not evaluate",
        "${oc.env:NOT_SET_HERE}": "unset in this environment",
        None: "is null",
    }
    for value, reason in cases.items():
        (f,) = run("GD-DL-001", make_facts(env=EIGHT_RANKS), **inline({"data": {"num_workers": value}}))
        assert f.severity is Severity.SKIP and reason in said(f), (value, f.message)


def test_negative_workers_are_left_to_dl008():
    config = {"data": {"num_workers": -1, "persistent_workers": True}}
    for cid in ("GD-DL-001", "GD-DL-002", "GD-DL-004", "GD-DL-005"):
        assert severity(cid, make_facts(env=EIGHT_RANKS), **inline(config)) is Severity.SKIP, cid
    (f,) = run("GD-DL-008", make_facts(), **inline(config))
    assert f.severity is Severity.WARN and "negative" in said(f) and "num_workers" in f.fix.title


def test_hf_trainer_defaults_count_for_rejected_arguments_only():
    config = {"per_device_train_batch_size": 4, "dataloader_persistent_workers": True}
    (f,) = run("GD-DL-008", make_facts(), **inline(config))
    assert f.severity is Severity.WARN and "TrainingArguments' default is 0" in said(f)
    assert "dataloader_persistent_workers" in f.fix.title
    (f,) = run("GD-DL-002", make_facts(env=EIGHT_RANKS), **inline(config))
    assert f.severity is Severity.INFO and f.fix.actions[0].key == "dataloader_num_workers"
    # Not an HF config: an unstated num_workers stays unknown.
    assert severity("GD-DL-008", make_facts(), **inline({"loader": {"persistent_workers": True}})) is Severity.PASS


def test_training_override_beats_a_shared_anchor_and_dev_loaders_do_not_count():
    shared = {"num_workers": 4, "pin_memory": False}
    config = {
        "loader_defaults": shared,
        "train": {"loader": {**shared, "num_workers": 12}},
        "dev_loader": {"num_workers": 0, "pin_memory": True},
    }
    s = find_settings(config)
    assert (s.value("num_workers"), s.where("num_workers")) == (12, "train.loader.num_workers")
    assert s.value("pin_memory") is False


def test_rank_aware_samplers_and_lightning_configs():
    mm = {"train_dataloader": {"num_workers": 2, "sampler": {"type": "InfiniteSampler", "shuffle": True}}}
    assert severity("GD-DL-009", make_facts(env=EIGHT_RANKS), **inline(mm)) is Severity.PASS
    lightning = {"trainer": {"devices": 8, "strategy": "ddp"}, "data": {"sampler": "torch.utils.data.RandomSampler"}}
    assert severity("GD-DL-009", make_facts(env=EIGHT_RANKS), **inline(lightning)) is Severity.INFO
