"""The judge of `gpudoctor diagnose`: pure, over what the reader kept (logread.Scan) and the signature table.

1. Every kept line a signature's keys and pattern match is an event; a line is one event, of the first row in
   the table's order that matches it (the more specific rows come first: GD-DIAG-004, several processes on one
   GPU, before GD-DIAG-029, any out-of-memory). A row with `needs` counts only where one of the rows it needs is
   in the log too (NCCL on a docker interface is a cause only where the network failed).
2. The first cause is the first `cause` event in the log's order (line order within a log, the logs in the
   order given), except that a hardware fault (a row of category "hardware": an Xid, an uncorrectable ECC
   error, a node failure) is the cause wherever it is: the kernel writes its log apart from the job's, and the
   CUDA errors the ranks print follow from it. With no cause, the first `hint` is named (a SIGKILL, a refused
   connection, an NCCL system error: known, but less sure), unless an unknown error comes before it.
3. What follows (`consequence` rows: watchdog timeouts, lost peers, torchrun's summary, srun's task lines)
   is said as such, one note per row; other causes after the first are notes too.
4. NCCL's watchdog lines give each rank's collective sequence number: the rank with the lowest is behind, and
   the others waited for it (GD-DIAG-055).
5. No cause: GD-DIAG-001 (warn) names the first error line, never a clean bill.
6. SLURM's record (`--job`): a state that is a cause in itself (TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, PREEMPTED)
   is the cause where the log names none, or only a hint.

A line is quoted only through redact.redact and sanitize.clean (a token in a traceback's locals, a URL's
userinfo, terminal escapes never reach the output).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpudoctor.checks.diagnose._signature import Signature
from gpudoctor.diagnose.logread import Line, Scan, exception
from gpudoctor.model import Finding, Fix, Location, Severity, manual
from gpudoctor.redact import redact
from gpudoctor.sanitize import bounded, clean

QUOTE_LIMIT = 300
MESSAGE_LIMIT = 120  # a finding's message is one line
UNKNOWN = "GD-DIAG-001"
BEHIND = "GD-DIAG-055"
VERSIONS = "GD-DIAG-024"
_TITLES = {
    UNKNOWN: ("log-cause-unknown", "distributed", "The failed job's log names a known cause"),
    BEHIND: ("log-rank-behind", "nccl", "No rank is behind the others in the collectives"),
}


# A traceback's source lines (`raise RuntimeError("... NCCL built in")`, rich's boxed frames) quote the message
# the exception line says itself, a line later: the exception line is the event.
_SOURCE_LINE = re.compile(r"\s*(?:raise\s|File \"|│|\u2502)")


@dataclass(frozen=True)
class Event:
    sig: Signature
    line: Line
    fields: dict[str, str] = field(default_factory=dict)


def cut(text: str, limit: int) -> str:
    """text within limit characters, an ellipsis where it was cut (a finding's message is one line)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def quote(line: Line) -> str:
    """A log line as gpudoctor may show it: secrets blanked, control bytes escaped, bounded."""
    return bounded(clean(redact(line.text.strip())), QUOTE_LIMIT)


def events(scan: Scan, table: Iterable[Signature]) -> list[Event]:
    """Every line a row matches, one event per line (the first row in table order), in the log's order."""
    taken: dict[int, Event] = {}
    for sig in table:
        if sig.id == VERSIONS:
            continue  # judged from all ranks' versions together (below)
        for key in sig.keys:
            for line in scan.found(key):
                if line.order in taken or _SOURCE_LINE.match(line.text):
                    continue
                m = sig.regex.search(line.text) if sig.regex else None
                if sig.regex and not m:
                    continue
                fields = {k: v for k, v in (m.groupdict() if m else {}).items() if v is not None}
                taken[line.order] = Event(sig, line, fields)
    present = {e.sig.id for e in taken.values()}
    found = sorted(
        (e for e in taken.values() if not e.sig.needs or present & set(e.sig.needs)), key=lambda e: e.line.order
    )
    versions = _versions(scan, table)
    return sorted([*found, *versions], key=lambda e: e.line.order)


def _versions(scan: Scan, table: Iterable[Signature]) -> list[Event]:
    sig = next((s for s in table if s.id == VERSIONS), None)
    if sig is None or len(scan.versions) < 2:
        return []
    lines = sorted(scan.versions.values(), key=lambda line: line.order)
    shown = ", ".join(f"{v} on {_who(line)}" for v, line in sorted(scan.versions.items()))
    return [Event(sig, lines[-1], {"versions": bounded(clean(shown), 200)})]


def _who(line: Line) -> str:
    parts = [line.who, clean(line.host) if line.host else ""]
    return " on ".join(p for p in parts if p) or line.where


def first_cause(found: list[Event], scan: Scan) -> Event | None:
    causes = [e for e in found if e.sig.role == "cause"]
    hardware = [e for e in causes if e.sig.category == "hardware"]
    if hardware:
        return hardware[0]
    if causes:
        return causes[0]
    hints = [e for e in found if e.sig.role == "hint"]
    if not hints:
        return None
    unknown = _first_error(scan, found)
    if unknown is not None and unknown.order < hints[0].line.order:
        return None
    return hints[0]


def _first_error(scan: Scan, found: list[Event], followers_too: bool = False) -> Line | None:
    """The first error line that is not a consequence's (a lost peer is not where to read); with
    followers_too, else the first line of any signature, else the first error line at all."""
    followers = {e.line.order for e in found if e.sig.role == "consequence"}
    first = next((line for line in scan.errors if line.order not in followers), None)
    if first is not None or not followers_too:
        return first
    if found:
        return found[0].line
    return scan.errors[0] if scan.errors else None


def _message(sig: Signature, fields: Mapping[str, str]) -> str:
    safe = {k: cut(clean(redact(v)), 60) for k, v in fields.items()}
    try:
        return sig.cause.format_map(_Blank(safe))
    except (ValueError, IndexError):
        return sig.cause


class _Blank(dict):
    def __missing__(self, key: str) -> str:
        return "?"


def _fix(sig: Signature) -> Fix:
    return manual(sig.fix, *sig.commands)


def _ranks(events: list[Event]) -> str:
    numbered = [e.line for e in events if e.line.rank is not None]
    if not numbered:
        return ""
    kind = numbered[0].rank_kind  # the lines of one log name their processes one way
    ranks = sorted({line.rank for line in numbered if line.rank_kind == kind and line.rank is not None})
    shown = ", ".join(str(r) for r in ranks[:8]) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
    return f"{kind}{'s' if len(ranks) > 1 else ''} {shown}"


def judge(
    scan: Scan,
    table: Iterable[Signature],
    preflight: Mapping[str, Finding] | None = None,
    job: Mapping[str, str] | None = None,
) -> list[Finding]:
    """The findings for the logs: the first cause (fail) or GD-DIAG-001 (warn), then what followed (info).
    preflight: findings of the checks a row names (check --sbatch's, on the job's script/config/snapshot),
    by id; a warn or fail among them gives the cause its line to change and its fix.
    job: SLURM's record of the job (scontrol/sacct: JobId, JobState, ExitCode, NodeList); a state that is itself
    a cause (TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, PREEMPTED) is the cause where the log names none surer."""
    table = tuple(table)
    found = events(scan, table)
    cause = first_cause(found, scan)
    out: list[Finding] = []
    behind = _behind(scan)
    by_id = {s.id: s for s in table}
    state = (job or {}).get("JobState", "").split(" ")[0].upper()
    from_slurm = by_id.get(STATE_CAUSES.get(state, ""))
    if from_slurm is not None and (cause is None or cause.sig.role == "hint"):
        out.append(_state_finding(from_slurm, job or {}))
        if cause is not None:
            found = [e for e in found if e is not cause]
            cause = None
        out.extend(_notes(found, None, followed_only=True))
        if behind is not None:
            out.append(_as_note(behind))
        return out
    if cause is not None:
        out.append(_cause_finding(cause, found, scan, preflight or {}))
        if behind is not None:
            out.append(_as_note(behind))
    elif behind is not None:  # the rank the others waited for: where the job stopped
        unknown = _unknown(scan, found)
        if "line" in unknown.evidence:
            behind.evidence["first_error"] = f"{unknown.evidence['line']}: {unknown.evidence.get('log', '')}"
        out.append(behind)
    else:
        out.append(_unknown(scan, found))
    out.extend(_notes(found, cause))
    return out


def _cause_finding(cause: Event, found: list[Event], scan: Scan, preflight: Mapping[str, Finding]) -> Finding:
    sig, line = cause.sig, cause.line
    same = [e for e in found if e.sig is sig]
    who = _who(line) if (line.rank is not None or line.host) else ""
    suffix = f" ({cut(who, 40)})" if who else ""
    message = cut(_message(sig, cause.fields), MESSAGE_LIMIT - len(suffix)) + suffix
    evidence: dict = {"line": line.where, "log": quote(line)}
    if cause.fields:
        evidence["read"] = ", ".join(f"{k}={cut(clean(redact(v)), 80)}" for k, v in sorted(cause.fields.items()))
    if line.rank is not None:
        evidence[_KEYS[line.rank_kind]] = line.rank
    if line.host:
        evidence["host"] = clean(line.host)
    if len(same) > 1:
        evidence["seen"] = f"{len(same)} lines ({_ranks(same) or 'no rank named'}), first at {line.where}"
    if sig.role == "hint":
        evidence["confidence"] = "a hint: no surer cause is in the log"
    followed = [e for e in found if e.sig.role == "consequence" and e.line.order > line.order]
    if followed:
        names = sorted({e.sig.name for e in followed})
        evidence["followed"] = f"{len(followed)} line(s) after it: {', '.join(names)}"
    root = _torchrun_root(scan)
    if root and line.rank_kind == "rank" and scan.root_cause.get("rank", "").split(" ")[0] != str(line.rank):
        evidence["torchrun_root_cause"] = f"{root} (only the first to exit)"
    evidence["source"] = sig.source
    if sig.check:
        evidence["caught_before_submission_by"] = ", ".join(sig.check)
    if sig.versions != "all":
        evidence["versions"] = sig.versions
    fix, location = _fix(sig), Location(line.source, line.number)
    joined = [preflight[c] for c in sig.check if c in preflight and preflight[c].severity in _JOINED]
    joined.sort(key=lambda f: -f.severity.rank)  # a fail before a warn; else the row's order (most specific first)
    if joined:
        pre = joined[0]
        evidence["before_submission"] = bounded(clean(f"{pre.id}: {pre.message}"), QUOTE_LIMIT)
        if pre.fix is not None:
            fix = pre.fix
        if pre.location is not None:
            location = pre.location
            evidence["change"] = f"{pre.location.file}:{pre.location.line}" if pre.location.line else pre.location.file
    return Finding(sig.id, sig.name, sig.category, Severity.FAIL, sig.title, message, evidence, fix, location)


_JOINED = (Severity.WARN, Severity.FAIL)
_KEYS = {"rank": "rank", "local rank": "local_rank", "task": "task"}  # the evidence key of a line's number
# SLURM's job states that are causes in themselves (sacct(1), JOB STATE CODES), by the row that says them
STATE_CAUSES = {
    "TIMEOUT": "GD-DIAG-039",
    "DEADLINE": "GD-DIAG-039",
    "OUT_OF_MEMORY": "GD-DIAG-027",
    "NODE_FAIL": "GD-DIAG-042",
    "PREEMPTED": "GD-DIAG-043",
}


def _state_finding(sig: Signature, job: Mapping[str, str]) -> Finding:
    fields = {"job": job.get("JobId", "?"), "node": job.get("NodeList", "?")}
    state = clean(job.get("JobState", ""))[:40]
    evidence = {"slurm": f"JobState={state}, ExitCode={clean(job.get('ExitCode', '?'))[:20]}", "source": sig.source}
    if sig.check:
        evidence["caught_before_submission_by"] = ", ".join(sig.check)
    message = cut(f"{_message(sig, fields)} (SLURM: {state})", 120)
    return Finding(sig.id, sig.name, sig.category, Severity.FAIL, sig.title, message, evidence, _fix(sig), None)


_WAITING = ("log-collective-timeout", "log-nccl-watchdog-timeout")


def _torchrun_root(scan: Scan) -> str:
    rc = scan.root_cause
    if not rc.get("rank"):
        return ""
    parts = [f"rank {rc['rank']}"]
    if rc.get("host"):
        parts.append(f"on {rc['host']}")
    if rc.get("exitcode"):
        parts.append(f"exitcode {rc['exitcode']}")
    return bounded(clean(redact(" ".join(parts))), 160)


def _unknown(scan: Scan, found: list[Event]) -> Finding:
    name, category, title = _TITLES[UNKNOWN]
    first = _first_error(scan, found, followers_too=True)
    evidence: dict = {}
    hints = [e for e in found if e.sig.role == "hint"]
    if first is not None:
        exc = exception(first)
        who = f" ({_who(first)})" if first.rank is not None or first.host else ""
        message = f"no known cause; the first error is at line {first.number}{who}"
        said = (f"{exc[0]}: {exc[1]}" if exc[1] else exc[0]) if exc else first.text.strip()
        message += f": {cut(clean(redact(said)), max(20, 118 - len(message)))}"
        evidence.update(line=first.where, log=quote(first))
        if first.rank is not None:
            evidence[_KEYS[first.rank_kind]] = first.rank
        location: Location | None = Location(first.source, first.number)
    else:
        message = f"no known cause and no error line in {scan.lines} line(s): the log does not say why the job ended"
        location = None
    evidence.update(lines_read=scan.lines, logs=bounded(", ".join(clean(s) for s in scan.sources), 300))
    if hints:
        evidence["hint"] = f"{hints[0].sig.name} at {hints[0].line.where}: {quote(hints[0].line)}"
    root = _torchrun_root(scan)
    if root:
        evidence["torchrun_root_cause"] = f"{root} (only the first to exit)"
    followed = [e for e in found if e.sig.role == "consequence"]
    if followed:
        evidence["followed"] = f"{len(followed)} line(s): {', '.join(sorted({e.sig.name for e in followed}))}"
    timeouts = {e.line.rank for e in followed if e.sig.name in _WAITING}
    if timeouts and (not first or first.order in {e.line.order for e in followed}):
        fix = manual(
            "Every rank that printed only timed out waiting: a hang or a collective mismatch; rerun with "
            "TORCH_DISTRIBUTED_DEBUG=DETAIL (names a mismatch) and TORCH_NCCL_DUMP_ON_TIMEOUT=1"
        )
    else:
        fix = manual(
            "Read the log from the line named; a known failure missing here is a new signature row (docs/diagnose.md)"
        )
    return Finding(UNKNOWN, name, category, Severity.WARN, title, message, evidence, fix, location)


def _behind(scan: Scan) -> Finding | None:
    """The rank whose collectives are behind the others' (the lowest SeqNum in the watchdog lines)."""
    work = scan.work
    if not work:
        return None
    name, category, title = _TITLES[BEHIND]
    low = min(work.values(), key=lambda w: (w.seq, w.line.order))
    lowest = [r for r, w in work.items() if w.seq == low.seq]
    ahead = {r: w for r, w in work.items() if w.seq > low.seq}
    silent = sorted(scan.ranks - set(work))
    evidence: dict = {
        "sequence_numbers": bounded(", ".join(f"rank {r}: {w.seq}" for r, w in sorted(work.items())), 400),
        "line": low.line.where,
        "log": quote(low.line),
    }
    if ahead:
        rank = lowest[0] if len(lowest) == 1 else None
        who = f"rank {rank}" if rank is not None else f"ranks {', '.join(map(str, sorted(lowest)[:8]))}"
        op = f" ({low.op})" if low.op else ""
        furthest = max(w.seq for w in ahead.values())
        message = f"{who} is behind: its collectives stop at SeqNum {low.seq}{op}, the others reached {furthest}"
        if rank is not None:
            evidence["rank"] = rank
    elif silent:
        shown = ", ".join(map(str, silent[:8]))
        message = f"ranks {shown} never timed out while the others waited at SeqNum {low.seq}: they were behind"
    else:
        return None
    fix = manual(
        "Read what the rank behind did after its last collective (its own error above, py-spy dump on a live job)"
    )
    return Finding(
        BEHIND, name, category, Severity.FAIL, title, message, evidence, fix, Location(low.line.source, low.line.number)
    )


def _as_note(f: Finding) -> Finding:
    from dataclasses import replace

    return replace(f, severity=Severity.INFO, fix=None)


def _notes(found: list[Event], cause: Event | None, followed_only: bool = False) -> list[Finding]:
    """One note per row besides the cause's: what followed it, and other causes after it (with followed_only,
    a cause known from elsewhere: every row's lines followed it)."""
    notes: list[Finding] = []
    by_sig: dict[str, list[Event]] = {}
    for e in found:
        if cause is not None and e.sig is cause.sig:
            continue
        by_sig.setdefault(e.sig.id, []).append(e)
    for rows in by_sig.values():
        sig, first = rows[0].sig, rows[0].line
        ranks = _ranks(rows)
        role = "followed" if followed_only else {"consequence": "followed", "cause": "also", "hint": "also"}[sig.role]
        if cause is not None and sig.role == "consequence" and first.order < cause.line.order:
            role = "also"  # printed before the cause (interleaved ranks): still a consequence of a failure
        where = f"{len(rows)} line(s){' on ' + ranks if ranks else ''}, first at {first.where}"
        suffix = f" ({cut(ranks, 40)})" if ranks else ""
        message = cut(f"{role}: {_message(sig, rows[0].fields)}", MESSAGE_LIMIT - len(suffix)) + suffix
        evidence = {"seen": where, "log": quote(first), "role": sig.role}
        notes.append(Finding(sig.id, sig.name, sig.category, Severity.INFO, sig.title, message, evidence, None, None))
    return notes
