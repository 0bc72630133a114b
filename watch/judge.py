"""The pure judgement of `gpudoctor watch`: one node's observation (samples.NodeObservation) -> Findings.

judge() runs every rule; the rules live by topic, each module pure: processes.py (the job's training processes
and the GPUs each sees), unused.py (GD-WATCH-001), gpus.py (the NVML rules: 002, 003, 004, 005, 007), hang.py
(008), verdict.py (what they share); their names stay importable from here.

No I/O here: the node probe (node.py) and the command (cli.py) gather; these rules judge, so every rule runs on
recorded data in the tests (tests/fixtures/watch/: a real H200's NVML trace; constructed process tables).

The rules, and what they rest on:
- allocated GPUs no process of the job uses (GD-WATCH-001). With NVML: no process of the job has a context on
  the GPU in any sample (nvmlDeviceGetComputeRunningProcesses), its utilization stays at or below IDLE_UTIL, and
  nothing /proc cannot name holds it (a PID the node's /proc does not show, or HELD_BYTES held with no process
  listed): inside a container NVML lists host PIDs the job's /proc does not show, and a GPU at work is not
  idle whoever runs on it. Without NVML: what each training process can see -- its own CUDA_VISIBLE_DEVICES read
  as the CUDA driver reads it (readers/cudavis), counted against the GPUs its step holds (SLURM_STEP_GPUS, or
  SLURM_JOB_GPUS in the batch step). SLURM writes indices local to the step when devices are constrained
  (task/cgroup ConstrainDevices: physical 4,5 read 0,1) and the physical indices otherwise; which one a node
  uses is read from a task leader's own environment, where SLURM's value is still as SLURM wrote it. A GPU no
  training process can see is certainly unused; a GPU only a process that sees several can use is unused by
  convention (CUDA's current device is 0 until the program calls cudaSetDevice/torch.cuda.set_device; the
  launchers' convention is cuda:LOCAL_RANK), which the program may break by driving several GPUs itself: said
  so, and a warn rather than a fail.
- a training process is a Python process of the job that is not a launcher (torchrun, python -m
  torch.distributed.run/launch, accelerate launch, deepspeed: readers/sbatch/launch.describe_command reads their
  command lines) and whose parent is not another such process, or is a launcher, or gave it another LOCAL_RANK
  (Lightning's own launcher: the main process is local rank 0 and starts the others). Children with their
  parent's LOCAL_RANK are its helpers (DataLoader workers, compile workers).
- another process on a job's GPU (GD-WATCH-003): an NVML process that is none of the job's, named with the
  PID and the user /proc shows for it on the node.
- throttling that is a cause (GD-WATCH-004): NVML's clock event reasons (nvml.h nvmlClocksEventReason*, the same
  bits as probe/nvidia.THROTTLE_REASONS): thermal slowdowns, HW slowdown and the power brake, in CAUSE_SHARE of
  the samples or more; the software power cap is what a GPU at full load does (the recorded H200 at 691 W of
  700 with SM 1485 of 1980 MHz) and is not a cause. Also a GPU whose median SM clock under full load is below
  SLOW_CLOCK of the node's other GPUs under the same load, whatever the reason.
- memory creeping toward the limit (GD-WATCH-005): after the window's first WARMUP_SHARE, a straight-line fit of
  used memory with correlation >= CREEP_R, at least CREEP_MIN_STEPS rises and CREEP_MIN_BYTES in all; the slope
  and the time until the GPU is full at that rate.
- a GPU held but idle (GD-WATCH-002): a job process holds HELD_BYTES or more on a GPU whose utilization stays at
  or below IDLE_UTIL in IDLE_SHARE of the samples, and whose memory is not creeping: a hung or waiting rank.
- waiting for input (GD-WATCH-007): a training process's GPU (the one NVML lists it on) busy at most
  INPUT_GPU_UTIL % (median) while its Python children (DataLoader workers) each use INPUT_WORKER_SHARE of a core
  or more (median, CPU time over the window): the loader sets the pace. Without NVML, or without workers, not
  judged (a process loading in its own main thread looks like any CPU-bound process from outside).
- GD-WATCH-002 adds the process's innermost Python frame where the probe could take its stack (py-spy, for a
  Python process that used under 2 % of a core), and where PyTorch's flight recorder writes its dump when the
  job set one: TORCH_NCCL_TRACE_BUFFER_SIZE (or TORCH_FR_BUFFER_SIZE) > 0 turns the ring buffer on, and on a
  collective's timeout each rank writes to TORCH_NCCL_DEBUG_INFO_TEMP_FILE (TORCH_FR_DUMP_TEMP_FILE in newer
  releases) followed by its rank (PyTorch's torch_nccl_environment_variables page; torchtitan sets the prefix
  `<dir>/rank_`).
- a suspected hang (GD-WATCH-008): every training process of the job used under NO_PROGRESS_SHARE of a core for
  a window of HANG_MIN_WINDOW_S or more, no GPU sampled did work (a GPU at work may keep its process's CPU idle
  in a blocking sync), and the stacks (py-spy) show at least one main thread waiting in a torch.distributed
  collective; without that evidence a sleep, a pause or a wait for I/O look the same, and it is a skip that says
  so. The process the others wait for is the one whose main thread is not in a collective while others' are.
  A rank spinning in an NCCL collective uses its CPU (CUDA's spin wait) and its GPU (the NCCL kernel), so this
  rule does not see NCCL hangs; where the job runs gpudoctor.watch.Monitor its heartbeat does (hang.stalled_loop:
  no step for 3 of its windows is a hang however busy the CPUs; fresh heartbeats are no hang however idle).
- not observed (GD-WATCH-006): a node that did not answer is a fail ("could not observe", never healthy); a
  node without NVML is info, naming the rules that could not be judged there.
"""

