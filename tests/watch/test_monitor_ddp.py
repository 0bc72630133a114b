"""gpudoctor.watch.Monitor in a real CPU DDP world: two gloo ranks (two Python processes, torch.distributed over
TCP on this machine), a tiny DDP model, window_s 0.4 s. One pair of processes (a script and its fork) runs five
worlds one after the other, each with its own Monitor (and gloo group):

- healthy: both ranks' steps sleep 8 ms (a stand-in for GPU work that leaves the CPU free): nobody is named;
- slowed: rank 1 sleeps 25 ms more in each step, after the optimizer: GD-WATCH-009 names rank 1, "the rest of the
  step" being the part, and rank 0 is seen waiting for it in the all-reduce;
- input-bound: rank 1's collate_fn sleeps 20 ms (num_workers=0): GD-WATCH-010 names rank 1 (and only it);
- uneven (issue 35): no DDP, rank 1 does 30 steps and rank 0 60: rank 0 is never held by the exchange (the old
  monitor waited there for the group's 600 s timeout), and GD-WATCH-012 names rank 1 as stopped at step 30;
- stuck (issue 35): no DDP, rank 1 stops stepping at step 20 without closing, alive until rank 0 is done; the
  bounds are shortened for the test (overdue after 0.3 s, close() waits 1 s): rank 0's exchange is overdue,
  GD-WATCH-012 names rank 1 as not reaching the window's end, rank 0 trains on to step 60;
- left (issue 34): no DDP, rank 1 destroys its process groups at its step 15 (the monitor's own group lives on in
  the monitor) and its process ends at step 40: rank 0's exchange fails, GD-WATCH-012 says rank 1 left, rank 0's
  monitor stands down and its steps go on.

The ranks run without numpy (sys.modules["numpy"] = None before torch is imported, so this holds where numpy is
installed too): torch's object collectives need it, the monitor must not (issue 34). About 10 s of wall time on
two idle cores, mostly sleeps; the only time asserted is the uneven world's bound on a hang.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.watch.rankworld import run_ranks

pytestmark = [pytest.mark.ddp, pytest.mark.xdist_group("cpu-ddp-worlds")]

# The two ranks are this script and its fork, made after torch and torch._dynamo (which DDP's constructor imports)
# are imported once: two processes, as a launcher's, without paying those imports twice (5-6 CPU-s here).
RANK = r"""
import json, os, sys, time
sys.modules["numpy"] = None  # a training environment without numpy (issue 34)
try:
    import numpy
    sys.exit("numpy importable in a rank")
except ImportError:
    pass
import torch, torch.distributed as dist, torch._dynamo
from torch.nn.parallel import DistributedDataParallel as DDP
from gpudoctor.watch import Monitor
import gpudoctor.watch.monitor as monitor_module

