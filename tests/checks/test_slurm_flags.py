"""GD-SLURM-041 (checks/slurm/flags.py): an option given twice on the launch line, argparse keeping the last."""

from __future__ import annotations

from gpudoctor.model import Severity
from tests.checks.test_slurm_checks import one, sb_run

HEAD = "#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:2\nX=8\n"


def test_a_launcher_option_given_twice_with_two_values_warns_naming_both():
    f = one(sb_run("GD-SLURM-041", HEAD + "srun torchrun --nproc_per_node=$X --standalone --nproc-per-node 2 t.py\n"))
    assert f.severity is Severity.WARN and len(f.message) <= 120
    assert "--nproc_per_node=$X then --nproc_per_node=2" in f.message and f.message.endswith("=2")
    assert f.location is not None and f.location.line == 6  # the launch line (under the shebang sb_run adds)


def test_the_same_value_twice_and_a_programs_option_are_notes():
    same = one(sb_run("GD-SLURM-041", HEAD + "torchrun --nnodes=1 --nnodes=1 --nproc_per_node=2 t.py\n"))
    assert same.severity is Severity.INFO
    program = one(sb_run("GD-SLURM-041", HEAD + "srun python t.py --tag a --tag b\n"))
    assert program.severity is Severity.INFO and "append" in program.evidence["unless"]


def test_each_option_once_passes_and_srun_options_are_not_the_launchers():
    ok = one(sb_run("GD-SLURM-041", HEAD + "srun -n 1 --ntasks=1 torchrun --nproc_per_node=2 t.py --lr 1\n"))
    assert ok.severity is Severity.PASS