from __future__ import annotations

from gpudoctor.model import Finding, Severity
from gpudoctor.watch.gpus import (  # noqa: F401  (the rules' names, importable from here)
    BUSY_UTIL,
    CAUSE_REASONS,
    CAUSE_SHARE,
    CREEP_MIN_BYTES,
    CREEP_MIN_STEPS,
    CREEP_R,
    IDLE_SHARE,
    INPUT_GPU_UTIL,
    INPUT_WORKER_SHARE,
    SLOW_CLOCK,
    WARMUP_SHARE,
    Creep,
    creep,
    foreign_processes,
    held_but_idle,
    memory_creeping,
    throttled,
    waits_for_input,
)
from gpudoctor.watch.hang import (  # noqa: F401
    FLIGHT_RECORDER,
    HANG_MIN_WINDOW_S,
    in_collective,
    innermost_frame,
    suspected_hang,
)
from gpudoctor.watch.processes import (  # noqa: F401
    LAUNCHER_SCRIPTS,
    Rank,
    local_numbering,
    ranks_on,
    training_processes,
    visible_gpus,
)
from gpudoctor.watch.samples import NodeObservation
from gpudoctor.watch.unused import CAUSE_CHECKS, overridden, unused_gpus  # noqa: F401
from gpudoctor.watch.verdict import (  # noqa: F401
    HELD_BYTES,
    IDLE_UTIL,
    MIN_SAMPLES,
    fix_line,
    join_fixes,
    make,
    sampled_traces,
)

NVML_RULES = ("GD-WATCH-002", "GD-WATCH-003", "GD-WATCH-004", "GD-WATCH-005", "GD-WATCH-007")


def not_observed(node: NodeObservation) -> Finding | None:
    if node.error is not None:
        return make(
            "GD-WATCH-006",
            Severity.FAIL,
            f"{node.node}: could not observe: {node.error}",
            None,
            node=node.node,
            error=node.error,
        )
    if node.allocated and not sampled_traces(node):
        why = node.nvml_error or "no NVML samples of its GPUs"
        return make(
            "GD-WATCH-006",
            Severity.INFO,
            f"{node.node}: GPU utilization, memory and clocks could not be read ({why}): its allocated GPUs are "
            "judged from the processes' own CUDA_VISIBLE_DEVICES only; held-but-idle, foreign processes, "
            "throttling, memory creep and waiting for input are not judged there",
            None,
            node=node.node,
            error=why,
            not_judged=list(NVML_RULES),
        )
    return None


def judge(nodes: list[NodeObservation], script_causes: list[Finding] | None = None) -> list[Finding]:
    """Every rule over every node, then a pass or skip for each verdict nothing was found for."""
    findings: list[Finding] = []
    for node in sorted(nodes, key=lambda n: n.node):
        for f in (not_observed(node), unused_gpus(node, script_causes)):
            if f is not None:
                findings.append(f)
        if node.observed:
            findings += held_but_idle(node) + foreign_processes(node) + throttled(node) + memory_creeping(node)
            findings += waits_for_input(node)
    hang = suspected_hang(nodes)
    if hang is not None:
        findings.append(hang)
    observed = [n for n in nodes if n.observed]
    sampled = [n for n in observed if sampled_traces(n)]
    found = {f.id for f in findings}
    gpus = sum(len(n.allocated) for n in observed)
    for fid in ("GD-WATCH-001", *NVML_RULES, "GD-WATCH-008", "GD-WATCH-006"):
        if fid in found:
            continue
        if fid == "GD-WATCH-008":
            judged = observed and all((n.window_s or 0) >= HANG_MIN_WINDOW_S for n in observed)
            findings.append(
                make(fid, Severity.PASS, "the job's processes made progress on the CPU or GPU")
                if judged
                else make(fid, Severity.SKIP, f"not judged: no node observed for {HANG_MIN_WINDOW_S:g} s or more")
            )
        elif fid == "GD-WATCH-006":
            findings.append(make(fid, Severity.PASS, f"all {len(nodes)} node(s) answered with NVML samples"))
        elif fid == "GD-WATCH-001" and observed:
            findings.append(
                make(fid, Severity.PASS, f"every allocated GPU is used ({gpus} on {len(observed)} node(s))")
            )
        elif sampled:
            findings.append(make(fid, Severity.PASS, f"nothing found on {len(sampled)} node(s) with NVML samples"))
        else:
            findings.append(make(fid, Severity.SKIP, "no NVML samples from any node"))
    return findings


# ---------------------------------------------------------------- words
