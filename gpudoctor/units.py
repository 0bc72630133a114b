"""Binary byte units, one spelling for every package (sizes from NVML, /proc and /sys are in bytes)."""

from __future__ import annotations

MIB = 1 << 20
GIB = 1 << 30
