"""The in-process monitor's judge (watch/steps.py) over constructed per-rank window series.

Constructed: four ranks of synchronous DDP on two hosts, 100 ms steps; each rank's parts are what DDP makes of a
slow rank (the same wall step on every rank, the slow one waiting least in the all-reduce)."""

from __future__ import annotations

from dataclasses import replace

from gpudoctor.model import Severity
from gpudoctor.watch.steps import RankWindow, Stopped, Window, judge_windows, rank_medians, stragglers

STEP = 0.100


def _rank(rank: int, data=0.002, compute=0.060, comm=0.030, tokens=4096.0) -> RankWindow:
    other = STEP - data - compute - comm
    return RankWindow(
        rank=rank,
        steps=20,
        step_s=STEP,
        data_s=data,
        compute_s=compute,
        comm_s=comm,
        other_s=other,
        tokens_per_s=tokens / STEP,
        host=f"node{rank // 2}",
        local_rank=rank % 2,
        device=f"cuda:{rank % 2}",
    )


def _healthy(world: int = 4) -> tuple[RankWindow, ...]:
    return tuple(_rank(r) for r in range(world))


def _slow(rank: int, world: int = 4) -> tuple[RankWindow, ...]:
    """rank's forward+backward 25 ms longer: it waits 25 ms less in the all-reduce; the others wait for it."""
    return tuple(_rank(r, compute=0.085, comm=0.005) if r == rank else _rank(r) for r in range(world))


def _series(*ranks_per_window: tuple[RankWindow, ...]) -> list[Window]:
    return [Window(i, float(i + 1), ranks) for i, ranks in enumerate(ranks_per_window)]


def _by_id(findings, fid):
    return [f for f in findings if f.id == fid]


def test_a_rank_slower_in_four_windows_in_a_row_is_named_with_its_host_gpu_and_part():
    windows = _series(_healthy(), _slow(3), _slow(3), _slow(3), _slow(3), _healthy())
    found = _by_id(judge_windows(windows), "GD-WATCH-009")
    assert [f.severity for f in found] == [Severity.WARN]
    f = found[0]
    assert f.evidence["rank"] == 3 and f.evidence["host"] == "node1" and f.evidence["local_rank"] == 1
    assert f.evidence["part"] == "compute_s" and f.evidence["windows"] == [1, 2, 3, 4]
    assert f.evidence["waiting"] == [0, 1, 2]  # the ranks waiting for it in the all-reduce
    assert f.message.startswith("rank 3 on node1 is slow in forward+backward: 85.0 ms a step against 60.0 ms")
    assert "rank 3 (host node1, local rank 1, cuda:1), 4 windows in a row" in f.evidence["detail"]
    assert "ranks 0, 1, 2 wait 30.0 ms for it" in f.message
    assert len(f.evidence["per_rank"]) == 4 and f.fix is not None
    medians = {m["rank"]: m for m in f.evidence["medians"]}  # what the verdict rests on, for every rank
    assert medians[3]["own_s"] == 0.095 and medians[0]["own_s"] == 0.07 and medians[0]["comm_s"] == 0.03


def test_a_stall_of_three_windows_is_not_a_straggler():
    windows = _series(_healthy(), _slow(2), _slow(2), _slow(2), _healthy(), _slow(2), _healthy(), _healthy())
    assert stragglers(windows) == []
    verdict = _by_id(judge_windows(windows), "GD-WATCH-009")
    assert [f.severity for f in verdict] == [Severity.PASS]


def test_the_rank_that_waits_longest_is_not_blamed_for_the_others():
    # rank 0 does more work but also waits longest in the all-reduce: not the one the others wait for
    busy_but_waiting = tuple(_rank(r, compute=0.085, comm=0.040) if r == 0 else _rank(r) for r in range(4))
    assert stragglers(_series(*[busy_but_waiting] * 5)) == []


def test_a_healthy_world_names_nobody_and_says_every_ranks_medians():
    findings = judge_windows(_series(*[_healthy()] * 8))
    assert {f.id: f.severity for f in findings} == {
        "GD-WATCH-009": Severity.PASS,
        "GD-WATCH-010": Severity.PASS,
        "GD-WATCH-011": Severity.PASS,
        "GD-WATCH-012": Severity.PASS,
    }
    verdict = _by_id(findings, "GD-WATCH-009")[0]
    assert "own work a step 70.0 ms to 70.0 ms across ranks" in verdict.message
    assert [m["rank"] for m in verdict.evidence["medians"]] == [0, 1, 2, 3]
    assert verdict.evidence["medians"][0]["windows"] == 7  # the first window (warm-up) left out


