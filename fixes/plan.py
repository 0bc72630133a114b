"""Plan the fixes: resolve each fix's actions to edits of the place that decides the value, apply them
to copies in memory, re-run the checks on the result, and keep a fix only if it helps.

Where a value is edited (issue 11, "edit where the value comes from"), in this order:
  1. the batch script's own `export` line or `#SBATCH` directive (--sbatch);
  2. an override on the launch line: Hydra/OmegaConf `key=value`, or `--flag value`;
  3. the training config's key (--config; YAML kept byte-for-byte outside the edit, or JSON);
  4. else the environment: lines for `eval "$(gpudoctor fix --shell)"` or --env-file.
A new `export` goes directly before the launch line. What an edit is, and each kind's place, lines and
slot, is gpudoctor/edit.py's table; `resolve` moves an edit to its place, `apply_edits` makes it.

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

from gpudoctor.edit import COMMAND, CONFIG, ENV, Edit
from gpudoctor.facts import Facts
from gpudoctor.fileio import FileIOError, read_input_bytes
from gpudoctor.fixes import config_edit, sbatch_edit
from gpudoctor.fixes.sbatch_edit import EditError
from gpudoctor.model import Action, ActionKind, Context, Finding, Fix, Safety, Severity, worst
from gpudoctor.redact import REDACTED

MAX_ROUNDS = 20
_BAD = (Severity.WARN, Severity.FAIL, Severity.ERROR)


class InputError(ValueError):
    """An input file that cannot be read back (one line, exit 2; nothing is written)."""


@dataclass
class Workspace:
    """The inputs as text (the files as they would be written) and the environment changes."""

    texts: dict[str, str]
    env: dict[str, str | None] = field(default_factory=dict)  # edits of no file: a value, or None for unset

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

    from gpudoctor.probe.bash import bash_syntax
    from gpudoctor.readers.accelerate import with_config_files
    from gpudoctor.readers.program import launched_program
    from gpudoctor.readers.sbatch import SbatchError, parse_sbatch
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
    edit = Edit.of(action)
    script = ctx.sbatch_path if ctx.sbatch_path in ws.texts else None
    place = edit.row.place
    if place == COMMAND:
        raise EditError("a command for the user to run")
    if place == ENV:
        edit = _env_edit(edit, script)
    elif place == CONFIG:
        edit = _config_edit(edit, ctx, ws, script)
    elif not script or not _same_file(edit.dest, script):
        raise EditError(f"{edit.dest} is not the --sbatch script given")
    elif edit.kind is ActionKind.SBATCH_SET and edit.value is None:
        edit = replace(edit, kind=ActionKind.SBATCH_REMOVE, dest=script)
    else:
        edit = replace(edit, dest=script)
    if edit.kind is ActionKind.EXPORT_REMOVE:  # inherited from the submitting shell: the script unsets it too
        edit = replace(edit, value=edit.key in facts.env)
    return [edit]


def _env_edit(edit: Edit, script: str | None) -> Edit:
    """A variable is set where the job gets it: the batch script's export when there is a script, else the
    environment gpudoctor fix prints lines for."""
    if edit.kind is ActionKind.SET_ENV and REDACTED in edit.value:
        # a value with a credential reaches gpudoctor blanked (facts.redact_value): writing it would
        # replace the real value with the blank
        raise EditError(f"the value of {edit.key} holds a credential gpudoctor does not copy; set it by hand")
    return replace(edit, kind=edit.row.in_script, dest=script) if script and edit.row.in_script else edit


def _config_edit(edit: Edit, ctx: Context, ws: Workspace, script: str | None) -> Edit:
    """A config key is set where the program gets it: an override on the launch line when the line gives one,
    else the --config file."""
    key = edit.key or ""
    if script and sbatch_edit.override_on_launch(ws.texts[script], key, _read_config_of(ctx, ws)):
        return Edit(ActionKind.OVERRIDE_SET, script, key, edit.value)
    if not ctx.config_path or not _same_file(edit.dest, ctx.config_path):
        raise EditError(f"{edit.dest} is not the --config given")
    return replace(edit, dest=ctx.config_path, key=key)


# How each kind that changes a file changes its text (gpudoctor/edit.KINDS says which kinds do).
_EDITORS: dict[ActionKind, Callable[[str, Edit], str]] = {
    ActionKind.YAML_SET: lambda t, e: config_edit.set_key(t, str(e.dest), e.key, e.value),
    ActionKind.SBATCH_SET: lambda t, e: sbatch_edit.set_directive(t, e.key, e.value),
    ActionKind.SBATCH_REMOVE: lambda t, e: sbatch_edit.remove_directive(t, e.key),
    ActionKind.SBATCH_HOIST: lambda t, e: sbatch_edit.hoist_directive(t, str(e.value)),
    ActionKind.CONTINUATION_REPAIR: lambda t, e: sbatch_edit.repair_continuation(t, str(e.value)),
    ActionKind.DIRECTIVE_REPAIR: lambda t, e: sbatch_edit.repair_directive(t, str(e.value)),
    ActionKind.SBATCH_RENAME: lambda t, e: sbatch_edit.rename_option(t, str(e.key), str(e.value)),
    ActionKind.SRUN_PREFIX: lambda t, e: sbatch_edit.prefix_srun(t, str(e.value or "")),
    ActionKind.EXPORT_SET: lambda t, e: sbatch_edit.set_export(t, e.key, e.value),
    ActionKind.EXPORT_REMOVE: lambda t, e: sbatch_edit.remove_export(t, e.key, inherited=bool(e.value)),
    ActionKind.OVERRIDE_SET: lambda t, e: sbatch_edit.set_override(t, e.key, e.value),
}


def apply_edits(ws: Workspace, edits: list[Edit]) -> Workspace:
    """The one applier: the edits made to a copy of the workspace, in order."""
    out = ws.copy()
    for e in edits:
        if e.dest is None:
            # the value as resolved: a str, or a shellquote.Reference the shell line keeps live
            out.env[str(e.key)] = e.value if e.kind is ActionKind.SET_ENV and isinstance(e.value, str) else None
        else:
            out.texts[e.dest] = _EDITORS[e.kind](out.texts[e.dest], e)
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


Tried = tuple[list[Edit], Workspace, list[Finding]]  # a fix's edits, the workspace they make, its findings


MAX_CONSEQUENCES = 4  # fixes of caused findings tried on top of one fix (the closure is small in practice)


def _with_consequences(
    target: Finding,
    before: list[Finding],
    trial: Workspace,
    after: list[Finding],
    edits: list[Edit],
    slots: dict[tuple, tuple[object, ActionKind, str]],
    allowed: frozenset[Safety],
    act: Callable[[Fix, Workspace], Tried | None],
) -> tuple[Workspace, list[Finding], list[Decision]]:
    """target's fix (already in trial) plus, one at a time, the fixes of the findings it caused, each kept only
    when its own finding gets better and it clashes with no kept or grouped edit. Returns the group's
    workspace, findings and the followers' decisions; the caller judges the group as one fix."""
    followers: list[Decision] = []
    taken = {e.slot: (e.value, e.kind) for e in edits}
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
                (e.slot in taken and taken[e.slot] != (e.value, e.kind))
                or (e.slot in slots and (slots[e.slot][0], slots[e.slot][1]) != (e.value, e.kind))
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
        taken.update({e.slot: (e.value, e.kind) for e in more})
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
    from gpudoctor.readers.sbatch import editing

    # the script's edits are read as check reads the script: its path and the arguments sbatch would pass it
    with editing(ctx.sbatch_path or "<script>", getattr(ctx.sbatch, "arguments", None)):
        planner = _Planner(run, facts, ctx, allowed)
        for _ in range(MAX_ROUNDS):
            if not planner.round():
                break
        return planner.plan()


