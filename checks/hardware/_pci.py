"""PCI addresses in the forms NVML, sysfs and the kernel log write them; shared by the hardware checks."""

from __future__ import annotations


def pci_key(text: str | None) -> str | None:
    """'00000000:3B:00.0', '0000:3b:00', '0000:3b:00.0' -> '3b:00' (bus:device), the part every form shares."""
    if not text:
        return None
    parts = text.lower().split(":")
    return ":".join(parts[-2:]).split(".")[0] if len(parts) >= 2 else None
