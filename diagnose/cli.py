"""`gpudoctor diagnose LOG... [--sbatch F] [--config F] [--snapshot F] [--json]`, `gpudoctor diagnose --job JOBID`:
read a failed job's log and name the first cause, the rank and the fix (docs/diagnose.md).

1. The logs are streamed through logread (bounded memory, `-` is standard input); with --job, the job's
   StdOut/StdErr paths, state, exit code and nodes come from `scontrol show job` (or `sacct` once the
   controller has forgotten the job), and its batch script from `scontrol write batch_script`, read-only.
2. The judge (judge.py) names the first cause (fail, exit 1) or GD-DIAG-001 (warn: the first error line,
   exit 0), and what followed as notes.
3. With --sbatch/--config/--snapshot (or the batch script of --job), the checks a cause's row names are run
   on those inputs as `check --sbatch` runs them (gpudoctor.inputs.context_for: the same reader of the
   script and config); a warn or fail among them gives the cause the script's line to change and its fix.
Exit codes as every command's: 1 a cause found, 0 none known (a warn, never a clean bill), 2 unusable input.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

JOB_TITLE = "SLURM's record of the job"
HELP = "read a failed job's log (or --job JOBID) and name the first cause, the rank that failed and the fix"
SCONTROL_TIMEOUT_S = 10.0
# a job id as SLURM writes it: 123, an array task 123_4, a het job component 123+1
_JOB_ID = re.compile(r"^[0-9]{1,12}(?:_[0-9]{1,9}|\+[0-9]{1,3})?$")


def add_arguments(p: argparse.ArgumentParser, check_parser: argparse.ArgumentParser) -> None:
    p.add_argument(
        "logs",
        nargs="*",
        metavar="LOG",
        help="the job's log files or directories (torchrun --log-dir; - reads standard input)",
    )
    p.add_argument("--job", metavar="JOBID", help="a SLURM job: its output files, state and batch script")
    p.add_argument("--sbatch", metavar="FILE", help="the job's batch script: a cause is joined to its line")
    p.add_argument("--config", metavar="FILE", help="the job's training config (YAML/JSON)")
    p.add_argument("--snapshot", metavar="FILE", help="a node's facts (gpudoctor snapshot -o) to judge with")
    p.add_argument("--json", action="store_true", help="print the gpudoctor.report/1 JSON object")
    p.add_argument("-v", "--verbose", action="store_true", help="every note with its full evidence")


def run(args) -> int:
    from gpudoctor.inputs import UsageError

    logs = list(args.logs or [])
    job_note = None
    script_text = None
    if args.job:
        if not _JOB_ID.match(args.job):
            raise UsageError(f"--job {_shown(args.job)}: expected a SLURM job id (digits, 123_4 or 123+1)")
        record = job_record(args.job, UsageError)
        job_note = record
        if not logs:
            logs = [p for p in dict.fromkeys([record.get("StdOut"), record.get("StdErr")]) if p]
            if not logs:
                raise UsageError(f"job {args.job}: SLURM names no output file; give the log: diagnose LOG --job ...")
        script_text = batch_script(args.job)
    if not logs:
        raise UsageError("diagnose: give the job's log (LOG..., - for standard input) or --job JOBID")
    if logs.count("-") > 1:
        raise UsageError("diagnose: - (standard input) can be given once")
    scan = _read(logs, UsageError)
    from gpudoctor.diagnose.judge import judge
    from gpudoctor.diagnose.signatures import TABLE

    preflight = _preflight(args, script_text, TABLE, UsageError)
    findings = judge(scan, TABLE, preflight, job_note)
    if job_note:
        findings.append(_job_finding(args.job, job_note))
    return _emit(findings, scan, args, _fix_command(args))


def _shown(text: str) -> str:
    from gpudoctor.sanitize import clean

    return repr(clean(text)[:60])


def _read(logs: list[str], usage_error: type[Exception]):
    from gpudoctor.diagnose.logread import read_logs
    from gpudoctor.diagnose.signatures import keys
    from gpudoctor.fileio import FileIOError, open_input_stream

    paths = expand(logs, usage_error)

    def streams():  # each file open only while it is read: a log directory may hold thousands
        for path in paths:
            if path == "-":
                yield "<stdin>", sys.stdin.buffer
                continue
            stream = open_input_stream(path, "log")
            try:
                yield path, stream
            finally:
                stream.close()

    try:
        return read_logs(streams(), keys())
    except FileIOError as e:
        raise usage_error(str(e)) from None
    except OSError as e:
        raise usage_error(f"cannot read the log: {e.strerror or e}") from None


MAX_FILES = 10000  # files read from the directories given (torchrun --log-dir: a few per rank)


def expand(logs: list[str], usage_error: type[Exception]) -> list[str]:
    """The files to read: each LOG as given, a directory as the regular files under it in name order (torchrun's
    --log-dir: attempt_N/LOCAL_RANK/stderr.log ...; symbolic links not followed), at most MAX_FILES."""
    import os

    out: list[str] = []
    for path in logs:
        if path == "-" or not os.path.isdir(path):
            out.append(path)
            continue
        found = []
        for root, dirs, files in os.walk(path):  # followlinks=False: a link to elsewhere is not read
            dirs.sort()
            for name in sorted(files):
                full = os.path.join(root, name)
                if os.path.isfile(full) and not os.path.islink(full):
                    found.append(full)
            if len(out) + len(found) > MAX_FILES:
                raise usage_error(f"log {_shown(path)}: more than {MAX_FILES} files; name the logs to read")
        if not found:
            raise usage_error(f"log {_shown(path)}: a directory without files")
        out.extend(found)
    return out


def _preflight(args, script_text: str | None, table, usage_error: type[Exception]) -> dict:
    """The findings of the checks the rows name, on the job's inputs (--sbatch, --config, --snapshot), by id."""
    import os
    import tempfile

    if not (args.sbatch or args.config or args.snapshot or script_text):
        return {}
    from gpudoctor.facts import Facts, SnapshotError
    from gpudoctor.inputs import context_for
    from gpudoctor.registry import load_all
    from gpudoctor.runner import run_checks

    facts = Facts(sections={"env": {"vars": {}}})  # judged as a script before submission, unless a snapshot
    if args.snapshot:
        try:
            facts = Facts.load(args.snapshot)
        except SnapshotError as e:
            raise usage_error(str(e)) from None
    specs = load_all()
    wanted = sorted({c for sig in table for c in sig.check if c in specs and specs[c].judged_by_check})
    with tempfile.TemporaryDirectory(prefix="gpudoctor-diagnose-") as tmp:
        sbatch = args.sbatch
        if not sbatch and script_text:
            sbatch = os.path.join(tmp, f"job-{args.job}.sbatch")
            with open(sbatch, "w") as f:
                f.write(script_text)
        ns = argparse.Namespace(
            config=args.config, sbatch=sbatch, expect_gpus=None, launcher=None, script_args=None, argv=[]
        )
        ctx = context_for(ns)
        found = run_checks([specs[c] for c in wanted], facts, ctx)
    return {f.id: f for f in found}


