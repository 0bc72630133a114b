"""The wire format of `check --job`: what each rank writes to the job's TCPStore, and what rank 0 writes
back. What another machine wrote is untrusted input: the ordinary cause is version skew (a node with
another gpudoctor release in the same job) or a stray program on the port, not an attacker.

Every entry is one JSON object carrying FORMAT (this exchange's version) and the writer's gpudoctor
version. Reading one checks, in order: its size (bounded before decoding), UTF-8, JSON, an object, the
format version, then each field's type; an entry that fails raises EntryError with one short reason, and
the caller treats that rank as not reported (GD-JOB-001 names it). Every string that passes is cleaned
and bounded (gpudoctor.sanitize), so no text from another machine can reach a terminal raw.
"""

from __future__ import annotations

import json
from typing import Any

from gpudoctor import __version__
from gpudoctor.job.compare import Member
from gpudoctor.sanitize import bounded, clean, clean_tree

FORMAT = 1
MAX_MEMBER_BYTES = 64 * 1024  # m/<rank>: who the rank is and its digests, a few hundred bytes
MAX_CONTENTS_BYTES = 8 * 2**20  # c/<rank>: the aspects asked for (environment, findings), kilobytes
MAX_CONTROL_BYTES = 64 * 1024  # rank 0's request and verdict


class EntryError(ValueError):
    """An entry this gpudoctor cannot read; str(e) says why in a few words."""


def encode(payload: dict) -> str:
    return json.dumps({**payload, "format": FORMAT, "gpudoctor": __version__}, separators=(",", ":"))


def _object(raw: bytes | str, limit: int) -> dict:
    data = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else bytes(raw)
    if len(data) > limit:
        raise EntryError(f"an entry of {len(data):,} bytes, more than the {limit:,} this format allows")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise EntryError("not UTF-8 text") from None
    try:
        value = json.loads(text)
    except ValueError:
        raise EntryError("not JSON") from None
    if not isinstance(value, dict):
        raise EntryError(f"a JSON {type(value).__name__} where an object belongs")
    if value.get("format") != FORMAT:
        writer = value.get("gpudoctor")
        by = f" written by gpudoctor {bounded(clean(writer), 40)}" if isinstance(writer, str) else ""
        raise EntryError(f"exchange format {bounded(clean(value.get('format')), 40)}{by}, not {FORMAT}")
    return value


def _claimed(raw: bytes | str, name: str, limit: int) -> str | None:
    """A text field an unreadable entry still claims (cleaned, bounded), for the finding's wording."""
    try:
        value = json.loads(bytes(raw.encode() if isinstance(raw, str) else raw)[:MAX_MEMBER_BYTES])
    except (ValueError, UnicodeDecodeError):
        return None
    text = value.get(name) if isinstance(value, dict) else None
    return bounded(clean(text), limit) if isinstance(text, str) and text else None


def writer_of(raw: bytes | str) -> str | None:
    """The gpudoctor version an unreadable entry names, where it names one."""
    return _claimed(raw, "gpudoctor", 40)


def host_of(raw: bytes | str) -> str | None:
    """The host name an unreadable entry claims, where it has one."""
    return _claimed(raw, "hostname", 253)


_FIELDS: dict[str, tuple[type, ...]] = {
    "node": (str,),
    "hostname": (str, type(None)),
    "node_index": (int, type(None)),
    "local_rank": (int, type(None)),
    "leader": (bool,),
    "gpu": (str, type(None)),
    "master": (dict, type(None)),
    "digests": (dict,),
}


def member(raw: bytes | str, rank: int) -> Member:
    """Rank `rank`'s entry m/<rank> as a Member, or EntryError."""
    d = _object(raw, MAX_MEMBER_BYTES)
    if type(d.get("rank")) is not int or d["rank"] != rank:
        raise EntryError(f"field rank is {bounded(clean(repr(d.get('rank'))), 40)}, not {rank}")
    for name, types in _FIELDS.items():
        value = d.get(name)
        # bool is an int in Python: a node index of true is as wrong as one of "0"
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise EntryError(f"field {name} is a {type(value).__name__}")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in d["digests"].items()):
        raise EntryError("field digests is not a map of text to text")
    d = clean_tree(d)
    return Member(
        rank=rank,
        node=d["node"] or "?",
        hostname=d.get("hostname"),
        node_index=d.get("node_index"),
        local_rank=d.get("local_rank"),
        leader=d["leader"],
        gpu=d.get("gpu"),
        master=d.get("master"),
        digests=d["digests"],
    )


def contents(raw: bytes | str, wanted: list[str]) -> dict[str, Any]:
    """A rank's c/<rank> entry: the aspects asked for, cleaned; others dropped."""
    d = _object(raw, MAX_CONTENTS_BYTES)
    return {a: clean_tree(d[a]) for a in wanted if d.get(a) is not None}


def request(raw: bytes | str) -> dict[str, list[str]]:
    """Rank 0's request: rank -> the aspects that rank must send."""
    d = _object(raw, MAX_CONTROL_BYTES)
    asked = d.get("ranks")
    if not isinstance(asked, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(a, str) for a in v) for k, v in asked.items()
    ):
        raise EntryError("field ranks is not a map of rank to aspect names")
    return asked


def verdict(raw: bytes | str) -> int:
    """Rank 0's verdict: the job's exit code."""
    code = _object(raw, MAX_CONTROL_BYTES).get("exit")
    if type(code) is not int or code not in (0, 1):
        raise EntryError(f"field exit is {bounded(clean(repr(code)), 40)}, not 0 or 1")
    return code
