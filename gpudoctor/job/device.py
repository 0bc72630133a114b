"""Which device a rank trains on, and how a GPU is named: facts about the job's placement.

Used by `check --job` (each rank's view) and by the smoke run's workers (sample_train imports these; the
core never imports sample_train).
"""

from __future__ import annotations


def device_index_for(visible: int, local_rank: int, launcher: str) -> int | None:
    """Which of the visible GPUs this rank trains on, or None when it has none of its own.

    One visible GPU: the launcher bound this task to it. Several: LOCAL_RANK indexes them, the
    convention of torchrun and of our own spawn, where every local rank sees the same GPUs.
    Under srun each task may see its own few (--gpus-per-task=2): the tasks' lists differ, so
    local rank modulo the count picks a GPU of its own set; if the lists were in fact the same,
    two ranks land on one GPU and the UUID comparison in check() says so before NCCL runs.
    """
    if visible < 1:
        return None
    if visible == 1:
        return 0
    if local_rank < visible:
        return local_rank
    return local_rank % visible if launcher == "srun" else None


def gpu_uuid_text(raw: str | None, cuda_visible_devices: str | None = None) -> str | None:
    """torch's device UUID ('8-4-4-4-12' hex, no prefix) in nvidia-smi's and NVML's form.

    NVML and CUDA_VISIBLE_DEVICES write 'GPU-<uuid>', and 'MIG-<uuid>' for a MIG device: CUDA
    shows a process one MIG device at most, named so in CUDA_VISIBLE_DEVICES.
    """
    if not raw:
        return None
    raw = str(raw)
    if raw.startswith(("GPU-", "MIG-")):
        return raw
    mig = any(e.strip().startswith("MIG-") for e in (cuda_visible_devices or "").split(","))
    return ("MIG-" if mig else "GPU-") + raw


def pci_address(domain, bus, device) -> str | None:
    """A GPU's PCI address as NVML and nvidia-smi write it ('00000000:18:00.0'), or None."""
    if not all(isinstance(v, int) for v in (domain, bus, device)):
        return None
    return f"{domain:08X}:{bus:02X}:{device:02X}.0"
