"""Rules found on hand-judged public scripts. GD-SLURM-042: a training launch ended by `&` with no `wait` after it,
read as bash reads the control operator (`&` ends a command, `&&`, `&>` and `>&` do not), and proved on the real
test SLURM (a batch script that starts its step with `&` and ends is a finished job, its step killed). GD-SLURM-003
and 010: where a cluster may give a node's GPUs without a request, no GPU request is said, not failed."""

from __future__ import annotations

import time

import pytest

from gpudoctor.model import Severity
from tests.checks.test_slurm_checks import one, sb_run

HEAD = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:4\n"


@pytest.mark.parametrize(
    ("body", "severity"),
    [
        ("srun torchrun --nnodes=2 --nproc_per_node=4 t.py &\n", Severity.FAIL),
        ("srun torchrun --nnodes=2 --nproc_per_node=4 t.py &\nwait\n", Severity.PASS),
        ("srun torchrun --nnodes=2 --nproc_per_node=4 t.py & # go\necho started\n", Severity.FAIL),
        ("srun torchrun --nnodes=2 --nproc_per_node=4 t.py && echo done\n", Severity.PASS),
        ("srun torchrun --nnodes=2 --nproc_per_node=4 t.py &> train.log\n", Severity.PASS),
        ("srun torchrun --nnodes=2 --nproc_per_node=4 t.py > train.log 2>&1\n", Severity.PASS),
        ("srun bash -c 'torchrun --nnodes=2 --nproc_per_node=4 t.py &'\n", Severity.PASS),  # the task's shell's `&`
        # a foreground launch after it keeps the script running while it runs (tensorboard before the training)
        ("python -m tensorboard.main --logdir runs &\nsrun python t.py\n", Severity.PASS),
        ("for i in 0 1; do\n  srun --nodes=1 --relative=$i python t.py &\ndone\nwait\n", Severity.PASS),
    ],
)
def test_a_launch_left_in_the_background(body, severity):
    f = one(sb_run("GD-SLURM-042", HEAD + body))
    assert f.severity is severity, (f.message, f.evidence)
    if severity is not Severity.PASS:
        assert "nothing waits" in f.message and len(f.message) <= 120
        assert f.fix is not None and "wait" in " ".join(a.target or "" for a in f.fix.actions)


@pytest.mark.slurm
def test_sbatch_ends_the_job_with_its_script_and_kills_the_step_left_in_the_background(slurm_cluster, tmp_path):
    """The rule's premise, on the real SLURM: the step started with `&` is still sleeping when the script ends; the
    job ends with the script and the step is killed before its `touch`."""
    marker = tmp_path / "done"
    script = tmp_path / "bg.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH --ntasks=1\nsrun bash -c 'sleep 60; touch {marker}' &\necho started\n")
    r = slurm_cluster.sbatch_wait(script, timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)
    time.sleep(1)
    # had the job waited for its step, the step would have slept its 60 s and written the marker
    assert not marker.exists(), "the job waited for the step it started in the background"


# ---- GPUs a cluster may give unasked (found on public TACC and JSC scripts): said, not failed


@pytest.mark.parametrize(
    ("directives", "severity"),
    [
        ("#SBATCH -p gpu-a100-dev\n#SBATCH -N 1\n", Severity.WARN),  # a GPU partition: whole nodes at some sites
        ("#SBATCH -p normal\n#SBATCH -N 1\n", Severity.FAIL),  # nothing says the GPUs come unasked
        ("#SBATCH --exclusive\n#SBATCH -N 1\n", Severity.WARN),
    ],
)
def test_no_gpu_request_is_failed_only_where_nothing_may_give_the_gpus(directives, severity):
    f = one(sb_run("GD-SLURM-003", "#!/bin/bash\n" + directives + "srun python t.py\n"))
    assert f.severity is severity, f.message


def test_an_export_of_eight_gpus_is_no_fail_when_the_node_may_come_with_them():
    text = "#!/bin/bash\n#SBATCH --exclusive\n#SBATCH -N 1\n"
    text += "export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7\nsrun python t.py\n"
    assert one(sb_run("GD-SLURM-010", text)).severity is not Severity.FAIL
    plain = text.replace("#SBATCH --exclusive\n", "")
    assert one(sb_run("GD-SLURM-010", plain)).severity is Severity.FAIL  # 0 GPUs asked, 8 named


@pytest.mark.slurm
def test_the_variables_sbatch_sets_from_the_directives_are_the_ones_read(slurm_cluster, tmp_path):
    """implied_slurm_env against the real sbatch: what the batch shell gets from the per-GPU directives (a
    `--cpus-per-task=$SLURM_CPUS_PER_GPU` line then reads as a number, not an unknown)."""
    from gpudoctor.readers.sbatch.header import implied_slurm_env

    directives = {"gpus-per-node": "2", "cpus-per-gpu": "1", "ntasks-per-gpu": "1"}
    out = tmp_path / "env.txt"
    script = tmp_path / "j.sbatch"
    lines = "".join(f"#SBATCH --{k}={v}\n" for k, v in directives.items())
    script.write_text(f"#!/bin/bash\n{lines}#SBATCH --output={out}\nenv\n")
    r = slurm_cluster.sbatch_wait(script, timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)
    real = dict(line.split("=", 1) for line in out.read_text().splitlines() if line.startswith("SLURM_"))
    implied = implied_slurm_env(directives, "j.sbatch")
    for name in ("SLURM_CPUS_PER_GPU", "SLURM_NTASKS_PER_GPU", "SLURM_GPUS_PER_NODE"):
        assert implied[name] == real[name], (name, implied.get(name), real.get(name))


def test_an_accelerate_config_read_inside_a_container_is_not_called_missing(tmp_path):
    """The path is the container's (`apptainer run --bind $CFG:/mnt/config.yaml IMG accelerate launch
    --config_file /mnt/config.yaml`): not there on this machine says nothing about the container."""
    text = (
        "#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --gres=gpu:4\n#SBATCH --ntasks-per-node=1\n"
        "srun apptainer run --bind $HOME/cfg.yaml:/mnt/gd-no-such/config.yaml img.sif "
        "accelerate launch --config_file /mnt/gd-no-such/config.yaml train.py\n"
    )
    from gpudoctor.readers.sbatch import load_sbatch

    job = tmp_path / "job.slurm"
    job.write_text(text)
    f = one(sb_run("GD-SLURM-033", load_sbatch(str(job))))
    assert f.severity is Severity.INFO and "container" in f.message, f.message
    job.write_text(text.replace("apptainer run --bind $HOME/cfg.yaml:/mnt/gd-no-such/config.yaml img.sif ", ""))
    assert one(sb_run("GD-SLURM-033", load_sbatch(str(job)))).severity is Severity.WARN


def test_a_step_of_one_task_on_a_larger_job_is_no_node_count_problem():
    """`srun -n 1 torchrun ...` once per node in a loop: srun lowers the step's nodes (SLURM_NNODES) to its one task,
    as the loop means; only both counts in the directives make the job other than the script says."""
    job = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --gres=gpu:2\n"
    loop = "for i in 0 1; do\n  srun -n 1 torchrun --nnodes=2 --node-rank=$i --nproc-per-node=2 t.py &\ndone\nwait\n"
    assert one(sb_run("GD-SLURM-001", job + loop)).severity is not Severity.WARN
    both = job.replace("--nodes=2\n", "--nodes=2\n#SBATCH --ntasks=1\n") + "srun torchrun --nproc-per-node=2 t.py\n"
    f = one(sb_run("GD-SLURM-001", both))
    assert f.severity is Severity.WARN and "allocates 1 node(s), not 2" in f.message
