"""GD-SLURM-026..029: rendezvous ports on shared nodes, ranks per node against GPUs, deepspeed's hostfile,
--gpus split over nodes."""

import pytest

from gpudoctor.model import ActionKind, Safety, Severity
from tests.checks.test_slurm_checks import one, sb_run
from tests.factsutil import said

# ---------------------------------------------------------------- GD-SLURM-026


@pytest.mark.parametrize(
    ("body", "port"),
    [
        ("torchrun --rdzv_backend=c10d --rdzv_endpoint=localhost:6000 --rdzv_id=100 --nproc_per_node=4 t.py", 6000),
        ("torchrun --nproc_per_node=4 t.py", 29500),  # static, torchrun's default --master-port
        ("python -m torch.distributed.launch --nproc_per_node=4 t.py", 29500),
        ("deepspeed --num_gpus 4 t.py", 29500),
        ("torchrun --nproc_per_node=4 --master_port=12345 t.py", 12345),
        ("export MASTER_PORT=12802\nsrun python t.py", 12802),
    ],
)
def test_026_fixed_rendezvous_port_on_a_shared_node_warns(body, port):
    f = one(sb_run("GD-SLURM-026", f"#SBATCH --gres=gpu:4\n#SBATCH --ntasks-per-node=1\n{body}\n"))
    assert f.severity is Severity.WARN and f"fixed rendezvous port {port}" in f.message


@pytest.mark.parametrize(
    "body",
    [
        "torchrun --standalone --nproc_per_node=4 t.py",
        "torchrun --standalone --rdzv_endpoint=localhost:6000 --nproc_per_node=4 t.py",  # --standalone ignores them
        "export MASTER_PORT=$((10000 + SLURM_JOB_ID % 1000))\nsrun python t.py",
        "torchrun --nproc_per_node=4 --master_port=$(shuf -i 20000-30000 -n 1) t.py",
        "srun python t.py",  # the program's own choice: not known here
    ],
)
def test_026_free_or_job_derived_ports_pass(body):
    assert one(sb_run("GD-SLURM-026", f"#SBATCH --gres=gpu:4\n{body}\n")).severity is Severity.PASS


def test_026_exclusive_nodes_pass_but_exclusive_user_still_shares():
    body = "torchrun --nproc_per_node=4 t.py\n"
    assert one(sb_run("GD-SLURM-026", "#SBATCH --exclusive\n#SBATCH --gres=gpu:4\n" + body)).severity is Severity.PASS
    f = one(sb_run("GD-SLURM-026", "#SBATCH --exclusive=user\n#SBATCH --gres=gpu:4\n" + body))
    assert f.severity is Severity.WARN and "--exclusive=user" in said(f)


def test_026_fixes_fit_the_launcher():
    c10d = one(
        sb_run(
            "GD-SLURM-026",
            "#SBATCH --gres=gpu:4\ntorchrun --rdzv_backend=c10d --rdzv_endpoint=localhost:6000 --rdzv_id=1 t.py\n",
        )
    )
    assert c10d.fix.safety is Safety.SAFE and c10d.fix.actions[0].value == "localhost:0"
    assert "joins or breaks" in said(c10d)
    static = one(sb_run("GD-SLURM-026", "#SBATCH --gres=gpu:4\ntorchrun --nproc_per_node=4 t.py\n"))
    assert static.fix.safety is Safety.MANUAL and "--standalone" in static.fix.actions[0].target
    multi = one(
        sb_run(
            "GD-SLURM-026",
            "#SBATCH -N 2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:4\n"
            "srun torchrun --nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:29500 --rdzv_id=$SLURM_JOB_ID "
            "--nproc_per_node=4 t.py\n",
        )
    )
    # several nodes: they usually hold their GPUs whole; the fixed port is said, not warned
    assert multi.severity is Severity.PASS and "fixed port 29500" in said(multi)
    acc = one(sb_run("GD-SLURM-026", "#SBATCH --gres=gpu:4\naccelerate launch --main_process_port 29500 t.py\n"))
    assert acc.fix.safety is Safety.SAFE and acc.fix.actions[0].value == "0"
    exported = one(sb_run("GD-SLURM-026", "#SBATCH --gres=gpu:4\nexport MASTER_PORT=6000\nsrun python t.py\n"))
    assert exported.fix.safety is Safety.MANUAL  # an arithmetic expansion: the user writes it
    assert exported.fix.actions[0].target == "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000))"


# ---------------------------------------------------------------- GD-SLURM-027


@pytest.mark.parametrize(
    "launch",
    [
        "torchrun --standalone --nproc_per_node=4 train.py",
        "python -m torch.distributed.launch --nproc_per_node 4 train.py",
        "deepspeed --num_gpus 4 train.py",
        "accelerate launch --multi_gpu --num_processes 4 train.py",
    ],
)
def test_027_more_workers_than_gpus_fails(launch):
    f = one(sb_run("GD-SLURM-027", f"#SBATCH --gres=gpu:2\n{launch}\n"))
    assert f.severity is Severity.FAIL and "invalid device ordinal" in said(f)
    assert f.fix.safety is Safety.UNSAFE and f.fix.actions[0].value == "2"


@pytest.mark.parametrize(
    "launch",
    [
        "torchrun --standalone --nproc_per_node=gpu train.py",
        "torchrun --standalone --nproc_per_node=2 train.py",
        "torchrun --standalone --nproc_per_node=1 train.py",  # fewer: GD-SLURM-003's
        "deepspeed train.py",
    ],
)
def test_027_workers_within_the_gpus_pass(launch):
    assert one(sb_run("GD-SLURM-027", f"#SBATCH --gres=gpu:2\n{launch}\n")).severity is Severity.PASS


