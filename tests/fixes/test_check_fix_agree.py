"""check and fix read the same job (issue 25, class 7): a launch-line override of the training config is read
once (gpudoctor/readers/overrides.py) and both judge the config it makes.

Each case runs `check --json` and `fix --json` on the same script and config (recorded facts, no probing) and
asserts the verdict an expert gives and that fix's "fixed + remaining" are exactly check's warns/fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudoctor.cli import main
from gpudoctor.readers.overrides import read_overrides

SNAPSHOT = str(Path(__file__).parents[1] / "fixtures" / "facts" / "recorded-cpu-debian12-torch2.13-nogpu.json")
HEADER = (
    "#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=1\n#SBATCH --cpus-per-task=4\n#SBATCH --gres=gpu:1\n"
)
CONFIG = "data:\n  num_workers: 32\n  batch_size: 16\n"


def _run(capsys, command: str, script: Path, config: Path) -> dict:
    argv = [command, "--snapshot", SNAPSHOT, "--sbatch", str(script), "--config", str(config), "--json"]
    main([*argv, "--select", "GD-DL-001", *(["--unsafe-fixes"] if command == "fix" else [])])
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("args", "config", "workers_warned"),
    [
        ("data.num_workers=2", CONFIG, False),  # Hydra: the job runs 2 workers (the false alarm of issue 25)
        ("data.num_workers=32", "data:\n  num_workers: 2\n", True),  # the override, not the file, decides
        ("++data.num_workers=2", CONFIG, False),  # force: add or change
        ("+data.num_workers=32", "data:\n  batch_size: 16\n", True),  # add a key the file lacks
        ("~data.num_workers", CONFIG, False),  # deleted: not stated, nothing to judge
        ("--data.num_workers=2", CONFIG, False),  # jsonargparse (LightningCLI) dotted option
        ("--data.num_workers 32", "data:\n  class_path: D\n  init_args:\n    num_workers: 2\n", True),
        ("--num_workers 2", CONFIG, False),  # the program's own option: unknown, not judged at 32
        ("--num-workers=2", CONFIG, False),
        ("data.num_workers=$NW", CONFIG, False),  # a shell variable the script does not set: unknown
        ("seed=1", CONFIG, True),  # an override of another key leaves the file's 32
        ("data=cifar", CONFIG, False),  # a Hydra config-group choice: data.* come from data/cifar.yaml, unknown here
    ],
)
def test_check_and_fix_agree_on_launch_line_overrides(tmp_path, capsys, args, config, workers_warned):
    script, cfg = tmp_path / "job.slurm", tmp_path / "cfg.yaml"
    script.write_text(HEADER + f"srun python train.py {args}\n")
    cfg.write_text(config)
    checked = _run(capsys, "check", script, cfg)
    finding = next(f for f in checked["findings"] if f["id"] == "GD-DL-001")
    bad = finding["severity"] in ("warn", "fail")
    assert bad is workers_warned, finding["message"]
    planned = _run(capsys, "fix", script, cfg)
    assert {f["id"] for f in planned["fixed"] + planned["remaining"]} == ({"GD-DL-001"} if bad else set())
    if bad and "=" in args and not args.startswith("seed"):
        assert finding["location"]["file"] == str(script)  # the override's line holds the value judged
        assert [f["path"] for f in planned["files"]] == [str(script)]  # the override is edited, not the file


def test_a_program_option_is_recorded_but_never_mapped_to_a_key():
    read = read_overrides(["--num-workers", "2", "data.batch_size=8", "--fast", "model.lr=1e-3", "~x"], line=7)
    assert [(o.key, o.op, o.raw) for o in read.overrides] == [
        ("data.batch_size", "set", "8"),
        ("model.lr", "set", "1e-3"),
        ("x", "delete", None),
    ]
    assert [f.written for f in read.flags] == ["--num-workers 2", "--fast"]
    assert read.opaque("loader.num_workers") is not None and read.opaque("data.batch_size") is None
    config = {"data": {"batch_size": 4}, "model": {"lr": 0.1}, "x": 1}
    assert read.apply(config) == {"data": {"batch_size": 8}, "model": {"lr": 1e-3}}
    assert config["x"] == 1  # the input is not changed
