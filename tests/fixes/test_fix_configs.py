"""Config edits on the real-world configs: every comment line kept, the file re-parses with the library
the framework itself uses (PyYAML's safe_load / json), and only the edited key changes.
Also the order of places `fix` edits: a launch-line override wins over the config key."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from gpudoctor.cli import main
from gpudoctor.fixes.config_edit import set_key
from gpudoctor.fixes.sbatch_edit import EditError

FIXTURES = Path(__file__).parents[1] / "fixtures"
REALWORLD = sorted(p for p in (FIXTURES / "configs" / "realworld").iterdir() if p.suffix in (".yaml", ".yml", ".json"))
SNAPSHOT = str(FIXTURES / "facts" / "synthetic-slurm-batch-ntasks1-gres8.json")


def _load(path: Path, text: str):
    return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)


def _scalar_keys(node, prefix: str = ""):
    if isinstance(node, dict):
        for k, v in node.items():
            if isinstance(k, str) and "." not in k:
                yield from _scalar_keys(v, f"{prefix}{k}.")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _scalar_keys(v, f"{prefix}{i}.")
    elif prefix:
        yield prefix[:-1], node


def _new_value(old):
    if isinstance(old, bool):
        return not old
    if isinstance(old, int):
        return old + 3
    if isinstance(old, float):
        return old * 2
    return "gpudoctor-edited"


def _comment_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.lstrip().startswith("#")]


@pytest.mark.parametrize("path", REALWORLD, ids=lambda p: p.name)
def test_every_scalar_edit_keeps_comments_and_reparses(path: Path):
    text = path.read_text()
    data = _load(path, text)
    edited = refused = 0
    for key, old in list(_scalar_keys(data))[:40]:
        value = _new_value(old)
        try:
            new = set_key(text, str(path), key, value)
        except EditError:
            refused += 1  # anchors, aliases, multi-line scalars: left to the user, never half-edited
            continue
        edited += 1
        assert _comment_lines(new) == _comment_lines(text), key
        reparsed = _load(path, new)
        node = reparsed
        for part in key.split("."):
            node = node[int(part)] if isinstance(node, list) else node[part]
        assert node == value, key
        # nothing else changed: put the old value back in the parsed data and compare
        parent = reparsed
        parts = key.split(".")
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        if isinstance(parent, list):
            parent[int(parts[-1])] = old
        else:
            parent[parts[-1]] = old
        assert reparsed == data, key
        # the edit touches one line only
        changed = [a for a, b in zip(text.splitlines(), new.splitlines(), strict=False) if a != b]
        assert len(changed) == 1 and len(text.splitlines()) == len(new.splitlines()), key
    assert edited > 0
    if not any(mark in text for mark in ("&", "[", "{", "|", ">")):
        assert refused == 0  # plain block YAML / JSON objects: every scalar can be edited in place


def test_a_new_key_keeps_comments_order_and_quoting(tmp_path):
    text = "# top comment\ndataloader:\n  # workers per rank\n  num_workers: 0  # slow\n  name: 'train'\nother: \"x\"\n"
    new = set_key(text, "c.yaml", "dataloader.pin_memory", True)
    assert _comment_lines(new) == _comment_lines(text)
    assert "  name: 'train'" in new and 'other: "x"' in new and "# slow" in new
    assert yaml.safe_load(new)["dataloader"] == {"num_workers": 0, "name": "train", "pin_memory": True}


def test_an_anchored_value_is_not_edited_through_its_alias():
    text = "defaults: &d\n  num_workers: 2\ntrain:\n  <<: *d\nval: *d\n"
    with pytest.raises(EditError):
        set_key(text, "c.yaml", "val", {"num_workers": 4})


def _job(tmp_path: Path, override: str) -> Path:
    script = tmp_path / "job.slurm"
    script.write_text(
        "#!/bin/bash\n#SBATCH --job-name=mnist\n#SBATCH --nodes=1\n#SBATCH --gres=gpu:8\n#SBATCH --ntasks-per-node=8\n"
        "#SBATCH --cpus-per-task=16\nexport SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK\n"
        f"srun python src/train.py experiment=mnist \\\n    {override} \\\n    trainer.max_epochs=10\n"
    )
    return script


def test_launch_line_override_is_edited_not_the_config_it_hides(tmp_path, capsys):
    config = tmp_path / "mnist.yaml"
    shutil.copyfile(FIXTURES / "configs" / "realworld" / "lightning-hydra-template-mnist.yaml", config)
    script = _job(tmp_path, "num_workers=0")
    config_before = config.read_text()
    rc = main(
        [
            "fix",
            "--snapshot",
            SNAPSHOT,
            "--sbatch",
            str(script),
            "--config",
            str(config),
            "--launcher",
            "lightning",
            "--select",
            "dataloader,slurm",
            "--unsafe-fixes",
            "--apply",
            "--json",
        ]
    )
    rep = json.loads(capsys.readouterr().out)
    assert rc == 0
    text = script.read_text()
    assert "    num_workers=8 \\\n" in text  # the override decides the value, so the override is edited
    after = config.read_text()
    assert "num_workers: 0" in after  # the config key it hides is left alone
    assert after.replace("pin_memory: True", "pin_memory: False") == config_before  # pin_memory has no override
    assert _comment_lines(after) == _comment_lines(config_before)
    assert {f["id"] for f in rep["fixed"]} >= {"GD-DL-002"}


def test_without_an_override_the_config_key_is_edited(tmp_path, capsys):
    config = tmp_path / "mnist.yaml"
    shutil.copyfile(FIXTURES / "configs" / "realworld" / "lightning-hydra-template-mnist.yaml", config)
    script = _job(tmp_path, "seed=1")
    script_before = script.read_text()
    assert (
        main(
            [
                "fix",
                "--snapshot",
                SNAPSHOT,
                "--sbatch",
                str(script),
                "--config",
                str(config),
                "--launcher",
                "lightning",
                "--select",
                "dataloader",
                "--unsafe-fixes",
                "--apply",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert "num_workers: 8" in config.read_text()
    assert script.read_text() == script_before
    assert yaml.safe_load(config.read_text())["num_workers"] == 8