def test_027_a_count_from_a_variable_is_not_judged():
    f = one(sb_run("GD-SLURM-027", "#SBATCH --gres=gpu:2\ntorchrun --standalone --nproc_per_node=$NGPUS t.py\n"))
    assert f.severity is Severity.SKIP


def test_027_accelerate_counts_per_machine():
    head = "#SBATCH -N 2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:2\n"
    ok = "srun accelerate launch --num_processes 4 --num_machines 2 --machine_rank $SLURM_NODEID t.py\n"
    assert one(sb_run("GD-SLURM-027", head + ok)).severity is Severity.PASS
    bad = one(sb_run("GD-SLURM-027", head + ok.replace("--num_processes 4", "--num_processes 8")))
    assert bad.severity is Severity.FAIL and bad.fix.actions[0].value == "4"


# ---------------------------------------------------------------- GD-SLURM-028


def test_028_deepspeed_over_nodes_needs_a_hostfile():
    head = "#SBATCH -N 2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:4\n"
    stops = one(sb_run("GD-SLURM-028", head + "deepspeed --launcher slurm --num_nodes 2 --num_gpus 4 t.py\n"))
    assert stops.severity is Severity.FAIL and "Num nodes is >1" in said(stops)
    alone = one(sb_run("GD-SLURM-028", head + "deepspeed t.py\n"))
    assert alone.severity is Severity.FAIL and "other 1 node(s) stay idle" in said(alone)
    apart = one(sb_run("GD-SLURM-028", head + "srun deepspeed t.py\n"))
    assert apart.severity is Severity.FAIL and "each trains alone" in apart.message
    given = head + "deepspeed --hostfile hostfile --num_nodes 2 --num_gpus 4 t.py\n"
    assert one(sb_run("GD-SLURM-028", given)).severity is Severity.PASS
    single = "#SBATCH --gres=gpu:4\ndeepspeed --num_gpus 4 t.py\n"
    assert one(sb_run("GD-SLURM-028", single)).severity is Severity.PASS


# ---------------------------------------------------------------- GD-SLURM-029


def test_029_gpus_total_over_nodes():
    head = "#SBATCH -N {n}\n#SBATCH --gpus={g}\n#SBATCH --ntasks-per-node=1\n"
    fixed = "srun torchrun --nnodes={n} --nproc_per_node={p} t.py\n"
    never = one(sb_run("GD-SLURM-029", head.format(n=3, g=8) + fixed.format(n=3, p=3)))
    assert never.severity is Severity.FAIL and "cannot be split equally" in said(never)
    maybe = one(sb_run("GD-SLURM-029", head.format(n=2, g=8) + fixed.format(n=2, p=4)))
    assert maybe.severity is Severity.WARN and maybe.fix.safety is Safety.UNSAFE
    assert [a.kind for a in maybe.fix.actions] == [ActionKind.SBATCH_SET, ActionKind.SBATCH_REMOVE]
    follows = one(sb_run("GD-SLURM-029", head.format(n=3, g=8) + fixed.format(n=3, p="gpu")))
    assert follows.severity is Severity.INFO
    per_node = "#SBATCH -N 2\n#SBATCH --gpus-per-node=4\nsrun torchrun --nproc_per_node=4 t.py\n"
    assert one(sb_run("GD-SLURM-029", per_node)).severity is Severity.PASS
    one_node = "#SBATCH --gpus=3\ntorchrun --standalone --nproc_per_node=3 t.py\n"
    assert one(sb_run("GD-SLURM-029", one_node)).severity is Severity.PASS


@pytest.mark.parametrize("check_id", [f"GD-SLURM-{n:03d}" for n in range(25, 30)])
def test_every_new_check_skips_outside_slurm_and_without_a_script(check_id):
    from tests.factsutil import make_facts, severity

    assert severity(check_id, make_facts(patch={"slurm": {"in_job": False, "version": "22.05.8"}})) is Severity.SKIP


def test_027_inside_a_torchrun_worker_reads_local_world_size():
    from tests.factsutil import make_facts, run

    env = {
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NTASKS": "1",
        "SLURM_TASKS_PER_NODE": "1",
        "SLURM_GPUS_ON_NODE": "2",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "TORCHELASTIC_RUN_ID": "x",
        "GROUP_RANK": "0",
        "LOCAL_WORLD_SIZE": "4",
    }
    slurm = {"in_job": True, "version": "22.05.8", "job": None, "packages": {}}
    assert one(run("GD-SLURM-027", make_facts(env=env, patch={"slurm": slurm}))).severity is Severity.FAIL
    env["LOCAL_WORLD_SIZE"] = "2"
    assert one(run("GD-SLURM-027", make_facts(env=env, patch={"slurm": slurm}))).severity is Severity.PASS


def test_027_leaves_several_launchers_per_node_to_009():
    text = "#SBATCH --ntasks-per-node=4\n#SBATCH --gpus-per-task=1\nsrun torchrun --nproc_per_node=4 t.py\n"
    assert one(sb_run("GD-SLURM-027", text)).severity is Severity.SKIP
    assert one(sb_run("GD-SLURM-009", text)).severity is Severity.FAIL


def test_026_several_nodes_with_an_id_every_run_shares_is_a_note_unless_they_hold_8_gpus():
    line = "srun torchrun --nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=$HEAD:29500 --rdzv_id=7 t.py\n"
    head = "#SBATCH -N 2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:{g}\n"
    note = one(sb_run("GD-SLURM-026", head.format(g=2) + line))
    assert note.severity is Severity.INFO and "SLURM_JOB_ID" in note.fix.actions[0].target
    assert one(sb_run("GD-SLURM-026", head.format(g=8) + line)).severity is Severity.PASS
