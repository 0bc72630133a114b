"""A finding only where its cause is (issue 25, class 6): GD-SLURM-007 needs an srun step; manual fix texts name
the program the script runs, never a placeholder."""

from __future__ import annotations

import pytest

from gpudoctor.model import Severity
from gpudoctor.readers.sbatch import parse_sbatch
from tests.factsutil import make_facts, run

SLURM_2205 = {"in_job": False, "version": "22.05.8", "job": None, "packages": {}}
HEADER = "#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --cpus-per-task=8\n#SBATCH --gres=gpu:4\n"


def judge(check_id: str, body: str):
    sb = parse_sbatch(HEADER + body, "/home/user/job.slurm")
    (finding,) = run(check_id, make_facts(patch={"slurm": SLURM_2205}), sbatch=sb, sbatch_path=sb.path)
    return finding


@pytest.mark.parametrize(
    "body",
    [
        "$PY train.py\n",  # a program the script never starts through srun
        "bash run.sh\n",
        "python train.py  # srun would be better\n",  # srun only in a comment
        "torchrun --standalone --nproc_per_node=4 main.py\n",
    ],
)
def test_007_no_srun_step_no_finding(body):
    f = judge("GD-SLURM-007", body)
    assert f.severity is Severity.PASS, f.message


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("srun python train.py\n", "line 5: srun"),
        ('CMD="srun python x.py"\neval $CMD\n', "srun does not inherit"),  # srun named where the step starts
    ],
)
def test_007_an_srun_step_is_judged(body, said):
    f = judge("GD-SLURM-007", body)
    assert f.severity is Severity.WARN and said in f.message, f.message


def test_manual_rank_fix_names_the_scripts_own_program():
    f = judge(
        "GD-DIST-001",
        "#SBATCH --ntasks=4\nexport RANK=$SLURM_PROCID\nsrun python3 main.py --lr 1e-3\n",
    )
    assert f.severity is Severity.FAIL
    (command,) = (a.target for a in f.fix.actions)
    assert "python3 main.py --lr 1e-3" in command and "train.py" not in command


def test_torchrun_fix_is_the_users_own_line():
    f = judge("GD-DIST-004", "python -m torch.distributed.launch --use_env --nproc_per_node=4 main.py --bs 8\n")
    (command,) = (a.target for a in f.fix.actions)
    assert command == "torchrun --nproc_per_node=4 main.py --bs 8"
