"""SLURM facts beyond the environment: the installed SLURM version, the running job as the
controller sees it, and the launcher libraries whose SLURM rules differ by version.

Every command is time-bounded; nothing here raises. Outside SLURM the section says so.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

from gpudoctor.probe.proc import run_bounded

COMMAND_TIMEOUT = 5.0
# scontrol fields worth keeping (the rest can hold paths, comments, user names).
JOB_FIELDS = (
    "JobId",
    "JobName",
    "NumNodes",
    "NumCPUs",
    "NumTasks",
    "CPUs/Task",
    "ReqTRES",
    "AllocTRES",
    "TresPerNode",
    "TresPerTask",
    "TresPerJob",
    "TresPerSocket",
    "BatchFlag",
    "Command",
    "Partition",
    "NodeList",
    "OverSubscribe",
    "Contiguous",
)
# Python packages whose launch rules under SLURM the checks need to know.
PACKAGES = ("lightning", "pytorch_lightning", "lightning_fabric", "accelerate", "deepspeed")


def _run(cmd: list[str], timeout: float = COMMAND_TIMEOUT) -> tuple[int | None, str, str]:
    try:
        r = run_bounded(cmd, timeout)  # its own process group, killed whole: a wrapper's children too
    except subprocess.TimeoutExpired:
        return None, "", f"{cmd[0]} did not answer within {timeout:g} s (killed)"
    except OSError as e:
        return None, "", f"cannot run {cmd[0]}: {e.strerror or e}"
    return r.returncode, r.stdout, r.stderr


def slurm_version() -> dict:
    """`srun --version` ('slurm 22.05.8'): needs no controller, so it works on a login node too."""
    for tool in ("srun", "sinfo", "sbatch"):
        if shutil.which(tool):
            rc, out, err = _run([tool, "--version"])
            m = re.search(r"(\d+\.\d+(?:\.\d+)?)", out)
            if rc == 0 and m:
                return {"version": m.group(1), "version_source": f"{tool} --version"}
            return {"version": None, "version_error": (err or out).strip()[:200] or f"{tool} --version failed"}
    return {"version": None, "version_error": "no SLURM commands (srun, sinfo, sbatch) on PATH"}


def parse_scontrol_record(text: str) -> dict:
    """'JobId=12 JobName=x NumNodes=1 ...' (scontrol -o) -> {field: value}; values may hold spaces only in Command."""
    fields: dict = {}
    for m in re.finditer(r"(\S+?)=(.*?)(?=\s+\S+?=|$)", text.strip()):
        fields[m.group(1)] = m.group(2).strip()
    return fields


def job_record(job_id: str) -> dict:
    if not shutil.which("scontrol"):
        return {"error": "scontrol is not on PATH"}
    rc, out, err = _run(["scontrol", "show", "job", "-o", "-d", job_id])
    if rc != 0 or not out.strip():
        return {"error": (err or out).strip()[:200] or f"scontrol exited {rc}"}
    record = parse_scontrol_record(out.splitlines()[0])
    return {k: record[k] for k in JOB_FIELDS if k in record}


def batch_script(job: str, timeout: float) -> str | None:
    """The job's batch script as submitted (`scontrol write batch_script JOB -`: SLURM keeps it while the job lives,
    and for a while after); None when it cannot be had (no scontrol, another user's job, gone, cut at 1 MiB)."""
    try:
        r = run_bounded(["scontrol", "write", "batch_script", job, "-"], timeout, max_output=1 << 20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 and r.stdout.strip() and not r.truncated else None


_PACKAGES_CODE = (
    "import json\nfrom importlib.metadata import version, PackageNotFoundError\nout = {}\n"
    "for p in %r:\n    try: out[p] = version(p)\n    except PackageNotFoundError: out[p] = None\n"
    "print(json.dumps(out))\n"
)


def launcher_packages(python: str | None) -> dict:
    """Installed versions of Lightning, accelerate, deepspeed in the target interpreter (no import)."""
    if python is None or os.path.realpath(python) == os.path.realpath(sys.executable):
        from importlib.metadata import PackageNotFoundError, version

        out: dict[str, str | None] = {}
        for p in PACKAGES:
            try:
                out[p] = version(p)
            except PackageNotFoundError:
                out[p] = None
        return out
    rc, stdout, err = _run([python, "-c", _PACKAGES_CODE % (PACKAGES,)], timeout=10)
    try:
        found = json.loads(stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError, RecursionError, ValueError):
        found = None
    if isinstance(found, dict) and all(isinstance(v, (str, type(None))) for v in found.values()):
        return {p: found.get(p) for p in PACKAGES}
    return {"error": (err or stdout).strip()[:200] or f"{python} exited {rc} without an answer"}


def probe(python: str | None = None) -> dict:
    out: dict = {"in_job": "SLURM_JOB_ID" in os.environ}
    out.update(slurm_version())
    job_id = os.environ.get("SLURM_JOB_ID")
    out["job"] = job_record(job_id) if job_id else None
    out["packages"] = launcher_packages(python)
    return out
