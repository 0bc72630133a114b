"""NCCL_* and TORCH_NCCL_* variables, read the way NCCL and torch read them.

How NCCL reads its variables (NCCL source, src/misc/param.cc, src/graph/paths.cc, src/debug.cc,
socket.cc; NCCL docs "Environment Variables"):
- integer parameters go through strtoll(value, NULL, 0): base 0 ('0x10' is 16, '010' is 8) and
  only the leading number counts ('4MB' is 4, 'true' is 0; recent releases fall back to the
  default when there is no number at all). NCCL_IB_DISABLE disables IB when non-zero;
  NCCL_P2P_DISABLE disables P2P only when it reads exactly 1.
- NCCL_P2P_LEVEL / NCCL_NET_GDR_LEVEL: case-sensitive path names (LOC, NVL, PIX, ...) or a
  legacy number; anything else is ignored.
- NCCL_DEBUG: VERSION, WARN, INFO, ABORT, TRACE, case-insensitive.
- NCCL_SOCKET_IFNAME / NCCL_IB_HCA: comma-separated prefixes; a leading '^' excludes, then a
  leading '=' makes every entry an exact name; ':port' suffixes are allowed.
torch's ProcessGroupNCCL reads TORCH_NCCL_* booleans as y/yes/t/true/1 or n/no/f/false/0 and
integers with std::stoi; anything else raises when the process group is created.
"""

from __future__ import annotations

import re

LLONG_MAX = 2**63 - 1


def c_strtoll(text: str) -> int | None:
    """The number C's strtoll(text, NULL, 0) reads at the start of text; None when there is none.
    Past the range of long long it saturates at LLONG_MAX / LLONG_MIN (ERANGE), as C does."""
    m = re.match(r"^\s*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)", text)
    if not m:
        return None
    digits = m.group(2)
    if digits[:2].lower() == "0x":
        base, body = 16, digits[2:]
    elif digits.startswith("0") and len(digits) > 1:
        base, body = 8, digits[1:]
    else:
        base, body = 10, digits
    body = body.lstrip("0") or "0"
    # 64 bits are at most 16 hex, 22 octal or 20 decimal digits: longer is out of range without int(), which
    # refuses more than 4300 decimal digits (ValueError)
    n = LLONG_MAX + 1 if len(body) > {16: 16, 8: 22, 10: 20}[base] else int(body, base)
    if m.group(1) == "-":
        return -min(n, LLONG_MAX + 1)
    return min(n, LLONG_MAX)


def decimal_int(text: str) -> int:
    """[+-]digits as a number; one of more than 30 digits (past any C integer) reads as +-10**30, since
    Python's int() refuses more than 4300 digits."""
    body = text.strip()
    sign = -1 if body.startswith("-") else 1
    digits = body.lstrip("+-").lstrip("0") or "0"
    return sign * (10**30 if len(digits) > 30 else int(digits))


def is_plain_int(text: str) -> bool:
    """strtoll(text, NULL, 0) reads all of it (blanks aside): decimal, 0x hex or 0 octal."""
    return re.fullmatch(r"\s*[+-]?(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)\s*", text) is not None


def octal_surprise(text: str) -> int | None:
    """'010' is octal to strtoll's base 0: the number NCCL reads when it differs from the decimal one."""
    if re.fullmatch(r"\s*[+-]?0[0-7]+\s*", text) and len(text) < 40 and c_strtoll(text) != int(text):
        return c_strtoll(text)
    return None


def nccl_flag(env: dict, name: str) -> int:
    """What NCCL makes of an integer flag: 0 when unset or when the value holds no number."""
    text = env.get(name)
    return 0 if text is None else (c_strtoll(text) or 0)


def p2p_disabled(env: dict) -> str | None:
    """Which setting turns NCCL's P2P transport (NVLink/PCIe peer access) off, if any."""
    text = env.get("NCCL_P2P_DISABLE")
    if text is not None and c_strtoll(text) == 1:
        return f"NCCL_P2P_DISABLE={text}"
    level = env.get("NCCL_P2P_LEVEL")
    if level == "LOC" or (level and level[0] in "0123456789" and c_strtoll(level) == 0):
        return f"NCCL_P2P_LEVEL={level}"
    return None


# --- interface and HCA lists ---------------------------------------------------------------


def parse_prefix_list(value: str) -> tuple[bool, bool, list[str]]:
    """NCCL_SOCKET_IFNAME / NCCL_IB_HCA -> (exclude, exact, names); ':port' suffixes dropped."""
    exclude = value.startswith("^")
    rest = value[1:] if exclude else value
    exact = rest.startswith("=")
    rest = rest[1:] if exact else rest
    names = [part.split(":", 1)[0] for part in rest.split(",")]
    return exclude, exact, [n for n in names if n]


def name_matches(name: str, entries: list[str], exact: bool) -> bool:
    return any(name == e if exact else name.startswith(e) for e in entries)


