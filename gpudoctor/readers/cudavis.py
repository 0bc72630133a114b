"""CUDA_VISIBLE_DEVICES as the CUDA driver reads it: which physical GPUs a process will get.

Pure parsing, no I/O; shared by the devices, slurm and distributed checks.

    vis = from_facts(facts)   # = parse_visible_devices(env value, NVML's GPUs, or None without NVML)
    vis.gpus      -> (3, 1)   NVML indices in CUDA order; None when they cannot be resolved
    vis.count     -> 2        devices a CUDA process will enumerate; None when unknown
    vis.problems  -> [...]    mistakes that lose GPUs (hidden, dropped, missing); [] when fine
    vis.notes     -> [...]    legal but odd spellings ('1gpu' reads as 1, a trailing comma)

The rules (CUDA C Programming Guide, "CUDA Environment Variables"; PyTorch's
torch.cuda._parse_visible_devices, which mirrors the driver so device_count() can
answer without initialising CUDA):
- unset: every GPU is visible, in CUDA's enumeration order;
- a comma-separated list of entries, enumerated in the order given;
- indices count the GPUs this process can open, in order: under SLURM with ConstrainDevices (or in
  a container) NVML may list GPUs the cgroup forbids, CUDA skips them, so SLURM writes local
  indices (0,1 for physical GPUs 4,5); the same order as NVML's assumes identical models or
  CUDA_DEVICE_ORDER=PCI_BUS_ID (see the devices check GD-DEV-003);
- an index entry is read like C's strtoul: leading blanks and a '+' are accepted and
  reading stops at the first non-digit, so '1gpu' means 1; no digits or a negative
  number is invalid ('-1' is the usual way to hide every GPU); '0-3' or '0 1' therefore give
  GPU 0 alone (reported as a problem: the other GPUs are lost without a word);
- 'GPU-<uuid>' may be abbreviated to any prefix that matches exactly one GPU;
- 'MIG-<uuid>' (R470+) or 'MIG-GPU-<uuid>/<gi>/<ci>' (older) names a MIG device; a CUDA
  process enumerates only one MIG device;
- the first invalid entry (unknown index or UUID, ambiguous prefix, garbage, empty)
  ends the list: entries after it are silently ignored ('0,2,-1,1' shows GPUs 0 and 2);
- a GPU named twice makes the whole list invalid: PyTorch counts zero devices.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

VARIABLE = "CUDA_VISIBLE_DEVICES"

# Values people write that CUDA does not understand, with what they probably meant.
_KNOWN_WORDS = {
    "nodevfiles": "SLURM writes 'NoDevFiles' when the job's GPUs have no device File= in gres.conf",
    "all": "'all' is an NVIDIA_VISIBLE_DEVICES value (container runtime); CUDA_VISIBLE_DEVICES takes indices or UUIDs",
    "none": (
        "'none' is an NVIDIA_VISIBLE_DEVICES value (container runtime); CUDA_VISIBLE_DEVICES takes indices or UUIDs"
    ),
    "void": (
        "'void' is an NVIDIA_VISIBLE_DEVICES value (container runtime); CUDA_VISIBLE_DEVICES takes indices or UUIDs"
    ),
}
_LEGACY_MIG = re.compile(r"^MIG-(GPU-[0-9A-Za-z-]+)/(\d+)/(\d+)$")


@dataclass(frozen=True)
class Entry:
    """One comma-separated entry, as CUDA reads it."""

    text: str  # exactly as written
    kind: str  # index | gpu_uuid | mig | invalid
    status: str  # ok | unresolved | not_found | ambiguous | invalid | duplicate | ignored
    gpu: int | None = None  # NVML index of the (parent) GPU
    mig_uuid: str | None = None  # the MIG device, for kind == "mig"
    reason: str | None = None  # why the entry is not ok

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "unresolved")


@dataclass(frozen=True)
class Visibility:
    value: str | None  # the variable's value; None when unset
    entries: tuple[Entry, ...] = ()
    gpus: tuple[int, ...] | None = None  # NVML indices CUDA enumerates, in order; None: unknown
    mig: tuple[str, ...] = ()  # MIG device UUIDs named (CUDA uses only one)
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    known_gpus: bool = True  # False when no NVML GPU list was given (nothing resolved)
    all_invalid_because: str | None = None  # e.g. the SLURM 'NoDevFiles' explanation

    @property
    def is_set(self) -> bool:
        return self.value is not None

    @property
    def accepted(self) -> tuple[Entry, ...]:
        """Entries CUDA uses (before the first invalid one)."""
        return tuple(e for e in self.entries if e.ok)

    @property
    def ignored(self) -> tuple[Entry, ...]:
        """Entries after the first invalid one: CUDA drops them without a word."""
        return tuple(e for e in self.entries if e.status == "ignored")

    @property
    def stopped_at(self) -> Entry | None:
        """The invalid entry that ended the list, if any."""
        return next((e for e in self.entries if e.status in ("invalid", "not_found", "ambiguous")), None)

    @property
    def duplicate(self) -> bool:
        return any(e.status == "duplicate" for e in self.entries)

    @property
    def count(self) -> int | None:
        """CUDA devices a process will enumerate (MIG devices count once); None when unknown."""
        if not self.is_set:
            return None if self.gpus is None else len(self.gpus)
        if self.duplicate:
            return 0
        accepted = self.accepted
        if any(e.kind == "mig" for e in accepted):
            return 1
        return len(accepted)

    @property
    def hides_all(self) -> bool:
        return self.is_set and self.count == 0

    @property
    def uses_indices(self) -> bool:
        return any(e.kind == "index" and e.ok for e in self.entries)

    @property
    def mixed_forms(self) -> bool:
        """Indices and UUIDs in one list: tools disagree on these (PyTorch stops at the first change of form)."""
        kinds = {e.kind for e in self.entries if e.kind != "invalid"}
        return len(kinds) > 1

    def describe(self) -> str:
        if self.value is None:
            return f"{VARIABLE} is not set"
        return f"{VARIABLE}={self.value!r}"


def strtoul_prefix(text: str) -> int | None:
    """The number C's strtoul reads at the start of text, or None (no digits, or negative)."""
    m = re.match(r"^\s*([+-]?)([0-9]+)", text)  # C reads ASCII digits only
    if not m or (m.group(1) == "-" and m.group(2).strip("0")):
        return None
    return _ulong(m.group(2))