@dataclass
class _Candidate:
    """A fix verified in this round: with the edits of the fixes it needs, and what it leaves."""

    key: tuple
    finding: Finding
    edits: list[Edit]
    trial: Workspace
    after: list[Finding]
    followers: list[Decision]

    @property
    def rank(self) -> tuple[int, int]:
        """The least left wrong first (a typo fixed beats shrinking the job around it), then the fewest edits."""
        return _burden(self.after), len(self.edits)


class _Planner:
    """The state of the loop: the workspace the kept fixes made, the findings on it, and what was decided."""

    def __init__(
        self,
        run: Callable[[Facts, Context], list[Finding]],
        facts: Facts,
        ctx: Context,
        allowed: frozenset[Safety],
    ) -> None:
        self.run, self.facts, self.ctx, self.allowed = run, facts, ctx, allowed
        self.original = Workspace({path: read_text(path) for path in (ctx.sbatch_path, ctx.config_path) if path})
        self.ws = self.original.copy()
        self.before = self.current = self.check(self.ws)
        self.decided: dict[tuple, Decision] = {}  # the last decision about each fix
        self.manual: list[tuple[Finding, Fix]] = []
        self.unsafe: list[tuple[Finding, Fix]] = []
        self.slots: dict[tuple, tuple[object, ActionKind, str]] = {}  # slot -> (value, kind, finding id) kept
        self.tried: set[tuple] = set()

    def plan(self) -> Plan:
        decisions = list(self.decided.values())
        return Plan(
            self.original, self.ws, self.before, self.current, decisions, _unique(self.manual), _unique(self.unsafe)
        )

    def check(self, ws: Workspace) -> list[Finding]:
        return self.run(facts_for(self.facts, ws), context_for(self.ctx, ws))

    def edits_of(self, fix: Fix, ws: Workspace) -> list[Edit]:
        actions = [a for a in fix.actions if ActionKind(a.kind) is not ActionKind.COMMAND]
        return [e for a in actions for e in resolve(a, self.ctx, self.facts, ws)]

    def round(self) -> bool:
        """Try every fix not tried yet on the current workspace and keep the best that verifies; False when
        none does."""
        candidates = sorted(
            (f for f in self.current if f.fix and f.severity not in (Severity.PASS, Severity.SKIP)),
            key=lambda f: -f.severity.rank,
        )
        good = [c for c in map(self.verify, candidates) if c is not None]
        if not good:
            return False
        self.keep(min(good, key=lambda c: c.rank), good)
        return True

    def verify(self, f: Finding) -> _Candidate | None:
        """f's fix applied to the workspace and the checks run again: the candidate when it helps, else None
        (the reason decided, or the fix set aside as manual or unsafe)."""
        key = _fix_key(f)
        if key in self.tried or f.fix is None:
            return None
        self.tried.add(key)
        fix = f.fix
        if fix.safety is Safety.MANUAL or all(ActionKind(a.kind) is ActionKind.COMMAND for a in fix.actions):
            self.manual.append((f, fix))  # (no actions at all is manual too)
            return None
        if fix.safety not in self.allowed:
            self.unsafe.append((f, fix))
            return None
        try:
            edits = self.edits_of(fix, self.ws)
        except (EditError, ValueError) as err:
            self.decide(key, f, False, f"not applied: {err}")
            return None
        clash = next((e for e in edits if self.clashes(e)), None)
        if clash is not None:
            value, _kind, other = self.slots[clash.slot]
            why = f"conflict: {clash.describe()} but the kept fix for {other} set {clash.key} to {value!r}"
            self.decide(key, f, False, why, edits)
            return None
        try:
            trial = apply_edits(self.ws, edits)
            if trial.texts == self.ws.texts and trial.env == self.ws.env:
                self.decide(key, f, False, "changes nothing in the files given", edits)
                return None
            after = self.check(trial)
        except EditError as err:
            self.decide(key, f, False, f"not applied: {err}", edits)
            return None
        except Exception as err:  # a bug in one editor must not cost the user the other fixes
            self.decide(key, f, False, f"not applied (gpudoctor error: {type(err).__name__}: {err})", edits)
            return None
        return self.judge(key, f, edits, trial, after)

    def clashes(self, e: Edit) -> bool:
        """e sets a value a kept fix set otherwise."""
        return e.slot in self.slots and self.slots[e.slot][:2] != (e.value, e.kind)

    def judge(
        self, key: tuple, f: Finding, edits: list[Edit], trial: Workspace, after: list[Finding]
    ) -> _Candidate | None:
        ok, why = judge(f, self.current, after)
        followers: list[Decision] = []
        if not ok and _worst(after, f.id) < _worst(self.current, f.id):
            # The fix helps its own finding but causes others: try it together with their own fixes (the
            # closure), verified as one group, so a fix is never refused for a consequence that has a fix.
            trial, after, followers = _with_consequences(
                f, self.current, trial, after, edits, self.slots, self.allowed, self.follower
            )
            ok, why = judge(f, self.current, after)
            if ok and followers:
                why += " (with " + ", ".join(f"{d.finding.id}'s fix" for d in followers) + ")"
        self.decide(key, f, ok, why, edits)
        if not ok:
            return None
        return _Candidate(key, f, edits + [e for d in followers for e in d.edits], trial, after, followers)

    def follower(self, fix: Fix, trial: Workspace) -> Tried | None:
        """A fix's edits applied to trial and the checks run on the result; None when it cannot apply."""
        if fix.safety not in self.allowed or fix.safety is Safety.MANUAL:
            return None
        try:
            edits = self.edits_of(fix, trial)
            if not edits:
                return None
            result = apply_edits(trial, edits)
            if result.texts == trial.texts and result.env == trial.env:
                return None
            return edits, result, self.check(result)
        except Exception:  # EditError, ValueError, or a bug in one editor: this follower does not apply
            return None

    def decide(self, key: tuple, f: Finding, kept: bool, reason: str, edits: list[Edit] | tuple = ()) -> None:
        assert f.fix is not None
        self.decided[key] = Decision(f, f.fix, kept, reason, tuple(edits))

    def keep(self, best: _Candidate, good: list[_Candidate]) -> None:
        """The best candidate becomes the workspace; the others are tried again on the result, and so is a fix
        refused before (it may work, or be needed, now)."""
        self.ws, self.current = best.trial, best.after
        for d in best.followers:
            self.decided[_fix_key(d.finding)] = d
            self.tried.add(_fix_key(d.finding))
        for e in best.edits:
            self.slots[e.slot] = (e.value, e.kind, best.finding.id)
        not_chosen = {c.key for c in good if c.key != best.key}
        self.tried -= not_chosen | {k for k, d in self.decided.items() if not d.kept}
        for k in not_chosen:
            self.decided.pop(k, None)


def _unique(pairs: list[tuple[Finding, Fix]]) -> list[tuple[Finding, Fix]]:
    seen, out = set(), []
    for f, fix in pairs:
        if (f.id, fix.title) not in seen:
            seen.add((f.id, fix.title))
            out.append((f, fix))
    return out
