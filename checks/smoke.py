"""The verdicts of `gpudoctor smoke`, registered like every check (source="smoke"), declared as data.

The smoke run (sample_train/) judges what only a real training run shows and builds these
findings itself (sample_train/judge/findings.make reads the id's name, category and title from here).
This table only documents them: `gpudoctor check` never runs them; `gpudoctor list`,
`explain` and docs/checks.md show them. Adding a verdict is adding a row. Importing this module
must stay free of torch. Categories are those of the problem each verdict is about (the run is in
category "smoke" only where the verdict is about the training itself), as in the gpudoctor.smoke/3
output. scope: "machine" unless given (registry SCOPES).
"""

from __future__ import annotations

from gpudoctor.registry import Verdict, declare

SMOKE_VERDICTS = (
    Verdict(
        id="GD-SMOKE-001",
        scope="job",
        name="rank-missing-at-rendezvous",
        category="distributed",
        title="Every rank joined the rendezvous",
        what="Waits, until the run's deadline, for every rank the launcher announced (WORLD_SIZE) to join the "
        "run's TCPStore rendezvous, and names the ranks and hosts that never arrived.",
        why="torch.distributed.init_process_group blocks until all WORLD_SIZE ranks have joined: one rank that "
        "never starts (wrong MASTER_ADDR, a node that cannot reach the store, a task that crashed on import) "
        "holds every other rank until the timeout, which is 30 minutes by default for NCCL.",
        fix="Look at the missing ranks' own logs (srun --output per task); check MASTER_ADDR/MASTER_PORT reach "
        "the rank-0 host from every node, and that WORLD_SIZE matches the processes actually started.",
    ),
    Verdict(
        id="GD-SMOKE-002",
        name="ranks-share-a-gpu",
        category="devices",
        title="Each rank has a GPU of its own",
        what="Compares the GPU each rank runs on (its UUID, else its PCI address, as torch reports it) across "
        "ranks and names the ranks that share one.",
        why="NCCL refuses two ranks of one communicator on the same GPU ('Duplicate GPU detected'), so the run "
        "fails or hangs at the first collective; outside NCCL both ranks run at half speed.",
        fix="Give each task its own GPU (--gpus-per-task=1, or --ntasks-per-node equal to the GPUs per node with "
        "--gres=gpu:N), or launch one process per node with torchrun --nproc-per-node N.",
    ),
    Verdict(
        id="GD-SMOKE-003",
        name="rank-outside-its-gpus",
        category="devices",
        title="Each rank runs on a GPU it was given",
        what="Compares, for every rank, the GPUs torch sees and the device it runs on with what its launcher "
        "gave it (SLURM's GPU list for the task, --gpus for a local run), and reports ranks on the CPU while "
        "others use GPUs.",
        why="A rank that sees more GPUs than SLURM allocated (a CUDA_VISIBLE_DEVICES set by hand) may run on "
        "another job's GPU; a rank on the CPU among GPU ranks makes every step wait for it.",
        fix="Leave CUDA_VISIBLE_DEVICES to SLURM inside a job, and start no more ranks than there are GPUs.",
    ),
    Verdict(
        id="GD-SMOKE-004",
        scope="job",
        name="rank-failed",
        category="distributed",
        title="No rank failed during the run",
        what="Watches every rank's process and its reports to the coordinator; a rank that exits early, is "
        "killed or reports an exception fails the run, with the first failing rank named as the cause.",
        why="In DDP every collective needs all ranks: one failed rank leaves the others blocked in the next "
        "all-reduce, so the first failure, not the later timeouts, is the one to read.",
        fix="Read the named rank's error (the smoke report quotes its last lines); `gpudoctor check` on its node "
        "often names the cause (driver, NCCL, memory).",
    ),
    Verdict(
        id="GD-SMOKE-005",
        scope="job",
        name="run-hung",
        category="distributed",
        title="The run finished within its timeout",
        what="Bounds the whole run by --timeout and, when it runs out, reports the phase each rank was in and the "
        "ranks that were behind the others.",
        why="A hang in a collective (a rank stuck, a network path NCCL cannot use) shows no error until NCCL's "
        "own timeout; naming the stuck ranks and phase points at the node or link to look at.",
        fix="Run the stuck ranks' node with `gpudoctor check` and NCCL_DEBUG=INFO; a longer --timeout only helps "
        "when the run was slow (first-time compilation, a cold filesystem), not stuck.",
    ),
    Verdict(
        id="GD-SMOKE-006",
        name="loss-did-not-fall",
        category="smoke",
        title="Training loss fell",
        what="Compares the mean loss over ranks of the first and last few training steps on the run's synthetic "
        "data; it must fall by a few per cent (sample_train/judge/report.py LOSS_DROP).",
        why="A loss that stays flat or becomes NaN/inf on data a small model learns easily means training is "
        "broken (a wrong gradient sync, precision overflow, a broken kernel) before any real job spends hours.",
        fix="Rerun with --device cpu to tell a GPU/library fault from a set-up fault; check the precision "
        "(GD-SMOKE-011) and the torch/CUDA checks of `gpudoctor check`.",
    ),
    Verdict(
        id="GD-SMOKE-007",
        scope="job",
        name="ranks-diverged",
        category="distributed",
        title="All ranks hold identical parameters after training",
        what="Compares a checksum of every rank's parameters after the last step and groups the ranks that agree.",
        why="DistributedDataParallel keeps the replicas identical by averaging gradients with all-reduce, so after "
        "training they must match bit for bit; a difference means a rank updated differently (a broken "
        "all-reduce, faulty hardware, silent data corruption).",
        fix="Rerun to see whether the same rank differs again; run that rank's node through `gpudoctor check` "
        "(ECC errors, GD-HW-001) and NCCL's own tests (nccl-tests all_reduce_perf with -c 1).",
    ),
    Verdict(
        id="GD-SMOKE-008",
        name="mfu-below-floor",
        category="smoke",
        title="MFU meets the --min-mfu floor",
        what="With --min-mfu, compares the run's model FLOPs utilisation (against the GPU's spec peak, else a "
        "measured matmul peak) with the floor.",
        why="A set-up that runs but at a fraction of the expected speed (throttled clocks, a PCIe link at x8, "
        "NCCL over sockets) passes every functional test; a floor makes it fail in CI.",
        fix="Look at the GPU's clocks, power and PCIe link (GD-HW-003, GD-HW-004) and NCCL's transport "
        "(GD-NCCL-003); lower the floor only for a GPU that is known to be slower.",
    ),
    Verdict(
        id="GD-SMOKE-009",
        name="throughput-below-floor",
        category="smoke",
        title="Throughput meets the --min-tokens-per-s floor",
        what="With --min-tokens-per-s, compares the run's tokens per second over all ranks with the floor.",
        why="Throughput over all ranks includes the communication cost a single-GPU benchmark misses: a slow "
        "interconnect shows here first.",
        fix="Compare with a run on one node and one GPU to tell the network from the GPU; see GD-SMOKE-008.",
    ),
    Verdict(
        id="GD-SMOKE-010",
        name="straggler-rank",
        category="hardware",
        title="No rank computes much slower than the others",
        what="Compares each rank's own forward+backward rate (DDP no_sync: no waiting for the others) with the job's "
        "median (sample_train/judge/outliers.py: below the median by more than 3.5 robust deviations and by a minimum "
        "gap, "
        "13 % on GPUs, 60 % on CPU ranks that share cores), and names the rank with its host, GPU index and UUID, and "
        "the reason NVML (or the CPU's cgroup quota) gives.",
        why="Every DDP step waits for the slowest rank at the gradient all-reduce, so one slow GPU (thermal or "
        "power slowdown, a degraded link) slows the whole job down to its speed.",
        fix="Look at the slow rank's GPU: `nvidia-smi -q -d PERFORMANCE` shows its clocks and slowdown reasons "
        "(GD-HW-003).",
    ),
    Verdict(
        id="GD-SMOKE-011",
        name="not-bf16",
        category="precision",
        title="Training ran in bf16 autocast",
        what="Reports the precision the run used and why (bf16 autocast where the GPU supports it; otherwise "
        "the reason it fell back); info when it is not bf16.",
        why="bf16 autocast is what large-model training uses on Ampere and newer GPUs; a run in fp32 measures a "
        "different speed and exercises different kernels than the job will.",
        fix="Use a GPU with bf16 support (compute capability 8.0 or newer) to test the bf16 path.",
    ),
    Verdict(
        id="GD-SMOKE-012",
        name="no-gpu",
        category="devices",
        title="CUDA GPUs are visible to torch",
        what="Before starting ranks, and in every rank, asks torch whether it sees a CUDA GPU "
        "(torch.cuda.is_available()).",
        why="Without a GPU, a GPU run cannot start; torch reports no error of its own until the first CUDA call.",
        fix="Run `gpudoctor check` on that machine for the cause (driver, CUDA_VISIBLE_DEVICES, a CPU-only "
        "torch), or pass --device cpu to test the CPU/gloo path.",
    ),
    Verdict(
        id="GD-SMOKE-013",
        name="torch-missing-for-smoke",
        category="smoke",
        title="The interpreter that runs the smoke training has torch",
        what="Before starting ranks, looks for torch in the interpreter that will train (this one, or --python's) "
        "without importing it (importlib.util.find_spec).",
        why="The smoke run is real torch training: without torch there is nothing to run. gpudoctor itself does not "
        "depend on torch, so it can be installed where torch is not (a login node, a fresh env).",
        fix="Install torch into the training environment (`python -m pip install torch`, or the CUDA build for your "
        "driver from https://download.pytorch.org/whl/), or point the run at that env: `gpudoctor smoke --python "
        "/path/to/env/bin/python`.",
    ),
    Verdict(
        id="GD-SMOKE-014",
        name="busbw-below-floor",
        category="smoke",
        title="All-reduce bus bandwidth meets the --min-busbw floor",
        what="With --min-busbw, compares the run's all-reduce bus bandwidth (nccl-tests' busbw = algbw x 2(n-1)/n, "
        "the slowest rank's time) with the floor in GB/s.",
        why="busbw is comparable across rank counts (nccl-tests, doc/PERFORMANCE.md): a fabric that falls back to "
        "TCP sockets, or a node whose NICs are down, keeps training correct but far below the interconnect's speed.",
        fix="Look at NCCL's transport (NCCL_DEBUG=INFO: NET/IB vs NET/Socket), GD-NCCL-003 and the nodes' NICs; "
        "run nccl-tests' all_reduce_perf for a fuller curve.",
    ),
    Verdict(
        id="GD-SMOKE-015",
        name="slow-node",
        category="hardware",
        title="No node computes much slower than the median node",
        what="Per node (the launcher's node: GROUP_RANK/SLURM_NODEID, else the host), the tokens per second of its "
        "ranks' own forward+backward; names the nodes below the median node by the robust rule of GD-SMOKE-010 "
        "(sample_train/judge/slowness.py MIN_GAP), and puts them in the run's --exclude line.",
        why="Under DDP every step waits for the slowest rank, so one slow node (throttled GPUs, a bad PCIe link, a "
        "noisy neighbour) sets the pace of the whole job; the per-rank view hides which node it is.",
        fix="Drain or inspect the named node (`nvidia-smi -q -d PERFORMANCE`, GD-HW-003/004); exclude it "
        "(sbatch --exclude) until it is fixed.",
    ),
)

