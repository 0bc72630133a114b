"""readers/program.py: the launched program's process model, read with ast and never run."""

from __future__ import annotations

from gpudoctor.readers.program import MAX_PROGRAM_BYTES, launched_program, load_program, program_bases, read_program
from gpudoctor.readers.sbatch import parse_sbatch

SPAWN = """\
import torch
import torch.multiprocessing as mp

def worker(gpu, n):
    pass

if __name__ == "__main__":
    n = torch.cuda.device_count()
    mp.spawn(worker, args=(n,), nprocs=n)
"""


def test_spawn_over_the_visible_gpus_is_read_through_a_variable():
    model = read_program(SPAWN, "/x/train.py")
    assert model.kind == "spawn" and model.processes == "visible GPUs"
    assert model.where("spawn") == "train.py:9: mp.spawn(worker, args=(n,), nprocs=n)"


def test_spawn_count_from_the_device_arguments_on_the_launch_line():
    text = "from torch.multiprocessing import spawn\nspawn(f, nprocs=len(args.gpu_devices))\n"
    model = read_program(text, "t.py", argv=("--gpu_devices", "0", "1", "--lr", "1"))
    assert model.kind == "spawn" and model.processes == 2
    assert model.device_args == ("--gpu_devices 0 1",)
    assert model.evidence()["program GPU arguments"] == "--gpu_devices 0 1"
    unknown = read_program("import torch.multiprocessing as mp\nmp.spawn(f, nprocs=args.n)\n", "t.py")
    assert unknown.kind == "spawn" and unknown.processes is None


def test_rank_source_slurm_or_launcher():
    slurm = (
        "import os\nimport torch.distributed as dist\n"
        "r = int(os.environ['SLURM_PROCID'])\ndist.init_process_group('nccl')\n"
    )
    env = "import os, torch.distributed as dist\ndist.init_process_group('nccl')\nint(os.getenv('LOCAL_RANK'))\n"
    assert read_program(slurm, "a.py").rank_source == "SLURM"
    assert read_program(env, "b.py").rank_source == "launcher"
    accel = read_program("from accelerate import Accelerator\nacc = Accelerator()\n", "c.py")
    assert accel.kind == "rank_per_process" and accel.rank_source == "launcher"


def test_data_parallel_and_hf_trainer_drive_every_gpu_from_one_process():
    assert read_program("import torch\nm = torch.nn.DataParallel(net)\n", "a.py").kind == "one_process_many_gpus"
    assert read_program("from transformers import Trainer\nTrainer(model=m)\n", "b.py").kind == "one_process_many_gpus"


def test_lightning_literals_and_expressions():
    model = read_program("import lightning as L\nL.Trainer(devices=4, num_nodes=args.n)\n", "fit.py")
    assert model.kind == "lightning"
    assert model.lightning["devices"] == (4, "fit.py:2: Trainer(devices=4)")
    assert model.lightning["num_nodes"][0] is None  # an expression is not known
    star = read_program("from pytorch_lightning import Trainer\nTrainer(**cfg.trainer)\n", "h.py")
    assert "**" in star.lightning


def test_a_trainer_argument_from_argparse_takes_the_launch_line_or_its_default():
    """Issue 38: Trainer(num_nodes=args.nodes) with `--nodes=2` on the launch line is 2, not 'not known'; the
    last of an option given twice wins, as in argparse; without it, the add_argument default."""
    text = (
        "import argparse\nimport lightning as L\np = argparse.ArgumentParser()\n"
        "p.add_argument('--nodes', type=int, default=1)\np.add_argument('--num-gpus', dest='gpus', default=8)\n"
        "args = p.parse_args()\nL.Trainer(devices=args.gpus, num_nodes=args.nodes)\n"
    )
    given = read_program(text, "fit.py", argv=("--nodes=4", "--nodes", "2"))
    assert given.lightning["num_nodes"] == (2, "fit.py:7: Trainer(num_nodes=args.nodes), --nodes=2 on the launch line")
    assert given.lightning["devices"] == (8, "fit.py:7: Trainer(devices=args.gpus), argparse default 8")
    assert read_program(text, "fit.py").lightning["num_nodes"][0] == 1


