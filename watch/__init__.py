"""`gpudoctor watch`: judge a running job, from outside by its SLURM id, or from inside as a callback
(docs/watch.md).

From outside: samples.py holds the shapes (one node's observation: the job's processes and per-GPU NVML
samples), judge.py the pure rules over them (kept by topic in processes, unused, gpus, hang, verdict), node.py the
probe that runs on each node inside the job (no torch, no CUDA context), and cli.py the command that resolves the
job, runs the probes and reports.

From inside: Monitor (monitor.py: hooks, timing, the per-window gather), LightningCallback and HFCallback
(callbacks.py) over one engine; steps.py judges (pure). Importing this package imports nothing: the three faces
are loaded (and torch with them) when first used.
"""

from __future__ import annotations

from typing import Any

_FACES = {"Monitor": "monitor", "LightningCallback": "callbacks", "HFCallback": "callbacks"}
__all__ = list(_FACES)


def __getattr__(name: str) -> Any:
    if name in _FACES:
        import importlib

        return getattr(importlib.import_module(f"gpudoctor.watch.{_FACES[name]}"), name)
    raise AttributeError(f"module 'gpudoctor.watch' has no attribute {name!r}")
