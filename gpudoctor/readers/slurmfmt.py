"""SLURM's own text formats, parsed exactly: task counts, host lists, GPU (gres) requests.

Pure functions, no I/O. Malformed input raises SlurmFormatError (a ValueError) naming
what could not be read, so a check can report it as a finding instead of crashing.
CUDA_VISIBLE_DEVICES is read by gpudoctor.readers.cudavis.

    parse_tasks_per_node("2(x3),1")          -> [2, 2, 2, 1]   (also SLURM_JOB_CPUS_PER_NODE)
    expand_nodelist("gpu[01-03,07],cpu1")    -> ["gpu01", "gpu02", "gpu03", "gpu07", "cpu1"]
    parse_index_list("0-2,5")                -> [0, 1, 2, 5]   (SLURM_JOB_GPUS, SLURM_STEP_GPUS, IDX:)
    parse_gres("gpu:h200:1")                 -> GpuRequest(count=1, type="h200")
    parse_gres("gpu:a100:2(IDX:0-1)")        -> GpuRequest(count=2, type="a100", indices=(0, 1))
    parse_gpus("h100:4")                     -> GpuRequest(count=4, type="h100")   (--gpus, --gpus-per-node/-task)
    job_detail(text of `scontrol show job -d`) -> JobDetail(state, nodes, gpus per node, batch script path)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "SlurmFormatError",
    "GpuRequest",
    "parse_int",
    "parse_tasks_per_node",
    "expand_nodelist",
    "parse_index_list",
    "parse_gres",
    "parse_gpus",
    "parse_gpu_env",
    "split_top_level",
    "JobDetail",
    "job_detail",
]


class SlurmFormatError(ValueError):
    """A SLURM value that does not follow SLURM's format."""


# More entries than this from one compressed value ('1(x10000000000)', '0-99999999') is a typo, not
# a job: refuse it rather than build a list that large.
MAX_EXPANSION = 100_000


# SLURM reads its counts with strtol() and refuses a negative one or one above INT_MAX ("Numeric argument
# (%ld) to big for %s", src/common/proc_args.c parse_int / get_resource_arg_range); a host list's numbers are
# unsigned longs (src/common/hostlist.c, strtoul). Digits are ASCII only: strtol reads no other digit.
INT_MAX = 2**31 - 1
ULONG_MAX = 2**64 - 1


def whole_number(digits: str, what: str, maximum: int = INT_MAX) -> int:
    """ASCII digits (already matched) -> their value, refused above maximum as SLURM refuses it; the length is
    compared first, so 5,000 digits cost nothing (Python's int() would raise past 4,300)."""
    significant = digits.lstrip("0") or "0"
    if len(significant) > len(str(maximum)) or int(significant) > maximum:
        shown = digits if len(digits) <= 24 else f"{digits[:12]}...({len(digits)} digits)"
        raise SlurmFormatError(f"{what}: {shown} is too large (SLURM refuses a value above {maximum})")
    return int(significant)


def parse_int(text: str | int | None, what: str = "value", minimum: int = 0, maximum: int = INT_MAX) -> int:
    """A whole number as SLURM writes it ('8', ' 8 ', at most INT_MAX); anything else is an error."""
    if isinstance(text, int) and not isinstance(text, bool):
        n = text
        if n > maximum:
            raise SlurmFormatError(f"{what}: {n} is too large (SLURM refuses a value above {maximum})")
    else:
        s = str(text).strip() if text is not None else ""
        if not _DIGITS.fullmatch(s):
            shown = repr(text) if len(s) <= 40 else f"{s[:20]!r}...({len(s)} characters)"
            raise SlurmFormatError(f"{what}: expected a whole number, got {shown}")
        n = whole_number(s.lstrip("+"), what, maximum)
    if n < minimum:
        raise SlurmFormatError(f"{what}: expected at least {minimum}, got {n}")
    return n


_DIGITS = re.compile(r"[+]?[0-9]+")


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on sep outside brackets and parentheses: 'a[1,2],b(IDX:0,1)' -> ['a[1,2]', 'b(IDX:0,1)']."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
            if depth < 0:
                raise SlurmFormatError(f"unbalanced brackets in {text!r}")
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise SlurmFormatError(f"unbalanced brackets in {text!r}")
    parts.append("".join(cur))
    return parts


# ---------------------------------------------------------------- task and CPU counts