SPEED_VERDICTS = (
    Verdict(
        id="GD-SMOKE-016",
        name="slow-part",
        category="hardware",
        title="No rank's GPU, memory or host link is much slower than the job's median",
        what="Before training every rank measures its own parts briefly: a square bf16 matmul and the model's FFN "
        "matmul (TFLOP/s), a device memory copy (GB/s, read + write), and on GPUs pinned host-to-device and "
        "device-to-host copies. Each figure is compared with the job's median (median and MAD, and a minimum gap) "
        "and the slow rank is named with its host, GPU index and UUID, and the reason NVML gives at that moment "
        "(clock slowdown reasons, SM clock against its maximum, PCIe width and generation against the maximum, a "
        "lowered power limit, other processes on the GPU with their PIDs).",
        why="A throttled GPU, a GPU shared with a stray process, or a link trained at x4 keeps working, just slower, "
        "and every synchronous rank waits for it: the job runs at the slowest part's pace without an error.",
        fix="Exclude the named host (the report's `sbatch --exclude=` line) and look at the GPU: "
        "`nvidia-smi -q -d PERFORMANCE,CLOCK`, `nvidia-smi --query-compute-apps=pid,used_memory --format=csv`, "
        "`lspci -vv` for the link; reseat or RMA a GPU whose link stays degraded.",
    ),
    Verdict(
        id="GD-SMOKE-017",
        name="below-expectation",
        category="hardware",
        title="Each rank's parts reach what its GPU model (or the fleet baseline) should",
        what="Compares every rank's figures with a fleet baseline given with --baseline (saved by --save-baseline on "
        "a known-good node; the same GPU model, world size and model), else with the reference table of its GPU "
        "model (sample_train/judge/peaks.py, docs/gpu_peaks.md: the datasheet figure times the fraction healthy "
        "devices "
        "reach). A GPU model missing from the table is info, never a fail.",
        why="The job's own median cannot see a fault every rank shares (all GPUs power-capped, a node type whose "
        "links all trained at a lower generation); an expectation from outside the job can.",
        fix="Save a baseline on a node known to be good (`gpudoctor smoke --save-baseline base.json`) and judge "
        "others against it (`--baseline base.json`); for a GPU the table lacks pass --peak-tflops.",
    ),
    Verdict(
        id="GD-SMOKE-018",
        scope="job",
        name="slow-link",
        category="distributed",
        title="No node or link between nodes is much slower than the others",
        what="After the all-reduce benchmarks, disjoint pairs of nodes send and receive at once, in rounds (at "
        "least log2 of the node count, every node meeting two others; all pairs with --deep). A node slow with "
        "every partner while the others reach more elsewhere is named; a pair slower than both of its ends reach "
        "with other partners is a slow link between them; with two nodes the data cannot say which end is at "
        "fault, and the report says so.",
        why="One node whose NIC runs at a fraction of the others' speed slows every all-reduce of the job; the "
        "job's all-reduce bandwidth shows that something is slow, not which node.",
        fix="Exclude the named node (the `sbatch --exclude=` line) and look at its NIC (`ibstat`, `ethtool`, "
        "link speed, errors); for a slow link between two healthy nodes, the switch port or cable between them.",
    ),
    Verdict(
        id="GD-SMOKE-019",
        scope="job",
        name="scaling-efficiency",
        category="distributed",
        title="Scaling efficiency meets the --min-scaling floor",
        what="The median rank's own forward+backward time (no gradient all-reduce) over the synchronised step time "
        "(the slowest rank's, median step): the 1 -> N efficiency; the rest of the step is waiting for others, "
        "the gradient all-reduce, data and the optimizer. A fail only below --min-scaling.",
        why="A job that scales badly spends its GPUs waiting: the share of the step that is not compute is what "
        "more GPUs will not speed up.",
        fix="Look at the all-reduce bandwidth (GD-SMOKE-014, NCCL's transport), the data wait per step, and "
        "overlap of communication with compute (DDP bucket size, gradient accumulation).",
    ),
    Verdict(
        id="GD-SMOKE-020",
        name="part-below-floor",
        category="hardware",
        title="Each part meets the floors given (--min-matmul-tflops, --min-membw, --min-hostbw, --min-linkbw)",
        what="With these floors, compares every rank's square matmul, device memory copy and pinned host<->device "
        "copies (either direction), and every node pair's send/recv, with the floor, and names those below it.",
        why="A fleet knows what its nodes should reach: a floor turns a slow part into a failed preflight in CI or a "
        "prolog instead of a slow night.",
        fix="Exclude the named hosts (the `sbatch --exclude=` line) and inspect them (GD-SMOKE-016's fix).",
    ),
)