def select_names(value: str, names: list[str]) -> list[str]:
    """The names an NCCL prefix list selects, in order."""
    exclude, exact, entries = parse_prefix_list(value)
    return [n for n in names if name_matches(n, entries, exact) != exclude]


def hca_port_selected(value: str | None, device: str, port) -> bool:
    """Whether NCCL_IB_HCA lets NCCL use this port of this device. Each entry is a device-name prefix (an exact
    name after '='), ':N' limits it to port N, '^' turns the list into exclusions (NCCL src/misc/utils.cc
    matchIfList/matchPort, used by ncclIbInit in src/transport/net_ib.cc); unset or empty selects every port."""
    if not value:
        return True
    exclude = value.startswith("^")
    rest = value[1:] if exclude else value
    exact = rest.startswith("=")
    rest = rest[1:] if exact else rest
    for part in filter(None, rest.split(",")):
        name, _, wanted = part.partition(":")
        if name_matches(device, [name], exact) and (not wanted or wanted == str(port)):
            return not exclude
    return exclude


# --- whole-environment problems (GD-NCCL-006) ---------------------------------------------

NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "ABORT", "TRACE")
NCCL_FLAGS = (
    "NCCL_IB_DISABLE",
    "NCCL_P2P_DISABLE",
    "NCCL_SHM_DISABLE",
    "NCCL_NET_GDR_READ",
    "NCCL_CUMEM_ENABLE",
    "NCCL_NVLS_ENABLE",
)
NCCL_RANGES = {  # name: (low, high, what)
    "NCCL_IB_TIMEOUT": (1, 31, "the IB verbs timeout exponent (4.096 us x 2^value)"),
    "NCCL_IB_RETRY_CNT": (0, 7, "the IB verbs retry count"),
    "NCCL_BUFFSIZE": (1, None, "a size in bytes"),
    "NCCL_MIN_NCHANNELS": (1, None, "a channel count"),
    "NCCL_MAX_NCHANNELS": (1, None, "a channel count"),
    "NCCL_NSOCKS_PERTHREAD": (1, None, "a socket count"),
    "NCCL_SOCKET_NTHREADS": (1, None, "a thread count"),
}
NCCL_NTHREADS_VALUES = (64, 128, 256, 512)
P2P_LEVELS = ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS")

TORCH_NCCL_INTS = (
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_ASYNC_ERROR_HANDLING",
    "TORCH_NCCL_TRACE_BUFFER_SIZE",
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",
)
TORCH_NCCL_BOOLS = (
    "TORCH_NCCL_BLOCKING_WAIT",
    "NCCL_BLOCKING_WAIT",
    "TORCH_NCCL_DESYNC_DEBUG",
    "NCCL_DESYNC_DEBUG",
    "TORCH_NCCL_ENABLE_TIMING",
    "NCCL_ENABLE_TIMING",
    "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_NCCL_ENABLE_MONITORING",
    "TORCH_NCCL_RETHROW_CUDA_ERRORS",
    "TORCH_NCCL_NAN_CHECK",
    "TORCH_NCCL_HIGH_PRIORITY",
    "TORCH_NCCL_AVOID_RECORD_STREAMS",
)
NCCL_ALGOS = (
    "Tree",
    "Ring",
    "CollnetDirect",
    "CollnetChain",
    "NVLS",
    "NVLSTree",
    "PAT",
    "CollNet",
)  # CollNet: NCCL < 2.14
NCCL_PROTOS = ("LL", "LL128", "Simple")
NCCL_FUNCS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce", "SendRecv")


def unknown_list_tokens(value: str, known: tuple[str, ...]) -> list[str]:
    """Names NCCL's parseList (src/graph/tuning.cc) would not recognise in NCCL_ALGO / NCCL_PROTO:
    'a,b' or '^a' or 'a,b;allreduce:^c' - comparisons are case-insensitive."""
    lower_known = {k.lower() for k in known}
    lower_funcs = {f.lower() for f in NCCL_FUNCS}
    bad = []
    for part in filter(None, value.split(";")):
        prefix, _, items = part.rpartition(":")
        if prefix and prefix.strip().lower() not in lower_funcs:
            bad.append(prefix.strip())
        for item in items.lstrip("^").split(","):
            if item.strip() and item.strip().lower() not in lower_known:
                bad.append(item.strip())
    return bad


STOI_MAX = 2**31 - 1  # torch reads TORCH_NCCL_* integers with std::stoi, which throws beyond int
TORCH_BOOL_WORDS = ("y", "yes", "1", "t", "true", "n", "no", "0", "f", "false")


def _nccl_flag_problem(name: str, text: str) -> str | None:
    n = c_strtoll(text)
    if n is None:
        return (
            f"{name}={text!r}: NCCL reads integers, so this is 0 (or the default) "
            "and does NOT turn the feature off; use 1"
        )
    if not is_plain_int(text):
        return f"{name}={text!r}: NCCL reads only the leading number ({n})"
    if octal_surprise(text) is not None:
        return f"{name}={text!r}: a leading 0 makes NCCL read it as octal, i.e. {n}"
    if name == "NCCL_P2P_DISABLE" and n not in (0, 1):
        return f"{name}={text!r}: only 1 disables P2P; {n} leaves it on"
    return None


