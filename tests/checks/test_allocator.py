import pytest

from gpudoctor.model import Severity
from gpudoctor.readers.allocconf import effective_variable, parse_alloc_conf, suggest_correction
from gpudoctor.registry import load_all
from tests.factsutil import DELETE, RECORDED_CPU, make_facts, run, said, severity

HEALTHY_TORCH = (2, 3)  # the healthy fixture's torch 2.3.1


def facts(env: dict, torch: str | None = "2.3.1+cu121"):
    """Only what the allocator checks read: env and torch's package version (no import probe)."""
    patch = {"torch": DELETE, "torch_meta.version": torch}
    return make_facts(env={"PATH": "/usr/bin", **env}, patch=patch)


def test_allocator_checks_never_need_torch_import():
    for spec in load_all().values():
        if spec.category == "allocator":
            assert "torch" not in spec.needs, spec.id


# --- allocconf: the value as torch parses it ----------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "max_split_size_mb:512",
        "expandable_segments:True",
        "garbage_collection_threshold:0.6,max_split_size_mb:128",
        " max_split_size_mb : 256 , expandable_segments : False ",  # blanks are dropped
        "roundup_power2_divisions:4",
        "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
        "backend:cudaMallocAsync",
        "max_split_size_mb:512,",  # a trailing comma is accepted
        "",
    ],
)
def test_valid_configs(text):
    assert parse_alloc_conf(text, HEALTHY_TORCH).errors == []


@pytest.mark.parametrize(
    "text, words",
    [
        ("max_split_size_mb:abc", "not a number"),
        ("max_split_size_mb:10", "more than 20"),
        ("max_split_size_mb=512", "key:value, not key=value"),
        ("expandable_segments:true", "exactly True or False"),
        ("expandable_segments", "no ':value'"),
        ("garbage_collection_threshold:1.0", "strictly between 0 and 1"),
        ("garbage_collection_threshold:0", "strictly between 0 and 1"),
        ("roundup_power2_divisions:3", "power of 2"),
        ("roundup_power2_divisions:[300:2]", "power of 2"),
        ("backend:async", "native or cudaMallocAsync"),
        ("max_spilt_size_mb:512", "did you mean max_split_size_mb"),
        ("max_split_size_mb:512;expandable_segments:True", "separate pairs with ','"),
        (",max_split_size_mb:512", "expected a key"),
        ("pinned_num_register_threads:3", "power of 2"),
    ],
)
def test_invalid_configs(text, words):
    conf = parse_alloc_conf(text, HEALTHY_TORCH)
    assert conf.errors and words in " ".join(conf.errors)


def test_keys_newer_than_torch():
    assert "arrived in torch 2.1" in parse_alloc_conf("expandable_segments:True", (2, 0)).errors[0]
    assert parse_alloc_conf("expandable_segments:True", (2, 1)).errors == []
    # versions we could not pin exactly give a warning, not a failure
    conf = parse_alloc_conf("pinned_use_background_threads:True", (2, 3))
    assert conf.errors == [] and conf.warnings


def test_split_size_of_exactly_20_depends_on_torch():
    assert parse_alloc_conf("max_split_size_mb:20", (2, 3)).warnings
    assert parse_alloc_conf("max_split_size_mb:20", (2, 10)).warnings == []


def test_unknown_key_on_torch_newer_than_the_table_is_only_a_warning():
    conf = parse_alloc_conf("brand_new_option:1", (2, 20))
    assert conf.errors == [] and conf.warnings


def test_cuda_malloc_async_ignores_native_options():
    conf = parse_alloc_conf("backend:cudaMallocAsync,max_split_size_mb:256", HEALTHY_TORCH)
    assert conf.errors == [] and "ignores max_split_size_mb" in conf.warnings[0]


def test_trailing_text_after_a_number_is_read_like_stoi():
    conf = parse_alloc_conf("max_split_size_mb:512MB", HEALTHY_TORCH)
    assert conf.errors == [] and "reads it as 512" in conf.warnings[0]


