"""The check registry: checks register with @check; third parties through entry points.

A check is a pure function `func(facts, ctx) -> Outcome | list[Outcome]` plus metadata. The
registry enforces the metadata when the module is imported, so a mistake in a new check stops
every command with one line naming the file and the check (exit 2), not a check silently
skipped or a crash far away. The rules, each a RegistryError at import time:

- id: built-in checks (modules under gpudoctor.checks) use GD-<AREA>-NNN exactly; third-party
  checks may use their own prefix (ACME-SCRATCH-1). An id is registered once.
- name: kebab-case naming the problem, unique across checks.
- category: one of model.CATEGORIES.
- title, what, why, fix: non-empty text (they are the check's documentation: list/explain/docs).
- needs: fact sections from gpudoctor.facts.SECTIONS; the probes that run are derived from them.
- requires, scope, defers_to, source: the policies below, each from its fixed vocabulary.

Policies the runner applies, so checks need no wrapper twins or skip helpers of their own:

requires -- preconditions; an unmet one makes the check a `skip` with one wording for all checks
(see REQUIREMENTS). Checked in the order given, after `needs`.

scope -- what the verdict is about (see SCOPES):
  "job"     the job: its settings (environment, batch script, training config, launcher) or all its
            ranks together (GD-JOB-*). The same wherever gpudoctor runs (a login node before
            submission, or inside the job).
  "machine" the machine gpudoctor runs on as it is: its driver, GPUs, torch install, hardware
            counters. (The default.) Run where the job runs for a verdict about the job's node.
  "node"    the compute node the job will get, measured on this machine (CPUs, memory, /dev/shm,
            network interfaces, NVLink). Before submission (--sbatch on a submit host) this machine
            is not that node: a warn/fail becomes info saying where it was judged, without a fix.
  A login-node mode can build on this split: "job" checks judge the job from anywhere, "machine"
  and "node" checks need to run on the node.

defers_to -- ids of checks this one leaves a shared finding to. When such a check is in the same
run (Context.running), the runner evaluates it and hands its outcomes to this check as
Context.deferred[id]; the check decides what to leave to it. No check calls another itself.

source -- "facts" (the default: judged from probed facts by `gpudoctor check`), "smoke" (the
verdict is produced by `gpudoctor smoke`; the function only documents it) or "watch" (produced by
`gpudoctor watch` from a running job's processes and NVML samples) or "diagnose" (a signature of a failed
job's log, named by `gpudoctor diagnose`). Smoke-, watch- and diagnose-sourced checks are listed, explained
and documented like every check but never run by `gpudoctor check`.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from gpudoctor.facts import SECTIONS
from gpudoctor.model import CATEGORIES

ENTRY_POINT_GROUP = "gpudoctor.checks"
BUILTIN_PACKAGE = "gpudoctor.checks"
BUILTIN_ID = re.compile(r"^GD-[A-Z]+-\d{3}$")
THIRD_PARTY_ID = re.compile(r"^[A-Z][A-Z0-9]*-[A-Z0-9-]+$")
RESERVED_PREFIX = "GD-"  # built-in ids only: a plug-in's GD-HOST-4 could collide with a future built-in
_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
DOC_SECTIONS = ("What it checks", "Why it matters", "How to fix")

# requires= vocabulary: name -> what must hold (the runner's wording of the skip is in runner.py).
REQUIREMENTS = {
    "gpus-expected": "the job is meant to train on GPUs (not --expect-gpus 0, not a process without CUDA)",
    "nvidia-driver": "NVML answered: an NVIDIA driver is loaded on this machine",
    "job-gpus": "the driver sees at least one of the job's GPUs (those CUDA_VISIBLE_DEVICES names)",
    "torch": "the probe imported torch",
    "cuda-build": "torch is a CUDA build (not CPU-only, not ROCm) whose CUDA version is a version number",
    "loader-settings": "a training config (--config) or a live DataLoader gives the DataLoader's settings",
    "sbatch": "a batch script is given (--sbatch)",
    "slurm-job": "a SLURM job to judge: a batch script (--sbatch), or gpudoctor runs inside a job (SLURM_JOB_ID)",
    "loader-workers": "the DataLoader's num_workers is stated and is a count (not negative)",
    "several-hosts": "the job's ranks run on more than one node; what the check finds exists only across hosts "
    "(each problem is marked so, and `check --job` drops it where the ranks share one host)",
}
SCOPES = ("job", "machine", "node")  # see the module docstring
SOURCES = ("facts", "smoke", "watch", "diagnose")
# the command that judges a source's verdicts (`gpudoctor check` judges "facts")
JUDGED_BY = {"smoke": "`gpudoctor smoke`", "watch": "`gpudoctor watch`", "diagnose": "`gpudoctor diagnose`"}


@dataclass(frozen=True)
class CheckSpec:
    id: str
    name: str
    category: str
    title: str
    needs: tuple[str, ...]  # fact sections the check reads; drives which probes run
    docs: dict[str, str]  # DOC_SECTIONS -> text
    func: Callable
    module: str
    requires: tuple[str, ...] = ()  # REQUIREMENTS keys, checked in order by the runner
    scope: str = "machine"  # SCOPES: what the verdict is about
    defers_to: tuple[str, ...] = ()  # check ids whose outcomes this check receives in Context.deferred
    source: str = "facts"  # SOURCES: who produces the verdict
    file: str = ""  # where it is defined, for messages

    @property
    def judged_by_check(self) -> bool:
        """Whether `gpudoctor check` runs it (smoke verdicts come from `gpudoctor smoke`)."""
        return self.source == "facts"


_REGISTRY: dict[str, CheckSpec] = {}


class RegistryError(Exception):
    """A check or plug-in that cannot be registered: one line naming the file and the check."""


def _caller(depth: int = 1) -> tuple[str, str, int]:
    """(module, file, line) of the call to the registry function that calls this (check(...), declare(...))."""
    frame = sys._getframe(depth + 1)
    return frame.f_globals.get("__name__", "?"), frame.f_code.co_filename, frame.f_lineno


def _where(file: str, line: int) -> str:
    return f"{_short(file)}:{line}"


def _short(file: str) -> str:
    """checks/x.py rather than an absolute path, where the file is inside this project."""
    for marker in ("/checks/", "/gpudoctor/"):
        if marker in file:
            return file[file.rindex(marker) + 1 :]
    return file


def _problems(
    module: str,
    id: Any,
    name: Any,
    category: Any,
    title: Any,
    needs: Any,
    texts: dict[str, Any],
    requires: tuple,
    scope: Any,
    defers_to: tuple,
    source: Any,
) -> list[str]:
    problems = []
    builtin = module == BUILTIN_PACKAGE or module.startswith(BUILTIN_PACKAGE + ".")
    if not isinstance(id, str) or not id:
        problems.append("missing id=")
    elif builtin and not BUILTIN_ID.match(id):
        problems.append(f"id {id!r} must look like GD-AREA-001 (GD-, capital letters, -, three digits)")
    elif not builtin and id.upper().startswith(RESERVED_PREFIX):
        problems.append(
            f"id {id!r} of module {module}: the {RESERVED_PREFIX} prefix is reserved for gpudoctor's own checks; "
            "give the plug-in's checks a prefix of its own (e.g. ACME-GPU-001)"
        )
    elif not builtin and not THIRD_PARTY_ID.match(id):
        problems.append(f"id {id!r} must look like PREFIX-NAME (e.g. ACME-GPU-001)")
    if not isinstance(name, str) or not _NAME.match(name):
        problems.append(f"name {name!r} must be kebab-case (e.g. nccl-socket-ifname-matches-nothing)")
    if category not in CATEGORIES:
        problems.append(f"unknown category {category!r} (one of {', '.join(CATEGORIES)})")
    for key, text in {"title": title, **texts}.items():
        if not isinstance(text, str) or not text.strip():
            problems.append(f"missing or empty {key}=")
    if needs is None or isinstance(needs, str):
        problems.append(f"needs= must be a list of fact sections (got {needs!r}; [] for none)")
    else:
        for section in needs:
            if section not in SECTIONS:
                problems.append(f"needs {section!r} is no fact section (one of {', '.join(SECTIONS)})")
    for req in requires:
        if req not in REQUIREMENTS:
            problems.append(f"requires {req!r} is unknown (one of {', '.join(REQUIREMENTS)})")
    if scope not in SCOPES:
        problems.append(f"scope {scope!r} is unknown (one of {', '.join(SCOPES)})")
    for other in defers_to:
        if not isinstance(other, str) or other == id:
            problems.append(f"defers_to {other!r} must name another check's id")
    if source not in SOURCES:
        problems.append(f"source {source!r} is unknown (one of {', '.join(SOURCES)})")
    return problems


def _tuple(value: Iterable[str] | str | None) -> tuple:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def check(
    *,
    id: str | None = None,
    name: str | None = None,
    category: str | None = None,
    title: str | None = None,
    needs: Iterable[str] | None = None,
    what: str | None = None,
    why: str | None = None,
    fix: str | None = None,
    requires: Iterable[str] | str | None = None,
    scope: str = "machine",
    defers_to: Iterable[str] | str | None = None,
    source: str = "facts",
) -> Callable[[Callable], Callable]:
    """Register a pure check: func(facts, ctx) -> Outcome | list[Outcome].

    id: stable, never reused (GD-AREA-NNN); name: kebab-case naming the problem;
    needs: the fact sections it reads (only those are probed with --select);
    requires/scope/defers_to/source: runner policies (module docstring).
    Every argument is keyword-only; a missing one is reported with the file and check.
    """
    module, file, line = _caller()
    fields: dict[str, Any] = dict(
        id=id, name=name, category=category, title=title, needs=needs, what=what, why=why, fix=fix
    )
    fields.update(requires=requires, scope=scope, defers_to=defers_to, source=source)
    _validate(module, file, line, fields)

    def register(func: Callable) -> Callable:
        _register(func, func.__module__, file, line, fields)
        return func

    return register


@dataclass(frozen=True)
class Verdict:
    """A verdict another command decides (the smoke run builds these findings itself), declared as data
    with check()'s documentation fields, so that list, explain and docs/checks.md show it like a check."""

    id: str
    name: str
    category: str
    title: str
    what: str
    why: str
    fix: str
    scope: str = "machine"


