"""Hostile limits (issue 24): numbers SLURM would refuse, a check that cannot run, a closed stdout and inputs
large enough to show a quadratic cost. Each ends as a finding, one line with its exit code, or linear work."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpudoctor.facts import ENV_PREFIXES
from gpudoctor.model import Context, Severity
from gpudoctor.readers import slurmfmt
from gpudoctor.registry import load_all
from gpudoctor.runner import run_checks
from tests.cliutil import clean_env, install_plugin, run_gpudoctor
from tests.factsutil import make_facts

ROOT = Path(__file__).resolve().parents[2]
HUGE = "9" * 5000  # past Python's 4,300-digit int() limit


# ---------------------------------------------------------------- numbers SLURM refuses


def test_slurm_reads_counts_up_to_int_max_and_refuses_more():
    """src/common/proc_args.c parse_int: strtol, then "Numeric argument (%ld) to big" above INT_MAX."""
    assert slurmfmt.parse_int("2147483647", "SLURM_NTASKS") == 2**31 - 1
    assert slurmfmt.parse_int("+0008", "SLURM_NTASKS") == 8
    for bad in ("2147483648", HUGE, "0" * 5000 + "2147483648"):
        with pytest.raises(slurmfmt.SlurmFormatError, match=r"SLURM_NTASKS: .*too large"):
            slurmfmt.parse_int(bad, "SLURM_NTASKS")
    assert slurmfmt.parse_int("0" * 5000 + "8", "SLURM_NTASKS") == 8
    with pytest.raises(slurmfmt.SlurmFormatError, match="whole number"):
        slurmfmt.parse_int("８", "SLURM_NTASKS")  # a full-width digit: int() reads it, strtol does not
    for reader, text in (
        (slurmfmt.parse_tasks_per_node, f"2(x{HUGE})"),
        (slurmfmt.parse_tasks_per_node, HUGE),
        (slurmfmt.parse_index_list, f"0-{HUGE}"),
        (slurmfmt.expand_nodelist, f"gpu[1-{HUGE}]"),
        (slurmfmt.parse_gpus, f"h100:{HUGE}"),
        (slurmfmt.parse_gres, f"gpu:{HUGE}"),
    ):
        with pytest.raises(slurmfmt.SlurmFormatError):
            reader(text)
    assert slurmfmt.compress_hostlist(["n" + HUGE, "n1"]) == f"n1,n{HUGE}"


def _slurm_names_the_code_reads() -> list[str]:
    names: set[str] = set()
    for folder in ("checks", "gpudoctor/job", "gpudoctor/readers", "gpudoctor/probe"):
        for path in (ROOT / folder).rglob("*.py"):
            names |= set(re.findall(r"[\"'](SLURM_[A-Z0-9_]+)[\"']", path.read_text()))
    return sorted(names)


@pytest.mark.parametrize("value", [HUGE, "-" + HUGE, "2147483648"], ids=["5000-digits", "negative", "int-max+1"])
def test_huge_slurm_numbers_inside_a_job_are_findings_naming_the_variable(value):
    """Inside a job (SLURM_JOB_ID set) every SLURM variable the code reads, one at a time: no check may crash,
    and the count variables SLURM itself refuses are named in a finding."""
    specs = list(load_all().values())
    names = _slurm_names_the_code_reads()
    assert len(names) > 20 and all(n.startswith(ENV_PREFIXES) for n in names)
    crashed, named = set(), set()
    base = {"SLURM_JOB_ID": "42", "SLURM_JOB_NUM_NODES": "1", "SLURM_NTASKS": "1", "SLURM_TASKS_PER_NODE": "1"}
    for name in names:
        for finding in run_checks(specs, make_facts(env={**base, name: value}), Context()):
            if finding.severity is Severity.ERROR:
                crashed.add(f"{finding.id} on {name}: {finding.message[:120]}")
            elif name in finding.message and finding.severity in (Severity.WARN, Severity.FAIL):
                named.add(name)
    assert not crashed
    assert {"SLURM_NTASKS", "SLURM_GPUS_ON_NODE", "SLURM_CPUS_PER_TASK"} <= named


def test_an_unreadable_gpu_count_is_not_judged_as_no_gpu():
    """SLURM_GPUS_ON_NODE that SLURM would refuse: GD-SLURM-001 names it; GD-SLURM-003 does not claim the job
    has no GPU (the count is unknown, not zero)."""
    env = {"SLURM_JOB_ID": "42", "SLURM_NTASKS": "1", "SLURM_GPUS_ON_NODE": HUGE}
    found = {f.id: f for f in run_checks(list(load_all().values()), make_facts(env=env), Context())}
    assert found["GD-SLURM-001"].severity is Severity.WARN and "SLURM_GPUS_ON_NODE" in found["GD-SLURM-001"].message
    assert found["GD-SLURM-003"].severity is Severity.SKIP, found["GD-SLURM-003"].message


# ---------------------------------------------------------------- a check that cannot run


CRASHING_PLUGIN = """
from gpudoctor.registry import check

@check(id="ACME-BOOM-001", name="acme-check-crashes", category="host", title="ACME check runs",
       needs=["env"], what="w", why="y", fix="f")
def boom(facts, ctx):
    raise ValueError("integer string too long")
