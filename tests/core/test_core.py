"""Registry, runner, plug-ins and packaging."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gpudoctor.model import Context, Severity, exit_code, passed
from gpudoctor.registry import CheckSpec, RegistryError, check, load_all, select
from gpudoctor.runner import run_check
from tests.cliutil import install_plugin, run_gpudoctor
from tests.factsutil import make_facts

ROOT = Path(__file__).resolve().parents[2]


def _spec(func, needs=("env",)):
    return CheckSpec("GD-TEST-001", "test-check", "host", "a test", tuple(needs), {}, func, __name__)


def test_a_check_that_raises_becomes_an_error_finding():
    def broken(facts, ctx):
        return facts.env["NOT_THERE"]

    (f,) = run_check(_spec(broken), make_facts(), Context())
    assert f.severity is Severity.ERROR
    assert "KeyError" in f.message and "where" in f.evidence
    assert exit_code([f]) == 1  # reported, not a crash; a check that could not run is never a pass (issue 24)


def test_a_check_returning_garbage_is_an_error_not_a_crash():
    (f,) = run_check(_spec(lambda facts, ctx: "ok"), make_facts(), Context())
    assert f.severity is Severity.ERROR


def test_missing_fact_section_skips_with_the_reason():
    facts = make_facts()
    del facts.sections["network"]
    (f,) = run_check(_spec(lambda facts, ctx: passed("fine"), needs=("network",)), facts, Context())
    assert f.severity is Severity.SKIP and "network" in f.message


@pytest.mark.parametrize("bad", [dict(id="X1"), dict(name="Not Kebab"), dict(category="gpu-stuff")])
def test_registry_rejects_malformed_specs(bad):
    kw = dict(id="GD-TEST-002", name="good-name", category="host", title="t", needs=[], what="w", why="y", fix="f")
    kw.update(bad)
    with pytest.raises(RegistryError):
        check(**kw)


def test_every_builtin_check_is_documented_and_unique():
    specs = load_all()
    assert len(specs) >= 2
    names = [s.name for s in specs.values()]
    assert len(names) == len(set(names))
    for s in specs.values():
        assert all(s.docs[k] for k in ("What it checks", "Why it matters", "How to fix")), s.id
        assert s.title and s.needs is not None


def test_select_and_ignore_by_category_id_and_name():
    specs = load_all()
    assert {s.category for s in select(specs, ["driver"], None)} == {"driver"}
    assert [s.id for s in select(specs, ["gd-drv-002"], None)] == ["GD-DRV-002"]
    assert "GD-DRV-001" not in [s.id for s in select(specs, None, ["nvidia-driver-unusable"])]
    with pytest.raises(RegistryError):
        select(specs, ["bogus"], None)


PLUGIN = """
from gpudoctor.model import warn
from gpudoctor.registry import check

@check(id="ACME-SCRATCH-001", name="acme-scratch-missing", category="host", title="ACME scratch mounted",
       needs=["env"], what="w", why="y", fix="f")
def scratch(facts, ctx):
    return warn("ACME_SCRATCH is not set", ACME_SCRATCH=None)
"""


def test_third_party_checks_load_through_the_entry_point_group(tmp_path):
    env = install_plugin(tmp_path, PLUGIN)
    r = run_gpudoctor("list", env=env)
    assert "ACME-SCRATCH-001" in r.stdout
    r = run_gpudoctor("check", "--select", "ACME-SCRATCH-001", "--json", "--strict", env=env)
    assert r.returncode == 1 and '"ACME-SCRATCH-001"' in r.stdout


def test_a_broken_plugin_stops_the_doctor_with_a_line_naming_it(tmp_path):
    # Issue 9: a plug-in whose checks silently went missing would let a CI run pass; exit 2 instead.
    env = install_plugin(tmp_path, "raise RuntimeError('plugin exploded')\n")
    for command in (["list"], ["check", "--select", "driver", "--json"]):
        r = run_gpudoctor(*command, env=env)
        assert r.returncode == 2 and r.stdout == ""
        assert r.stderr.count("\n") == 1 and "plug-in acme_checks" in r.stderr and "plugin exploded" in r.stderr


def test_wheel_exposes_only_the_gpudoctor_namespace(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = tmp_path.glob("gpudoctor-*.whl")
    tops = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()}
    assert tops == {"gpudoctor", next(t for t in tops if t.endswith(".dist-info"))}
    names = zipfile.ZipFile(wheel).namelist()
    for sub in ("checks", "fixes", "sample_train", "sample_train/judge", "probe"):
        assert f"gpudoctor/{sub}/__init__.py" in names
    assert "gpudoctor/probe/torch_child.py" in names
