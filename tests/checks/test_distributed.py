import socket
from pathlib import Path

import pytest

from gpudoctor.model import Severity
from gpudoctor.probe import rendezvous
from gpudoctor.readers.sbatch import parse_sbatch
from tests.factsutil import DELETE, RECORDED_CPU, make_facts, run, said, severity

TORCHRUN_RANK3 = {
    "RANK": "3",
    "LOCAL_RANK": "3",
    "WORLD_SIZE": "16",
    "LOCAL_WORLD_SIZE": "8",
    "GROUP_RANK": "0",
    "MASTER_ADDR": "gpu-node-01",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RUN_ID": "1234",
}
# srun --ntasks-per-node=8 on 2 nodes, task 3 of the first node.
SRUN_TASK3 = {
    "SLURM_JOB_ID": "77",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "3",
    "SLURM_NODEID": "0",
    "SLURM_NTASKS": "16",
    "SLURM_NNODES": "2",
    "SLURM_TASKS_PER_NODE": "8(x2)",
    "SLURM_STEP_TASKS_PER_NODE": "8(x2)",
    "MASTER_ADDR": "gpu-node-01",
    "MASTER_PORT": "29500",
}


# --- GD-DIST-001 ---------------------------------------------------------------------------


def test_no_rank_variables_before_launch_is_skipped():
    assert severity("GD-DIST-001", make_facts(env={})) is Severity.SKIP


def test_torchrun_worker_variables_pass():
    (f,) = run("GD-DIST-001", make_facts(env=TORCHRUN_RANK3))
    assert f.severity is Severity.PASS
    assert "RANK=3" in said(f)


def test_rank_not_below_world_size_fails():
    (f,) = run("GD-DIST-001", make_facts(env={**TORCHRUN_RANK3, "RANK": "16"}))
    assert f.severity is Severity.FAIL
    assert "RANK=16 is not below WORLD_SIZE=16" in said(f)


def test_non_integer_rank_fails():
    (f,) = run("GD-DIST-001", make_facts(env={**TORCHRUN_RANK3, "LOCAL_RANK": "0.0"}))
    assert f.severity is Severity.FAIL
    assert "LOCAL_RANK='0.0' is not an integer" in said(f)


def test_local_world_size_larger_than_world_size_fails():
    env = {**TORCHRUN_RANK3, "WORLD_SIZE": "4", "RANK": "3"}
    (f,) = run("GD-DIST-001", make_facts(env=env))
    assert f.severity is Severity.FAIL
    assert "LOCAL_WORLD_SIZE=8 is larger than WORLD_SIZE=4" in said(f)


def test_rank_exported_in_batch_script_disagrees_with_srun_task():
    # `export RANK=$SLURM_PROCID` before srun: every task inherits the batch step's 0.
    env = {**SRUN_TASK3, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "16"}
    (f,) = run("GD-DIST-001", make_facts(env=env), launcher="srun")
    assert f.severity is Severity.FAIL
    assert "RANK=0 but SLURM_PROCID=3" in said(f)
    assert "LOCAL_RANK=0 but SLURM_LOCALID=3" in said(f)


def test_rank_set_per_srun_task_passes():
    env = {**SRUN_TASK3, "RANK": "3", "LOCAL_RANK": "3", "WORLD_SIZE": "16"}
    assert severity("GD-DIST-001", make_facts(env=env), launcher="srun") is Severity.PASS