CORRECTNESS_VERDICTS = (
    Verdict(
        id="GD-SMOKE-024",
        name="speed-falls-under-load",
        category="hardware",
        title="Every rank holds its speed under sustained load (--soak)",
        what="With --soak, every rank measures its square matmul and its device memory copy again and again after "
        "training, reading clocks, temperature and throttle reasons (or, on a CPU rank, its CPU quota) after each. "
        "A rank whose figure stays below both its own first minute and the other ranks at the same moment (13 % on "
        "a GPU, 40 % on a CPU, three samples in a row) is named with when it fell and why its device says; every "
        "rank falling together names the node.",
        why="A short run misses a GPU that throttles once hot (a clogged heat sink, a failing fan, a power brake): "
        "in synchronous training every step waits for it, hours into the job.",
        fix="Look at the named GPU's cooling and power and its clocks under load (`nvidia-smi -q -d "
        "PERFORMANCE,TEMPERATURE,POWER`, `nvidia-smi dmon -s pucm`); exclude the host until it is repaired.",
    ),
    Verdict(
        id="GD-SMOKE-023",
        name="gpu-memory-held-by-another-process",
        category="devices",
        title="The GPUs' memory is free for the run",
        what="As each rank joins, reads its GPU's free memory (torch.cuda.mem_get_info) and the processes NVML sees on "
        "it. A process that is not one of the run's ranks and holds memory (or free memory below 90 % of the total "
        "with no process shown: another container) is named with its PID and how much it holds; the model is then "
        "sized from the free memory, and below what the smallest model needs (about 6 GiB) the run stops before "
        "training.",
        why="A GPU shared with a forgotten process (a notebook's kernel, a previous job's orphan) gives a training job "
        "half its speed and a fraction of its memory: it fails with CUDA out of memory, or runs slowly, with nothing "
        "in its own logs to say why.",
        fix="See what holds the GPU: `nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv`, "
        "then `ps -o user,pid,etime,cmd -p PID`; stop it if it is yours, or run on another node.",
    ),
    Verdict(
        id="GD-SMOKE-021",
        name="wrong-results",
        category="hardware",
        title="Every rank computes right",
        what="Every rank runs the same deterministic work on fixed data — a chain of bf16 and fp32 matmuls and one "
        "training step of a small MLP — and the bits of the results are compared across ranks of one kind (GPU "
        "model, SM count, torch and CUDA; or CPU model, threads and torch); each rank's small matmul is also "
        "compared with float64 within its rounding. A rank that differs from its kind's majority, or from "
        "float64, is named with its host, GPU and UUID.",
        why="A GPU that is fast but computes wrong values (a bad SM, a weak memory stack: silent data corruption) "
        "is the worst case for training: NaNs or divergence days later, with nothing in the logs. cuBLAS gives "
        "bit-wise identical results on GPUs of one architecture and SM count with one toolkit (cuBLAS docs, "
        "'Results reproducibility'), so a difference there is the device's, not the library's.",
        fix="Take the named GPU out of service (`sbatch --exclude=<host>`) and run the vendor's diagnostics: "
        "`dcgmi diag -r 3` (or 4), `nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER`.",
    ),
    Verdict(
        id="GD-SMOKE-022",
        name="device-memory-errors",
        category="hardware",
        title="Device memory reads back what was written",
        what="Writes two bit patterns (0x55, 0xAA) and each 32-bit word's own index over a bounded share of every "
        "rank's free device memory (5 %, at most 2 GiB; 4 MiB on a CPU rank) and counts the words that read back "
        "wrong.",
        why="A memory cell that flips a bit corrupts weights, activations or gradients silently when ECC does not "
        "catch it (or on GPUs without ECC); DCGM's memory test and memtest exist for this reason.",
        fix="Take the GPU out of service and run `dcgmi diag -r 3` (its memory test); look for retired pages or "
        "remapped rows (`nvidia-smi -q -d PAGE_RETIREMENT,ROW_REMAPPER`).",
    ),
)

