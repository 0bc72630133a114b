"""Fault injection for tests ONLY: make one rank misbehave so the watchdog can be tested for real.

Set GPUDOCTOR_SMOKE_FAULT="rank=1,at=start,do=hang" (several faults separated by ';').
  at: start (before the rank joins the rendezvous: a rank that never starts),
      first-allreduce, step:N (at the forward pass of step N), selftest, memory (the correctness tests)
  do: hang (sleep until killed), crash (raise an exception), exit (die without a word, exit 17),
      corrupt (at selftest or memory: one wrong value, as a faulty device would compute or store it),
      announce (write this rank's PID to the file given as to=PATH: a test then slows the process for real)
Nothing reads this variable but the smoke worker; users have no reason to set it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

ENV = "GPUDOCTOR_SMOKE_FAULT"
ACTIONS = ("hang", "crash", "exit", "corrupt", "announce")


class FaultSpecError(ValueError):
    pass


@dataclass(frozen=True)
class Fault:
    rank: int
    at: str
    do: str
    to: str | None = None


def parse(text: str | None) -> list[Fault]:
    faults = []
    for part in (text or "").split(";"):
        if not part.strip():
            continue
        fields = dict(kv.split("=", 1) for kv in part.split(",") if "=" in kv)
        try:
            fault = Fault(int(fields["rank"]), fields["at"].strip(), fields.get("do", "hang").strip(), fields.get("to"))
        except (KeyError, ValueError):
            raise FaultSpecError(f"{ENV}={text!r}: expected rank=N,at=PLACE,do=ACTION") from None
        if fault.do not in ACTIONS:
            raise FaultSpecError(f"{ENV}: do={fault.do!r} is not one of {', '.join(ACTIONS)}")
        faults.append(fault)
    return faults


def maybe_inject(rank: int, at: str) -> None:
    """Called by the worker at each injection point; does nothing unless the variable names it."""
    for fault in parse(os.environ.get(ENV)):
        if fault.rank == rank and fault.at == at and fault.do == "announce" and fault.to:
            with open(fault.to, "w") as fh:
                fh.write(str(os.getpid()))
        elif fault.rank == rank and fault.at == at and fault.do not in ("corrupt", "announce"):
            _act(fault)


def corrupts(rank: int, at: str) -> bool:
    """Whether a test should compute one value wrong on this rank (a correctness test's own injection point)."""
    return any(f.rank == rank and f.at == at and f.do == "corrupt" for f in parse(os.environ.get(ENV)))


def _act(fault: Fault) -> None:
    time.sleep(0.3)  # be seen in this phase first, as a real failure inside it would be
    if fault.do == "crash":
        raise RuntimeError(f"injected fault: rank {fault.rank} crashes at {fault.at}")
    if fault.do == "exit":
        os._exit(17)
    deadline = time.monotonic() + 3600  # bounded even if nobody kills us
    while time.monotonic() < deadline:
        time.sleep(0.5)
