"""PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF as torch's caching allocator reads them.

Pure parsing, no I/O, no torch import: the allocator checks must run without torch.

    conf = parse_alloc_conf("max_split_size_mb:512,expandable_segments:True", (2, 4))
    conf.settings  -> {"max_split_size_mb": "512", "expandable_segments": "True"}
    conf.errors    -> []   problems that make torch raise at the first CUDA allocation
    conf.warnings  -> []   settings that are ignored or probably not what was meant

How torch reads the value (c10/core/AllocatorConfig.{h,cpp}, c10/cuda/CUDAAllocatorConfig.cpp):
- the text is split into tokens at ',' ':' '[' ']'; blanks are dropped everywhere;
- key:value pairs separated by ','; a list value is written [a:b,c:d] (roundup_power2_divisions);
- an unknown key raises "Unrecognized CachingAllocator option" ("Unrecognized key ... in CUDA
  allocator config" from torch 2.10) - when the first CUDA memory is allocated, not at import;
- booleans are exactly True or False; numbers are read like C's stoi/stod (a leading number
  is taken, the rest ignored; no number at all raises);
- max_split_size_mb must be more than 20 (at least 20 from torch 2.10); garbage_collection_
  threshold strictly between 0 and 1; roundup divisions powers of two;
- a key given twice: the last one wins.
Which variable is read (one of them, never a merge of both):
- torch < 2.9 knows only PYTORCH_CUDA_ALLOC_CONF; torch 2.9 reads PYTORCH_ALLOC_CONF for the
  device-generic keys but its CUDA allocator still ignores expandable_segments there
  (pytorch#183387), so for CUDA it counts as ignored before 2.10;
- from 2.10 either name alone works;
- both set: torch 2.9 preferred PYTORCH_ALLOC_CONF (and warned that the old name is deprecated),
  torch 2.13 reads PYTORCH_CUDA_ALLOC_CONF first and ignores PYTORCH_ALLOC_CONF (c10/core/
  AllocatorConfig.cpp "keep the parsing order stable"; verified on 2.13.0 with
  torch._C._accelerator_getAllocatorSettings()). 2.10-2.12 are not verified: then both are checked.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

LEGACY_VAR = "PYTORCH_CUDA_ALLOC_CONF"
UNIFIED_VAR = "PYTORCH_ALLOC_CONF"
UNIFIED_SINCE = (2, 10)  # first torch whose CUDA allocator reads PYTORCH_ALLOC_CONF
LEGACY_FIRST_SINCE = (2, 13)  # verified: with both set, PYTORCH_CUDA_ALLOC_CONF wins
SPLIT_MIN_MB = 20  # kLargeBuffer / 1 MiB (from 2.13: large_segment_size_mb, default 20)
LARGE_SEGMENT_MIN_MB = 10  # kMinLargeAlloc / 1 MiB: large_segment_size_mb must be more
SPLIT_EQUAL_OK_SINCE = (2, 10)  # "must be > 20" became ">= 20" with AcceleratorAllocatorConfig
KNOWN_UP_TO = (2, 13)  # the newest torch whose key list this table was checked against
MAX_REGISTER_THREADS = 128
# Real allocator configs are a few pairs, under 200 characters; past this the value is not checked (one
# warning), so a pasted blob costs nothing and no message quotes kilobytes.
MAX_CONF_CHARS = 4096


@dataclass(frozen=True)
class Key:
    since: tuple[int, int]  # first torch version with the key
    kind: str  # how its value is checked (see _check_value)
    certain: bool = False  # True: `since` verified, so an older torch surely rejects the key
    removed: tuple[int, int] | None = None  # first torch version without it (approximate)


KEYS = {
    "max_split_size_mb": Key((1, 10), "split_mb", certain=True),
    "garbage_collection_threshold": Key((1, 12), "open_fraction"),
    "roundup_power2_divisions": Key((1, 12), "roundup"),
    "roundup_bypass_threshold_mb": Key((1, 13), "int", removed=(2, 1)),
    "backend": Key((2, 0), "backend", certain=True),
    "expandable_segments": Key((2, 1), "bool", certain=True),
    "release_lock_on_cudamalloc": Key((2, 2), "bool"),
    "release_lock_on_hipmalloc": Key((2, 2), "bool"),
    "pinned_use_cuda_host_register": Key((2, 2), "bool"),
    "pinned_use_hip_host_register": Key((2, 2), "bool"),
    "pinned_num_register_threads": Key((2, 2), "pow2_threads"),
    "max_non_split_rounding_mb": Key((2, 4), "split_mb"),
    "pinned_use_background_threads": Key((2, 5), "bool"),
    "graph_capture_record_stream_reuse": Key((2, 9), "bool"),
    "per_process_memory_fraction": Key((2, 9), "fraction"),
    "pinned_reserve_segment_size_mb": Key((2, 10), "positive_int"),
    "pinned_free_catch_all": Key((2, 12), "any"),
    "throw_on_cudamalloc_oom": Key((2, 12), "any"),
    "pinned_max_round_threshold_mb": Key((2, 13), "any"),
    "pinned_max_cached_size_mb": Key((2, 13), "any"),
    "expandable_segments_reserve": Key((2, 13), "any"),
    "large_segment_size_mb": Key((2, 13), "large_segment"),
}
# Options cudaMallocAsync ignores (torch warns "backend:cudaMallocAsync ignores ...").
NATIVE_ONLY = (
    "max_split_size_mb",
    "roundup_power2_divisions",
    "garbage_collection_threshold",
    "max_non_split_rounding_mb",
    "expandable_segments",
)


class AllocConfError(ValueError):
    """The text cannot be split into key:value pairs at all."""


@dataclass
class AllocConf:
    text: str
    pairs: list[tuple[str, str]] = field(default_factory=list)  # in order, values as written (lists joined)
    errors: list[str] = field(default_factory=list)  # torch raises at the first CUDA allocation
    warnings: list[str] = field(default_factory=list)  # accepted, but ignored or probably wrong
    notes: list[str] = field(default_factory=list)  # fine, worth knowing

    @property
    def settings(self) -> dict[str, str]:
        return dict(self.pairs)  # the last of a repeated key wins, as in torch

    @property
    def ok(self) -> bool:
        return not self.errors


def tokenize(text: str) -> list[str]:
    """Torch's ConfigTokenizer: separators are tokens, blanks vanish."""
    tokens, buf = [], ""
    for ch in text:
        if ch in ",:[]":
            if buf:
                tokens.append(buf)
                buf = ""
            tokens.append(ch)
        elif not ch.isspace():
            buf += ch
    if buf:
        tokens.append(buf)
    return tokens