def job_record(job: str, usage_error: type[Exception]) -> dict:
    """The job's fields from `scontrol show job` (StdOut, StdErr, JobState, ExitCode, NodeList, Reason), or
    from `sacct` once the controller has forgotten it (no output paths there: the log must be given)."""
    from gpudoctor.probe.proc import run_bounded
    from gpudoctor.sanitize import clean

    try:
        r = run_bounded(["scontrol", "show", "job", job], SCONTROL_TIMEOUT_S, max_output=1 << 20)
    except subprocess.TimeoutExpired:
        raise usage_error(f"scontrol show job {job} did not answer within {SCONTROL_TIMEOUT_S:g} s") from None
    except OSError as e:
        raise usage_error(f"cannot run scontrol: {e.strerror or e}") from None
    if r.returncode == 0 and "JobId=" in r.stdout:
        return _fields(r.stdout)
    try:
        acct = run_bounded(
            ["sacct", "-j", job, "-X", "-n", "-P", "-o", "JobID,State,ExitCode,NodeList"],
            SCONTROL_TIMEOUT_S,
            max_output=1 << 20,
        )
    except (OSError, subprocess.TimeoutExpired):
        acct = None
    if acct is not None and acct.returncode == 0 and acct.stdout.strip():
        row = acct.stdout.strip().splitlines()[0].split("|")
        if len(row) >= 4:
            return {"JobId": row[0], "JobState": row[1], "ExitCode": row[2], "NodeList": row[3]}
    said = ((r.stderr or r.stdout).strip().splitlines() or [f"exited {r.returncode}"])[-1]
    raise usage_error(f"scontrol show job {job}: {clean(said)[:300]}")


