"""The model's expansion rules against real bash (issue 37): each script runs in bash as the batch shell of node 0
(SLURM_PROCID=SLURM_NODEID=SLURM_LOCALID=0, the batch step's variables), with `srun` a function that starts the
command once per task with that task's variables, as srun(1) sets them, and the launchers replaced by recorders
of the argv they get. The model built from the same text must predict every task's argv. Multi-node placement is
SLURM's block distribution (tests/job/test_model_reality.py runs the single-node rules on real SLURM)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpudoctor.job.model import build
from gpudoctor.readers.sbatch import parse_sbatch

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="no bash here")

SRUN = r"""
srun() {
  while [[ $# -gt 0 && $1 == -* ]]; do shift; done
  local t=0 n l
  for ((n = 0; n < NODES; n++)); do
    for ((l = 0; l < PER_NODE; l++)); do
      SLURM_PROCID=$t SLURM_NODEID=$n SLURM_LOCALID=$l HOSTNAME=node$n SLURM_NTASKS=$((NODES * PER_NODE)) "$@"
      t=$((t + 1))
    done
  done
}
"""
RECORDER = '#!/bin/bash\nprintf "%s\\n" "$(basename "$0")" "$@" > "$RECORD_DIR/$SLURM_PROCID-$RANDOM.argv"\n'
# A container runtime stand-in: runs the command after `exec|run [options] IMAGE` (-B takes a value), as it would
# inside the container.
CONTAINER = '#!/bin/bash\nshift\nwhile [[ $1 == -* ]]; do [[ $1 == -B ]] && shift; shift; done\nshift\nexec "$@"\n'


def _real(tmp_path: Path, text: str, nodes: int, per_node: int) -> dict[int, list[str]]:
    bin_dir, records = tmp_path / "bin", tmp_path / "records"
    bin_dir.mkdir()
    records.mkdir()
    for name in ("torchrun", "python", "accelerate", "singularity", "deepspeed"):
        (bin_dir / name).write_text(CONTAINER if name == "singularity" else RECORDER)
        (bin_dir / name).chmod(0o755)
    body = text.split("\n", 1)[1]
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "RECORD_DIR": str(records),
        "NODES": str(nodes),
        "PER_NODE": str(per_node),
        "SLURM_PROCID": "0",
        "SLURM_NODEID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NNODES": str(nodes),
        "SLURM_JOB_ID": "77",
        "HOSTNAME": "node0",
    }
    r = subprocess.run([BASH, "-c", SRUN + body], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    out: dict[int, list[str]] = {}
    for f in records.iterdir():
        out[int(f.name.split("-")[0])] = f.read_text().splitlines()
    return out


CASES = [
    ("srun torchrun --nnodes=2 --node_rank=$SLURM_NODEID --nproc_per_node=4 t.py --rank $SLURM_PROCID\n", 2, 1),
    ("srun bash -c 'torchrun --nnodes=2 --node_rank=$SLURM_NODEID --nproc_per_node=4 t.py'\n", 2, 1),
    ('srun bash -c "torchrun --nnodes=2 --node_rank=$SLURM_NODEID --nproc_per_node=4 t.py"\n', 2, 1),
    ('srun bash -c "torchrun --nnodes=2 --node_rank=\\$SLURM_NODEID --nproc_per_node=4 t.py"\n', 2, 1),
    ("srun bash -c 'python t.py --rank=$SLURM_PROCID --local=$SLURM_LOCALID'\n", 2, 2),
    ("export R=$SLURM_PROCID\nsrun python t.py --rank=$R\n", 1, 3),
    ("srun singularity exec --nv -B /a:/b img.sif bash -c 'python t.py --node=$SLURM_NODEID'\n", 3, 1),
    ('set -- accelerate launch --machine_rank $SLURM_NODEID t.py\nsrun "$@"\n', 2, 1),
    ("srun bash -c 'accelerate launch --machine_rank $SLURM_NODEID --num_machines 2 t.py'\n", 2, 1),
    # the real wrappers of this machine (coreutils, util-linux), by their synopsis in launch.WRAPPERS
    ("srun timeout -s INT -k 10 3600 python t.py --node=$SLURM_NODEID\n", 2, 1),
    ("srun taskset -c 0 nice -n 5 stdbuf -oL env A=1 python t.py --x\n", 1, 2),
    ("srun bash -c 'exec taskset 0x1 timeout 1h torchrun --node_rank=$SLURM_NODEID --nnodes=2 t.py'\n", 2, 1),
    ("srun nohup env -u CUDA_VISIBLE_DEVICES python t.py --y 1\n", 1, 2),
]


@pytest.mark.parametrize(("line", "nodes", "per_node"), CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_each_task_runs_the_argv_the_model_predicts(tmp_path, line, nodes, per_node):
    text = f"#!/bin/bash\n#SBATCH --nodes={nodes}\n#SBATCH --ntasks-per-node={per_node}\n#SBATCH --gres=gpu:4\n{line}"
    real = _real(tmp_path, text, nodes, per_node)
    model = build(parse_sbatch(text, "job.slurm"))
    assert len(model.tasks) == len(real) == nodes * per_node
    for task in model.tasks:
        got = real[task.procid]
        want = [os.path.basename(task.argv[0]), *task.argv[1:]]
        # the recorder sees the innermost program; the model's argv is the command after every wrapper
        assert got[-len(want) + 1 :] == want[1:] and got[0] == want[0], (task.procid, json.dumps(got), want)
