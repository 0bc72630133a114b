"""cuda checks over facts fixtures: the healthy H100 node, this (recorded) CPU machine, and variants."""

import pytest

from gpudoctor.model import Safety, Severity
from tests.factsutil import RECORDED_CPU, make_facts, run, said, severity

WHEEL = "/opt/conda/lib/python3.11/site-packages/nvidia"
CUDA_IDS = [f"GD-CUDA-00{i}" for i in range(1, 8)]


def one(check_id, facts, **ctx):
    (finding,) = run(check_id, facts, **ctx)
    return finding


def lib(path, version, source, **extra):
    return {"path": path, "version": version, "source": source, "symlink": False, **extra}


# ---------------------------------------------------------------- whole machines


def test_healthy_node_has_no_problem_in_cuda():
    for check_id in CUDA_IDS:
        assert severity(check_id, make_facts()) in (Severity.PASS, Severity.INFO), check_id


def test_this_cpu_machine_gives_no_false_fail_with_expect_gpus_0():
    for check_id in CUDA_IDS:
        assert severity(check_id, make_facts(RECORDED_CPU), expect_gpus=0) in (Severity.PASS, Severity.SKIP), check_id


# ---------------------------------------------------------------- GD-CUDA-001 torch importable


def test_import_error_fails_with_the_message_and_a_hint():
    f = make_facts(
        patch={
            "torch": {
                "status": "import_error",
                "python": "/env/bin/python",
                "error": "ImportError: libcudnn.so.9: cannot open shared object file: No such file or directory",
            }
        }
    )
    finding = one("GD-CUDA-001", f)
    assert finding.severity is Severity.FAIL
    assert "libcudnn.so.9: cannot open shared object file" in said(finding)
    assert "missing" in said(finding)
    assert finding.fix.safety is Safety.MANUAL


def test_undefined_symbol_points_at_ld_library_path():
    f = make_facts(
        patch={
            "torch": {
                "status": "import_error",
                "python": "p",
                "error": "OSError: libcusparse.so.12: undefined symbol: __nvJitLinkComplete_12_4",
            }
        },
        env={"LD_LIBRARY_PATH": "/usr/local/cuda-12.1/lib64"},
    )
    finding = one("GD-CUDA-001", f)
    assert "LD_LIBRARY_PATH" in said(finding)
    assert finding.evidence["ld_library_path"] == "/usr/local/cuda-12.1/lib64"


def test_timeout_in_import_and_in_cuda_init_are_told_apart():
    base = {"status": "timeout", "python": "p", "timeout_seconds": 2}
    imp = one(
        "GD-CUDA-001",
        make_facts(patch={"torch": {**base, "stage": "import", "error": "importing torch did not finish within 2 s"}}),
    )
    assert imp.severity is Severity.FAIL and "--torch-timeout" in said(imp)
    init = one(
        "GD-CUDA-001",
        make_facts(
            patch={"torch": {**base, "stage": "cuda_init", "error": "initialising CUDA did not finish within 2 s"}}
        ),
    )
    assert init.severity is Severity.FAIL and "driver" in said(init)


def test_crash_names_the_signal():
    f = make_facts(
        patch={
            "torch": {
                "status": "crashed",
                "python": "p",
                "signal": "SIGILL",
                "error": "the torch probe died with SIGILL while importing torch",
            }
        }
    )
    finding = one("GD-CUDA-001", f)
    assert finding.severity is Severity.FAIL
    assert "SIGILL" in said(finding) and "instruction" in said(finding)


def test_missing_torch_fails_when_gpus_expected_and_warns_with_expect_gpus_0():
    f = make_facts(
        RECORDED_CPU,
        patch={
            "torch": {
                "status": "missing",
                "python": "/venv/bin/python",
                "error": "ModuleNotFoundError: No module named 'torch'",
            }
        },
    )
    assert severity("GD-CUDA-001", f) is Severity.FAIL
    finding = one("GD-CUDA-001", f, expect_gpus=0)
    assert finding.severity is Severity.WARN
    assert "--python" in said(finding)


def test_torch_that_imports_passes():
    finding = one("GD-CUDA-001", make_facts(RECORDED_CPU))
    assert finding.severity is Severity.PASS
    assert "2.13.0+cpu" in said(finding)


