"""The program's own process model in the slurm checks (issue 25, class 3) and the framework table (class 12).

Each case writes a batch script and the program it launches into tmp_path and reads them as
`gpudoctor check --sbatch` does (load_sbatch: the program is found beside the script).
"""

from __future__ import annotations

from gpudoctor.model import ActionKind, Safety, Severity
from gpudoctor.readers.sbatch import load_sbatch
from tests.factsutil import make_facts, run, said

SLURM = {"in_job": False, "version": "23.11.6", "job": None, "packages": {}}

SINGLE = "import torch\nmodel = torch.nn.Linear(4, 1).cuda()\n"
SPAWN = "import torch\nimport torch.multiprocessing as mp\nmp.spawn(f, nprocs=torch.cuda.device_count())\n"
SLURM_RANKS = (
    "import os\nimport torch.distributed as dist\n"
    "rank = int(os.environ['SLURM_PROCID'])\ndist.init_process_group('nccl', rank=rank)\n"
)
ENV_RANKS = (
    "import os\nimport torch.distributed as dist\ndist.init_process_group('nccl')\nint(os.environ['LOCAL_RANK'])\n"
)


def job(tmp_path, directives: str, launch: str, program: str | None, name: str = "train.py"):
    if program is not None:
        (tmp_path / name).write_text(program)
    path = tmp_path / "job.slurm"
    path.write_text("#!/bin/bash\n" + directives + launch + "\n")
    return load_sbatch(str(path))


def check(check_id, sb, **ctx):
    (finding,) = run(check_id, make_facts(patch={"slurm": SLURM}), sbatch=sb, sbatch_path=sb.path, **ctx)
    return finding


def kinds(finding) -> set:
    return {ActionKind(a.kind) for a in finding.fix.actions} if finding.fix else set()


ONE_TASK_TWO_GPUS = "#SBATCH --ntasks=1\n#SBATCH --gpus=2\n"


def test_003_one_task_spawning_over_the_gpus_passes(tmp_path):
    f = check("GD-SLURM-003", job(tmp_path, ONE_TASK_TWO_GPUS, "srun python train.py", SPAWN))
    assert f.severity is Severity.PASS and "one process per visible GPU" in said(f)
    assert "train.py:3" in str(f.evidence["program facts"])


def test_003_single_gpu_program_warns_and_fix_adds_no_task(tmp_path):
    f = check("GD-SLURM-003", job(tmp_path, ONE_TASK_TWO_GPUS, "srun python train.py", SINGLE))
    assert f.severity is Severity.WARN and "1 GPU(s) stay idle" in said(f)
    assert kinds(f) == {ActionKind.SBATCH_SET} and {a.key: a.value for a in f.fix.actions} == {"gpus": "1"}


def test_003_unknown_program_is_a_note_without_fix(tmp_path):
    f = check("GD-SLURM-003", job(tmp_path, ONE_TASK_TWO_GPUS, "srun python train.py", None))
    assert f.severity is Severity.INFO and f.fix is None
    assert "train.py is not there" in said(f) and "2 copies" in said(f)


def test_003_slurm_ranked_program_gets_tasks_per_gpu(tmp_path):
    sb = job(
        tmp_path,
        "#SBATCH --nodes=1\n#SBATCH --gres=gpu:4\n#SBATCH --ntasks-per-node=2\n",
        "srun python train.py",
        SLURM_RANKS,
    )
    f = check("GD-SLURM-003", sb)
    assert f.severity is Severity.WARN and f.fix.safety is Safety.UNSAFE
    assert {a.key: a.value for a in f.fix.actions} == {"ntasks-per-node": "4"}


def test_003_launcher_ranked_program_is_told_to_use_torchrun_not_srun(tmp_path):
    f = check("GD-SLURM-003", job(tmp_path, ONE_TASK_TWO_GPUS, "python train.py", ENV_RANKS))
    assert f.severity is Severity.WARN and f.fix.safety is Safety.MANUAL
    assert "torchrun --standalone --nproc-per-node=2 train.py" in str(f.fix.actions)
    assert ActionKind.SRUN_PREFIX not in kinds(f)


def test_012_four_tasks_one_gpu_single_program_runs_as_intended(tmp_path):
    sb = job(tmp_path, "#SBATCH --ntasks-per-node=4\n#SBATCH --gpus-per-node=1\n", "python train.py", SINGLE)
    f = check("GD-SLURM-012", sb)
    assert f.severity is Severity.INFO and f.fix is None  # shown without -v (issue 38), not a false alarm
    assert "runs it once" in said(f) and "srun would start 4 copies" in said(f)


