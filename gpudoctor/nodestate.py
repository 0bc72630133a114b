"""This node as SLURM sees it: its name, its state and reason, and the two changes `gpudoctor health` makes
(drain with a reason, resume a node it drained). Every command runs through probe.proc.run_bounded.

What slurmd gives the programs it runs (verified on the test cluster, SLURM 22.05.8): the
HealthCheckProgram gets SLURMD_NODENAME and nothing else (no PATH, no SLURM_CONF: scontrol then reads
/etc/slurm/slurm.conf or finds a configless controller as any client does); the Prolog gets
SLURMD_NODENAME, SLURM_CONF, SLURM_JOB_ID and the job's other SLURM_* values (slurm.conf(5), "Prolog and
Epilog Scripts"). SLURM stores a long reason whole (3,000 characters were kept), but `sinfo -R` shows
only its first 20 characters (sinfo(1), --list-reasons), so the reason leads with the check id.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from gpudoctor.probe.proc import run_bounded

COMMAND_TIMEOUT = 5.0  # per scontrol/sinfo call; the controller answers in milliseconds when it is up
REASON_PREFIX = "gpudoctor "  # a reason that starts with it is ours to replace or clear (NHC's "NHC:" rule)
MAX_REASON = 100  # characters: short enough for `scontrol show node` and `sinfo -R -o %100E` on one line
# node states (sinfo %T, lower case, '*' = not responding) in which the node takes no new jobs
OFFLINE_STATES = ("drain", "down", "fail", "maint")


class NodeStateError(Exception):
    """A SLURM command failed or did not answer: one line saying which and why."""


@dataclass(frozen=True)
class NodeState:
    name: str
    state: str  # sinfo's long state: idle, mixed, allocated, drained, draining, down*, ...
    reason: str  # "" when none

    @property
    def offline(self) -> bool:
        return self.state.rstrip("*~#!%$@^-").startswith(OFFLINE_STATES)

    @property
    def ours(self) -> bool:
        return self.reason.startswith(REASON_PREFIX)


def drain_reason(check_id: str, message: str, more: int = 0) -> str:
    """'gpudoctor GD-HW-001: <message>' on one line, at most MAX_REASON characters, without the quotes,
    backslashes and control characters that would break a reason pasted into a shell or a conf file."""
    head = f"{REASON_PREFIX}{check_id}: "
    tail = f" (+{more} more)" if more else ""
    text = re.sub(r"[\"'`\\\x00-\x1f\x7f]", " ", message)
    text = re.sub(r"\s+", " ", text).strip()
    room = MAX_REASON - len(head) - len(tail)
    if len(text) > room:
        text = text[: max(room - 3, 0)].rstrip() + "..."
    return head + text + tail


def _run(cmd: list[str], timeout: float) -> str:
    try:
        r = run_bounded(cmd, timeout)
    except subprocess.TimeoutExpired:
        raise NodeStateError(f"`{' '.join(cmd[:3])}` did not answer within {timeout:g} s (killed)") from None
    except OSError as e:
        raise NodeStateError(f"cannot run {cmd[0]}: {e.strerror or e}") from None
    if r.returncode != 0:
        lines = [ln.strip() for ln in (r.stderr or r.stdout).splitlines() if ln.strip()]
        why = lines[-1][:200] if lines else f"exit status {r.returncode}"
        raise NodeStateError(f"`{' '.join(cmd[:3])}` failed: {why}")
    return r.stdout


def this_node(given: str | None = None, env: Mapping[str, str] | None = None, timeout: float = COMMAND_TIMEOUT) -> str:
    """This machine's SLURM node name: --node, else SLURMD_NODENAME (set by slurmd for the health check and
    the prolog), else the node whose NodeHostName is this host (sinfo; NodeName may differ from the host
    name), else the short host name (what NHC assumes)."""
    if given:
        return given
    named = (os.environ if env is None else env).get("SLURMD_NODENAME")
    if named:
        return named
    host = socket.gethostname()
    try:
        listing = _run(["sinfo", "-h", "-N", "-o", "%N %n"], timeout)
    except NodeStateError:
        listing = ""
    return node_of_host(listing, host) or host.split(".")[0]


def node_of_host(listing: str, host: str) -> str | None:
    """The NodeName in `sinfo -h -N -o '%N %n'` lines whose NodeHostName is `host` (full or short)."""
    short = host.split(".")[0]
    for line in listing.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] in (host, short):
            return parts[0]
    return None


def parse_state_line(name: str, line: str) -> NodeState:
    """`sinfo -h -N -n NODE -o '%T|%E'` -> NodeState; sinfo prints 'none' when there is no reason."""
    state, _, reason = line.strip().partition("|")
    return NodeState(name, state.strip().lower(), "" if reason.strip() == "none" else reason.strip())


def read(name: str, timeout: float = COMMAND_TIMEOUT) -> NodeState:
    out = _run(["sinfo", "-h", "-N", "-n", name, "-o", "%T|%E"], timeout)
    lines = [ln for ln in out.splitlines() if ln.strip()]
    if not lines:
        raise NodeStateError(f"SLURM knows no node {name!r} (sinfo -n {name}); give its name with --node")
    return parse_state_line(name, lines[0])


def drain(name: str, reason: str, timeout: float = COMMAND_TIMEOUT) -> None:
    # an argument list, not a shell line: the reason needs no quoting
    _run(["scontrol", "update", f"NodeName={name}", "State=DRAIN", f"Reason={reason}"], timeout)


def resume(name: str, timeout: float = COMMAND_TIMEOUT) -> None:
    _run(["scontrol", "update", f"NodeName={name}", "State=RESUME"], timeout)
