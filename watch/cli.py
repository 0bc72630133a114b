"""`gpudoctor watch --job JOBID [--for 30s] [--json] [--log FILE] [--prometheus FILE]`: judge a running SLURM job
from outside.

1. Resolve the job on the login node: `scontrol show job -d JOBID` (readers/slurmfmt.job_detail: its state,
   nodes and the GPU indices it holds on each), and the batch script SLURM keeps for it (`scontrol write
   batch_script JOBID -`).
2. Run one probe per node inside the job: `srun --jobid JOBID --overlap -N <nodes> --ntasks-per-node=1
   python -m gpudoctor.watch.node ...` (node.py). It needs the user's own job and SLURM >= 20.11 (--overlap).
   Seen on slurm-wlm 22.05 (tests/watch/test_watch_slurm.py and docs/watch.md): without --overlap the step
   waits ("Requested nodes are busy") while the job's own step holds the node; with it and no --gres, the step
   is given every GPU the job holds on the node (SLURM_STEP_GPUS and CUDA_VISIBLE_DEVICES list them all, even
   those another step of the job holds), and with --gres=none none. So no --gres is passed: where devices are
   constrained (task/cgroup ConstrainDevices=yes) a step's cgroup holds the GPUs the step is given, which is
   what lets NVML open them -- the test cluster does not constrain devices (task/none), so that part rests on
   SLURM's rule, not on a run here.
   The python on the nodes is this interpreter (a shared file system) or --python.
3. Judge (judge.py) and report as `check` does: the same findings, text or --json (gpudoctor.report/1), exit
   codes 0 (no fail), 1 (a fail; a warn with --strict), 2 (bad input: one line), 3 (internal error). A node
   that does not answer is GD-WATCH-006, "could not observe", never healthy.

The batch script is judged by the batch-script checks themselves (judge.CAUSE_CHECKS: GD-SLURM-003, -010, -005
run through the registry on the script's text), so the corrected lines are theirs; their fix edits the script
file when the file SLURM names (Command=) still holds the text the job was submitted with, and is given as
lines to write otherwise.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from typing import TYPE_CHECKING

from gpudoctor.model import ActionKind, Finding, Fix, Safety, Severity

if TYPE_CHECKING:  # imported by probe_nodes, which reads them: the parser (`watch --help`) does not need them
    from gpudoctor.watch.samples import NodeObservation

HELP = "judge a running SLURM job by its id: idle allocated GPUs, stray processes, throttling, memory creep"
DEFAULT_WINDOW_S = 30.0
MAX_WINDOW_S = 3600.0
SCONTROL_TIMEOUT_S = 10.0
OUTPUT_PER_NODE = 16 * 2**20  # node.MAX_SAMPLES per GPU, 8 GPUs: about 8 MiB of JSON
SRUN_MARGIN_S = 60.0  # srun's own start and the probe's Python start, beyond the window
# A job id as SLURM writes it: a positive whole number, an array task 123_4, a het job's component 123+1. ASCII
# digits only, the whole text (fullmatch: `$` would let a trailing newline through); 0 is no job (`scontrol show
# job 0` lists every job).
_JOB_ID = re.compile(r"[1-9][0-9]{0,11}(?:_[0-9]{1,9}|\+[0-9]{1,4})?")
_UNITS = {"": 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def _duration(text: str) -> float:
    """30s, 2m, 45: the number through the command line's one parser (readers/ints.option_number), then a unit."""
    from gpudoctor.readers.ints import option_number, shown_option

    number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    value = option_number(number)
    unit = _UNITS.get(text[len(number) :])
    if value is None or unit is None:
        raise argparse.ArgumentTypeError(f"expected a duration such as 30s, 2m or 45, got {shown_option(text)}")
    value *= unit
    if not 0 < value <= MAX_WINDOW_S:
        raise argparse.ArgumentTypeError(
            f"expected more than 0 s and at most {MAX_WINDOW_S:g} s, got {shown_option(text)}"
        )
    return value


