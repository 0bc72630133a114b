"""Probe: the only code that touches the machine. Each probe runs isolated and time-bounded.

A probe that fails or overruns leaves {"error": ...} in its section; collect() never raises.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable, Iterable

from gpudoctor import __version__
from gpudoctor.facts import SECTIONS, Facts, collectable_env

DEFAULT_PROBE_TIMEOUT = 15.0
DEFAULT_TORCH_TIMEOUT = 60.0
# Why torch was left alone (the torch_meta section says it, the runner's skips repeat it): before submission
# the job's torch is the training environment's, which this interpreter's need not be.
TORCH_NOT_ASKED = "before submission this torch is not the job's (--python PATH, --local-torch: judge one)"


def _env_probe() -> dict:
    return {"vars": collectable_env()}


def _in_thread(fn: Callable[[], dict]) -> Callable[[float], dict]:
    """Start fn in a daemon thread now; the returned callable waits for it until a deadline.

    A hung probe (an NVML call stuck in the driver) is abandoned, not joined: daemon
    threads do not keep the process alive.
    """
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - a module on sys.path (a pynvml shadow) may call sys.exit()
            box["value"] = {"error": f"{type(e).__name__}: {str(e)[:500]}"}

    t = threading.Thread(target=target, daemon=True)
    t.start()

    def wait(deadline: float) -> dict:
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            return {"error": "probe timed out", "timed_out": True}
        return box["value"]

    return wait


def _torch_not_asked() -> dict:
    return {"version": None, "not_asked": TORCH_NOT_ASKED}


def start_torch_probe(python: str | None = None, torch_timeout: float = DEFAULT_TORCH_TIMEOUT, fork: bool = False):
    """Start importing torch in a child now, so that the caller's own start-up overlaps it. fork: the caller has
    imported the torch to judge itself, so the child is a fork of it (torch_probe.py)."""
    from gpudoctor.probe.torch_probe import TorchProbe

    return TorchProbe(python, torch_timeout, fork)


def collect(
    sections: Iterable[str] = SECTIONS,
    python: str | None = None,
    torch_timeout: float = DEFAULT_TORCH_TIMEOUT,
    probe_timeout: float = DEFAULT_PROBE_TIMEOUT,
    torch_probe=None,
    partition: str | None = None,
    probe_torch: bool = True,
) -> Facts:
    """torch_probe: a TorchProbe the caller started earlier (see start_torch_probe); partition: the
    SLURM partition whose nodes the cluster section describes (default: the cluster's default one);
    probe_torch=False: torch is neither imported nor read (no torch section; torch_meta says why)."""
    wanted = [s for s in SECTIONS if s in set(sections) and (probe_torch or s != "torch")]
    started = getattr(torch_probe, "started", None) or time.monotonic()
    if "torch" in wanted and torch_probe is None:  # first: the slowest, and it runs in another process
        torch_probe = start_torch_probe(python, torch_timeout)
    elif "torch" not in wanted and torch_probe is not None:
        torch_probe.cancel()

    def lazy(module: str, attr: str = "probe", *args):
        def run():
            import importlib

            return getattr(importlib.import_module(module), attr)(*args)

        return run

    runners = {
        "host": lazy("gpudoctor.probe.host"),
        "nvidia": lazy("gpudoctor.probe.nvidia"),
        "torch_meta": lazy("gpudoctor.probe.torch_probe", "torch_meta", python) if probe_torch else _torch_not_asked,
        "libraries": lazy("gpudoctor.probe.libraries"),
        "env": _env_probe,
        "network": lazy("gpudoctor.probe.network"),
        "slurm": lazy("gpudoctor.probe.slurm", "probe", python),
        "rendezvous": lazy("gpudoctor.probe.rendezvous"),
        "kernel": lazy("gpudoctor.probe.kernel"),
        "pci": lazy("gpudoctor.probe.pci"),
        "cluster": lazy("gpudoctor.probe.cluster", "probe", partition),
    }
    pending = {name: _in_thread(runners[name]) for name in wanted if name in runners}
    deadline = time.monotonic() + probe_timeout
    out: dict = {}
    for name in wanted:
        if name not in pending and name != "torch":
            continue  # a section no probe makes ("job" is built from every rank's facts)
        if name == "torch":
            out[name] = torch_probe.result()
        else:
            out[name] = pending[name](deadline)
    _describe_torch_cudnn(out)
    meta = {
        "tool": {"name": "gpudoctor", "version": __version__},
        "collected_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "probe_seconds": round(time.monotonic() - started, 3),
    }
    return Facts(sections=out, meta=meta)


def _describe_torch_cudnn(out: dict) -> None:
    """torch's own cuDNN folders, read once the torch child has said which they are (libraries.cudnn_loader.bundle):
    the loader's choice for cuDNN's sub-libraries depends on their RUNPATH (GD-CUDA-005)."""
    torch, libs = out.get("torch"), out.get("libraries")
    if not isinstance(torch, dict) or not isinstance(libs, dict) or not isinstance(libs.get("cudnn_loader"), dict):
        return
    from gpudoctor.probe.libraries import describe_cudnn_dirs, torch_cudnn_dirs

    try:
        libs["cudnn_loader"]["bundle"] = describe_cudnn_dirs(torch_cudnn_dirs(torch))
    except OSError as e:
        libs["cudnn_loader"]["bundle_error"] = str(e)[:200]
