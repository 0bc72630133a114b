"""Version strings and numbers as NVIDIA and PyTorch write them."""

from __future__ import annotations

import re


def parse(text: str | None) -> tuple[int, ...] | None:
    """'12.4' -> (12, 4); '2.3.0+cu121' -> (2, 3, 0); '550.54.15' -> (550, 54, 15)."""
    if not text:
        return None
    # at most 18 digits a part: no real version has more, and int() refuses thousands of them
    m = re.match(r"^\s*v?(\d{1,18}(?:\.\d{1,18})*)(?!\d)", str(text))
    return tuple(int(p) for p in m.group(1).split(".")) if m else None


def cuda_from_int(n: int | None) -> tuple[int, int] | None:
    """NVML/cudart integer form: 12040 -> (12, 4)."""
    if not n:
        return None
    return (n // 1000, (n % 1000) // 10)


def fmt(v: tuple[int, ...] | None) -> str:
    return ".".join(str(p) for p in v) if v else "?"


def cudnn_from_int(n: int | None) -> tuple[int, int, int] | None:
    """torch.backends.cudnn.version(): 8907 -> (8, 9, 7); 90100 -> (9, 1, 0)."""
    if not n:
        return None
    if n >= 10000:  # cuDNN 9+: major*10000 + minor*100 + patch
        return (n // 10000, (n % 10000) // 100, n % 100)
    return (n // 1000, (n % 1000) // 100, n % 100)