ULONG_MAX = 2**64 - 1


def _ulong(digits: str) -> int:
    """ASCII digits as strtoul reads them: past ULONG_MAX it saturates (ERANGE); never int() of thousands
    of digits (Python refuses more than 4300)."""
    digits = digits.lstrip("0") or "0"
    return ULONG_MAX if len(digits) > 20 else min(int(digits), ULONG_MAX)


def lost_indices(text: str) -> list[int] | None:
    """The indices an entry like '0-3', '0 1' or '0;1' was meant to list, when strtoul reads only its
    first number (CUDA takes neither ranges nor separators other than ','); None for an ordinary entry."""
    head = re.match(r"^\s*[+]?[0-9]+", text)
    if not head or not re.search(r"[0-9]", text[head.end() :]):
        return None
    ends = re.fullmatch(r"\s*([0-9]+)\s*-\s*([0-9]+)\s*", text)
    if ends and _ulong(ends.group(1)) < _ulong(ends.group(2)) <= _ulong(ends.group(1)) + 64:
        return list(range(_ulong(ends.group(1)), _ulong(ends.group(2)) + 1))
    return [_ulong(n) for n in re.findall(r"[0-9]+", text)]


def _gpu_uuid_matches(prefix: str, gpus: list[dict]) -> list[int]:
    return [g["index"] for g in gpus if isinstance(g.get("uuid"), str) and g["uuid"].startswith(prefix)]


def _mig_matches(text: str, gpus: list[dict]) -> list[tuple[int, str]]:
    out = []
    for g in gpus:
        for d in (g.get("mig") or {}).get("devices") or []:
            uuid = d.get("uuid")
            if isinstance(uuid, str) and uuid.startswith(text):
                out.append((g["index"], uuid))
    return out


def enumerable(gpus: list[dict]) -> list[dict]:
    """The GPUs CUDA can enumerate: NVML's, less those this process may not open or lost."""
    return [g for g in gpus if not g.get("error")]


