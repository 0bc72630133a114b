from gpudoctor.model import Severity
from gpudoctor.probe import host as hostprobe
from tests.factsutil import RECORDED_CPU, make_facts, run, severity

DOCKER = "synthetic-docker-rtx4090-defaults"
GIB = 1 << 30


# --- GD-HOST-001 host-ram-too-small -------------------------------------------------------------


def test_container_memory_limit_below_gpu_memory_warns():
    (f,) = run("GD-HOST-001", make_facts(DOCKER))
    assert f.severity is Severity.WARN
    assert "cgroup memory limit" in f.message and "16 GiB" in f.message and "24 GiB" in f.message


def test_physical_ram_counts_when_no_limit():
    f = make_facts(DOCKER, patch={"host.container.memory_limit_bytes": None})
    (finding,) = run("GD-HOST-001", f)
    assert finding.severity is Severity.PASS and "physical RAM" in finding.message


def test_slurm_mem_limit_on_big_node_warns():
    # 2 TiB node, but the job's cgroup (SLURM --mem=256G) holds less than 8x80 GB of GPU memory
    f = make_facts(patch={"host.container.memory_limit_bytes": 256 * GIB})
    assert severity("GD-HOST-001", f) is Severity.WARN


def test_only_the_jobs_gpus_count():
    f = make_facts(env={"CUDA_VISIBLE_DEVICES": "0,1"}, patch={"host.container.memory_limit_bytes": 256 * GIB})
    assert severity("GD-HOST-001", f) is Severity.PASS  # 256 GiB for 2 x 80 GB


def test_big_node_passes_and_cpu_job_skips():
    assert severity("GD-HOST-001", make_facts()) is Severity.PASS
    assert severity("GD-HOST-001", make_facts(RECORDED_CPU), expect_gpus=0) is Severity.SKIP


# --- GD-HOST-002 shm-too-small ------------------------------------------------------------------


def test_docker_default_shm_warns_with_shm_size_fix():
    (f,) = run("GD-HOST-002", make_facts(DOCKER))
    assert f.severity is Severity.WARN and "64 MiB" in f.message and "Docker's default" in f.message
    assert any("--shm-size" in a.target for a in f.fix.actions)


def test_nearly_full_shm_warns():
    f = make_facts(patch={"host.shm": {"total_bytes": 32 * GIB, "free_bytes": 100 << 20}})
    assert severity("GD-HOST-002", f) is Severity.WARN


def test_missing_shm_warns():
    assert severity("GD-HOST-002", make_facts(patch={"host.shm": None})) is Severity.WARN


def test_large_shm_passes():
    assert severity("GD-HOST-002", make_facts()) is Severity.PASS
    assert severity("GD-HOST-002", make_facts(RECORDED_CPU)) is Severity.PASS


# --- GD-HOST-003 memlock-limited-with-infiniband ------------------------------------------------


def test_limited_memlock_with_active_infiniband_warns():
    f = make_facts(patch={"host.ulimits.memlock_soft": 65536, "host.ulimits.memlock_hard": 65536})
    (finding,) = run("GD-HOST-003", f)
    assert finding.severity is Severity.WARN and "64 KiB" in finding.message
    assert any("memlock" in a.target for a in finding.fix.actions)


def test_limited_memlock_without_infiniband_is_fine():
    assert severity("GD-HOST-003", make_facts(DOCKER)) is Severity.PASS  # 8 MiB memlock, no IB ports
    assert severity("GD-HOST-003", make_facts(RECORDED_CPU)) is Severity.PASS


def test_limited_memlock_with_only_inactive_ports_is_fine():
    ports = [
        {
            "device": "mlx5_0",
            "port": 1,
            "state": "DOWN",
            "phys_state": "Disabled",
            "rate": None,
            "link_layer": "InfiniBand",
        }
    ]
    f = make_facts(patch={"host.ulimits.memlock_soft": 65536, "network.infiniband": ports})
    assert severity("GD-HOST-003", f) is Severity.PASS


def test_unlimited_memlock_passes():
    assert severity("GD-HOST-003", make_facts()) is Severity.PASS


# --- the host probe -----------------------------------------------------------------------------


def test_cgroup_dirs_walk_up_from_the_jobs_cgroup(monkeypatch):
    cgroup = "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n"
    monkeypatch.setattr(hostprobe, "_read", lambda path: cgroup if path == "/proc/self/cgroup" else None)
    dirs = hostprobe._own_cgroup_dirs()
    assert dirs[0] == "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_42/step_0/user/task_0"
    assert "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_42" in dirs and dirs[-1] == "/sys/fs/cgroup"


def test_cgroup_limit_is_the_tightest_on_the_path(monkeypatch):
    files = {
        "/proc/self/cgroup": "0::/slurm/job_42/step_0\n",
        "/sys/fs/cgroup/slurm/job_42/step_0/memory.max": "max",
        "/sys/fs/cgroup/slurm/job_42/memory.max": str(256 * GIB),
        "/sys/fs/cgroup/slurm/memory.max": "max",
        "/sys/fs/cgroup/slurm/job_42/cpu.max": "1600000 100000",
    }
    monkeypatch.setattr(hostprobe, "_read", files.get)
    assert hostprobe._cgroup_limits() == {"memory_limit_bytes": 256 * GIB, "cpu_limit": 16.0}


def test_cgroup_v1_job_memory_limit(monkeypatch):
    files = {
        "/proc/self/cgroup": "11:memory:/slurm/uid_0/job_7/step_0\n4:cpu,cpuacct:/slurm/uid_0/job_7/step_0\n",
        "/sys/fs/cgroup/memory/slurm/uid_0/job_7/memory.limit_in_bytes": str(64 * GIB),
        "/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712",
        "/sys/fs/cgroup/cpu,cpuacct/slurm/uid_0/job_7/cpu.cfs_quota_us": "-1",
        "/sys/fs/cgroup/cpu,cpuacct/slurm/uid_0/job_7/cpu.cfs_period_us": "100000",
    }
    monkeypatch.setattr(hostprobe, "_read", files.get)
    assert hostprobe._cgroup_limits() == {"memory_limit_bytes": 64 * GIB, "cpu_limit": None}


def test_probe_runs_here():
    facts = hostprobe.probe()
    assert facts["mem_total_bytes"] > 0 and "memlock_soft" in facts["ulimits"]
