"""What one step of a fix changes, and where (as ruff's `Edit`): one description of an edit, the action kinds
as a table, and the one renderer of both.

A check's fix is a tuple of `model.Action`s. `Edit.of(action)` is the edit an action proposes, in one shape
for every kind: the file it changes (None for the environment or a command), the key and the value. Each
kind's row in `KINDS` says the rest as data: which place it changes, how the report advises it and how the
fix plan describes it (format templates), which value it decides, where in the batch script it is, and the
kind that makes it inside the batch script. Three readers use the one table:
- report/text.py shows a fix's actions (`Edit.advice`);
- fixes/plan.py resolves an action to the edit of the place that decides the value, applies it and names it
  (`Edit.describe`, `Edit.slot`, `Kind.in_script`);
- job/locate.py finds the line of the batch script a finding is about (`Kind.span`).
Every value shown for a shell goes through gpudoctor/shellquote.py (the `export` and `unset` fields).
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from typing import Any

from gpudoctor import shellquote
from gpudoctor.model import Action, ActionKind, export_title

# Kind.place: what an edit of the kind changes
ENV, SCRIPT, CONFIG, COMMAND = "environment", "batch script", "training config", "command"


@dataclass(frozen=True)
class ScriptSpan:
    """Where an edit is in the batch script (readers.sbatch.BatchScript): the item of the script's `items`
    whose `field` is the edit's `by` (its "key" or "value") and that item's `span`; `items` None: the
    launch line (the line the edit changes, or writes an export above)."""

    items: str | None = None
    field: str = ""
    by: str = "key"
    span: str = "span"
    last: bool = False  # sbatch takes the last directive written, bash the last assignment
    contains: bool = False  # the field is a collection that holds the wanted text


@dataclass(frozen=True)
class Kind:
    """One ActionKind as data. The templates take the edit's {key} and {value}, and {json} (the value as
    JSON), {srun} (`srun` and its options), {export} and {unset} (shell lines, see `_fields`)."""

    place: str  # ENV, SCRIPT, CONFIG or COMMAND
    advice: str  # the report's line: what to do (report/text.action_lines)
    change: str  # the fix plan's line: what the edit does (`gpudoctor fix --json` "edits")
    slot: str = ""  # the value it decides, shared by kinds that decide one value ("" : a slot of its own)
    span: ScriptSpan | None = None
    in_script: ActionKind | None = None  # the kind that makes it in the batch script (an export, an override)


_LAUNCH = ScriptSpan()
_DIRECTIVE = ScriptSpan("directives", "option", last=True)
K = ActionKind
KINDS: dict[ActionKind, Kind] = {
    K.SET_ENV: Kind(ENV, "{export}", "{export}", "env", in_script=K.EXPORT_SET),
    K.UNSET_ENV: Kind(ENV, "{unset}", "unset {key}", "env", in_script=K.EXPORT_REMOVE),
    K.COMMAND: Kind(COMMAND, "{value}", "{value}"),
    K.YAML_SET: Kind(CONFIG, "{key}: {json}", "{key}: {value}", in_script=K.OVERRIDE_SET),
    K.SBATCH_SET: Kind(SCRIPT, "#SBATCH --{key}={value}", "#SBATCH --{key}={value}", "sbatch", _DIRECTIVE),
    K.SBATCH_REMOVE: Kind(SCRIPT, "remove #SBATCH --{key}", "remove #SBATCH --{key}", "sbatch", _DIRECTIVE),
    K.SBATCH_RENAME: Kind(
        SCRIPT,
        "#SBATCH {key} -> --{value}",
        "rename #SBATCH {key} to --{value}",
        span=ScriptSpan("unknown_directives", "options", contains=True),
    ),
    K.SBATCH_HOIST: Kind(
        SCRIPT,
        "move `{value}` above the first command",
        "move `{value}` above the first command",
        span=ScriptSpan("late_directives", "text", "value"),
    ),
    K.DIRECTIVE_REPAIR: Kind(
        SCRIPT,
        "write `{value}` as an #SBATCH directive",
        "write `{value}` as an #SBATCH directive",
        span=ScriptSpan("lookalike_directives", "text", "value", "marker"),
    ),
    K.CONTINUATION_REPAIR: Kind(
        SCRIPT,
        "nothing after the backslash of `{value}` (its comment moves above the command)",
        "nothing after the backslash of `{value}`",
        span=ScriptSpan("broken_continuations", "text", "value", "backslash"),
    ),
    K.SRUN_PREFIX: Kind(
        SCRIPT, "start the launch line with `{srun}`", "start the launch line with {srun}", span=_LAUNCH
    ),
    K.EXPORT_SET: Kind(SCRIPT, "{export}", "{export}", "env", _LAUNCH),
    K.EXPORT_REMOVE: Kind(
        SCRIPT, "drop the export of {key}", "drop export {key}", "env", ScriptSpan("assignments", "name", last=True)
    ),
    K.OVERRIDE_SET: Kind(SCRIPT, "launch line {key}={value}", "launch-line override {key}={value}", span=_LAUNCH),
}
FILE_EDITS = frozenset(k for k, row in KINDS.items() if row.place in (SCRIPT, CONFIG))


@dataclass(frozen=True)
class Edit:
    """One change: its kind, the file it changes (None: the environment, or nothing for a command), which key
    (a variable, an #SBATCH option, a config key) and the value."""

    kind: ActionKind
    dest: str | None
    key: str | None = None
    value: Any = None

    @classmethod
    def of(cls, action: Action) -> Edit:
        """The edit an action proposes, at the place the action names."""
        kind = ActionKind(action.kind)
        place = KINDS[kind].place
        if place == ENV:  # the target is the variable; a value `$NAME` marked as one stays a Reference
            return cls(kind, None, action.target, action.env_value if kind is ActionKind.SET_ENV else None)
        if place == COMMAND:
            return cls(kind, None, None, action.target)
        return cls(kind, action.target, action.key, action.value)

    @property
    def row(self) -> Kind:
        return KINDS[self.kind]

    def advice(self) -> str:
        """The report's line: a shell line exactly as the shell must read it, or the edit to make."""
        return render(self, self.row.advice, shell=True)

    def describe(self) -> str:
        """The fix plan's line: what this edit does."""
        return render(self, self.row.change, shell=False)

    @property
    def slot(self) -> tuple:
        """The value this edit decides: two kept edits of one slot must agree."""
        return (self.dest, self.row.slot or self.kind.value, self.key)


def render(edit: Edit, template: str, shell: bool) -> str:
    """template filled from the edit (only the fields it names are made), after the file it changes."""
    names = {name for _, name, _, _ in string.Formatter().parse(template) if name}
    text = template.format_map({name: _FIELDS[name](edit, shell) for name in names})
    return f"{edit.dest}: {text}" if edit.dest is not None else text


def export_line(name: str, value: Any) -> str:
    """`export NAME=value` as the shell must read it (the value's bytes exactly, a Reference kept live); a name
    no shell can set is a comment saying so, never an assignment."""
    try:
        return shellquote.export(name, value if isinstance(value, str) else str(value))
    except ValueError as e:
        return f"# {e}; no shell line can set it"


def unset_line(name: str) -> str:
    try:
        return shellquote.unset(name)
    except ValueError as e:
        return f"# {e}; no shell line can unset it"


def _export(edit: Edit, shell: bool) -> str:
    """For the shell a line it runs as written; for a title the same, quoted where the shell cannot run it."""
    if shell:
        return export_line(edit.key or "", edit.value)
    return export_title(str(edit.key), edit.value)


_FIELDS = {
    "key": lambda e, shell: e.key,
    "value": lambda e, shell: e.value,
    "json": lambda e, shell: json.dumps(e.value, default=str),
    "srun": lambda e, shell: "srun" + (f" {e.value}" if e.value else ""),
    "export": _export,
    "unset": lambda e, shell: unset_line(e.key or ""),
}