def _read_index(text: str, gpus: list[dict] | None) -> Entry:
    n = strtoul_prefix(text)
    if n is None:
        stripped = text.strip()
        if not stripped:
            return Entry(text, "invalid", "invalid", reason="empty entry")
        if re.match(r"^\s*-\d+", text):
            return Entry(text, "invalid", "invalid", reason="a negative index ('-1' is the usual way to hide GPUs)")
        return Entry(text, "invalid", "invalid", reason=f"{stripped!r} is not a GPU index, GPU-<uuid> or MIG-<uuid>")
    if gpus is None:
        return Entry(text, "index", "unresolved", gpu=n)
    usable = enumerable(gpus)
    if n >= len(usable):
        return Entry(text, "index", "not_found", reason=f"there is no GPU {n} (this process can open {len(usable)})")
    return Entry(text, "index", "ok", gpu=usable[n]["index"])


def _read_gpu_uuid(text: str, gpus: list[dict] | None) -> Entry:
    if gpus is None:
        return Entry(text, "gpu_uuid", "unresolved")
    found = _gpu_uuid_matches(text, gpus)
    if not found:
        return Entry(text, "gpu_uuid", "not_found", reason=f"no GPU has a UUID starting with {text!r}")
    if len(found) > 1:
        return Entry(text, "gpu_uuid", "ambiguous", reason=f"{text!r} matches GPUs {found}; use more of the UUID")
    return Entry(text, "gpu_uuid", "ok", gpu=found[0])


def _read_mig(text: str, gpus: list[dict] | None) -> Entry:
    legacy = _LEGACY_MIG.match(text)
    if gpus is None:
        return Entry(text, "mig", "unresolved", mig_uuid=text)
    if legacy:  # MIG-GPU-<uuid>/<gi>/<ci>: only the parent GPU can be checked from NVML facts
        parents = _gpu_uuid_matches(legacy.group(1), gpus)
        if len(parents) != 1:
            return Entry(
                text, "mig", "not_found", mig_uuid=text, reason=f"no single GPU has the UUID {legacy.group(1)!r}"
            )
        parent = next(g for g in gpus if g["index"] == parents[0])
        if not (parent.get("mig") or {}).get("current"):
            return Entry(
                text, "mig", "not_found", gpu=parents[0], mig_uuid=text, reason=f"GPU {parents[0]} is not in MIG mode"
            )
        return Entry(text, "mig", "ok", gpu=parents[0], mig_uuid=text)
    found = _mig_matches(text, gpus)
    if not found:
        return Entry(text, "mig", "not_found", mig_uuid=text, reason=f"no MIG device has the UUID {text!r}")
    if len(found) > 1:
        return Entry(text, "mig", "ambiguous", mig_uuid=text, reason=f"{text!r} matches {len(found)} MIG devices")
    return Entry(text, "mig", "ok", gpu=found[0][0], mig_uuid=found[0][1])


def _read_entry(text: str, gpus: list[dict] | None) -> Entry:
    if text.startswith("GPU-"):
        return _read_gpu_uuid(text, gpus)
    if text.startswith("MIG-"):
        return _read_mig(text, gpus)
    if text[:1].isspace() and text.strip().startswith(("GPU-", "MIG-")):
        # The UUID forms are compared as written: PyTorch's parser (like CUDA's) does not strip blanks.
        return Entry(
            text, "invalid", "invalid", reason=f"blank before {text.strip()!r}: UUID entries must not contain spaces"
        )
    return _read_index(text, gpus)


def _identity(e: Entry):
    """What makes two entries the same device."""
    if e.kind == "mig":
        return ("mig", e.mig_uuid)
    if e.gpu is not None:
        return ("gpu", e.gpu)
    return ("text", e.text.strip())


