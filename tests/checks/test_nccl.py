import pytest

from gpudoctor.job.layout import SEVERAL_HOSTS_ONLY
from gpudoctor.model import Severity
from gpudoctor.readers.ncclenv import c_strtoll, p2p_disabled, parse_prefix_list, select_names
from gpudoctor.readers.sbatch import parse_sbatch
from tests.factsutil import RECORDED_CPU, make_facts, run, said, severity

EIGHT_RANKS = {"LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "8", "RANK": "0", "LOCAL_RANK": "0"}
TWO_NODES = {"SLURM_JOB_ID": "42", "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2"}


# --- parsing as NCCL does -------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,n", [("1", 1), ("0x10", 16), ("010", 8), ("4MB", 4), (" 7", 7), ("-3", -3), ("true", None), ("", None)]
)
def test_c_strtoll_reads_like_c(text, n):
    assert c_strtoll(text) == n


@pytest.mark.parametrize(
    "name, text, problem",
    [
        ("NCCL_IB_DISABLE", "0x1", None),  # strtoll base 0 reads hex whole
        ("NCCL_BUFFSIZE", "0x400000", None),
        ("NCCL_IB_TIMEOUT", "022", "octal, i.e. 18"),
        ("NCCL_IB_TIMEOUT", "08", "leading number, 0"),  # 8 is no octal digit: strtoll stops at it
    ],
)
def test_nccl_integers_in_c_notation(name, text, problem):
    from gpudoctor.readers.ncclenv import nccl_problems

    got = nccl_problems({name: text})
    assert (got == []) if problem is None else (problem in got[0])


def test_prefix_list_syntax():
    names = ["eth0", "eth1", "ib0", "lo", "docker0"]
    assert select_names("eth", names) == ["eth0", "eth1"]
    assert select_names("=eth0,ib0", names) == ["eth0", "ib0"]
    assert select_names("^docker,lo", names) == ["eth0", "eth1", "ib0"]
    assert select_names("^=eth0", names) == ["eth1", "ib0", "lo", "docker0"]
    assert select_names("=eth", names) == []  # exact match: no interface is called 'eth'
    assert parse_prefix_list("eth0:5000,ib") == (False, False, ["eth0", "ib"])


def test_p2p_disable_reads_exactly_one():
    assert p2p_disabled({"NCCL_P2P_DISABLE": "1"}) == "NCCL_P2P_DISABLE=1"
    assert p2p_disabled({"NCCL_P2P_DISABLE": "2"}) is None
    assert p2p_disabled({"NCCL_P2P_DISABLE": "true"}) is None
    assert p2p_disabled({"NCCL_P2P_LEVEL": "LOC"}) == "NCCL_P2P_LEVEL=LOC"
    assert p2p_disabled({"NCCL_P2P_LEVEL": "NVL"}) is None


# --- GD-NCCL-001 ---------------------------------------------------------------------------


def test_multi_gpu_job_with_nccl_passes():
    (f,) = run("GD-NCCL-001", make_facts(env=EIGHT_RANKS))
    assert f.severity is Severity.PASS and "2.20.5" in said(f)


def test_multi_gpu_job_without_nccl_fails():
    (f,) = run("GD-NCCL-001", make_facts(env=EIGHT_RANKS, patch={"torch.nccl_available": False}))
    assert f.severity is Severity.FAIL
    assert "doesn't have NCCL built in" in said(f)


def test_expected_gpu_count_makes_it_multi_process():
    assert (
        severity("GD-NCCL-001", make_facts(env={}, patch={"torch.nccl_available": False}), expect_gpus=8)
        is Severity.FAIL
    )


def test_single_process_does_not_need_nccl():
    assert severity("GD-NCCL-001", make_facts(env={}, patch={"torch.nccl_available": False})) is Severity.SKIP


