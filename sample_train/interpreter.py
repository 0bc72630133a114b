"""Which interpreter the smoke run trains in: this one, or `--python PATH` (the training env's, like
`gpudoctor check --python`). Without torch there is no run: a GD-SMOKE-013 finding with the install
command and exit 2, never an internal error. Imports no torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from gpudoctor.model import ExitCode, Severity, manual

PROBE_TIMEOUT_S = 30.0
_FIND = (
    "import importlib.util as u, json; "
    "print(json.dumps({'torch': u.find_spec('torch') is not None, 'gpudoctor': u.find_spec('gpudoctor') is not None}))"
)


def has_modules(python: str) -> dict | str:
    """{'torch': bool, 'gpudoctor': bool} for that interpreter, or why it could not say."""
    from gpudoctor.probe.proc import run_bounded

    try:  # its own process group, killed whole: a conda shim's children do not outlive the question
        r = run_bounded([python, "-P", "-c", _FIND], timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"{python} did not answer within {PROBE_TIMEOUT_S:g} s"
    except OSError as e:
        return f"cannot run {python}: {e.strerror or e}"
    try:
        found = json.loads(r.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return f"{python} exited {r.returncode}: {(r.stderr or r.stdout).strip()[-200:]}"
    return found if isinstance(found, dict) else f"{python} answered {found!r}"


def torch_here() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def no_torch(opts, python: str) -> int:
    """The GD-SMOKE-013 report (text or JSON as asked) and exit 2."""
    import time

    from gpudoctor.sample_train import launch
    from gpudoctor.sample_train.coordinator import Verdict
    from gpudoctor.sample_train.judge import report
    from gpudoctor.sample_train.judge.findings import make

    fix = manual(
        "Install torch into the interpreter that trains, or point the run at the training env",
        f"{python} -m pip install torch",
        "gpudoctor smoke --python /path/to/env/bin/python",
    )
    finding = make(
        "GD-SMOKE-013",
        Severity.FAIL,
        f"torch is not installed for {python}: the smoke run trains with torch and cannot start",
        fix,
        python=python,
    )
    started = time.monotonic()
    where = {
        "mode": "spawn",
        "world_size": 0,
        "local_world_size": 0,
        "nodes": 0,
        "backend": None,
        "reporter": {"role": "spawner", "pid": os.getpid()},
    }
    rep = report.build(Verdict(False, [finding]), opts, where, time.monotonic() - started)
    launch.emit(rep, opts)  # the report's exit_code stays 1 (smoke/1 knows 0 and 1: the run failed)
    return ExitCode.USAGE  # the process: nothing could run, as for a bad --python


def rerun_in(python: str, argv: list[str], opts) -> int:
    """`smoke --python PATH`: the whole run in that interpreter, where gpudoctor must be installed too."""
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        print(f"gpudoctor smoke: --python {python}: not an executable file", file=sys.stderr)
        return ExitCode.USAGE
    found = has_modules(python)
    if isinstance(found, str):
        print(f"gpudoctor smoke: --python {python}: {found}", file=sys.stderr)
        return ExitCode.USAGE
    if not found.get("torch"):
        return no_torch(opts, python)
    if not found.get("gpudoctor"):
        print(
            f"gpudoctor smoke: --python {python}: gpudoctor is not installed there; the run trains in that env, so "
            f"install it there too ({python} -m pip install gpudoctor)",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    rest = []
    skip_next = False
    for a in argv:
        if skip_next:
            skip_next = False
            continue
        if a == "--python":
            skip_next = True
            continue
        if a.startswith("--python="):
            continue
        rest.append(a)
    return subprocess.call([python, "-P", "-m", "gpudoctor", *rest], stdin=None)


HELD_WARNINGS: list[str] = []  # Python warnings raised during the run (torch's deprecations and the like)


def hold_warnings() -> None:
    """Keep Python warnings (torch's own: deprecations, TF32 notices, storage API) out of the smoke output:
    they are about torch's internals or our sample model, not about the user's set-up, and would sit between
    the progress and the report. They are kept in HELD_WARNINGS instead of printed."""
    import warnings

    def hold(message, category, filename, lineno, file=None, line=None) -> None:
        HELD_WARNINGS.append(f"{category.__name__}: {message} ({os.path.basename(str(filename))}:{lineno})")

    warnings.showwarning = hold
