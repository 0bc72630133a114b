import pytest

from gpudoctor.model import Severity
from gpudoctor.readers.cudavis import parse_visible_devices, strtoul_prefix
from tests.factsutil import RECORDED_CPU, make_facts, run, said, severity

MIXED = "synthetic-mixed-a100-h100-pcie"
MIG = "synthetic-a100x2-mig"
UUID3 = "GPU-5b1c2f3e-0000-4000-8000-000000000003"


def gpus(n=4, prefix="GPU-5b1c2f3e-0000-4000-8000-00000000000"):
    return [{"index": i, "uuid": f"{prefix}{i}", "mig": None} for i in range(n)]


# --- cudavis: CUDA_VISIBLE_DEVICES as the driver reads it -------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, (0, 1, 2, 3)),
        ("", ()),
        ("2,1", (2, 1)),  # CUDA enumerates in the order given
        ("0,2,-1,1", (0, 2)),  # the CUDA guide's own example: -1 ends the list
        ("-1", ()),
        (" 0, 1", (0, 1)),  # strtoul skips leading blanks
        ("1gpu,2", (1, 2)),  # strtoul stops at the first non-digit
        ("0,,1", (0,)),  # an empty entry is invalid and ends the list
        ("0,7,1", (0,)),  # no GPU 7: everything after it is dropped
        ("0,0", ()),  # a repeated GPU invalidates the list
        ("NoDevFiles", ()),
        ("all", ()),
        ("GPU-5b1c2f3e-0000-4000-8000-000000000003,GPU-5b1c2f3e-0000-4000-8000-000000000001", (3, 1)),
        ("GPU-5b1c2f3e-0000-4000-8000-000000000002", (2,)),
        ("GPU-5b1c2f3e", ()),  # a prefix shared by every GPU is ambiguous: invalid
        (
            "GPU-5b1c2f3e-0000-4000-8000-000000000002, GPU-5b1c2f3e-0000-4000-8000-000000000001",
            (2,),
        ),  # blank before a UUID
        ("GPU-ffffffff", ()),
    ],
)
def test_visible_gpus_follow_cuda_rules(value, expected):
    assert parse_visible_devices(value, gpus()).gpus == expected


def test_unique_uuid_prefix_resolves():
    distinct = [
        {"index": 0, "uuid": "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"},
        {"index": 1, "uuid": "GPU-1111aaaa-0000-0000-0000-000000000000"},
    ]
    vis = parse_visible_devices("GPU-8932f937", distinct)
    assert vis.gpus == (0,) and vis.problems == ()


def test_dropped_entries_are_named():
    vis = parse_visible_devices("0,2,-1,1", gpus())
    assert [e.text for e in vis.ignored] == ["1"]
    assert "silently ignores '1'" in vis.problems[0]


@pytest.mark.parametrize(
    "value, kept, meant", [("0-3", (0,), "0,1,2,3"), ("0 1", (0,), "0,1"), ("0;2,1", (0, 1), "0,2")]
)
def test_range_or_other_separator_loses_gpus_and_names_the_list_meant(value, kept, meant):
    vis = parse_visible_devices(value, gpus())
    assert vis.gpus == kept
    assert len(vis.problems) == 1 and f"list them: {meant}" in vis.problems[0]


def test_trailing_comma_is_only_a_note():
    vis = parse_visible_devices("0,1,", gpus())
    assert vis.gpus == (0, 1) and vis.problems == () and vis.notes


def test_without_nvml_indices_are_unresolved_but_form_is_checked():
    vis = parse_visible_devices("0,5", None)
    assert vis.gpus is None and vis.count == 2 and not vis.problems
    assert parse_visible_devices("0,,1", None).count == 1