def declare(verdicts: Iterable[Verdict], source: str, judged_by: str) -> None:
    """Register each verdict of a table as a check of `source`; `gpudoctor check` never runs them (a run
    outside its command would say: skipped, judged by `judged_by`)."""
    module, file, line = _caller(depth=1)

    def not_judged_here(facts, ctx):
        from gpudoctor.model import skip

        return skip(f"judged by {judged_by}, not from probed facts")

    for v in verdicts:
        fields: dict[str, Any] = dict(
            id=v.id, name=v.name, category=v.category, title=v.title, needs=[], what=v.what, why=v.why
        )
        fields.update(fix=v.fix, requires=None, scope=v.scope, defers_to=None, source=source)
        _validate(module, file, line, fields)
        _register(not_judged_here, module, file, line, fields)


def _validate(module: str, file: str, line: int, f: dict) -> None:
    texts = {"what": f["what"], "why": f["why"], "fix": f["fix"]}
    problems = _problems(
        module,
        f["id"],
        f["name"],
        f["category"],
        f["title"],
        f["needs"],
        texts,
        _tuple(f["requires"]),
        f["scope"],
        _tuple(f["defers_to"]),
        f["source"],
    )
    if problems:
        raise RegistryError(f"{_where(file, line)}: check {f['id'] or '(no id)'}: {'; '.join(problems)}")