def _split_pairs(tokens: list[str]) -> list[tuple[str, str | list[str]]]:
    """key ':' value (',' ...); a value may be a '[' ... ']' list. Raises AllocConfError."""
    pairs, i = [], 0
    while i < len(tokens):
        key = tokens[i]
        if key in ",:[]":
            raise AllocConfError(f"expected a key {_where(tokens, i)}, found {key!r}")
        if i + 1 >= len(tokens) or tokens[i + 1] != ":":
            hint = " (write key:value, not key=value)" if "=" in key else ""
            raise AllocConfError(f"{key!r} has no ':value'{hint}")
        if i + 2 >= len(tokens) or tokens[i + 2] in ",:]":
            raise AllocConfError(f"{key!r} has no value")
        if tokens[i + 2] == "[":
            try:
                end = tokens.index("]", i + 2)
            except ValueError:
                raise AllocConfError(f"{key!r}: '[' without a closing ']'") from None
            value: str | list[str] = tokens[i + 3 : end]
            i = end + 1
        else:
            value = tokens[i + 2]
            i += 3
        pairs.append((key, value))
        if i < len(tokens):
            if tokens[i] != ",":
                hint = " (separate pairs with ',')" if ";" in "".join(tokens) else ""
                raise AllocConfError(f"expected ',' after {key!r}'s value, found {tokens[i]!r}{hint}")
            i += 1
    return pairs


