"""The job model against reality (issue 37): real batch scripts run on the test SLURM (tests/slurmcluster.py),
their commands started by the real sbatch, bash, srun and torchrun; a stand-in program records, in every process,
its argv, the variables that make its rank, its visible GPUs and (under torchrun, with gloo) the rank
init_process_group gave it. The model built from the same script text must predict them process by process."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from gpudoctor.job.model import JobModel, build
from gpudoctor.readers.cudavis import parse_visible_devices
from gpudoctor.readers.sbatch import load_sbatch

pytestmark = pytest.mark.slurm

RECORD = r"""
import json, os, socket, sys
VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID",
        "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS", "CUDA_VISIBLE_DEVICES")
out = {"argv": sys.argv[1:], "env": {k: os.environ[k] for k in VARS if k in os.environ}, "host": socket.gethostname()}
if os.environ.get("TORCHELASTIC_RUN_ID"):
    import torch.distributed as dist
    dist.init_process_group("gloo")
    out["dist_rank"], out["dist_world"] = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    dist.destroy_process_group()
name = f"{os.environ.get('SLURM_PROCID', 'x')}-{os.environ.get('LOCAL_RANK', 'x')}-{os.getpid()}.json"
with open(os.path.join(os.environ["RECORD_DIR"], name), "w") as f:
    json.dump(out, f)