def _fields(text: str) -> dict:
    out: dict[str, str] = {}
    for line in text.splitlines():
        stripped = line.strip()
        for key in ("StdOut", "StdErr", "Command", "WorkDir"):  # a path may hold spaces: the rest of the line
            if stripped.startswith(key + "="):
                out.setdefault(key, stripped[len(key) + 1 :])
                break
        else:
            for key, value in re.findall(r"(?:^|\s)([A-Za-z]+)=(\S*)", stripped):
                out.setdefault(key, value)
    return {k: v for k, v in out.items() if v not in ("", "(null)")}


def batch_script(job: str) -> str | None:
    """The batch script as submitted; None when it cannot be had (gpudoctor/probe/slurm.batch_script)."""
    from gpudoctor.probe.slurm import batch_script as written

    return written(job, SCONTROL_TIMEOUT_S)


def _job_finding(job: str, record: dict):
    from gpudoctor.model import Finding, Severity
    from gpudoctor.sanitize import clean

    state = clean(record.get("JobState", "unknown"))[:40]
    code = clean(record.get("ExitCode", "?"))[:20]
    nodes = clean(record.get("NodeList", "?"))[:120]
    evidence = {k: clean(v)[:300] for k, v in record.items() if k in ("JobState", "ExitCode", "Reason", "NodeList")}
    message = f"job {job}: {state}, exit code {code}, on {nodes}"
    return Finding("GD-DIAG-066", "log-slurm-job-record", "slurm", Severity.INFO, JOB_TITLE, message, evidence)


def _fix_command(args) -> str | None:
    """`gpudoctor fix --apply --sbatch F --config C` for the files the user named (a --job's script is a copy)."""
    if not (args.sbatch or args.config):
        return None
    from gpudoctor.model import Context
    from gpudoctor.report.preflight import fix_command

    return fix_command(Context(sbatch_path=args.sbatch, config_path=args.config))


def _emit(findings, scan, args, fix_command: str | None = None) -> int:
    import time

    from gpudoctor.model import exit_code
    from gpudoctor.report.emit import Output, emit
    from gpudoctor.report.result import Result, View
    from gpudoctor.sanitize import clean

    logs = ", ".join(clean(s) for s in scan.sources)
    header = f"gpudoctor diagnose: {len(scan.sources)} log(s), {scan.lines:,} line(s) ({clean(logs)[:160]})"
    view = View(
        header=header,
        subject="the job",
        notes=True,
        fails_mean="the first cause is named above",
        warns_mean="no known cause: read the log from the line named",
        fix_command=fix_command,
    )
    result = Result(
        findings,
        findings,
        int(exit_code(findings)),
        view=view,
        detail="all" if args.verbose else "default",
        source={"logs": list(scan.sources), "lines": scan.lines, "bytes": scan.size},
        extra={"diagnose": {"logs": list(scan.sources), "lines": scan.lines, "bytes": scan.size}},
        judged_at=time.time(),
    )
    emit(result, [Output("json" if args.json else "text")])
    return result.exit_code