def test_other_cuda_checks_skip_when_torch_is_broken():
    f = make_facts(patch={"torch": {"status": "crashed", "python": "p", "error": "x"}})
    for check_id in CUDA_IDS[1:]:
        assert severity(check_id, f) is Severity.SKIP, check_id


# ---------------------------------------------------------------- GD-CUDA-002 CPU-only build


def test_cpu_build_on_gpu_node_fails_with_the_index_url_for_the_driver():
    f = make_facts(patch={"torch.cuda": None, "torch.version": "2.3.1+cpu", "torch.cuda_available": False})
    finding = one("GD-CUDA-002", f)
    assert finding.severity is Severity.FAIL
    assert "8 NVIDIA GPU(s)" in said(finding)
    commands = [a.target for a in finding.fix.actions]
    # driver 550 supports CUDA 12.4: the newest wheel index it can run
    assert commands == ["pip install --force-reinstall torch==2.3.1 --index-url https://download.pytorch.org/whl/cu124"]


def test_cpu_build_on_gpu_node_is_only_info_with_expect_gpus_0():
    f = make_facts(patch={"torch.cuda": None})
    assert severity("GD-CUDA-002", f, expect_gpus=0) is Severity.INFO


def test_cpu_build_without_any_gpu_warns_when_gpus_expected():
    assert severity("GD-CUDA-002", make_facts(RECORDED_CPU)) is Severity.WARN


def test_rocm_build_on_nvidia_node_fails():
    f = make_facts(patch={"torch.cuda": None, "torch.hip": "6.0.32830"})
    finding = one("GD-CUDA-002", f)
    assert finding.severity is Severity.FAIL and "ROCm" in said(finding)


def test_cuda_build_passes():
    assert severity("GD-CUDA-002", make_facts()) is Severity.PASS


# ---------------------------------------------------------------- GD-CUDA-003 CUDA initialisation


def test_cuda_init_failure_with_error_802_names_the_fabric_manager():
    err = (
        "CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before "
        "calling NumCudaDevices() that might have already set an error? Error 802: system not yet initialized"
    )
    f = make_facts(
        patch={"torch.cuda_available": False, "torch.device_count": 0, "torch.devices": [], "torch.cuda_error": err}
    )
    finding = one("GD-CUDA-003", f)
    assert finding.severity is Severity.FAIL
    assert "fabricmanager" in said(finding)
    assert finding.evidence["cuda_error"] == err
    assert "systemctl start nvidia-fabricmanager" in [a.target for a in finding.fix.actions]


def test_cuda_visible_devices_hiding_all_gpus_is_named():
    f = make_facts(
        env={"CUDA_VISIBLE_DEVICES": ""},
        patch={
            "torch.cuda_available": False,
            "torch.device_count": 0,
            "torch.cuda_error": "CUDA initialization: no CUDA-capable device is detected",
        },
    )
    finding = one("GD-CUDA-003", f)
    assert finding.severity is Severity.FAIL
    assert "CUDA_VISIBLE_DEVICES=''" in said(finding)


def test_cuda_visible_devices_naming_a_missing_gpu_is_left_to_the_devices_check():
    # As seen on a real one-GPU H100 with CUDA_VISIBLE_DEVICES=1: torch says no GPU and gives no reason.
    f = make_facts(
        "recorded-h100x1-driver580-torch2.11-cu130",
        env={"CUDA_VISIBLE_DEVICES": "1"},
        patch={"torch.cuda_available": False, "torch.device_count": 0, "torch.devices": []},
    )
    alone = one("GD-CUDA-003", f)
    assert alone.severity is Severity.FAIL
    assert "CUDA_VISIBLE_DEVICES='1' leaves this process no GPU" in said(alone)
    in_a_run = one("GD-CUDA-003", f, running=frozenset({"GD-CUDA-003", "GD-DEV-001"}))
    assert in_a_run.severity is Severity.SKIP and "GD-DEV-001" in said(in_a_run)
    assert severity("GD-DEV-001", f) is Severity.FAIL


def test_cuda_unavailable_without_a_message_still_fails():
    finding = one("GD-CUDA-003", make_facts(patch={"torch.cuda_available": False, "torch.device_count": 0}))
    assert finding.severity is Severity.FAIL
    assert "without an error message" in said(finding)