def _nccl_range_problem(name: str, text: str) -> str | None:
    low, high, what = NCCL_RANGES[name]
    n = c_strtoll(text)
    if n is None:
        return f"{name}={text!r} is not a number ({what}): NCCL ignores it"
    if not is_plain_int(text):
        return f"{name}={text!r}: NCCL reads only the leading number, {n} ({what})"
    if octal_surprise(text) is not None:
        return f"{name}={text!r}: a leading 0 makes NCCL read it as octal, i.e. {n} ({what})"
    if n < low or (high is not None and n > high):
        return f"{name}={n} is outside {low}-{high if high is not None else 'max'} ({what})"
    return None


def nccl_problems(env: dict) -> list[str]:
    out = []
    for name in NCCL_FLAGS:
        if name in env:
            out.append(_nccl_flag_problem(name, env[name]))
    for name in NCCL_RANGES:
        if name in env:
            out.append(_nccl_range_problem(name, env[name]))
    if "NCCL_NTHREADS" in env:
        text = env["NCCL_NTHREADS"]
        if c_strtoll(text) not in NCCL_NTHREADS_VALUES or not is_plain_int(text):
            read = (
                f" (NCCL reads {c_strtoll(text)})"
                if c_strtoll(text) is not None and octal_surprise(text) is not None
                else ""
            )
            out.append(f"NCCL_NTHREADS={text!r}: accepted values are 64, 128, 256 and 512{read}")
    for name in ("NCCL_P2P_LEVEL", "NCCL_NET_GDR_LEVEL"):
        text = env.get(name)
        if (
            text is not None and text not in P2P_LEVELS and not (text and text[0] in "0123456789")
        ):  # NCCL: '0' <= str[0] <= '9'
            hint = f" (values are case-sensitive: {text.upper()})" if text.upper() in P2P_LEVELS else ""
            out.append(f"{name}={text!r} is not a level NCCL knows ({', '.join(P2P_LEVELS)}){hint}: NCCL ignores it")
    debug = env.get("NCCL_DEBUG")
    if debug is not None and debug.strip().upper() not in NCCL_DEBUG_LEVELS:
        out.append(
            f"NCCL_DEBUG={debug!r} is not a level ({', '.join(NCCL_DEBUG_LEVELS)}): "
            "NCCL logs nothing, not even warnings"
        )
    for name in TORCH_NCCL_INTS:
        text = env.get(name)
        number = re.match(r"^\s*([+-]?[0-9]+)", text) if text is not None and "ASYNC_ERROR_HANDLING" in name else None
        if number is not None:
            mode = decimal_int(number.group(1))
            if not 0 <= mode <= 3:
                # torch casts the number to its mode enum without checking: no error, and no mode applies
                out.append(
                    f"{name}={text!r} is not a mode "
                    "(0 none, 1 tear down, 2 clean up only, 3 skip clean-up, the default): "
                    "torch accepts it without a word and then neither tears down nor cleans up on a NCCL error"
                )
    for name, known in (("NCCL_ALGO", NCCL_ALGOS), ("NCCL_PROTO", NCCL_PROTOS)):
        if env.get(name):
            unknown = unknown_list_tokens(env[name], known)
            if unknown:
                out.append(
                    f"{name}={env[name]!r}: {', '.join(map(repr, unknown))} is not one of {', '.join(known)} "
                    "(case-insensitive, '^' to exclude, 'allreduce:...' per collective): recent NCCL releases fail "
                    "communicator creation with 'invalid usage', older ones ignore the name"
                )
    family = env.get("NCCL_SOCKET_FAMILY")
    if family is not None and family not in ("AF_INET", "AF_INET6"):
        out.append(f"NCCL_SOCKET_FAMILY={family!r} is neither AF_INET nor AF_INET6: NCCL ignores it")
    return [p for p in out if p]


def torch_nccl_problems(env: dict) -> list[str]:
    """Values that make torch's ProcessGroupNCCL raise when it is created."""
    out = []
    for name in TORCH_NCCL_INTS:
        text = env.get(name)
        number = re.match(r"^\s*[+-]?[0-9]+", text) if text is not None else None
        if text is not None and not number:
            out.append(
                f"{name}={text!r} is not an integer: creating the NCCL process group raises "
                "'Invalid value for environment variable'"
            )
        elif number and abs(decimal_int(number.group(0))) > STOI_MAX:
            out.append(
                f"{name}={text!r} does not fit in an int (at most {STOI_MAX}): torch's std::stoi fails, "
                "so creating the NCCL "
                "process group raises 'Invalid value for environment variable'"
            )
    for name in TORCH_NCCL_BOOLS:
        text = env.get(name)
        if text is not None and text.lower() not in TORCH_BOOL_WORDS:
            out.append(
                f"{name}={text!r} is not a boolean (1/0, true/false, yes/no): creating the NCCL process group raises"
            )
    return out
