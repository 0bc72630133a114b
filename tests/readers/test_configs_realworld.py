"""Every config under tests/fixtures/configs/realworld/ against the verdicts its header declares.

Each fixture is in the shape of a real framework's config (Lightning, Hydra, HF Trainer,
DeepSpeed, accelerate, torchtune, timm, MMEngine, NeMo, Ultralytics...). Its header (YAML `#`
lines, or a sibling `<file>.expect` for JSON) says where the shape comes from, whether the
set-up is good or bad, and lines like

    # expect[8 ranks, 224 CPUs, NUM_WORKERS=40]: GD-DL-001=warn GD-DL-005=pass

A scenario is comma-separated: `N ranks` (WORLD_SIZE=N, up to 8 of them on this node),
`M CPUs` (the CPUs this process may use), `cpu only` (--expect-gpus 0, one process) and
`NAME=value` environment variables. A set-up declared GOOD may not get a warn or fail from
any dataloader check in its first scenario.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpudoctor.model import Severity
from gpudoctor.readers.trainconfig import load_config
from gpudoctor.registry import load_all
from tests.cliutil import run_gpudoctor_here
from tests.factsutil import HEALTHY_GPU, load_fixture, make_facts, run

REALWORLD = Path(__file__).parents[1] / "fixtures" / "configs" / "realworld"
CONFIGS = sorted(p for p in REALWORLD.iterdir() if p.suffix in (".yaml", ".yml", ".json"))
EXPECT = re.compile(r"^#\s*expect\[([^\]]*)\]:\s*(.+)$")
SETUP = re.compile(r"^#\s*Set-up:\s*(\w+)", re.IGNORECASE)


def header(path: Path) -> list[str]:
    source = path.with_name(path.name + ".expect") if path.suffix == ".json" else path
    return [line.strip() for line in source.read_text().splitlines() if line.startswith("#")]


def expectations(path: Path) -> list[tuple[str, dict[str, str]]]:
    out = []
    for line in header(path):
        m = EXPECT.match(line)
        if m:
            verdicts = dict(item.split("=", 1) for item in m.group(2).split())
            out.append((m.group(1), verdicts))
    return out


def setup_kind(path: Path) -> str | None:
    for line in header(path):
        m = SETUP.match(line)
        if m:
            return m.group(1).upper()
    return None


def scenario(text: str) -> tuple[dict, dict, dict]:
    """(env, facts patch, context) for 'N ranks, M CPUs, cpu only, NAME=value'."""
    env: dict[str, str] = {}
    patch: dict = {}
    ctx: dict = {}
    for part in (p.strip() for p in text.split(",")):
        if m := re.fullmatch(r"(\d+) ranks", part):
            ranks = int(m.group(1))
            env.update(WORLD_SIZE=str(ranks), LOCAL_WORLD_SIZE=str(min(ranks, 8)))
        elif m := re.fullmatch(r"(\d+) CPUs", part):
            patch["host.cpus_allowed_count"] = int(m.group(1))
        elif part == "cpu only":
            ctx["expect_gpus"] = 0
        elif m := re.fullmatch(r"(\w+)=(\S+)", part):
            env[m.group(1)] = m.group(2)
        else:
            raise AssertionError(f"unknown scenario part {part!r}")
    return env, patch, ctx


def verdicts(path: Path, scenario_text: str) -> dict:
    env, patch, ctx = scenario(scenario_text)
    facts = make_facts(HEALTHY_GPU, env=env, patch=patch)
    config = load_config(str(path))
    out = {}
    for check_id, spec in load_all().items():
        if spec.category != "dataloader":
            continue
        (finding,) = run(check_id, facts, config=config, config_path=str(path), **ctx)
        out[check_id] = finding
    return out


CASES = [(p, s, v) for p in CONFIGS for s, v in expectations(p)]


def test_every_realworld_config_declares_its_source_setup_and_verdicts():
    assert len(CONFIGS) >= 15
    for path in CONFIGS:
        lines = header(path)
        assert any(line.startswith("# Shape:") for line in lines), f"{path.name}: no '# Shape:' line"
        assert setup_kind(path), f"{path.name}: no '# Set-up:' line"
        assert expectations(path), f"{path.name}: no expect[...] line"


@pytest.mark.parametrize("path,scenario_text,expected", CASES, ids=[f"{p.name}[{s}]" for p, s, _ in CASES])
def test_declared_verdicts(path, scenario_text, expected):
    got = verdicts(path, scenario_text)
    wrong = {
        cid: f"{got[cid].severity.value}: {got[cid].message}"
        for cid, sev in expected.items()
        if got[cid].severity.value != sev
    }
    assert not wrong, f"{path.name} [{scenario_text}] expected {expected}, got {wrong}"
    for finding in got.values():
        assert finding.severity is not Severity.ERROR, finding.message
        if finding.severity in (Severity.WARN, Severity.FAIL):
            assert finding.fix is not None, f"{finding.id} warns without a fix: {finding.message}"
        if finding.severity is not Severity.SKIP:
            assert finding.message and finding.evidence, f"{finding.id} has no message or evidence"


@pytest.mark.parametrize("path", [p for p in CONFIGS if setup_kind(p) == "GOOD"], ids=lambda p: p.name)
def test_good_setups_get_no_warning_in_their_first_scenario(path):
    first, _ = expectations(path)[0]
    bad = {
        cid: f"{f.severity.value}: {f.message}"
        for cid, f in verdicts(path, first).items()
        if f.severity in (Severity.WARN, Severity.FAIL)
    }
    assert not bad, f"{path.name} is a good set-up but [{first}] gives {bad}"


# --- the same configs through the real CLI --------------------------------------------------


def test_cli_reads_every_realworld_config_without_a_fail_on_the_good_ones(tmp_path):
    data = load_fixture(HEALTHY_GPU)
    data["env"]["vars"] = {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"}
    snapshot = tmp_path / "facts.json"
    snapshot.write_text(json.dumps(data))
    # One CLI process for all configs would hide which one failed; a few are enough to prove the path.
    picked = [
        p
        for p in CONFIGS
        if p.name
        in (
            "deepspeed-hf-auto.json",
            "hydra-oc-env-no-default.yaml",
            "nemo-megatron-gpt.yaml",
            "mmengine-dump-mmdet.yaml",
            "hf-trainer-args.json",
        )
    ]
    assert len(picked) == 5
    for path in picked:
        r = run_gpudoctor_here(
            "check", "--snapshot", str(snapshot), "--config", str(path), "--select", "dataloader", "--json"
        )
        assert r.returncode == 0, f"{path.name}: {r.stdout[-2000:]}{r.stderr}"
        findings = json.loads(r.stdout)["findings"]
        assert findings and not [f for f in findings if f["severity"] in ("fail", "error")], path.name
