"""The line of the batch script a finding is about, from what the check already says in data.

A check may set Outcome.location itself. Otherwise the location is derived, in this order, from:
1. its fix's actions on the script (the #SBATCH option it sets or removes, the unknown option it renames,
   the late #SBATCH line it moves, the broken continuation it repairs, the export it drops, the launch
   line it edits or exports before, a variable the script assigns that the fix sets or unsets): the line
   the fix writes is the line the problem is on;
2. its evidence naming the launch line ("launch line": "line N: ...", every shape-based SLURM check);
otherwise it has none, and output formats that need a line (github, concise) say where they put it.
Which item of the script each kind of action edits is a column of its row in gpudoctor/edit.KINDS (`span`).
Spans come from the reader (gpudoctor/readers/sbatch/script.py: Span lines 1-based, columns 0-based).
"""

from __future__ import annotations

import os
import re
from typing import Any

from gpudoctor.edit import CONFIG, ENV, KINDS
from gpudoctor.model import Action, ActionKind, Context, Location, Outcome

LAUNCH_EVIDENCE = "launch line"  # the evidence key of the shape-based checks (checks/slurm/_shared.py shape_evidence)


def _at(path: str, span) -> Location:
    return Location(path, span.line, span.column + 1, span.end_line, span.end_column + 1)


def _action_span(action: Action, script: Any) -> Any:
    """The span of what the action edits in the script, as its kind's row says (gpudoctor/edit.KINDS)."""
    where = KINDS[ActionKind(action.kind)].span
    if where is None:
        return None
    if where.items is None:
        return script.launch.span if script.launch else None
    want = getattr(action, where.by)
    found = [
        item
        for item in getattr(script, where.items)
        if (want in getattr(item, where.field) if where.contains else getattr(item, where.field) == want)
    ]
    if not found:
        return None
    return getattr(found[-1] if where.last else found[0], where.span)


def _assignment_span(action: Action, script: Any) -> Any:
    """A fix that sets or unsets a variable the script itself assigns: the problem is that assignment."""
    if KINDS[ActionKind(action.kind)].place != ENV:
        return None
    own = [a for a in (script.launch.env if script.launch is not None else ()) if a.name == action.target]
    if own:  # `NAME=value srun ...`: the launch command's own value is the one the job gets
        return own[-1].value_span or own[-1].span
    found = [a for a in script.assignments if a.name == action.target]
    return found[-1].span if found else None  # the last one is what the launch sees


def locate(outcome: Outcome, ctx: Context) -> Location | None:
    """The outcome's own location, else the one its fix or evidence names in ctx's batch script or config."""
    if outcome.location is not None:
        return outcome.location
    return _in_script(outcome, ctx) or _on_launch_override(outcome, ctx) or _in_config(outcome, ctx)


def _config_keys(outcome: Outcome) -> tuple[list[str], list[dict]]:
    """The config keys an outcome is about, most telling first, and the settings of its evidence."""
    keys = [
        a.key
        for a in (outcome.fix.actions if outcome.fix else ())
        if KINDS[ActionKind(a.kind)].place == CONFIG and a.key
    ]
    settings = [v for v in outcome.evidence.values() if isinstance(v, dict) and isinstance(v.get("path"), str)]
    keys += [v["path"] for v in settings if v.get("problem")]
    keys += [v["path"] for v in settings if v["path"] in outcome.message]
    return keys, settings


def _on_launch_override(outcome: Outcome, ctx: Context) -> Location | None:
    """A setting the launch line's override gives (readers/dlconfig's evidence `set_by`): the problem is there."""
    script: Any = ctx.sbatch
    if script is None or getattr(script, "launch", None) is None or not ctx.sbatch_path:
        return None
    keys, settings = _config_keys(outcome)
    overridden = {v["path"] for v in settings if v.get("set_by")}
    if keys and keys[0] in overridden:
        return _at(ctx.sbatch_path, script.launch.span)
    return None


def _in_config(outcome: Outcome, ctx: Context) -> Location | None:
    """The config key the fix sets (YAML_SET), else the setting the evidence says has a problem, else a setting
    of the evidence that the message names (readers/dlconfig's evidence: {setting: {value, path, problem}})."""
    lines, path = ctx.config_lines or {}, ctx.config_path
    if not lines or not path:
        return None
    keys, _ = _config_keys(outcome)
    line = next((lines[k] for k in keys if k in lines), None)
    return Location(path, line) if line else None


def _in_script(outcome: Outcome, ctx: Context) -> Location | None:
    script: Any = ctx.sbatch  # a readers.sbatch BatchScript (Context types it loosely)
    path = ctx.sbatch_path
    if script is None or not path or not hasattr(script, "directives"):
        return None
    for action in outcome.fix.actions if outcome.fix else ():
        span = _action_span(action, script) if action.target == path else _assignment_span(action, script)
        if span is not None:
            return _at(path, span)
    if LAUNCH_EVIDENCE in outcome.evidence and script.launch is not None:
        return _at(path, script.launch.span)
    return _named_line(outcome, script, path)


def _named_line(outcome: Outcome, script: Any, path: str) -> Location | None:
    """What the outcome names in data: a script line its evidence quotes ("line 16: srun ...", "job.slurm
    line 14") or its message starts with ("line 16 starts ..."), a variable of its evidence the script
    assigns (`export WORLD_SIZE=2`); else, for a fix that sets the job's environment, the launch line it
    exports before. A line of another file (the program's) is never taken for the script's."""
    own = re.compile(rf"^line (\d+):|\b{re.escape(os.path.basename(path))} line (\d+)\b")
    texts: list[str] = []
    for value in outcome.evidence.values():
        texts.extend(v for v in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(v, str))
    for m in [*(own.search(t) for t in texts), re.match(r"line (\d+)\b", outcome.message)]:
        if m:
            return Location(path, int(next(g for g in m.groups() if g)))
    assigned = [a for a in script.assignments if a.name in outcome.evidence]
    if assigned:
        return _at(path, assigned[-1].span)
    sets_env = any(KINDS[ActionKind(a.kind)].place == ENV for a in (outcome.fix.actions if outcome.fix else ()))
    if sets_env and script.launch is not None:
        return _at(path, script.launch.span)
    return None