def test_cpu_job_does_not_need_nccl():
    assert severity("GD-NCCL-001", make_facts(RECORDED_CPU, env=EIGHT_RANKS), expect_gpus=0) is Severity.SKIP


# --- GD-NCCL-002 ---------------------------------------------------------------------------


def test_socket_ifname_prefix_selecting_eth0_passes():
    (f,) = run("GD-NCCL-002", make_facts(env={"NCCL_SOCKET_IFNAME": "eth", **EIGHT_RANKS}))
    assert f.severity is Severity.PASS
    assert f.evidence["selected"] == ["eth0"]


def test_socket_ifname_naming_a_missing_interface_fails_on_a_multi_gpu_job():
    (f,) = run("GD-NCCL-002", make_facts(env={"NCCL_SOCKET_IFNAME": "=ens1f0", **EIGHT_RANKS}))
    assert f.severity is Severity.FAIL
    assert "no socket interface found" in said(f)
    assert "eth0" in said(f)  # names what this host does have
    assert f.fix.actions[0].kind == "unset_env"


def test_socket_ifname_missing_interface_on_single_process_warns():
    assert severity("GD-NCCL-002", make_facts(env={"NCCL_SOCKET_IFNAME": "=ens1f0"})) is Severity.WARN


def test_loopback_only_on_multi_node_job_fails():
    (f,) = run("GD-NCCL-002", make_facts(env={"NCCL_SOCKET_IFNAME": "lo", **TWO_NODES}))
    assert f.severity is Severity.FAIL
    assert "2-node job" in said(f)


def test_excluding_every_real_interface_on_multi_node_fails():
    env = {"NCCL_SOCKET_IFNAME": "^eth,ib", **TWO_NODES}
    (f,) = run("GD-NCCL-002", make_facts(env=env))
    assert f.severity is Severity.FAIL
    assert f.evidence["selected"] == ["lo"]


def test_loopback_on_one_node_is_fine():
    assert severity("GD-NCCL-002", make_facts(env={"NCCL_SOCKET_IFNAME": "lo", **EIGHT_RANKS})) is Severity.PASS


def test_partly_wrong_list_is_info():
    (f,) = run("GD-NCCL-002", make_facts(RECORDED_CPU, env={"NCCL_SOCKET_IFNAME": "=eth0,ib0"}))
    assert f.severity is Severity.INFO
    assert "ib0 matches no interface" in said(f)


def test_down_interface_does_not_count():
    # ifb0 exists on the recorded machine but is down with no address: NCCL cannot use it.
    assert (
        severity("GD-NCCL-002", make_facts(RECORDED_CPU, env={"NCCL_SOCKET_IFNAME": "ifb", **EIGHT_RANKS}))
        is Severity.FAIL
    )


def test_socket_ifname_unset_is_skipped():
    assert severity("GD-NCCL-002", make_facts(env=EIGHT_RANKS)) is Severity.SKIP


# --- GD-NCCL-003 ---------------------------------------------------------------------------


def test_ib_disabled_with_active_ib_on_multi_node_warns():
    (f,) = run("GD-NCCL-003", make_facts(env={"NCCL_IB_DISABLE": "1", **TWO_NODES}))
    assert f.severity is Severity.WARN
    assert "TCP sockets" in said(f) and "mlx5_0:1" in said(f)
    assert f.fix.actions[0].kind == "unset_env" and f.fix.actions[0].target == "NCCL_IB_DISABLE"
    assert f.evidence[SEVERAL_HOSTS_ONLY] is True  # requires="several-hosts": `check --job` drops it on one host


