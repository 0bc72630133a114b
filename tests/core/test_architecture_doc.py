"""docs/architecture.md is the truth about the code: its package table names what each package imports of
gpudoctor, and this test holds the table and the tree equal (an import the table does not name fails, and so
does a name in the table that no module imports any more)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.core.test_import_graph import graph

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("probe", "readers", "job", "commands", "report", "checks", "fixes", "sample_train", "watch", "diagnose")


def _unit(module: str) -> str:
    """A module's place in the table: its package, or the name of a top-level core module."""
    parts = module.split(".")
    if len(parts) == 1:
        return "gpudoctor"
    return parts[1]


def _actual() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {p: set() for p in PACKAGES}
    for module, deps in graph().items():
        unit = _unit(module)
        if unit in found:
            found[unit] |= {_unit(d) for d in deps} - {unit, "gpudoctor"}
    return found


def _documented() -> dict[str, set[str]]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows: dict[str, set[str]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3:
            continue
        name = re.match(r"`(?:gpudoctor/)?(\w+)/`", cells[0])
        if name and name.group(1) in PACKAGES:
            # the names before any parenthesis: "(only ...)" explains an entry, it names no package
            rows[name.group(1)] = set(re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", cells[2])))
    return rows


def test_the_package_table_names_every_package():
    assert set(_documented()) == set(PACKAGES)


def test_each_package_imports_what_the_table_says():
    documented, actual = _documented(), _actual()
    for package in PACKAGES:
        assert actual[package] == documented[package], (
            f"{package}: imported but not in docs/architecture.md: {sorted(actual[package] - documented[package])}; "
            f"in the table but imported no more: {sorted(documented[package] - actual[package])}"
        )


def test_no_module_cites_a_design_file_outside_the_repository():
    cited = [
        str(p.relative_to(ROOT))
        for folder in ("gpudoctor", "checks", "fixes", "sample_train", "watch", "tests")
        for p in (ROOT / folder).rglob("*.py")
        if "DESIGN.md" in p.read_text() and p.name != Path(__file__).name
    ]
    assert cited == []