def _register(func: Callable, module: str, file: str, line: int, f: dict) -> None:
    id, name = f["id"], f["name"]
    spec = CheckSpec(
        id=id,
        name=name,
        category=f["category"],
        title=f["title"],
        needs=tuple(f["needs"]),
        docs={section: str(f[key]).strip() for section, key in zip(DOC_SECTIONS, ("what", "why", "fix"), strict=True)},
        func=func,
        module=module,
        requires=_tuple(f["requires"]),
        scope=f["scope"],
        defers_to=_tuple(f["defers_to"]),
        source=f["source"],
        file=_short(file),
    )
    where = f"{_where(file, line)}: check {id} ({func.__name__})"
    old = _REGISTRY.get(id)
    if old is not None and (old.module, old.func.__qualname__) != (spec.module, func.__qualname__):
        raise RegistryError(f"{where}: id {id} is already registered by {old.file} ({old.func.__name__})")
    same_name = next((s for s in _REGISTRY.values() if s.name == name and s.id != id), None)
    if same_name is not None:
        raise RegistryError(f"{where}: name {name!r} is already used by {same_name.id} in {same_name.file}")
    _REGISTRY[id] = spec
    func.spec = spec  # type: ignore[attr-defined]


_loaded = False


def builtin_modules() -> list[str]:
    """Every check module of the gpudoctor.checks package and of its sub-packages (a category grown into a
    package, checks/slurm/): a new checks/x.py or checks/x/y.py is found without a list. A name that starts
    with `_` is no check module (checks/slurm/_shared.py: helpers)."""
    return sorted(_check_modules(importlib.import_module(BUILTIN_PACKAGE)))


