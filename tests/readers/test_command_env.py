"""The launch command's own environment (issue 25, class 1): `NAME=value cmd`, `env NAME=value cmd`, `env -u NAME`,
`env -i` (bash(1) SIMPLE COMMAND EXPANSION; coreutils env(1)), judged as exports are, and the script's arguments
($1, "$@") unknown unless given (`gpudoctor check --sbatch F -- ARGS`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudoctor.cli import main
from gpudoctor.fixes import sbatch_edit
from gpudoctor.job.env import job_env
from gpudoctor.model import Context, Severity
from gpudoctor.readers.sbatch import parse_sbatch
from tests.factsutil import make_facts, run, said

SLURM_2205 = {"in_job": False, "version": "22.05.8", "job": None, "packages": {}}
SNAPSHOT = str(Path(__file__).parents[1] / "fixtures" / "facts" / "recorded-cpu-debian12-torch2.13-nogpu.json")
HEADER = "#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --ntasks=1\n#SBATCH --gres=gpu:2\n"


def script(body: str, arguments=None):
    return parse_sbatch(HEADER + body, "/home/u/job.slurm", arguments)


def env_of(body: str, arguments=None):
    sb = script(body, arguments)
    return job_env(make_facts(env={}), Context(sbatch=sb, sbatch_path=sb.path))


def test_prefix_assignments_are_the_launch_commands_environment_only():
    env = env_of("NCCL_DEBUG=INFO TORCH_DISTRIBUTED_DEBUG=DETAIL srun python train.py\n")
    assert env["NCCL_DEBUG"] == "INFO" and env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
    assert env.source("NCCL_DEBUG") == "job.slurm line 5 (for its command)"
    # a prefix of another command is not the training's environment, and the shell never keeps it
    sb = script("NCCL_DEBUG=INFO srun hostname\nsrun python train.py $NCCL_DEBUG\n")
    assert "NCCL_DEBUG" not in sb.exports and sb.launch.script_args == ("$NCCL_DEBUG",)


def test_env_command_sets_unsets_and_clears():
    env = env_of("export OMP_NUM_THREADS=8\nenv -u OMP_NUM_THREADS NCCL_DEBUG=WARN srun python train.py\n")
    assert "OMP_NUM_THREADS" not in env and env["NCCL_DEBUG"] == "WARN"
    assert "NCCL_DEBUG" in env_of("srun env NCCL_DEBUG=WARN python train.py\n")  # env(1) after srun's options
    cleared = env_of("export NCCL_DEBUG=INFO\nenv -i PATH=/usr/bin srun python train.py\n")
    assert "NCCL_DEBUG" not in cleared and cleared["PATH"] == "/usr/bin"


def test_credential_in_a_prefix_is_never_kept():
    sb = script("HF_TOKEN=hf_abcdef srun python train.py\n")
    assert sb.exports["HF_TOKEN"].redacted and "hf_abcdef" not in repr(sb)


def test_script_arguments_unknown_unless_given():
    sb = script('CUDA_VISIBLE_DEVICES=${1:-0} python train.py "$@"\n')
    assert sb.exports["CUDA_VISIBLE_DEVICES"].value == "${1:-0}"  # never the default: $1 may be given
    assert sb.launch.script_args == ("$@",)
    given = script('CUDA_VISIBLE_DEVICES=$1 python train.py "$@"\n', ("0,1", "--lr", "3 4"))
    assert given.exports["CUDA_VISIBLE_DEVICES"].value == "0,1"
    assert given.launch.script_args == ("0,1", "--lr", "3 4")  # "$@": each argument one word
    # an inner shell has its own positional parameters
    inner = script("srun bash -c 'python train.py $1' _ x\n", ("0",))
    assert "$1" in inner.launch.expanded


def judge(check_id: str, body: str, arguments=None):
    sb = script(body, arguments)
    (f,) = run(check_id, make_facts(patch={"slurm": SLURM_2205}), sbatch=sb, sbatch_path=sb.path)
    return f


def test_cuda_visible_devices_from_a_script_argument_says_it_is_unknown():
    f = judge("GD-SLURM-010", "CUDA_VISIBLE_DEVICES=$1 python train.py\n")
    assert f.severity is Severity.WARN
    assert "sets CUDA_VISIBLE_DEVICES=$1 for its command" in said(f)
    assert "first argument: unknown before submission" in said(f) and "-- ARGS" in said(f)
    given = judge("GD-SLURM-010", "CUDA_VISIBLE_DEVICES=$1 python train.py\n", ("0,1,2,3",))
    assert given.severity is Severity.FAIL and "(4 GPUs)" in said(given)


def test_a_prefix_rank_is_expanded_by_the_batch_shell():
    f = judge("GD-DIST-001", "#SBATCH --ntasks=4\nRANK=$SLURM_PROCID srun python main.py\n")
    assert f.severity is Severity.FAIL and "RANK" in said(f)


def test_fixes_edit_the_launch_commands_own_assignment():
    text = HEADER + "export NCCL_DEBUG=INFO\nNCCL_DEBUG=INFO CUDA_VISIBLE_DEVICES=0 srun python t.py\n"
    assert "NCCL_DEBUG=WARN CUDA_VISIBLE_DEVICES=0 srun" in sbatch_edit.set_export(text, "NCCL_DEBUG", "WARN")
    assert "\nNCCL_DEBUG=INFO srun python t.py\n" in sbatch_edit.remove_export(text, "CUDA_VISIBLE_DEVICES")


@pytest.mark.parametrize(
    ("extra", "expected"),
    [([], "$1 is the script's first argument"), (["--", "0,1"], "CUDA_VISIBLE_DEVICES=0,1 for its command")],
)
def test_cli_takes_the_scripts_arguments_after_a_double_dash(tmp_path, capsys, extra, expected):
    job = tmp_path / "job.slurm"
    job.write_text(HEADER + "CUDA_VISIBLE_DEVICES=$1 python train.py\n")
    main(["check", "--snapshot", SNAPSHOT, "--sbatch", str(job), "--select", "GD-SLURM-010", "--json", *extra])
    (finding,) = json.loads(capsys.readouterr().out)["findings"]
    assert expected in said(finding)


def test_script_arguments_without_a_script_are_a_usage_error(capsys):
    assert main(["check", "--snapshot", SNAPSHOT, "stray"]) == 2
    err = capsys.readouterr().err
    assert "need --sbatch" in err and "Traceback" not in err


def test_an_empty_script_argument_hides_every_gpu():
    f = judge("GD-SLURM-010", "CUDA_VISIBLE_DEVICES=$1 python train.py\n", ())  # `sbatch job.slurm` with no ARGS
    assert f.severity is Severity.FAIL and "names no GPU" in said(f)


def test_shift_and_set_move_the_scripts_arguments():
    body = 'module=$1\nshift\nroot=$1\nshift 1\nset -- extra "$@"\npython train.py --root $root "$@"\n'
    sb = script(body, ("m", "r", "a"))
    assert sb.launch.script_args == ("--root", "r", "extra", "a")
    unknown = script("shift\npython train.py $1\n")  # arguments not given: still unknown after shift
    assert unknown.launch.script_args == ("$1",)


def test_a_finding_about_a_prefix_variable_is_located_on_its_value(tmp_path, capsys):
    job = tmp_path / "job.slurm"
    job.write_text(HEADER + "TORCH_DISTRIBUTED_DEBUG=DETAIL srun python train.py\n")
    main(["check", "--snapshot", SNAPSHOT, "--sbatch", str(job), "--select", "GD-ALLOC-006", "--json"])
    (finding,) = json.loads(capsys.readouterr().out)["findings"]
    assert finding["severity"] == "warn"
    assert (finding["location"]["line"], finding["location"]["column"]) == (5, len("TORCH_DISTRIBUTED_DEBUG=") + 1)


def test_every_own_assignment_of_a_name_is_dropped_once():
    text = HEADER + "export NCCL_DEBUG=INFO\nNCCL_DEBUG=INFO srun env NCCL_DEBUG=TRACE python t.py\n"
    assert script(text[len(HEADER) :]).exports["NCCL_DEBUG"].value == "TRACE"  # env(1)'s, the last, wins
    out = sbatch_edit.remove_export(text, "NCCL_DEBUG")
    assert out.endswith("\nsrun env python t.py\n") and "export NCCL_DEBUG" not in out