_REPEAT = re.compile(r"^\s*([0-9]+)\s*(?:\(\s*x\s*([0-9]+)\s*\))?\s*$")


def parse_tasks_per_node(text: str, what: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """'2(x3),1' -> [2, 2, 2, 1]: one count per node, in node order.

    The same compressed format is used by SLURM_TASKS_PER_NODE, SLURM_STEP_TASKS_PER_NODE
    and SLURM_JOB_CPUS_PER_NODE.
    """
    if text is None or not str(text).strip():
        raise SlurmFormatError(f"{what}: empty")
    out: list[int] = []
    for part in str(text).split(","):
        m = _REPEAT.match(part)
        if not m:
            raise SlurmFormatError(f"{what}: cannot read {part.strip()!r} in {text!r} (expected N or N(xM))")
        count, repeat = whole_number(m.group(1), what), whole_number(m.group(2) or "1", what)
        if repeat < 1:
            raise SlurmFormatError(f"{what}: repeat count (x{repeat}) must be at least 1 in {text!r}")
        if len(out) + repeat > MAX_EXPANSION:
            raise SlurmFormatError(f"{what}: {text!r} describes an implausibly large number of nodes")
        out.extend([count] * repeat)
    return out


# ---------------------------------------------------------------- host lists

_RANGE = re.compile(r"^([0-9]+)(?:-([0-9]+))?$")


def _expand_brackets(body: str, whole: str) -> list[str]:
    """'01-03,07' -> ['01', '02', '03', '07']; zero padding follows the lower bound."""
    out = []
    for item in body.split(","):
        item = item.strip()
        m = _RANGE.match(item)
        if not m:
            raise SlurmFormatError(f"node list {whole!r}: cannot read range {item!r}")
        lo_s, hi_s = m.group(1), m.group(2)
        if hi_s is None:
            out.append(lo_s)
            continue
        lo, hi = (whole_number(n, f"node list {whole!r}", ULONG_MAX) for n in (lo_s, hi_s))
        if hi < lo:
            raise SlurmFormatError(f"node list {whole!r}: range {item!r} runs backwards")
        if len(out) + hi - lo >= MAX_EXPANSION:
            raise SlurmFormatError(f"node list {whole!r}: range {item!r} is implausibly large")
        width = len(lo_s) if lo_s.startswith("0") and len(lo_s) > 1 else 0
        out.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return out


def _expand_host(pattern: str, whole: str) -> list[str]:
    """One host expression, possibly with several bracket groups: 'r[1-2]n[01-02]'."""
    m = re.search(r"\[([^\]]*)\]", pattern)
    if not m:
        if "[" in pattern or "]" in pattern:
            raise SlurmFormatError(f"node list {whole!r}: unbalanced brackets")
        return [pattern]
    head, tail = pattern[: m.start()], pattern[m.end() :]
    if "[" in head or "]" in head:
        raise SlurmFormatError(f"node list {whole!r}: unbalanced brackets")
    mids, rests = _expand_brackets(m.group(1), whole), _expand_host(tail, whole)
    if len(mids) * len(rests) > MAX_EXPANSION:
        raise SlurmFormatError(f"node list {whole!r}: {pattern!r} names an implausibly large number of hosts")
    return [head + mid + rest for mid in mids for rest in rests]


def expand_nodelist(text: str) -> list[str]:
    """SLURM host list -> host names, in order: 'gpu[01-04,07],cpu1' keeps the zero padding."""
    if text is None or not str(text).strip():
        raise SlurmFormatError("node list: empty")
    hosts: list[str] = []
    for part in split_top_level(str(text).strip()):
        part = part.strip()
        if not part:
            raise SlurmFormatError(f"node list {text!r}: empty entry")
        if any(c.isspace() for c in part):
            raise SlurmFormatError(f"node list {text!r}: unexpected space in {part!r}")
        hosts.extend(_expand_host(part, text))
        if len(hosts) > MAX_EXPANSION:
            raise SlurmFormatError(f"node list {text!r} names an implausibly large number of hosts")
    return hosts


_NUMBERED = re.compile(r"^(.*?)([0-9]{1,20})$")


def compress_hostlist(hosts) -> str:
    """Host names -> a SLURM host list, as `scontrol show hostlistsorted` writes it: names that differ only in
    a trailing number of the same width share a bracket, ranges collapse: ['gpu01', 'gpu02', 'gpu04', 'cpu'] ->
    'cpu,gpu[01-02,04]'. expand_nodelist() gives the names back (sorted, each once)."""
    groups: dict[tuple[str, int], set[int]] = {}
    plain = set()
    for host in hosts:
        m = _NUMBERED.match(host)
        if m is None or any(c in host for c in "[],"):
            plain.add(host)
        else:
            groups.setdefault((m.group(1), len(m.group(2))), set()).add(int(m.group(2)))
    parts = sorted(plain)
    for (prefix, width), numbers in sorted(groups.items()):
        ordered = sorted(numbers)
        if len(ordered) == 1:
            parts.append(f"{prefix}{ordered[0]:0{width}d}")
            continue
        runs, start = [], ordered[0]
        for i, cur in enumerate(ordered):
            if i + 1 == len(ordered) or ordered[i + 1] != cur + 1:  # a run ends here
                runs.append(f"{start:0{width}d}" + (f"-{cur:0{width}d}" if cur != start else ""))
                if i + 1 < len(ordered):
                    start = ordered[i + 1]
        parts.append(f"{prefix}[{','.join(runs)}]")
    return ",".join(parts)


# ---------------------------------------------------------------- GPU indices and requests


def parse_index_list(text: str, what: str = "GPU index list") -> list[int]:
    """'0,1,2,3' or '0-3,5' -> [0, 1, 2, 3, 5] (SLURM_JOB_GPUS, SLURM_STEP_GPUS, IDX: lists)."""
    if text is None or not str(text).strip():
        raise SlurmFormatError(f"{what}: empty")
    out: list[int] = []
    for item in str(text).split(","):
        m = _RANGE.match(item.strip())
        if not m:
            raise SlurmFormatError(f"{what}: cannot read {item.strip()!r} in {text!r}")
        lo = whole_number(m.group(1), what)
        hi = whole_number(m.group(2), what) if m.group(2) is not None else lo
        if hi < lo:
            raise SlurmFormatError(f"{what}: range {item.strip()!r} runs backwards")
        if len(out) + hi - lo >= MAX_EXPANSION:
            raise SlurmFormatError(f"{what}: range {item.strip()!r} is implausibly large")
        out.extend(range(lo, hi + 1))
    return out


@dataclass(frozen=True)
class GpuRequest:
    """A GPU request or allocation: how many, of which type, and (from IDX:) which indices."""

    count: int
    type: str | None = None
    indices: tuple[int, ...] | None = None

    def describe(self) -> str:
        kind = f"{self.type} " if self.type else ""
        return f"{self.count} {kind}GPU{'s' if self.count != 1 else ''}"


_COUNT = re.compile(r"^([0-9]+)([kKmMgG]?)$")
_SUFFIX = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def _count(text: str, whole: str) -> int:
    m = _COUNT.match(text)
    if not m:
        raise SlurmFormatError(f"GPU request {whole!r}: cannot read count {text!r}")
    return whole_number(m.group(1), f"GPU request {whole!r}") * _SUFFIX[m.group(2).lower()]


def _one_gres(spec: str, whole: str) -> tuple[str, GpuRequest] | None:
    """'gpu:h200:1' -> ('gpu', GpuRequest(1, 'h200')); other gres names are returned too."""
    spec = spec.strip()
    indices = None
    m = re.search(r"\(([^)]*)\)\s*$", spec)
    if m:  # 'gpu:a100:2(IDX:0-1)' as scontrol and SLURM_JOB_GRES-like strings show it
        inner = m.group(1).strip()
        spec = spec[: m.start()].strip()
        if inner.upper().startswith("IDX:"):
            idx = inner[4:].strip()
            indices = tuple(parse_index_list(idx, f"GPU request {whole!r}")) if idx and idx.upper() != "N/A" else ()
    for prefix in ("gres/", "gres:"):
        if spec.startswith(prefix):
            spec = spec[len(prefix) :]
    count_text = None
    if "=" in spec:  # TRES form: gres/gpu:h100=4
        spec, count_text = (s.strip() for s in spec.split("=", 1))
    fields = [f.strip() for f in spec.split(":")]
    name, rest = fields[0], fields[1:]
    if not name:
        raise SlurmFormatError(f"GPU request {whole!r}: empty gres name")
    gtype = None
    if count_text is None:
        if rest and _COUNT.match(rest[-1]):
            count_text = rest[-1]
            rest = rest[:-1]
        elif len(rest) >= 2:  # 'gpu:a100:two' or 'gpu:a100:2:extra'
            raise SlurmFormatError(f"GPU request {whole!r}: cannot read count {rest[-1]!r}")
    if len(rest) > 1:
        raise SlurmFormatError(f"GPU request {whole!r}: too many ':' fields in {spec!r}")
    if rest:
        gtype = rest[0] or None
    if count_text is not None:
        count = _count(count_text, whole)
    else:  # 'gpu' alone asks for one; 'gpu(IDX:0-3)' holds as many as it lists
        count = len(indices) if indices else 1
    return name, GpuRequest(count, gtype, indices)


def _sum(requests: list[GpuRequest]) -> GpuRequest | None:
    if not requests:
        return None
    types = {r.type for r in requests}
    gtype = types.pop() if len(types) == 1 else None
    idx: tuple[int, ...] | None = None
    listed = [r.indices for r in requests if r.indices is not None]
    if len(listed) == len(requests):
        idx = tuple(i for indices in listed for i in indices)
    return GpuRequest(sum(r.count for r in requests), gtype, idx)


def parse_gres(text: str) -> GpuRequest | None:
    """A --gres value (or scontrol's TresPerNode/GRES): the GPUs it asks for per node.

    'gpu:h200:1', 'gpu:8', 'gpu' (one), 'gpu:a100:2(IDX:0-1)', 'gres/gpu:h100=4',
    'gpu:1,nic:2'. Several gpu entries add up. None when no GPU is named; 'none' too.
    """
    if text is None or not str(text).strip() or str(text).strip().lower() in ("none", "(null)", "n/a"):
        return None
    found = []
    for spec in split_top_level(str(text).strip()):
        if not spec.strip():
            continue
        parsed = _one_gres(spec, text)
        if parsed and parsed[0] == "gpu":
            found.append(parsed[1])
    return _sum(found)


def parse_gpus(text: str) -> GpuRequest:
    """A --gpus / --gpus-per-node / --gpus-per-task / --gpus-per-socket value: '[type:]count'.

    '4', 'h100:4', 'gpu:h100:4' (the 'gpu:' name is accepted), 'a100:2,v100:1' (added up).
    """
    if text is None or not str(text).strip():
        raise SlurmFormatError("GPU count: empty")
    found = []
    for spec in split_top_level(str(text).strip()):
        spec = spec.strip()
        if not spec:
            continue
        fields = [f.strip() for f in spec.split(":")]
        if fields[0] == "gpu":
            fields = fields[1:]
        if not fields or not fields[-1]:
            raise SlurmFormatError(f"GPU count {text!r}: no count in {spec!r}")
        if len(fields) == 1:
            if _COUNT.match(fields[0]):
                found.append(GpuRequest(_count(fields[0], text)))
            else:  # a bare type asks for one of it
                found.append(GpuRequest(1, fields[0]))
        elif len(fields) == 2:
            found.append(GpuRequest(_count(fields[1], text), fields[0] or None))
        else:
            raise SlurmFormatError(f"GPU count {text!r}: too many ':' fields in {spec!r}")
    req = _sum(found)
    if req is None:
        raise SlurmFormatError(f"GPU count {text!r}: nothing to read")
    return req


def parse_gpu_env(name: str, value: str) -> GpuRequest:
    """A GPU variable SLURM sets in a job, read by its own rules.

    SLURM_JOB_GPUS / SLURM_STEP_GPUS / GPU_DEVICE_ORDINAL: index lists;
    SLURM_GPUS_ON_NODE: a count; SLURM_GPUS*, SLURM_GPUS_PER_*: '[type:]count'.
    """
    if name in ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "GPU_DEVICE_ORDINAL"):
        idx = parse_index_list(value, name)
        return GpuRequest(len(idx), None, tuple(idx))
    if name == "SLURM_GPUS_ON_NODE":
        return GpuRequest(parse_int(value, name))
    try:
        return parse_gpus(value)
    except SlurmFormatError as e:
        raise SlurmFormatError(f"{name}: {e}") from None


