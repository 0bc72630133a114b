"""Reading batch scripts the way sbatch does, and `gpudoctor check --sbatch` on real script files."""

import json
from pathlib import Path

import pytest

from gpudoctor.readers.sbatch import SbatchError, load_sbatch, parse_sbatch
from tests.cliutil import run_gpudoctor_here

SCRIPTS = Path(__file__).parents[1] / "fixtures" / "sbatch"


def parse(text: str) -> dict:
    return parse_sbatch(text, "job.slurm")


def test_short_and_long_forms_with_equals_or_space():
    sb = parse(
        "#!/bin/bash\n"
        "#SBATCH -N 2\n"
        "#SBATCH -n16\n"
        "#SBATCH --ntasks-per-node 8\n"
        "#SBATCH --gres=gpu:h100:8   # eight per node\n"
        "#SBATCH -c=12 -J train\n"
        "#SBATCH --tasks-per-node=8\n"
        "srun python train.py\n"
    )
    d = sb.options
    assert d["nodes"] == "2" and d["ntasks"] == "16" and d["ntasks-per-node"] == "8"
    assert d["gres"] == "gpu:h100:8" and d["cpus-per-task"] == "12" and d["job-name"] == "train"
    assert sb.job_name == "train"
    assert sb.directive_lines["gres"] == 5


def test_directives_stop_at_first_command_as_sbatch_does():
    sb = parse(
        "#!/bin/bash\n#SBATCH --nodes=1\n\n# a comment\nmodule load cuda\n#SBATCH --gres=gpu:8\nsrun python x.py\n"
    )
    assert "gres" not in sb.options
    assert [(d.line, d.text) for d in sb.late_directives] == [(6, "#SBATCH --gres=gpu:8")]


def test_commented_out_directives_are_not_read():
    sb = parse("#!/bin/bash\n##SBATCH --gres=gpu:8\n# SBATCH --nodes=4\n#SBATCH --nodes=1\npython t.py\n")
    assert sb.options == {"nodes": "1"}


def test_later_directive_wins_and_prefix_abbreviation():
    sb = parse("#SBATCH --ntasks=4\n#SBATCH --ntasks=8\n#SBATCH --cpus-per-t=4\ntrue\n")
    assert sb.options["ntasks"] == "8"
    assert sb.options["cpus-per-task"] == "4"


def test_unknown_option_is_recorded():
    sb = parse("#SBATCH --ntask-per-nod=8\ntrue\n")
    assert sb.unknown_directives[0].options == ("--ntask-per-nod=8",)


@pytest.mark.parametrize(
    "text, message",
    [
        ("#SBATCH --ntasks-per-node=eight\n", "whole number"),
        ("#SBATCH --gres=gpu:h100:x\n", "cannot read count"),
        ("#SBATCH --nodes=two\n", "MIN-MAX"),
        ("#SBATCH --gres\n", "needs a value"),
        ('#SBATCH --job-name="unterminated\n', "cannot split"),
    ],
)
def test_values_sbatch_would_reject_raise(text, message):
    with pytest.raises(SbatchError, match=message):
        parse(text)


def test_missing_directory_and_binary_files(tmp_path):
    with pytest.raises(SbatchError, match="no such file"):
        load_sbatch(str(tmp_path / "nope.slurm"))
    with pytest.raises(SbatchError, match="directory"):
        load_sbatch(str(tmp_path))
    binary = tmp_path / "b.slurm"
    binary.write_bytes(b"\x00\x01#SBATCH")
    with pytest.raises(SbatchError):
        load_sbatch(str(binary))


