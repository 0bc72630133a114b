"""The watch judge (watch/judge.py) on data.

Recorded: tests/fixtures/watch/recorded-h200-nvml-trace-5-phases.jsonl, a real NVIDIA H200 (141 GB, driver 580.159.04)
sampled through nvidia-ml-py at 5 Hz (its phases: idle; one process of 8192x8192 bf16 matmuls; the same plus a
stray process; one process adding 2 GiB a second; one process holding 40 GiB and idle). Each phase is judged as
one window, the PIDs of the job being the ones the recording names for that phase.
Constructed: the process tables (PIDs, parents, command lines, environments) and the owners of other processes;
they follow what SLURM 22.05 sets (CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS, SLURM_JOB_GPUS) as the test cluster
shows it (tests/watch/test_watch_slurm.py), and what torchrun and Lightning set (LOCAL_RANK).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.model import Severity
from gpudoctor.watch.judge import judge, ranks_on, training_processes
from gpudoctor.watch.samples import GpuSample, GpuTrace, JobProcess, NodeObservation, read_trace

TRACE = Path(__file__).parents[1] / "fixtures" / "watch" / "recorded-h200-nvml-trace-5-phases.jsonl"
PY = "/usr/bin/python3"


def _phase(name: str) -> GpuTrace:
    """The first contiguous run of samples of one phase (the recording returns to idle at its end)."""
    trace, phases = read_trace(TRACE.read_text().splitlines())
    first = phases.index(name)
    end = next((i for i in range(first, len(phases)) if phases[i] != name), len(phases))
    return GpuTrace(**{**trace.__dict__, "samples": trace.samples[first:end]})


def _node(trace: GpuTrace | None, pids=(), others=None, allocated=(0,)) -> NodeObservation:
    procs = tuple(JobProcess(pid=p, ppid=1, cmdline=(PY, "train.py")) for p in pids)
    span = trace.samples[-1].t - trace.samples[0].t if trace else 30.0
    return NodeObservation("gpu01", allocated, procs, (trace,) if trace else (), others=others or {}, window_s=span)


def _problems(findings) -> dict:
    return {f.id: f for f in findings if f.severity not in (Severity.PASS, Severity.SKIP)}


# ---------------------------------------------------------------- recorded H200 trace


def test_idle_phase_names_the_allocated_gpu_no_process_uses():
    found = _problems(judge([_node(_phase("idle"))]))
    assert set(found) == {"GD-WATCH-001"}
    f = found["GD-WATCH-001"]
    assert f.severity is Severity.FAIL and f.evidence["unused"] == [0]
    assert "no process of the job had a context on it" in f.message and "(NVML)" in f.message


def test_training_at_the_software_power_cap_is_no_finding():
    trace = _phase("train")
    # the recording's own figures: SW power cap (0x4) at ~691 W of 700 with SM ~1485 of 1980 MHz
    busy = [s for s in trace.samples if (s.util_gpu or 0) >= 90]
    assert busy and all(s.clock_event_reasons in (0, 4) for s in busy)
    assert _problems(judge([_node(trace, pids=[445])])) == {}


def test_a_stray_second_process_is_named_with_pid_and_user():
    others = {480: {"user": "bob", "cmdline": ["python3", "stray.py"], "slurm_job": None}}
    found = _problems(judge([_node(_phase("train+stray"), pids=[445], others=others)]))
    assert set(found) == {"GD-WATCH-003"}
    f = found["GD-WATCH-003"]
    assert f.severity is Severity.WARN and f.evidence["pid"] == 480 and f.evidence["user"] == "bob"
    assert "PID 480 of user bob" in f.message and "kill 480" in f.fix.actions[0].target


def test_a_process_the_nodes_proc_cannot_see_is_said_so_not_blamed():
    found = _problems(judge([_node(_phase("train+stray"), pids=[445])]))
    f = found["GD-WATCH-003"]
    assert f.severity is Severity.INFO and "not visible in the node's /proc" in f.message and f.fix is None


def test_memory_creeping_is_named_with_its_slope_and_time_to_full():
    found = _problems(judge([_node(_phase("memory-creep"), pids=[510])]))
    assert set(found) == {"GD-WATCH-005"}
    f = found["GD-WATCH-005"]
    slope_gib = f.evidence["slope_bytes_per_s"] / 2**30
    assert 1.6 < slope_gib < 2.2, slope_gib  # the recording adds 2 GiB a second
    assert f.evidence["seconds_to_full"] < 120 and f.severity is Severity.WARN
    assert "GiB/s after warm-up" in f.message and "full in about" in f.message


def test_a_process_holding_40_gib_on_an_idle_gpu_is_named():
    found = _problems(judge([_node(_phase("idle-holding-memory"), pids=[543])]))
    assert set(found) == {"GD-WATCH-002"}
    f = found["GD-WATCH-002"]
    assert f.evidence["pid"] == 543 and f.evidence["used_memory_bytes"] > 39 * 2**30
    assert "py-spy dump --pid 543" in f.fix.actions[0].target


def test_every_phase_with_its_process_on_the_gpu_is_not_called_unused():
    for name, pid in (("train", 445), ("train+stray", 445), ("memory-creep", 510), ("idle-holding-memory", 543)):
        assert "GD-WATCH-001" not in _problems(judge([_node(_phase(name), pids=[pid])])), name


# ---------------------------------------------------------------- constructed: throttling


def _busy(n: int, clock: int, reasons: int = 4) -> tuple[GpuSample, ...]:
    return tuple(
        GpuSample(t=float(i), util_gpu=99, mem_used_bytes=40 * 2**30, sm_clock_mhz=clock, clock_event_reasons=reasons)
        for i in range(n)
    )


def _gpu(index: int, samples) -> GpuTrace:
    return GpuTrace(index, "H100", f"GPU-{index}", 1980, 700.0, 80 * 2**30, samples)


def _sampled(gpus: tuple[GpuTrace, ...]) -> NodeObservation:
    return NodeObservation("gpu01", tuple(g.index for g in gpus), (), gpus, window_s=20.0)


def test_a_thermal_slowdown_is_named_and_the_power_cap_is_not():
    hot = _gpu(0, _busy(20, 1200, reasons=0x4 | 0x40))
    capped = _gpu(1, _busy(20, 1485, reasons=0x4))
    found = [f for f in judge([_sampled((hot, capped))]) if f.id == "GD-WATCH-004"]
    problems = [f for f in found if f.severity is Severity.WARN]
    assert [f.evidence["gpu"] for f in problems] == [0]
    assert "hardware thermal slowdown" in problems[0].message


def test_a_gpu_far_below_the_others_clock_under_the_same_load_is_named():
    gpus = (_gpu(0, _busy(20, 1485)), _gpu(1, _busy(20, 1500)), _gpu(2, _busy(20, 1100)))
    node = _sampled(gpus)
    problems = [f for f in judge([node]) if f.id == "GD-WATCH-004" and f.severity is Severity.WARN]
    assert [f.evidence["gpu"] for f in problems] == [2]
    assert "SM clock 1100 MHz under full load" in problems[0].message


# ---------------------------------------------------------------- constructed: processes without NVML


def _proc(pid, ppid, cmd, **env) -> JobProcess:
    return JobProcess(pid=pid, ppid=ppid, cmdline=tuple(cmd.split()), env={k: str(v) for k, v in env.items()})


ALL8 = "0,1,2,3,4,5,6,7"


def _no_nvml(*procs, allocated=tuple(range(8))) -> NodeObservation:
    return NodeObservation("gpu01", allocated, procs, (), nvml_error="NVML: not found", window_s=30.0)


def test_one_python_that_sees_eight_gpus_leaves_seven_idle_by_convention_only():
    batch = _proc(100, 1, "/bin/bash /var/spool/slurm_script", CUDA_VISIBLE_DEVICES=ALL8, SLURM_JOB_GPUS=ALL8)
    train = _proc(101, 100, f"{PY} train.py", CUDA_VISIBLE_DEVICES=ALL8, SLURM_JOB_GPUS=ALL8)
    f = _problems(judge([_no_nvml(batch, train)]))["GD-WATCH-001"]
    # it can see them all: idle unless it drives several GPUs itself -- a premise not known, so a warn
    assert f.severity is Severity.WARN and f.evidence["unused"] == []
    assert f.evidence["unused_by_convention"] == [1, 2, 3, 4, 5, 6, 7]
    assert "unless the program drives several GPUs itself" in f.message
    assert "1 training process(es) where 8 were meant" in f.message
    assert "Python child process" not in f.message


def test_a_process_with_python_children_is_said_to_maybe_drive_the_other_gpus():
    # torch.multiprocessing.spawn's workers and DataLoader workers look alike in /proc (no LOCAL_RANK either)
    main = _proc(101, 100, f"{PY} main.py", CUDA_VISIBLE_DEVICES="0,1", SLURM_JOB_GPUS="0,1")
    child = _proc(102, 101, f"{PY} -c from multiprocessing.spawn import spawn_main", CUDA_VISIBLE_DEVICES="0,1")
    f = _problems(judge([_no_nvml(main, child, allocated=(0, 1))]))["GD-WATCH-001"]
    assert f.severity is Severity.WARN and f.evidence["unused_by_convention"] == [1]
    assert "1 Python child process(es): DataLoader workers, or workers of its own" in f.message


def test_torchrun_workers_with_local_ranks_use_every_gpu():
    agent = _proc(
        200,
        1,
        f"{PY} /usr/local/bin/torchrun --nproc-per-node=8 train.py",
        CUDA_VISIBLE_DEVICES=ALL8,
        SLURM_STEP_GPUS=ALL8,
        SLURM_STEP_ID="0",
    )
    workers = [
        _proc(
            201 + r,
            200,
            f"{PY} -u train.py",
            CUDA_VISIBLE_DEVICES=ALL8,
            SLURM_STEP_GPUS=ALL8,
            LOCAL_RANK=r,
            SLURM_STEP_ID="0",
        )
        for r in range(8)
    ]
    # DataLoader workers: children of a rank with its LOCAL_RANK, helpers, not ranks
    loaders = [_proc(300 + r, 201 + r, f"{PY} -u train.py", CUDA_VISIBLE_DEVICES=ALL8, LOCAL_RANK=r) for r in range(8)]
    node = _no_nvml(agent, *workers, *loaders)
    assert [p.pid for p in training_processes(node.processes)] == list(range(201, 209))
    assert [r.runs_on for r in ranks_on(node)] == list(range(8))
    assert "GD-WATCH-001" not in _problems(judge([node]))


def test_torchrun_with_too_few_workers_names_the_gpus_left():
    agent = _proc(200, 1, "torchrun --nproc-per-node=2 train.py", CUDA_VISIBLE_DEVICES=ALL8, SLURM_JOB_GPUS=ALL8)
    workers = [_proc(201 + r, 200, f"{PY} train.py", CUDA_VISIBLE_DEVICES=ALL8, LOCAL_RANK=r) for r in range(2)]
    f = _problems(judge([_no_nvml(agent, *workers)]))["GD-WATCH-001"]
    assert f.evidence["unused_by_convention"] == [2, 3, 4, 5, 6, 7]


def test_lightning_children_with_their_own_local_rank_are_ranks():
    main = _proc(400, 1, f"{PY} fit.py", CUDA_VISIBLE_DEVICES="0,1", SLURM_JOB_GPUS="0,1")
    child = _proc(401, 400, f"{PY} fit.py", CUDA_VISIBLE_DEVICES="0,1", SLURM_JOB_GPUS="0,1", LOCAL_RANK=1)
    node = _no_nvml(main, child, allocated=(0, 1))
    assert [r.runs_on for r in ranks_on(node)] == [0, 1]
    assert "GD-WATCH-001" not in _problems(judge([node]))


def test_constrained_devices_number_from_zero_within_the_step():
    # GPUs 4-7 of the node; with ConstrainDevices SLURM writes 0-3 (local), which this task leader shows
    tasks = [
        _proc(500 + i, 1, f"{PY} train.py", CUDA_VISIBLE_DEVICES=str(i), SLURM_STEP_GPUS="4,5,6,7", SLURM_STEP_ID="0")
        for i in range(3)
    ]
    leader = _proc(499, 1, "/bin/bash x", CUDA_VISIBLE_DEVICES="0,1,2,3", SLURM_JOB_GPUS="4,5,6,7")
    node = _no_nvml(leader, *tasks, allocated=(4, 5, 6, 7))
    assert [r.sees for r in ranks_on(node)] == [(4,), (5,), (6,)]
    f = _problems(judge([node]))["GD-WATCH-001"]
    assert f.severity is Severity.FAIL and f.evidence["unused"] == [7]


def test_a_gpu_given_by_uuid_without_nvml_is_not_guessed():
    p = _proc(600, 1, f"{PY} train.py", CUDA_VISIBLE_DEVICES="GPU-abc", SLURM_JOB_GPUS="0,1")
    assert "GD-WATCH-001" not in _problems(judge([_no_nvml(p, allocated=(0, 1))]))


def test_a_node_without_training_processes_names_every_gpu():
    shell = _proc(700, 1, "/bin/bash script", CUDA_VISIBLE_DEVICES="0,1", SLURM_JOB_GPUS="0,1")
    f = _problems(judge([_no_nvml(shell, allocated=(0, 1))]))["GD-WATCH-001"]
    assert f.severity is Severity.FAIL and f.evidence["unused"] == [0, 1]
    assert "No training process of the job runs on this node" in f.message


def test_a_node_that_did_not_answer_is_a_fail_and_never_healthy():
    found = judge([NodeObservation("gpu02", (0, 1), error="the probe did not answer within 90 s")])
    by_id = {f.id: f for f in found}
    assert by_id["GD-WATCH-006"].severity is Severity.FAIL
    assert "could not observe" in by_id["GD-WATCH-006"].message
    assert all(f.severity is not Severity.PASS for f in found)


def test_without_nvml_the_rules_that_need_it_are_skipped_and_said():
    p = _proc(800, 1, f"{PY} train.py", CUDA_VISIBLE_DEVICES="0", SLURM_JOB_GPUS="0")
    by_id = {f.id: f for f in judge([_no_nvml(p, allocated=(0,))])}
    assert by_id["GD-WATCH-006"].severity is Severity.INFO
    assert by_id["GD-WATCH-001"].severity is Severity.PASS
    for fid in ("GD-WATCH-002", "GD-WATCH-003", "GD-WATCH-004", "GD-WATCH-005", "GD-WATCH-007"):
        assert by_id[fid].severity is Severity.SKIP


@pytest.mark.parametrize("name", ["idle", "train", "train+stray", "memory-creep", "idle-holding-memory"])
def test_a_trace_round_trips_through_the_probes_json(name):
    node = _node(_phase(name), pids=[445])
    again = NodeObservation.from_dict(node.to_dict())
    assert again == node


def test_a_step_given_two_of_four_gpus_leaves_two_unseen_and_one_by_convention():
    # as slurm-wlm 22.05 set it on the test cluster: a batch step holding GPUs 0-3, and `srun --gres=gpu:2 python`
    # whose task (started by slurmstepd, so its parent is no process of the job) got 0,1
    batch = _proc(900, 1, "/bin/bash slurm_script", CUDA_VISIBLE_DEVICES="0,1,2,3", SLURM_JOB_GPUS="0,1,2,3")
    srun = _proc(901, 900, "srun --gres=gpu:2 python3 -c pass", CUDA_VISIBLE_DEVICES="0,1,2,3")
    task = _proc(902, 880, f"{PY} -c pass", CUDA_VISIBLE_DEVICES="0,1", SLURM_STEP_GPUS="0,1", SLURM_STEP_ID="0")
    f = _problems(judge([_no_nvml(batch, srun, task, allocated=(0, 1, 2, 3))]))["GD-WATCH-001"]
    assert f.severity is Severity.FAIL
    assert f.evidence["unused"] == [2, 3] and f.evidence["unused_by_convention"] == [1]
    assert "was set by the job" not in f.message  # SLURM's own value for the step


def test_a_shell_or_srun_that_would_start_python_is_not_a_training_process():
    shell = _proc(950, 1, "bash -c python3 train.py", CUDA_VISIBLE_DEVICES="0,1", SLURM_JOB_GPUS="0,1")
    srun = _proc(951, 950, "srun python3 train.py", CUDA_VISIBLE_DEVICES="0,1", SLURM_JOB_GPUS="0,1")
    task = _proc(952, 880, f"{PY} train.py", CUDA_VISIBLE_DEVICES="1", SLURM_STEP_GPUS="0,1", SLURM_STEP_ID="0")
    assert [p.pid for p in training_processes((shell, srun, task))] == [952]


@pytest.mark.parametrize(
    "agent",
    [
        f"{PY} /usr/local/bin/torchrun --nproc-per-node=2 train.py",
        f"{PY} -m torch.distributed.run --nproc_per_node 2 train.py",
        f"{PY} /usr/local/bin/accelerate launch --num_processes 2 train.py",
        f"{PY} /usr/local/bin/deepspeed --num_gpus 2 train.py",
        f"{PY} /usr/local/bin/lightning run model --devices 2 train.py",
    ],
)
def test_launcher_agents_are_not_training_processes(agent):
    parent = _proc(10, 1, agent, CUDA_VISIBLE_DEVICES="0,1")
    workers = [_proc(11 + r, 10, f"{PY} train.py", CUDA_VISIBLE_DEVICES="0,1", LOCAL_RANK=r) for r in range(2)]
    assert [p.pid for p in training_processes((parent, *workers))] == [11, 12]


def test_a_gpu_held_by_a_process_proc_cannot_name_is_not_called_unused():
    # the recorded 40 GiB holder, seen from a container whose /proc shows neither it nor any process of the job
    found = _problems(judge([_node(_phase("idle-holding-memory"))]))
    assert "GD-WATCH-001" not in found
    assert found["GD-WATCH-003"].severity is Severity.INFO  # said, not blamed


# ---------------------------------------------------------------- constructed: waiting for input


def _loader_node(gpu_util: int, worker_cpu_s: float, rank_pid: int = 20) -> NodeObservation:
    samples = tuple(
        GpuSample(t=float(i), util_gpu=gpu_util, mem_used_bytes=30 * 2**30, processes=((rank_pid, 30 * 2**30),))
        for i in range(30)
    )
    rank = JobProcess(rank_pid, 1, None, (PY, "train.py"), {"CUDA_VISIBLE_DEVICES": "0"}, 12.0, 0.0)
    workers = tuple(
        JobProcess(rank_pid + 1 + w, rank_pid, None, (PY, "train.py"), {}, worker_cpu_s, 0.0) for w in range(4)
    )
    return NodeObservation("gpu01", (0,), (rank, *workers), (_gpu(0, samples),), window_s=30.0)


def test_a_gpu_waiting_for_saturated_loader_workers_is_named():
    found = _problems(judge([_loader_node(gpu_util=30, worker_cpu_s=29.0)]))
    f = found["GD-WATCH-007"]
    assert f.evidence["pid"] == 20 and f.evidence["median_util_pct"] == 30
    assert "4 Python child process(es) of PID 20 (DataLoader workers) each used 97% of a core" in f.message


def test_a_busy_gpu_or_idle_workers_is_not_input_bound():
    assert "GD-WATCH-007" not in _problems(judge([_loader_node(gpu_util=95, worker_cpu_s=29.0)]))
    assert "GD-WATCH-007" not in _problems(judge([_loader_node(gpu_util=30, worker_cpu_s=3.0)]))


PY_SPY = """Process 543: /usr/bin/python3 train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 543 (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:2501)
    step (train.py:40)
    <module> (train.py:77)
