"""The verdicts of `gpudoctor watch`, registered like every check (source="watch"), declared as data.

`gpudoctor watch --job JOBID` observes a running job from outside (watch/: one probe per node inside the
job, NVML samples and the job's processes) and builds GD-WATCH-001 to 008 itself; the in-process monitor
(gpudoctor.watch.Monitor and its Lightning and Hugging Face callbacks) builds 009 to 011 (watch/verdict.make reads
each id's name, category and title from here). This table only documents them: `gpudoctor check` never runs them;
`gpudoctor list`, `explain` and docs/checks.md show them. Adding a verdict is adding a row. Categories are
those of the problem each verdict is about, as for the smoke verdicts.
"""

from __future__ import annotations

from gpudoctor.registry import Verdict, declare

WATCH_VERDICTS = (
    Verdict(
        id="GD-WATCH-001",
        scope="job",
        name="allocated-gpu-unused",
        category="slurm",
        title="Every GPU allocated to the running job is used by one of its processes",
        what="On every node of a running job, compares the GPUs SLURM allocated there (scontrol show job -d: "
        "GRES IDX) with the GPUs the job's processes use. With NVML: a GPU on which no process of the job has a "
        "context during the window and whose utilization stays at or below 5 %. Without NVML: the GPUs each of "
        "the job's training processes can see (its own CUDA_VISIBLE_DEVICES from /proc/PID/environ, mapped onto "
        "the allocation's indices) and the one it runs on by convention (cuda:LOCAL_RANK, else cuda:0). The "
        "likely cause is named from the processes (one process where the node has N GPUs) and, when SLURM still "
        "holds the batch script, from the batch script's own checks (GD-SLURM-003, GD-SLURM-010, GD-SLURM-005).",
        why="An allocated GPU that no process uses is paid for and wasted, and the job trains at a fraction of "
        "the speed it asked for without any error: the 8-GPU job that trains on one GPU for days.",
        fix="Start one process per GPU (srun with --ntasks-per-node equal to the GPUs per node, or torchrun "
        "--nproc-per-node); leave CUDA_VISIBLE_DEVICES to SLURM; or request only the GPUs the job uses. The "
        "finding carries the corrected batch-script lines when the batch script is known.",
    ),
    Verdict(
        id="GD-WATCH-002",
        scope="job",
        name="gpu-held-but-idle",
        category="distributed",
        title="No process of the job holds a GPU's memory while the GPU does nothing",
        what="With NVML: a GPU on which a process of the job holds device memory (1 GiB or more) while the GPU's "
        "utilization stays at or below 5 % in nine of ten samples of the window and its memory does not grow.",
        why="A rank that holds its model on the GPU but computes nothing is stuck (a hang in a collective, a "
        "deadlock, a rank waiting for another) or starved (input, checkpointing): every other rank of a "
        "synchronous job waits for it until NCCL's timeout.",
        fix="Dump the named process's stack (`py-spy dump --pid PID`), and with PyTorch's flight recorder "
        "(TORCH_NCCL_TRACE_BUFFER_SIZE) see which collective it waits in; a short pause (checkpoint, evaluation) "
        "shows as such in a longer window (`--for 2m`).",
    ),
    Verdict(
        id="GD-WATCH-003",
        scope="job",
        name="foreign-process-on-job-gpu",
        category="devices",
        title="No process outside the job runs on the job's GPUs",
        what="With NVML: the processes with a context on each of the job's GPUs during the window; one that is "
        "not a process of the job is named with its PID, user (from /proc on the node) and memory.",
        why="A second process on a training GPU takes its compute and memory: the rank on that GPU slows down "
        "(and every synchronous rank with it) or runs out of memory; on a shared node it is another user's job "
        "or a forgotten process of one's own.",
        fix="Stop the named process if it is yours (`kill PID`); otherwise ask the site to enforce exclusive GPUs "
        "(SLURM ConstrainDevices=yes, compute mode EXCLUSIVE_PROCESS) and exclude the node meanwhile.",
    ),
    Verdict(
        id="GD-WATCH-004",
        name="gpu-throttled-while-running",
        category="hardware",
        title="No GPU of the running job is slowed by heat, a hardware slowdown or a power brake",
        what="With NVML: over the window, each GPU's clock event reasons (thermal slowdown, hardware slowdown, "
        "power brake in a fifth of the samples or more; the software power cap at full load is normal and not "
        "counted) and its median SM clock under load against the node's other GPUs under the same load (below "
        "85 % of theirs).",
        why="A GPU slowed by heat or a power fault keeps working at a fraction of its speed, and every "
        "synchronous rank waits for it.",
        fix="Look at the named GPU's cooling and power (`nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER`); "
        "exclude the node (`sbatch --exclude=NODE`) until the site has looked at it.",
    ),
    Verdict(
        id="GD-WATCH-005",
        scope="job",
        name="gpu-memory-creeping",
        category="allocator",
        title="No GPU's memory keeps growing toward its limit after warm-up",
        what="With NVML: the used memory of each GPU over the window after its first quarter (warm-up), fitted "
        "with a straight line; a steady rise (correlation 0.9 or more, at least 64 MiB) is named with its slope "
        "and the time left until the GPU is full at that rate.",
        why="Memory that keeps growing in a steady state is a leak (tensors kept in a list, a growing cache, "
        "history kept with its graph): the job ends in an out-of-memory error hours in, losing the work since "
        "the last checkpoint.",
        fix="Find what keeps growing: `torch.cuda.memory._record_memory_history()` and a snapshot, or "
        "`torch.cuda.memory_summary()` at intervals; keep `.item()`/`.detach()` of logged losses, not the "
        "tensors.",
    ),
    Verdict(
        id="GD-WATCH-007",
        scope="job",
        name="gpu-waits-for-input",
        category="dataloader",
        title="No GPU of the running job waits for data while its loader's workers are saturated",
        what="With NVML and the job's processes: a training process whose GPU (the one NVML lists it on) is busy "
        "at most half the time over the window while its Python child processes (DataLoader workers) each used 90 % "
        "of a core or more (CPU time from /proc at the start and end of the window).",
        why="When the workers cannot produce batches as fast as the GPU consumes them, the GPU waits at every step: "
        "the job trains at the loader's speed, and a faster GPU would not help.",
        fix="Give the loader more workers where the job has CPUs to spare (--cpus-per-task, num_workers), make each "
        "batch cheaper (decode and augment once, offline; smaller images), and keep the workers alive "
        "(persistent_workers=True); `gpudoctor check --config` judges the loader settings against the CPUs.",
    ),
    Verdict(
        id="GD-WATCH-008",
        scope="job",
        name="job-made-no-progress",
        category="distributed",
        title="The running job's processes make progress",
        what="Every training process of the job (on every node that answered) used under 2 % of a core for the "
        "whole window (10 s or more), no GPU sampled did work, and their stacks (py-spy dump --nonblocking, taken "
        "where py-spy is installed on the nodes) show at least one main thread waiting in a torch.distributed "
        "collective; the process whose main thread is not in a collective while the others' are is named: the one "
        "they wait for. Without stacks a hang cannot be told from a pause or a sleep, and the verdict says so.",
        why="A synchronous job whose ranks all wait makes no progress until the collective's timeout (10 minutes "
        "for NCCL by default, 30 for gloo), and then fails with an error on the ranks that waited, not on the one "
        "that stopped; naming that one while it is stuck is what finds the cause.",
        fix="Read the named process's stack (`py-spy dump --pid PID`) and, after the timeout, the flight recorder's "
        "dump (TORCH_NCCL_TRACE_BUFFER_SIZE=2000 with TORCH_NCCL_DEBUG_INFO_TEMP_FILE set turns it on for the next "
        "run); a pause (a checkpoint write) shows as such in a longer window.",
    ),
    Verdict(
        id="GD-WATCH-006",
        scope="job",
        name="job-not-observed",
        category="job",
        title="Every node of the running job was observed",
        what="The probe gpudoctor runs on each node of the job (srun --overlap inside the job) must answer "
        "within the window plus a margin; a node that does not, or a signal that cannot be read there (NVML), "
        "is named as not observed. A job that ended during the window (its state in `scontrol show job` after "
        "it) is said to have ended, with its state and end time: a note when COMPLETED, a warn otherwise.",
        why="A node that cannot be observed is not a healthy node: it may be the one that hangs. Reporting it as "
        "such keeps the verdict honest.",
        fix="Run the probe by hand on that node (`srun --jobid JOB --overlap -w NODE python -m "
        "gpudoctor.watch.node --job JOB`) and read its error; NVML needs the NVIDIA driver on the node.",
    ),
    Verdict(
        id="GD-WATCH-009",
        scope="job",
        name="rank-slower-while-running",
        category="distributed",
        title="No rank of the running job is slower than the others window after window",
        what="Inside the job (gpudoctor.watch.Monitor, LightningCallback or HFCallback): every rank times each "
        "step's parts (waiting for data, forward+backward up to the end of the backward graph, the wait after it "
        "until backward() returns -- DDP's gradient all-reduce --, the rest), and every window each part's mean per "
        "step is exchanged on a separate gloo group. A rank whose own work (the step less its wait in the "
        "all-reduce) is at least 25 % and 1 ms above the median of the other ranks', while it waits less than they "
        "do, in 4 consecutive windows or more is named, with its host, GPU (local rank), the part that explains the "
        "gap and the ranks waiting for it; every rank's medians are in the evidence, named or not. In synchronous "
        "DDP every rank's step takes the same wall time: the culprit is the rank that waits least in the "
        "all-reduce. One slow window (a stall) is not a straggler.",
        why="In a synchronous job every step waits for the slowest rank: one slow GPU, a rank sharing its CPUs, or "
        "a slower input pipeline on one node sets the pace of all of them, and nothing in the logs says which.",
        fix="By the part named: forward+backward, look at that GPU (`gpudoctor watch --job JOBID`: throttling, "
        "another process) and exclude the node; data, its loader and the node's CPUs and storage; the rest, "
        "what else the rank does between steps (logging, checkpoints, CPU contention).",
    ),
    Verdict(
        id="GD-WATCH-010",
        scope="job",
        name="input-bound-steps",
        category="dataloader",
        title="No rank spends a large share of its step waiting for data",
        what="Inside the job (gpudoctor.watch.Monitor and its callbacks): the time each step waits for the next "
        "batch (the loader's __next__), against the step's wall time. A rank whose median wait is 30 % of its "
        "step or more (and at least 2 ms) in 3 consecutive windows is named; the fix is the DataLoader settings "
        "`gpudoctor check` derives (num_workers from the CPUs per rank, pin_memory, persistent_workers) for the "
        "rank's own loader.",
        why="A step that waits for its batch leaves the GPU idle: the job trains at the loader's speed, and a "
        "faster GPU or more of them would not help.",
        fix="More DataLoader workers where the CPUs allow (num_workers up to CPUs per rank - 1), pin_memory=True, "
        "persistent_workers=True, and cheaper batches (decode and augment once, offline).",
    ),
    Verdict(
        id="GD-WATCH-011",
        scope="job",
        name="slower-than-it-was",
        category="job",
        title="The running job is not slower than it was in its first windows",
        what="Inside the job (gpudoctor.watch.Monitor and its callbacks): the job's throughput (tokens/s summed "
        "over ranks, or steps/s where no tokens are given) in each window against the median of its first "
        "windows after the first; 20 % or more below it in 3 consecutive windows is named, with the part of the "
        "step that grew.",
        why="A job that slows down hours in (a GPU heating up, a node's storage or network degrading, memory "
        "fragmentation, a growing dataset shard) costs the difference for the rest of the run, and is noticed "
        "only when the run ends late.",
        fix="Read which part grew (data, forward+backward, all-reduce, the rest) and look there: the loader and "
        "the storage, the GPUs (`gpudoctor watch --job JOBID`), the network between nodes.",
    ),
    Verdict(
        id="GD-WATCH-012",
        scope="job",
        name="rank-stopped-stepping",
        category="distributed",
        title="Every rank of the running job steps as long as the others",
        what="Inside the job (gpudoctor.watch.Monitor and its callbacks): the window exchange is an asynchronous "
        "all_gather no rank waits in. A rank whose Monitor closed (at which step: a key in the job's store) while "
        "another went on, a rank that left the monitor's gloo group, or an exchange not completed 30 s (or 3 "
        "windows) and 3 steps after it was posted names the rank that stopped stepping, where it can be told; the "
        "monitor then stands down (each rank goes on counting its steps for its heartbeat only).",
        why="Ranks with uneven step counts (uneven data shards, evaluation loops on some ranks only) hang a DDP "
        "job at its next collective, or train on fewer batches than meant; a rank that stopped is what a hang "
        "or a silent imbalance looks like.",
        fix="Give every rank the same number of batches (DistributedSampler with drop_last=True, or a step "
        "count every rank computes alike), or wrap uneven loops in torch.distributed.algorithms.Join.",
    ),
)

declare(
    WATCH_VERDICTS,
    source="watch",
    judged_by="`gpudoctor watch --job JOBID` on a running job, or gpudoctor.watch.Monitor inside it",
)