@pytest.mark.parametrize(
    "line, launcher, per_node, srun",
    [
        ("srun python train.py", "python", None, True),
        ("python train.py --lr 1e-3", "python", None, False),
        ("srun --ntasks-per-node=1 torchrun --nproc_per_node=8 train.py", "torchrun", "8", True),
        ("torchrun --standalone --nproc-per-node 4 train.py", "torchrun", "4", False),
        (
            "srun python -m torch.distributed.launch --nproc_per_node=8 --use_env train.py",
            "torch.distributed.launch",
            "8",
            True,
        ),
        ("python3 -u -m torch.distributed.run --nproc-per-node=gpu train.py", "torchrun", "gpu", False),
        ("deepspeed --num_gpus 8 train.py --deepspeed ds.json", "deepspeed", "8", False),
        ("accelerate launch --num_processes 16 --num_machines 2 train.py", "accelerate", None, False),
        ("CUDA_LAUNCH_BLOCKING=0 exec srun -u --cpu-bind=cores python train.py", "python", None, True),
        ("srun uv run python train.py", "python", None, True),
        ("srun apptainer exec --nv img.sif torchrun --nproc-per-node=8 t.py", "torchrun", "8", True),
    ],
)
def test_launch_lines(line, launcher, per_node, srun):
    sb = parse(f"#!/bin/bash\n#SBATCH --nodes=1\n{line}\n")
    launch = sb.launch
    assert launch.launcher == launcher
    assert launch.nproc_per_node == per_node
    assert (launch.srun is not None) is srun


def test_accelerate_counts_and_srun_options():
    sb = parse(
        "#SBATCH -N2\nsrun -N 2 --ntasks-per-node=1 -c 32 accelerate launch --num_processes=16 --num_machines=2 t.py\n"
    )
    launch = sb.launch
    assert launch.num_processes == "16" and launch.nnodes == "2"
    assert dict(launch.srun.options) == {"nodes": "2", "ntasks-per-node": "1", "cpus-per-task": "32"}


def test_preflight_and_probes_are_not_the_training_launch():
    sb = parse(
        "#SBATCH -N1\n"
        "srun hostname\n"
        'python -c "import torch; print(torch.cuda.device_count())"\n'
        "gpudoctor check --json > pre.json || exit 1\n"
        "srun python -m gpudoctor check --select slurm\n"
        "srun python train.py\n"
        "echo done\n"
    )
    assert sb.launch.line == 6
    assert [launch.line for launch in sb.launches] == [2, 3, 4, 5, 6]
    assert sb.launches[1].inline and sb.launches[2].gpudoctor


def test_variables_and_slurm_values_are_expanded():
    sb = parse(
        "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-node=h100:8\n#SBATCH -c 64\n"
        "GPUS=8\nexport SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK\n"
        "srun torchrun --nnodes=$SLURM_NNODES --nproc-per-node=${GPUS} train.py\n"
    )
    assert sb.launch.nproc_per_node == "8"
    assert sb.launch.nnodes == "2"
    assert sb.exports["SRUN_CPUS_PER_TASK"].value == "64"


def test_lightning_arguments_on_the_launch_line():
    sb = parse("#SBATCH -N1\nsrun python main.py fit --trainer.devices 8 --trainer.num_nodes=1\n")
    assert dict(sb.launch.lightning) == {"devices": "8", "num_nodes": "1"}
    sb = parse("#SBATCH -N1\nsrun python run.py trainer.params.devices=4 +trainer.params.num_nodes=2\n")
    assert dict(sb.launch.lightning) == {"devices": "4", "num_nodes": "2"}


def test_continuation_lines_are_joined():
    sb = parse("#SBATCH -N1\nsrun \\\n  torchrun \\\n  --nproc-per-node=8 \\\n  train.py\n")
    assert sb.launch.launcher == "torchrun" and sb.launch.line == 2


def test_seed_scripts_parse():
    broken = load_sbatch(str(SCRIPTS / "seed-broken-gres1-ntasks8.slurm"))
    assert broken.options["gres"] == "gpu:h200:1" and broken.options["ntasks-per-node"] == "8"
    fixed = load_sbatch(str(SCRIPTS / "seed-fixed-ntasks1-lightning.slurm"))
    assert fixed.options["ntasks"] == "1"
    assert fixed.exports["CUDA_VISIBLE_DEVICES"].value == "0,1,2,3,4,5,6,7"
    assert fixed.launch.srun is None