def test_mig_uuid_resolves_to_parent_and_counts_once():
    nv = gpus(2)
    nv[0]["mig"] = {"current": True, "devices": [{"uuid": "MIG-aaaa"}, {"uuid": "MIG-bbbb"}]}
    vis = parse_visible_devices("MIG-aaaa,MIG-bbbb", nv)
    assert vis.gpus == (0, 0) and vis.mig == ("MIG-aaaa", "MIG-bbbb") and vis.count == 1
    assert any("enumerates only one" in n for n in vis.notes)


def test_indices_count_only_gpus_this_process_can_open():
    # SLURM with ConstrainDevices: NVML lists all 8, CUDA opens only 4 and 5, SLURM writes 0,1
    nv = gpus(8)
    for g in nv:
        if g["index"] not in (4, 5):
            g.update(error="Insufficient Permissions", inaccessible=True)
            del g["uuid"]
    assert parse_visible_devices("0,1", nv).gpus == (4, 5)
    assert parse_visible_devices(None, nv).gpus == (4, 5)
    assert parse_visible_devices("4", nv).problems  # a global index does not exist for CUDA here


def test_strtoul_prefix():
    assert strtoul_prefix(" 12x") == 12 and strtoul_prefix("+3") == 3
    assert strtoul_prefix("-1") is None and strtoul_prefix("abc") is None


# --- GD-DEV-001 visible-devices-invalid ---------------------------------------------------------


def test_unset_visible_devices_passes():
    assert severity("GD-DEV-001", make_facts()) is Severity.PASS


def test_valid_subset_passes():
    (f,) = run("GD-DEV-001", make_facts(env={"CUDA_VISIBLE_DEVICES": "4,3"}))
    assert f.severity is Severity.PASS and "[4, 3]" in said(f)


def test_slurm_local_indices_under_device_cgroup_pass():
    hidden = {
        f"nvidia.gpus.{i}": {"index": i, "error": "Insufficient Permissions", "inaccessible": True}
        for i in (0, 1, 2, 3, 6, 7)
    }
    f = make_facts(env={"CUDA_VISIBLE_DEVICES": "0,1"}, patch=hidden)
    (finding,) = run("GD-DEV-001", f)
    assert finding.severity is Severity.PASS and "[4, 5]" in said(finding)
    assert severity("GD-DEV-002", f, expect_gpus=2) is Severity.PASS


def test_mixed_index_and_uuid_forms_are_info():
    (f,) = run("GD-DEV-001", make_facts(env={"CUDA_VISIBLE_DEVICES": f"4,{UUID3}"}))
    assert f.severity is Severity.INFO and "[4, 3]" in said(f) and "mixed" in said(f)


def test_empty_visible_devices_fails_when_gpus_expected():
    (f,) = run("GD-DEV-001", make_facts(env={"CUDA_VISIBLE_DEVICES": ""}))
    assert f.severity is Severity.FAIL and "empty" in said(f)


def test_empty_visible_devices_is_fine_for_cpu_job():
    assert severity("GD-DEV-001", make_facts(env={"CUDA_VISIBLE_DEVICES": ""}), expect_gpus=0) is Severity.PASS


def test_index_beyond_last_gpu_fails_and_names_dropped_entries():
    (f,) = run("GD-DEV-001", make_facts(env={"CUDA_VISIBLE_DEVICES": "0,1,8,2"}))
    assert f.severity is Severity.FAIL
    assert "no GPU 8" in said(f) and "'2'" in said(f)
    assert "CUDA_VISIBLE_DEVICES=0,1" in f.fix.title


def test_slurm_nodevfiles_is_explained():
    (f,) = run("GD-DEV-001", make_facts(env={"CUDA_VISIBLE_DEVICES": "NoDevFiles"}))
    assert f.severity is Severity.FAIL and "gres.conf" in said(f)


def test_unknown_uuid_fails():
    assert severity("GD-DEV-001", make_facts(env={"CUDA_VISIBLE_DEVICES": "GPU-deadbeef"})) is Severity.FAIL


