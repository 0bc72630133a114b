"""The shape of a row of `gpudoctor diagnose`'s signature table, and its registration as a verdict.

A signature is data: literal keys a log line must contain (found by a byte search over the log, so a
multi-GB log costs a few passes of `bytes.find`), an optional regular expression over that line (its named
groups fill the message), what it means (the cause, or a consequence of another cause), the source that
established it, the fix, the gpudoctor check that would have caught it before submission, and the torch/NCCL
versions that print it. Each row is declared as a verdict of source "diagnose" by its topic module
(registry.declare), so
`gpudoctor list`, `gpudoctor explain GD-DIAG-0NN` and docs/checks.md show it like a check; the judge is in
gpudoctor.diagnose (diagnose/judge.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from gpudoctor.registry import Verdict

# cause: names the first cause; consequence: what follows a cause elsewhere (a watchdog timeout after a rank
# died); hint: named only when the log holds no cause (a retried connection that may still have succeeded)
ROLES = ("cause", "consequence", "hint")


@dataclass(frozen=True)
class Signature:
    id: str
    name: str
    category: str
    title: str  # the invariant, as a check's title states it
    keys: tuple[str, ...]  # literal text; a line holding any one of them is read further
    cause: str  # the finding's message: one sentence; {name} fields from the pattern's named groups
    why: str  # what happened and why (explain's "Why it matters")
    fix: str  # what to change (explain's "How to fix", and the finding's fix)
    source: str  # where the cause was established: the documentation or the issue thread
    pattern: str | None = None  # a regular expression the line must also match (searched, not anchored)
    role: str = "cause"
    check: tuple[str, ...] = ()  # the gpudoctor checks that judge this before submission (check --sbatch)
    versions: str = "all"  # the torch / NCCL / SLURM versions that print it
    commands: tuple[str, ...] = ()  # commands the fix shows (manual)
    needs: tuple[str, ...] = ()  # rows of which one must also be in the log for this one to count (context)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"{self.id}: role {self.role!r} is not one of {ROLES}")
        if not self.keys or any(not k for k in self.keys):
            raise ValueError(f"{self.id}: a signature needs literal keys")

    @property
    def regex(self) -> re.Pattern | None:
        return _compiled(self.pattern) if self.pattern else None


_CACHE: dict[str, re.Pattern] = {}


def _compiled(pattern: str) -> re.Pattern:
    if pattern not in _CACHE:
        _CACHE[pattern] = re.compile(pattern)
    return _CACHE[pattern]


def _what(s: Signature) -> str:
    keys = " or ".join(f"`{k}`" for k in s.keys)
    shape = f", matching `{s.pattern}`" if s.pattern else ""
    role = {
        "cause": "Named as the cause when it is the first cause in the log's order.",
        "consequence": "A consequence: named as following the first cause, never as the cause itself.",
        "hint": "A hint: named only when the log holds no cause.",
    }[s.role]
    printed = f" ({s.versions})" if s.versions != "all" else ""
    needs = f" Counted only where the log also shows {' or '.join(s.needs)}." if s.needs else ""
    return f"`gpudoctor diagnose` reads a failed job's log for a line with {keys}{shape}{printed}. {role}{needs}"


def _fix(s: Signature) -> str:
    caught = f" Before submission: {', '.join(s.check)} (`gpudoctor check`)." if s.check else ""
    return s.fix + caught


JUDGED_BY = "`gpudoctor diagnose LOG` on a failed job's log"


def verdicts(rows: Iterable[Signature]) -> list[Verdict]:
    """Each row as a verdict of `gpudoctor diagnose` (each topic module declares its own, so the registry
    names the module that holds the row)."""
    return [
        Verdict(
            id=s.id,
            name=s.name,
            category=s.category,
            title=s.title,
            what=_what(s),
            why=f"{s.why} Source: {s.source}",
            fix=_fix(s),
            scope="job",
        )
        for s in rows
    ]