def parse_visible_devices(value: str | None, gpus: list[dict] | None = None) -> Visibility:
    """Read CUDA_VISIBLE_DEVICES the way CUDA does.

    value: the variable's value, None when unset. gpus: NVML's GPUs (facts.gpus: dicts with
    index, uuid, mig.devices[].uuid), or None when unknown (then nothing can be resolved;
    entries are checked for form only).
    """
    known = gpus is not None
    if value is None:
        all_gpus = tuple(g["index"] for g in enumerable(gpus)) if gpus is not None else None
        return Visibility(value=None, gpus=all_gpus, known_gpus=known)

    entries: list[Entry] = []
    stopped = False
    seen: dict = {}
    for text in value.split(","):
        if stopped:
            entries.append(Entry(text, "invalid", "ignored", reason="after an invalid entry"))
            continue
        e = _read_entry(text, gpus)
        if e.ok:
            key = _identity(e)
            if key in seen:
                e = replace(e, status="duplicate", reason=f"names the same device as {seen[key]!r}")
            else:
                seen[key] = text
        entries.append(e)
        stopped = not e.ok and e.status != "duplicate"

    vis = Visibility(value=value, entries=tuple(entries), known_gpus=known)
    accepted = vis.accepted
    order = tuple(e.gpu for e in accepted if e.gpu is not None) if known else None
    because = _KNOWN_WORDS.get(value.strip().lower())
    vis = replace(
        vis,
        gpus=() if vis.duplicate else order,
        mig=tuple(e.mig_uuid for e in accepted if e.kind == "mig" and e.mig_uuid is not None),
        all_invalid_because=because,
    )
    return replace(vis, problems=tuple(_problems(vis, because)), notes=tuple(_notes(vis)))


def _problems(vis: Visibility, because: str | None) -> list[str]:
    out = []
    value = vis.value or ""
    if value.strip() == "":
        return [f"{VARIABLE} is set but empty: CUDA sees no GPUs"]
    if because:
        return [f"{VARIABLE}={value!r} hides every GPU: {because}"]
    dups = [e for e in vis.entries if e.status == "duplicate"]
    if dups:
        out.append(
            f"{VARIABLE}={value!r} names a device twice ({', '.join(repr(e.text) for e in dups)}): "
            "the list is invalid and PyTorch counts no GPUs"
        )
    for e in vis.accepted:
        meant = lost_indices(e.text) if e.kind == "index" else None
        if meant:
            out.append(
                f"{VARIABLE}={value!r}: entry {e.text!r} reads as GPU {strtoul_prefix(e.text)} only - CUDA reads the "
                "leading number and takes neither ranges nor separators other than ',' "
                f"(list them: {','.join(map(str, meant))})"
            )
    stop = vis.stopped_at
    if stop is not None:
        ignored = vis.ignored
        trailing_empty = stop.reason == "empty entry" and not ignored and vis.accepted
        if trailing_empty:
            return out  # '0,1,' - harmless, see _notes
        if stop.reason and stop.reason.startswith("a negative") and stop is vis.entries[0]:
            out.append(f"{VARIABLE}={value!r} hides every GPU ({stop.text.strip()} ends the list before any GPU)")
        else:
            kept = ", ".join(e.text.strip() for e in vis.accepted) or "none"
            msg = f"{VARIABLE}={value!r}: entry {stop.text!r} is invalid ({stop.reason}); CUDA stops there"
            if ignored:
                msg += f" and silently ignores {', '.join(repr(e.text) for e in ignored)}"
            out.append(msg + f" (kept: {kept})")
    return out


def _notes(vis: Visibility) -> list[str]:
    out = []
    for e in vis.accepted:
        if e.kind == "index" and not e.text.strip().isdigit() and not lost_indices(e.text):
            out.append(f"entry {e.text!r} reads as index {strtoul_prefix(e.text)}")
    stop = vis.stopped_at
    if stop is not None and stop.reason == "empty entry" and not vis.ignored and vis.accepted:
        out.append(f"{VARIABLE}={vis.value!r} ends with an empty entry (harmless, but tidy it)")
    if vis.mixed_forms:
        out.append("indices and UUIDs are mixed in one list; PyTorch's device count stops at the first change of form")
    if len(vis.mig) > 1:
        out.append(f"{len(vis.mig)} MIG devices named, but a CUDA process enumerates only one")
    return out


def from_facts(facts) -> Visibility:
    """The job's CUDA_VISIBLE_DEVICES resolved against NVML's GPUs (when NVML answered)."""
    known = facts.gpus if facts.nvidia.get("available") else None
    return parse_visible_devices(facts.env.get(VARIABLE), known)


def job_gpus(facts) -> list[dict]:
    """The NVML GPUs the job will use: those CUDA_VISIBLE_DEVICES names, all of them when it is
    unset or unresolved; GPUs NVML could not describe are left out."""
    vis = from_facts(facts)
    gpus = [g for g in facts.gpus if not g.get("error")]
    if vis.is_set and vis.gpus is not None:
        wanted = set(vis.gpus)
        gpus = [g for g in gpus if g.get("index") in wanted]
    return gpus
