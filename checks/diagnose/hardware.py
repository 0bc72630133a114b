"""Signatures of the GPU hardware: Xid events and ECC errors (diagnose)."""

from gpudoctor.checks.diagnose._signature import JUDGED_BY, Signature, verdicts
from gpudoctor.registry import declare

_XID = "https://docs.nvidia.com/deploy/xid-errors/index.html"

SIGNATURES = (
    Signature(
        id="GD-DIAG-045",
        name="log-gpu-xid-hardware",
        category="hardware",
        title="No GPU of the job reports a hardware Xid",
        keys=("Xid", "fallen off the bus"),
        pattern=r"Xid (?:\((?P<pci>[^)]*)\))?:?\s*(?P<xid>48|61|63|64|74|79|92|94|95|119|120|140)\b"
        r"|fallen off the bus",
        cause="a GPU failed in hardware (an Xid: uncorrectable ECC, fallen off the bus, NVLink or GSP firmware)",
        why="Xid 48/94/95 are uncorrectable ECC errors, 63/64 row remapping, 74 NVLink, 79 a GPU fallen off the "
        "bus, 119/120 the GSP firmware: the GPU, not the program, failed. The CUDA errors the ranks print "
        "afterwards follow from it.",
        fix="Drain the node (report it; scontrol update NodeName=... State=DRAIN Reason=xid) and resubmit "
        "excluding it (--exclude); a reset (nvidia-smi -r) or a reboot may clear it.",
        source=_XID,
        check=("GD-HW-008", "GD-HW-001"),
        versions="NVIDIA driver kernel log (dmesg)",
    ),
    Signature(
        id="GD-DIAG-046",
        name="log-gpu-xid-program",
        category="cuda",
        title="No GPU of the job reports a program Xid",
        keys=("Xid",),
        pattern=r"Xid (?:\((?P<pci>[^)]*)\))?:?\s*(?P<xid>13|31|43|45|62|69)\b",
        cause="a GPU reported Xid {xid}: a program's kernel faulted (usually the program, not the GPU)",
        why="Xid 13 (graphics engine exception), 31 (MMU fault: an illegal address) and 43 (the context ended) "
        "come from what a process ran; 45 is a process ended by the driver; 62 (a micro-controller halt) follows "
        "driver faults as often as hardware ones. They follow a kernel bug or an "
        "out-of-range index more often than a hardware fault.",
        fix="Rerun with CUDA_LAUNCH_BLOCKING=1 to find the kernel; if the Xid follows one GPU across programs, "
        "treat it as hardware.",
        source=_XID,
        check=("GD-HW-008",),
        versions="NVIDIA driver kernel log (dmesg)",
    ),
    Signature(
        id="GD-DIAG-047",
        name="log-uncorrectable-ecc",
        category="hardware",
        title="No GPU of the job hits an uncorrectable ECC error",
        keys=("uncorrectable ECC error", "ECC error encountered", "ECC_UNCORRECTABLE", "ECCUncorrectable"),
        cause="a GPU hit an uncorrectable ECC error (its memory failed)",
        why="An uncorrectable ECC error means a GPU's memory returned wrong data; the driver ends the contexts "
        "on that GPU, and the GPU needs a reset and, when it recurs, replacing.",
        fix="Drain the node and report the GPU (nvidia-smi -q -d ECC,ROW_REMAPPER), resubmit excluding it.",
        source=_XID,
        check=("GD-HW-001", "GD-HW-002"),
    ),
)

declare(verdicts(SIGNATURES), source="diagnose", judged_by=JUDGED_BY)
