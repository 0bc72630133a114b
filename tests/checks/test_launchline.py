"""GD-SLURM-021: a launch line whose program expands to nothing (issue 25, class 10)."""

from __future__ import annotations

import pytest

from gpudoctor.model import Severity
from gpudoctor.readers.sbatch import parse_sbatch
from tests.factsutil import make_facts, run, said

HEADER = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:4\n"
TEMPLATE = 'LAUNCHER="torchrun --nnodes 2 --nproc_per_node 4"\nCMD="$LAUNCHER $PYTHON_FILE --lr 1"\nsrun $CMD\n'


def judge(body: str, header: str = HEADER, arguments=None):
    sb = parse_sbatch(header + body, "/home/u/job.slurm", arguments)
    (f,) = run("GD-SLURM-021", make_facts(), sbatch=sb, sbatch_path=sb.path)
    return f


def test_never_set_and_not_inherited_fails():
    f = judge(TEMPLATE, HEADER + "#SBATCH --export=NONE\n")
    assert f.severity is Severity.FAIL
    assert "$PYTHON_FILE" in said(f) and "torchrun gets no program (`--lr` takes its place)" in said(f)


@pytest.mark.parametrize(
    ("extra_header", "before", "words"),
    [
        ("", "", "unless your shell exports it"),  # --export=ALL by default
        ("#SBATCH --export=NONE,PYTHON_FILE\n", "", "unless your shell exports it"),
        ("#SBATCH --export=NONE\n", "source env.sh\n", "line 6 (source, eval, module) may"),
    ],
)
def test_maybe_inherited_or_sourced_warns(extra_header, before, words):
    f = judge(before + TEMPLATE, HEADER + extra_header)
    assert f.severity is Severity.WARN and words in said(f), f.message


@pytest.mark.parametrize(
    "body",
    [
        'if [ -n "$X" ]; then PYTHON_FILE=a.py; fi\n' + TEMPLATE,  # set in a branch: its value is known at run time
        "read PYTHON_FILE < f\n" + TEMPLATE,
        "for PYTHON_FILE in a.py; do :; done\n" + TEMPLATE,
        ': "${PYTHON_FILE:=train.py}"\n' + TEMPLATE,
        "PYTHON_FILE=train.py\n" + TEMPLATE,  # expanded: the program is train.py
        "srun torchrun --nproc_per_node 4 ${PYTHON_FILE:-train.py}\n",  # a default
        "srun python -m pkg.train\n",
    ],
)
def test_a_program_the_script_names_passes(body):
    assert judge(body).severity is Severity.PASS


def test_python_without_a_program_runs_nothing():
    f = judge("python $PYTHON_FILE\n", HEADER + "#SBATCH --export=NONE\n")
    assert f.severity is Severity.FAIL and "exits 0 having trained nothing" in said(f)


def test_a_script_argument_as_the_program_is_unknown_not_judged_empty():
    f = judge("srun python $1 --lr 1\n")
    assert f.severity is Severity.INFO and "first argument" in f.message and "unknown before submission" in said(f)
    assert judge("srun python $1 --lr 1\n", arguments=("train.py",)).severity is Severity.PASS


def test_no_script_no_launch_is_skipped():
    (f,) = run("GD-SLURM-021", make_facts())
    assert f.severity is Severity.SKIP
    assert judge("echo hi\n").severity is Severity.SKIP