def test_batch_script_disabling_ib_on_two_nodes_warns_inside_an_allocation():
    sbatch = parse_sbatch(
        "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --gres=gpu:8\nexport NCCL_IB_DISABLE=1\nsrun torchrun train.py\n",
        "job.slurm",
    )
    # Inside an allocation (salloc): this node is one the job runs on.
    (f,) = run("GD-NCCL-003", make_facts(env={"SLURM_JOB_ID": "7", "SLURM_NNODES": "2"}), sbatch=sbatch)
    assert f.severity is Severity.WARN
    assert f.evidence["NCCL_IB_DISABLE"] == "1"
    # On the submit host the ports seen are not the compute nodes': a hint, not a verdict.
    (f,) = run("GD-NCCL-003", make_facts(env={}), sbatch=sbatch)
    assert f.severity is Severity.INFO
    assert f.message.startswith("judged on gpu-node-01, not on the node the job will get")
    assert f.evidence["nodes"] == "2 (SLURM_NNODES)"


def test_active_ib_used_on_multi_node_passes():
    assert severity("GD-NCCL-003", make_facts(env=TWO_NODES)) is Severity.PASS


def test_ib_disable_spelled_true_does_not_disable_ib():
    # NCCL reads 'true' as 0: InfiniBand stays on (GD-NCCL-006 reports the spelling).
    assert severity("GD-NCCL-003", make_facts(env={"NCCL_IB_DISABLE": "true", **TWO_NODES})) is Severity.PASS


def test_ib_disable_on_single_node_does_not_matter():
    assert severity("GD-NCCL-003", make_facts(env={"NCCL_IB_DISABLE": "1", **EIGHT_RANKS})) is Severity.SKIP


def test_no_ib_hardware_on_multi_node_is_info():
    (f,) = run("GD-NCCL-003", make_facts(RECORDED_CPU, env={"NCCL_IB_DISABLE": "1", **TWO_NODES}))
    assert f.severity is Severity.INFO
    assert "harmless" in said(f)


def test_ib_ports_all_down_on_multi_node_warns():
    ports = [
        {
            "device": "mlx5_0",
            "port": 1,
            "state": "DOWN",
            "phys_state": "Polling",
            "rate": "10 Gb/sec",
            "link_layer": "InfiniBand",
        }
    ]
    (f,) = run("GD-NCCL-003", make_facts(env=TWO_NODES, patch={"network.infiniband": ports}))
    assert f.severity is Severity.WARN
    assert "mlx5_0:1 DOWN" in said(f)


def test_ib_hca_naming_no_active_device_warns():
    assert severity("GD-NCCL-003", make_facts(env={"NCCL_IB_HCA": "=mlx4_0", **TWO_NODES})) is Severity.WARN
    assert severity("GD-NCCL-003", make_facts(env={"NCCL_IB_HCA": "mlx5", **TWO_NODES})) is Severity.PASS


def test_efa_devices_are_not_the_ib_transport():
    efa = [{"device": "rdmap16s27", "port": 1, "state": "ACTIVE", "link_layer": "Unspecified"}]
    efa[0]["device"] = "efa_0"
    assert (
        severity(
            "GD-NCCL-003", make_facts(env={"NCCL_IB_DISABLE": "1", **TWO_NODES}, patch={"network.infiniband": efa})
        )
        is Severity.INFO
    )


# --- GD-NCCL-004 ---------------------------------------------------------------------------


def test_p2p_disabled_on_nvlink_gpus_warns():
    (f,) = run("GD-NCCL-004", make_facts(env={"NCCL_P2P_DISABLE": "1"}))
    assert f.severity is Severity.WARN
    assert "NVLink" in said(f) and "0, 1, 2" in said(f)


def test_p2p_level_loc_on_nvlink_warns():
    assert severity("GD-NCCL-004", make_facts(env={"NCCL_P2P_LEVEL": "LOC"})) is Severity.WARN


def test_p2p_on_passes():
    assert severity("GD-NCCL-004", make_facts(env={})) is Severity.PASS
    assert severity("GD-NCCL-004", make_facts(env={"NCCL_P2P_DISABLE": "0"})) is Severity.PASS