port, out = sys.argv[1], sys.argv[2]
rank = 1 if os.fork() == 0 else 0
os.environ["LOCAL_RANK"] = str(rank)
if rank == 1:  # rank 0's stderr is the test's to read; rank 1's goes to a file
    os.dup2(os.open(f"{out}/stderr1.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
data = [torch.randn(8, 16) for _ in range(16)]

def slow_collate(batch):
    time.sleep(0.020)
    return torch.stack(batch)

def world(name, steps, extra_sleep=0.0, collate=None, ddp=True, window_s=0.4, leave_at=None, stuck_at=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    model = DDP(model) if ddp else model
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader([x for b in data for x in b], batch_size=8, collate_fn=collate)
    report = f"{out}/{name}.json"
    beat = f"{out}/{name}-hb{rank}.json"
    monitor = Monitor(model=model, window_s=window_s, report=report, heartbeat=beat, comm_hook=name == "input")
    done, start = 0, time.perf_counter()
    while done < steps:
        for batch in monitor.loader(loader):
            with monitor.step(tokens=batch.shape[0]):
                model(batch).sum().backward()
                opt.step()
                opt.zero_grad()
                time.sleep(0.008 + extra_sleep)
            done += 1
            if leave_at is not None and done == leave_at:
                dist.destroy_process_group()  # this rank leaves torch.distributed (every group) ...
            if leave_at is not None and done == leave_at + 25:
                open(f"{out}/left-rank1-steps.txt", "w").write(str(done))
                sys.stderr.flush()
                os._exit(0)  # ... and its process ends
            if stuck_at is not None and done == stuck_at:  # alive, not stepping, not closing: until rank 0 is done
                for _ in range(600):
                    if os.path.exists(f"{out}/{name}-done"):
                        break
                    time.sleep(0.1)
                done = steps  # and it steps no more
                break
            if done == steps:
                break
    findings = monitor.close()
    if rank == 0:
        with open(f"{out}/{name}-findings.json", "w") as f:
            json.dump([x.to_dict() for x in findings], f)
        with open(f"{out}/{name}-wall.txt", "w") as f:
            f.write(str(time.perf_counter() - start))
        open(f"{out}/{name}-done", "w").close()

world("healthy", 150)
world("slowed", 90, extra_sleep=0.025 if rank == 1 else 0.0)
world("input", 90, collate=slow_collate if rank == 1 else None)
world("uneven", 60 if rank == 0 else 30, extra_sleep=0.005, ddp=False, window_s=0.1)
monitor_module.OVERDUE_MIN_S, monitor_module.CLOSE_WAIT_S = 0.3, 1.0  # the stuck world's bounds, shortened
world("stuck", 60, extra_sleep=0.02, ddp=False, window_s=0.1, stuck_at=20 if rank == 1 else None)
world("left", 60, extra_sleep=0.005, ddp=False, window_s=0.1, leave_at=15 if rank == 1 else None)
if rank == 1:
    sys.stderr.flush()
    os._exit(0)
_, status = os.wait()
sys.exit(f"rank 1 ended with {status:#x}" if status else 0)
"""


@pytest.fixture(scope="module")
def worlds(tmp_path_factory) -> Path:
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("monitor-ddp")
    script = out / "rank.py"
    script.write_text(RANK)
    returncode, said = run_ranks(script, str(out), timeout=180)
    rank1 = out / "stderr1.txt"
    assert returncode == 0, (said, rank1.read_text() if rank1.exists() else "")
    (out / "stderr0.txt").write_text(said)
    return out


def _findings(out: Path, name: str) -> dict[str, dict]:
    return {f["id"]: f for f in json.loads((out / f"{name}-findings.json").read_text())}


def test_a_healthy_world_names_nobody(worlds):
    found = _findings(worlds, "healthy")
    assert {fid: f["severity"] for fid, f in found.items()}["GD-WATCH-009"] == "pass", found["GD-WATCH-009"]
    assert found["GD-WATCH-010"]["severity"] == "pass", found["GD-WATCH-010"]["message"]
    assert not [f for f in found.values() if f["severity"] in ("warn", "fail")]


def test_a_slowed_rank_is_named_with_the_part_and_the_rank_waiting_for_it(worlds):
    f = _findings(worlds, "slowed")["GD-WATCH-009"]
    assert f["severity"] == "warn", f["message"]
    assert f["evidence"]["rank"] == 1 and f["evidence"]["local_rank"] == 1 and f["evidence"]["part"] == "other_s"
    assert f["evidence"]["host"] == socket.gethostname()
    per_rank = {r["rank"]: r for r in f["evidence"]["per_rank"]}
    assert per_rank[0]["comm_s"] > per_rank[1]["comm_s"]  # rank 0 waits for rank 1 in the all-reduce
    assert "GD-WATCH-009 warn: rank 1" in (worlds / "stderr0.txt").read_text()  # printed by rank 0


def test_a_slow_collate_on_one_rank_is_input_bound(worlds):
    found = _findings(worlds, "input")
    f = found["GD-WATCH-010"]
    assert f["severity"] == "warn", f["message"]
    assert f["evidence"]["rank"] == 1 and f["evidence"]["loader"]["num_workers"] == 0
    assert "num_workers" in f["fix"]["title"]
    listed = json.loads((worlds / "input-findings.json").read_text())
    assert [x["evidence"]["rank"] for x in listed if x["id"] == "GD-WATCH-010"] == [1]  # rank 0 is not input-bound


def test_a_rank_with_fewer_steps_holds_nobody_and_is_named_as_stopped(worlds):
    # the old monitor held rank 0 in its window exchange for the group's whole timeout (600 s) here
    assert float((worlds / "uneven-wall.txt").read_text()) < 30
    f = _findings(worlds, "uneven")["GD-WATCH-012"]
    assert f["severity"] == "warn", f["message"]
    assert f["evidence"]["rank"] == 1 and f["evidence"]["how"] == "closed" and f["evidence"]["step"] == 30
    assert f["message"].startswith("rank 1 on ") and "stopped stepping at step 30" in f["message"]
    report = json.loads((worlds / "uneven.json").read_text())
    assert report["watch"]["steps"] == 60 and report["watch"]["closed"] is True


def test_a_rank_that_stopped_without_closing_is_named_once_its_exchange_is_overdue(worlds):
    f = _findings(worlds, "stuck")["GD-WATCH-012"]
    assert f["severity"] == "warn" and f["evidence"]["rank"] == 1 and f["evidence"]["how"] == "silent", f["message"]
    assert f["message"].startswith("rank 1 on ") and "did not reach step" in f["message"]
    report = json.loads((worlds / "stuck.json").read_text())
    assert report["watch"]["steps"] == 60 and report["watch"]["exchange"] == "alone"


def test_a_rank_that_left_the_group_stands_the_monitor_down_and_the_steps_go_on(worlds):
    f = _findings(worlds, "left")["GD-WATCH-012"]
    assert f["severity"] == "warn" and f["evidence"]["rank"] == 1 and f["evidence"]["how"] == "left", f["message"]
    report = json.loads((worlds / "left.json").read_text())
    assert report["watch"]["steps"] == 60 and report["watch"]["exchange"] == "alone"  # rank 0 trained on
    assert (worlds / "left-rank1-steps.txt").read_text() == "40"  # rank 1 stepped on after leaving, too
    for said in ((worlds / "stderr1.txt").read_text(), (worlds / "stderr0.txt").read_text()):
        assert "Traceback" not in said and "monitor off after an error" not in said, said


def test_the_report_and_heartbeats_are_written(worlds):
    import jsonschema

    schema = json.loads((Path(__file__).parents[2] / "docs" / "report.schema.json").read_text())
    report = json.loads((worlds / "slowed.json").read_text())
    jsonschema.validate(report, schema)
    assert report["watch"]["closed"] is True and report["watch"]["allreduce_timed"] is True
    assert [m["rank"] for m in report["watch"]["medians"]] == [0, 1]
    assert [r["rank"] for r in report["source"]["ranks"]] == [0, 1]
    for r in range(2):
        beat = json.loads((worlds / f"slowed-hb{r}.json").read_text())
        assert beat["rank"] == r and beat["step"] == 90 and beat["closed"] is True
