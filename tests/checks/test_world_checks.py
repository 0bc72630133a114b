"""The invariants over the job's model (checks/slurm/world.py): GD-SLURM-035 one world, GD-SLURM-036 unique ranks,
GD-SLURM-037 a GPU per rank, GD-SLURM-038 a launch line that is understood. Each failing case has a passing twin
that differs in the one thing the invariant judges."""

from __future__ import annotations

import pytest

from gpudoctor.model import Severity
from gpudoctor.readers.sbatch import parse_sbatch
from gpudoctor.registry import load_all
from gpudoctor.runner import run_checks
from tests.factsutil import make_facts

TWO_NODES = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:8\n"
ONE_NODE = "#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --ntasks=1\n#SBATCH --gres=gpu:4\n"
FIRST = 'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'


def verdict(check_id: str, text: str):
    """The one finding of check_id when every slurm/distributed check runs (deferrals as in `check`)."""
    specs = [s for s in load_all().values() if s.category in ("slurm", "distributed")]
    facts = make_facts(patch={"slurm": {"in_job": False, "version": "22.05.8", "job": None, "packages": {}}})
    from gpudoctor.model import Context

    sb = parse_sbatch(text, "job.slurm")
    found = [f for f in run_checks(specs, facts, Context(sbatch=sb, sbatch_path="job.slurm")) if f.id == check_id]
    assert len(found) == 1, found
    assert len(found[0].message) <= 130, found[0].message
    return found[0]


@pytest.mark.parametrize(
    "line",
    [
        "srun torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint localhost:29500 t.py\n",
        "srun bash -c 'torchrun --nnodes=2 --node_rank=$SLURM_NODEID --nproc_per_node=8 "
        "--master_addr 127.0.0.1 t.py'\n",
        "srun torchrun --standalone --nproc_per_node=8 t.py\n",
        FIRST + "srun torchrun --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:29500 t.py\n",
        "srun --ntasks-per-node=1 python main.py --dist-url tcp://127.0.0.1:23456\n",
    ],
    ids=["loopback-rdzv-endpoint", "loopback-master-addr", "standalone", "no-nnodes", "init-method-tcp-localhost"],
)
def test_035_two_nodes_that_never_meet_fail(line):
    f = verdict("GD-SLURM-035", TWO_NODES + line)
    assert f.severity is Severity.FAIL


@pytest.mark.parametrize(
    "line",
    [
        FIRST + "srun torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:29500 "
        "--rdzv_id=$SLURM_JOB_ID t.py\n",
        FIRST + "srun bash -c 'torchrun --nnodes=2 --node_rank=$SLURM_NODEID --nproc_per_node=8 "
        "--master_addr $MASTER_ADDR t.py'\n",
    ],
    ids=["c10d-first-node", "static-per-node-rank"],
)
def test_035_two_nodes_at_the_first_node_pass(line):
    assert verdict("GD-SLURM-035", TWO_NODES + line).severity is Severity.PASS


def test_035_one_node_loopback_is_fine():
    text = ONE_NODE + "torchrun --nproc_per_node=4 --rdzv_backend=c10d --rdzv_endpoint=localhost:29500 t.py\n"
    assert verdict("GD-SLURM-035", text).severity is Severity.PASS


def test_036_rank_argument_expanded_once_by_the_batch_shell_fails_and_per_task_passes():
    head = "#!/bin/bash\n#SBATCH --ntasks-per-node=4\n#SBATCH --nodes=1\n#SBATCH --gres=gpu:4\n"
    once = verdict("GD-SLURM-036", head + 'srun python train.py --rank="$SLURM_PROCID" --world_size=4\n')
    assert once.severity is Severity.FAIL and "rank 0" in once.message
    per_task = verdict("GD-SLURM-036", head + "srun bash -c 'python train.py --rank=$SLURM_PROCID --world_size=4'\n")
    assert per_task.severity is Severity.PASS


