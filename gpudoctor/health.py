"""`gpudoctor health`: this node's verdict for SLURM's HealthCheckProgram and Prolog (docs/integrations-slurm.md).

It runs only the checks about the machine and node (registry scopes "machine" and "node": driver, GPUs,
torch install, hardware counters, CPUs, memory, network), not those about a job's settings ("job": the
batch script, the launcher, the training config), within a time budget: every probe gets what is left
of --budget, and a probe that overruns it is a failure (a node whose NVML or /proc hangs is not
healthy). LBNL NHC's watchdog is 30 s by default (its README, "Supported Variables": TIMEOUT) and slurmd
kills the HealthCheckProgram after 60 s (slurm.conf(5)); the default budget here is well inside both.

Exit codes: 0 healthy (no fail; a warn does not take a node out of service), 1 a fail, a check that could
not run (error: never a pass) or the budget overrun, 2 bad input, 3 internal error. In a Prolog, 1 is what
makes slurmd drain the node and requeue the job held (slurm.conf(5), Prolog). With --drain a failing run
sets the node to DRAIN with a reason naming the check ("gpudoctor GD-DRV-001: ..."); with --resume a passing
run resumes the node only when its reason is ours (NHC's node-mark-online rule: a node drained by someone
else stays drained).
"""

from __future__ import annotations

import argparse
import re
import time
from dataclasses import dataclass

from gpudoctor.model import BLOCKING, ExitCode, Finding, Severity

HELP = "the node's verdict for SLURM's HealthCheckProgram/Prolog; --drain takes a failing node out of service"
DEFAULT_BUDGET_S = 10.0
MAX_BUDGET_S = 55.0  # slurmd kills the HealthCheckProgram at 60 s: leave room for scontrol
NODE_SCOPES = ("machine", "node")
# check's options that mean the same here (shared argparse actions: one definition of each)
_SHARED = ("snapshot", "python", "select", "ignore", "expect_gpus")
_NODE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")  # one node: it goes into NodeName= of an scontrol argument


def _budget(text: str) -> float:
    from gpudoctor.readers.ints import number_option

    return number_option(0.0, MAX_BUDGET_S, what="seconds (slurmd kills the health check at 60 s)")(text)


def add_arguments(p: argparse.ArgumentParser, check_parser: argparse.ArgumentParser) -> None:
    for action in check_parser._actions:
        if action.dest in _SHARED:
            p._add_action(action)
    p.add_argument(
        "--budget",
        type=_budget,
        default=DEFAULT_BUDGET_S,
        metavar="S",
        help=f"seconds for probing and judging; a probe past it is a failure (default {DEFAULT_BUDGET_S:g})",
    )
    p.add_argument(
        "--drain",
        action="store_true",
        help='on a fail: scontrol update NodeName=<node> State=DRAIN Reason="gpudoctor GD-...: ..."',
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="when healthy: resume the node if gpudoctor drained it (a reason of anyone else's is left alone)",
    )
    p.add_argument("--node", metavar="NAME", help="this node's SLURM name (default: SLURMD_NODENAME, else found)")
    p.add_argument("--json", action="store_true", help="print the gpudoctor.report/1 JSON object with a health part")


def node_checks(specs) -> list:
    """The checks about this machine and node that `check` judges from facts; those that need a training
    config are about a job, not the node."""
    return [s for s in specs if s.scope in NODE_SCOPES and s.judged_by_check and "loader-settings" not in s.requires]


def overrun_sections(facts) -> list[str]:
    """Fact sections whose probe did not finish within the budget."""
    out = []
    for name in facts.sections:
        section = facts.sections[name]
        if isinstance(section, dict) and (section.get("timed_out") or section.get("status") == "timeout"):
            out.append(name)
    return out


@dataclass(frozen=True)
class Verdict:
    fails: list[Finding]
    warns: list[Finding]
    overrun: list[str]  # probes past the budget
    budget: float

    @property
    def healthy(self) -> bool:
        return not self.fails and not self.overrun

    def reason(self) -> str:
        from gpudoctor.nodestate import REASON_PREFIX, drain_reason

        if self.fails:
            first = self.fails[0]
            return drain_reason(first.id, first.message, more=len(self.fails) - 1)
        return f"{REASON_PREFIX}budget: {', '.join(self.overrun)} probe over {self.budget:g} s"[:100]


