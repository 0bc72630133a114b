"""GD-SLURM-033 (the accelerate --config_file), GD-SLURM-034 (a rendezvous endpoint computed per task), and the
config's values judged by the existing launcher checks (GD-SLURM-003, GD-DIST-001)."""

from __future__ import annotations

from gpudoctor.model import Severity
from gpudoctor.readers.sbatch import load_sbatch
from tests.factsutil import make_facts, run, said, severity

CONFIG = """compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
machine_rank: 0
num_machines: 2
num_processes: {procs}
main_process_ip: node-a
{extra}"""
TWO_NODES = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:8\n"
ONE_NODE = "#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=2\n#SBATCH --gres=gpu:2\n"


def _ctx(tmp_path, body: str, config: str | None = None, head: str = TWO_NODES) -> dict:
    if config is not None:
        (tmp_path / "acc.yaml").write_text(config)
    script = tmp_path / "job.slurm"
    script.write_text(head + body + "\n")
    return {"sbatch": load_sbatch(str(script)), "sbatch_path": str(script)}


def _facts():
    return make_facts(patch={"slurm": {"in_job": False, "version": "23.11.6", "job": None, "packages": {}}})


# --- GD-SLURM-033 ---------------------------------------------------------------------------


def test_config_read_names_its_values_and_lines(tmp_path):
    ctx = _ctx(tmp_path, "srun accelerate launch --config_file acc.yaml t.py", CONFIG.format(procs=16, extra=""))
    (f,) = run("GD-SLURM-033", _facts(), **ctx)
    assert f.severity is Severity.PASS
    assert "num_processes 16 over num_machines 2 (8 per machine)" in said(f)
    assert f.evidence["num_processes"] == "16 (acc.yaml:5)"


def test_missing_config_at_a_known_place_warns(tmp_path):
    ctx = _ctx(tmp_path, f"srun accelerate launch --config_file {tmp_path}/none.yaml t.py")
    (f,) = run("GD-SLURM-033", _facts(), **ctx)
    assert f.severity is Severity.WARN and "does not exist" in said(f) and f.fix is not None


def test_missing_relative_config_is_a_note_the_submit_directory_is_unknown(tmp_path):
    ctx = _ctx(tmp_path, "srun accelerate launch --config_file none.yaml t.py")
    (f,) = run("GD-SLURM-033", _facts(), **ctx)
    assert f.severity is Severity.INFO and "directory sbatch is run from" in said(f)


def test_broken_config_warns_in_one_line(tmp_path):
    ctx = _ctx(tmp_path, "srun accelerate launch --config_file acc.yaml t.py", "num_processes: [\n")
    (f,) = run("GD-SLURM-033", _facts(), **ctx)
    assert f.severity is Severity.WARN and "broken YAML" in said(f) and "\n" not in said(f)


def test_config_accelerate_refuses_fails(tmp_path):
    ctx = _ctx(tmp_path, "srun accelerate launch --config_file acc.yaml t.py", "num_machines: 2\n")
    (f,) = run("GD-SLURM-033", _facts(), **ctx)
    assert f.severity is Severity.FAIL and "distributed_type" in said(f)


def test_several_machines_without_a_main_process_ip_fail(tmp_path):
    config = CONFIG.format(procs=16, extra="").replace("main_process_ip: node-a\n", "")
    ctx = _ctx(tmp_path, "srun accelerate launch --config_file acc.yaml t.py", config)
    (f,) = run("GD-SLURM-033", _facts(), **ctx)
    assert f.severity is Severity.FAIL and "host 'None'" in said(f)
    ctx = _ctx(tmp_path, "srun accelerate launch --config_file acc.yaml --main_process_ip $MASTER_ADDR t.py", config)
    assert severity("GD-SLURM-033", _facts(), **ctx) is Severity.PASS


def test_no_config_file_is_not_applicable(tmp_path):
    ctx = _ctx(tmp_path, "srun accelerate launch --num_processes 16 --num_machines 2 t.py")
    assert severity("GD-SLURM-033", _facts(), **ctx) is Severity.SKIP


# --- the config's values in the launcher checks ----------------------------------------------