def test_last_repeated_key_wins():
    assert parse_alloc_conf("max_split_size_mb:64,max_split_size_mb:128", HEALTHY_TORCH).settings == {
        "max_split_size_mb": "128"
    }


def test_common_slips_get_a_corrected_value():
    assert suggest_correction("expandable_segments:true") == "expandable_segments:True"
    assert (
        suggest_correction("max_split_size_mb=512;expandable_segments=true")
        == "max_split_size_mb:512,expandable_segments:True"
    )
    assert suggest_correction("max_split_size_mb:abc") is None


def test_which_variable_each_torch_reads():
    both = {"PYTORCH_ALLOC_CONF": "a", "PYTORCH_CUDA_ALLOC_CONF": "b"}
    old, unverified, new = (
        effective_variable(both, (2, 9)),
        effective_variable(both, (2, 11)),
        effective_variable(both, (2, 13)),
    )
    assert (old.effective, old.ignored) == ("PYTORCH_CUDA_ALLOC_CONF", ("PYTORCH_ALLOC_CONF",))
    # torch 2.13 reads PYTORCH_CUDA_ALLOC_CONF first (verified with _accelerator_getAllocatorSettings)
    assert (new.effective, new.ignored) == ("PYTORCH_CUDA_ALLOC_CONF", ("PYTORCH_ALLOC_CONF",))
    assert unverified.order_unknown and unverified.candidates == ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
    alias = effective_variable({"PYTORCH_CUDA_ALLOC_CONF": "b"}, (2, 11))
    assert alias.effective == "PYTORCH_CUDA_ALLOC_CONF" and alias.deprecated_alias
    alone = effective_variable({"PYTORCH_ALLOC_CONF": "a"}, (2, 13))
    assert alone.effective == "PYTORCH_ALLOC_CONF" and not alone.ignored


def test_large_segment_size_is_a_key_of_torch_2_13():
    assert parse_alloc_conf("large_segment_size_mb:64", (2, 13)).ok
    assert not parse_alloc_conf("large_segment_size_mb:8", (2, 13)).ok


# --- GD-ALLOC-001 alloc-conf-invalid ------------------------------------------------------------


def test_navsim_max_split_size_512_is_valid():
    (f,) = run("GD-ALLOC-001", facts({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}))
    assert f.severity is Severity.PASS and "valid for torch 2.3" in said(f)


