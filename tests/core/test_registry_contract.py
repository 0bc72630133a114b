"""The registry's contract: every registered check keeps it, and every registration mistake is caught
when its module is imported, by one line naming the file and the check (issue 9).

The mistakes are proven with throwaway check modules written to a temporary folder that joins the
gpudoctor.checks package (real imports of real files, as a new checks/x.py would be).
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

import gpudoctor.checks
from gpudoctor.facts import SECTIONS
from gpudoctor.model import CATEGORIES, Context, Severity
from gpudoctor.registry import (
    BUILTIN_ID,
    DOC_SECTIONS,
    REQUIREMENTS,
    SCOPES,
    RegistryError,
    builtin_modules,
    load_all,
    select,
)
from gpudoctor.runner import UNMET, run_check, run_checks
from tests.cliutil import install_plugin, run_gpudoctor
from tests.factsutil import make_facts

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]
SPECS = load_all()


# --- every registered check ---------------------------------------------------------------


@pytest.mark.parametrize("spec", SPECS.values(), ids=list(SPECS))
def test_every_check_keeps_the_contract(spec):
    assert spec.module.startswith("gpudoctor.checks."), spec.module
    assert BUILTIN_ID.match(spec.id)
    assert spec.category in CATEGORIES
    assert spec.title.strip()
    assert [s for s in DOC_SECTIONS if not spec.docs[s].strip()] == []
    assert set(spec.needs) <= set(SECTIONS)
    assert set(spec.requires) <= set(REQUIREMENTS) and spec.scope in SCOPES
    assert all(other in SPECS for other in spec.defers_to)
    assert spec.file.startswith("checks/") and (ROOT / spec.file).is_file()


def test_names_are_unique():
    names = [s.name for s in SPECS.values()]
    assert sorted(n for n in names if names.count(n) > 1) == []


def test_every_check_module_in_the_package_is_discovered():
    folder = ROOT / "checks"  # and its sub-packages (checks/slurm/): dotted names below gpudoctor.checks
    relative = (p.relative_to(folder).with_suffix("").parts for p in folder.rglob("*.py"))
    on_disk = {".".join(parts) for parts in relative if not any(part.startswith("_") for part in parts)}
    assert {m.removeprefix("gpudoctor.checks.") for m in builtin_modules()} == on_disk
    assert {s.module.removeprefix("gpudoctor.checks.") for s in SPECS.values()} == on_disk  # each registers a check


def _test_sources() -> str:
    return "\n".join(p.read_text(errors="replace") for p in TESTS.rglob("*.py") if p.name != Path(__file__).name)


# Checks whose tests are being written by the job-wide gathering work (issue 9 report: listed, not hidden).
def test_every_check_is_referenced_by_a_test():
    sources = _test_sources()
    untested = {cid for cid in SPECS if cid not in sources}
    assert untested == set()


def test_check_modules_import_no_sibling_check_module():
    """A check module imports no other check module; the modules of a category package (checks/slurm/) share
    only its helper module (checks/slurm/_shared.py)."""
    offenders = []
    for path in sorted((ROOT / "checks").rglob("*.py")):
        package = ".".join(("gpudoctor", *path.relative_to(ROOT).parent.parts))
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                own_helper = name.startswith(package + "._") and package != "gpudoctor.checks"
                if name.startswith("gpudoctor.checks") and not own_helper:
                    offenders.append(f"{path.relative_to(ROOT)}: imports {name}")
    assert offenders == []


def test_every_requirement_has_one_runner_wording():
    assert UNMET.keys() == REQUIREMENTS.keys()


def test_the_registry_imports_no_torch():
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from gpudoctor.registry import load_all; load_all(); print('torch' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr


# --- runner policies -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("check_id", "facts_kwargs", "ctx", "wording"),
    [
        ("GD-DL-002", {}, {"expect_gpus": 0, "config": {"num_workers": 0}}, "no GPU training expected"),
        ("GD-NCCL-001", {}, {"expect_gpus": 0}, "no GPU training expected"),
        ("GD-HW-001", {"patch": {"nvidia.available": False}}, {}, "no NVIDIA driver (see GD-DRV-001)"),
        (
            "GD-CUDA-002",
            {"patch": {"torch.status": "missing"}},
            {},
            "torch could not be imported (missing; see GD-CUDA-001)",
        ),
        (
            "GD-CUDA-006",
            {"patch": {"torch.cuda": "twelve"}},
            {},
            "torch's CUDA version 'twelve' is not a version number",
        ),
        ("GD-DL-001", {}, {"config": {"num_workers": -1}}, "num_workers=-1"),
        ("GD-DL-004", {}, {"config": {"pin_memory": True}}, "num_workers is not stated in"),
        ("GD-NCCL-003", {}, {}, "not a multi-node job (nodes: "),
    ],
)
def test_an_unmet_requirement_is_one_skip_with_one_wording(check_id, facts_kwargs, ctx, wording):
    (f,) = run_check(SPECS[check_id], make_facts(**facts_kwargs), Context(**ctx))
    assert f.severity is Severity.SKIP and f.message.startswith(wording)


def test_smoke_checks_are_listed_but_never_run_by_check():
    smoke = [s for s in SPECS.values() if s.source == "smoke"]
    ids_in_order = sorted(s.id for s in smoke)
    assert len(ids_in_order) >= 12 and ids_in_order == [f"GD-SMOKE-{n:03d}" for n in range(1, len(smoke) + 1)]
    ids = {f.id for f in run_checks(SPECS.values(), make_facts(), Context())}
    assert ids and not ids & {s.id for s in smoke}
    assert not {s.id for s in select(SPECS, ["distributed"], None)} & {s.id for s in smoke}
    for name in ("GD-SMOKE-001", "smoke"):
        with pytest.raises(RegistryError, match="judged by `gpudoctor smoke`"):
            select(SPECS, [name], None)


def test_watch_verdicts_are_listed_but_never_run_by_check():
    watch = [s for s in SPECS.values() if s.source == "watch"]
    assert sorted(s.id for s in watch) == [f"GD-WATCH-{n:03d}" for n in range(1, len(watch) + 1)]
    ids = {f.id for f in run_checks(SPECS.values(), make_facts(), Context())}
    assert ids and not ids & {s.id for s in watch}
    assert not {s.id for s in select(SPECS, ["slurm"], None)} & {s.id for s in watch}
    with pytest.raises(RegistryError, match="judged by `gpudoctor watch`"):
        select(SPECS, ["GD-WATCH-001"], None)


# --- registration mistakes, each caught at import with the file and the check --------------

GOOD = dict(
    id="GD-TMPX-001",
    name="tmp-check-problem",
    category="host",
    title="a title",
    needs='["env"]',
    what="what it checks",
    why="why it matters",
    fix="how to fix",
)


def _module(**changes) -> str:
    kw = {**GOOD, **changes}
    args = []
    for key, value in kw.items():
        if value is None:
            continue  # left out of the decorator
        args.append(f"{key}={value}" if key in ("needs", "requires", "defers_to") else f"{key}={value!r}")
    return textwrap.dedent(f"""\
        from gpudoctor.model import passed
        from gpudoctor.registry import check


        @check({", ".join(args)})
        def tmp_check(facts, ctx):
            return passed("fine")
        """)


@pytest.fixture
def checks_dir(tmp_path):
    """A folder that is part of the gpudoctor.checks package for the test, as checks/ itself is."""
    gpudoctor.checks.__path__.append(str(tmp_path))
    yield tmp_path
    gpudoctor.checks.__path__.remove(str(tmp_path))


def _import_new_check_module(folder: Path, body: str) -> tuple[str, Exception | None]:
    stem = f"tmp_{uuid.uuid4().hex[:8]}"
    (folder / f"{stem}.py").write_text(body)
    try:
        importlib.import_module(f"gpudoctor.checks.{stem}")
    except Exception as e:  # noqa: BLE001 - the test inspects it
        return stem, e
    return stem, None


MISTAKES = {
    "what left out": (dict(what=None), "missing or empty what="),
    "why empty": (dict(why="   "), "missing or empty why="),
    "fix left out": (dict(fix=None), "missing or empty fix="),
    "title empty": (dict(title=""), "missing or empty title="),
    "loose id for a built-in": (dict(id="GD-HOST-4"), "'GD-HOST-4' must look like GD-AREA-001"),
    "third-party id for a built-in": (dict(id="ACME-SCRATCH-1"), "must look like GD-AREA-001"),
    "needs a section that does not exist": (dict(needs='["hosts"]'), "needs 'hosts' is no fact section"),
    "needs a string": (dict(needs='"env"'), "needs= must be a list"),
    "needs left out": (dict(needs=None), "needs= must be a list"),
    "name not kebab-case": (dict(name="Tmp_Check"), "name 'Tmp_Check' must be kebab-case"),
    "unknown category": (dict(category="gpu"), "unknown category 'gpu'"),
    "unknown requirement": (dict(requires='["gpus"]'), "requires 'gpus' is unknown"),
    "unknown scope": (dict(scope="cluster"), "scope 'cluster' is unknown"),
    "an id already registered": (dict(id="GD-DRV-001"), "id GD-DRV-001 is already registered by checks/driver.py"),
    "a name already used": (dict(name="nvidia-driver-unusable"), "already used by GD-DRV-001"),
}


@pytest.mark.parametrize("mistake", MISTAKES.values(), ids=list(MISTAKES))
def test_a_registration_mistake_names_the_file_and_the_check(checks_dir, mistake):
    changes, words = mistake
    stem, error = _import_new_check_module(checks_dir, _module(**changes))
    assert isinstance(error, RegistryError), error
    message = str(error)
    assert f"{stem}.py:" in message and words in message
    assert (changes.get("id") or GOOD["id"]) in message
    assert "\n" not in message


def test_an_interrupt_while_a_check_module_loads_stays_an_interrupt(checks_dir):
    """SIGTERM (Terminated, a KeyboardInterrupt) landing while a dataclass is built inside a check module: Python
    3.11 wraps it in "RuntimeError: Error calling __set_name__"; the registry must re-raise the interrupt (exit
    143), not report a module that failed to load (exit 2, seen once in CI)."""
    from gpudoctor.registry import _import
    from gpudoctor.report.usage import Terminated

    stem = f"tmp_{uuid.uuid4().hex[:8]}"
    (checks_dir / f"{stem}.py").write_text(
        "from gpudoctor.report.usage import Terminated\n"
        "class Field:\n    def __set_name__(self, owner, name):\n        raise Terminated\n"
        "class Member:\n    digests = Field()\n"
    )
    with pytest.raises(Terminated):
        _import(f"gpudoctor.checks.{stem}", "check module")


def test_a_third_party_module_keeps_the_looser_id_rule(tmp_path, monkeypatch):
    stem = f"acme_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{stem}.py").write_text(_module(id="ACME-SCRATCH-1", name=f"acme-{uuid.uuid4().hex[:8]}"))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(stem)
    assert module.tmp_check.spec.id == "ACME-SCRATCH-1"
    from gpudoctor import registry

    del registry._REGISTRY["ACME-SCRATCH-1"]  # registered for this test only


@pytest.mark.parametrize("plugin_id", ["GD-HOST-4", "GD-HOST-901", "gd-acme-1"])
def test_an_installed_plug_in_may_not_use_the_reserved_gd_prefix(tmp_path, plugin_id):
    stem = f"acme_{uuid.uuid4().hex[:8]}"
    env = install_plugin(tmp_path, _module(id=plugin_id, name="acme-scratch"), module=stem)
    r = run_gpudoctor("list", env=env)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert f"module {stem}" in r.stderr and "GD- prefix is reserved" in r.stderr and plugin_id in r.stderr
    install_plugin(tmp_path, _module(id="ACME-HOST-4", name="acme-scratch"), module=stem)
    r = run_gpudoctor("list", env=env)
    assert r.returncode == 0 and "ACME-HOST-4" in r.stdout, r.stderr  # the same plug-in, its own prefix


def _cli_with_extra_checks(folder: Path, *args: str) -> subprocess.CompletedProcess:
    code = (
        "import sys, gpudoctor.checks as c; c.__path__.append(sys.argv[1]); "
        "from gpudoctor.cli import main; sys.exit(main(sys.argv[2:]))"
    )
    return subprocess.run([sys.executable, "-c", code, str(folder), *args], capture_output=True, text=True, timeout=120)


def test_a_new_check_module_is_registered_without_being_listed(tmp_path):
    (tmp_path / "newarea.py").write_text(_module())
    r = _cli_with_extra_checks(tmp_path, "list")
    assert r.returncode == 0 and "GD-TMPX-001" in r.stdout, r.stderr
    r = _cli_with_extra_checks(tmp_path, "explain", "GD-TMPX-001")
    assert r.returncode == 0 and "how to fix" in r.stdout


@pytest.mark.parametrize("command", [["list"], ["check", "--select", "host", "--json"], ["explain", "GD-DRV-001"]])
def test_the_cli_reports_a_registration_mistake_in_one_line_with_exit_2(tmp_path, command):
    (tmp_path / "badarea.py").write_text(_module(id="GD-HOST-4"))
    r = _cli_with_extra_checks(tmp_path, *command)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "badarea.py:" in r.stderr and "GD-HOST-4" in r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr


def test_defers_to_an_unknown_check_is_caught_when_the_checks_are_loaded(tmp_path):
    (tmp_path / "deferarea.py").write_text(_module(defers_to='["GD-NOPE-001"]'))
    r = _cli_with_extra_checks(tmp_path, "list")
    assert r.returncode == 2 and "deferarea.py" in r.stderr and "GD-TMPX-001" in r.stderr and "GD-NOPE-001" in r.stderr


def test_a_check_module_that_fails_to_import_is_named(tmp_path):
    (tmp_path / "brokenarea.py").write_text("import gpudoctor.no_such_module\n")
    r = _cli_with_extra_checks(tmp_path, "list")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "gpudoctor.checks.brokenarea" in r.stderr and "ModuleNotFoundError" in r.stderr