def test_cuda_unavailable_is_only_info_when_no_gpus_are_expected():
    f = make_facts(patch={"torch.cuda_available": False, "torch.device_count": 0})
    assert severity("GD-CUDA-003", f, expect_gpus=0) is Severity.INFO


def test_cuda_init_passes_on_healthy_node_and_skips_without_gpus():
    assert severity("GD-CUDA-003", make_facts()) is Severity.PASS
    f = make_facts(patch={"nvidia.available": False, "nvidia.gpus": [], "torch.cuda_available": False})
    assert severity("GD-CUDA-003", f) is Severity.SKIP
    # no NVML library in the container, but CUDA itself works
    f = make_facts(patch={"nvidia.available": False, "nvidia.gpus": []})
    assert severity("GD-CUDA-003", f) is Severity.PASS


# ---------------------------------------------------------------- GD-CUDA-004 arch list


def test_blackwell_on_a_cu121_torch_fails_with_no_kernel_image():
    f = make_facts(each_gpu={"compute_capability": [10, 0], "name": "NVIDIA B200"})
    finding = one("GD-CUDA-004", f)
    assert finding.severity is Severity.FAIL
    assert "no kernel image is available for execution on the device" in said(finding)
    assert "GPU 0,1,2,3,4,5,6,7 (NVIDIA B200, compute capability 10.0)" in said(finding)
    assert "12.8" in finding.fix.title


def test_newer_minor_runs_older_minor_machine_code():
    # Ada (8.9) has no sm_89 in the wheel, but sm_86 machine code runs on it
    f = make_facts(each_gpu={"compute_capability": [8, 9], "name": "NVIDIA L40S"})
    assert severity("GD-CUDA-004", f) is Severity.PASS


def test_older_minor_cannot_run_newer_minor_machine_code():
    f = make_facts(each_gpu={"compute_capability": [8, 6]}, patch={"torch.arch_list": ["sm_80", "sm_89", "sm_90"]})
    # sm_80 covers 8.6; drop it and nothing does
    assert severity("GD-CUDA-004", f) is Severity.PASS
    f = make_facts(each_gpu={"compute_capability": [8, 6]}, patch={"torch.arch_list": ["sm_89", "sm_90"]})
    assert severity("GD-CUDA-004", f) is Severity.FAIL


def test_too_old_gpu_for_the_build_fails():
    f = make_facts(
        each_gpu={"compute_capability": [6, 0], "name": "Tesla P100"},
        patch={"torch.arch_list": ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]},
    )
    assert severity("GD-CUDA-004", f) is Severity.FAIL


def test_ptx_only_coverage_warns_about_jit_time():
    f = make_facts(
        each_gpu={"compute_capability": [12, 0]}, patch={"torch.arch_list": ["sm_80", "sm_90", "compute_90"]}
    )
    finding = one("GD-CUDA-004", f)
    assert finding.severity is Severity.WARN
    assert "JIT" in said(finding)


def test_arch_specific_machine_code_runs_only_on_that_gpu():
    f = make_facts(patch={"torch.arch_list": ["sm_80", "sm_90a"]})
    assert severity("GD-CUDA-004", f) is Severity.PASS  # H100 is exactly 9.0
    f = make_facts(each_gpu={"compute_capability": [10, 0]}, patch={"torch.arch_list": ["sm_80", "sm_90a"]})
    assert severity("GD-CUDA-004", f) is Severity.FAIL


def test_empty_arch_list_skips():
    assert severity("GD-CUDA-004", make_facts(patch={"torch.arch_list": []})) is Severity.SKIP


# ---------------------------------------------------------------- GD-CUDA-005 cuDNN


def test_cudnn_version_incompatibility_fails_and_drops_the_folder_from_ld_library_path():
    err = (
        "RuntimeError: cuDNN version incompatibility: PyTorch was compiled  against (9, 1, 0) but found runtime "
        "version (9, 0, 0). PyTorch already comes bundled with cuDNN."
    )
    f = make_facts(
        env={"LD_LIBRARY_PATH": "/usr/local/cuda/lib64:/opt/slurm/lib"},
        patch={
            "torch.cudnn": None,
            "torch.cudnn_error": err,
            "libraries.found.cudnn": [lib("/usr/local/cuda/lib64/libcudnn.so.9", "9", "LD_LIBRARY_PATH")],
        },
    )
    finding = one("GD-CUDA-005", f)
    assert finding.severity is Severity.FAIL
    assert "version incompatibility" in said(finding) and "/usr/local/cuda/lib64/libcudnn.so.9" in said(finding)
    assert finding.fix.safety is Safety.SAFE
    (action,) = finding.fix.actions
    assert (action.kind, action.target, action.value) == ("set_env", "LD_LIBRARY_PATH", "/opt/slurm/lib")