def test_p2p_disabled_without_nvlink_is_a_known_workaround():
    (f,) = run("GD-NCCL-004", make_facts(env={"NCCL_P2P_DISABLE": "1"}, each_gpu={"nvlink": []}))
    assert f.severity is Severity.INFO
    assert "workaround" in said(f)


def test_p2p_disabled_with_one_visible_gpu_is_not_a_loss():
    assert (
        severity("GD-NCCL-004", make_facts(env={"NCCL_P2P_DISABLE": "1", "CUDA_VISIBLE_DEVICES": "3"})) is Severity.INFO
    )


def test_p2p_check_skips_without_driver():
    assert severity("GD-NCCL-004", make_facts(RECORDED_CPU, env={"NCCL_P2P_DISABLE": "1"})) is Severity.SKIP


# --- GD-NCCL-005 ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env,expected",
    [
        ({}, Severity.PASS),
        ({"NCCL_DEBUG": "WARN"}, Severity.PASS),
        ({"NCCL_DEBUG": "INFO"}, Severity.INFO),
        ({"NCCL_DEBUG": "info", "NCCL_DEBUG_SUBSYS": "INIT,NET"}, Severity.INFO),
        ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,COLL"}, Severity.WARN),
        ({"NCCL_DEBUG": "TRACE", "NCCL_DEBUG_SUBSYS": "ALL"}, Severity.WARN),
        ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "^COLL"}, Severity.INFO),
    ],
)
def test_nccl_debug_levels(env, expected):
    assert severity("GD-NCCL-005", make_facts(env=env)) is expected


# --- GD-NCCL-006 ---------------------------------------------------------------------------


def test_ib_disable_true_is_read_as_zero():
    (f,) = run("GD-NCCL-006", make_facts(env={"NCCL_IB_DISABLE": "true"}))
    assert f.severity is Severity.WARN
    assert "does NOT turn the feature off" in said(f)


def test_buffsize_with_unit_is_read_as_a_few_bytes():
    (f,) = run("GD-NCCL-006", make_facts(env={"NCCL_BUFFSIZE": "4MB"}))
    assert f.severity is Severity.WARN
    assert "only the leading number, 4" in said(f)


def test_lower_case_p2p_level_is_ignored_by_nccl():
    (f,) = run("GD-NCCL-006", make_facts(env={"NCCL_P2P_LEVEL": "nvl"}))
    assert f.severity is Severity.WARN
    assert "case-sensitive: NVL" in said(f)


@pytest.mark.parametrize(
    "env",
    [{"NCCL_DEBUG": "verbose"}, {"NCCL_NTHREADS": "100"}, {"NCCL_IB_TIMEOUT": "40"}, {"NCCL_SOCKET_FAMILY": "ipv4"}],
)
def test_other_values_nccl_ignores_warn(env):
    assert severity("GD-NCCL-006", make_facts(env=env)) is Severity.WARN


@pytest.mark.parametrize(
    "env",
    [
        {"TORCH_NCCL_BLOCKING_WAIT": "on"},
        {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "yes"},
        {"NCCL_ASYNC_ERROR_HANDLING": "true"},
    ],
)
def test_values_torch_cannot_parse_fail(env):
    (f,) = run("GD-NCCL-006", make_facts(env=env))
    assert f.severity is Severity.FAIL
    assert "raises" in said(f)


def test_well_formed_values_pass():
    env = {
        "NCCL_DEBUG": "WARN",
        "NCCL_IB_DISABLE": "0",
        "NCCL_SOCKET_IFNAME": "=eth0",
        "NCCL_P2P_LEVEL": "NVL",
        "NCCL_NTHREADS": "512",
        "NCCL_BUFFSIZE": "8388608",
        "NCCL_IB_TIMEOUT": "22",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "TORCH_NCCL_BLOCKING_WAIT": "false",
    }
    (f,) = run("GD-NCCL-006", make_facts(env=env))
    assert f.severity is Severity.PASS, f.message
    assert severity("GD-NCCL-006", make_facts(env={})) is Severity.PASS