# ---------------------------------------------------------------- scontrol show job -d


@dataclass(frozen=True)
class JobDetail:
    """What `scontrol show job -d JOB` says of a job's placement: its state, nodes, the GPU indices it holds on
    each node (the detail lines `Nodes=n[1-2] CPU_IDs=... GRES=gpu:h200:4(IDX:0-3)`), and its batch script."""

    job_id: str
    state: str | None
    nodes: tuple[str, ...]
    gpus: dict  # node -> tuple of GPU indices (nodes without GPUs: ())
    batch: bool
    command: str | None  # the batch script's path as submitted (scontrol's Command=)
    user: str | None
    work_dir: str | None = None  # where the job runs (scontrol's WorkDir=: sbatch's --chdir, else the submit dir)
    uid: int | None = None  # the job's user's uid (UserId=alice(1000))
    end_time: str | None = None  # EndTime=: the time limit's end while it runs, when it ended after


_FIELD = re.compile(r"(?:^|\s)([A-Za-z/:]+)=(\S*)")


def job_detail(text: str, job: str | None = None) -> JobDetail:
    """Read `scontrol show job -d JOB`'s multi-line record: the record of `job` when given (records are
    separated by a blank line; `scontrol show job 0` lists every job, and a whole array lists its tasks), else
    the first. `job` is SLURM's own id form: `46` (JobId=46), an array task `46_3` (ArrayJobId=46
    ArrayTaskId=3), a het job's component `46+1` (HetJobId=46 HetJobOffset=1). SlurmFormatError when no
    record is the job asked for: the job judged is always the one asked for (issue 35 item 6)."""
    records = [_job_record(r) for r in re.split(r"\n[ \t]*\n", text) if r.strip()]
    records = [r for r in records if r[0]]
    if not records:
        raise SlurmFormatError("scontrol show job: no JobId in its output")
    chosen = records[0] if job is None else next((r for r in records if _is_job(r[0], job)), None)
    if chosen is None:
        said = ", ".join(sorted({r[0].get("JobId", "?") for r in records}))[:80]
        raise SlurmFormatError(f"scontrol show job {job}: its answer names another job (JobId={said})")
    fields, gpus = chosen
    if "JobId" not in fields:
        raise SlurmFormatError("scontrol show job: no JobId in its output")
    nodelist = fields.get("NodeList", "")
    nodes = tuple(expand_nodelist(nodelist)) if nodelist and nodelist != "(null)" else ()
    user = fields.get("UserId", "").split("(")[0] or None
    uid_text = fields.get("UserId", "").partition("(")[2].rstrip(")")
    command = fields.get("Command")
    return JobDetail(
        job_id=fields["JobId"],
        state=fields.get("JobState"),
        nodes=nodes,
        gpus={n: gpus.get(n, ()) for n in nodes},
        batch=fields.get("BatchFlag") == "1",
        command=None if command in (None, "", "(null)") else command,
        work_dir=None if fields.get("WorkDir") in (None, "", "(null)") else fields.get("WorkDir"),
        user=user,
        uid=int(uid_text) if uid_text.isdigit() and uid_text.isascii() and len(uid_text) <= 10 else None,
        end_time=None if fields.get("EndTime") in (None, "", "Unknown", "None") else fields.get("EndTime"),
    )


