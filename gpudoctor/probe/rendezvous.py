"""Rendezvous facts: does MASTER_ADDR resolve, is it this host, is MASTER_PORT free to bind here.

Time-bounded: name resolution runs in a daemon thread that is abandoned after
RESOLVE_TIMEOUT. The port test binds and closes at once (never listens), and only on the
host that will bind the port: rank 0, or the host MASTER_ADDR names when no rank is set
yet (a preflight before launch). Under torchrun the elastic agent already owns the port.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import threading
import time
from collections.abc import Mapping

from gpudoctor.redact import redact_value

RESOLVE_TIMEOUT = 5.0


def _resolve(host: str, timeout: float = RESOLVE_TIMEOUT) -> dict:
    box: dict = {}

    def run():
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
            box["addresses"] = sorted({i[4][0] for i in infos})
        except OSError as e:
            box["error"] = f"{type(e).__name__}: {e}"
        except Exception as e:  # noqa: BLE001 - 'a..b' (UnicodeError: empty IDNA label), a NUL byte: not a host name
            box["error"] = f"not a valid host name ({type(e).__name__}: {str(e)[:200]})"

    started = time.monotonic()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    out: dict = {"seconds": round(time.monotonic() - started, 3)}
    if t.is_alive():
        out["error"] = f"name resolution did not answer within {timeout:g} s"
        out["timed_out"] = True
    else:
        out.update(box)
    return out


def _local_addresses() -> set[str]:
    try:
        import psutil

        return {
            a.address.split("%")[0]
            for addrs in psutil.net_if_addrs().values()
            for a in addrs
            if a.family in (socket.AF_INET, socket.AF_INET6)
        }
    except Exception:
        return set()


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def _names_this_host(addr: str, resolved: list[str], local: set[str]) -> bool | None:
    if addr in (socket.gethostname(), socket.getfqdn(), "localhost"):
        return True
    if not resolved:
        return None
    return any(a in local or _is_loopback(a) for a in resolved)


def _binder(env: Mapping[str, str], is_local: bool | None) -> tuple[bool, str]:
    """Whether this process (or the job about to start here) binds MASTER_PORT, and why."""
    if "TORCHELASTIC_RUN_ID" in env:
        return False, "torchrun's agent already hosts the rendezvous store"
    rank = env.get("RANK")
    if rank is not None:
        try:
            n = int(rank)
        except ValueError:  # also thousands of digits (the int-digit limit)
            return False, f"RANK={rank[:40]!r} is not a number"
        return n == 0, f"RANK={n}"
    if is_local:
        return True, "no RANK set and MASTER_ADDR names this host"
    if "MASTER_ADDR" not in env:
        return False, "no RANK or MASTER_ADDR set"
    return False, "no RANK set and MASTER_ADDR is another host"


def _try_bind(port: int) -> dict:
    """Bind like c10d's TCPStore server (all addresses, SO_REUSEADDR), then close without listening."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("", port))
        return {"free": True}
    except OSError as e:
        reasons = {errno.EADDRINUSE: "in use", errno.EACCES: "permission denied"}
        reason = reasons.get(e.errno, "error") if e.errno is not None else "error"
        return {"free": False, "reason": reason, "error": f"{type(e).__name__}: {e.strerror or e}"}
    finally:
        s.close()


def _port(text: str | None) -> int | None:
    try:
        n = int(text) if text is not None else None
    except ValueError:
        return None
    return n if n is not None and 1 <= n <= 65535 else None


def probe(environ: Mapping[str, str] | None = None) -> dict:
    env: Mapping[str, str] = os.environ if environ is None else environ
    addr, port_text = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    # user:password@host or a URL with a token: the facts keep the host, never the credential
    shown_addr = redact_value(addr) if addr is not None else None
    shown_port = redact_value(port_text)[:100] if port_text is not None else None
    out: dict = {"master_addr": shown_addr, "master_port": shown_port, "hostname": socket.gethostname()}
    is_local = None
    if addr:
        res = _resolve(addr.strip())
        resolved = res.get("addresses") or []
        out["resolve"] = res
        out["resolved"] = resolved
        out["loopback"] = bool(resolved) and all(_is_loopback(a) for a in resolved)
        is_local = _names_this_host(addr.strip(), resolved, _local_addresses())
        out["is_this_host"] = is_local
    binds, why = _binder(env, is_local)
    out["binds_port_here"] = binds
    out["binds_port_reason"] = why
    port = _port(port_text)
    if binds and port is not None:
        out["port_check"] = {"port": port, **_try_bind(port)}
    return out
