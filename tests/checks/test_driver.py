from gpudoctor.model import Severity
from tests.factsutil import RECORDED_CPU, make_facts, run, said, severity


def test_recorded_cpu_machine_fails_when_gpus_expected():
    f = make_facts(RECORDED_CPU)
    (finding,) = run("GD-DRV-001", f)
    assert finding.severity is Severity.FAIL
    assert "libnvidia-ml" in said(finding)
    assert finding.fix is not None


def test_recorded_cpu_machine_skips_with_expect_gpus_0():
    assert severity("GD-DRV-001", make_facts(RECORDED_CPU), expect_gpus=0) is Severity.SKIP


def test_healthy_gpu_node_passes():
    assert severity("GD-DRV-001", make_facts()) is Severity.PASS
    assert severity("GD-DRV-002", make_facts()) is Severity.PASS


def test_driver_library_mismatch_is_explained():
    f = make_facts(
        patch={"nvidia.available": False, "nvidia.error": "NVML: Driver/library version mismatch", "nvidia.gpus": []}
    )
    (finding,) = run("GD-DRV-001", f)
    assert finding.severity is Severity.FAIL
    assert "upgrade without a reboot" in said(finding)


def test_gpu_fallen_off_the_bus_fails():
    f = make_facts(patch={"nvidia.gpus.3": {"index": 3, "error": "GPU is lost"}})
    assert severity("GD-DRV-001", f) is Severity.FAIL


def test_driver_older_major_than_torch_cuda_fails_with_found_version():
    # issue 13: the facts of a too-old driver include torch failing to initialise CUDA (when torch did
    # initialise it, a newer libcuda is in use and GD-DRV-002 only says so, agreeing with GD-CUDA-003)
    f = make_facts(
        patch={
            "nvidia.cuda_driver_version": 11040,
            "nvidia.driver_version": "470.223.02",
            "torch.cuda_available": False,
            "torch.device_count": 0,
            "torch.cuda_error": "The NVIDIA driver on your system is too old (found version 11040)",
        }
    )
    (finding,) = run("GD-DRV-002", f)
    assert finding.severity is Severity.FAIL
    assert "found version 11040" in said(finding)
    works = make_facts(patch={"nvidia.cuda_driver_version": 11040, "nvidia.driver_version": "470.223.02"})
    assert severity("GD-DRV-002", works) is Severity.INFO


def test_driver_older_minor_warns_about_minor_version_compat():
    f = make_facts(
        patch={"nvidia.cuda_driver_version": 12000, "nvidia.driver_version": "525.147.05", "torch.cuda": "12.4"}
    )
    assert severity("GD-DRV-002", f) is Severity.WARN


def test_forward_compat_libcuda_counts():
    compat = {
        "path": "/usr/local/cuda-12.4/compat/libcuda.so.550.54.15",
        "version": "550.54.15",
        "source": "LD_LIBRARY_PATH",
        "symlink": False,
    }
    f = make_facts(
        patch={
            "nvidia.cuda_driver_version": 11040,
            "nvidia.driver_version": "470.223.02",
            "libraries.cuda_compat": [compat],
        }
    )
    (finding,) = run("GD-DRV-002", f)
    assert finding.severity is Severity.PASS
    assert "forward" in said(finding)


def test_cpu_only_torch_skips_driver_version_check():
    assert severity("GD-DRV-002", make_facts(patch={"torch.cuda": None})) is Severity.SKIP


def test_gpus_of_other_jobs_under_a_device_cgroup_are_not_broken():
    f = make_facts(
        patch={
            f"nvidia.gpus.{i}": {"index": i, "error": "Insufficient Permissions", "inaccessible": True}
            for i in range(4, 8)
        }
    )
    (finding,) = run("GD-DRV-001", f)
    assert finding.severity is Severity.PASS
    assert finding.evidence["gpu_count"] == 4