def test_cudnn_loaded_from_ld_library_path_instead_of_the_wheel_warns():
    f = make_facts(
        env={"LD_LIBRARY_PATH": "/usr/local/cuda-12.1/lib64"},
        patch={
            "torch.loaded_libraries.cudnn": ["/usr/local/cuda-12.1/lib64/libcudnn.so.8.9.7"],
            "libraries.found.cudnn": [
                lib("/usr/local/cuda-12.1/lib64/libcudnn.so.8", "8", "LD_LIBRARY_PATH"),
                lib(f"{WHEEL}/cudnn/lib/libcudnn.so.8", "8", "pip-wheel"),
            ],
        },
    )
    finding = one("GD-CUDA-005", f)
    assert finding.severity is Severity.WARN
    assert "instead of the copy its wheels installed" in said(finding)
    assert finding.fix.actions[0].kind == "unset_env"  # LD_LIBRARY_PATH held nothing else


def test_same_major_cudnn_on_ld_library_path_warns_even_when_torch_loaded_its_own():
    f = make_facts(
        env={"LD_LIBRARY_PATH": "/opt/cudnn-8.6/lib"},
        patch={
            "libraries.found.cudnn": [
                lib("/opt/cudnn-8.6/lib/libcudnn.so.8.6.0", "8.6.0", "LD_LIBRARY_PATH"),
                lib(f"{WHEEL}/cudnn/lib/libcudnn.so.8", "8", "pip-wheel"),
            ]
        },
    )
    finding = one("GD-CUDA-005", f)
    assert finding.severity is Severity.WARN
    assert "SUBLIBRARY_VERSION_MISMATCH" in said(finding)
    assert finding.evidence["other_copies"] == ["/opt/cudnn-8.6/lib/libcudnn.so.8.6.0"]


def test_other_major_cudnn_on_ld_library_path_is_only_info():
    f = make_facts(
        env={"LD_LIBRARY_PATH": "/opt/cudnn-9/lib"},
        patch={
            "libraries.found.cudnn": [
                lib("/opt/cudnn-9/lib/libcudnn.so.9", "9", "LD_LIBRARY_PATH"),
                lib(f"{WHEEL}/cudnn/lib/libcudnn.so.8", "8", "pip-wheel"),
            ]
        },
    )
    finding = one("GD-CUDA-005", f)
    assert finding.severity is Severity.INFO
    assert "cannot replace" in said(finding)


def test_ld_library_path_entry_that_is_a_symlink_to_the_loaded_folder_is_not_another_copy():
    f = make_facts(
        env={"LD_LIBRARY_PATH": "/usr/local/cuda/lib64"},
        patch={
            "torch.loaded_libraries.cudnn": ["/usr/local/cuda-12.4/lib64/libcudnn.so.9.1.0"],
            "libraries.found.cudnn": [
                lib(
                    "/usr/local/cuda/lib64/libcudnn.so.9",
                    "9",
                    "LD_LIBRARY_PATH",
                    realpath="/usr/local/cuda-12.4/lib64/libcudnn.so.9.1.0",
                )
            ],
            "torch.cudnn": 90100,
        },
    )
    assert severity("GD-CUDA-005", f) is Severity.PASS  # no wheel copy: a system/NGC build using its system cuDNN


def test_cudnn_sub_libraries_from_two_folders_warn():
    f = make_facts(
        patch={
            "torch.loaded_libraries.cudnn": [
                f"{WHEEL}/cudnn/lib/libcudnn.so.9",
                "/lib/x86_64-linux-gnu/libcudnn_engines_tensor_ir.so.9",
            ],
            "libraries.found.cudnn": [],
        }
    )
    finding = one("GD-CUDA-005", f)
    assert finding.severity is Severity.WARN
    assert "several folders" in said(finding)


