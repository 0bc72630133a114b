"""Kernel facts: the command line and the kernel log's GPU and PCIe evidence (section "kernel").

The log is read from /dev/kmsg (no subprocess; needs CAP_SYSLOG where kernel.dmesg_restrict=1),
else from `journalctl -k`, else from `dmesg`, each bounded in time and size. Only messages of
the last WINDOW_HOURS hours are kept, and at most MAX_EVENTS of each kind: Xid events
("NVRM: Xid (PCI:0000:3b:00): 79, ..."), NVRM messages that ask for a GPU reset or reboot, and
PCIe AER errors. When no source can be read (a container, a user without the right), log is
{"readable": false, "attempts": [{source, reason}]} so a check can say why it cannot judge.

Section "kernel": cmdline (str | None), iommu_params [str], log {readable, source, window_hours, xid [...],
reset_required [...], aer [...], truncated, attempts, aer_corrected_by_device {source: count} (uncapped, issue
25), window_seconds (the time the counts cover)}.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import time

from gpudoctor.fileio import read_text
from gpudoctor.redact import redact_cmdline

WINDOW_HOURS = 24
MAX_EVENTS = 50  # per kind: enough to judge, small enough for a snapshot
MAX_RECORDS = 200_000  # /dev/kmsg records read at most (the ring buffer holds far fewer)
MAX_OUTPUT_BYTES = 16 * 1024 * 1024  # journalctl/dmesg output kept at most
COMMAND_TIMEOUT = 3.0
READ_DEADLINE = 2.0  # seconds spent reading /dev/kmsg at most

XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+)(?:,\s*(.*))?")
RESET_REQUIRED = re.compile(
    r"NVRM:.*(reset required|requires? (?:a )?(?:gpu )?reset|reboot required|drain and reset)", re.I
)
# Xid 154 names the recovery action the driver now asks for: "... changed from 0x0 (None) to 0x1 (GPU Reset Required)"
RECOVERY_ACTION = re.compile(r"recovery action changed from .*? to 0x[0-9A-Fa-f]+ \(([^)]*)\)")
AER = re.compile(r"AER: (?:Multiple )?(Corrected|Uncorrected \((?:Non-Fatal|Fatal)\)) error received:?\s*(\S*)")
PCIE_BUS_ERROR = re.compile(r"(\S+): PCIe Bus Error: severity=([^,]+)")
CORRECTED_PREFIX = "aer_corrected:"  # counts' keys for corrected AER errors per source device


def run_bounded(cmd: list[str], timeout: float, env: dict | None = None) -> tuple[int, str, str]:
    """(returncode, stdout, stderr) of cmd, run in its own process group; at the deadline the whole
    group is killed (a wrapper's children too) and subprocess.TimeoutExpired is raised."""
    from gpudoctor.probe import proc  # the one bounded runner (group killed at exit and at the deadline)

    r = proc.run_bounded(cmd, timeout, env=env, max_output=MAX_OUTPUT_BYTES)
    return r.returncode, r.stdout, r.stderr[:4096]


def classify(message: str, seconds_ago: float | None, events: dict[str, list], counts: dict[str, int]) -> None:
    """Adds one kernel message to the Xid / reset-required / AER lists it belongs to."""
    if "NVRM" not in message and "AER" not in message and "PCIe Bus Error" not in message:
        return  # the common case, without running the patterns
    age = None if seconds_ago is None else round(max(seconds_ago, 0.0))
    action = RECOVERY_ACTION.search(message)
    if action and action.group(1).strip().lower() == "none":
        return  # Xid 154 "recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)": a reset cleared it
    m = XID.search(message)
    if m:
        _add(
            events,
            counts,
            "xid",
            {"pci": m.group(1), "code": int(m.group(2)), "message": _short(m.group(3) or ""), "seconds_ago": age},
        )
    if RESET_REQUIRED.search(message):
        _add(events, counts, "reset_required", {"message": _short(message), "seconds_ago": age})
    m = AER.search(message)
    if m:
        severity = (
            m.group(1).lower().replace("uncorrected (non-fatal)", "non_fatal").replace("uncorrected (fatal)", "fatal")
        )
        if severity == "corrected":  # one "AER: Corrected error received: <source>" line per error, uncapped
            key = CORRECTED_PREFIX + (m.group(2) or "?")
            if key in counts or sum(k.startswith(CORRECTED_PREFIX) for k in counts) < MAX_EVENTS:
                counts[key] = counts.get(key, 0) + 1
        _add(
            events,
            counts,
            "aer",
            {"severity": severity, "device": m.group(2) or None, "message": _short(message), "seconds_ago": age},
        )
        return
    m = PCIE_BUS_ERROR.search(message)
    if m:
        severity = (
            m.group(2)
            .strip()
            .lower()
            .replace("uncorrected (non-fatal)", "non_fatal")
            .replace("uncorrected (fatal)", "fatal")
        )
        _add(
            events,
            counts,
            "aer",
            {"severity": severity, "device": m.group(1), "message": _short(message), "seconds_ago": age},
        )


def _add(events: dict[str, list], counts: dict[str, int], kind: str, event: dict) -> None:
    counts[kind] = counts.get(kind, 0) + 1
    kept = events.setdefault(kind, [])
    kept.append(event)
    if len(kept) > MAX_EVENTS:  # keep the newest: messages arrive oldest first
        del kept[0]


def _short(text: str) -> str:
    return text.strip()[:300]


def _uptime(proc_root: str) -> float | None:
    text = read_text(os.path.join(proc_root, "uptime"))
    try:
        return float(text.split()[0]) if text else None
    except ValueError:
        return None


def _from_kmsg(path: str, uptime: float | None, window: float, events: dict, counts: dict) -> None:
    """Reads every record in the ring buffer once, non-blocking. Raises OSError when unreadable."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        deadline = time.monotonic() + READ_DEADLINE
        for _ in range(MAX_RECORDS):
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                return  # the end of the buffer
            except OSError as e:
                if e.errno == errno.EPIPE:  # a record overwritten while reading: go on with the next
                    continue
                raise
            if not record or time.monotonic() > deadline:
                return
            header, _, body = record.decode("utf-8", "replace").partition(";")
            fields = header.split(",")
            try:
                usec = int(fields[2])
            except (IndexError, ValueError):
                continue
            ago = None if uptime is None else uptime - usec / 1e6
            if ago is not None and ago > window:
                continue
            classify(body.split("\n", 1)[0], ago, events, counts)
    finally:
        os.close(fd)


def _from_journal(journalctl: str, hours: int, events: dict, counts: dict, env: dict) -> str | None:
    """None when read; otherwise why the journal could not be used."""
    code, out, err = run_bounded(
        [journalctl, "-k", "-q", "--no-pager", "-o", "short-unix", "--since", f"{hours} hours ago"],
        COMMAND_TIMEOUT,
        env,
    )
    if code != 0:
        return f"journalctl exited with {code}: {err.strip()[:200]}"
    if "insufficient permissions" in err or "not seeing messages" in err:
        return "journalctl: no permission to read the system journal (needs the adm or systemd-journal group)"
    now = time.time()
    for line in out.splitlines():
        stamp, _, rest = line.partition(" ")
        try:
            ago = now - float(stamp)
        except ValueError:
            continue
        if ago <= hours * 3600.0:  # --since already does this; a journal with a skewed clock may not
            classify(rest, ago, events, counts)
    return None


_DMESG_LINE = re.compile(r"^\[\s*(\d+\.\d+)\]\s?(.*)$")


def _from_dmesg(dmesg: str, uptime: float | None, window: float, events: dict, counts: dict, env: dict) -> str | None:
    code, out, err = run_bounded([dmesg], COMMAND_TIMEOUT, env)
    if code != 0:
        return f"dmesg exited with {code}: {err.strip()[:200]}"
    for line in out.splitlines():
        m = _DMESG_LINE.match(line)
        if not m:
            continue
        ago = None if uptime is None else uptime - float(m.group(1))
        if ago is not None and ago > window:
            continue
        classify(m.group(2), ago, events, counts)
    return None


def kernel_log(
    kmsg_path: str = "/dev/kmsg", proc_root: str = "/proc", path: str | None = None, hours: int = WINDOW_HOURS
) -> dict:
    """The log's GPU/PCIe evidence of the last `hours` hours, from the first source that can be read.
    path: the PATH searched for journalctl and dmesg (default: this process's)."""
    search = os.environ.get("PATH", os.defpath) if path is None else path
    env = {**os.environ, "LC_ALL": "C", "SYSTEMD_PAGER": "", "PAGER": "cat"}
    uptime = _uptime(proc_root)
    window = hours * 3600.0
    attempts: list[dict] = []
    for source in ("/dev/kmsg", "journalctl", "dmesg"):
        events: dict[str, list] = {}
        counts: dict[str, int] = {}
        try:
            if source == "/dev/kmsg":
                _from_kmsg(kmsg_path, uptime, window, events, counts)
                reason = None
            else:
                tool = shutil.which(source, path=search)
                if tool is None:
                    attempts.append({"source": source, "reason": f"{source} not found on PATH"})
                    continue
                if source == "journalctl":
                    reason = _from_journal(tool, hours, events, counts, env)
                else:
                    reason = _from_dmesg(tool, uptime, window, events, counts, env)
        except subprocess.TimeoutExpired:
            reason = f"{source} did not answer within {COMMAND_TIMEOUT:g} s (killed)"
        except FileNotFoundError:
            reason = f"{source} does not exist (a container?)"
        except PermissionError:
            reason = f"{source}: permission denied (kernel.dmesg_restrict; needs root or CAP_SYSLOG)"
        except OSError as e:
            reason = f"{source}: {e.strerror or e}"
        if reason is not None:
            attempts.append({"source": source, "reason": reason})
            continue
        return {
            "readable": True,
            "source": source,
            "window_hours": hours,
            "xid": events.get("xid", []),
            "reset_required": events.get("reset_required", []),
            "aer": events.get("aer", []),
            "counts": {k: counts.get(k, 0) for k in ("xid", "reset_required", "aer")},
            "aer_corrected_by_device": {
                k.removeprefix(CORRECTED_PREFIX): n for k, n in counts.items() if k.startswith(CORRECTED_PREFIX)
            },
            # the time the counts cover: the window, or less when the machine booted within it
            "window_seconds": round(min(window, uptime)) if uptime is not None else None,
            "truncated": any(n > MAX_EVENTS for k, n in counts.items() if not k.startswith(CORRECTED_PREFIX)),
            "attempts": attempts,
        }
    return {"readable": False, "source": None, "window_hours": hours, "attempts": attempts}


def probe(proc_root: str = "/proc", kmsg_path: str = "/dev/kmsg", path: str | None = None) -> dict:
    cmdline = read_text(os.path.join(proc_root, "cmdline"))
    shown = redact_cmdline(cmdline[:4096]) if cmdline is not None else None
    return {"cmdline": shown, "iommu_params": iommu_params(shown or ""), "log": kernel_log(kmsg_path, proc_root, path)}


_IOMMU_PARAM = re.compile(r"^(iommu|intel_iommu|amd_iommu|iommu\.passthrough|iommu\.strict|pcie_acs_override)=")


def iommu_params(cmdline: str) -> list[str]:
    """The boot parameters that set the IOMMU mode: intel_iommu=on, iommu=pt, iommu.passthrough=1, ..."""
    return [word for word in cmdline.split() if _IOMMU_PARAM.match(word)][:16]