def _where(tokens: list[str], i: int) -> str:
    return "at the start" if i == 0 else f"after {''.join(tokens[:i])!r}"


def _leading_int(text: str) -> int | None:
    """C's stoi: an optional sign and ASCII digits at the start; None when there are none
    (C reads no other digits: a full-width '１２８' makes torch's stoi/stoull raise)."""
    m = _LEADING_INT.match(text)
    if not m:
        return None
    sign, digits = m.group(1), m.group(2).lstrip("0") or "0"
    if len(digits) > 40:  # past any parser's range (2**64 has 20 digits); int() of thousands of digits raises
        digits = "1" + "0" * 40
    return int(sign + digits)


_LEADING_INT = re.compile(r"([+-]?)([0-9]+)")
# A whole decimal number as C's stod reads it. Matched from the start only and compared with the length,
# never fullmatch-ed: with a trailing letter, fullmatch backtracks through every split of the digits.
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:nan|inf)", re.I)


def _leading_float(text: str) -> float | None:
    """C's stod: a leading decimal number, or nan/inf (which stod reads, and the range checks reject)."""
    m = re.match(r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", text) or re.match(
        r"^[+-]?(nan|inf)", text, re.I
    )
    return float(m.group(0)) if m else None


def _integer_parser(torch_version) -> tuple[str, int]:
    """The C++ call torch reads whole-number values with, and the largest magnitude it accepts:
    std::stoi before the shared ConfigTokenizer (2.10), std::stoull from then on (any sign)."""
    if torch_version is not None and tuple(torch_version[:2]) < SPLIT_EQUAL_OK_SINCE:
        return "stoi", 2**31 - 1
    return "stoull", 2**64 - 1


def _out_of_range(conf, key, value, n: int, torch_version) -> bool:
    """True (with the error recorded) when the number overflows torch's parser: std::out_of_range."""
    parser, limit = _integer_parser(torch_version)
    if abs(n) <= limit:
        return False
    torch = f"torch {_fmt(torch_version)}" if torch_version else "torch"
    conf.errors.append(
        f"{key}:{value} is too large for {torch}'s {parser} (at most {limit}): it raises std::out_of_range"
    )
    return True


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def parse_alloc_conf(text: str, torch_version: tuple[int, ...] | None = None, variable: str = LEGACY_VAR) -> AllocConf:
    """Check an allocator config string the way torch (of torch_version, when known) will."""
    conf = AllocConf(text=text)
    if len(text) > MAX_CONF_CHARS:
        conf.warnings.append(
            f"{variable} is {len(text):,} characters long; real allocator configs are a few pairs, "
            f"so gpudoctor does not check one over {MAX_CONF_CHARS:,} (torch still parses it)"
        )
        return conf
    try:
        raw_pairs = _split_pairs(tokenize(text))
    except AllocConfError as e:
        conf.errors.append(f"{variable}={text!r} is not key:value,key:value - {e}")
        return conf
    seen = set()
    for key, value in raw_pairs:
        shown = _join_list(value) if isinstance(value, list) else value
        conf.pairs.append((key, shown))
        if key in seen:
            conf.notes.append(f"{key} is given more than once; the last value ({shown}) wins")
        seen.add(key)
        _check_key(conf, key, value, torch_version)
    _check_combinations(conf)
    return conf


def _join_list(tokens: list[str]) -> str:
    return "[" + "".join(tokens) + "]"


