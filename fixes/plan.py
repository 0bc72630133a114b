"""Plan the fixes: resolve each fix's actions to edits of the place that decides the value, apply them
to copies in memory, re-run the checks on the result, and keep a fix only if it helps.

Where a value is edited (issue 11, "edit where the value comes from"), in this order:
  1. the batch script's own `export` line or `#SBATCH` directive (--sbatch);
  2. an override on the launch line: Hydra/OmegaConf `key=value`, or `--flag value`;
  3. the training config's key (--config; YAML kept byte-for-byte outside the edit, or JSON);
  4. else the environment: lines for `eval "$(gpudoctor fix --shell)"` or --env-file.
A new `export` goes directly before the launch line.

Verify, then keep (ruff's fix-until-stable): each candidate fix is applied to the in-memory
workspace, the edited script and config are read again through gpudoctor's own readers, and the
checks run again on the same facts. The fix is kept only when its finding gets better (fail ->
warn -> info -> pass) and no other check gets a new warn/fail. The loop repeats until a round keeps
nothing. Two fixes that set one value to different values are never both kept: the second is
reported as a conflict.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gpudoctor.facts import Facts
from gpudoctor.fileio import FileIOError, read_input_bytes
from gpudoctor.fixes import config_edit, sbatch_edit
from gpudoctor.fixes.sbatch_edit import EditError
from gpudoctor.model import Action, ActionKind, Context, Finding, Fix, Safety, Severity, export_title, worst
from gpudoctor.redact import REDACTED

ENV = "<environment>"  # the destination of env changes that no file of the job holds
MAX_ROUNDS = 20
_BAD = (Severity.WARN, Severity.FAIL, Severity.ERROR)


class InputError(ValueError):
    """An input file that cannot be read back (one line, exit 2; nothing is written)."""


@dataclass(frozen=True)
class Edit:
    """One concrete change: where, what, which key (see ActionKind for the script operations)."""

    dest: str  # a file path, or ENV
    op: str  # an ActionKind value, "config_set", "env_set" or "env_unset"
    key: str | None
    value: object = None

    def describe(self) -> str:
        if self.dest == ENV:
            return export_title(str(self.key), self._text()) if self.op == "env_set" else f"unset {self.key}"
        if self.op == ActionKind.EXPORT_SET.value:
            return f"{self.dest}: {export_title(str(self.key), self._text())}"
        what = {
            ActionKind.SBATCH_SET.value: f"#SBATCH --{self.key}={self.value}",
            ActionKind.SBATCH_REMOVE.value: f"remove #SBATCH --{self.key}",
            ActionKind.SBATCH_HOIST.value: f"move `{self.value}` above the first command",
            ActionKind.CONTINUATION_REPAIR.value: f"nothing after the backslash of `{self.value}`",
            ActionKind.DIRECTIVE_REPAIR.value: f"write `{self.value}` as an #SBATCH directive",
            ActionKind.SBATCH_RENAME.value: f"rename #SBATCH {self.key} to --{self.value}",
            ActionKind.SRUN_PREFIX.value: "start the launch line with srun" + (f" {self.value}" if self.value else ""),
            ActionKind.EXPORT_REMOVE.value: f"drop export {self.key}",
            ActionKind.OVERRIDE_SET.value: f"launch-line override {self.key}={self.value}",
            "config_set": f"{self.key}: {self.value}",
        }.get(self.op, self.op)
        return f"{self.dest}: {what}"

    def _text(self) -> str:
        return self.value if isinstance(self.value, str) else str(self.value)  # a Reference stays one

    @property
    def slot(self) -> tuple:
        """The value this edit decides: two kept edits of one slot must agree."""
        if self.op in (ActionKind.SBATCH_SET.value, ActionKind.SBATCH_REMOVE.value):
            return (self.dest, "sbatch", self.key)
        if self.op in (ActionKind.EXPORT_SET.value, ActionKind.EXPORT_REMOVE.value, "env_set", "env_unset"):
            return (self.dest, "env", self.key)
        return (self.dest, self.op, self.key)


@dataclass
class Workspace:
    """The inputs as text (the files as they would be written) and the environment changes."""

    texts: dict[str, str]
    env: dict[str, str | None] = field(default_factory=dict)  # ENV destination: value, or None for unset

    def copy(self) -> Workspace:
        return Workspace(dict(self.texts), dict(self.env))


@dataclass
class Decision:
    finding: Finding
    fix: Fix
    kept: bool
    reason: str
    edits: tuple[Edit, ...] = ()


@dataclass
class Plan:
    original: Workspace
    final: Workspace
    before: list[Finding]
    after: list[Finding]
    decisions: list[Decision]
    manual: list[tuple[Finding, Fix]]
    unsafe_available: list[tuple[Finding, Fix]]

    @property
    def changed_files(self) -> list[str]:
        return [p for p, t in self.final.texts.items() if self.original.texts.get(p) != t]

    @property
    def env_changes(self) -> dict[str, str | None]:
        return dict(self.final.env)

    @property
    def pending(self) -> bool:
        return bool(self.changed_files or self.env_changes)


# ---------------------------------------------------------------- reading the inputs


def read_text(path: str) -> str:
    """A file's text with every byte kept (undecodable bytes survive as surrogates); regular files
    only, size-capped, so a FIFO or /dev/zero given as input is refused instead of read forever."""
    try:
        data = read_input_bytes(path)
    except FileIOError as e:
        raise InputError(str(e)) from None
    return data.decode("utf-8", errors="surrogateescape")


def context_for(ctx: Context, ws: Workspace) -> Context:
    """The context with the workspace's script and config read through gpudoctor's own readers, and the config
    the program runs with made from them by the reader `check` uses (readers/overrides.job_config): an edit of
    an override is verified, and a config edit the override hides never looks like a fix."""
    from gpudoctor.readers.overrides import job_config, launch_overrides

    sbatch: Any = ctx.sbatch
    config: Any = ctx.config
    overrides = ctx.overrides
    if ctx.sbatch_path and ctx.sbatch_path in ws.texts:
        sbatch = _read_script(ctx.sbatch_path, ws.texts[ctx.sbatch_path], getattr(ctx.sbatch, "arguments", None))
        overrides = launch_overrides(sbatch)
    if ctx.config_path and ctx.config_path in ws.texts:
        config, overrides = job_config(_read_config(ctx.config_path, ws.texts[ctx.config_path]), sbatch)
    return replace(ctx, sbatch=sbatch, config=config, overrides=overrides, running=None)


def _read_script(path: str, text: str, arguments: tuple[str, ...] | None = None):
    """The script as load_sbatch reads it (sbatch's whole-file checks, the parse, `bash -n`)."""
    from dataclasses import replace as with_field

    from gpudoctor.readers.accelerate import with_config_files
    from gpudoctor.readers.program import launched_program
    from gpudoctor.readers.sbatch import SbatchError, bash_syntax, parse_sbatch
    from gpudoctor.readers.sbatch.reader import _check_sbatch_accepts

    try:
        _check_sbatch_accepts(text, path)
        script = with_config_files(parse_sbatch(text, path, arguments))
    except SbatchError as e:
        raise EditError(f"the edited script does not read back: {e}") from None
    # the program the launch line runs, read as load_sbatch reads it: check and fix judge the same process model
    return with_field(script, bash_syntax=bash_syntax(text), program=launched_program(script))


def _read_config(path: str, text: str) -> dict:
    """The config through readers/trainconfig.load_config itself (same name, same parser)."""
    from gpudoctor.readers.trainconfig import ConfigError, load_config

    with tempfile.TemporaryDirectory(prefix="gpudoctor-fix-") as tmp:
        copy = os.path.join(tmp, os.path.basename(path))
        with open(copy, "w", encoding="utf-8", errors="surrogateescape") as fh:
            fh.write(text)
        try:
            return load_config(copy)
        except ConfigError as e:
            raise EditError(f"the edited config does not read back: {str(e).replace(copy, path)}") from None


def _read_config_of(ctx: Context, ws: Workspace) -> dict | None:
    """The --config file as the workspace holds it (its shape resolves jsonargparse's init_args-less keys)."""
    if ctx.config_path and ctx.config_path in ws.texts:
        return _read_config(ctx.config_path, ws.texts[ctx.config_path])
    return None


def facts_for(facts: Facts, ws: Workspace) -> Facts:
    if not ws.env:
        return facts
    env = dict(facts.env)
    for name, value in ws.env.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    sections = dict(facts.sections)
    sections["env"] = {**(facts.sections.get("env") or {}), "vars": env}
    return Facts(sections=sections, meta=facts.meta)


# ---------------------------------------------------------------- from actions to edits


def _same_file(a: str | None, b: str | None) -> bool:
    if not a or not b:
        return False
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def resolve(action: Action, ctx: Context, facts: Facts, ws: Workspace) -> list[Edit]:
    """The edit(s) one action becomes, at the place that decides the value; EditError if none can."""
    kind = ActionKind(action.kind)
    script = ctx.sbatch_path if ctx.sbatch_path in ws.texts else None
    if kind in (ActionKind.SET_ENV, ActionKind.UNSET_ENV):
        name = action.target
        if kind is ActionKind.SET_ENV and REDACTED in action.env_value:
            # a value with a credential reaches gpudoctor blanked (facts.redact_value): writing it would
            # replace the real value with the blank
            raise EditError(f"the value of {name} holds a credential gpudoctor does not copy; set it by hand")
        if script:
            if kind is ActionKind.SET_ENV:
                return [Edit(script, ActionKind.EXPORT_SET.value, name, action.env_value)]
            return [Edit(script, ActionKind.EXPORT_REMOVE.value, name, name in facts.env)]
        return [
            Edit(
                ENV,
                "env_set" if kind is ActionKind.SET_ENV else "env_unset",
                name,
                action.env_value if kind is ActionKind.SET_ENV else None,
            )
        ]
    if kind is ActionKind.YAML_SET:
        key = action.key or ""
        if script and sbatch_edit.override_on_launch(ws.texts[script], key, _read_config_of(ctx, ws)):
            return [Edit(script, ActionKind.OVERRIDE_SET.value, key, action.value)]
        if not ctx.config_path or not _same_file(action.target, ctx.config_path):
            raise EditError(f"{action.target} is not the --config given")
        return [Edit(ctx.config_path, "config_set", key, action.value)]
    if kind is ActionKind.COMMAND:
        raise EditError("a command for the user to run")
    if not script or not _same_file(action.target, script):
        raise EditError(f"{action.target} is not the --sbatch script given")
    if kind is ActionKind.SBATCH_SET and action.value is None:
        kind = ActionKind.SBATCH_REMOVE
    value = action.value
    if kind is ActionKind.EXPORT_REMOVE:
        value = action.key in facts.env
    return [Edit(script, kind.value, action.key, value)]


_SCRIPT_OPS: dict[str, Callable[[str, Edit], str]] = {
    ActionKind.SBATCH_SET.value: lambda t, e: sbatch_edit.set_directive(t, e.key, e.value),
    ActionKind.SBATCH_REMOVE.value: lambda t, e: sbatch_edit.remove_directive(t, e.key),
    ActionKind.SBATCH_HOIST.value: lambda t, e: sbatch_edit.hoist_directive(t, str(e.value)),
    ActionKind.CONTINUATION_REPAIR.value: lambda t, e: sbatch_edit.repair_continuation(t, str(e.value)),
    ActionKind.DIRECTIVE_REPAIR.value: lambda t, e: sbatch_edit.repair_directive(t, str(e.value)),
    ActionKind.SBATCH_RENAME.value: lambda t, e: sbatch_edit.rename_option(t, str(e.key), str(e.value)),
    ActionKind.SRUN_PREFIX.value: lambda t, e: sbatch_edit.prefix_srun(t, str(e.value or "")),
    ActionKind.EXPORT_SET.value: lambda t, e: sbatch_edit.set_export(t, e.key, e.value),
    ActionKind.EXPORT_REMOVE.value: lambda t, e: sbatch_edit.remove_export(t, e.key, inherited=bool(e.value)),
    ActionKind.OVERRIDE_SET.value: lambda t, e: sbatch_edit.set_override(t, e.key, e.value),
}


def apply_edits(ws: Workspace, edits: list[Edit]) -> Workspace:
    out = ws.copy()
    for e in edits:
        if e.dest == ENV:
            # the value as resolved: a str, or a shellquote.Reference the shell line keeps live
            out.env[str(e.key)] = e.value if e.op == "env_set" and isinstance(e.value, str) else None
        elif e.op == "config_set":
            out.texts[e.dest] = config_edit.set_key(out.texts[e.dest], e.dest, e.key, e.value)
        else:
            out.texts[e.dest] = _SCRIPT_OPS[e.op](out.texts[e.dest], e)
    return out


# ---------------------------------------------------------------- judging a fix


def _worst(findings: list[Finding], check_id: str) -> int:
    """The rank of the check's worst finding (a check with none counts as passed)."""
    return worst(f for f in findings if f.id == check_id).rank


def _bad_counts(findings: list[Finding]) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in findings:
        if f.severity in _BAD:
            out[f.id] = out.get(f.id, 0) + (10 if f.severity is Severity.FAIL else 1)
    return out


def _clip(message: str, limit: int = 160) -> str:
    """A finding's message cut at a word boundary, marked as cut (the full text is in `check`'s report)."""
    if len(message) <= limit:
        return message
    return message[:limit].rsplit(" ", 1)[0].rstrip(",;:(") + " ..."


def new_problems(before: list[Finding], after: list[Finding], target_id: str) -> list[str]:
    """Checks other than the target that are worse after (a new warn/fail, or more of them)."""
    old, new = _bad_counts(before), _bad_counts(after)
    return sorted(i for i, n in new.items() if n > old.get(i, 0) and i != target_id)


def judge(target: Finding, before: list[Finding], after: list[Finding]) -> tuple[bool, str]:
    """Kept when the target finding gets better and no check gets a new warn/fail. Better: its check's worst
    severity drops, or stays while fewer of its findings have it (one check reports each deprecated variable
    as a finding of its own; renaming one of two leaves the other's)."""
    was, now = _worst(before, target.id), _worst(after, target.id)
    fewer = now == was and _count(after, target.id, now) < _count(before, target.id, was)
    if now > was or (now == was and not fewer):
        sev = next((f.severity.value for f in after if f.id == target.id and f.severity.rank == now), "pass")
        return False, f"{target.id} is still {sev} after it"
    worse = new_problems(before, after, target.id)
    if worse:
        detail = "; ".join(
            f"{f.id} {f.severity.value}: {_clip(f.message)}" for f in after if f.id in worse and f.severity in _BAD
        )
        return False, f"it would cause {detail}"
    if fewer:
        sev = _sev_name(after, target.id, now)
        return True, f"{target.id} {sev} x{_count(before, target.id, was)} -> {sev} x{_count(after, target.id, now)}"
    return True, f"{target.id} {_sev_name(before, target.id, was)} -> {_sev_name(after, target.id, now)}"


def _count(findings: list[Finding], check_id: str, rank: int) -> int:
    return sum(1 for f in findings if f.id == check_id and f.severity.rank == rank)


_WEIGHT = {Severity.FAIL: 1000, Severity.ERROR: 100, Severity.WARN: 10, Severity.INFO: 1}


def _burden(findings: list[Finding]) -> int:
    """How much is still wrong: fails outweigh any number of warnings in practice, warnings infos."""
    return sum(_WEIGHT.get(f.severity, 0) for f in findings)


def _sev_name(findings: list[Finding], check_id: str, rank: int) -> str:
    return next((f.severity.value for f in findings if f.id == check_id and f.severity.rank == rank), "pass")


MAX_CONSEQUENCES = 4  # fixes of caused findings tried on top of one fix (the closure is small in practice)


def _with_consequences(
    target: Finding,
    before: list[Finding],
    trial: Workspace,
    after: list[Finding],
    edits: list[Edit],
    slots: dict[tuple, tuple[object, str, str]],
    allowed: frozenset[Safety],
    act: Callable[[Fix, Workspace], tuple[list[Edit], Workspace, list[Finding]] | None],
) -> tuple[Workspace, list[Finding], list[Decision]]:
    """target's fix (already in trial) plus, one at a time, the fixes of the findings it caused, each kept only
    when its own finding gets better and it clashes with no kept or grouped edit. Returns the group's
    workspace, findings and the followers' decisions; the caller judges the group as one fix."""
    followers: list[Decision] = []
    taken = {e.slot: (e.value, e.op) for e in edits}
    for _ in range(MAX_CONSEQUENCES):
        caused = new_problems(before, after, target.id)
        if not caused:
            break
        step = None
        for g in after:
            if g.id not in caused or g.fix is None or g.severity not in _BAD or g.fix.safety not in allowed:
                continue
            tried = act(g.fix, trial)
            if tried is None:
                continue
            more, result, findings = tried
            clash = any(
                (e.slot in taken and taken[e.slot] != (e.value, e.op))
                or (e.slot in slots and (slots[e.slot][0], slots[e.slot][1]) != (e.value, e.op))
                for e in more
            )
            if clash or _worst(findings, g.id) >= _worst(after, g.id):
                continue
            step = (g, g.fix, more, result, findings)
            break
        if step is None:
            break
        g, g_fix, more, trial, after_g = step
        reason = (
            f"{g.id} {_sev_name(after, g.id, _worst(after, g.id))} -> {_sev_name(after_g, g.id, _worst(after_g, g.id))}"
        )
        followers.append(Decision(g, g_fix, True, f"{reason}, needed by the fix for {target.id}", tuple(more)))
        taken.update({e.slot: (e.value, e.op) for e in more})
        after = after_g
    return trial, after, followers


# ---------------------------------------------------------------- the loop


def _fix_key(f: Finding) -> tuple:
    """One fix of one check, by what it does (its title may name line numbers that move as edits land)."""
    if f.fix is None:
        return (f.id,)
    actions = tuple(tuple(sorted(a.to_dict().items(), key=str)) for a in f.fix.actions)
    return (f.id, actions) if actions else (f.id, f.fix.title)


def make_plan(
    run: Callable[[Facts, Context], list[Finding]], facts: Facts, ctx: Context, allowed: frozenset[Safety]
) -> Plan:
    """Plan every fix that verifies. `run` runs the selected checks on (facts, context)."""
    texts = {}
    for path in (ctx.sbatch_path, ctx.config_path):
        if path:
            texts[path] = read_text(path)
    original = Workspace(texts)
    ws = original.copy()
    before = run(facts_for(facts, ws), context_for(ctx, ws))
    current = before
    decided: dict[tuple, Decision] = {}  # the last decision about each fix
    manual: list[tuple[Finding, Fix]] = []
    unsafe: list[tuple[Finding, Fix]] = []
    slots: dict[tuple, tuple[object, str, str]] = {}  # slot -> (value, op, finding id) of kept edits
    tried: set[tuple] = set()

    def act(fix: Fix, trial: Workspace) -> tuple[list[Edit], Workspace, list[Finding]] | None:
        """A fix's edits applied to trial and the checks run on the result; None when it cannot apply."""
        if fix.safety not in allowed or fix.safety is Safety.MANUAL:
            return None
        try:
            edits = [
                e
                for a in fix.actions
                if ActionKind(a.kind) is not ActionKind.COMMAND
                for e in resolve(a, ctx, facts, trial)
            ]
            if not edits:
                return None
            result = apply_edits(trial, edits)
            if result.texts == trial.texts and result.env == trial.env:
                return None
            return edits, result, run(facts_for(facts, result), context_for(ctx, result))
        except Exception:  # EditError, ValueError, or a bug in one editor: this follower does not apply
            return None

    for _ in range(MAX_ROUNDS):
        kept_one = False
        good: list[tuple] = []  # verified fixes of this round: (burden after, edits, key, finding, edits, ws, findings)
        candidates = sorted(
            (f for f in current if f.fix and f.severity not in (Severity.PASS, Severity.SKIP)),
            key=lambda f: -f.severity.rank,
        )
        for f in candidates:
            key = _fix_key(f)
            if key in tried:
                continue
            tried.add(key)
            fix = f.fix
            if fix is None:
                continue

            def decide(kept: bool, reason: str, edits: list[Edit] | tuple = (), f=f, fix=fix, key=key) -> None:
                decided[key] = Decision(f, fix, kept, reason, tuple(edits))

            if (
                fix.safety is Safety.MANUAL
                or not fix.actions
                or all(ActionKind(a.kind) is ActionKind.COMMAND for a in fix.actions)
            ):
                manual.append((f, fix))
                continue
            if fix.safety not in allowed:
                unsafe.append((f, fix))
                continue
            try:
                edits = [
                    e
                    for a in fix.actions
                    if ActionKind(a.kind) is not ActionKind.COMMAND
                    for e in resolve(a, ctx, facts, ws)
                ]
            except (EditError, ValueError) as err:
                decide(False, f"not applied: {err}")
                continue
            clash = next(
                (e for e in edits if e.slot in slots and (slots[e.slot][0], slots[e.slot][1]) != (e.value, e.op)), None
            )
            if clash is not None:
                value, _op, other = slots[clash.slot]
                decide(
                    False,
                    f"conflict: {clash.describe()} but the kept fix for {other} set {clash.key} to {value!r}",
                    edits,
                )
                continue
            try:
                trial = apply_edits(ws, edits)
                if trial.texts == ws.texts and trial.env == ws.env:
                    decide(False, "changes nothing in the files given", edits)
                    continue
                after = run(facts_for(facts, trial), context_for(ctx, trial))
            except EditError as err:
                decide(False, f"not applied: {err}", edits)
                continue
            except Exception as err:  # a bug in one editor must not cost the user the other fixes
                decide(False, f"not applied (gpudoctor error: {type(err).__name__}: {err})", edits)
                continue
            ok, why = judge(f, current, after)
            followers: list[Decision] = []
            if not ok and _worst(after, f.id) < _worst(current, f.id):
                # The fix helps its own finding but causes others: try it together with their own fixes (the
                # closure), verified as one group, so a fix is never refused for a consequence that has a fix.
                trial, after, followers = _with_consequences(f, current, trial, after, edits, slots, allowed, act)
                ok, why = judge(f, current, after)
                if ok and followers:
                    why += " (with " + ", ".join(f"{d.finding.id}'s fix" for d in followers) + ")"
            decide(ok, why, edits)
            if ok:
                group = edits + [e for d in followers for e in d.edits]
                good.append((_burden(after), len(group), key, f, group, trial, after, followers))
        if good:
            # Keep the verified fix that leaves the least wrong (a typo fixed beats shrinking the job around it);
            # the others are tried again on the result.
            _, _, best_key, f, edits, trial, after, followers = min(good, key=lambda g: g[:2])
            ws, current, kept_one = trial, after, True
            for d in followers:
                decided[_fix_key(d.finding)] = d
                tried.add(_fix_key(d.finding))
            for e in edits:
                slots[e.slot] = (e.value, e.op, f.id)
            # A fix refused before, or verified but not chosen, may work or be needed now: try those again.
            not_chosen = {g[2] for g in good if g[2] != best_key}
            tried -= not_chosen | {k for k, d in decided.items() if not d.kept}
            for k in not_chosen:
                decided.pop(k, None)
        if not kept_one:
            break
    return Plan(original, ws, before, current, list(decided.values()), _unique(manual), _unique(unsafe))


def _unique(pairs: list[tuple[Finding, Fix]]) -> list[tuple[Finding, Fix]]:
    seen, out = set(), []
    for f, fix in pairs:
        if (f.id, fix.title) not in seen:
            seen.add((f.id, fix.title))
            out.append((f, fix))
    return out