def _rate(text: str) -> float:
    from gpudoctor.readers.ints import number_option

    return number_option(0.01, 10.0, what="samples per second", low_open=False)(text)


def add_arguments(p: argparse.ArgumentParser, check_parser: argparse.ArgumentParser) -> None:
    p.add_argument("--job", metavar="JOBID", help="the running SLURM job (default: SLURM_JOB_ID, inside a job)")
    p.add_argument(
        "--for",
        dest="window",
        type=_duration,
        default=DEFAULT_WINDOW_S,
        metavar="DURATION",
        help=f"how long to sample each node (30s, 2m; default {DEFAULT_WINDOW_S:g}s)",
    )
    p.add_argument("--rate", type=_rate, default=1.0, metavar="HZ", help="NVML samples per second (default 1)")
    p.add_argument("--json", action="store_true", help="print the gpudoctor.report/1 JSON object")
    p.add_argument("--log", metavar="FILE", help="write the NVML samples as JSON lines (one per GPU and sample)")
    p.add_argument(
        "--prometheus",
        metavar="FILE",
        help="also write the verdict in node_exporter's textfile format (metrics gpudoctor_watch_*), atomically",
    )
    p.add_argument("--python", metavar="PATH", help="the python that runs the probe on the nodes (default: this one)")
    p.add_argument("--strict", action="store_true", help="exit 1 on a warn too")


def run(args) -> int:
    from gpudoctor.inputs import UsageError

    job = args.job if args.job is not None else os.environ.get("SLURM_JOB_ID")
    if job is None:
        raise UsageError("watch: --job JOBID is required outside a SLURM job")
    if not _JOB_ID.fullmatch(job):
        source = "--job" if args.job is not None else "SLURM_JOB_ID"
        raise UsageError(
            f"{source} {_shown(job)}: expected a SLURM job id (a positive number, an array task 123_4, a het job 123+1)"
        )
    python = args.python or sys.executable
    if args.python is not None and not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise UsageError(f"--python {_shown(python)}: not an executable file")
    _check_outputs(args, UsageError)
    detail = resolve(job, UsageError)
    # an array task (123_4) runs as a job of its own id (JobId=), which its processes carry in SLURM_JOB_ID
    job = detail.job_id
    script_text = batch_script(job) if detail.batch else None
    nodes = probe_nodes(job, detail, args.window, args.rate, python)
    from gpudoctor.watch.judge import judge

    findings = judge(nodes, script_causes(job, detail.command, script_text, detail.work_dir))
    findings = ended_during_watch(findings, job, still(job))
    if args.log is not None:
        from gpudoctor.fileio import write_output
        from gpudoctor.watch.samples import log_lines

        lines = [line for n in nodes for line in log_lines(n, job)]
        write_output(args.log, "".join(line + "\n" for line in lines), what="--log")
    result = _result(findings, job, detail, nodes, args)
    from gpudoctor.report.emit import Output, emit

    prometheus = [Output("prometheus", args.prometheus)] if args.prometheus is not None else []
    emit(result, [*prometheus, Output("json" if args.json else "text")])
    return result.exit_code


def _check_outputs(args, usage_error: type[Exception]) -> None:
    """--log and --prometheus name a file to write: an unusable one (empty, a directory, a missing directory)
    is one line and exit 2 before the window is spent, never ignored (issue 35 item 5)."""
    for option, path in (("--log", args.log), ("--prometheus", args.prometheus)):
        if path is None:
            continue
        if not path.strip():
            raise usage_error(f"{option} {_shown(path)}: an empty path; name a file")
        if "\0" in path:
            raise usage_error(f"{option} {_shown(path)}: not a usable path")
        if os.path.isdir(path):
            raise usage_error(f"{option} {_shown(path)}: is a directory; name a file")
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise usage_error(f"{option} {_shown(path)}: no directory {_shown(parent)}")