"""


def test_a_held_idle_process_is_named_with_its_stack_and_its_flight_recorder_dump():
    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/scratch/fr/rank_"}
    proc = JobProcess(543, 1, None, (PY, "train.py"), env, cpu_seconds=10.1, cpu_seconds_start=10.0, stack=PY_SPY)
    trace = _phase("idle-holding-memory")
    node = NodeObservation("gpu01", (0,), (proc,), (trace,), window_s=23.0)
    f = _problems(judge([node]))["GD-WATCH-002"]
    assert "no progress on the CPU either: stuck" in f.message
    assert "its stack (py-spy) is in all_reduce (torch/distributed/distributed_c10d.py:2501)" in f.message
    assert "its flight recorder dumps to /scratch/fr/rank_<rank>" in f.message
    assert f.evidence["stack"] == PY_SPY


# ---------------------------------------------------------------- constructed: a job that makes no progress


def _stuck(pid: int, rank: int, stack: str | None, cpu: float = 0.1) -> JobProcess:
    env = {"RANK": str(rank), "CUDA_VISIBLE_DEVICES": str(rank), "SLURM_JOB_GPUS": "0,1"}
    return JobProcess(pid, 1, None, (PY, "train.py"), env, cpu_seconds=cpu, cpu_seconds_start=0.0, stack=stack)


def _stack(pid: int, frame: str) -> str:
    return f'Thread {pid} (idle): "MainThread"\n    {frame}\n    step (train.py:40)\n'


def test_the_rank_the_others_wait_for_is_named_from_the_stacks():
    waiting = _stuck(10, 0, _stack(10, "all_reduce (torch/distributed/distributed_c10d.py:2501)"))
    culprit = _stuck(11, 1, _stack(11, "load_shard (data.py:12)"))
    node = NodeObservation("gpu01", (0, 1), (waiting, culprit), (), nvml_error="NVML: none", window_s=30.0)
    f = _problems(judge([node]))["GD-WATCH-008"]
    assert f.severity is Severity.WARN and f.evidence["not_in_collective"] == [11]
    assert "gpu01 PID 11 (rank 1) is not in a collective (in load_shard (data.py:12))" in f.message
    assert "1 other(s) wait in one" in f.message and f.fix.actions[0].target == "py-spy dump --pid 11"


def test_no_progress_without_stacks_is_not_called_a_hang_and_says_how_to_tell():
    # a job of sleeping processes (as test jobs are) is not named: without stacks a hang looks like a pause
    node = NodeObservation("gpu01", (0, 1), (_stuck(10, 0, None), _stuck(11, 1, None)), (), window_s=30.0)
    (f,) = [f for f in judge([node]) if f.id == "GD-WATCH-008"]
    assert f.severity is Severity.SKIP and "install py-spy on the nodes" in f.message
    sleeping = _stuck(12, 0, _stack(12, "<module> (<string>:1)"))
    node = NodeObservation("gpu01", (0,), (sleeping,), (), window_s=30.0)
    (f,) = [f for f in judge([node]) if f.id == "GD-WATCH-008"]
    assert f.severity is Severity.SKIP and "none is in a torch.distributed collective" in f.message


def test_every_rank_waiting_in_a_collective_is_a_hang_without_a_named_culprit():
    frame = "all_reduce (torch/distributed/distributed_c10d.py:2501)"
    node = NodeObservation("gpu01", (0, 1), (_stuck(10, 0, _stack(10, frame)), _stuck(11, 1, _stack(11, frame))))
    node = NodeObservation(**{**node.__dict__, "window_s": 30.0})
    f = _problems(judge([node]))["GD-WATCH-008"]
    assert f.evidence["not_in_collective"] == [] and "a hang, or a slow collective" in f.message


def test_a_process_at_work_or_a_short_window_is_no_hang():
    busy = NodeObservation("gpu01", (0, 1), (_stuck(10, 0, None), _stuck(11, 1, None, cpu=20.0)), (), window_s=30.0)
    short = NodeObservation("gpu01", (0, 1), (_stuck(10, 0, None), _stuck(11, 1, None)), (), window_s=5.0)
    for node in (busy, short):
        assert "GD-WATCH-008" not in _problems(judge([node]))


def test_a_gpu_at_work_is_no_hang_even_with_idle_cpus():
    # a blocking CUDA sync leaves the CPU idle while the GPU computes
    samples = tuple(GpuSample(t=float(i), util_gpu=99, processes=((10, 2**30),)) for i in range(30))
    node = NodeObservation("gpu01", (0,), (_stuck(10, 0, None),), (_gpu(0, samples),), window_s=30.0)
    assert "GD-WATCH-008" not in _problems(judge([node]))


# ---------------------------------------------------------------- the in-process Monitor's heartbeat, read from outside


def _beating(pid: int, rank: int, age_s: float, cpu: float, window_s: float = 5.0) -> JobProcess:
    beat = {"step": 120, "age_s": age_s, "window_s": window_s, "closed": False}
    return JobProcess(**{**_stuck(pid, rank, None, cpu=cpu).__dict__, "heartbeat": beat})


def test_a_stalled_heartbeat_is_a_hang_even_when_the_processes_spin():
    # NCCL's progress thread keeps a core busy in a hung collective: CPU time cannot tell, the loop's heartbeat can
    ranks = (_beating(10, 0, age_s=40.0, cpu=29.0), _beating(11, 1, age_s=41.0, cpu=29.5))
    f = _problems(judge([NodeObservation("gpu01", (0, 1), ranks, (), window_s=30.0)]))["GD-WATCH-008"]
    assert f.severity is Severity.WARN and f.evidence["stalled"] == [10, 11]
    assert "gpu01 PID 10 (rank 0) counted no step for 40 s (last at step 120" in f.message


def test_a_fresh_heartbeat_is_no_hang_however_idle_the_processes_look():
    ranks = (_beating(10, 0, age_s=3.0, cpu=0.1), _beating(11, 1, age_s=4.0, cpu=0.1))
    assert "GD-WATCH-008" not in _problems(judge([NodeObservation("gpu01", (0, 1), ranks, (), window_s=30.0)]))


def test_the_node_probe_reads_the_heartbeat_the_monitor_writes(tmp_path):
    import json
    import os
    import time

    from gpudoctor.watch.node import read_heartbeat

    me = JobProcess(os.getpid(), env={"TMPDIR": str(tmp_path)})
    assert read_heartbeat(me) is None  # no Monitor in this process
    folder = tmp_path / f"gpudoctor-{os.getuid()}"
    folder.mkdir()
    beat = {"pid": os.getpid(), "rank": 0, "step": 7, "time": time.time() - 12, "window_s": 5.0, "closed": False}
    (folder / f"heartbeat-{os.getpid()}.json").write_text(json.dumps(beat))
    got = read_heartbeat(me)
    assert got is not None and got["step"] == 7 and 11 < got["age_s"] < 60 and got["window_s"] == 5.0
    assert JobProcess.from_dict(JobProcess(**{**me.__dict__, "heartbeat": got}).to_dict()).heartbeat == got
