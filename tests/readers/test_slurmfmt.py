"""SLURM's text formats, parsed exactly as SLURM writes them."""

import pytest

from gpudoctor.readers import slurmfmt
from gpudoctor.readers.slurmfmt import (
    GpuRequest,
    SlurmFormatError,
    expand_nodelist,
    parse_gpu_env,
    parse_gpus,
    parse_gres,
    parse_index_list,
    parse_int,
    parse_tasks_per_node,
    split_top_level,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("8", [8]),
        ("2(x3),1", [2, 2, 2, 1]),
        ("4(x2)", [4, 4]),
        ("1,2,3", [1, 2, 3]),
        (" 2 ( x 2 ) , 1 ", [2, 2, 1]),
        ("72(x2)", [72, 72]),  # SLURM_JOB_CPUS_PER_NODE uses the same format
    ],
)
def test_tasks_per_node(text, expected):
    assert parse_tasks_per_node(text) == expected


@pytest.mark.parametrize("text", ["", "x", "2(x)", "2(3)", "2(x0)", "2,,1", "-1", "2(x3"])
def test_tasks_per_node_rejects_malformed(text):
    with pytest.raises(SlurmFormatError):
        parse_tasks_per_node(text)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("node1", ["node1"]),
        ("gpu[01-04,07],cpu1", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu1"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[008-010]", ["n008", "n009", "n010"]),
        ("rack[1-2]-node[01-02]", ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]),
        ("a[3],b[1-2]ib", ["a3", "b1ib", "b2ib"]),
    ],
)
def test_expand_nodelist(text, expected):
    assert expand_nodelist(text) == expected


@pytest.mark.parametrize("text", ["", "gpu[01-", "gpu]01[", "gpu[4-2]", "gpu[a-b]", "a,,b", "gpu[1-2"])
def test_nodelist_rejects_malformed(text):
    with pytest.raises(SlurmFormatError):
        expand_nodelist(text)


def test_index_lists():
    assert parse_index_list("0,1,2,3") == [0, 1, 2, 3]
    assert parse_index_list("0-3,5") == [0, 1, 2, 3, 5]
    with pytest.raises(SlurmFormatError):
        parse_index_list("0,a")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("gpu:h200:1", GpuRequest(1, "h200")),
        ("gpu:8", GpuRequest(8)),
        ("gpu", GpuRequest(1)),
        ("gpu:h100", GpuRequest(1, "h100")),
        ("gpu:a100:2(IDX:0-1)", GpuRequest(2, "a100", (0, 1))),
        ("gpu(IDX:0,2)", GpuRequest(2, None, (0, 2))),
        ("gres:gpu:h200:1", GpuRequest(1, "h200")),  # scontrol's TresPerNode
        ("gres/gpu:h100=4", GpuRequest(4, "h100")),  # TRES form
        ("gpu:1,nic:2", GpuRequest(1)),
        ("nic:2,gpu:a100_80gb:4", GpuRequest(4, "a100_80gb")),
        ("gpu:a100:2,gpu:v100:1", GpuRequest(3, None)),
    ],
)
def test_parse_gres(text, expected):
    assert parse_gres(text) == expected


@pytest.mark.parametrize("text", ["nic:2", "none", "", None])
def test_gres_without_gpu(text):
    assert parse_gres(text) is None


@pytest.mark.parametrize("text", ["gpu:h100:x", "gpu:a:b:c:d", ":1"])
def test_gres_rejects_malformed(text):
    with pytest.raises(SlurmFormatError):
        parse_gres(text)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("4", GpuRequest(4)),
        ("h100:4", GpuRequest(4, "h100")),
        ("gpu:h100:4", GpuRequest(4, "h100")),
        ("a100:2,v100:1", GpuRequest(3, None)),
        ("h200", GpuRequest(1, "h200")),
    ],
)
def test_parse_gpus(text, expected):
    assert parse_gpus(text) == expected


def test_gpu_env_variables_follow_their_own_formats():
    assert parse_gpu_env("SLURM_JOB_GPUS", "0,1,2,3") == GpuRequest(4, None, (0, 1, 2, 3))
    assert parse_gpu_env("SLURM_STEP_GPUS", "4-7") == GpuRequest(4, None, (4, 5, 6, 7))
    assert parse_gpu_env("SLURM_GPUS_ON_NODE", "8") == GpuRequest(8)
    assert parse_gpu_env("SLURM_GPUS_PER_NODE", "h200:4") == GpuRequest(4, "h200")
    with pytest.raises(SlurmFormatError, match="SLURM_GPUS_ON_NODE"):
        parse_gpu_env("SLURM_GPUS_ON_NODE", "eight")


def test_parse_int_and_split():
    assert parse_int(" 8 ") == 8
    with pytest.raises(SlurmFormatError):
        parse_int("8x", "SLURM_NTASKS")
    with pytest.raises(SlurmFormatError):
        parse_int("0", "nodes", minimum=1)
    assert split_top_level("a[1,2],b(IDX:0,1),c") == ["a[1,2]", "b(IDX:0,1)", "c"]


# ---------------------------------------------------------------- scontrol show job -d (gpudoctor watch)

# As slurm-wlm 22.05 printed it for a running job on the test cluster (tests/watch/test_watch_slurm.py), cut;
# the second job's detail lines are constructed in the same format for two nodes with different GPUs.
SHOW_JOB = """\
JobId=1 JobName=one.sh
   UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A
   JobState=RUNNING Reason=None Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0
   NodeList=gdw23022
   NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   JOB_GRES=gpu:h200:8
     Nodes=gdw23022 CPU_IDs=255 Mem=0 GRES=gpu:h200:8(IDX:0-7)
   MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0
   Command=/home/alice/my jobs/one.sh
   WorkDir=/home/alice
   TresPerNode=gres:gpu:8
"""
SHOW_TWO_NODES = """\
JobId=77 JobName=train
   UserId=bob(1001) GroupId=bob(1001) MCS_label=N/A
   JobState=RUNNING Reason=None Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=0 Reboot=0 ExitCode=0:0
   NodeList=gpu[01-02]
     Nodes=gpu01 CPU_IDs=0-7 Mem=0 GRES=gpu:a100:4(IDX:0-3)
     Nodes=gpu02 CPU_IDs=0-7 Mem=0 GRES=gpu:a100:2(IDX:2,5),nic:1(IDX:0)
   Command=(null)
"""


def test_job_detail_reads_nodes_gpu_indices_and_the_script():
    d = slurmfmt.job_detail(SHOW_JOB)
    assert (d.job_id, d.state, d.user, d.batch) == ("1", "RUNNING", "alice", True)
    assert d.nodes == ("gdw23022",) and d.gpus == {"gdw23022": (0, 1, 2, 3, 4, 5, 6, 7)}
    assert d.command == "/home/alice/my jobs/one.sh"  # a path with a space: the rest of the line


def test_job_detail_reads_each_nodes_own_gpus():
    d = slurmfmt.job_detail(SHOW_TWO_NODES)
    assert d.nodes == ("gpu01", "gpu02") and d.gpus == {"gpu01": (0, 1, 2, 3), "gpu02": (2, 5)}
    assert d.batch is False and d.command is None


@pytest.mark.parametrize("text", ["", "slurm_load_jobs error: Invalid job id specified\n", "JobName=x\n"])
def test_job_detail_without_a_job_is_an_error(text):
    with pytest.raises(slurmfmt.SlurmFormatError):
        slurmfmt.job_detail(text)