LINK_VERDICTS = (
    Verdict(
        id="GD-SMOKE-025",
        scope="job",
        name="nccl-transport",
        category="nccl",
        title="NCCL used the fast transport the nodes have",
        what="Each GPU rank has NCCL log its set-up (NCCL_DEBUG=INFO, subsystems INIT and NET, to a file of its own "
        "unless you set NCCL_DEBUG_FILE) and reads which transport every connection took: P2P (NVLink or PCIe peer "
        "access), SHM, NET/IB (with GPUDirect RDMA where NCCL says GDRDMA), NET/Socket, or a network plug-in. "
        "TCP sockets between nodes that have RDMA devices (/sys/class/infiniband: InfiniBand, RoCE, EFA) are a "
        "fail; sockets between ranks of one node a warning.",
        why="NCCL falls back to TCP sockets without an error when it cannot use InfiniBand or EFA (NCCL_IB_DISABLE "
        "left set, a container without /dev/infiniband, a missing network plug-in): the job runs, with a fraction "
        "of the bandwidth (one report: ~3 GB/s over TCP against 489 GB/s over EFA on the same H100 nodes).",
        fix="Look at NCCL's own log (`NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET`: the 'Using network' line and "
        "'NET/IB : No device found'); unset NCCL_IB_DISABLE / NCCL_NET=Socket, give the container the RDMA devices "
        "(--device=/dev/infiniband, the SR-IOV/host network), install the network plug-in (aws-ofi-nccl on EFA).",
    ),
    Verdict(
        id="GD-SMOKE-026",
        scope="job",
        name="allreduce-below-reference",
        category="nccl",
        title="The all-reduce reaches what this node's GPUs and fabric should",
        what="Compares the run's all-reduce bus bandwidth (nccl-tests' busbw, 256 MiB) on one node of 8 GPUs of a "
        "known model with a published fleet floor for that node (Azure's node health checks: 8 x H100 SXM 460 GB/s, "
        "8 x H200 SXM 431, 8 x A100 SXM4 228; sample_train/judge/transport.py) times a wide margin for the smaller "
        "message. Other shapes have no published reference and are skipped, saying so.",
        why="A node whose NVLink or NVSwitch is degraded all-reduces slower than its peers of the same kind; the "
        "job's own median cannot show it when the whole node is one rank group.",
        fix="Run nccl-tests' all_reduce_perf on the node (`-b 8G -e 8G -g 8`) and `nvidia-smi nvlink -s`; exclude "
        "the node until its links are repaired.",
    ),
    Verdict(
        id="GD-SMOKE-027",
        scope="job",
        name="gpu-pair-below-nvlink-reference",
        category="hardware",
        title="Every GPU pair inside a node reaches its NVLink's floor (--deep)",
        what="With --deep, every pair of GPUs inside a node sends and receives at once through NCCL; each pair's "
        "rate is compared with half of what a healthy pair of its model is published to reach "
        "(sample_train/judge/transport.py: H100/H200 SXM, NVLink 4, 371 GB/s each direction). Models without a "
        "published figure are skipped, saying so; the job's own median still judges their pairs (GD-SMOKE-018).",
        why="A GPU pair that lost its NVLink falls back to PCIe P2P at a tenth of the speed; when every pair of a "
        "node is degraded, the node's own median cannot show it, and every collective of the job waits on it.",
        fix="`nvidia-smi nvlink -s` and `nvidia-smi topo -m` on the node (links down, P2P through the CPU), "
        "nvbandwidth's device_to_device tests; exclude the node (`sbatch --exclude=`) until it is repaired.",
    ),
)

declare(
    SMOKE_VERDICTS + SPEED_VERDICTS + CORRECTNESS_VERDICTS + LINK_VERDICTS,
    source="smoke",
    judged_by="the smoke run (gpudoctor smoke)",
)