def _check_modules(package: Any) -> Iterator[str]:
    for m in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        if m.name.rsplit(".", 1)[1].startswith("_"):
            continue
        if m.ispkg:
            yield from _check_modules(importlib.import_module(m.name))
        else:
            yield m.name


def _import(module: str, what: str, origin: str = "") -> None:
    try:
        importlib.import_module(module)
    except RegistryError:
        raise  # already names the file and the check
    except Exception as e:
        interrupt = _interrupt_within(e)
        if interrupt is not None:  # Ctrl-C/SIGTERM landed in class creation: Python 3.11 wraps it in RuntimeError
            raise interrupt from None
        raise RegistryError(f"{what} {module}{origin} failed to load: {type(e).__name__}: {e}") from e


def _interrupt_within(error: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt (or SIGTERM's Terminated) that an import error wraps: Python 3.11 turns any exception
    raised under `__set_name__` (a dataclass field while its class is built) into a RuntimeError whose cause is it."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def load_all() -> dict[str, CheckSpec]:
    """Import the built-in check modules and every installed entry point of gpudoctor.checks.

    A module that fails to import, or a check it registers wrongly, raises RegistryError: a CI
    run must not pass because a plug-in's checks silently went missing.
    """
    global _loaded
    if not _loaded:
        from importlib.metadata import entry_points

        for module in builtin_modules():
            _import(module, "check module")
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            module = ep.value.split(":")[0]
            if module != BUILTIN_PACKAGE:
                _import(module, "plug-in", f" (entry point {ep.name!r} of {ENTRY_POINT_GROUP})")
        for spec in _REGISTRY.values():
            unknown = [other for other in spec.defers_to if other not in _REGISTRY]
            if unknown:
                raise RegistryError(f"{spec.file}: check {spec.id}: defers_to {', '.join(unknown)}: no such check")
        _loaded = True
    return dict(sorted(_REGISTRY.items()))


def registered(check_id: str) -> CheckSpec | None:
    """The spec of a check already registered (its module imported), without loading the others."""
    return _REGISTRY.get(check_id)


def select(specs: dict[str, CheckSpec], selected: list[str] | None, ignored: list[str] | None) -> list[CheckSpec]:
    """The checks `gpudoctor check` runs, filtered by categories or ids; unknown names raise RegistryError.

    Smoke- and watch-sourced checks are never among them (`gpudoctor smoke` and `gpudoctor watch` judge those).
    """

    def matcher(names: list[str]) -> Callable[[CheckSpec], bool]:
        cats, ids = set(), set()
        for n in names:
            if n.lower() in CATEGORIES:  # categories and names are lower case, ids upper: any case is accepted
                cats.add(n.lower())
            elif n.upper() in specs:
                ids.add(n.upper())
            elif any(s.name == n.lower() for s in specs.values()):
                ids.update(s.id for s in specs.values() if s.name == n.lower())
            else:
                raise RegistryError(f"unknown category or check id: {n!r} (see 'gpudoctor list')")
        return lambda s: s.category in cats or s.id in ids

    out = [s for s in specs.values() if s.judged_by_check]
    if selected:
        for source, command in JUDGED_BY.items():
            elsewhere = [
                n
                for n in selected
                if (n.upper() in specs and specs[n.upper()].source == source) or (n == "smoke" and source == "smoke")
            ]
            if elsewhere:
                raise RegistryError(f"{', '.join(elsewhere)}: judged by {command}, not by `gpudoctor check`")
        m = matcher(selected)
        out = [s for s in out if m(s)]
    if ignored:
        m = matcher(ignored)
        out = [s for s in out if not m(s)]
    return out