# ---------------------------------------------------------------- through the CLI


def gpudoctor(*args):
    """The CLI's answer, run in this process."""
    return run_gpudoctor_here(*args)


def slurm_findings(result) -> dict:
    report = json.loads(result.stdout)
    return {f["id"]: f for f in report["findings"] if f["category"] == "slurm"}


def test_cli_seed_broken_script_fails_with_a_directive_fix():
    script = str(SCRIPTS / "seed-broken-gres1-ntasks8.slurm")
    r = gpudoctor("check", "--select", "slurm", "--json", "--sbatch", script)
    assert r.returncode == 1, r.stderr
    found = slurm_findings(r)
    shared = found["GD-SLURM-002"]
    assert shared["severity"] == "fail"
    assert "8 tasks per node" in shared["message"] and "gpu:h200:1" in shared["message"]
    assert shared["evidence"]["#SBATCH --gres"] == "gpu:h200:1"
    action = shared["fix"]["actions"][0]
    assert action == {"kind": "sbatch_set", "target": script, "key": "gres", "value": "gpu:h200:8"}
    assert shared["fix"]["safety"] == "unsafe"  # it changes the GPUs the job requests (issue 11)


def test_cli_correct_script_passes():
    r = gpudoctor("check", "--select", "slurm", "--json", "--sbatch", str(SCRIPTS / "correct-srun-ntasks8-gres8.slurm"))
    assert r.returncode == 0, r.stdout + r.stderr
    bad = {i: f["severity"] for i, f in slurm_findings(r).items() if f["severity"] in ("fail", "warn", "error")}
    assert bad == {}


def test_cli_bad_script_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.slurm"
    bad.write_text("#!/bin/bash\n#SBATCH --ntasks-per-node=eight\nsrun python t.py\n")
    r = gpudoctor("check", "--select", "slurm", "--sbatch", str(bad))
    assert r.returncode == 2
    assert "bad.slurm:2" in r.stderr and "whole number" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = gpudoctor("check", "--select", "slurm", "--sbatch", str(tmp_path / "missing.slurm"))
    assert r.returncode == 2 and "no such file" in r.stderr


# ------------------------------------------------------------- patterns from real scripts (fixtures/sbatch/realworld)


def test_srun_own_options_take_their_values():
    sb = parse(
        "#SBATCH -N1 --ntasks-per-node=1 --gres=gpu:8\n"
        "srun --wait=60 -W 30 --jobid $SLURM_JOB_ID --kill-on-bad-exit=1 torchrun --nproc_per_node 8 t.py\n"
    )
    launch = sb.launch
    assert launch.launcher == "torchrun" and launch.nproc_per_node == "8"
    assert launch.srun.options["jobid"] == "$SLURM_JOB_ID" and launch.srun.unknown == ()


def test_pyxis_container_options_belong_to_srun():
    sb = parse(
        "#SBATCH -N1\nsrun --container-image nvcr.io/nvidia/pytorch:24.05-py3 --container-mounts /data:/data "
        "--no-container-mount-home python t.py\n"
    )
    assert sb.launch.program == "python" and sb.launch.srun.unknown == ()


@pytest.mark.parametrize(
    "line, launcher, count",
    [
        ('srun bash -c "RANK=\\$SLURM_PROCID LOCAL_RANK=\\$SLURM_LOCALID python -u train.py"', "python", None),
        ("srun sh -xeuc 'cd /work && torchrun --nproc-per-node gpu main.py'", "torchrun", "gpu"),
        ('srun bash -lc "source env.sh; accelerate launch --num_processes 8 t.py"', "accelerate", "8"),
        ("srun shifter --image=nersc/pytorch:24.06 bash -c 'python train.py'", "python", None),
        ("srun bash run_wrapper.sh", None, None),
    ],
)
def test_shell_wrappers_are_looked_into(line, launcher, count):
    launch = parse(f"#SBATCH -N1\n{line}\n").launch
    assert launch.launcher == launcher
    assert (launch.nproc_per_node or launch.num_processes) == count


