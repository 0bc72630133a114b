"""Signatures of NCCL's network: interfaces, sockets, InfiniBand, containers (diagnose)."""

from gpudoctor.checks.diagnose._signature import JUDGED_BY, Signature, verdicts
from gpudoctor.registry import declare

_ENV = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"
_TROUBLE = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html"

SIGNATURES = (
    Signature(
        id="GD-DIAG-012",
        name="log-nccl-no-interface",
        category="nccl",
        title="NCCL finds a network interface to bootstrap on",
        keys=("no socket interface found", "No usable listening interface found", "no interface found"),
        cause="NCCL found no usable network interface (NCCL_SOCKET_IFNAME matches none on the node)",
        why="NCCL bootstraps over the interfaces NCCL_SOCKET_IFNAME selects; a name that no interface of the node "
        "has (eth0 where the node has ens*, ib0 on a node without IPoIB) leaves none.",
        fix="Set NCCL_SOCKET_IFNAME to an interface every node has (`ip -br addr` on a node; a prefix such as "
        "=ens or ^lo,docker to exclude), or unset it.",
        source=_ENV,
        check=("GD-NCCL-002", "GD-NCCL-007"),
    ),
    Signature(
        id="GD-DIAG-013",
        name="log-nccl-socket-error",
        category="nccl",
        title="NCCL's socket connections between ranks hold",
        keys=(
            "socketStartConnect",
            "socket progress error",
            "Connection closed by remote peer",
            "socketPollConnect",
            "No route to host",
            "Network is unreachable",
            "Connect to",
        ),
        pattern=r"NCCL WARN.*(?:[Ss]ocket|Connect to .* failed|[Cc]onnection closed|No route|unreachable)"
        r"|socketStartConnect|socketPollConnect|socketProgress",
        role="hint",
        cause="NCCL's socket connection between ranks failed (interface, firewall, or a peer that died first)",
        why="NCCL connects the ranks over the interface NCCL_SOCKET_IFNAME selects; an interface that cannot reach "
        "the other node (a private docker or virtual NIC picked by default), a firewall, or a peer process that "
        "died first breaks the connection.",
        fix="Pin NCCL_SOCKET_IFNAME to the interface the nodes reach each other on, open the ports between nodes, "
        "and if another rank failed first, that rank's error is the cause.",
        source=_TROUBLE,
        check=("GD-NCCL-010", "GD-NCCL-002"),
    ),
    Signature(
        id="GD-DIAG-014",
        name="log-nccl-ib-completion-error",
        category="nccl",
        title="InfiniBand transfers between ranks complete",
        keys=("Got completion", "with error 12", "ibv_poll_cq", "Got async event"),
        pattern=r"NET/IB.*[Cc]ompletion.*(?:error|status=)\s*\d+|ibv_poll_cq|NET/IB.*Got async event",
        cause="an InfiniBand/RoCE transfer timed out: the NICs cannot reach each other (GID index, link, fabric)",
        why="NET/IB completion errors (12: transport retry counter exceeded) mean the remote HCA did not answer: a "
        "link down or flapping, a port in another subnet, or a node gone.",
        fix="On RoCE, error 12 at the first transfer means the NICs cannot talk RoCE: set NCCL_IB_GID_INDEX to the "
        "RoCEv2 GID (show_gids); else check the ports (ibstat) on the nodes named and drain a node whose link "
        "errors; NCCL_IB_TIMEOUT=22 for long fabrics.",
        source=_ENV,
        check=("GD-NCCL-009",),
    ),
    Signature(
        id="GD-DIAG-015",
        name="log-nccl-ib-gid-or-hca",
        category="nccl",
        title="NCCL's InfiniBand/RoCE device and GID index are right",
        keys=("ibv_modify_qp failed", "NET/IB : No device found", "NCCL_IB_HCA", "GID"),
        pattern=r"ibv_modify_qp failed|NCCL WARN.*(?:No device found|GID|NCCL_IB_HCA)",  # INFO's "No device": no IB
        cause="NCCL could not open its InfiniBand/RoCE connection (HCA, GID index, or NICs across rails)",
        why="ibv_modify_qp fails when the queue pair is given a GID index the port does not have (RoCE needs the "
        "RoCEv2 GID, usually 3), and NET/IB finds no device when NCCL_IB_HCA names HCAs the node lacks.",
        fix="Set NCCL_IB_HCA to the HCAs the node has (ibv_devices) and, on RoCE, NCCL_IB_GID_INDEX to the "
        "RoCEv2 GID (show_gids); on a rail-optimized fabric (only NICs of the same rail connect) NCCL_CROSS_NIC=0.",
        source=_ENV,
        check=("GD-NCCL-006",),
    ),
    Signature(
        id="GD-DIAG-016",
        name="log-nccl-shm-segment",
        category="nccl",
        title="NCCL can create its shared memory segments",
        keys=(
            "Error while creating shared memory segment",
            "failed to extend /dev/shm/nccl",
        ),
        cause="NCCL could not create a shared memory segment: /dev/shm too small (a container's 64 MB default)",
        why="Ranks on one node exchange data through /dev/shm; a container started without --ipc=host or "
        "--shm-size has 64 MB there, too little for NCCL's buffers.",
        fix="Start the container with --ipc=host or --shm-size=16g (Kubernetes: an emptyDir of medium Memory on "
        "/dev/shm); or NCCL_SHM_DISABLE=1 as a slower fallback.",
        source=_TROUBLE,
        check=("GD-HOST-002",),
    ),
    Signature(
        id="GD-DIAG-017",
        name="log-nccl-memlock",
        category="nccl",
        title="NCCL can register memory with the InfiniBand device",
        keys=("ibv_reg_mr", "Call to ibv_create_cq failed", "ibv_create_qp failed"),
        pattern=r"NCCL WARN.*(?:ibv_reg_mr|ibv_create_cq|ibv_create_qp)",
        cause="NCCL could not register memory with the InfiniBand device (locked memory limit too low)",
        why="RDMA pins memory; with a small RLIMIT_MEMLOCK (a container's default, or slurmd started with a low "
        "limit) ibv_reg_mr and queue creation fail.",
        fix="Raise the locked-memory limit: `ulimit -l unlimited` for slurmd (PropagateResourceLimits) or "
        "docker --ulimit memlock=-1.",
        source=_TROUBLE,
        check=("GD-HOST-003",),
    ),
    Signature(
        id="GD-DIAG-018",
        name="log-nccl-system-error",
        category="nccl",
        title="No NCCL call fails with a system or internal error",
        keys=("unhandled system error", "ncclSystemError", "ncclInternalError", "internal error - please report"),
        role="hint",
        cause="an NCCL call failed with a system error (the NCCL WARN line before it says which)",
        why="ncclSystemError is NCCL's summary of a failed system call (socket, shared memory, InfiniBand); the "
        "NCCL WARN line just before it names the call, and NCCL_DEBUG=INFO prints it.",
        fix="Run again with NCCL_DEBUG=INFO (and NCCL_DEBUG_SUBSYS=INIT,NET) and read the first NCCL WARN line.",
        source=_TROUBLE,
    ),
    Signature(
        id="GD-DIAG-019",
        name="log-nccl-unhandled-cuda-error",
        category="nccl",
        title="No NCCL call fails on a CUDA error",
        keys=("unhandled cuda error", "ncclUnhandledCudaError", "Cuda failure"),
        pattern=r"unhandled cuda error|ncclUnhandledCudaError|Cuda failure '(?!out of memory)(?P<what>[^']*)'",
        role="hint",
        cause="a CUDA call inside NCCL failed (the 'Cuda failure' line names it: memory, driver, P2P)",
        why="ncclUnhandledCudaError wraps a failed CUDA call; the NCCL WARN 'Cuda failure' line names it (out of "
        "memory, peer access not supported, a driver/CUDA mismatch).",
        fix="Read the NCCL WARN 'Cuda failure' line (NCCL_DEBUG=INFO); for P2P failures on consumer GPUs or in VMs "
        "NCCL_P2P_DISABLE=1.",
        source=_TROUBLE,
        check=("GD-NCCL-011", "GD-HW-009"),
    ),
    Signature(
        id="GD-DIAG-063",
        name="log-nccl-virtual-interface",
        category="nccl",
        title="NCCL does not bootstrap over a container's or a VM's virtual interface",
        keys=("Bootstrap : Using", "NET/Socket : Using"),
        pattern=r"(?:Bootstrap|NET/Socket) : Using (?:\[\d+\])?(?P<ifname>(?:docker|veth|virbr|br-|cni|flannel|vxlan"
        r"|tun|tailscale|vmnet)[\w.-]*)",
        role="hint",
        cause="NCCL connected the ranks over {ifname}, a virtual interface other nodes may not reach",
        why="Without NCCL_SOCKET_IFNAME, NCCL picks the first interface that is up; a docker bridge, a veth or a "
        "VPN interface has an address only its own host (or container) reaches, so ranks on other nodes never "
        "connect and the job hangs or fails in NCCL's sockets.",
        fix="Set NCCL_SOCKET_IFNAME (and GLOO_SOCKET_IFNAME) to the interface the nodes reach each other on, or "
        "exclude the virtual ones: NCCL_SOCKET_IFNAME=^docker,veth,lo.",
        source="https://github.com/NVIDIA/nccl/issues/913",
        check=("GD-NCCL-010", "GD-NCCL-002"),
        needs=("GD-DIAG-013", "GD-DIAG-018", "GD-DIAG-048", "GD-DIAG-049", "GD-DIAG-050", "GD-DIAG-061"),
    ),
    Signature(
        id="GD-DIAG-064",
        name="log-fabric-manager-not-running",
        category="hardware",
        title="The NVSwitch fabric manager runs on the job's nodes",
        keys=("system not yet initialized", "Error 802"),
        cause="CUDA says the system is not yet initialized: the NVSwitch fabric manager is not running",
        why="On NVSwitch systems (HGX/DGX A100, H100, H200) CUDA cannot use the GPUs until nvidia-fabricmanager "
        "has set up the fabric; a node booted without it, or with a fabric manager of another version than the "
        "driver, fails every CUDA call with error 802.",
        fix="Start nvidia-fabricmanager (its version equal to the driver's) on the node, or drain the node and report "
        "it; resubmit excluding it.",
        source="https://github.com/pytorch/pytorch/issues/35710",
        check=("GD-HW-006", "GD-HW-010"),
    ),
)

declare(verdicts(SIGNATURES), source="diagnose", judged_by=JUDGED_BY)