def test_012_slurm_ranked_program_without_srun_warns_with_srun_fix(tmp_path):
    sb = job(tmp_path, "#SBATCH --ntasks-per-node=4\n#SBATCH --gres=gpu:4\n", "python train.py", SLURM_RANKS)
    f = check("GD-SLURM-012", sb)
    assert f.severity is Severity.WARN and ActionKind.SRUN_PREFIX in kinds(f)


def test_012_two_nodes_unknown_program_gets_no_srun_prefix(tmp_path):
    sb = job(tmp_path, "#SBATCH --nodes=2\n#SBATCH --gres=gpu:1\n", "python train.py", None)
    f = check("GD-SLURM-012", sb)
    assert f.severity is Severity.WARN and f.fix.safety is Safety.MANUAL
    assert ActionKind.SRUN_PREFIX not in kinds(f)


TWO_NODES = "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=8\n#SBATCH --gres=gpu:8\n"


def test_005_num_nodes_of_a_program_not_shown_is_unknown_not_one(tmp_path):
    f = check("GD-SLURM-005", job(tmp_path, TWO_NODES, "srun python train.py", None), launcher="lightning")
    assert f.severity is Severity.INFO and f.fix is None and "num_nodes not known" in said(f)


def test_005_trainer_without_num_nodes_on_two_nodes_fails(tmp_path):
    program = "import lightning as L\ntrainer = L.Trainer(devices=8)\n"
    f = check("GD-SLURM-005", job(tmp_path, TWO_NODES, "srun python train.py", program))
    assert f.severity is Severity.FAIL and "num_nodes=1" in said(f)  # Lightning's default: a fact, read


def test_005_trainer_literals_pass_and_make_it_a_lightning_job(tmp_path):
    program = "import lightning as L\ntrainer = L.Trainer(devices=8, num_nodes=2)\n"
    f = check("GD-SLURM-005", job(tmp_path, TWO_NODES, "srun python train.py", program))
    assert f.severity is Severity.PASS and "train.py:2: Trainer(num_nodes=2)" in said(f)


MEGATRON = (
    "#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:8\n",
    "srun torchrun --nproc-per-node=8 pretrain_gpt.py --tensor-model-parallel-size 2 --sequence-parallel",
)


def test_030_megatron_sequence_parallel_needs_max_connections(tmp_path):
    f = check("GD-SLURM-030", job(tmp_path, *MEGATRON, None))
    assert f.severity is Severity.FAIL and "CUDA_DEVICE_MAX_CONNECTIONS is not set" in said(f)
    assert f.fix.safety is Safety.SAFE and "Megatron-LM" in f.evidence["source"]


def test_030_set_by_export_prefix_or_program_passes(tmp_path):
    directives, launch = MEGATRON
    exported = job(tmp_path, directives + "export CUDA_DEVICE_MAX_CONNECTIONS=1\n", launch, None)
    assert check("GD-SLURM-030", exported).severity is Severity.PASS
    prefixed = job(tmp_path, directives, "CUDA_DEVICE_MAX_CONNECTIONS=1 " + launch, None)
    assert check("GD-SLURM-030", prefixed).severity is Severity.PASS
    own = "import os\nos.environ.setdefault('CUDA_DEVICE_MAX_CONNECTIONS', '1')\nimport megatron\n"
    assert check("GD-SLURM-030", job(tmp_path, directives, launch, own, "pretrain_gpt.py")).severity is Severity.PASS


def test_030_tensor_parallel_one_switches_sequence_parallel_off(tmp_path):
    directives, launch = MEGATRON
    tp1 = job(tmp_path, directives, launch.replace("size 2", "size 1"), None)
    assert check("GD-SLURM-030", tp1).severity is Severity.SKIP
    other = job(tmp_path, directives, "srun torchrun train.py --sequence-parallel", None)
    assert check("GD-SLURM-030", other).severity is Severity.SKIP


def test_002_srun_copies_of_a_single_program_on_one_gpu_warn_with_one_task_keeping_cpus(tmp_path):
    directives = "#SBATCH --ntasks-per-node=4\n#SBATCH --cpus-per-task=2\n#SBATCH --gres=gpu:1\n"
    f = check("GD-SLURM-002", job(tmp_path, directives, "srun python train.py", SINGLE))
    assert f.severity is Severity.WARN and "4 identical copies" in said(f)
    assert {a.key: a.value for a in f.fix.actions} == {"ntasks-per-node": "1", "cpus-per-task": "8"}
    # a program that reads which task it is (a sweep over SLURM_PROCID) shares the GPU on purpose: a note
    sweep = SINGLE + "import os\nseed = int(os.environ['SLURM_PROCID'])\n"
    assert check("GD-SLURM-002", job(tmp_path, directives, "srun python train.py", sweep)).severity is Severity.INFO
