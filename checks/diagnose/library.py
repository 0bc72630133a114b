"""Signatures of libraries and the driver: symbols, versions, architectures, cuDNN (diagnose)."""

from gpudoctor.checks.diagnose._signature import JUDGED_BY, Signature, verdicts
from gpudoctor.registry import declare

_COMPAT = "https://docs.nvidia.com/deploy/cuda-compatibility/"

SIGNATURES = (
    Signature(
        id="GD-DIAG-020",
        name="log-undefined-symbol",
        category="cuda",
        title="Every library torch loads has the symbols torch was built against",
        keys=("undefined symbol",),
        pattern=r"(?P<lib>[\w.+-]+\.so[\w.]*): undefined symbol: (?P<symbol>\S+)",
        cause="a library lacks a symbol torch needs ({symbol}): another version of it was loaded first",
        why="An 'undefined symbol' at import means the shared library found first (LD_LIBRARY_PATH, a module "
        "load, a conda/pip mix) is another version than the one torch was built against: often a system NCCL, "
        "cuDNN or cuBLAS shadowing the wheel's own.",
        fix="Drop the directory that holds the other version from LD_LIBRARY_PATH (or `module unload` it) so torch "
        "loads its own libraries; reinstall torch into a clean environment if pip and conda were mixed.",
        source="https://github.com/pytorch/pytorch/issues/119932",
        check=("GD-CUDA-006", "GD-CUDA-008", "GD-CUDA-005"),
    ),
    Signature(
        id="GD-DIAG-021",
        name="log-driver-too-old",
        category="driver",
        title="The node's NVIDIA driver is new enough for torch's CUDA",
        keys=(
            "driver on your system is too old",
            "driver version is insufficient",
            "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
            "forward compatibility was attempted on non supported HW",
            "PTX was compiled with an unsupported toolchain",
        ),
        cause="the node's NVIDIA driver is older than the CUDA version torch was built with",
        why="A CUDA runtime needs a driver at least as new as its release (minor-version compatibility aside); "
        "a torch wheel for CUDA 12.x on a node with a driver for 11.x cannot initialise CUDA.",
        fix="Install the torch build for the node's CUDA (pip install torch --index-url .../whl/cu118) or run on "
        "nodes with a newer driver (nvidia-smi shows its CUDA version).",
        source=_COMPAT,
        check=("GD-DRV-002",),
    ),
    Signature(
        id="GD-DIAG-022",
        name="log-no-kernel-image",
        category="cuda",
        title="torch has kernels for the GPU's architecture",
        keys=(
            "no kernel image is available",
            "is not compatible with the current PyTorch installation",
            "invalid device function",
        ),
        cause="torch has no kernels for this GPU's architecture (a build without its sm_ version)",
        why="A torch wheel carries kernels for a list of compute capabilities; a GPU outside it (a new Blackwell "
        "sm_120 on a wheel built for up to sm_90, an old sm_37 dropped from recent wheels) cannot run them.",
        fix="Install a torch build whose arch list has the GPU's capability (torch.cuda.get_arch_list(); the cu128 "
        "wheels for sm_120), or run on GPUs the build supports.",
        source="https://pytorch.org/get-started/locally/",
        check=("GD-CUDA-004",),
    ),
    Signature(
        id="GD-DIAG-023",
        name="log-cudnn-not-initialized",
        category="cuda",
        title="cuDNN initialises",
        keys=("CUDNN_STATUS_NOT_INITIALIZED",),
        cause="cuDNN could not initialise (GPU memory already exhausted, or a cuDNN that does not match torch)",
        why="cuDNN's handle creation fails with NOT_INITIALIZED when the GPU has no memory left for its workspace "
        "(the real error is an out-of-memory) or when the cuDNN loaded is another version than torch's.",
        fix="Look for an out-of-memory first (smaller batch, one rank per GPU); otherwise drop any other cuDNN from "
        "LD_LIBRARY_PATH so torch loads its own.",
        source="https://github.com/yukkyo/PyTorch-FilterResponseNormalizationLayer/issues/4",
        check=("GD-CUDA-005",),
    ),
    Signature(
        id="GD-DIAG-024",
        name="log-nccl-version-mismatch",
        category="nccl",
        title="Every rank runs the same NCCL version",
        keys=("NCCL version",),
        pattern=r"NCCL version (?P<version>\d+\.\d+\.\d+)",
        role="hint",
        cause="the ranks run different NCCL versions ({versions})",
        why="NCCL's wire protocol is only guaranteed between identical versions; ranks that load different NCCL "
        "libraries (different environments per node, a system NCCL on some) hang or fail at the first "
        "collective. Named from the NCCL INFO version lines (NCCL_DEBUG=INFO) when they differ.",
        fix="Run every node from the same environment (same torch wheel and nvidia-nccl package, same "
        "LD_LIBRARY_PATH).",
        source="https://docs.nvidia.com/deeplearning/nccl/release-notes/index.html",
        check=("GD-JOB-002", "GD-CUDA-008"),
    ),
    Signature(
        id="GD-DIAG-025",
        name="log-cuda-init-failed",
        category="driver",
        title="CUDA initialises on every rank",
        keys=("CUDA driver initialization failed", "cudaErrorInitializationError", "CUDA unknown error"),
        cause="CUDA failed to initialise on the node (driver not loaded, or device files missing)",
        why="CUDA's initialisation fails when the driver is not loaded or broken, when /dev/nvidia* are not in "
        "the container or cgroup, or when the process forked after CUDA was initialised.",
        fix="Check nvidia-smi on the node; in a container add --gpus all; start workers with spawn, not fork, "
        "after CUDA is initialised.",
        source="https://pytorch.org/docs/stable/notes/multiprocessing.html#cuda-in-multiprocessing",
        check=("GD-CUDA-003", "GD-DRV-001"),
    ),
    Signature(
        id="GD-DIAG-056",
        name="log-cublas-not-initialized",
        category="cuda",
        title="cuBLAS initialises",
        keys=("CUBLAS_STATUS_NOT_INITIALIZED",),
        cause="cuBLAS could not initialise (GPU memory already exhausted, or the wrong device or CUDA libraries)",
        why="cublasCreate fails with NOT_INITIALIZED when the GPU has no memory left for cuBLAS's workspace (often "
        "several ranks on one GPU, or a batch that nearly fills it), or when the cuBLAS loaded does not match "
        "torch's CUDA.",
        fix="One rank per GPU and a smaller batch first; otherwise drop any other CUDA libraries from "
        "LD_LIBRARY_PATH so torch loads its own.",
        source="https://github.com/EleutherAI/lm-evaluation-harness/issues/1689",
        check=("GD-SLURM-002", "GD-CUDA-006"),
    ),
    Signature(
        id="GD-DIAG-057",
        name="log-torch-without-nccl",
        category="nccl",
        title="The job's torch has NCCL",
        keys=("Distributed package doesn't have NCCL built in", "NCCL is not available", "ProcessGroupNCCL is not"),
        cause="the job's torch has no NCCL (a CPU-only, macOS or Windows build) but the job asked for backend nccl",
        why="init_process_group('nccl') needs a CUDA build of torch on Linux; a CPU-only wheel (pip's default on "
        "some indexes), a macOS or Windows build has no NCCL.",
        fix="Install a CUDA build of torch (pip install torch --index-url https://download.pytorch.org/whl/cu124) "
        "or use backend gloo where there are no GPUs.",
        source="https://pytorch.org/docs/stable/distributed.html#backends",
        check=("GD-NCCL-001", "GD-CUDA-002"),
    ),
    Signature(
        id="GD-DIAG-058",
        name="log-torch-cpu-build",
        category="cuda",
        title="The job's torch is a CUDA build",
        keys=("Torch not compiled with CUDA enabled",),
        cause="the job's torch is a CPU-only build (Torch not compiled with CUDA enabled)",
        why="A CPU-only torch wheel (the default on PyPI for some platforms, or a dependency that pulled it in) "
        "cannot use the GPUs the job was given.",
        fix="Install the CUDA build of torch in the job's environment (pip install torch --index-url "
        "https://download.pytorch.org/whl/cu124) and check `python -c 'import torch; print(torch.version.cuda)'`.",
        source="https://pytorch.org/get-started/locally/",
        check=("GD-CUDA-002",),
    ),
    Signature(
        id="GD-DIAG-059",
        name="log-torch-not-installed",
        category="cuda",
        title="The job's Python has torch",
        keys=("No module named 'torch'", 'No module named "torch"'),
        cause="the job's Python has no torch: the environment is not activated on the node",
        why="The program runs under the Python the batch script (or srun) finds on the node; a venv, conda "
        "environment or module loaded only in the login shell is not there.",
        fix="Activate the environment in the batch script before srun/torchrun (source venv/bin/activate, conda "
        "activate, module load), or call its Python by absolute path.",
        source="https://slurm.schedmd.com/sbatch.html",
        check=("GD-CUDA-001",),
    ),
    Signature(
        id="GD-DIAG-067",
        name="log-cuda-library-missing",
        category="cuda",
        title="Every CUDA library the job loads is found on the node",
        keys=("cannot open shared object file",),
        pattern=r"(?P<lib>lib(?:cud|nccl|cublas|cufft|curand|cusparse|cusolver|nvrtc|nvJitLink|nvidia|nvToolsExt)"
        r"[\w.+-]*): cannot open shared object file",
        cause="a CUDA library is not found on the node ({lib}): the environment's CUDA libraries are not loaded",
        why="torch and its extensions load libcudart, libcudnn, libnccl and the others from the wheel's nvidia "
        "packages, LD_LIBRARY_PATH or a module; on a node where the module is not loaded, or an extension built for "
        "another CUDA, the library is missing.",
        fix="Load the same CUDA module / environment in the batch script as where the code was built, or install "
        "the torch wheel with its nvidia-* packages; rebuild extensions for this CUDA.",
        source="https://pytorch.org/get-started/locally/",
        check=("GD-CUDA-006", "GD-CUDA-001"),
    ),
    Signature(
        id="GD-DIAG-068",
        name="log-gloo-connect-failed",
        category="distributed",
        title="gloo connects every pair of ranks",
        keys=("connectFullMesh failed", "Gloo connectFullMesh"),
        cause="gloo could not connect the ranks: the interface or hostname it used is not reachable from the others",
        why="gloo connects every pair of ranks on the address of the interface GLOO_SOCKET_IFNAME names, or of the "
        "host name; a host name that resolves to 127.0.1.1 (/etc/hosts) or a virtual interface is unreachable from "
        "other nodes.",
        fix="Set GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME) to the interface the nodes reach each other on; make "
        "the host name resolve to that interface's address.",
        source="https://pytorch.org/docs/stable/distributed.html#choosing-the-network-interface-to-use",
        check=("GD-NCCL-002", "GD-DIST-006"),
    ),
)

declare(verdicts(SIGNATURES), source="diagnose", judged_by=JUDGED_BY)