def _check_key(conf: AllocConf, key: str, value, torch_version) -> None:
    spec = KEYS.get(key)
    if spec is None:
        close = difflib.get_close_matches(key, KEYS, n=1, cutoff=0.75)
        hint = f" (did you mean {close[0]}?)" if close else ""
        msg = f"unknown key {key!r}{hint}"
        if torch_version is not None and tuple(torch_version[:2]) > KNOWN_UP_TO:
            conf.warnings.append(
                f"{msg}: not a key of torch up to {_fmt(KNOWN_UP_TO)}; if torch {_fmt(torch_version)} does not know "
                "it either, the first CUDA allocation raises"
            )
        else:
            conf.errors.append(f"{msg}: torch raises 'Unrecognized ... option' at the first CUDA allocation")
        return
    if torch_version is not None:
        v = tuple(torch_version[:2])
        if v < spec.since:
            if spec.certain:
                conf.errors.append(
                    f"{key} arrived in torch {_fmt(spec.since)}; torch {_fmt(v)} raises 'Unrecognized "
                    "CachingAllocator option' at the first CUDA allocation"
                )
            else:
                conf.warnings.append(
                    f"{key} arrived in about torch {_fmt(spec.since)}; torch {_fmt(v)} probably rejects it "
                    "('Unrecognized CachingAllocator option')"
                )
            return
        if spec.removed and v >= spec.removed:
            conf.warnings.append(
                f"{key} is an old option (torch {_fmt(spec.since)}..); "
                "newer torch versions no longer list it and may reject it"
            )
            return
    _check_value(conf, key, spec.kind, value, torch_version)


def _check_value(conf: AllocConf, key: str, kind: str, value, torch_version) -> None:
    if isinstance(value, list) and kind != "roundup":
        conf.errors.append(f"{key} takes a single value, not a [list]")
        return
    check = _VALUE_CHECKS.get(kind)
    if check is not None:
        check(conf, key, value, torch_version)


def _mib(conf, key, value, parser: str, torch_version) -> int | None:
    """The leading whole number of MiB, as torch's parser (stoi, stoull) reads it; None after an error."""
    n = _leading_int(value)
    if n is None:
        conf.errors.append(f"{key}:{value} is not a number of MiB (torch's {parser} raises)")
        return None
    if _out_of_range(conf, key, value, n, torch_version):
        return None
    _note_trailing(conf, key, value, str(n))
    return n


def _check_split_mb(conf, key, value, torch_version) -> None:
    n = _mib(conf, key, value, _integer_parser(torch_version)[0], torch_version)
    if n is None:
        return
    if n < 0:
        conf.warnings.append(f"{key}:{value} is negative; torch reads it as a huge number, i.e. no limit")
    elif n < SPLIT_MIN_MB:
        conf.errors.append(
            f"{key}:{n} is too small: torch requires more than "
            f"{SPLIT_MIN_MB} MiB ('CachingAllocator option {key} too small')"
        )
    elif n == SPLIT_MIN_MB:
        if torch_version is None or tuple(torch_version[:2]) < SPLIT_EQUAL_OK_SINCE:
            conf.warnings.append(
                f"{key}:20 is the limit: torch before {_fmt(SPLIT_EQUAL_OK_SINCE)} "
                "requires more than 20 and raises; use 21 or more"
            )


def _check_large_segment(conf, key, value, torch_version) -> None:
    n = _mib(conf, key, value, "stoull", torch_version)
    if n is not None and 0 <= n <= LARGE_SEGMENT_MIN_MB:
        conf.errors.append(f"{key}:{n} is too small: torch requires more than {LARGE_SEGMENT_MIN_MB} MiB")


def _check_open_fraction(conf, key, value, torch_version) -> None:
    x = _leading_float(value)
    if x is None:
        conf.errors.append(f"{key}:{value} is not a number (torch's stod raises)")
        return
    _note_trailing(conf, key, value, None)
    if not 0 < x < 1:
        conf.errors.append(
            f"{key}:{value} must be strictly between 0 and 1 "
            "('garbage_collect_threshold is invalid, set it in (0.0, 1.0)')"
        )


def _check_fraction(conf, key, value, torch_version) -> None:
    x = _leading_float(value)
    if x is None:
        conf.errors.append(f"{key}:{value} is not a number")
    elif not 0 < x <= 1:
        conf.warnings.append(f"{key}:{value} should be a fraction of GPU memory between 0 and 1")


