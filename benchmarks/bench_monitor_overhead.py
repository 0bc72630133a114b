"""What gpudoctor.watch.Monitor costs a training step: the median step time with and without it (issue 27: at most
1 % of the median step).

    python benchmarks/bench_monitor_overhead.py [--ddp] [--blocks 10] [--steps 50] [--width 256]

One process trains an MLP (4 Linear layers of --width, batch 64) on CPU. Blocks of --steps steps alternate
without and with the monitor (loader(), step(), the forward and gradient hooks, the two autograd final callbacks
of each backward; with --ddp the model is DDP over a one-rank gloo group), so the machine's drift falls on both
alike. Prints
the machine, each median and the difference as a share of the step.
"""

from __future__ import annotations

import argparse
import copy
import io
import os
import platform
import statistics
import sys
import time


def _machine() -> str:
    import torch

    return (
        f"{platform.node()} · {os.cpu_count()} CPUs · {platform.platform()} · Python {platform.python_version()} · "
        f"torch {torch.__version__}"
    )


def _run_block(model, opt, batches, monitor) -> list[tuple[float, float]]:
    """(wall, CPU time of this thread) of each step. The CPU time is what a shared machine cannot inflate: the
    wall time also holds the waits for a core (issue 27's bar is on the wall time of a real run)."""
    times = []
    if monitor is None:
        for batch in batches:
            wall, cpu = time.perf_counter(), time.thread_time()
            model(batch).sum().backward()
            opt.step()
            opt.zero_grad()
            times.append((time.perf_counter() - wall, time.thread_time() - cpu))
        return times
    it = iter(monitor.loader(batches))
    while True:
        wall, cpu = time.perf_counter(), time.thread_time()
        batch = next(it, None)
        if batch is None:
            return times
        with monitor.step(tokens=batch.shape[0]):
            model(batch).sum().backward()
            opt.step()
            opt.zero_grad()
        times.append((time.perf_counter() - wall, time.thread_time() - cpu))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ddp", action="store_true", help="wrap the model in DDP over a one-rank gloo group")
    ap.add_argument("--blocks", type=int, default=10)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1: a shared machine)")
    args = ap.parse_args()
    import torch

    from gpudoctor.watch import Monitor

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    base = torch.nn.Sequential(*layers)
    # two identical models: the plain one never carries the monitor's hooks
    models = [copy.deepcopy(base), copy.deepcopy(base)]
    if args.ddp:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
        models = [torch.nn.parallel.DistributedDataParallel(m) for m in models]
    opts = [torch.optim.SGD(m.parameters(), lr=1e-4) for m in models]
    batches = [torch.randn(64, args.width) for _ in range(args.steps)]
    monitor = Monitor(model=models[1], window_s=1.0, heartbeat=False, echo=io.StringIO())
    for m, o in zip(models, opts, strict=True):
        _run_block(m, o, batches, None)  # warm-up
    plain: list[tuple[float, float]] = []
    watched: list[tuple[float, float]] = []
    for _ in range(args.blocks):
        plain += _run_block(models[0], opts[0], batches, None)
        watched += _run_block(models[1], opts[1], batches, monitor)
    monitor.close()
    a, b = statistics.median(w for w, _ in plain), statistics.median(w for w, _ in watched)
    ca, cb = statistics.median(c for _, c in plain), statistics.median(c for _, c in watched)
    print(f"machine: {_machine()}")
    kind = "DDP (gloo, 1 rank)" if args.ddp else "no DDP"
    print(f"model: 4 x Linear({args.width}) MLP, batch 64, {kind}, {args.threads} torch thread(s)")
    print(f"steps: {len(plain)} without, {len(watched)} with, in {args.blocks} alternating blocks")
    print(f"median step without the monitor: {a * 1000:.3f} ms")
    print(f"median step with the monitor:    {b * 1000:.3f} ms")
    print(f"overhead (wall): {(b - a) * 1e6:.1f} us a step, {(b - a) / a:+.2%} of the median step")
    print(f"median step CPU time without / with: {ca * 1000:.3f} ms / {cb * 1000:.3f} ms")
    print(f"overhead (CPU time of the training thread): {(cb - ca) * 1e6:.1f} us a step, {(cb - ca) / ca:+.2%}")
    print(f"windows judged: {len(monitor.windows)}")
    wall_us, cpu_us = _own_cost_us(args.ddp)
    print(f"the monitor's own work a step (a step of almost no compute): {wall_us:.1f} us wall, {cpu_us:.1f} us CPU")
    return 0


def _own_cost_us(ddp: bool) -> tuple[float, float]:
    """The monitor's bookkeeping alone: the median step of a 2-layer Linear(4) model (4 parameters) with and
    without it, in alternating blocks; the difference is what the monitor adds to any step, whatever its size."""
    import torch

    from gpudoctor.watch import Monitor

    base = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    models = [copy.deepcopy(base), copy.deepcopy(base)]
    if ddp:
        models = [torch.nn.parallel.DistributedDataParallel(m) for m in models]
    opts = [torch.optim.SGD(m.parameters(), lr=1e-4) for m in models]
    batches = [torch.randn(2, 4) for _ in range(200)]
    monitor = Monitor(model=models[1], window_s=1.0, heartbeat=False, echo=io.StringIO())
    plain: list[tuple[float, float]] = []
    watched: list[tuple[float, float]] = []
    for _ in range(10):
        plain += _run_block(models[0], opts[0], batches, None)
        watched += _run_block(models[1], opts[1], batches, monitor)
    monitor.close()
    return tuple(  # type: ignore[return-value]
        (statistics.median(x[i] for x in watched) - statistics.median(x[i] for x in plain)) * 1e6 for i in (0, 1)
    )


if __name__ == "__main__":
    sys.exit(main())