def test_cudnn_passes_on_healthy_node_and_names_the_folder():
    finding = one("GD-CUDA-005", make_facts())
    assert finding.severity is Severity.PASS
    assert f"{WHEEL}/cudnn/lib" in said(finding)


def test_newer_cudnn_from_the_ld_so_cache_than_torch_was_built_with_warns_and_puts_the_wheel_first():
    # issue 18: the distribution's libcudnn9 package (ld.so cache) answers before the wheel's copy
    f = make_facts(
        env={"LD_LIBRARY_PATH": "/opt/mpi/lib"},
        patch={
            "torch.cudnn": 91400,
            "torch.cudnn_compile": [9, 1, 0],
            "torch.loaded_libraries.cudnn": ["/usr/lib/x86_64-linux-gnu/libcudnn.so.9.14.0"],
            "libraries.found.cudnn": [
                lib(
                    "/usr/lib/x86_64-linux-gnu/libcudnn.so.9",
                    "9",
                    "ldconfig",
                    realpath="/usr/lib/x86_64-linux-gnu/libcudnn.so.9.14.0",
                ),
                lib(f"{WHEEL}/cudnn/lib/libcudnn.so.9", "9", "pip-wheel"),
            ],
        },
    )
    finding = one("GD-CUDA-005", f)
    assert finding.severity is Severity.WARN, finding.message
    assert "the the" not in said(finding)
    assert "found through the ld.so cache" in said(finding) and "built with 9.1" in said(finding)
    assert finding.evidence["found_through"] == "the ld.so cache"
    (action,) = finding.fix.actions
    assert (action.target, action.value) == ("LD_LIBRARY_PATH", f"{WHEEL}/cudnn/lib:/opt/mpi/lib")


def test_cudnn_of_the_version_torch_was_built_with_on_ld_library_path_passes():
    f = make_facts(
        env={"LD_LIBRARY_PATH": "/opt/cudnn/lib"},
        patch={
            "torch.cudnn": 90100,
            "torch.cudnn_compile": [9, 1, 0],
            "torch.loaded_libraries.cudnn": ["/opt/cudnn/lib/libcudnn.so.9.1.0"],
            "libraries.found.cudnn": [lib("/opt/cudnn/lib/libcudnn.so.9.1.0", "9.1.0", "LD_LIBRARY_PATH")],
        },
    )
    assert severity("GD-CUDA-005", f) is Severity.PASS  # no wheel copy and torch's own version: a system build


def test_newer_cudnn_that_no_loader_path_explains_is_not_judged():
    # a conda env's lib folder reached through torch's RUNPATH: the env's own, pinned cuDNN
    f = make_facts(
        patch={
            "torch.cudnn": 90300,
            "torch.cudnn_compile": [9, 1, 0],
            "torch.loaded_libraries.cudnn": ["/opt/conda/envs/train/lib/libcudnn.so.9.3.0"],
            "libraries.found.cudnn": [],
            "torch.wheel_lib_dirs": [],
        },
    )
    assert severity("GD-CUDA-005", f) is Severity.PASS


# ---------------------------------------------------------------- GD-CUDA-006 CUDA runtime / cuBLAS


def test_cublas_loaded_from_a_toolkit_instead_of_the_wheel_warns():
    f = make_facts(
        env={"LD_LIBRARY_PATH": "/usr/local/cuda-12.1/lib64:/opt/mpi/lib"},
        patch={
            "torch.loaded_libraries.cublas": [
                "/usr/local/cuda-12.1/lib64/libcublas.so.12.1.3.1",
                "/usr/local/cuda-12.1/lib64/libcublasLt.so.12.1.3.1",
            ],
            "libraries.found.cublas": [
                lib("/usr/local/cuda-12.1/lib64/libcublas.so.12", "12", "LD_LIBRARY_PATH"),
                lib(f"{WHEEL}/cublas/lib/libcublas.so.12", "12", "pip-wheel"),
            ],
        },
    )
    finding = one("GD-CUDA-006", f)
    assert finding.severity is Severity.WARN
    assert "cuBLAS" in said(finding) and "/usr/local/cuda-12.1/lib64" in said(finding)
    assert finding.fix.actions[0].value == "/opt/mpi/lib"