def test_config_machine_rank_shared_by_every_node_fails(tmp_path):
    ctx = _ctx(tmp_path, "srun accelerate launch --config_file acc.yaml t.py", CONFIG.format(procs=16, extra=""))
    (f,) = run("GD-DIST-001", _facts(), **ctx)
    assert f.severity is Severity.FAIL and "machine_rank: 0 from acc.yaml:3" in said(f)


def test_machine_rank_per_task_on_the_line_overrides_the_config(tmp_path):
    body = "srun bash -c 'accelerate launch --config_file acc.yaml --machine_rank $SLURM_NODEID t.py'"
    ctx = _ctx(tmp_path, body, CONFIG.format(procs=16, extra=""))
    assert severity("GD-DIST-001", _facts(), **ctx) is not Severity.FAIL


def test_config_with_c10d_rendezvous_is_not_judged_on_machine_rank(tmp_path):
    config = CONFIG.format(procs=16, extra="rdzv_backend: c10d\n")
    ctx = _ctx(tmp_path, "srun accelerate launch --config_file acc.yaml t.py", config)
    assert severity("GD-DIST-001", _facts(), **ctx) is not Severity.FAIL


def test_config_process_count_is_what_idle_gpus_are_judged_with(tmp_path):
    ctx = _ctx(tmp_path, "srun accelerate launch --config_file acc.yaml t.py", CONFIG.format(procs=8, extra=""))
    (f,) = run("GD-SLURM-003", _facts(), **ctx)
    assert f.severity is Severity.WARN and "4 process(es) per node for 8 GPU(s)" in f.message
    ctx = _ctx(tmp_path, "srun accelerate launch --config_file acc.yaml t.py", CONFIG.format(procs=16, extra=""))
    assert severity("GD-SLURM-003", _facts(), **ctx) is Severity.PASS


# --- GD-SLURM-034 ---------------------------------------------------------------------------


def test_hostname_per_task_on_two_nodes_fails(tmp_path):
    body = "srun bash -c 'torchrun --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint $(hostname) t.py'"
    (f,) = run("GD-SLURM-034", _facts(), **_ctx(tmp_path, body))
    assert f.severity is Severity.FAIL and "each of the 2 nodes gets its own" in said(f) and f.fix is not None


def test_hostname_per_task_on_one_node_is_the_same_for_all(tmp_path):
    body = "srun bash -c 'MASTER_ADDR=$(hostname) MASTER_PORT=29500 python t.py'"
    assert severity("GD-SLURM-034", _facts(), **_ctx(tmp_path, body, head=ONE_NODE)) is Severity.PASS


def test_free_port_per_task_on_one_node_fails(tmp_path):
    pick = "$(python -c \"import socket; s=socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])\")"
    body = f"srun bash -c 'MASTER_ADDR=$(hostname) MASTER_PORT={pick} python t.py'"
    (f,) = run("GD-SLURM-034", _facts(), **_ctx(tmp_path, body, head=ONE_NODE))
    assert f.severity is Severity.FAIL and "MASTER_PORT" in said(f) and "each of the 2 tasks" in said(f)


def test_endpoint_computed_in_the_batch_shell_passes(tmp_path):
    body = (
        "head=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)\n"
        'srun bash -c "torchrun --nnodes 2 --rdzv_backend c10d --rdzv_endpoint $head:29500 t.py"'
    )
    assert severity("GD-SLURM-034", _facts(), **_ctx(tmp_path, body)) is Severity.PASS


def test_config_port_zero_over_several_machines_fails(tmp_path):
    config = CONFIG.format(procs=16, extra="main_process_port: 0\n")
    body = "srun bash -c 'accelerate launch --config_file acc.yaml --machine_rank $SLURM_NODEID t.py'"
    (f,) = run("GD-SLURM-034", _facts(), **_ctx(tmp_path, body, config))
    assert f.severity is Severity.FAIL and "main_process_port 0" in said(f)


def test_without_a_per_task_shell_the_batch_shell_expands_once(tmp_path):
    body = "srun torchrun --nnodes 2 --rdzv_backend c10d --rdzv_endpoint $(hostname):29500 t.py"
    assert severity("GD-SLURM-034", _facts(), **_ctx(tmp_path, body)) is Severity.SKIP