def _shown(text: str) -> str:
    from gpudoctor.sanitize import clean

    return repr(clean(text)[:60])


def resolve(job: str, usage_error: type[Exception]):
    """The job's placement from scontrol; a job that is not running, or unknown, is bad input (one line)."""
    from gpudoctor.probe.proc import run_bounded
    from gpudoctor.readers.slurmfmt import SlurmFormatError, job_detail
    from gpudoctor.sanitize import clean

    try:
        r = run_bounded(["scontrol", "show", "job", "-d", job], SCONTROL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise usage_error(f"scontrol show job {job} did not answer within {SCONTROL_TIMEOUT_S:g} s") from None
    except OSError as e:
        raise usage_error(f"cannot run scontrol: {e.strerror or e}") from None
    if r.returncode != 0:
        said = ((r.stderr or r.stdout).strip().splitlines() or [f"exited {r.returncode}"])[-1]
        raise usage_error(f"scontrol show job {job}: {clean(said)[:300]}")
    try:
        detail = job_detail(r.stdout, job)
    except SlurmFormatError as e:
        raise usage_error(clean(str(e))) from None
    if detail.state != "RUNNING":
        raise usage_error(f"job {job} is {clean(detail.state or 'in an unknown state')}, not RUNNING: nothing to watch")
    return detail


GONE = "GONE"  # still()'s state for a job the controller no longer lists


def still(job: str):
    """The job's record now (after the window); a record in state GONE when the controller no longer lists it
    (a finished job is kept MinJobAge seconds, 300 by default); None when it cannot be asked."""
    from gpudoctor.probe.proc import run_bounded
    from gpudoctor.readers.slurmfmt import JobDetail, SlurmFormatError, job_detail

    try:
        r = run_bounded(["scontrol", "show", "job", "-d", job], SCONTROL_TIMEOUT_S)
        if r.returncode != 0 and "invalid job id" in (r.stderr + r.stdout).lower():
            # it was RUNNING when the watch began: gone from the list means it ended and MinJobAge passed
            return JobDetail(job, GONE, (), {}, False, None, None)
        return job_detail(r.stdout, job) if r.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, SlurmFormatError):
        return None


def ended_during_watch(findings: list[Finding], job: str, now) -> list[Finding]:
    """A job that ended during the window (the controller's record after it): a node that did not answer for that
    reason is said to have ended, with its state and end time, instead of "could not observe" (issue 35 item 7);
    where every node answered, the end is said once (GD-WATCH-006 in place of its pass): what was seen is what
    the job did before it ended. COMPLETED is a note; any other end (FAILED, CANCELLED, TIMEOUT, NODE_FAIL,
    OUT_OF_MEMORY, ...) a warn. A job still RUNNING, or one the controller cannot tell of, keeps the findings."""
    if now is None or now.state == "RUNNING":
        return findings
    from gpudoctor.sanitize import clean
    from gpudoctor.watch.verdict import make

    state = clean(now.state or "ended")[:40]
    when = f" at {clean(now.end_time)[:40]}" if now.end_time else ""
    severity = Severity.INFO if state in ("COMPLETED", GONE) else Severity.WARN
    if state == GONE:
        state, when = "no longer in the controller's list", ""
    ended = {"state": state, "end_time": now.end_time}
    out, said = [], False
    for f in findings:
        if f.id == "GD-WATCH-006" and f.severity is Severity.FAIL:
            node = f.evidence.get("node")
            message = f"{node}: job {job} ended during the watch ({state}{when}); nothing more to observe"
            f = make("GD-WATCH-006", severity, message, None, node=node, error=f.evidence.get("error"), ended=ended)
            said = True
        elif f.id == "GD-WATCH-006" and f.severity is Severity.PASS:
            continue
        out.append(f)
    if not said:
        message = f"job {job} ended during the watch ({state}{when}): what was seen is what it did before it ended"
        out.append(make("GD-WATCH-006", severity, message, None, ended=ended))
    return out