def test_garbage_value_fails():
    (f,) = run("GD-ALLOC-001", facts({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:abc"}))
    assert f.severity is Severity.FAIL and "max_split_size_mb:abc" in said(f)


def test_lower_case_bool_fails_with_a_safe_corrected_value():
    (f,) = run("GD-ALLOC-001", facts({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:true"}))
    assert f.severity is Severity.FAIL
    assert f.fix.safety.value == "safe" and f.fix.actions[0].value == "expandable_segments:True"


def test_expandable_segments_on_torch_2_0_fails():
    assert (
        severity("GD-ALLOC-001", facts({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, torch="2.0.1"))
        is Severity.FAIL
    )


def test_new_variable_is_validated_on_new_torch():
    f = facts({"PYTORCH_ALLOC_CONF": "garbage_collection_threshold:2"}, torch="2.11.0")
    assert severity("GD-ALLOC-001", f) is Severity.FAIL


def test_unset_passes_and_recorded_machine_passes():
    assert severity("GD-ALLOC-001", facts({})) is Severity.PASS
    assert severity("GD-ALLOC-001", make_facts(RECORDED_CPU), expect_gpus=0) is Severity.PASS


def test_without_torch_version_both_variables_are_checked():
    f = facts(
        {"PYTORCH_ALLOC_CONF": "expandable_segments:True", "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:5"}, torch=None
    )
    assert severity("GD-ALLOC-001", f) is Severity.FAIL


# --- GD-ALLOC-002 alloc-conf-variable-ignored ---------------------------------------------------


def test_new_variable_on_old_torch_is_ignored_and_fix_copies_it():
    (f,) = run("GD-ALLOC-002", facts({"PYTORCH_ALLOC_CONF": "expandable_segments:True"}, torch="2.5.1"))
    assert f.severity is Severity.WARN and "ignored" in said(f)
    assert (f.fix.actions[0].target, f.fix.actions[0].value) == ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")


def test_old_variable_shadowed_on_new_torch_warns():
    env = {"PYTORCH_ALLOC_CONF": "max_split_size_mb:256", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    (f,) = run("GD-ALLOC-002", facts(env, torch="2.10.0"))
    assert f.severity is Severity.WARN and f.fix.actions[0].kind == "unset_env" and "only one" in said(f)


def test_both_set_on_torch_2_13_the_old_name_wins():
    env = {"PYTORCH_ALLOC_CONF": "max_split_size_mb:256", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    (f,) = run("GD-ALLOC-002", facts(env, torch="2.13.0"))
    assert f.severity is Severity.WARN and "ignores PYTORCH_ALLOC_CONF" in said(f)
    # a typo in the variable torch 2.13 ignores is harmless; one in the variable it reads is not
    assert severity("GD-ALLOC-001", facts({**env, "PYTORCH_ALLOC_CONF": "bogus:1"}, torch="2.13.0")) is Severity.PASS
    assert (
        severity("GD-ALLOC-001", facts({**env, "PYTORCH_CUDA_ALLOC_CONF": "bogus:1"}, torch="2.13.0")) is Severity.FAIL
    )


def test_both_set_on_unverified_torch_checks_both():
    env = {"PYTORCH_ALLOC_CONF": "bogus:1", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert severity("GD-ALLOC-001", facts(env, torch="2.11.0")) is Severity.FAIL


def test_old_variable_alone_on_new_torch_is_a_deprecated_alias_not_an_alarm():
    assert (
        severity("GD-ALLOC-002", facts({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, torch="2.11.0"))
        is Severity.PASS
    )


def test_matching_variable_passes():
    assert (
        severity("GD-ALLOC-002", facts({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, torch="2.5.1"))
        is Severity.PASS
    )


# --- GD-ALLOC-003 caching-allocator-disabled ----------------------------------------------------


def test_no_caching_1_warns():
    (f,) = run("GD-ALLOC-003", facts({"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}))
    assert f.severity is Severity.WARN and f.fix.actions[0].kind == "unset_env"


def test_no_caching_0_still_disables_caching_before_torch_2_7():
    (f,) = run("GD-ALLOC-003", facts({"PYTORCH_NO_CUDA_MEMORY_CACHING": "0"}, torch="2.5.1"))
    assert f.severity is Severity.WARN and "even when it is 0" in said(f)


def test_no_caching_0_is_off_from_torch_2_7():
    assert severity("GD-ALLOC-003", facts({"PYTORCH_NO_CUDA_MEMORY_CACHING": "0"}, torch="2.7.0")) is Severity.PASS


def test_caching_unset_passes():
    assert severity("GD-ALLOC-003", facts({})) is Severity.PASS


# --- GD-ALLOC-004 cuda-launch-blocking-on -------------------------------------------------------


def test_launch_blocking_1_warns():
    assert severity("GD-ALLOC-004", facts({"CUDA_LAUNCH_BLOCKING": "1"})) is Severity.WARN


def test_launch_blocking_0_is_off():  # the navsim guide's CUDA_LAUNCH_BLOCKING=0: no false alarm
    (f,) = run("GD-ALLOC-004", facts({"CUDA_LAUNCH_BLOCKING": "0"}))
    assert f.severity is Severity.PASS and "off" in said(f)


def test_launch_blocking_other_values_are_info():
    assert severity("GD-ALLOC-004", facts({"CUDA_LAUNCH_BLOCKING": "true"})) is Severity.INFO


# --- GD-ALLOC-005 cuda-dsa-flag-at-runtime ------------------------------------------------------


def test_torch_use_cuda_dsa_at_runtime_is_info_with_unset():  # the navsim guide's TORCH_USE_CUDA_DSA=1
    (f,) = run("GD-ALLOC-005", facts({"TORCH_USE_CUDA_DSA": "1"}))
    assert f.severity is Severity.INFO and "PYTORCH_USE_CUDA_DSA" in said(f)
    assert f.fix.actions[0].target == "TORCH_USE_CUDA_DSA"


def test_no_dsa_flags_pass():
    assert severity("GD-ALLOC-005", facts({})) is Severity.PASS


# --- GD-ALLOC-006 cuda-debug-tool-attached ------------------------------------------------------


@pytest.mark.parametrize(
    "env, words",
    [
        (
            {"CUDA_INJECTION64_PATH": "/opt/nvidia/nsight-systems/2024.1/target-linux-x64/libToolsInjection64.so"},
            "Nsight Systems",
        ),
        ({"LD_PRELOAD": "/usr/local/cuda/compute-sanitizer/libsanitizer-public.so"}, "compute-sanitizer"),
        ({"TORCH_CUDA_SANITIZER": "0"}, "stream sanitizer"),  # torch enables it whenever the name exists
        ({"CUDNN_LOGINFO_DBG": "1"}, "cuDNN logs"),
        ({"CUBLASLT_LOG_LEVEL": "5"}, "cuBLASLt"),
    ],
)
def test_debug_tools_warn(env, words):
    (f,) = run("GD-ALLOC-006", facts(env))
    assert f.severity is Severity.WARN and words in said(f)


def test_error_only_logging_and_plain_ld_preload_pass():
    env = {
        "CUDNN_LOGLEVEL_DBG": "1",
        "CUBLASLT_LOG_LEVEL": "1",
        "LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    }
    assert severity("GD-ALLOC-006", facts(env)) is Severity.PASS


def test_navsim_guide_environment_verdicts():
    env = {
        "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512",
        "TORCH_CUDNN_V8_API_ENABLED": "1",
        "TORCH_USE_CUDA_DSA": "1",
        "CUDA_LAUNCH_BLOCKING": "0",
    }
    f = facts(env)
    verdicts = {
        cid: severity(cid, f)
        for cid in ("GD-ALLOC-001", "GD-ALLOC-003", "GD-ALLOC-004", "GD-ALLOC-005", "GD-ALLOC-006")
    }
    assert verdicts == {
        "GD-ALLOC-001": Severity.PASS,
        "GD-ALLOC-003": Severity.PASS,
        "GD-ALLOC-004": Severity.PASS,
        "GD-ALLOC-005": Severity.INFO,
        "GD-ALLOC-006": Severity.PASS,
    }


@pytest.mark.parametrize(
    "value, expected",
    [
        ("OFF", Severity.PASS),
        ("INFO", Severity.PASS),
        ("DETAIL", Severity.WARN),
        ("detail", Severity.WARN),
        ("true", Severity.FAIL),
    ],
)
def test_torch_distributed_debug(value, expected):
    # c10d/debug.cpp upper-cases the value; anything but OFF/INFO/DETAIL raises at import torch.distributed
    (f,) = run("GD-ALLOC-006", facts({"TORCH_DISTRIBUTED_DEBUG": value}))
    assert f.severity is expected
    if expected is not Severity.PASS:
        assert f.fix.actions[0].target == "TORCH_DISTRIBUTED_DEBUG"


def test_eager_module_loading_is_info_and_lazy_passes():
    (f,) = run("GD-ALLOC-006", facts({"CUDA_MODULE_LOADING": "EAGER"}))
    assert f.severity is Severity.INFO and "start-up" in said(f)
    assert severity("GD-ALLOC-006", facts({"CUDA_MODULE_LOADING": "LAZY"})) is Severity.PASS


@pytest.mark.parametrize(
    "text, torch_version, ok",
    [
        ("max_split_size_mb:3000000000", (2, 4), False),  # torch < 2.10 reads it with std::stoi: out_of_range
        ("max_split_size_mb:3000000000", (2, 13), True),  # 2.10+ reads with std::stoull
        ("max_split_size_mb:2147483647", (2, 4), True),
        ("roundup_power2_divisions:4294967296", (2, 4), False),
    ],
)
def test_numbers_beyond_torchs_integer_parser_raise(text, torch_version, ok):
    conf = parse_alloc_conf(text, torch_version)
    assert conf.ok is ok
    assert ok or "out_of_range" in conf.errors[0]


def test_non_ascii_digits_are_not_numbers_to_torch():
    assert not parse_alloc_conf("max_split_size_mb:１２８", (2, 13)).ok


# --------------------------------------------------------------- issue 18: the fix keeps what torch accepts


@pytest.mark.parametrize(
    "text, kept, dropped",
    [
        ("expandable_segments:True,bogus_key:1", "expandable_segments:True", ["bogus_key:1"]),
        (  # a list's own commas stay inside it; slips are mended before judging
            "roundup_power2_divisions:[256:1,512:2],max_split_size_mb:10;expandable_segments=true",
            "roundup_power2_divisions:[256:1,512:2],expandable_segments:True",
            ["max_split_size_mb:10"],
        ),
        ("bogus:1,other:2", "", ["bogus:1", "other:2"]),
        ("garbage_collection_threshold:1.5", "", ["garbage_collection_threshold:1.5"]),
    ],
)
def test_valid_entries_keep_what_torch_accepts(text, kept, dropped):
    from gpudoctor.readers.allocconf import valid_entries

    assert valid_entries(text, (2, 13)) == (kept, dropped)
    if kept:
        assert parse_alloc_conf(kept, (2, 13)).ok


def test_an_invalid_value_is_fixed_by_dropping_its_invalid_entries():
    value = "expandable_segments:True,max_split_size_mb:10,bogus_key:1"
    (f,) = run("GD-ALLOC-001", make_facts(RECORDED_CPU, env={"PYTORCH_CUDA_ALLOC_CONF": value}))
    assert f.severity is Severity.FAIL and f.fix is not None and f.fix.safety.value == "safe"
    (action,) = f.fix.actions
    assert (action.kind, action.target, action.value) == (
        "set_env",
        "PYTORCH_CUDA_ALLOC_CONF",
        "expandable_segments:True",
    )
    assert "max_split_size_mb:10" in f.fix.title and "bogus_key:1" in f.fix.title


def test_a_value_with_no_valid_entry_is_unset():
    (f,) = run("GD-ALLOC-001", make_facts(RECORDED_CPU, env={"PYTORCH_CUDA_ALLOC_CONF": "bogus:1,other:2"}))
    (action,) = f.fix.actions
    assert (action.kind, action.target) == ("unset_env", "PYTORCH_CUDA_ALLOC_CONF")


def test_fix_shell_and_the_scripts_export_keep_the_valid_entries(tmp_path):
    from tests.cliutil import run_gpudoctor_here

    value = "expandable_segments:True,max_split_size_mb:10,bogus_key:1"
    r = run_gpudoctor_here(
        "fix", "--select", "allocator", "--expect-gpus", "0", "--shell", env={"PYTORCH_CUDA_ALLOC_CONF": value}
    )
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in r.stdout, r.stdout + r.stderr
    script = tmp_path / "job.slurm"
    script.write_text(
        f"#!/bin/bash\n#SBATCH --gres=gpu:1\nexport PYTORCH_CUDA_ALLOC_CONF={value}\nsrun python train.py\n"
    )
    r = run_gpudoctor_here("fix", "--sbatch", str(script), "--select", "allocator", "--apply")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n" in script.read_text()
    r = run_gpudoctor_here("check", "--sbatch", str(script), "--select", "allocator")
    assert r.returncode == 0, r.stdout
