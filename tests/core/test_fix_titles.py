"""Issue 38: a fix's text, its diff and its verification agree. Over every fixture batch script, each fix
that gpudoctor would write (safe or unsafe: its actions are the edits `fix` diffs and re-checks) names in
its title every option it sets (`--ntasks-per-node=1` where the diff writes `#SBATCH --ntasks-per-node=1`)
and every option, variable or key it changes; a value the title gives is the value written. A fix that
changes the CPUs a node's tasks get names the --cpus-per-task it writes (the CPU-halving fix is gone)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.cliutil import run_gpudoctor_here
from tests.factsutil import FIXTURES

SCRIPTS = FIXTURES / "sbatch"
ALL = (
    sorted(SCRIPTS.glob("*.slurm"))
    + sorted(SCRIPTS.glob("realworld/*.slurm"))
    + sorted(SCRIPTS.glob("realworld/*/*.slurm"))
)
CPU_SNAPSHOT = str(FIXTURES / "facts" / "recorded-cpu-debian12-torch2.13-nogpu.json")
FLAG = re.compile(r"--([a-z][a-z0-9_-]*)=([^\s,;)`'\"]+)")
QUOTED = re.compile(r"`[^`]*`")  # a line quoted as it will read (`srun torchrun ...`): its other flags are the user's


def flags(text: str) -> list[tuple[str, str]]:
    return [(_norm(name), value.rstrip(":")) for name, value in FLAG.findall(text)]


def _norm(name: str) -> str:
    return name.replace("_", "-").lower()


def _named(action: dict, title: str) -> bool:
    """The title names what the action changes."""
    kind, key, target, value = action["kind"], action.get("key"), action["target"], action.get("value")
    words = _norm(title)
    if kind in ("sbatch_set", "sbatch_remove", "override_set"):
        return _norm(str(key).lstrip("-")) in words
    if kind in ("set_env", "unset_env"):
        return target.lower() in title.lower()
    if kind in ("export_set", "export_remove"):
        return str(key).lower() in title.lower()
    if kind == "srun_prefix":
        return "srun" in title
    if kind == "sbatch_rename":
        return str(value) in title or _norm(str(value)) in words
    return True  # hoist, repairs: the title says what kind of line moves; its text is the line's own


def _fixes(path: Path) -> list[tuple[str, dict]]:
    r = run_gpudoctor_here("check", "--snapshot", CPU_SNAPSHOT, "--sbatch", str(path), "--json")
    report = json.loads(r.stdout)
    return [(f["id"], f["fix"]) for f in report["findings"] if f["fix"] and f["fix"]["safety"] != "manual"]


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.stem)
def test_a_fix_title_names_exactly_what_its_edits_change(path):
    for check_id, fix in _fixes(path):
        title, actions = fix["title"], fix["actions"]
        for action in actions:
            assert _named(action, title), (check_id, title, action)
        written = {
            _norm(str(a.get("key")).lstrip("-")): str(a.get("value"))
            for a in actions
            if a["kind"] in ("sbatch_set", "override_set")
        }
        for a in actions:  # the lines a fix writes whole: the flags in them
            if a["kind"] in ("srun_prefix", "sbatch_hoist", "sbatch_rename", "directive_repair"):
                written.update(flags(str(a.get("value") or "")))
        for name, value in flags(QUOTED.sub("", title)):  # nothing else: no alternative the edits do not make
            assert written.get(name) == value, (check_id, title, written)
        changes_tasks = "ntasks-per-node" in written and "ntasks-per-node" not in FLAG.pattern
        if changes_tasks and any(a["kind"] == "sbatch_set" and a["key"] == "cpus-per-task" for a in actions):
            assert "cpus-per-task" in _norm(title), (check_id, title)