def batch_script(job: str) -> str | None:
    """The batch script as submitted; None when it cannot be had (gpudoctor/probe/slurm.batch_script)."""
    from gpudoctor.probe.slurm import batch_script as written

    return written(job, SCONTROL_TIMEOUT_S)


def script_causes(job: str, command: str | None, text: str | None, work_dir: str | None = None) -> list[Finding]:
    """The batch-script checks that explain idle GPUs (judge.CAUSE_CHECKS), run on the submitted text with the
    program it launches read from the job's working directory (readers/program.py: what the program does with
    its process decides whether more tasks are a fix, README "Do no harm"); their note, warn and fail findings.
    Their fixes edit `command` when that file still holds this text, else are lines."""
    if not text:
        return []
    import tempfile

    from gpudoctor.facts import Facts
    from gpudoctor.model import Context
    from gpudoctor.readers.sbatch import SbatchError, parse_sbatch
    from gpudoctor.registry import load_all
    from gpudoctor.runner import run_checks
    from gpudoctor.watch.judge import CAUSE_CHECKS

    same_file = False
    if command and os.path.isfile(command):
        try:
            from gpudoctor.fileio import read_input

            same_file = read_input(command, "batch script") == text
        except (OSError, UnicodeDecodeError):
            same_file = False
    with tempfile.TemporaryDirectory(prefix="gpudoctor-watch-") as tmp:
        path = command if same_file and command else os.path.join(tmp, f"job-{job}.sbatch")
        if not same_file:
            with open(path, "w") as f:
                f.write(text)
        try:
            sbatch = parse_sbatch(text, path)
        except SbatchError:
            return []
        from dataclasses import replace

        from gpudoctor.readers.program import launched_program

        base = work_dir or (os.path.dirname(os.path.abspath(command)) if command else None)
        sbatch = replace(sbatch, program=launched_program(sbatch, base))
        specs = load_all()
        # Context.sbatch holds the parsed BatchScript, as inputs.context_for passes it (its annotation says dict)
        ctx = Context(sbatch=sbatch, sbatch_path=path)
        # judged as a script before submission: no environment of this machine enters the verdict
        facts = Facts(sections={"env": {"vars": {}}})
        found = run_checks([specs[c] for c in CAUSE_CHECKS if c in specs], facts, ctx)
    causes = [f for f in found if f.severity in (Severity.INFO, Severity.WARN, Severity.FAIL)]
    return causes if same_file else [_as_lines(f) for f in causes]


def _as_lines(f: Finding) -> Finding:
    """A cause whose fix edits a copy of the script: the same fix as lines for the user to write."""
    from dataclasses import replace

    from gpudoctor.model import Action
    from gpudoctor.watch.judge import fix_line

    if f.fix is None or all(a.kind is ActionKind.COMMAND for a in f.fix.actions):
        return replace(f, location=None)
    actions = tuple(Action(ActionKind.COMMAND, fix_line(a)) for a in f.fix.actions)
    return replace(f, fix=Fix(f.fix.title + " (in the batch script)", Safety.MANUAL, actions), location=None)