def test_two_cuda_runtime_majors_in_one_process_warn():
    f = make_facts(
        patch={
            "torch.loaded_libraries.cudart": [
                f"{WHEEL}/cuda_runtime/lib/libcudart.so.12",
                "/usr/local/cuda-11.8/lib64/libcudart.so.11.0",
            ]
        }
    )
    finding = one("GD-CUDA-006", f)
    assert finding.severity is Severity.WARN
    assert "several major versions" in said(finding)


def test_other_major_runtime_on_ld_library_path_is_info_not_a_warning():
    f = make_facts(
        env={"LD_LIBRARY_PATH": "/usr/local/cuda-11.8/lib64"},
        patch={
            "libraries.found.cudart": [
                lib("/usr/local/cuda-11.8/lib64/libcudart.so.11.0", "11.0", "LD_LIBRARY_PATH"),
                lib(f"{WHEEL}/cuda_runtime/lib/libcudart.so.12", "12", "pip-wheel"),
            ]
        },
    )
    finding = one("GD-CUDA-006", f)
    assert finding.severity is Severity.INFO
    assert "cannot replace" in said(finding)


def test_wheel_folders_reported_by_the_target_interpreter_count_as_torchs_own():
    # --python names another environment: the wheels are only known from the torch child
    f = make_facts(
        env={"LD_LIBRARY_PATH": "/usr/local/cuda-12.1/lib64"},
        patch={
            "libraries.found.cublas": [lib("/usr/local/cuda-12.1/lib64/libcublas.so.12", "12", "LD_LIBRARY_PATH")],
            "torch.wheel_lib_dirs": [f"{WHEEL}/cublas/lib"],
            "torch.loaded_libraries.cublas": ["/usr/local/cuda-12.1/lib64/libcublas.so.12"],
        },
    )
    assert severity("GD-CUDA-006", f) is Severity.WARN


def test_wheels_of_gpudoctors_own_interpreter_do_not_count_for_another_target():
    # gpudoctor runs from an env with NVIDIA wheels; --python names a conda env whose torch uses $CONDA_PREFIX/lib
    f = make_facts(
        patch={
            "torch.wheel_lib_dirs": [],
            "torch.location": "/opt/conda/envs/train/lib/python3.11/site-packages/torch/__init__.py",
            "torch.loaded_libraries.cudnn": ["/opt/conda/envs/train/lib/libcudnn.so.8.9.2"],
            "torch.loaded_libraries.cublas": ["/opt/conda/envs/train/lib/libcublas.so.12.1.3.1"],
            "torch.loaded_libraries.cudart": ["/opt/conda/envs/train/lib/libcudart.so.12.1.105"],
        }
    )
    assert severity("GD-CUDA-005", f) is Severity.PASS
    assert severity("GD-CUDA-006", f) is Severity.PASS


def test_cuda_runtime_libraries_pass_on_healthy_node():
    assert severity("GD-CUDA-006", make_facts()) is Severity.PASS


# ---------------------------------------------------------------- GD-CUDA-007 nvcc


def toolkit(version, nvcc="/usr/local/cuda/bin/nvcc", found_via="PATH", home="/usr/local/cuda"):
    return {"libraries.toolkit": {"cuda_home": home, "found_via": found_via, "nvcc": nvcc, "version": version}}


def test_nvcc_of_another_major_warns_with_cpp_extension_error():
    finding = one("GD-CUDA-007", make_facts(patch=toolkit("11.8")))
    assert finding.severity is Severity.WARN
    assert "mismatches the version" in said(finding)
    assert "CUDA_HOME" in finding.fix.title


def test_nvcc_minor_difference_is_info_and_same_version_passes():
    assert severity("GD-CUDA-007", make_facts(patch=toolkit("12.4"))) is Severity.INFO
    assert severity("GD-CUDA-007", make_facts(patch=toolkit("12.1"))) is Severity.PASS


def test_cuda_home_without_nvcc_warns():
    f = make_facts(patch=toolkit(None, nvcc=None, found_via="CUDA_HOME", home="/opt/cuda-missing"))
    finding = one("GD-CUDA-007", f)
    assert finding.severity is Severity.WARN and "/opt/cuda-missing" in said(finding)


