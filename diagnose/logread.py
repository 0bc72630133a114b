"""Read a failed job's log as its writers wrote it, in bounded memory and time.

The log is read in chunks of CHUNK bytes and searched with `bytes.find` for literal keys (the signatures'
keys, the generic error words, the few lines the reader parses itself); only a line holding a key is decoded,
so a multi-GB log costs a few passes of a C search, and memory stays bounded: per key the first MAX_HITS
lines (and a count of the rest), per rank one record, every kept line cut to LINE_LIMIT characters. A line
longer than MAX_CARRY without a newline is searched in pieces and counted as one line.

What the writers put in front of a line is read off it (`prefix`): srun --label's `3: `, torchrun's
`[default3]:` (its --tee/--redirects prefix: role and rank; torchx's `[trainer3]:`, `[trainer0|0]:`), torch's
`[rank3]:` (c10d's log prefix since torch 2.2), mpirun --tag-output's `[1,3]<stdout>:`, a `[pid] ` and a
leading ISO time, after any indentation; NCCL's `host:pid:tid [dev] NCCL INFO|WARN` gives the host. A rank named
inside the text (`[Rank 3]`, `[PG 0 Rank 3]`) is the rank where no prefix gives one.

Parsed here, as NCCL and torch write them:
- the watchdog's `WorkNCCL(SeqNum=N, OpType=OP, ...)` and torch >= 2.2's `last enqueued NCCL work: N, last
  completed NCCL work: M` (the lowest per rank is the rank behind);
- NCCL's `NCCL version X` per rank and host (ranks on different versions);
- torchrun's error summary (torch/distributed/elastic/multiprocessing/errors): after `Root Cause (first
  observed failure):` its `rank :`, `host :`, `exitcode :` and `time :` fields.
Nothing here is redacted or cleaned: the judge's findings quote lines through redact and sanitize.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

CHUNK = 4 << 20
MAX_CARRY = 1 << 20  # a "line" longer than this without a newline is searched in pieces
MAX_HITS = 64  # lines kept per key; the rest are counted
MAX_RANKS = 65536  # per-rank records kept (a job larger than this keeps the first ones seen)
MAX_ERRORS = 32  # generic error lines kept
LINE_LIMIT = 600  # characters of a kept line
BLOCK_LINES = 12  # lines after torchrun's "Root Cause" header read as its fields

# Generic error words: the first such line is where "no known cause" points.
ERROR_KEYS = (b"Error", b"Exception", b"error:", b"ERROR", b"FAILED", b"atal", b"Segmentation fault", b"Aborted")
_ERROR_LINE = re.compile(
    r"(?:^|[\s:\]])[A-Za-z_][\w.]*(?:Error|Exception)\b(?::|$)|\berror:|\bERROR\b|\bFAILED\b|\b[Ff]atal\b"
    r"|Segmentation fault|\bAborted\b|core dumped"
)
# not where to read: NCCL's INFO lines, counts of no errors, warnings, torchrun's summary title (`train.py FAILED`)
_NOT_ERROR = re.compile(
    r"NCCL INFO|\b0 errors?\b|errors?=0\b|UserWarning|FutureWarning|DeprecationWarning|^\s*[\w./-]+ FAILED\s*$"
)
_EXCEPTION = re.compile(
    r"^(?:Traceback .*|(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Interrupt))(?::\s*(?P<msg>.*))?)$"
)

SEQ_KEY = b"SeqNum="
WORK_KEY = b"last enqueued NCCL work"
VERSION_KEY = b"NCCL version "
ROOT_KEY = b"Root Cause (first observed failure)"
_EVERY_LINE = frozenset({SEQ_KEY, WORK_KEY, VERSION_KEY})  # parsed on every line: one record per rank or version
_SEQ = re.compile(r"WorkNCCL\(SeqNum=(?P<seq>\d+),\s*OpType=(?P<op>\w+)")
_WORK = re.compile(r"last enqueued NCCL work:\s*(?P<enq>-?\d+),\s*last completed NCCL work:\s*(?P<done>-?\d+)")
_VERSION = re.compile(r"NCCL version (?P<version>\d+\.\d+\.\d+)")
_FIELD = re.compile(r"^\s*(?P<key>rank|host|exitcode|time|error_file)\s*:\s*(?P<value>.*?)\s*$")

_PREFIX = re.compile(
    r"^\s*(?:(?P<label>\d{1,6}): |\[rank(?P<rank>\d{1,6})\]:|\[(?:[A-Za-z_]+?)(?P<role>\d{1,6})(?:\|\d+)?\]:"
    r"|\[\d+,(?P<mpi>\d{1,6})\]<std(?:out|err)>:|\[\d{1,9}\] "
    r"|(?P<time>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d[\d.,]*(?:Z|[+-]\d\d:?\d\d)?:?\s+))"
)
RANK, LOCAL_RANK, TASK = "rank", "local rank", "task"  # what a line's number is (prefix)
_NCCL_HOST = re.compile(r"^(?P<host>[A-Za-z0-9][\w.-]*):\d+:\d+ \[\d+\] (?:[\w./-]+:\d+ )?NCCL (?:INFO|WARN)")
_TEXT_RANK = re.compile(r"\[(?:PG [^\]]*?)?Rank (?P<rank>\d{1,6})\]")
_SRUN_HOST = re.compile(r"^srun: error: (?P<host>[\w.-]+): task")


@dataclass(frozen=True)
class Line:
    """One kept line: where it is, the rank and host its prefix or text names, its text without the prefix."""

    source: str
    number: int  # 1-based line number in its source
    text: str
    rank: int | None = None
    host: str | None = None
    order: int = 0  # across sources: (source index, line number) as one integer
    rank_kind: str = "rank"  # RANK, LOCAL_RANK or TASK: what `rank` is (prefix)

    @property
    def who(self) -> str:
        """'rank 3', 'local rank 3' or 'task 3'; '' where no number is known."""
        return f"{self.rank_kind} {self.rank}" if self.rank is not None else ""

    @property
    def where(self) -> str:
        return f"{self.source}:{self.number}"


@dataclass
class RankWork:
    """A rank's collective progress as its watchdog lines give it (the lowest seen: where it stopped)."""

    seq: int
    op: str | None
    line: Line