def probe_nodes(job: str, detail, window: float, rate: float, python: str) -> list[NodeObservation]:
    """One probe per node through srun; a node without an answer is an observation with its error."""
    import json

    from gpudoctor.probe.proc import run_bounded
    from gpudoctor.readers.slurmfmt import compress_hostlist
    from gpudoctor.sanitize import clean
    from gpudoctor.watch.samples import NodeObservation

    nodes = list(detail.nodes)
    allocation = json.dumps({n: list(detail.gpus.get(n, ())) for n in nodes})
    cmd = [
        "srun",
        "--jobid",
        job,
        "--overlap",
        "-N",
        str(len(nodes)),
        "--ntasks-per-node=1",
        f"--nodelist={compress_hostlist(nodes)}",
        "--kill-on-bad-exit=0",
        python,
        "-m",
        "gpudoctor.watch.node",
        "--job",
        job,
        "--for",
        f"{window:g}",
        "--rate",
        f"{rate:g}",
        "--allocation",
        allocation,
        *(["--uid", str(detail.uid)] if detail.uid is not None else []),
    ]
    # srun reads its options from SLURM_*/SRUN_* too: those of a job this command runs in must not reach the step
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SRUN_", "SBATCH_", "SALLOC_"))}
    if os.environ.get("SLURM_CONF"):
        env["SLURM_CONF"] = os.environ["SLURM_CONF"]
    timeout = window + SRUN_MARGIN_S
    answered: dict[str, NodeObservation] = {}
    errors: dict[str, str] = {}
    problem = None
    try:
        r = run_bounded(cmd, timeout, env=env, max_output=OUTPUT_PER_NODE * len(nodes))
        for line in r.stdout.splitlines():
            if line.startswith("{"):
                try:
                    obs = NodeObservation.from_dict(json.loads(line))
                except (ValueError, KeyError, TypeError):
                    continue
                if obs.node in nodes:
                    answered[obs.node] = obs
        if r.returncode != 0 or len(answered) < len(nodes):
            said = r.stderr.strip().splitlines()
            last = (said or [f"srun exited {r.returncode}"])[-1]
            problem = f"the probe gave no answer (srun: {clean(last)[:300]})"
            for n in nodes:  # srun names the node a task failed on: that line is this node's reason
                own = [line for line in said if re.search(rf"\b{re.escape(n)}\b", line)]
                if n not in answered and own:
                    errors[n] = f"the probe gave no answer (srun: {clean(own[-1])[:300]})"
    except subprocess.TimeoutExpired:
        problem = f"the probe did not answer within {timeout:g} s (srun killed)"
    except OSError as e:
        problem = f"cannot run srun: {e.strerror or e}"
    return [
        answered.get(n)
        or NodeObservation(node=n, allocated=tuple(detail.gpus.get(n, ())), error=errors.get(n, problem or "no answer"))
        for n in nodes
    ]


def fix_command(command: str | None) -> str | None:
    """The `gpudoctor fix` line for the job's batch script (scontrol's Command=), shell-quoted: a fix that edits
    the script is written there, never on this machine (issue 35 item 9). None when SLURM names no script."""
    if not command:
        return None
    from gpudoctor import shellquote

    return shellquote.command(["gpudoctor", "fix", "--apply", "--sbatch", command])


def _result(findings: list[Finding], job: str, detail, nodes: list[NodeObservation], args):
    """What the watch's outputs show: every finding counts; the JSON's "watch" object, the text's header."""
    import time

    from gpudoctor.model import exit_code
    from gpudoctor.report.result import Result, View
    from gpudoctor.sanitize import clean

    answered = [n for n in nodes if n.observed]
    watch = {
        "job": job,
        "nodes": list(detail.nodes),
        "allocated": {n: list(g) for n, g in detail.gpus.items()},
        "window_s": args.window,
        "rate_hz": args.rate,
        "answered": [n.node for n in answered],
    }
    gpus = sum(len(g) for g in detail.gpus.values())
    header = (
        f"gpudoctor watch: job {job} on {len(detail.nodes)} node(s) ({clean(','.join(detail.nodes))[:200]}), "
        f"{gpus} GPU(s), sampled {args.window:g} s"
    )
    view = View(
        header=header,
        subject=f"job {job}",
        notes=True,
        fails_mean="it does not run as intended",
        fix_command=fix_command(detail.command),
    )
    code = int(exit_code(findings, strict=args.strict))
    return Result(
        findings,
        findings,
        code,
        view=view,
        source={"job": job},
        extra={"watch": watch},
        judged_at=time.time(),
        metric_prefix="gpudoctor_watch",
    )
