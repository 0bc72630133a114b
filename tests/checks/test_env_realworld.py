"""A catalogue of environment variable values people really set, with the verdict each check
must give. The sources of truth are named per block (torch's allocator and c10d sources, NCCL's
sources and docs, CUDA's documentation, and torch 2.13 itself where it could be run).

Checks that read only the environment run through the real CLI with real environment variables
(`gpudoctor check --select ... --json` in this process, probing this machine: torch 2.13, no GPU). Checks that
also need GPUs or network interfaces run on the healthy 8xH100 facts fixture with the variables
set in its environment, since this machine has neither.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudoctor.model import Severity
from tests.cliutil import run_gpudoctor_here
from tests.factsutil import make_facts, run, said
from tests.thismachine import torch_release_here

ROOT = Path(__file__).resolve().parents[2]
PASS, INFO, WARN, FAIL = "pass", "info", "warn", "fail"
SCRUB = (
    "CUDA_",
    "NCCL_",
    "PYTORCH_",
    "TORCH_",
    "SLURM_",
    "LD_PRELOAD",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "MASTER_",
)

# (variables, {check id: expected severity}) - judged on this machine's torch 2.13.
LIVE = [
    # PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF: c10/core/AllocatorConfig.{h,cpp}, c10/cuda/CUDAAllocatorConfig.h
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, {"GD-ALLOC-001": PASS, "GD-ALLOC-002": PASS}),
    ({"PYTORCH_ALLOC_CONF": "expandable_segments:True"}, {"GD-ALLOC-001": PASS, "GD-ALLOC-002": PASS}),
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:true"}, {"GD-ALLOC-001": FAIL}),  # toBool: exactly True/False
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments"}, {"GD-ALLOC-001": FAIL}),  # no value: ConfigTokenizer assert
    ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb=512"}, {"GD-ALLOC-001": FAIL}),
    ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}, {"GD-ALLOC-001": PASS}),
    ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:19"}, {"GD-ALLOC-001": FAIL}),
    ({"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6,max_split_size_mb:128"}, {"GD-ALLOC-001": PASS}),
    ({"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:1.0"}, {"GD-ALLOC-001": FAIL}),
    ({"PYTORCH_CUDA_ALLOC_CONF": "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]"}, {"GD-ALLOC-001": PASS}),
    ({"PYTORCH_CUDA_ALLOC_CONF": "roundup_power2_divisions:[256:1,512:3]"}, {"GD-ALLOC-001": FAIL}),
    ({"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, {"GD-ALLOC-001": PASS}),
    ({"PYTORCH_CUDA_ALLOC_CONF": "backend:cudamallocasync"}, {"GD-ALLOC-001": FAIL}),
    ({"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync,expandable_segments:True"}, {"GD-ALLOC-001": WARN}),
    (
        {"PYTORCH_CUDA_ALLOC_CONF": "pinned_use_cuda_host_register:True,pinned_num_register_threads:8"},
        {"GD-ALLOC-001": PASS},
    ),
    ({"PYTORCH_CUDA_ALLOC_CONF": "pinned_num_register_threads:6"}, {"GD-ALLOC-001": FAIL}),
    ({"PYTORCH_CUDA_ALLOC_CONF": "release_lock_on_cudamalloc:True"}, {"GD-ALLOC-001": PASS}),
    ({"PYTORCH_CUDA_ALLOC_CONF": "large_segment_size_mb:64"}, {"GD-ALLOC-001": PASS}),  # a 2.13 key
    # torch 2.13's own parser (torch._C._accelerator_setAllocatorSettings) on edge spellings
    (
        {"PYTORCH_CUDA_ALLOC_CONF": " expandable_segments : True, "},
        {"GD-ALLOC-001": PASS},
    ),  # blanks vanish, one trailing ',' is fine
    (
        {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:１２８"},
        {"GD-ALLOC-001": FAIL},
    ),  # full-width digits: stoull raises
    (
        {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:99999999999999999999999"},
        {"GD-ALLOC-001": FAIL},
    ),  # stoull out_of_range
    (
        {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:nan"},
        {"GD-ALLOC-001": FAIL},
    ),  # stod reads nan; (0,1) check fails
    # both set: torch 2.13 reads PYTORCH_CUDA_ALLOC_CONF and ignores PYTORCH_ALLOC_CONF (run and verified)
    (
        {"PYTORCH_ALLOC_CONF": "expandable_segments:True", "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"},
        {"GD-ALLOC-001": PASS, "GD-ALLOC-002": WARN},
    ),
    (
        {"PYTORCH_ALLOC_CONF": "expandable_segments:True", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        {"GD-ALLOC-002": PASS},
    ),
    # PYTORCH_NO_CUDA_MEMORY_CACHING: torch >= 2.7 reads the value (pytorch#145905)
    ({"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, {"GD-ALLOC-003": WARN}),
    ({"PYTORCH_NO_CUDA_MEMORY_CACHING": "0"}, {"GD-ALLOC-003": PASS}),
    # CUDA debug switches (CUDA Programming Guide, "CUDA Environment Variables")
    ({"CUDA_LAUNCH_BLOCKING": "0"}, {"GD-ALLOC-004": PASS}),
    ({"CUDA_LAUNCH_BLOCKING": "1"}, {"GD-ALLOC-004": WARN}),
    ({"CUDA_LAUNCH_BLOCKING": "true"}, {"GD-ALLOC-004": INFO}),  # CUDA documents only 0 and 1
    ({"TORCH_USE_CUDA_DSA": "1"}, {"GD-ALLOC-005": INFO}),  # a build flag: nothing reads it at run time
    ({"CUDA_MODULE_LOADING": "LAZY"}, {"GD-ALLOC-006": PASS}),
    ({"CUDA_MODULE_LOADING": "EAGER"}, {"GD-ALLOC-006": INFO}),
    (
        {"CUDA_INJECTION64_PATH": "/opt/nvidia/nsight-systems/2024.1.1/target-linux-x64/libToolsInjection64.so"},
        {"GD-ALLOC-006": WARN},
    ),
    # TORCH_DISTRIBUTED_DEBUG: c10d/debug.cpp upper-cases the value and raises on anything else
    ({"TORCH_DISTRIBUTED_DEBUG": "OFF"}, {"GD-ALLOC-006": PASS}),
    ({"TORCH_DISTRIBUTED_DEBUG": "INFO"}, {"GD-ALLOC-006": PASS}),
    ({"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, {"GD-ALLOC-006": WARN}),
    ({"TORCH_DISTRIBUTED_DEBUG": "detail"}, {"GD-ALLOC-006": WARN}),
    ({"TORCH_DISTRIBUTED_DEBUG": "1"}, {"GD-ALLOC-006": FAIL}),
    ({"TORCH_SHOW_CPP_STACKTRACES": "1", "TORCH_CPP_LOG_LEVEL": "INFO"}, {"GD-ALLOC-006": PASS, "GD-NCCL-006": PASS}),
    # NCCL_DEBUG: src/debug.cc compares case-insensitively
    ({"NCCL_DEBUG": "WARN"}, {"GD-NCCL-005": PASS, "GD-NCCL-006": PASS}),
    ({"NCCL_DEBUG": "VERSION"}, {"GD-NCCL-005": PASS, "GD-NCCL-006": PASS}),
    ({"NCCL_DEBUG": "INFO"}, {"GD-NCCL-005": INFO, "GD-NCCL-006": PASS}),
    ({"NCCL_DEBUG": "info"}, {"GD-NCCL-005": INFO, "GD-NCCL-006": PASS}),
    ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}, {"GD-NCCL-005": INFO}),
    ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "ALL"}, {"GD-NCCL-005": WARN}),
    ({"NCCL_DEBUG": "1"}, {"GD-NCCL-006": WARN}),
    # NCCL integers go through strtoll: 'true' is 0 (src/misc/param.cc)
    ({"NCCL_IB_DISABLE": "1"}, {"GD-NCCL-006": PASS}),
    ({"NCCL_IB_DISABLE": "true"}, {"GD-NCCL-006": WARN}),
    ({"NCCL_BUFFSIZE": "4MB"}, {"GD-NCCL-006": WARN}),
    ({"NCCL_CROSS_NIC": "1", "NCCL_NVLS_ENABLE": "0", "NCCL_NET_GDR_LEVEL": "PHB"}, {"GD-NCCL-006": PASS}),
    # NCCL_P2P_LEVEL: case-sensitive names or a legacy number (src/graph/paths.cc ncclGetLevel)
    ({"NCCL_P2P_LEVEL": "NVL"}, {"GD-NCCL-006": PASS}),
    ({"NCCL_P2P_LEVEL": "SYS"}, {"GD-NCCL-006": PASS}),
    ({"NCCL_P2P_LEVEL": "5"}, {"GD-NCCL-006": PASS}),
    ({"NCCL_P2P_LEVEL": "nvl"}, {"GD-NCCL-006": WARN}),
    # NCCL_ALGO / NCCL_PROTO: src/graph/tuning.cc parseList, case-insensitive, '^' excludes
    ({"NCCL_ALGO": "Ring"}, {"GD-NCCL-006": PASS}),
    ({"NCCL_ALGO": "^NVLS"}, {"GD-NCCL-006": PASS}),
    ({"NCCL_ALGO": "allreduce:tree;broadcast:ring"}, {"GD-NCCL-006": PASS}),
    ({"NCCL_PROTO": "^LL128"}, {"GD-NCCL-006": PASS}),
    ({"NCCL_ALGO": "Rings"}, {"GD-NCCL-006": WARN}),
    # torch's ProcessGroupNCCL: getCvarBool (y/yes/t/true/1, n/no/f/false/0, any case), getCvarInt (stoi)
    ({"TORCH_NCCL_BLOCKING_WAIT": "1"}, {"GD-NCCL-006": PASS}),
    ({"TORCH_NCCL_ENABLE_MONITORING": "0"}, {"GD-NCCL-006": PASS}),
    ({"TORCH_NCCL_ENABLE_MONITORING": "off"}, {"GD-NCCL-006": FAIL}),
    ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}, {"GD-NCCL-006": PASS}),
    ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "yes"}, {"GD-NCCL-006": FAIL}),
    ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "5"}, {"GD-NCCL-006": WARN}),  # cast without a check: no error
    # strtoll(value, NULL, 0): hex is read whole, a leading 0 is octal
    ({"NCCL_IB_DISABLE": "0x1"}, {"GD-NCCL-006": PASS}),
    ({"NCCL_BUFFSIZE": "0x800000"}, {"GD-NCCL-006": PASS}),
    ({"NCCL_IB_TIMEOUT": "022"}, {"GD-NCCL-006": WARN}),  # octal: 18, not 22
    # getCvarInt is std::stoi: beyond int it throws, and torch turns that into 'Invalid value'
    ({"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "99999999999"}, {"GD-NCCL-006": FAIL}),
    ({"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "1800"}, {"GD-NCCL-006": PASS}),
    # torch's env:// handler (torch/distributed/rendezvous.py): empty counts as unset; port 0..65535
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "", "MASTER_PORT": "29500"}, {"GD-DIST-001": WARN}),
    ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "localhost", "MASTER_PORT": "0"}, {"GD-DIST-002": PASS}),
    ({"RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "localhost", "MASTER_PORT": "0"}, {"GD-DIST-002": FAIL}),
    ({"MASTER_PORT": "29500 "}, {"GD-DIST-002": PASS}),  # int() strips blanks
]


def _live(env: dict, ids: list[str]) -> dict[str, str]:
    r = run_gpudoctor_here(
        "check", "--select", ",".join(ids), "--json", "--expect-gpus", "0", env=env, drop=SCRUB, cwd=ROOT
    )
    assert r.returncode in (0, 1), r.stderr
    return {f["id"]: f["severity"] for f in json.loads(r.stdout)["findings"]}


@torch_release_here(2, 13)
@pytest.mark.parametrize("env, expected", LIVE, ids=[" ".join(f"{k}={v}" for k, v in e.items()) for e, _ in LIVE])
def test_live_environment(env, expected):
    got = _live(env, sorted(expected))
    assert {k: got.get(k) for k in expected} == expected


# --- checks that need GPUs or interfaces: the healthy 8xH100 fixture ------------------------------

UUID = "GPU-5b1c2f3e-0000-4000-8000-00000000000"  # the fixture's GPUs end in 0..7
MULTI_NODE = {
    "SLURM_JOB_ID": "1",
    "SLURM_NNODES": "2",
    "SLURM_NTASKS": "16",
    "WORLD_SIZE": "16",
    "LOCAL_WORLD_SIZE": "8",
}

ON_FIXTURE = [
    # CUDA_VISIBLE_DEVICES as the CUDA driver reads it (and torch.cuda._parse_visible_devices mirrors)
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, {"GD-DEV-001": PASS, "GD-DEV-002": PASS}),
    ({"CUDA_VISIBLE_DEVICES": "0, 1"}, {"GD-DEV-001": PASS}),  # strtoul skips leading blanks
    ({"CUDA_VISIBLE_DEVICES": UUID + "3"}, {"GD-DEV-001": PASS, "GD-DEV-002": PASS}),
    ({"CUDA_VISIBLE_DEVICES": f"{UUID}5,{UUID}6"}, {"GD-DEV-001": PASS}),
    ({"CUDA_VISIBLE_DEVICES": "GPU-5b1c2f3e"}, {"GD-DEV-001": FAIL}),  # a prefix of all 8: ambiguous
    ({"CUDA_VISIBLE_DEVICES": "-1"}, {"GD-DEV-001": FAIL, "GD-DEV-002": FAIL}),
    ({"CUDA_VISIBLE_DEVICES": "0,1,-1,2"}, {"GD-DEV-001": FAIL}),  # CUDA stops at -1 and drops 2
    ({"CUDA_VISIBLE_DEVICES": "0,9,1"}, {"GD-DEV-001": FAIL}),
    ({"CUDA_VISIBLE_DEVICES": "0,0"}, {"GD-DEV-001": FAIL}),
    ({"CUDA_VISIBLE_DEVICES": "0,1,"}, {"GD-DEV-001": INFO}),
    ({"CUDA_VISIBLE_DEVICES": "0-3"}, {"GD-DEV-001": FAIL}),  # strtoul reads 0: no ranges
    ({"CUDA_VISIBLE_DEVICES": "0 1 2 3"}, {"GD-DEV-001": FAIL}),  # blanks are no separator: GPU 0 alone
    ({"CUDA_VISIBLE_DEVICES": "1gpu,2"}, {"GD-DEV-001": INFO}),  # legal, if odd: 1 and 2
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7,8"}, {"GD-DEV-001": FAIL, "GD-DEV-002": PASS}),
    ({"CUDA_VISIBLE_DEVICES": ""}, {"GD-DEV-001": FAIL}),
    ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, {"GD-DEV-001": FAIL}),  # SLURM without gres File=
    ({"CUDA_VISIBLE_DEVICES": "all"}, {"GD-DEV-001": FAIL}),
    ({"CUDA_VISIBLE_DEVICES": "MIG-9f1d2c3b-aaaa-bbbb-cccc-0123456789ab"}, {"GD-DEV-001": FAIL}),  # no MIG here
    ({"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, {"GD-DEV-003": PASS}),
    ({"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, {"GD-DEV-003": PASS}),  # one GPU model: the orders agree
    # NCCL_SOCKET_IFNAME: prefixes, '^' excludes, '=' exact (the fixture has lo, eth0, ibp24s0)
    ({"NCCL_SOCKET_IFNAME": "eth0", **MULTI_NODE}, {"GD-NCCL-002": PASS}),
    ({"NCCL_SOCKET_IFNAME": "eth", **MULTI_NODE}, {"GD-NCCL-002": PASS}),
    ({"NCCL_SOCKET_IFNAME": "=eth0", **MULTI_NODE}, {"GD-NCCL-002": PASS}),
    ({"NCCL_SOCKET_IFNAME": "^docker0,lo", **MULTI_NODE}, {"GD-NCCL-002": PASS}),
    ({"NCCL_SOCKET_IFNAME": "ib", **MULTI_NODE}, {"GD-NCCL-002": PASS}),
    ({"NCCL_SOCKET_IFNAME": "=eth", **MULTI_NODE}, {"GD-NCCL-002": FAIL}),
    ({"NCCL_SOCKET_IFNAME": "ens", **MULTI_NODE}, {"GD-NCCL-002": FAIL}),
    ({"NCCL_SOCKET_IFNAME": "lo", **MULTI_NODE}, {"GD-NCCL-002": FAIL}),
    # NCCL_IB_HCA (mlx5_0..7 active) and NCCL_IB_DISABLE between nodes
    ({"NCCL_IB_HCA": "mlx5_0:1,mlx5_1:1", **MULTI_NODE}, {"GD-NCCL-003": PASS}),
    ({"NCCL_IB_HCA": "^mlx5_2", **MULTI_NODE}, {"GD-NCCL-003": PASS}),
    ({"NCCL_IB_HCA": "=mlx5_0", **MULTI_NODE}, {"GD-NCCL-003": PASS}),
    ({"NCCL_IB_HCA": "=mlx5", **MULTI_NODE}, {"GD-NCCL-003": WARN}),
    ({"NCCL_IB_DISABLE": "1", **MULTI_NODE}, {"GD-NCCL-003": WARN}),
    ({"NCCL_IB_DISABLE": "0", **MULTI_NODE}, {"GD-NCCL-003": PASS}),
    # P2P on the fixture's NVLink-connected H100s
    ({"NCCL_P2P_DISABLE": "1"}, {"GD-NCCL-004": WARN}),
    ({"NCCL_P2P_DISABLE": "0"}, {"GD-NCCL-004": PASS}),
    ({"NCCL_P2P_LEVEL": "NVL"}, {"GD-NCCL-004": PASS}),
    ({"NCCL_P2P_LEVEL": "0"}, {"GD-NCCL-004": WARN}),  # legacy 0 = LOC: P2P off
]


@pytest.mark.parametrize(
    "env, expected", ON_FIXTURE, ids=[" ".join(f"{k}={v}" for k, v in e.items()) for e, _ in ON_FIXTURE]
)
def test_on_the_healthy_fixture(env, expected):
    facts = make_facts(env={"PATH": "/usr/bin", **env})
    got = {cid: max(run(cid, facts), key=lambda f: f.severity.rank).severity.value for cid in expected}
    assert got == expected


def test_findings_name_their_evidence_and_a_fix():
    """Every non-pass verdict names the variable it is about and, where one exists, a fix."""
    facts = make_facts(env={"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "0,1,-1,2"})
    (f,) = run("GD-DEV-001", facts)
    assert f.severity is Severity.FAIL and "'2'" in said(f) and f.fix is not None
    got = _live({"TORCH_DISTRIBUTED_DEBUG": "1"}, ["GD-ALLOC-006"])
    assert got == {"GD-ALLOC-006": FAIL}


@torch_release_here(2, 13)
def test_both_allocator_variables_on_torch_2_13_name_the_one_it_reads():
    # torch 2.13 itself: _accelerator_getAllocatorSettings() returns the PYTORCH_CUDA_ALLOC_CONF value
    env = {"PYTORCH_ALLOC_CONF": "expandable_segments:True", "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}
    r = run_gpudoctor_here("check", "--select", "GD-ALLOC-002", "--json", env=env, drop=SCRUB, cwd=ROOT)
    (f,) = json.loads(r.stdout)["findings"]
    assert f["severity"] == WARN and "ignores PYTORCH_ALLOC_CONF" in said(f)
