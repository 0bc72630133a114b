"""Issue 38: the default text report fits one screen and every message is one short sentence.

`check --sbatch` on every fixture batch script at COLUMNS=80: with at most four problems the report is at most
24 lines, no line is wider than 80 columns, and every fail is visible without -v. Over the fixture scripts, the
facts fixtures and the training configs, every message of `--json` is at most ~120 characters (the contract
gpudoctor.runner.one_sentence holds: a longer one ends at a clause, the rest goes to the `detail` evidence).
"""

from __future__ import annotations

import json

import pytest

from tests.cliutil import run_gpudoctor_here
from tests.factsutil import FIXTURES

SCRIPTS = FIXTURES / "sbatch"
ALL_SCRIPTS = sorted(SCRIPTS.glob("*.slurm")) + sorted(SCRIPTS.glob("realworld/*.slurm"))
ALL_SCRIPTS += sorted(SCRIPTS.glob("realworld/*/*.slurm"))
CPU_SNAPSHOT = str(FIXTURES / "facts" / "recorded-cpu-debian12-torch2.13-nogpu.json")
SCREEN, COLUMNS, MESSAGE = 24, 80, 120


def _check(*args: str):
    return run_gpudoctor_here("check", *args, env={"COLUMNS": str(COLUMNS)})


@pytest.mark.parametrize("path", ALL_SCRIPTS, ids=lambda p: p.stem)
def test_the_default_report_fits_one_screen(path):
    r = _check("--sbatch", str(path))
    report = json.loads(_check("--sbatch", str(path), "--json").stdout)
    outside = set(report["target"]["outside_verdict"])
    problems = [f for f in report["findings"] if f["severity"] in ("fail", "warn", "error") and f["id"] not in outside]
    lines = r.stdout.splitlines()
    wide = [line for line in lines if len(line) > COLUMNS]
    assert not wide, "\n".join(wide)
    if len(problems) <= 4:
        assert len(lines) <= SCREEN, f"{len(lines)} lines for {len(problems)} problem(s):\n{r.stdout}"
    for f in problems:  # every fail (and warn) visible without -v, with its id
        assert f["id"] in r.stdout, (f["id"], r.stdout)


MESSAGE_RUNS = [["--snapshot", CPU_SNAPSHOT, "--sbatch", str(p)] for p in ALL_SCRIPTS]
MESSAGE_RUNS += [["--snapshot", str(p)] for p in sorted((FIXTURES / "facts").glob("*.json"))]
MESSAGE_RUNS += [
    ["--snapshot", CPU_SNAPSHOT, "--config", str(p), "--expect-gpus", "8"]
    for p in sorted((FIXTURES / "configs").glob("*.*"))
    if "broken" not in p.name
]


def test_every_message_is_one_short_sentence():
    long = []
    for args in MESSAGE_RUNS:
        report = json.loads(_check(*args, "--json").stdout)
        long += [(f["id"], f["message"]) for f in report["findings"] if len(f["message"]) > MESSAGE]
    assert not long, long[:5]


def test_a_long_message_ends_at_a_clause_and_keeps_the_rest():
    from gpudoctor.runner import one_sentence

    text = "a" * 60 + " is wrong: " + "because " * 20
    head, rest = one_sentence(text)
    assert head == "a" * 60 + " is wrong" and rest.startswith("because")
    assert one_sentence("short") == ("short", None)
    head, rest = one_sentence("x" * 300)
    assert len(head) <= MESSAGE and rest == "x" * 300  # nothing to cut at: shortened, the whole kept