def test_036_workers_reading_slurm_procid_first_fail(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text(
        "import os\nimport torch.distributed as dist\n"
        'rank = int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", 0)))\n'
        'dist.init_process_group("nccl", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))\n'
    )
    monkeypatch.chdir(tmp_path)
    from gpudoctor.readers.program import launched_program

    text = ONE_NODE + "torchrun --standalone --nproc_per_node=4 train.py\n"
    specs = [load_all()["GD-SLURM-036"]]
    sb = parse_sbatch(text, str(tmp_path / "job.slurm"))
    from dataclasses import replace

    from gpudoctor.model import Context

    sb = replace(sb, program=launched_program(sb))
    findings = run_checks(specs, make_facts(), Context(sbatch=sb, sbatch_path=sb.path))
    assert findings[0].severity is Severity.FAIL and "SLURM_PROCID before RANK" in findings[0].message


@pytest.mark.parametrize("value", ["0", "0, 1"])
def test_037_cuda_visible_devices_narrower_than_the_workers_fails(value):
    f = verdict("GD-SLURM-037", ONE_NODE + f"export CUDA_VISIBLE_DEVICES={value}\ntorchrun --nproc_per_node=4 t.py\n")
    assert f.severity is Severity.FAIL and "1 GPU" in f.message


def test_037_workers_for_every_gpu_pass():
    assert verdict("GD-SLURM-037", ONE_NODE + "torchrun --nproc_per_node=4 t.py\n").severity is Severity.PASS


def test_038_a_launch_only_known_at_run_time_is_a_warning_and_a_known_one_passes():
    head = "#!/bin/bash\n#SBATCH --ntasks=8\n#SBATCH --nodes=1\n#SBATCH --gres=gpu:8\n"
    assert verdict("GD-SLURM-038", head + "srun $CMD\n").severity is Severity.WARN
    understood = verdict("GD-SLURM-038", head + 'set -- accelerate launch --num_processes 8 t.py\nexec "$@"\n')
    assert understood.severity is Severity.PASS


def _with_program(tmp_path, monkeypatch, program: str, body: str, check_id: str):
    from dataclasses import replace

    from gpudoctor.model import Context
    from gpudoctor.readers.program import launched_program

    (tmp_path / "train.py").write_text(program)
    monkeypatch.chdir(tmp_path)
    sb = parse_sbatch(ONE_NODE + body, str(tmp_path / "job.slurm"))
    sb = replace(sb, program=launched_program(sb))
    return run_checks([load_all()[check_id]], make_facts(), Context(sbatch=sb, sbatch_path=sb.path))[0]


PARSER = (
    "import argparse\np = argparse.ArgumentParser()\np.add_argument('--learning-rate')\np.add_argument('--epochs')\n"
    "p.add_argument('--local_rank', type=int)\nargs = p.parse_args()\n"
)


@pytest.mark.parametrize(
    ("body", "severity"),
    [
        ("python train.py --learning-rate 1e-3 --epochs 2\n", Severity.PASS),
        ("python train.py --lr 1e-3\n", Severity.FAIL),  # not a prefix of any option
        ("python train.py --learn 1e-3 --ep 2\n", Severity.PASS),  # unique prefixes (allow_abbrev)
        ("python -m torch.distributed.launch --nproc_per_node=4 train.py --epochs 2\n", Severity.FAIL),  # --local-rank
        ("python train.py --learning-rate $LR --unknown-yet=$X\n", Severity.FAIL),
    ],
    ids=["defined", "unrecognized", "prefixes", "launch-local-rank", "one-unknown"],
)
def test_039_options_against_the_programs_argparse(tmp_path, monkeypatch, body, severity):
    f = _with_program(tmp_path, monkeypatch, PARSER, body, "GD-SLURM-039")
    assert f.severity is severity, f.message


def test_039_a_parser_that_may_take_more_options_is_not_judged(tmp_path, monkeypatch):
    known_args = PARSER.replace("p.parse_args()", "p.parse_known_args()")
    f = _with_program(tmp_path, monkeypatch, known_args, "python train.py --lr 1\n", "GD-SLURM-039")
    assert f.severity is Severity.SKIP and "parse_known_args" in f.message


def test_040_parallel_sizes_must_divide_the_world():
    head = TWO_NODES + FIRST
    launch = "srun torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:29500 "
    bad = verdict(
        "GD-SLURM-040",
        head + launch + "pretrain_gpt.py --tensor-model-parallel-size 8 --pipeline-model-parallel-size 3\n",
    )
    assert bad.severity is Severity.FAIL and "world of 16" in bad.message
    good = verdict(
        "GD-SLURM-040",
        head + launch + "pretrain_gpt.py --tensor-model-parallel-size=8 --pipeline-model-parallel-size=2\n",
    )
    assert good.severity is Severity.PASS