def test_malformed_value_without_nvml_still_fails():
    assert severity("GD-DEV-001", make_facts(RECORDED_CPU, env={"CUDA_VISIBLE_DEVICES": "0,,1"})) is Severity.FAIL
    assert (
        severity("GD-DEV-001", make_facts(RECORDED_CPU, env={"CUDA_VISIBLE_DEVICES": "0,,1"}), expect_gpus=0)
        is Severity.WARN
    )


# --- GD-DEV-002 gpu-count-mismatch --------------------------------------------------------------


def test_expected_count_matches():
    assert severity("GD-DEV-002", make_facts(), expect_gpus=8) is Severity.PASS


def test_fewer_gpus_than_expected_fails():
    (f,) = run("GD-DEV-002", make_facts(env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"}), expect_gpus=8)
    assert f.severity is Severity.FAIL and "expects 8" in said(f) and "see 4" in said(f)


def test_no_visible_gpu_fails_by_default_and_passes_for_cpu_job():
    f = make_facts(env={"CUDA_VISIBLE_DEVICES": "-1"})
    assert severity("GD-DEV-002", f) is Severity.FAIL
    assert severity("GD-DEV-002", f, expect_gpus=0) is Severity.PASS


def test_cpu_machine_skips_count_unless_cpu_job():
    assert severity("GD-DEV-002", make_facts(RECORDED_CPU)) is Severity.SKIP
    assert severity("GD-DEV-002", make_facts(RECORDED_CPU), expect_gpus=0) is Severity.PASS


def test_mig_gives_one_cuda_device():
    assert severity("GD-DEV-002", make_facts(MIG), expect_gpus=2) is Severity.FAIL


# --- GD-DEV-003 device-order-ambiguous ----------------------------------------------------------


def test_index_selection_on_mixed_models_warns_with_safe_fix():
    (f,) = run("GD-DEV-003", make_facts(MIXED, env={"CUDA_VISIBLE_DEVICES": "0,2"}))
    assert f.severity is Severity.WARN
    assert f.fix.safety.value == "safe" and f.fix.actions[0].target == "CUDA_DEVICE_ORDER"


def test_pci_bus_order_passes_on_mixed_models():
    assert (
        severity(
            "GD-DEV-003", make_facts(MIXED, env={"CUDA_VISIBLE_DEVICES": "0,2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
        )
        is Severity.PASS
    )


def test_uuid_selection_on_mixed_models_is_only_info():
    assert (
        severity(
            "GD-DEV-003", make_facts(MIXED, env={"CUDA_VISIBLE_DEVICES": "GPU-7c0a9d1e-1111-4222-8333-000000000000"})
        )
        is Severity.INFO
    )


def test_same_models_need_no_device_order():
    assert severity("GD-DEV-003", make_facts(env={"CUDA_VISIBLE_DEVICES": "0,1"})) is Severity.PASS


# --- GD-DEV-004 mig-multiple-devices ------------------------------------------------------------


def test_several_gpus_expected_on_mig_fails():
    (f,) = run("GD-DEV-004", make_facts(MIG), expect_gpus=2)
    assert f.severity is Severity.FAIL and "only one" in said(f)


def test_one_mig_device_per_process_passes():
    f = make_facts(MIG, env={"CUDA_VISIBLE_DEVICES": "MIG-9a1b2c3d-4e5f-5a6b-8c7d-000000000001"})
    assert severity("GD-DEV-004", f, expect_gpus=1) is Severity.PASS


def test_several_mig_devices_visible_is_info():
    assert severity("GD-DEV-004", make_facts(MIG)) is Severity.INFO


def test_job_on_the_whole_gpu_ignores_mig_neighbour():
    assert severity("GD-DEV-004", make_facts(MIG, env={"CUDA_VISIBLE_DEVICES": "1"}), expect_gpus=1) is Severity.PASS


def test_no_mig_passes():
    assert severity("GD-DEV-004", make_facts(), expect_gpus=8) is Severity.PASS


# --- GD-DEV-005 compute-mode-restricted ---------------------------------------------------------


def test_prohibited_fails():
    (f,) = run("GD-DEV-005", make_facts(patch={"nvidia.gpus.2.compute_mode": "Prohibited"}))
    assert f.severity is Severity.FAIL and "[2]" in said(f)


def test_prohibited_gpu_outside_the_job_is_ignored():
    f = make_facts(env={"CUDA_VISIBLE_DEVICES": "0,1"}, patch={"nvidia.gpus.2.compute_mode": "Prohibited"})
    assert severity("GD-DEV-005", f) is Severity.PASS


def test_exclusive_process_is_info_warns_for_multi_process_launch_and_fails_when_taken():
    f = make_facts(each_gpu={"compute_mode": "Exclusive_Process"})
    assert severity("GD-DEV-005", f) is Severity.INFO
    assert severity("GD-DEV-005", f, launcher="torchrun") is Severity.WARN
    taken = make_facts(
        each_gpu={"compute_mode": "Exclusive_Process"},
        patch={"nvidia.gpus.0.processes": [{"pid": 4242, "type": "compute", "used_memory_bytes": 1 << 30}]},
    )
    assert severity("GD-DEV-005", taken) is Severity.FAIL


def test_default_compute_mode_passes():
    assert severity("GD-DEV-005", make_facts()) is Severity.PASS


# --- GD-DEV-006 persistence-mode-off ------------------------------------------------------------


def test_persistence_off_warns_on_a_multi_gpu_server_with_manual_fix():
    # issue 13: on a multi-GPU server this is a warning (it was info for every machine)
    (f,) = run("GD-DEV-006", make_facts(each_gpu={"persistence_mode": False}))
    assert f.severity is Severity.WARN
    assert f.fix.safety.value == "manual" and any("-pm 1" in a.target for a in f.fix.actions)


def test_persistence_on_passes():
    assert severity("GD-DEV-006", make_facts()) is Severity.PASS


# --- GD-DEV-007 gpus-already-busy ---------------------------------------------------------------


def test_idle_gpus_with_driver_reservation_pass():
    assert severity("GD-DEV-007", make_facts()) is Severity.PASS  # 0.5 GiB used by the driver itself


def test_memory_in_use_without_visible_pids_warns():
    f = make_facts(patch={"nvidia.gpus.1.memory_used_bytes": 12 << 30})
    (finding,) = run("GD-DEV-007", f)
    assert finding.severity is Severity.WARN and "GPU 1" in said(finding)


def test_half_full_gpu_fails():
    (f,) = run(
        "GD-DEV-007",
        make_facts(
            patch={
                "nvidia.gpus.0.memory_used_bytes": 60 << 30,
                "nvidia.gpus.0.processes": [{"pid": 777, "type": "compute", "used_memory_bytes": 60 << 30}],
            }
        ),
    )
    assert f.severity is Severity.FAIL and "777" in said(f)


def test_busy_gpu_outside_the_job_is_ignored():
    f = make_facts(env={"CUDA_VISIBLE_DEVICES": "0"}, patch={"nvidia.gpus.5.memory_used_bytes": 70 << 30})
    assert severity("GD-DEV-007", f) is Severity.PASS


# --- GD-DEV-008 mixed-gpu-models ----------------------------------------------------------------


def test_mixed_models_warn():
    (f,) = run("GD-DEV-008", make_facts(MIXED))
    assert f.severity is Severity.WARN and "A100" in said(f) and "H100" in said(f)


def test_one_model_selected_from_mixed_machine_passes():
    f = make_facts(MIXED, env={"CUDA_VISIBLE_DEVICES": "1,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert severity("GD-DEV-008", f) is Severity.PASS


def test_same_models_pass():
    assert severity("GD-DEV-008", make_facts()) is Severity.PASS