"""

PY = sys.executable
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
HEAD = "#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --time=5\n#SBATCH --output=job.out\n"


def _run(cluster, tmp_path: Path, monkeypatch, body: str) -> tuple[JobModel, list[dict]]:
    records = tmp_path / "records"
    records.mkdir()
    (tmp_path / "record.py").write_text(RECORD)
    script = tmp_path / "job.slurm"
    script.write_text(HEAD + body)
    monkeypatch.chdir(tmp_path)  # the program is looked up where sbatch runs, as the job does
    model = build(load_sbatch(str(script)), {"RECORD_DIR": str(records)})
    r = cluster.sbatch_wait(script, env={"RECORD_DIR": str(records)}, cwd=tmp_path, timeout=240)
    log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert r.returncode == 0, (r.stdout, r.stderr, log)
    seen = [json.loads(p.read_text()) for p in sorted(records.glob("*.json"))]
    return model, seen


def _key(env: dict) -> tuple:
    return (int(env.get("SLURM_PROCID", 0)), int(env.get("LOCAL_RANK", -1)))


def _compare(model: JobModel, seen: list[dict], names: tuple[str, ...]) -> None:
    """Every predicted process is one seen, and back: argv, the variables named, the visible GPUs."""
    predicted = sorted(model.processes(), key=lambda p: (p.procid, p.local_rank if p.launcher != "python" else -1))
    seen = sorted(seen, key=lambda s: _key(s["env"]))
    assert len(predicted) == len(seen), (len(predicted), seen)
    for p, s in zip(predicted, seen, strict=True):
        assert (
            list(p.argv[2:] if p.argv[:1] != ("bash",) else p.argv) == s["argv"]
            or list(p.argv[-len(s["argv"]) :]) == s["argv"]
        ), (p.argv, s["argv"])
        for name in names:
            assert p.env.get(name) == s["env"].get(name), (name, p.env.get(name), s["env"])
        if "CUDA_VISIBLE_DEVICES" in s["env"]:
            real = parse_visible_devices(s["env"]["CUDA_VISIBLE_DEVICES"])
            assert p.visible_gpus == tuple(str(e.gpu) for e in real.accepted), (p.visible_gpus, s["env"])
        if "dist_rank" in s:
            assert (p.rank, p.world_size) == (s["dist_rank"], s["dist_world"])


def test_srun_argument_expanded_once_by_the_batch_shell(slurm_cluster, tmp_path, monkeypatch):
    model, seen = _run(
        slurm_cluster,
        tmp_path,
        monkeypatch,
        f"#SBATCH --ntasks=3\n#SBATCH --gres=gpu:2\nsrun {PY} record.py --rank=$SLURM_PROCID --tag x\n",
    )
    assert [s["argv"] for s in seen] == [["--rank=0", "--tag", "x"]] * 3  # what the model says: 0 for all
    _compare(model, seen, ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS", "CUDA_VISIBLE_DEVICES"))


def test_single_quoted_bash_c_expanded_per_task(slurm_cluster, tmp_path, monkeypatch):
    model, seen = _run(
        slurm_cluster,
        tmp_path,
        monkeypatch,
        f"#SBATCH --ntasks=3\n#SBATCH --gres=gpu:2\nsrun bash -c '{PY} record.py --rank=$SLURM_PROCID'\n",
    )
    assert sorted(s["argv"][0] for s in seen) == ["--rank=0", "--rank=1", "--rank=2"]
    assert sorted(t.argv[-1] for t in model.tasks) == ["--rank=0", "--rank=1", "--rank=2"]
    _compare(model, seen, ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"))


def test_exported_cuda_visible_devices_in_the_batch_shell_and_in_srun_tasks(slurm_cluster, tmp_path, monkeypatch):
    # bash splits `0, 1` into `CUDA_VISIBLE_DEVICES=0,` and `export 1` (which fails and is ignored)
    model, seen = _run(
        slurm_cluster,
        tmp_path,
        monkeypatch,
        f"#SBATCH --ntasks=1\n#SBATCH --gres=gpu:2\nexport CUDA_VISIBLE_DEVICES=0, 1\n{PY} record.py\n",
    )
    assert seen[0]["env"]["CUDA_VISIBLE_DEVICES"] == "0,"
    _compare(model, seen, ("CUDA_VISIBLE_DEVICES", "SLURM_PROCID"))


@pytest.mark.world
@pytest.mark.skipif(not shutil.which(TORCHRUN), reason="no torchrun next to this interpreter")
def test_torchrun_in_the_batch_shell_with_gloo(slurm_cluster, tmp_path, monkeypatch):
    model, seen = _run(
        slurm_cluster,
        tmp_path,
        monkeypatch,
        f"#SBATCH --ntasks=1\n#SBATCH --cpus-per-task=2\nset -- {TORCHRUN} --standalone --nproc_per_node=2 record.py"
        ' --lr 1e-3\nexec "$@"\n',
    )
    _compare(model, seen, ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_PROCID"))


def test_srun_steps_get_slurms_cuda_visible_devices_over_the_scripts_export(slurm_cluster, tmp_path, monkeypatch):
    # the gres/gpu plugin sets CUDA_VISIBLE_DEVICES in every step that has GPUs: the batch shell's export is replaced
    model, seen = _run(
        slurm_cluster,
        tmp_path,
        monkeypatch,
        f"#SBATCH --ntasks=2\n#SBATCH --gres=gpu:2\nexport CUDA_VISIBLE_DEVICES=1\nsrun {PY} record.py\n",
    )
    assert {s["env"].get("CUDA_VISIBLE_DEVICES") for s in seen} == {"0,1"}, seen
    assert [p.visible_gpus for p in model.processes()] == [("0", "1")] * 2
    _compare(model, seen, ("CUDA_VISIBLE_DEVICES", "SLURM_PROCID"))


def test_a_wrapper_script_srun_runs_is_read_per_task_with_its_arguments(slurm_cluster, tmp_path, monkeypatch):
    (tmp_path / "run.sh").write_text(f'#!/bin/bash\nexec {PY} record.py --rank=$SLURM_PROCID --tag "$1"\n')
    (tmp_path / "run.sh").chmod(0o755)
    model, seen = _run(
        slurm_cluster, tmp_path, monkeypatch, "#SBATCH --ntasks=3\n#SBATCH --gres=gpu:2\nsrun ./run.sh first\n"
    )
    assert sorted(s["argv"][0] for s in seen) == ["--rank=0", "--rank=1", "--rank=2"]
    assert "run.sh" in model.tasks[0].wrappers
    _compare(model, seen, ("SLURM_PROCID", "SLURM_LOCALID", "CUDA_VISIBLE_DEVICES"))
