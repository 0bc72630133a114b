"""`gpudoctor check --sbatch F --show-job`: the job as it will run, per node (gpudoctor/report/jobview.py)."""

from __future__ import annotations

from pathlib import Path

from gpudoctor.job.model import build
from gpudoctor.readers.sbatch import parse_sbatch
from gpudoctor.report.jobview import render
from tests.cliutil import run_gpudoctor_here

REALWORLD = Path(__file__).parents[1] / "fixtures" / "sbatch" / "realworld"
HEAD = "#!/bin/bash\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:8\n"


def test_a_two_node_job_names_each_nodes_processes_with_rank_gpu_and_rendezvous():
    text = render(
        build(
            parse_sbatch(
                HEAD + "#SBATCH --nodes=2\nsrun torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d "
                "--rdzv_endpoint=node01:29500 t.py\n",
                "job.slurm",
            )
        )
    )
    assert "node 0:" in text and "node 1:" in text
    assert "ranks 0..7 of 16" in text and "ranks 8..15 of 16" in text
    assert "rank 15 of 16  local 7  SLURM_PROCID 1  GPU 7" in text
    assert "node01:29500 (torchrun --rdzv-endpoint) -> node01" in text
    assert "worlds: 1" in text


def test_a_large_job_folds_nodes_alike_and_says_what_is_unknown():
    text = render(
        build(parse_sbatch(HEAD + "#SBATCH --nodes=64\nsrun torchrun --standalone --nproc_per_node=8 t.py\n", "j"))
    )
    assert "nodes 2..63: like node 1" in text and "worlds: 64" in text
    assert len(text.splitlines()) < 20
    unknown = render(build(parse_sbatch("#!/bin/bash\n#SBATCH --ntasks=4\nsrun $CMD\n", "j")))
    assert "unknown: line 3 runs $CMD, known only at run time" in unknown


def test_the_cli_prints_the_model_before_the_report():
    script = REALWORLD / "model-loopback-rdzv-endpoint-2nodes.slurm"
    r = run_gpudoctor_here("check", "--sbatch", str(script), "--show-job")
    assert r.stdout.startswith("The job as it will run")
    assert "rendezvous localhost:29500 (torchrun --rdzv-endpoint) -> node 1" in r.stdout
    assert "GD-SLURM-035" in r.stdout and r.returncode == 1
    usage = run_gpudoctor_here("check", "--show-job")
    assert usage.returncode == 2 and "--sbatch" in usage.stderr
