"""Category = folder: every built-in check id lives under its area's folder (or module) of checks/, so a reader
finds a check where its id says, and `gpudoctor list --next AREA` says the next free id of an area."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from gpudoctor.registry import load_all

# GD-<AREA>: the package (checks/<folder>/) or module (checks/<module>.py) that holds the area's checks.
AREA_HOME = {
    "ALLOC": "allocator",
    "CUDA": "cuda",
    "DEV": "devices",
    "DIAG": "diagnose",
    "DIST": "distributed",
    "DL": "dataloader",
    "DRV": "driver",
    "HOST": "host",
    "HW": "hardware",
    "JOB": "job",
    "NCCL": "nccl",
    "PREC": "precision",
    "SLURM": "slurm",
    "SMOKE": "smoke",
    "WATCH": "watch",
}


def test_every_builtin_check_is_under_its_areas_folder():
    misplaced = []
    for spec in load_all().values():
        if not spec.id.startswith("GD-"):
            continue
        area = spec.id.split("-")[1]
        assert area in AREA_HOME, f"{spec.id}: area {area} has no home in checks/ (add it to AREA_HOME)"
        home = f"gpudoctor.checks.{AREA_HOME[area]}"
        if not (spec.module == home or spec.module.startswith(home + ".")):
            misplaced.append(f"{spec.id} in {spec.module} (belongs under {home})")
    assert misplaced == []


def _list(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudoctor", "list", *args], capture_output=True, text=True)


def test_list_says_the_next_free_id_of_an_area():
    taken = [s.id for s in load_all().values() if s.id.startswith("GD-SLURM-")]
    highest = max(int(i.rsplit("-", 1)[1]) for i in taken)
    r = _list("--next", "slurm")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"GD-SLURM-{highest + 1:03d}"
    assert json.loads(_list("--next", "DIAG", "--json").stdout)["next"].startswith("GD-DIAG-")


def test_list_next_of_an_unknown_area_is_one_line_and_exit_2():
    r = _list("--next", "NOPE\x1b[31m")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "\x1b" not in r.stderr and re.match(r"gpudoctor( list)?: ", r.stderr)