def _check_roundup(conf, key, value, torch_version) -> None:
    if not isinstance(value, list):
        n = _leading_int(value)
        if n is None:
            conf.errors.append(f"{key}:{value} is not a number")
        elif _out_of_range(conf, key, value, n, torch_version):
            pass
        elif not _pow2(n):
            conf.errors.append(
                f"{key}:{value} must be a power of 2 ('For roundups, the divisions has to be power of 2')"
            )
        return
    if torch_version is not None and tuple(torch_version[:2]) < (2, 1):
        conf.warnings.append(
            f"{key} as a [list] needs a newer torch (about 2.1); torch {_fmt(torch_version)} expects a single number"
        )
    items = [t for t in value if t != ","]
    pairs = [items[j : j + 3] for j in range(0, len(items), 3)]
    for p in pairs:
        if len(p) != 3 or p[1] != ":":
            conf.errors.append(f"{key}: list entries are size:divisions, e.g. [256:1,512:2,>:4]")
            return
        boundary, divisions = p[0], _leading_int(p[2])
        if boundary != ">" and not (re.fullmatch(r"[0-9]+", boundary) and _pow2(int(boundary))):
            conf.errors.append(f"{key}: interval {boundary!r} must be a power of 2 (MiB) or '>'")
        if divisions is None or not (divisions == 0 or _pow2(divisions)):
            conf.errors.append(f"{key}: divisions {p[2]!r} must be a power of 2, or 0 to disable rounding")


