"""Inputs from an adversarial run (issue 13 B3, B7, B8): each must cost linear time and end as a
finding or one line with exit 2 - never a hang, an `error` finding or exit 3."""

from __future__ import annotations

import time

import pytest

from gpudoctor.readers import allocconf
from tests.cliutil import run_gpudoctor, run_gpudoctor_here


@pytest.mark.parametrize(
    "text",
    [
        "a" * 120_000,  # took 81-220 s in suggest_correction's key=value regex
        "a" * (allocconf.MAX_CONF_CHARS - 2) + "=1",
        "max_split_size_mb:" + "9" * (allocconf.MAX_CONF_CHARS - 30) + "x",  # fullmatch backtracking
        "roundup_power2_divisions:[" + "1:2," * (allocconf.MAX_CONF_CHARS // 5) + "]",
        "max_split_size_mb:" + "0" * 6000 + "200",
    ],
    ids=["letters-120k", "key=value", "digits-then-letter", "long-list", "leading-zeros"],
)
def test_allocator_config_costs_linear_time(text):
    started = time.monotonic()
    conf = allocconf.parse_alloc_conf(text)
    allocconf.suggest_correction(text)
    assert time.monotonic() - started < 1.0
    assert all(len(m) < 3 * allocconf.MAX_CONF_CHARS for m in conf.errors + conf.warnings)


def test_a_5000_digit_split_size_is_out_of_range_not_a_crash():
    conf = allocconf.parse_alloc_conf("max_split_size_mb:" + "9" * 5000)
    assert not conf.errors and conf.warnings  # too long to check
    conf = allocconf.parse_alloc_conf("max_split_size_mb:" + "9" * 4000)
    assert any("too large" in e for e in conf.errors)
    conf = allocconf.parse_alloc_conf("max_split_size_mb:" + "0" * 4000 + "512")
    assert not conf.errors and conf.settings["max_split_size_mb"].endswith("512")


def test_an_oversized_config_is_a_warning_not_a_check():
    conf = allocconf.parse_alloc_conf("x" * 120_000)
    assert not conf.errors and "not check" in conf.warnings[0]
    assert allocconf.suggest_correction("max_split_size_mb=1;" * 10_000) is None


# --- B7/B8: exit 3, error findings and tracebacks on bad input --------------------------------------------

import json  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

from gpudoctor.facts import ENV_NAMES, ENV_PREFIXES  # noqa: E402
from gpudoctor.model import Context, Severity  # noqa: E402
from gpudoctor.registry import load_all  # noqa: E402
from gpudoctor.runner import run_checks  # noqa: E402
from tests.factsutil import make_facts  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _gpudoctor(*args: str, env: dict | None = None, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    """A real process: for what the interpreter's start-up (PYTHONPATH) or its stdout's file makes of a run."""
    return run_gpudoctor(*args, env=env, stdout=stdout, cwd=ROOT)


def _gpudoctor_here(*args: str) -> subprocess.CompletedProcess:
    """The same command line in this process, for what it prints."""
    return run_gpudoctor_here(*args, cwd=ROOT)


# the tests replaying this machine's snapshot share one probe of it: one worker runs them
replays_the_live_snapshot = pytest.mark.xdist_group("hostile-inputs-live-snapshot")


def _env_names_the_checks_read() -> list[str]:
    names: set[str] = set()
    for folder in ("checks", "gpudoctor/job", "gpudoctor/readers"):
        for path in (ROOT / folder).glob("*.py"):
            names |= set(re.findall(r"[\"']([A-Z][A-Z0-9_]{2,})[\"']", path.read_text()))
    return sorted(n for n in names if n in ENV_NAMES or n.startswith(ENV_PREFIXES))


@pytest.mark.parametrize(
    "value",
    ["9" * 5000, "-" + "9" * 5000, "0" * 5000 + "1", "0x" + "f" * 5000, "9" * 5000 + ".5"],
    ids=["digits", "negative", "leading-zeros", "hex", "decimal"],
)
def test_huge_numbers_in_any_variable_the_checks_read_are_judged_not_crashed(value):
    specs = list(load_all().values())
    names = _env_names_the_checks_read()
    assert len(names) > 50  # the scan found the checks' variables
    crashed = set()
    for name in names:
        for finding in run_checks(specs, make_facts(env={name: value}), Context()):
            if finding.severity == Severity.ERROR:
                crashed.add(f"{finding.id} on {name}: {finding.message[:120]}")
    assert not crashed


def test_a_shadow_pynvml_that_calls_sys_exit_is_an_error_fact(tmp_path):
    (tmp_path / "pynvml.py").write_text("import sys\nsys.exit('shadow pynvml')\n")
    # NVML is probed by gpudoctor itself; the torch probe (a --python answering at once) is not the test
    r = _gpudoctor("snapshot", "--python", "/bin/true", env={"PYTHONPATH": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    nvidia = json.loads(r.stdout)["nvidia"]
    assert nvidia["available"] is False and "SystemExit" in nvidia["error"]


@pytest.fixture(scope="module")
def live_snapshot(tmp_path_factory) -> dict:
    r = _gpudoctor_here("snapshot")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@replays_the_live_snapshot
def test_a_lone_surrogate_in_a_replayed_snapshot_is_shown_escaped(tmp_path, live_snapshot):
    data = dict(live_snapshot, host={**live_snapshot["host"], "hostname": "node\ud800x"})
    snap = tmp_path / "snap.json"
    snap.write_text(json.dumps(data))  # ensure_ascii: the file holds the escape \ud800
    for fmt in ([], ["--json"]):
        r = _gpudoctor_here("check", "--snapshot", str(snap), *fmt)
        assert r.returncode in (0, 1), r.stderr
        assert "node\\ud800x" in r.stdout.replace("\\\\", "\\")  # JSON doubles the backslash


@replays_the_live_snapshot
def test_json_report_is_strict_json_with_non_finite_numbers(tmp_path, live_snapshot):
    data = dict(live_snapshot, probe_seconds=float("nan"))  # copied into the report's source
    snap = tmp_path / "snap.json"
    snap.write_text(json.dumps(data))  # Python writes NaN, which json.loads reads back
    r = _gpudoctor_here("check", "--snapshot", str(snap), "--json")
    assert r.returncode in (0, 1), r.stderr
    report = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert report["source"]["probe_seconds"] == "NaN"


def test_json_report_render_never_writes_nan():
    from gpudoctor.model import Finding
    from gpudoctor.report import json_report

    finding = Finding(
        id="GD-X-001",
        name="x",
        category="host",
        severity=Severity.PASS,
        title="t",
        message="m",
        evidence={"ratio": float("nan"), "peak": float("inf"), "low": float("-inf"), "ok": 1.5},
    )
    data = json.loads(json_report.document([finding]), parse_constant=lambda c: pytest.fail(c))
    assert data["findings"][0]["evidence"] == {"ratio": "NaN", "peak": "Infinity", "low": "-Infinity", "ok": 1.5}


@replays_the_live_snapshot
@pytest.mark.parametrize("fmt", [[], ["--json"]])
def test_output_to_dev_full_is_one_line_exit_2(live_snapshot, tmp_path, fmt):
    snap = tmp_path / "snap.json"
    snap.write_text(json.dumps(live_snapshot))
    with open("/dev/full", "w") as full:
        r = _gpudoctor("check", "--snapshot", str(snap), *fmt, stdout=full)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["gpudoctor: cannot write the output: No space left on device"]


def test_bare_gpudoctor_is_a_usage_error_on_stderr():
    r = _gpudoctor_here()
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1 and "check" in r.stderr
    assert _gpudoctor_here("--help").returncode == 0


def test_huge_numbers_in_any_numeric_string_fact_are_judged_not_crashed():
    """Version strings and other facts holding digits, replayed with 5000 digits (a hand-made snapshot)."""
    import copy

    from gpudoctor.facts import Facts
    from tests.factsutil import HEALTHY_GPU, load_fixture

    base = load_fixture(HEALTHY_GPU)
    paths: list[list] = []

    def walk(node, path: list) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, path + [key])
        elif isinstance(node, list):
            for i, value in enumerate(node[:1]):
                walk(value, path + [i])
        elif isinstance(node, str) and any(c.isdigit() for c in node) and path != ["schema"]:
            paths.append(path)

    walk(base, [])
    assert len(paths) > 10
    specs = list(load_all().values())
    crashed = set()
    for path in paths:
        data = copy.deepcopy(base)
        node = data
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = "9" * 5000
        for finding in run_checks(specs, Facts.from_dict(data), Context()):
            if finding.severity == Severity.ERROR:
                crashed.add(f"{finding.id} on {'.'.join(map(str, path))}: {finding.message[:100]}")
    assert not crashed


def test_smoke_json_is_strict_json_when_a_loss_diverges():
    import io

    from gpudoctor.sample_train.judge.report import print_json

    out = io.StringIO()
    print_json({"metrics": {"loss_last": float("nan"), "tokens_per_s": float("inf")}}, out)
    data = json.loads(out.getvalue(), parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert data["metrics"] == {"loss_last": "NaN", "tokens_per_s": "Infinity"}


# --- issue 35 item 6: every command's numbers through one parser; item 5: no empty path taken for "not given" ---

# Python's int() and float() read all of these; none is a number a person types on a command line.
NOT_NUMBERS = ["١", "٤٦", "1_0", " 5", "5\n", "nan", "inf", "-inf", "0x10", "1e999", "５", ""]
NUMERIC_OPTIONS = [
    ("check", "--expect-gpus"),
    ("check", "--torch-timeout"),
    ("check", "--timeout"),
    ("snapshot", "--torch-timeout"),
    ("health", "--budget"),
    ("watch", "--for"),
    ("watch", "--rate"),
    ("smoke", "--steps"),
    ("smoke", "--batch-size"),
    ("smoke", "--timeout"),
    ("smoke", "--min-tokens-per-s"),
]


@pytest.mark.parametrize("command, option", NUMERIC_OPTIONS)
def test_every_commands_numbers_are_ascii_digits_only(command, option):
    for text in NOT_NUMBERS:
        r = run_gpudoctor_here(command, option, text)
        assert r.returncode == 2, (option, text, r.stdout[-300:], r.stderr)
        assert option in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "\n" not in r.stderr.strip(), r.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "--sbatch", ""],
        ["check", "--config", ""],
        ["check", "--junit", ""],
        ["check", "--prometheus", ""],
        ["check", "--snapshot", ""],
        ["fix", "--env-file", ""],
        ["snapshot", "-o", ""],
        ["docs", "-o", ""],
        ["compare", "", "x.json"],
        ["watch", "--job", "5", "--log", ""],
        ["watch", "--job", "5", "--prometheus", ""],
        ["smoke", "--python", ""],
    ],
)
def test_an_empty_path_is_one_line_and_exit_2(argv):
    r = run_gpudoctor_here(*argv)
    assert r.returncode == 2 and "an empty path" in r.stderr, (argv, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1
