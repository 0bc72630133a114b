"""What the machine running the tests has. A few tests judge this machine itself (CI's has no GPU
and torch 2.13.0+cpu); on another machine they adapt, or skip with the reason."""

from __future__ import annotations

import functools
import importlib.metadata

import pytest


@functools.cache
def torch_sees_gpu() -> bool:
    try:
        import torch
    except Exception:
        return False
    return torch.cuda.is_available()


def torch_release() -> tuple[int, int] | None:
    try:
        major, minor = importlib.metadata.version("torch").split(".")[:2]
        return int(major), int(minor)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


no_gpu_here = pytest.mark.skipif(torch_sees_gpu(), reason="judges a machine without a GPU (as CI's); this one has one")


def torch_release_here(major: int, minor: int):
    found = torch_release()
    return pytest.mark.skipif(
        found != (major, minor), reason=f"verdicts recorded for torch {major}.{minor}; this is {found}"
    )