def _is_job(fields: dict, job: str) -> bool:
    if "_" in job:
        array, task = job.split("_", 1)
        return fields.get("ArrayJobId") == array and fields.get("ArrayTaskId") == task
    if "+" in job:
        het, offset = job.split("+", 1)
        return fields.get("HetJobId") == het and fields.get("HetJobOffset") == offset
    return fields.get("JobId") == job


def _job_record(text: str) -> tuple[dict[str, str], dict[str, tuple[int, ...]]]:
    """One record's fields (the first of each name) and the GPU indices of its detail lines, per node."""
    fields: dict[str, str] = {}
    gpus: dict[str, tuple[int, ...]] = {}
    first = True
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("Nodes=") and not first:  # a detail line: the nodes and what they hold
            found = dict(_FIELD.findall(stripped))
            hosts = expand_nodelist(found.get("Nodes", ""))
            req = parse_gres(found.get("GRES", "")) if found.get("GRES") else None
            held = tuple(req.indices or ()) if req is not None else ()
            for host in hosts:
                gpus[host] = held
            continue
        first = False
        if stripped.startswith("Command="):  # a path may hold spaces: the rest of the line
            fields["Command"] = stripped[len("Command=") :]
            continue
        for key, value in _FIELD.findall(stripped):
            fields.setdefault(key, value)
    return fields, gpus