def test_unknown_algorithm_name_warns_and_known_forms_pass():
    (f,) = run("GD-NCCL-006", make_facts(env={"NCCL_ALGO": "Ring,Trees"}))
    assert f.severity is Severity.WARN and "'Trees'" in said(f)
    for value in ("ring", "^NVLS,CollnetDirect", "allreduce:tree;broadcast:ring"):
        assert severity("GD-NCCL-006", make_facts(env={"NCCL_ALGO": value})) is Severity.PASS, value
    assert severity("GD-NCCL-006", make_facts(env={"NCCL_PROTO": "^LL128"})) is Severity.PASS


def test_async_error_handling_out_of_range_warns_because_torch_does_not_reject_it():
    (f,) = run("GD-NCCL-006", make_facts(env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "5"}))
    assert f.severity is Severity.WARN and "neither tears down" in said(f)
    assert severity("GD-NCCL-006", make_facts(env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"})) is Severity.PASS


# --- GD-NCCL-013 ---------------------------------------------------------------------------


def test_a_variable_neither_nccl_nor_torch_reads_is_named_with_what_was_meant():
    """Issue 38: `export NCCL_TIMEOUT=1800` and TORCH_NCCL_TIMEOUT set no timeout; a typo names the real one."""
    env = {"NCCL_TIMEOUT": "1800", "TORCH_NCCL_TIMEOUT": "1800", "NCCL_SOCKET_IFNAM": "ib0", "NCCL_DEBUG": "WARN"}
    found = {f.message.split()[0]: f for f in run("GD-NCCL-013", make_facts(env=env))}
    assert set(found) == {"NCCL_TIMEOUT", "TORCH_NCCL_TIMEOUT", "NCCL_SOCKET_IFNAM"}
    assert all(f.severity is Severity.WARN and len(f.message) <= 120 for f in found.values())
    assert "init_process_group(timeout=...)" in found["NCCL_TIMEOUT"].message
    assert "did you mean NCCL_SOCKET_IFNAME?" in found["NCCL_SOCKET_IFNAM"].message
    assert "export NCCL_SOCKET_IFNAME=ib0" in [a.target for a in found["NCCL_SOCKET_IFNAM"].fix.actions]


def test_names_nccl_or_torch_read_pass_and_an_undocumented_one_is_a_note():
    known = {"NCCL_IB_TIMEOUT": "22", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_ASYNC_ERROR_HANDLING": "1"}
    known |= {"TORCH_DISTRIBUTED_DEBUG": "DETAIL", "NCCL_VERSION": "2.21.5", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "600"}
    assert severity("GD-NCCL-013", make_facts(env=known)) is Severity.PASS
    assert severity("GD-NCCL-013", make_facts(env={"NCCL_SOMETHING_NEW": "1"})) is Severity.INFO
    # a network plugin's own names (NVIDIA's IB/SHARP plugin, AWS's OFI plugin) are not judged: unsetting
    # NCCL_IBEXT_DISABLE=1, a near miss of NCCL_IB_DISABLE, would turn the plugin back on
    plugins = {"NCCL_IBEXT_DISABLE": "1", "NCCL_SHARP_DISABLE": "1", "NCCL_OFI_NIC_DUP_CONNS": "2"}
    assert severity("GD-NCCL-013", make_facts(env=plugins)) is Severity.PASS


def test_an_unread_variable_points_at_its_export_line():
    script = "#!/bin/bash\n#SBATCH --gres=gpu:1\nexport NCCL_DEBUG=WARN\nexport NCCL_TIMEOUT=1800\nsrun python t.py\n"
    sb = parse_sbatch(script, "job.slurm")
    (f,) = run("GD-NCCL-013", make_facts(RECORDED_CPU, env={}), sbatch=sb, sbatch_path="job.slurm")
    assert f.severity is Severity.WARN and f.location is not None and f.location.line == 4