@dataclass
class Scan:
    """What the reader kept of the logs: bounded whatever their size."""

    sources: list[str] = field(default_factory=list)
    lines: int = 0
    size: int = 0  # bytes read
    hits: dict[bytes, list[Line]] = field(default_factory=dict)
    counts: dict[bytes, int] = field(default_factory=dict)
    errors: list[Line] = field(default_factory=list)  # generic error lines, first MAX_ERRORS
    error_count: int = 0
    work: dict[int, RankWork] = field(default_factory=dict)  # rank -> lowest collective sequence number seen
    versions: dict[str, Line] = field(default_factory=dict)  # NCCL version -> first line that printed it
    root_cause: dict[str, str] = field(default_factory=dict)  # torchrun's summary: rank, host, exitcode, time
    root_line: Line | None = None
    ranks: set[int] = field(default_factory=set)  # global ranks seen in kept lines (bounded by MAX_RANKS)

    def found(self, key: str) -> list[Line]:
        return self.hits.get(key.encode(), [])


def prefix(text: str) -> tuple[str, int | None, str, str | None]:
    """(text without the writers' prefixes, the rank they name, what that number is, the host) of one decoded
    line. The number is the global rank where any prefix or the text names it (`[rank3]:`, mpirun's `[1,3]`,
    `[Rank 3]`), else torchrun's `[default3]:` (its default template is `[${role_name}${local_rank}]:`: the
    local rank), else srun's label (the task, SLURM_PROCID: the rank only where each task is one rank)."""
    found: dict[str, int] = {}
    for _ in range(4):
        m = _PREFIX.match(text)
        if not m or m.end() == 0:
            break
        for group, kind in (("rank", RANK), ("mpi", RANK), ("role", LOCAL_RANK), ("label", TASK)):
            if m.group(group) is not None:
                found.setdefault(kind, int(m.group(group)))
        text = text[m.end() :]
    if RANK not in found:
        inner = _TEXT_RANK.search(text)
        if inner:
            found[RANK] = int(inner.group("rank"))
    host = _NCCL_HOST.match(text) or _SRUN_HOST.match(text)
    kind = next((k for k in (RANK, LOCAL_RANK, TASK) if k in found), RANK)
    return text, found.get(kind), kind, host.group("host") if host else None