def _check_backend(conf, key, value, torch_version) -> None:
    if value not in ("native", "cudaMallocAsync"):
        close = difflib.get_close_matches(value, ["native", "cudaMallocAsync"], n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        conf.errors.append(
            f"backend:{value} is not a backend: use native or cudaMallocAsync{hint} ('Unknown allocator backend')"
        )


def _check_bool(conf, key, value, torch_version) -> None:
    if value not in ("True", "False"):
        hint = f" (write {value.capitalize()})" if value.lower() in ("true", "false") else ""
        conf.errors.append(f"{key}:{value} - torch accepts exactly True or False{hint}")


def _check_pow2_threads(conf, key, value, torch_version) -> None:
    n = _leading_int(value)
    if n is None or not _pow2(n) or n > MAX_REGISTER_THREADS:
        conf.errors.append(f"{key}:{value} must be a power of 2 up to {MAX_REGISTER_THREADS}")


def _check_positive_int(conf, key, value, torch_version) -> None:
    n = _leading_int(value)
    if n is None or n <= 0:
        conf.errors.append(f"{key}:{value} must be a whole number above 0")


def _check_int(conf, key, value, torch_version) -> None:
    if _leading_int(value) is None:
        conf.errors.append(f"{key}:{value} is not a number")


def _note_trailing(conf, key, value, read_as) -> None:
    m = _NUMBER.match(value)
    if m is None or m.end() != len(value):
        shown = f"it as {read_as}" if read_as is not None else "only its leading number"
        conf.warnings.append(f"{key}:{value} has extra characters; torch reads {shown} - write a plain number")


_VALUE_CHECKS = {
    "split_mb": _check_split_mb,
    "large_segment": _check_large_segment,
    "open_fraction": _check_open_fraction,
    "fraction": _check_fraction,
    "roundup": _check_roundup,
    "backend": _check_backend,
    "bool": _check_bool,
    "pow2_threads": _check_pow2_threads,
    "positive_int": _check_positive_int,
    "int": _check_int,
}


def _check_combinations(conf: AllocConf) -> None:
    s = conf.settings
    if s.get("backend") == "cudaMallocAsync":
        ignored = [k for k in NATIVE_ONLY if k in s]
        if ignored:
            conf.warnings.append(
                f"backend:cudaMallocAsync ignores {', '.join(ignored)} (those tune the native caching allocator)"
            )


def suggest_correction(text: str, torch_version: tuple[int, ...] | None = None) -> str | None:
    """A corrected value for the common slips (key=value, ';' between pairs, true/false in lower
    case), or None when those are not the problem or the result is still invalid."""
    if len(text) > MAX_CONF_CHARS:
        return None
    fixed = _repaired(text)
    if fixed == text or parse_alloc_conf(fixed, torch_version).errors:
        return None
    return fixed


def _repaired(text: str) -> str:
    """The common slips mended: key=value -> key:value, ';' -> ',', true/false -> True/False."""
    # The lookbehind anchors each key at its first letter: without it a long run of letters is rescanned
    # from every position (quadratic; 120k characters took minutes).
    fixed = re.sub(r"(?<![A-Za-z_])([A-Za-z_]+)\s*=\s*", r"\1:", text).replace(";", ",")
    return re.sub(r":\s*(true|false|TRUE|FALSE)\b", lambda m: ":" + m.group(1).capitalize(), fixed)


def _entries(text: str) -> list[str]:
    """The top-level comma-separated entries, a '[...]' list kept whole (roundup_power2_divisions:[256:1,512:2])."""
    out, depth, buf = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth <= 0:
            out.append(buf)
            buf = ""
        else:
            buf += ch
    out.append(buf)
    return [e.strip() for e in out if e.strip()]


def valid_entries(text: str, torch_version: tuple[int, ...] | None = None) -> tuple[str, list[str]]:
    """(the value with only the entries this torch accepts, the entries dropped), slips mended first.

    torch rejects the whole value for one bad entry (its first CUDA allocation raises), so the rest can only
    run once the bad ones are gone. ('', [all]) when none is valid or the kept ones are invalid together."""
    if len(text) > MAX_CONF_CHARS:
        return "", [text]
    entries = _entries(_repaired(text))
    kept = [e for e in entries if not parse_alloc_conf(e, torch_version).errors]
    value = ",".join(kept)
    if not kept or parse_alloc_conf(value, torch_version).errors:
        return "", entries
    return value, [e for e in entries if e not in kept]


def _fmt(v) -> str:
    return ".".join(str(p) for p in v[:2])


@dataclass(frozen=True)
class Variables:
    """Which allocator variable this torch reads, and which are set but ignored."""

    effective: str | None  # the variable torch reads; None when none is set or the order is unknown
    value: str | None
    ignored: tuple[str, ...]  # set, but this torch does not read it
    version_known: bool
    deprecated_alias: bool  # PYTORCH_CUDA_ALLOC_CONF alone on torch >= 2.10 (the older name; it works)
    order_unknown: bool = False  # both set on a torch whose precedence is not verified: either may win

    @property
    def candidates(self) -> tuple[str, ...]:
        """The variables torch may read: the effective one, or both when that is unknown."""
        if self.effective:
            return (self.effective,)
        return (UNIFIED_VAR, LEGACY_VAR) if self.order_unknown else ()


def effective_variable(env: dict[str, str], torch_version: tuple[int, ...] | None) -> Variables:
    legacy, unified = env.get(LEGACY_VAR), env.get(UNIFIED_VAR)
    if torch_version is None:
        both = legacy is not None and unified is not None
        name = None if both else (UNIFIED_VAR if unified is not None else (LEGACY_VAR if legacy is not None else None))
        return Variables(name, env.get(name) if name else None, (), False, False, order_unknown=both)
    v = tuple(torch_version[:2])
    if v < UNIFIED_SINCE:
        ignored = (UNIFIED_VAR,) if unified is not None else ()
        return Variables(LEGACY_VAR if legacy is not None else None, legacy, ignored, True, False)
    if unified is None or legacy is None:
        name = UNIFIED_VAR if unified is not None else (LEGACY_VAR if legacy is not None else None)
        return Variables(name, env.get(name) if name else None, (), True, name == LEGACY_VAR)
    if v >= LEGACY_FIRST_SINCE:
        return Variables(LEGACY_VAR, legacy, (UNIFIED_VAR,), True, False)
    return Variables(None, None, (), True, False, order_unknown=True)