def test_no_nvcc_is_info():
    assert severity("GD-CUDA-007", make_facts()) is Severity.INFO


def test_nvcc_is_irrelevant_to_a_cpu_torch():
    # this machine: nvcc 13.0 from /usr/local/cuda-13.0, torch 2.13.0+cpu
    assert severity("GD-CUDA-007", make_facts(RECORDED_CPU)) is Severity.SKIP


@pytest.mark.parametrize("check_id", CUDA_IDS)
def test_every_cuda_check_is_documented(check_id):
    from gpudoctor.registry import load_all

    spec = load_all()[check_id]
    assert spec.category == "cuda"
    assert all(spec.docs.values())


def test_older_cublas_through_an_ld_library_path_symlink_fails_and_names_the_entry():
    # issue 18 (pytorch#91067, pytorch#103832): a toolkit's older cuBLAS answers before the wheel's
    f = make_facts(
        env={"LD_LIBRARY_PATH": "/usr/local/cuda/lib64:/opt/mpi/lib"},
        patch={
            "torch.cuda": "12.4",
            "torch.loaded_libraries.cublas": [
                "/usr/local/cuda-12.1/targets/x86_64-linux/lib/libcublas.so.12.1.3.1",
                "/usr/local/cuda-12.1/targets/x86_64-linux/lib/libcublasLt.so.12.1.3.1",
            ],
            "libraries.found.cublas": [
                lib(
                    "/usr/local/cuda/lib64/libcublas.so.12",
                    "12",
                    "LD_LIBRARY_PATH",
                    realpath="/usr/local/cuda-12.1/targets/x86_64-linux/lib/libcublas.so.12.1.3.1",
                ),
                lib(f"{WHEEL}/cublas/lib/libcublas.so.12", "12", "pip-wheel"),
            ],
        },
    )
    finding = one("GD-CUDA-006", f)
    assert finding.severity is Severity.FAIL, finding.message
    assert "cuBLAS 12.1.3.1" in said(finding) and "built with 12.4" in said(finding)
    assert "LD_LIBRARY_PATH entry /usr/local/cuda/lib64" in said(finding)
    (action,) = finding.fix.actions
    assert (action.target, action.value) == ("LD_LIBRARY_PATH", "/opt/mpi/lib")


def test_cublas_of_torchs_cuda_minor_from_the_toolkit_is_not_a_version_problem():
    f = make_facts(
        env={"LD_LIBRARY_PATH": "/usr/local/cuda-12.4/lib64"},
        patch={
            "torch.cuda": "12.4",
            "torch.loaded_libraries.cublas": ["/usr/local/cuda-12.4/lib64/libcublas.so.12.4.5.8"],
            "libraries.found.cublas": [lib("/usr/local/cuda-12.4/lib64/libcublas.so.12", "12", "LD_LIBRARY_PATH")],
            "libraries.found.cudart": [],
            "libraries.found.nvjitlink": [],
            "torch.wheel_lib_dirs": [],
        },
    )
    assert severity("GD-CUDA-006", f) is Severity.PASS


def test_file_versions_and_build_versions():
    from gpudoctor.checks.cuda._loading import file_version

    assert file_version("/x/libcudnn.so.9.1.0") == (9, 1, 0)
    assert file_version("/x/libcublasLt.so.12.4.5.8") == (12, 4, 5, 8)
    assert file_version("/x/libcudnn.so.9") is None  # the wheels' bare soname says only the major


# --- GD-CUDA-009 kineto-daemon-initialises-cuda-at-import -----------------------------------------


@pytest.mark.parametrize("value", ["1", "0", ""])
def test_kineto_use_daemon_set_to_any_value_warns(value):
    (f,) = run("GD-CUDA-009", make_facts(env={"PATH": "/usr/bin", "KINETO_USE_DAEMON": value}))
    assert f.severity is Severity.WARN and "initialization error" in said(f)
    assert f.fix.actions[0].target == "KINETO_USE_DAEMON" and f.fix.safety.value == "safe"


@pytest.mark.parametrize("env", [{}, {"KINETO_LOG_LEVEL": "3"}])
def test_kineto_daemon_unset_passes(env):
    (f,) = run("GD-CUDA-009", make_facts(env={"PATH": "/usr/bin", **env}))
    assert f.severity is Severity.PASS