def test_a_rank_slow_in_bursts_is_judged_on_its_windows_totals():
    # a CPU quota's throttled periods: the slow rank's mean own work is 4x the others' (its median step would not
    # show it); the others wait for it
    def window(i: int) -> tuple[RankWindow, ...]:
        return tuple(_rank(r, compute=0.240, comm=0.002) if r == 2 else _rank(r, comm=0.210) for r in range(3))

    step = 0.002 + 0.240 + 0.002 + 0.008
    windows = [Window(i, float(i), tuple(replace(r, step_s=step, other_s=0.008) for r in window(i))) for i in range(5)]
    f = stragglers(windows)
    assert [x.evidence["rank"] for x in f] == [2] and f[0].evidence["part"] == "compute_s"
    assert rank_medians(windows)[2]["compute_s"] == 0.24


def test_noise_that_moves_from_rank_to_rank_is_not_a_straggler():
    # a loaded machine: each window one rank (another each time) loses time; no rank three windows in a row
    windows = _series(*[_slow(i // 3, world=3) for i in range(9)])  # three windows each, then the next rank
    assert stragglers(windows) == []


def test_a_rank_that_stopped_stepping_is_named_with_where_it_stopped():
    stopped = [Stopped(rank=1, count=30, how="closed", others_at=60, seen_by=0, host="node0", local_rank=1)]
    found = _by_id(judge_windows(_series(*[_healthy(2)] * 3), stopped=stopped), "GD-WATCH-012")
    assert [f.severity for f in found] == [Severity.WARN]
    assert found[0].message.startswith("rank 1 on node0 stopped stepping at step 30 while another rank went on to")
    assert found[0].evidence["how"] == "closed" and found[0].evidence["step"] == 30
    unknown = Stopped(rank=-1, count=None, how="silent", others_at=40)
    assert (
        "a rank did not reach step 40 in time"
        in _by_id(judge_windows([], stopped=[unknown]), "GD-WATCH-012")[0].message
    )


def test_a_rank_waiting_for_data_is_input_bound_with_the_fix_check_derives():
    from gpudoctor.model import Finding, Fix, Safety

    starved = tuple(_rank(r, data=0.045, comm=0.002) if r == 1 else _rank(r) for r in range(4))
    advice = [
        Finding(
            "GD-DL-002",
            "dataloader-loads-in-main-process",
            "dataloader",
            Severity.WARN,
            "t",
            "num_workers=0: batches are loaded in the training process",
            {},
            Fix("Set num_workers to 3 (DataLoader(num_workers=3))", Safety.UNSAFE),
        )
    ]
    loader = {"num_workers": 0, "pin_memory": False, "persistent_workers": False}
    found = _by_id(judge_windows(_series(*[starved] * 4), advice, loader), "GD-WATCH-010")
    assert [f.severity for f in found] == [Severity.WARN]
    assert found[0].evidence["rank"] == 1 and found[0].evidence["data_share"] == 0.45
    assert "num_workers=0" in found[0].evidence["detail"] and "num_workers=3" in found[0].fix.title
    assert found[0].message == "rank 1 on node0 waits for data 45% of its step in 4 windows in a row"
    assert found[0].evidence["check_advice"] == {"GD-DL-002": advice[0].message}


def test_slower_than_its_own_first_windows_names_the_part_that_grew():
    slow = tuple(_rank(r, data=0.002, compute=0.060, comm=0.030, tokens=4096.0 * 0.6) for r in range(4))
    windows = _series(*[_healthy()] * 4, *[slow] * 3)
    found = _by_id(judge_windows(windows), "GD-WATCH-011")
    assert [f.severity for f in found] == [Severity.WARN]
    assert found[0].evidence["unit"] == "tokens/s" and found[0].evidence["windows"] == [4, 5, 6]
    assert "40% below" in found[0].message


def test_too_few_windows_is_a_skip_and_one_rank_has_no_straggler():
    findings = judge_windows(_series(_healthy(1), _healthy(1), _healthy(1)))
    assert {f.id: f.severity for f in findings} == {
        "GD-WATCH-009": Severity.SKIP,
        "GD-WATCH-010": Severity.PASS,
        "GD-WATCH-011": Severity.SKIP,
    }


def test_a_window_survives_its_dict():
    w = _rank(2)
    assert RankWindow.from_dict(w.to_dict()).to_dict() == w.to_dict()