def test_torchrun_inside_srun_may_differ_from_slurm_procid():
    env = {**SRUN_TASK3, **TORCHRUN_RANK3, "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}
    assert severity("GD-DIST-001", make_facts(env=env)) is Severity.PASS


def test_rank_without_master_addr_warns():
    (f,) = run("GD-DIST-001", make_facts(env={"RANK": "0", "WORLD_SIZE": "2"}))
    assert f.severity is Severity.WARN
    assert "MASTER_ADDR" in said(f) and "MASTER_PORT" in said(f)


def test_minus_one_means_not_distributed_and_one_process_needs_no_master():
    assert severity("GD-DIST-001", make_facts(env={"LOCAL_RANK": "-1"})) is Severity.SKIP
    assert severity("GD-DIST-001", make_facts(env={"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})) is Severity.PASS
    assert severity("GD-DIST-001", make_facts(env={"LOCAL_RANK": "-2"})) is Severity.FAIL


def test_srun_launcher_without_rank_variables_is_explained():
    env = {k: v for k, v in SRUN_TASK3.items() if not k.startswith("MASTER")}
    (f,) = run("GD-DIST-001", make_facts(env=env), launcher="srun")
    assert f.severity is Severity.INFO
    assert "SLURM_PROCID" in said(f)


# --- GD-DIST-002 ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "port,expected",
    [
        ("29500", Severity.PASS),
        ("abc", Severity.FAIL),
        ("70000", Severity.FAIL),
        ("0", Severity.FAIL),
        ("80", Severity.WARN),
    ],
)
def test_master_port_values(port, expected):
    assert severity("GD-DIST-002", make_facts(env={"MASTER_PORT": port})) is expected


@pytest.mark.parametrize("world, expected", [("1", Severity.PASS), ("8", Severity.FAIL)])
def test_master_port_zero_works_only_for_one_process(world, expected):
    # torch accepts 0..65535; 0 makes rank 0's store bind a random port the other ranks cannot know
    assert severity("GD-DIST-002", make_facts(env={"MASTER_PORT": "0", "WORLD_SIZE": world})) is expected


def test_empty_master_addr_counts_as_missing():
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "", "MASTER_PORT": "29500"}
    (f,) = run("GD-DIST-001", make_facts(env=env))
    assert f.severity is Severity.WARN and "MASTER_ADDR (set but empty)" in said(f)


def test_master_port_unset_is_skipped():
    assert severity("GD-DIST-002", make_facts(env={})) is Severity.SKIP


# --- GD-DIST-003 ---------------------------------------------------------------------------


def _rdv(**fields):
    base = {
        "master_addr": "gpu-node-01",
        "master_port": "29500",
        "resolve": {"seconds": 0.01, "addresses": ["10.0.3.11"]},
        "resolved": ["10.0.3.11"],
        "loopback": False,
        "is_this_host": True,
        "binds_port_here": True,
        "binds_port_reason": "no RANK set and MASTER_ADDR names this host",
        "port_check": {"port": 29500, "free": True},
    }
    base.update(fields)
    return {"rendezvous": base}


def test_rendezvous_not_probed_is_skipped():
    # The shipped fixtures predate the rendezvous probe: the runner skips, it does not crash.
    (f,) = run("GD-DIST-003", make_facts(env={"MASTER_ADDR": "x"}))
    assert f.severity is Severity.SKIP and "rendezvous" in said(f)


def test_resolvable_master_with_free_port_passes():
    (f,) = run("GD-DIST-003", make_facts(env={"MASTER_ADDR": "gpu-node-01"}, patch=_rdv()))
    assert f.severity is Severity.PASS
    assert "10.0.3.11" in said(f) and "free" in said(f)


def test_unresolvable_master_addr_fails():
    patch = _rdv(
        resolve={"seconds": 0.2, "error": "gaierror: [Errno -2] Name or service not known"},
        resolved=[],
        is_this_host=None,
    )
    (f,) = run("GD-DIST-003", make_facts(env={"MASTER_ADDR": "gpu-node-99"}, patch=patch))
    assert f.severity is Severity.FAIL
    assert "does not resolve" in said(f) and "Name or service not known" in said(f)


@pytest.mark.parametrize(
    "addr, hint",
    [("gpu-node-01:29500", "belongs in MASTER_PORT"), ("tcp://10.0.0.1", "no scheme"), ("[::1]", "without brackets")],
)
def test_unresolvable_master_addr_says_what_is_wrong_with_its_form(addr, hint):
    patch = _rdv(
        master_addr=addr,
        resolve={"seconds": 0.01, "error": "gaierror: [Errno -2] Name or service not known"},
        resolved=[],
    )
    (f,) = run("GD-DIST-003", make_facts(env={"MASTER_ADDR": addr}, patch=patch))
    assert f.severity is Severity.FAIL and hint in said(f)


def test_loopback_master_on_multi_node_job_fails():
    patch = _rdv(master_addr="localhost", resolved=["127.0.0.1", "::1"], loopback=True)
    env = {"MASTER_ADDR": "localhost", "SLURM_NNODES": "2", "SLURM_JOB_ID": "5"}
    (f,) = run("GD-DIST-003", make_facts(env=env, patch=patch))
    assert f.severity is Severity.FAIL
    assert "loopback" in said(f) and "2 nodes" in said(f)


def test_loopback_master_on_one_node_passes():
    patch = _rdv(master_addr="localhost", resolved=["127.0.0.1"], loopback=True)
    assert severity("GD-DIST-003", make_facts(env={"MASTER_ADDR": "localhost"}, patch=patch)) is Severity.PASS


def test_port_in_use_where_it_is_bound_fails():
    patch = _rdv(
        port_check={"port": 29500, "free": False, "reason": "in use", "error": "OSError: Address already in use"}
    )
    (f,) = run("GD-DIST-003", make_facts(env={"MASTER_ADDR": "gpu-node-01"}, patch=patch))
    assert f.severity is Severity.FAIL
    assert "29500" in said(f) and "another process" in said(f)


def test_rank0_on_another_host_than_master_addr_warns():
    patch = _rdv(is_this_host=False, binds_port_here=True, binds_port_reason="RANK=0", port_check=None)
    env = {"MASTER_ADDR": "gpu-node-02", "RANK": "0", "WORLD_SIZE": "16"}
    (f,) = run("GD-DIST-003", make_facts(env=env, patch=patch))
    assert f.severity is Severity.WARN
    assert "rank 0" in said(f)


def test_rank0_elsewhere_is_fine_under_torchrun():
    patch = _rdv(is_this_host=False, binds_port_here=False, port_check=None)
    env = {**TORCHRUN_RANK3, "RANK": "0", "LOCAL_RANK": "0"}
    assert severity("GD-DIST-003", make_facts(env=env, patch=patch)) is Severity.PASS


# The probe itself, for real, on this machine.


def test_probe_finds_a_port_held_by_another_socket():
    holder = socket.socket()
    holder.bind(("", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        out = rendezvous.probe({"MASTER_ADDR": "localhost", "MASTER_PORT": str(port)})
    finally:
        holder.close()
    assert out["is_this_host"] is True and out["binds_port_here"] is True
    assert out["port_check"]["free"] is False and out["port_check"]["reason"] == "in use"
    assert out["loopback"] is True


def test_probe_finds_a_free_port_free():
    s = socket.socket()
    s.bind(("", 0))
    port = s.getsockname()[1]
    s.close()
    out = rendezvous.probe({"MASTER_ADDR": socket.gethostname(), "MASTER_PORT": str(port)})
    assert out["port_check"] == {"port": port, "free": True}


def test_probe_does_not_bind_on_other_ranks_or_under_torchrun():
    assert "port_check" not in rendezvous.probe({"MASTER_ADDR": "localhost", "MASTER_PORT": "29500", "RANK": "5"})
    out = rendezvous.probe({"MASTER_ADDR": "localhost", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x"})
    assert "port_check" not in out and "torchrun" in out["binds_port_reason"]


def test_probe_reports_an_unresolvable_name_within_its_time_limit():
    out = rendezvous.probe({"MASTER_ADDR": "no-such-host.invalid", "MASTER_PORT": "29500"})
    assert out["resolved"] == [] and out["resolve"]["error"]
    assert out["resolve"]["seconds"] <= rendezvous.RESOLVE_TIMEOUT + 1


def test_probe_without_master_addr_records_nothing_to_test():
    out = rendezvous.probe({})
    assert out["master_addr"] is None and "port_check" not in out


# --- GD-DIST-004 ---------------------------------------------------------------------------


def _script(body: str) -> dict:
    return parse_sbatch("#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --gres=gpu:8\n" + body, "job.slurm")


def test_legacy_launch_in_batch_script_warns():
    sbatch = _script("python -m torch.distributed.launch --nproc_per_node=8 train.py\n")
    (f,) = run("GD-DIST-004", make_facts(), sbatch=sbatch, sbatch_path="job.slurm")
    assert f.severity is Severity.WARN
    assert "--local-rank" in said(f)
    assert f.evidence["lines"] == ["line 4: python -m torch.distributed.launch --nproc_per_node=8 train.py"]


def test_legacy_launch_with_use_env_is_info():
    sbatch = _script("srun python -m torch.distributed.launch --use-env --nproc_per_node=8 train.py\n")
    assert severity("GD-DIST-004", make_facts(), sbatch=sbatch) is Severity.INFO


def test_torchrun_batch_script_passes():
    sbatch = _script("srun torchrun --nproc-per-node=8 train.py\n")
    assert severity("GD-DIST-004", make_facts(), sbatch=sbatch) is Severity.PASS


def test_master_port_exported_by_the_batch_script_is_checked():
    sbatch = _script("export MASTER_PORT=443\nsrun python train.py\n")
    (f,) = run("GD-DIST-002", make_facts(env={}), sbatch=sbatch)
    assert f.severity is Severity.WARN and "443" in said(f)


def test_legacy_launch_check_skips_without_batch_script():
    assert severity("GD-DIST-004", make_facts()) is Severity.SKIP


# --- GD-DIST-005 ---------------------------------------------------------------------------


def test_old_async_error_handling_name_on_new_torch_is_info_with_a_rename_fix():
    (f,) = run("GD-DIST-005", make_facts(env={"NCCL_ASYNC_ERROR_HANDLING": "1"}))  # fixture torch 2.3.1
    assert f.severity is Severity.INFO
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" in said(f)
    assert [a.kind for a in f.fix.actions] == ["set_env", "unset_env"]


def test_old_and_new_names_disagreeing_warns():
    env = {"NCCL_BLOCKING_WAIT": "1", "TORCH_NCCL_BLOCKING_WAIT": "0"}
    (f,) = run("GD-DIST-005", make_facts(env=env))
    assert f.severity is Severity.WARN and "disagree" in said(f)


def test_new_name_on_torch_older_than_2_2_has_no_effect():
    f = make_facts(
        env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"},
        patch={"torch.version": "2.1.2+cu121", "torch_meta.version": "2.1.2+cu121"},
    )
    (finding,) = run("GD-DIST-005", f)
    assert finding.severity is Severity.WARN
    assert "no effect" in said(finding)


def test_new_names_on_new_torch_pass():
    assert severity("GD-DIST-005", make_facts(env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"})) is Severity.PASS
    assert severity("GD-DIST-005", make_facts(RECORDED_CPU)) is Severity.PASS


# --- under a real srun (tests/slurmcluster.py: a single-node SLURM started by the tests) ---------


def _srun_check(cluster, tmp_path, task_command: str, *check_args) -> dict:
    """Run `gpudoctor check --json` in every task of `srun --ntasks=2`; the reports by SLURM_PROCID."""
    import json
    import shlex
    import sys

    check = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "gpudoctor", "check", "--json", *check_args])
    script = f"{task_command} {check} > {tmp_path}/task$SLURM_PROCID.json"
    r = cluster.srun(
        ["--ntasks=2", "--cpus-per-task=1", "bash", "-c", script],
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert r.returncode in (0, 1), r.stderr
    return {n: json.loads((tmp_path / f"task{n}.json").read_text()) for n in (0, 1)}


def _finding(report: dict, check_id: str) -> dict:
    return next(f for f in report["findings"] if f["id"] == check_id)


@pytest.mark.slurm
def test_real_srun_tasks_with_rank_exported_before_srun_fail(slurm_cluster, tmp_path):
    # RANK=0 exported once for the whole step, as `export RANK=$SLURM_PROCID` in a batch script does.
    reports = _srun_check(
        slurm_cluster,
        tmp_path,
        "RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=localhost MASTER_PORT=29555",
        "--select",
        "GD-DIST-001",
        "--launcher",
        "srun",
        "--expect-gpus",
        "0",
    )
    assert _finding(reports[0], "GD-DIST-001")["severity"] == "pass"
    task1 = _finding(reports[1], "GD-DIST-001")
    assert task1["severity"] == "fail"
    assert "RANK=0 but SLURM_PROCID=1" in said(task1)


@pytest.mark.slurm
def test_real_srun_tasks_with_rank_set_per_task_pass(slurm_cluster, tmp_path):
    per_task = (
        "RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS MASTER_ADDR=localhost MASTER_PORT=29556"
    )
    reports = _srun_check(
        slurm_cluster,
        tmp_path,
        per_task,
        "--select",
        "GD-DIST-001,GD-DL-001",
        "--launcher",
        "srun",
        "--expect-gpus",
        "0",
        "--config",
        str(Path(__file__).parents[1] / "fixtures" / "configs" / "synthetic-good-dataloader.yaml"),
    )
    for n in (0, 1):
        assert _finding(reports[n], "GD-DIST-001")["severity"] == "pass"
        # Both tasks share this machine's CPUs: 2 ranks x (8 workers + 1) does not fit.
        dl = _finding(reports[n], "GD-DL-001")
        assert dl["severity"] == "warn" and "2 rank(s) x (8 workers + 1 main process)" in said(dl)
        assert dl["evidence"]["ranks_on_node"] == "2 (SLURM tasks on this node)"


def _loopback_script(nodes: int, addr: str) -> object:
    head = f"#!/bin/bash\n#SBATCH --nodes={nodes}\n#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-node=1\n"
    return parse_sbatch(head + f"export MASTER_ADDR={addr}\nsrun python main.py\n", "job.slurm")


@pytest.mark.parametrize("addr", ["localhost", "127.0.0.1", "::1"])
def test_006_script_exporting_loopback_master_on_several_nodes_fails_before_submission(addr):
    """pytorch/pytorch#76069: a loopback MASTER_ADDR written in the batch script of a 4-node job; judged from a
    login node whose own environment has no MASTER_ADDR (so the rendezvous probe saw none)."""
    facts = make_facts(env={}, patch={"rendezvous": {"master_addr": None}})
    (f,) = run("GD-DIST-006", facts, sbatch=_loopback_script(4, addr), sbatch_path="job.slurm")
    assert f.severity is Severity.FAIL
    assert f"MASTER_ADDR={addr} is loopback" in f.message and "4 nodes" in f.message
    assert f.evidence["MASTER_ADDR_source"] == "job.slurm line 5" and f.location.line == 5
    assert "scontrol show hostnames" in f.fix.actions[0].target


def test_006_script_exporting_loopback_master_on_one_node_is_fine():
    facts = make_facts(env={}, patch={"rendezvous": {"master_addr": None}})
    (f,) = run("GD-DIST-006", facts, sbatch=_loopback_script(1, "localhost"), sbatch_path="job.slurm")
    assert f.severity is Severity.PASS


def test_006_needs_no_rendezvous_probe_and_leaves_live_values_to_003():
    # judged from the script alone: a snapshot without the rendezvous section still gets the verdict
    facts = make_facts(env={}, patch={"rendezvous": DELETE})
    (f,) = run("GD-DIST-006", facts, sbatch=_loopback_script(4, "127.0.0.1"), sbatch_path="job.slurm")
    assert f.severity is Severity.FAIL
    (g,) = run("GD-DIST-006", make_facts(env={"MASTER_ADDR": "localhost"}))
    assert g.severity is Severity.SKIP


def test_a_live_check_probes_the_rendezvous_it_judges():
    # needs= drives which probes run: GD-DIST-003 must still get the rendezvous probe inside a job
    # (a loopback MASTER_ADDR on a 2-node torchrun job), not skip as "not probed".
    import json

    from tests.cliutil import run_gpudoctor_here

    env = dict(RANK="0", WORLD_SIZE="16", LOCAL_WORLD_SIZE="8", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    r = run_gpudoctor_here("check", "--select", "GD-DIST-003", "--json", env=env)
    (finding,) = json.loads(r.stdout)["findings"]
    assert finding["severity"] == "fail" and "loopback" in said(finding), finding


def test_006_a_master_addr_set_by_a_command_is_said_to_be_set():
    """Issue 38: `export MASTER_ADDR=$(scontrol ...)` is set by the script; only its value is not known yet."""
    from gpudoctor.readers.sbatch import parse_sbatch

    text = (
        "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --gres=gpu:4\n"
        'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\nsrun python t.py\n'
    )
    facts = make_facts(env={}, patch={"rendezvous": {"master_addr": None}})
    (f,) = run("GD-DIST-006", facts, sbatch=parse_sbatch(text, "job.slurm"), sbatch_path="job.slurm")
    assert f.severity is Severity.SKIP and f.message.startswith("line 4 sets MASTER_ADDR")
    assert "does not export" not in f.message