"""


def test_a_check_that_crashes_fails_the_verdict_and_is_named(tmp_path):
    env = install_plugin(tmp_path, CRASHING_PLUGIN)
    r = run_gpudoctor("check", "--select", "ACME-BOOM-001", env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "could not run: ACME-BOOM-001" in r.stdout and "(exit 1)" in r.stdout
    r = run_gpudoctor("check", "--select", "ACME-BOOM-001", "--json", env=env)
    assert r.returncode == 1 and json.loads(r.stdout)["summary"]["error"] == 1
    r = run_gpudoctor("check", "--select", "ACME-BOOM-001", "--format", "concise", env=env)
    assert r.returncode == 1 and "ACME-BOOM-001" in r.stdout
    r = run_gpudoctor("health", "--select", "ACME-BOOM-001", env=env)
    assert r.returncode == 1 and "UNHEALTHY: ACME-BOOM-001" in r.stdout and "error ACME-BOOM-001" in r.stdout


# ---------------------------------------------------------------- a closed standard output

COMMANDS = [
    ["check", "--select", "driver", "--json"],
    ["snapshot"],
    ["list"],
    ["explain", "GD-DRV-001"],
    ["docs"],
    ["health", "--select", "driver", "--expect-gpus", "0"],
    ["smoke", "--help"],
    ["--version"],
]
BROKEN_SCRIPT = ROOT / "tests/fixtures/sbatch/seed-broken-gres1-ntasks8.slurm"
HOOK = str(Path(sys.executable).with_name("gpudoctor-hook"))


def _gpudoctor_with_stdout(redirect: str, argv: list[str]) -> subprocess.CompletedProcess:
    """argv run by a real bash with its standard output redirected (closed: `>&-`)."""
    return subprocess.run(
        ["bash", "-c", f'"$@" {redirect}', "bash", *argv],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
        cwd=ROOT,
        timeout=120,
    )


@pytest.mark.parametrize(
    "redirect,commands",
    [
        (">&-", [*COMMANDS, ["fix", "--sbatch", str(BROKEN_SCRIPT)]]),
        ("1</dev/null", [["--help"], ["--version"], ["list"]]),
        (">/dev/full", [["--help"], ["smoke", "--help"], ["--version"]]),
    ],
    ids=["closed", "read-only", "full"],
)
def test_an_unwritable_stdout_is_one_line_and_exit_2_for_every_command(redirect, commands):
    """`gpudoctor snapshot >&-` was exit 3 ("internal error: AttributeError"); argparse's --help and --version
    dropped their text and exited 0. As coreutils' close_stdout: one line, a failure status (2, as /dev/full)."""
    runs = [[sys.executable, "-m", "gpudoctor", *c] for c in commands]
    runs.append([HOOK, "sbatch", str(BROKEN_SCRIPT)])
    for argv in runs:
        r = _gpudoctor_with_stdout(redirect, argv)
        assert r.returncode == 2, (argv, r.returncode, r.stderr)
        assert r.stderr.startswith("gpudoctor: cannot write the output: ") and r.stderr.count("\n") == 1, r.stderr


# ---------------------------------------------------------------- large inputs: fix within a small factor of check


def _long_script(lines: int) -> str:
    head = ["#!/bin/bash", "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8"]
    body = [f"echo step {i} >> log.txt" if i % 2 else f"export V{i}=value{i}" for i in range(lines)]
    return "\n".join([*head, "export NCCL_ASYNC_ERROR_HANDLING=1", *body, "srun python train.py", ""])


def _cpu_seconds(argv: list[str]) -> float:
    import contextlib
    import io
    import time

    from gpudoctor.cli import main

    started = time.process_time()  # this process's CPU: a busy neighbour on the machine does not count
    with contextlib.redirect_stdout(io.StringIO()):
        main(argv)
    return time.process_time() - started


def test_fix_reads_a_long_script_a_fixed_number_of_times(tmp_path, monkeypatch):
    """fix parsed the script once per look at it (six parses for one fix); the last parses are kept, so their
    count is the number of distinct texts (the original, each edit's result), whatever the script's length."""
    from gpudoctor.readers.sbatch import reader

    counts = []
    for lines in (2_000, 4_000):
        path = tmp_path / f"long{lines}.slurm"
        path.write_text(_long_script(lines))
        reader._parse_sbatch_cached.cache_clear()
        _cpu_seconds(["fix", "--sbatch", str(path)])
        counts.append(reader._parse_sbatch_cached.cache_info().misses)
    assert counts[0] == counts[1] <= 5, counts


def test_fix_costs_a_small_multiple_of_check_and_grows_linearly(tmp_path):
    """CPU time of this process, fix against check on the same script: a ratio and a doubling, with room for
    noise (measured here: fix 3.2x check on 50,000 lines; doubling the script 2.0x the time)."""
    costs = {}
    for lines in (8_000, 16_000):
        path = tmp_path / f"long{lines}.slurm"
        path.write_text(_long_script(lines))
        check = _cpu_seconds(["check", "--sbatch", str(path)])
        fix = _cpu_seconds(["fix", "--sbatch", str(path)])
        costs[lines] = (check, fix)
        assert fix < 6 * check, (lines, check, fix)
    assert costs[16_000][1] < 3 * costs[8_000][1], costs


def test_an_argv_of_thousands_of_words_is_refused_at_once():
    """argparse rescans every option string for each one (20,000 flags: 18 s); gpudoctor needs under 100."""
    r = run_gpudoctor("check", *["--strict"] * 20_000, timeout=30)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "at most 1000" in r.stderr