class _Reader:
    def __init__(self, keys: Iterable[bytes] | Mapping[bytes, Sequence[re.Pattern | None]]):
        self.filters: dict[bytes, tuple[re.Pattern, ...]] = {}
        if isinstance(keys, Mapping):
            self.filters = {k: tuple(p for p in ps if p is not None) for k, ps in keys.items() if None not in ps}
        self.keys = tuple(dict.fromkeys([*keys, *ERROR_KEYS, SEQ_KEY, WORK_KEY, VERSION_KEY, ROOT_KEY]))
        self.scan = Scan()
        self.hits: dict[bytes, list[Line]] = {k: [] for k in self.keys}
        self.counts: dict[bytes, int] = dict.fromkeys(self.keys, 0)
        self.last: dict[bytes, int] = dict.fromkeys(self.keys, -1)  # last line number recorded per key

    def read(self, name: str, index: int, stream: BinaryIO) -> None:
        self.scan.sources.append(name)
        self.index = index
        self.name = name
        self.last = dict.fromkeys(self.keys, -1)  # line numbers start again in each source
        first = 1  # line number of the first line of the buffer
        carry = b""
        while True:
            data = stream.read(CHUNK)
            self.scan.size += len(data)
            buf = carry + data if carry else data
            if not data:
                if buf:
                    self._search(buf, first, final=True)
                    first += 1
                break
            cut = buf.rfind(b"\n") + 1
            if cut == 0:
                if len(buf) > MAX_CARRY:  # one endless line: search it in pieces, keep a tail for a key across
                    self._search(buf, first, final=False)
                    carry = buf[-256:]
                else:
                    carry = buf
                continue
            part, carry = buf[:cut], buf[cut:]
            first += self._search(part, first, final=True)
        self.scan.lines += first - 1

    def _search(self, part: bytes, first: int, final: bool) -> int:
        """Search one buffer of whole lines (final) or a piece of one; the number of newlines in it."""
        newlines: list[int] | None = None
        for key in self.keys:
            pos = part.find(key)
            if pos < 0:
                continue
            if newlines is None:
                newlines = [m.start() for m in re.finditer(b"\n", part)]
            hits = self.hits[key]
            while pos >= 0:
                n = bisect.bisect_left(newlines, pos)  # newlines before pos: the line's index in the buffer
                start = newlines[n - 1] + 1 if n else 0
                end = newlines[n] if n < len(newlines) else len(part)
                number = first + n
                if number != self.last[key]:
                    self.last[key] = number
                    self.counts[key] += 1
                    if len(hits) < (MAX_ERRORS if key in ERROR_KEYS else MAX_HITS) or key in _EVERY_LINE:
                        self._keep(key, part, start, end, number, newlines, n)
                    else:  # kept enough: count the remaining occurrences at C speed
                        self.counts[key] += part.count(key, end)
                        break
                pos = part.find(key, end + 1) if end < len(part) else -1
        return len(newlines) if newlines is not None else part.count(b"\n")

    def _line(self, raw: bytes, number: int) -> Line:
        text = raw[: LINE_LIMIT * 4].decode("utf-8", "surrogateescape").rstrip("\r")[:LINE_LIMIT]
        text, rank, kind, host = prefix(text)
        if rank is not None and kind == RANK and len(self.scan.ranks) < MAX_RANKS:
            self.scan.ranks.add(rank)
        return Line(self.name, number, text, rank, host, (self.index << 40) + number, kind)

    def _keep(self, key: bytes, part: bytes, start: int, end: int, number: int, newlines: list[int], n: int) -> None:
        line = self._line(part[start:end], number)
        if key in ERROR_KEYS:
            if _ERROR_LINE.search(line.text) and not _NOT_ERROR.search(line.text):
                self.hits[key].append(line)
            return
        if key == SEQ_KEY:
            m = _SEQ.search(line.text)
            if m and line.rank is not None and line.rank_kind == RANK:
                self._work(line.rank, int(m.group("seq")), m.group("op"), line)
        elif key == WORK_KEY:
            m = _WORK.search(line.text)
            if m and line.rank is not None and line.rank_kind == RANK:
                self._work(line.rank, int(m.group("done")) + 1, None, line)  # the collective it waits in
        elif key == VERSION_KEY:
            m = _VERSION.search(line.text)
            if m and len(self.scan.versions) < 16:
                self.scan.versions.setdefault(m.group("version"), line)
        elif key == ROOT_KEY and self.scan.root_line is None:
            self.scan.root_line = line
            for k in range(n + 1, min(n + 1 + BLOCK_LINES, len(newlines))):
                body = part[newlines[k - 1] + 1 : newlines[k]].decode("utf-8", "surrogateescape")[:LINE_LIMIT]
                m = _FIELD.match(prefix(body)[0])
                if m:
                    self.scan.root_cause.setdefault(m.group("key"), m.group("value"))
        hits = self.hits[key]
        patterns = self.filters.get(key)
        if len(hits) < MAX_HITS and (not patterns or any(p.search(line.text) for p in patterns)):
            hits.append(line)

    def _work(self, rank: int, seq: int, op: str | None, line: Line) -> None:
        old = self.scan.work.get(rank)
        if old is None and len(self.scan.work) >= MAX_RANKS:
            return
        if old is None or seq < old.seq:
            self.scan.work[rank] = RankWork(seq, op, line)

    def done(self) -> Scan:
        s = self.scan
        s.hits = {k: v for k, v in self.hits.items() if v}
        s.counts = {k: v for k, v in self.counts.items() if v}
        errors = {line.order: line for key in ERROR_KEYS for line in self.hits[key]}
        s.errors = [errors[k] for k in sorted(errors)][:MAX_ERRORS]
        s.error_count = sum(self.counts[key] for key in ERROR_KEYS)  # occurrences of the words, an upper bound
        return s


def read_logs(
    sources: Iterable[tuple[str, BinaryIO]], keys: Iterable[bytes] | Mapping[bytes, Sequence[re.Pattern | None]]
) -> Scan:
    """Scan each (name, binary stream) in turn for the keys; what was kept, in bounded memory. With a mapping,
    a line holding a key is kept only when one of the key's patterns matches it (None: any line): the bound on
    kept lines then counts lines that matter, so a hundred harmless lines with `gres` in them do not push out
    the one SLURM error after them."""
    reader = _Reader(keys)
    for index, (name, stream) in enumerate(sources):
        reader.read(name, index, stream)
    return reader.done()


def exception(line: Line) -> tuple[str, str] | None:
    """(type, message) of a Python exception line (`ValueError: boom`), None for another line."""
    m = _EXCEPTION.match(line.text.strip())
    if not m or not m.group("type"):
        return None
    return m.group("type"), (m.group("msg") or "")
