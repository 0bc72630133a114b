"""accelerate launch --config_file: where the file is looked for, how it is read, and the values the launch uses
(command line over config over accelerate's defaults; readers/accelerate.py)."""

from __future__ import annotations

import os

from gpudoctor.readers.accelerate import MAX_CONFIG_BYTES, accelerate_plan, config_candidates, read_config
from gpudoctor.readers.sbatch import load_sbatch, parse_sbatch

MULTI_NODE = """compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
machine_rank: 0
main_process_ip: node-a
main_process_port: 29500
num_machines: 2
num_processes: 16
"""
HEAD = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:8\n"


def _job(tmp_path, line: str, config: str | None = MULTI_NODE, name: str = "acc.yaml", head: str = HEAD):
    if config is not None:
        (tmp_path / name).write_text(config)
    script = tmp_path / "job.slurm"
    script.write_text(head + line + "\n")
    return load_sbatch(str(script))


def test_config_next_to_the_script_is_read_with_its_lines(tmp_path):
    sb = _job(tmp_path, "srun accelerate launch --config_file acc.yaml train.py")
    config = sb.launch.launcher_config
    assert config.status == "read" and config.path == str(tmp_path / "acc.yaml")
    assert config.values["num_processes"] == 16 and config.lines["num_processes"] == 7


def test_command_line_wins_over_the_config_and_the_config_over_the_defaults(tmp_path):
    sb = _job(tmp_path, "srun accelerate launch --config_file acc.yaml --num_processes 8 --machine_rank 1 train.py")
    plan = accelerate_plan(sb.launch)
    assert (plan.num_processes.value, plan.num_processes.source) == ("8", "launch line")
    assert (plan.num_machines.value, plan.num_machines.source) == (2, "acc.yaml:6")
    assert plan.machine_rank.value == "1" and plan.mode.value == "multi_gpu"
    assert plan.procs_per_machine == 4  # 8 over 2 machines
    assert plan.gpu_ids.source == "accelerate's default"


def test_a_cd_before_the_launch_is_where_the_relative_path_is_opened(tmp_path):
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "acc.yaml").write_text(MULTI_NODE)
    sb = _job(tmp_path, f"cd {tmp_path}\ncd cfg\nsrun accelerate launch --config_file acc.yaml train.py", config=None)
    assert sb.launch.cwd == str(tmp_path / "cfg")
    assert sb.launch.launcher_config.status == "read"


def test_a_cd_inside_srun_bash_c_counts_too(tmp_path):
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "acc.yaml").write_text(MULTI_NODE)
    body = f"srun bash -c 'cd {tmp_path}/cfg && accelerate launch --config_file acc.yaml train.py'"
    sb = _job(tmp_path, body, config=None)
    assert sb.launch.cwd == f"{tmp_path}/cfg" and sb.launch.launcher_config.status == "read"


def test_distributed_type_no_is_one_process_whatever_num_processes_says(tmp_path):
    sb = _job(tmp_path, "accelerate launch --config_file acc.yaml train.py", "distributed_type: 'NO'\n")
    plan = accelerate_plan(sb.launch)
    assert plan.mode.value == "single" and plan.procs_per_machine == 1 and plan.num_processes.value == 1


def test_a_config_without_num_processes_stops_accelerate(tmp_path):
    sb = _job(tmp_path, "srun accelerate launch --config_file acc.yaml train.py", "distributed_type: MULTI_GPU\n")
    plan = accelerate_plan(sb.launch)
    assert plan.stops and "--num_processes" in plan.stops[0] and plan.procs_per_machine is None


def test_json_config_is_read_as_json(tmp_path):
    sb = _job(
        tmp_path,
        "srun accelerate launch --config_file acc.json train.py",
        '{"distributed_type": "MULTI_GPU", "num_processes": 8, "num_machines": 1}',
        name="acc.json",
    )
    assert accelerate_plan(sb.launch).procs_per_machine == 8


def test_broken_yaml_is_one_line_not_a_crash(tmp_path):
    sb = _job(tmp_path, "srun accelerate launch --config_file acc.yaml train.py", "num_processes: [8\n")
    config = sb.launch.launcher_config
    assert config.status == "unreadable" and "broken YAML at line 2" in config.problem
    assert "\n" not in config.problem
    assert accelerate_plan(sb.launch).procs_per_machine is None  # unknown, not guessed


def test_a_huge_or_special_file_is_refused_bounded(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("a: 1\n" * (MAX_CONFIG_BYTES // 4))
    assert read_config("big.yaml", [str(big)]).status == "unreadable"
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    assert read_config("fifo.yaml", [str(fifo)]).status == "unreadable"  # a FIFO would block a plain open()


def test_missing_and_unresolved_paths(tmp_path):
    sb = _job(tmp_path, "srun accelerate launch --config_file nope.yaml train.py", config=None)
    assert sb.launch.launcher_config.status == "missing"
    sb = _job(tmp_path, "srun accelerate launch --config_file configs/$ACCEL.yaml train.py", config=None)
    assert sb.launch.launcher_config.status == "unresolved"
    assert config_candidates("a.yaml", "/x/job.slurm", "?", None) is None  # after `cd "$(dirname $0)"`


def test_relative_path_tries_the_script_directory_and_the_current_directory():
    found = config_candidates("acc.yaml", "/repo/slurm/job.slurm", None, None)
    assert found[0] == "/repo/slurm/acc.yaml" and found[-1] == os.path.join(os.getcwd(), "acc.yaml")
    assert config_candidates("acc.yaml", "/repo/job.slurm", None, "/work/run") == ["/work/run/acc.yaml"]


def test_parse_only_reads_no_file():
    sb = parse_sbatch(HEAD + "srun accelerate launch --config_file acc.yaml train.py\n", "job.slurm")
    assert sb.launch.launcher_config is None and sb.launch.config_file == "acc.yaml"


def test_a_sagemaker_config_is_not_judged_as_a_local_launch(tmp_path):
    config = "compute_environment: AMAZON_SAGEMAKER\ndistributed_type: DATA_PARALLEL\nnum_processes: 8\n"
    plan = accelerate_plan(_job(tmp_path, "accelerate launch --config_file acc.yaml t.py", config).launch)
    assert plan.mode.value is None and plan.stops == () and plan.procs_per_machine is None