def test_launch_command_kept_in_variables_and_arithmetic():
    sb = parse(
        "#SBATCH --nodes=4 --ntasks-per-node=1 --gres=gpu:4\n"
        "export GPUS_PER_NODE=4\n"
        'export LAUNCHER="accelerate launch --num_processes $((SLURM_NNODES * GPUS_PER_NODE)) '
        '--num_machines $SLURM_NNODES"\n'
        'export CMD="$LAUNCHER train.py"\n'
        "srun $CMD\n"
    )
    assert sb.launch.num_processes == "16" and sb.launch.nnodes == "4"
    from gpudoctor.readers.sbatch import expand_vars

    assert (
        expand_vars("$((N * 8)) $((1/0)) $((2**99)) $((M+1))", {"N": "2", "M": "x"})
        == "16 $((1/0)) $((2**99)) $((M+1))"
    )


def test_batch_shell_is_task_zero():
    sb = parse("#SBATCH -N1 --ntasks-per-node=8\nexport RANK=$SLURM_PROCID\nsrun python t.py\n")
    assert sb.exports["RANK"].value == "0" and sb.exports["RANK"].text == "export RANK=$SLURM_PROCID"


def test_hetjob_components_and_commented_directives():
    sb = parse(
        "#SBATCH -n1 -c 32\n#SBATCH hetjob\n#SBATCH -N1 --gres=gpu:4\n##SBATCH --gres=gpu:8\n"
        "srun --het-group=1 python t.py\n"
    )
    assert sb.het_components == 2 and sb.het_group == 1
    assert sb.options == {"nodes": "1", "gres": "gpu:4"} and sb.unknown_directives == ()
    assert [(d.line, d.text) for d in sb.commented_directives] == [(4, "##SBATCH --gres=gpu:8")]


def test_single_quotes_and_backslash_leave_per_task_variables_to_each_task():
    from gpudoctor.readers.sbatch import expand_vars

    known = {"SLURM_NODEID": "0", "SLURM_PROCID": "0", "GPUS": "8"}
    assert expand_vars("srun bash -c 'x --node_rank=$SLURM_NODEID --n $GPUS' $SLURM_NODEID", known) == (
        "srun bash -c 'x --node_rank=$SLURM_NODEID --n 8' 0"
    )
    assert (
        expand_vars('CMD="--machine_rank \\$SLURM_PROCID it\'s $GPUS"', known)
        == 'CMD="--machine_rank $SLURM_PROCID it\'s 8"'
    )


def test_if_branches_that_cannot_run_for_this_job_are_skipped():
    head = "#SBATCH --nodes=2 --ntasks-per-node=1 --gres=gpu:8\n"
    sb = parse(
        head
        + 'if [ "$SLURM_NNODES" -gt 1 ]; then\n  srun torchrun --nproc_per_node=8 t.py\n'
        + "else\n  torchrun --standalone t.py\nfi\n"
    )
    assert sb.launch.srun is not None and [ln.line for ln in sb.launches] == [3]
    unknown = parse(head + 'if [ -n "$DEBUG" ]; then srun python a.py; else python b.py; fi\n')
    assert len(unknown.launches) == 2  # a condition gpudoctor cannot judge: both branches may run


def test_a_single_process_step_after_the_training_is_not_the_training():
    sb = parse(
        "#SBATCH -N1 --ntasks-per-node=8 --gres=gpu:8\nsrun python train.py\nsrun -n 1 python eval.py\npython plot.py\n"
    )
    assert sb.launch.script == "train.py"