def test_a_literal_dataloader_is_read_for_the_loader_checks(tmp_path):
    """Issue 38: `DataLoader(ds, num_workers=10)` in the program just read is known, not 'not known'."""
    from gpudoctor.model import Context
    from gpudoctor.readers import dlconfig

    text = "from torch.utils.data import DataLoader\nloader = DataLoader(ds, batch_size=32, num_workers=10)\n"
    model = read_program(text, "train.py")
    assert model.dataloader["num_workers"] == (10, "train.py:2: DataLoader(num_workers=10)")
    (tmp_path / "train.py").write_text(text)
    script = tmp_path / "job.slurm"
    script.write_text("#!/bin/bash\n#SBATCH --gres=gpu:1\nsrun python train.py\n")
    from gpudoctor.readers.sbatch import load_sbatch

    settings = dlconfig.from_context(Context(sbatch=load_sbatch(str(script)), sbatch_path=str(script)))
    assert settings is not None and settings.value("num_workers") == 10 and settings.source == "train.py:2"


def test_single_process_program_and_frameworks_that_decide_for_themselves():
    single = read_program("import torch\nmodel = torch.nn.Linear(2, 2).cuda()\n", "one.py")
    assert single.kind == "single" and single.known
    keras = read_program("import tensorflow as tf\nmodel = tf.keras.Sequential()\n", "k.py")
    assert not keras.known and "tensorflow" in keras.unknown


def test_unparsable_oversized_and_binary_programs_are_unknown_never_an_error():
    assert "does not parse" in read_program("def f(:\n", "bad.py").unknown
    assert "larger than" in read_program("x = 1\n" * (MAX_PROGRAM_BYTES // 6 + 1), "big.py").unknown
    assert not read_program("\x00\x01\x02", "bin.py").known
    deep = "x = " + "(" * 5000 + "1" + ")" * 5000 + "\n"
    assert not read_program(deep, "deep.py").known


def test_env_set_by_the_program_is_recorded():
    model = read_program("import os\nos.environ['CUDA_DEVICE_MAX_CONNECTIONS'] = '1'\n", "p.py")
    assert model.env_sets == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def test_local_imports_are_followed_one_level(tmp_path):
    (tmp_path / "train.py").write_text("from engine import run\nrun()\n")
    (tmp_path / "engine.py").write_text("import torch.multiprocessing as mp\ndef run():\n    mp.spawn(f, nprocs=2)\n")
    model = load_program("train.py", None, [str(tmp_path)])
    assert model.kind == "spawn" and model.processes == 2
    assert model.where("spawn").startswith("engine.py:3")


def test_module_and_missing_program(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text("import torch\n")
    assert load_program(None, "pkg.train", [str(tmp_path)]).kind == "single"
    missing = load_program("nope.py", None, [str(tmp_path)])
    assert not missing.known and "nope.py is not there" in missing.unknown
    assert "only known at run time" in load_program("$SCRIPT", None, [str(tmp_path)]).unknown


def test_program_found_from_the_scripts_cd(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(SPAWN)
    text = f"#!/bin/bash\n#SBATCH --gres=gpu:2\ncd {work}\nsrun python train.py\n"
    script = parse_sbatch(text, str(tmp_path / "job.slurm"))
    bases, how = program_bases(script, submit_dir=str(tmp_path))
    assert bases == [str(work)] and "cd" in how
    assert launched_program(script, submit_dir=str(tmp_path)).kind == "spawn"
    # `cd "$SLURM_SUBMIT_DIR"` is the directory sbatch runs in: before submission, the current one
    submit = parse_sbatch('#!/bin/bash\ncd "$SLURM_SUBMIT_DIR"\nsrun python work/train.py\n', str(tmp_path / "j.slurm"))
    assert launched_program(submit, submit_dir=str(tmp_path)).kind == "spawn"
    # a directory only known at run time: unknown, not a guess
    runtime = parse_sbatch("#!/bin/bash\ncd $WORKDIR\nsrun python train.py\n", str(tmp_path / "k.slurm"))
    assert not launched_program(runtime, submit_dir=str(tmp_path)).known


def test_credentials_in_the_program_are_never_kept():
    text = (
        "import os\nimport lightning as L\nos.environ['WANDB_API_KEY'] = 'sekrit123'\n"
        "L.Trainer(devices=2, logger=W(api_key='sekrit456'))\n"
    )
    model = read_program(text, "p.py")
    assert "WANDB_API_KEY" not in model.env_sets
    assert "sekrit" not in repr(model.facts) and "sekrit" not in model.describe()