def judge(findings: list[Finding], overrun: list[str], budget: float) -> Verdict:
    return Verdict(
        # a check that could not run (error) is never a pass: it fails the node's verdict as a fail does
        fails=[f for f in findings if f.severity in BLOCKING],
        warns=[f for f in findings if f.severity is Severity.WARN],
        overrun=overrun,
        budget=budget,
    )


def run(args) -> int:
    from gpudoctor.inputs import UsageError, specs_for
    from gpudoctor.model import Context
    from gpudoctor.runner import run_checks

    started = time.monotonic()
    if args.snapshot and args.python:
        raise UsageError("--snapshot replays recorded facts; it cannot be combined with --python")
    if args.node is not None and not _NODE_NAME.match(args.node):
        raise UsageError(f"--node {args.node!r}: expected one SLURM node name (letters, digits, '.', '_', '-')")
    specs = node_checks(specs_for(args))
    if not specs:  # --select named only checks about a job: an empty run would say "healthy"
        raise UsageError("--select: none of these checks is about the node (scope machine or node; see gpudoctor list)")
    facts = _facts(args, specs, started)
    findings = run_checks(specs, facts, Context(expect_gpus=args.expect_gpus))
    verdict = judge(findings, [] if args.snapshot else overrun_sections(facts), args.budget)
    elapsed = time.monotonic() - started
    action = _act(args, verdict) if (args.drain or args.resume) else None
    from gpudoctor.report.emit import Output, emit
    from gpudoctor.report.result import Result

    health = {"healthy": verdict.healthy, "seconds": round(elapsed, 3), "budget_seconds": args.budget}
    health.update({"overrun": verdict.overrun, "reason": None if verdict.healthy else verdict.reason()})
    health["slurm"] = action
    host = facts.host.get("hostname")
    code = ExitCode.OK if verdict.healthy else ExitCode.FAIL
    result = Result(
        findings,
        verdict.fails,
        int(code),
        kind="health",
        source={"snapshot": args.snapshot, "hostname": host},
        extra={"health": health},
        hostname=host,
        seconds=elapsed,
    )
    emit(result, [Output("json" if args.json else "text")])
    return code


def _facts(args, specs, started: float):
    from gpudoctor.facts import Facts, SnapshotError
    from gpudoctor.inputs import UsageError, probe_kwargs

    if args.snapshot:
        try:
            return Facts.load(args.snapshot)
        except SnapshotError as e:
            raise UsageError(str(e)) from None
    from gpudoctor.probe import collect

    left = max(0.1, args.budget - (time.monotonic() - started))
    kw = probe_kwargs(argparse.Namespace(python=args.python, torch_timeout=None))
    return collect({n for s in specs for n in s.needs}, torch_timeout=left, probe_timeout=left, **kw)


def _act(args, verdict: Verdict) -> dict:
    """Drain (a fail, --drain) or resume (healthy, --resume, drained by us); never touches a node that is
    offline for someone else's reason. Returns what was done, for the report; SLURM errors are reported,
    not raised (the verdict stands)."""
    from gpudoctor import nodestate

    name = args.node
    try:
        name = nodestate.this_node(args.node)
        before = nodestate.read(name)
        if not verdict.healthy and args.drain:
            if before.offline and before.reason and not before.ours:
                return _done(name, "left", f"already {before.state} for another reason: {before.reason}")
            reason = verdict.reason()
            nodestate.drain(name, reason)
            return _done(name, "drained", reason)
        if verdict.healthy and args.resume:
            if before.offline and before.ours:
                nodestate.resume(name)
                return _done(name, "resumed", f"its reason was ours: {before.reason}")
            why = "not drained" if not before.offline else f"{before.state} for another reason: {before.reason}"
            return _done(name, "left", why)
        return _done(name, "left", "nothing to do")
    except nodestate.NodeStateError as e:
        return {"node": name, "action": "error", "detail": str(e)}


def _done(node: str, action: str, detail: str) -> dict:
    return {"node": node, "action": action, "detail": detail}
