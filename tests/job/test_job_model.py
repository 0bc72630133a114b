"""The model of the job as it will run (gpudoctor/job/model.py): allocation, tasks, processes, worlds."""

from __future__ import annotations

from gpudoctor.job.model import Unknown, build, known, resolve_host
from gpudoctor.readers.sbatch import parse_sbatch

HEAD = "#!/bin/bash\n"


def model(body: str):
    return build(parse_sbatch(HEAD + body, "job.slurm"))


def test_two_node_torchrun_with_c10d_endpoint_is_one_world_of_16():
    m = model(
        "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:8\n"
        'srun torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint="$(scontrol show hostnames'
        ' $SLURM_JOB_NODELIST | head -n 1):29500" --rdzv-id=$SLURM_JOB_ID train.py\n'
    )
    procs = list(m.processes())
    assert len(procs) == 16 and len(m.worlds()) == 1
    assert sorted(p.rank for p in procs) == list(range(16))
    assert {p.world_size for p in procs} == {16}
    assert [p.node for p in procs] == [0] * 8 + [1] * 8
    assert procs[9].local_rank == 1 and procs[9].env["RANK"] == "9" and procs[9].env["SLURM_PROCID"] == "1"


def test_torchrun_without_nnodes_on_two_nodes_forms_two_worlds_when_standalone():
    m = model(
        "#SBATCH -N 2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:4\n"
        "srun torchrun --standalone --nproc_per_node=4 t.py\n"
    )
    worlds = m.worlds()
    assert len(worlds) == 2 and all(len(w) == 4 for w in worlds.values())


def test_loopback_rdzv_endpoint_resolves_on_each_node():
    m = model(
        "#SBATCH -N 2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:4\n"
        "srun torchrun --nnodes=2 --nproc_per_node=4 --rdzv_backend=c10d --rdzv_endpoint=localhost:29500 t.py\n"
    )
    assert {str(p.rendezvous.reaches) for p in m.processes()} == {"0", "1"}
    assert len(m.worlds()) == 2


def test_batch_shell_expands_srun_arguments_once():
    m = model("#SBATCH --ntasks=4\n#SBATCH --gres=gpu:4\nsrun python train.py --rank=$SLURM_PROCID\n")
    assert [p.rank for p in m.processes()] == [0, 0, 0, 0]
    assert [p.procid for p in m.processes()] == [0, 1, 2, 3]


def test_single_quoted_bash_c_is_expanded_per_task():
    m = model(
        "#SBATCH -N 2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:2\n"
        "srun bash -c 'torchrun --nnodes=2 --node_rank=$SLURM_NODEID --nproc_per_node=2 "
        "--master_addr=node0 --master_port=29500 t.py'\n"
    )
    assert [t.launcher.node_rank for t in m.tasks] == [0, 1]
    assert sorted(p.rank for p in m.processes()) == [0, 1, 2, 3]


def test_exported_cuda_visible_devices_split_by_bash_names_one_gpu():
    m = model("#SBATCH --gres=gpu:4\nexport CUDA_VISIBLE_DEVICES=0, 1\ntorchrun --nproc_per_node=4 t.py\n")
    procs = list(m.processes())
    assert len(procs) == 4 and procs[0].visible_gpus == ("0",)
    assert [p.gpu for p in procs] == ["0", None, None, None]


def test_wrappers_are_peeled_and_set_exec_is_read():
    m = model(
        "#SBATCH -N 16\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:8\n"
        "srun singularity run --nv img.sif bash -c 'torchrun --standalone --nproc_per_node=8 t.py'\n"
    )
    assert m.tasks[0].launcher.standalone and len(m.worlds()) == 16
    assert "singularity" in m.tasks[0].wrappers
    m = model('#SBATCH --gres=gpu:8\nset -- accelerate launch --num_processes 8 train.py\nexec "$@"\n')
    assert m.understood and m.tasks[0].launcher.kind == "accelerate"


def test_unknown_launch_is_explicit():
    m = model("#SBATCH --gres=gpu:8\n#SBATCH --ntasks=8\nsrun $CMD\n")
    assert not m.understood and m.unknown


def test_resolve_host_rules():
    assert resolve_host("localhost", 3, 0) == (3, True)
    assert resolve_host("127.0.0.2", 2, 0) == (2, True)
    assert resolve_host("$(hostname)", 3, 0) == (0, False)  # expanded by the batch shell on node 0
    assert resolve_host("$(hostname)", 3, 3) == (3, False)  # expanded by the task's own shell
    assert resolve_host("gpu17", 1, 0) == ("gpu17", False)
    assert not known(resolve_host("$ADDR", 1, 0)[0]) and isinstance(resolve_host("$ADDR", 1, 0)[0], Unknown)


def test_values_the_batch_shell_computed_stay_one_value_in_every_task():
    # slitvinov/deepseek-slurm main2.sh: the host is a backtick the batch shell ran once (its $SLURM_PROCID is
    # the batch shell's), spliced into each task's string; the script's arguments are srun's options
    m = model(
        "#SBATCH --gpus-per-node=2\n#SBATCH -N 2\n"
        "master_addr=`srun \"$@\" sh -xeuc 'if test $SLURM_PROCID -eq 0; then hostname; fi'`\n"
        "srun \"$@\" sh -xeuc 'torchrun --master-addr '$master_addr' --nnodes $SLURM_NNODES "
        "--node-rank $SLURM_NODEID --nproc-per-node gpu main.py'\n"
    )
    assert len(m.worlds()) == 1 and sorted(p.rank for p in m.processes()) == [0, 1, 2, 3]
    exported = model(
        "#SBATCH -N 2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:4\nexport MASTER_ADDR=$(hostname)\n"
        "srun bash -c 'torchrun --nnodes=2 --node_rank=$SLURM_NODEID --nproc_per_node=4 "
        "--master_addr $MASTER_ADDR t.py'\n"
    )
    assert {p.rendezvous.reaches for p in exported.processes()} == {0}  # node 0's hostname, on every node


def test_to_dict_is_json_and_says_unknown_in_words():
    import json

    m = model("#SBATCH --ntasks=2\n#SBATCH --gres=gpu:2\nsrun python train.py\n")
    data = json.loads(json.dumps(m.to_dict()))
    assert [p["procid"] for p in data["processes"]] == [0, 1]
    assert "unknown" in data["processes"][0]["rank"] and data["allocation"]["tasks_per_node"] == [2]
