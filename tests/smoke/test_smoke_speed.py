"""Will it run fast: the robust comparisons, the node-pair search, baselines, floors and the --exclude line.

Pure: the judgement over rank results shaped as real ranks write them (tests/smoke/test_smoke.py fake_result);
the real runs with real slowness are in test_smoke_slowness.py.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from gpudoctor.readers.slurmfmt import compress_hostlist, expand_nodelist
from gpudoctor.sample_train.coordinator import Verdict, plan_run
from gpudoctor.sample_train.judge import baseline, outliers, report
from gpudoctor.sample_train.options import OptionsError, SmokeOptions
from tests.smoke.test_smoke import FALLING, fake_result


# -- robust outliers --------------------------------------------------------------------------------
def test_healthy_jitter_names_nobody_and_one_slow_value_is_named():
    jitter = {r: 100 * (1 + 0.04 * math.sin(r)) for r in range(8)}  # +-4 %
    assert outliers.slow_ones(jitter, 0.13)[0] == []
    found, reference = outliers.slow_ones({**jitter, 3: 70.0}, 0.13)
    assert [s.key for s in found] == [3] and 0.25 < found[0].shortfall < 0.35 and 97 < reference < 103


def test_a_wide_spread_raises_the_bar_and_the_gap_is_a_floor():
    spread = {0: 100.0, 1: 60.0, 2: 140.0, 3: 80.0, 4: 120.0, 5: 100.0}  # no outlier: the job varies this much
    assert outliers.slow_ones(spread, 0.13)[0] == []
    few = {0: 100.0, 1: 60.0, 2: 140.0, 3: 100.0}  # too few values for a spread: the gap alone decides
    assert [s.key for s in outliers.slow_ones(few, 0.13)[0]] == [1]
    assert outliers.slow_ones({0: 100.0, 1: 100.0, 2: 100.0, 3: 90.0}, 0.13)[0] == []  # 10 % < the 13 % gap


def test_two_values_compare_the_lower_with_the_higher():
    assert [s.key for s in outliers.slow_ones({0: 100.0, 1: 40.0}, 0.5)[0]] == [1]
    assert outliers.slow_ones({0: 100.0, 1: 60.0}, 0.5)[0] == []
    assert outliers.slow_ones({0: 100.0}, 0.1) == ([], None)


@given(st.integers(min_value=2, max_value=64), st.booleans())
@settings(max_examples=60, deadline=None)
def test_pair_rounds_are_disjoint_and_every_node_meets_two_others(n, every):
    rounds = outliers.pair_rounds(n, every=every)
    met: dict[int, set[int]] = {v: set() for v in range(n)}
    seen = set()
    for pairs in rounds:
        nodes = [v for pair in pairs for v in pair]
        assert len(nodes) == len(set(nodes)), "a node in two pairs of one round"
        for a, b in pairs:
            assert 0 <= a < b < n and (a, b) not in seen
            seen.add((a, b))
            met[a].add(b)
            met[b].add(a)
    assert all(len(m) >= min(2, n - 1) for m in met.values())
    if every:
        assert len(seen) == n * (n - 1) // 2
    else:
        assert len(rounds) >= math.ceil(math.log2(n))
        assert len(rounds) <= max(3, math.ceil(math.log2(n)) + 2)  # log2, not a round-robin


@pytest.mark.parametrize("n", [3, 4, 5, 8, 16])
def test_a_slow_node_is_found_among_n(n):
    for slow in range(n):
        rates = {p: (0.01 if slow in p else 1.0) for pairs in outliers.pair_rounds(n) for p in pairs}
        found = outliers.localise(rates, 0.25)
        assert [s.key for s in found.slow_nodes] == [slow], (n, slow, rates)
        assert found.slow_links == [] and found.undecided == []


def test_a_slow_link_between_two_healthy_nodes_is_the_link():
    rates = {p: 1.0 for pairs in outliers.pair_rounds(4) for p in pairs}
    rates[(1, 2)] = 0.1
    found = outliers.localise(rates, 0.25)
    assert found.slow_nodes == [] and [link for link, _, _ in found.slow_links] == [(1, 2)]


def test_two_nodes_cannot_be_split():
    found = outliers.localise({(0, 1): 0.01}, 0.25)
    assert found.slow_nodes == [] and found.slow_links == [] and found.undecided == [(0, 1)]


@given(st.lists(st.from_regex(r"[a-z]{1,4}[0-9]{0,3}", fullmatch=True), min_size=1, max_size=30))
@settings(max_examples=100, deadline=None)
def test_compressed_hostlist_expands_back(hosts):
    assert sorted(expand_nodelist(compress_hostlist(hosts))) == sorted(set(hosts))


def test_compressed_hostlist_as_slurm_writes_it():
    assert compress_hostlist(["gpu01", "gpu02", "gpu03", "gpu07", "login"]) == "login,gpu[01-03,07]"
    assert compress_hostlist(["gdnode2"]) == "gdnode2"


# -- the judgement over a world of nodes -------------------------------------------------------------
def world(n_nodes: int, per_node: int = 1, *, slow_link: int | None = None, slow_part: int | None = None):
    """Rank results of n_nodes hosts node1..nodeN, as the ranks write them, with node pair exchanges done in the
    plan's rounds; slow_link: that node's exchanges run at 1 % of the others'; slow_part: that rank's memory copy
    runs at a third."""
    opts = SmokeOptions.of(device="cpu")
    joins = {}
    for rank in range(n_nodes * per_node):
        node = rank // per_node
        joins[rank] = {
            "rank": rank,
            "local_rank": rank % per_node,
            "host": f"node{node + 1}",
            "node_index": node,
            "device_type": "cpu",
            "device": "cpu",
            "pid": 1000 + rank,
        }
    plan = plan_run(joins, opts)
    results = {}
    node_of = {r: i for i, ranks in enumerate(plan["nodes"]) for r in ranks}
    for rank, join in joins.items():
        r = fake_result(rank, FALLING)
        r["host"] = join["host"]
        r["parts"] = {"ffn_gemm": {"tflops": 0.05}, "memory_copy": {"gbps": 10.0 if rank != slow_part else 3.0}}
        r["condition"] = {"cpu": {"cpu_limit": 0.2 if rank == slow_part else None, "affinity_cpus": 2, "load_1m": 1}}
        exchanges = []
        for number, pairs in enumerate(plan["node_rounds"]):
            for a, b in pairs:
                if node_of[rank] in (a, b):
                    other = plan["nodes"][b if node_of[rank] == a else a]
                    position = plan["nodes"][node_of[rank]].index(rank)
                    gbps = 0.01 if slow_link in (a, b) else 1.0
                    exchanges.append({"round": number, "peer": other[position], "gbps": gbps})
        r["node_pairs"] = exchanges
        results[rank] = r
    return opts, joins, plan, results


def build(opts, joins, plan, results):
    verdict = Verdict(True, [], joins, results, {}, plan)
    launch = {"mode": "torchrun", "world_size": len(joins), "backend": "gloo", "reporter": {"role": "rank", "pid": 1}}
    rep = report.build(verdict, opts, launch, 1.0)
    return rep, {f["id"]: f for f in rep["findings"]}


def test_a_slow_node_link_is_named_with_the_exclude_line():
    rep, found = build(*world(4, 2, slow_link=2))
    f = found["GD-SMOKE-018"]
    assert f["severity"] == "warn" and f["evidence"]["slow_nodes"] == ["node3"], f["message"]
    assert rep["exclude"]["sbatch"] == "--exclude=node3" and rep["exclude"]["keep_hosts"] == ["node1", "node2", "node4"]
    assert rep["links"]["rounds"] == 2 and len(rep["links"]["pairs"]) == 4


def test_a_healthy_world_names_nobody():
    for shape in ((1, 4), (2, 2), (3, 1), (4, 2)):
        rep, found = build(*world(*shape))
        assert rep["ok"] and rep["exclude"] is None, shape
        assert all(found[i]["severity"] in ("pass", "skip", "info") for i in ("GD-SMOKE-010", "GD-SMOKE-016"))


def test_a_slow_part_is_named_with_rank_host_and_the_cpu_quota_as_the_reason():
    rep, found = build(*world(4, 1, slow_part=2))
    f = found["GD-SMOKE-016"]
    assert f["severity"] == "warn" and f["evidence"]["ranks"] == [2]
    assert "rank 2 on node3" in f["message"] and "device memory copy" in f["message"]
    assert "its cgroup's CPU quota is 0.2 CPU" in f["message"]
    assert rep["exclude"]["sbatch"] == "--exclude=node3"


def test_two_nodes_say_the_pair_cannot_be_split():
    rep, found = build(*world(2, 1, slow_link=1))
    assert found["GD-SMOKE-018"]["severity"] == "pass"
    assert "cannot tell" in found["GD-SMOKE-018"]["message"] and rep["links"]["undecided"]


def test_floors_fail_naming_the_part_and_the_pair():
    opts, joins, plan, results = world(3, 1, slow_link=0)
    opts.floors.parts["min_membw_gbps"], opts.floors.min_linkbw_gbps, opts.floors.min_scaling = 5.0, 0.5, 0.99
    rep, found = build(opts, joins, plan, results)
    f = found["GD-SMOKE-020"]
    assert f["severity"] == "fail" and "nodes node1 - node2" in f["message"] and "memory" not in f["message"]
    assert found["GD-SMOKE-019"]["severity"] == "fail"  # fake steps: 0.05 s of compute in a 0.1 s step
    assert rep["floors"]["min_linkbw_gbps"] == 0.5 and not rep["ok"]


# -- baselines -------------------------------------------------------------------------------------------
def test_a_baseline_saved_then_compared(tmp_path):
    rep, _ = build(*world(2, 2))
    saved = tmp_path / "base.json"
    saved.write_text(json.dumps(baseline.from_report(rep)))
    loaded = baseline.load(str(saved))
    assert loaded["kind"]["world_size"] == 4 and loaded["figures"]["memory_copy_gbps"] == 10.0

    opts, joins, plan, results = world(2, 2, slow_part=3)
    opts.measure.baseline, opts.measure.baseline_path = loaded, str(saved)
    rep, found = build(opts, joins, plan, results)
    f = found["GD-SMOKE-017"]
    assert f["severity"] == "warn" and f["evidence"]["ranks"] == [3] and "baseline" in f["message"]

    opts, joins, plan, results = world(4, 1)  # the same ranks, another layout: refused, exit 2
    opts.measure.baseline, opts.measure.baseline_path = loaded, str(saved)
    rep, _ = build(opts, joins, plan, results)
    assert rep["exit_code"] == 2 and "nodes 2 there, 4 here" in rep["refused"]
    assert baseline.early_mismatch(loaded, 8, "cpu") and baseline.early_mismatch(loaded, 4, "cuda")
    assert baseline.early_mismatch(loaded, 4, "cpu") is None


@pytest.mark.parametrize(
    "content, says",
    [
        ("{", "not JSON"),
        ('{"schema": "gpudoctor.smoke/1"}', "not a gpudoctor.smoke-baseline/1 file"),
        ('{"schema": "gpudoctor.smoke-baseline/1", "kind": [], "figures": {}}', "must be objects"),
        ('{"schema": "gpudoctor.smoke-baseline/1", "kind": {}, "figures": {"x": "fast"}}', "not a non-negative"),
        (b"\xff\xfe", "not JSON"),
    ],
)
def test_a_bad_baseline_is_one_line(tmp_path, content, says):
    path = tmp_path / "b.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(OptionsError, match=says):
        baseline.load(str(path))
    with pytest.raises(OptionsError, match="cannot read"):
        baseline.load(str(tmp_path / "missing.json"))


# -- the real command (the saved-then-judged baseline is in test_smoke_run.py, on its shared healthy run) --
@pytest.mark.parametrize("flag, target", [("--baseline", "missing.json"), ("--save-baseline", "no/such/dir/b.json")])
def test_a_baseline_path_that_cannot_be_used_is_one_line_and_exit_2(tmp_path, flag, target):
    from tests.cliutil import run_gpudoctor

    r = run_gpudoctor("smoke", "--device", "cpu", flag, str(tmp_path / target), timeout=60, cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and flag in r.stderr


# -- a GPU-shaped run: NVML's reasons and the model's reference --------------------------------------------------
def h100_world(slow_rank: int):
    from tests.smoke.test_smoke_gpu_path import gpu_join, gpu_result

    opts = SmokeOptions.of(device="cuda")
    joins = {r: {**gpu_join(r, uuid=f"GPU-{r}"), "device_index": r, "pid": 7000 + r} for r in range(8)}
    plan = plan_run(joins, opts)
    results = {}
    for r in range(8):
        # 256 MiB all-reduced in 1.3 ms: busbw 361 GB/s, what 8 x H100 SXM reach at that size (GD-SMOKE-026)
        res = gpu_result(r, 0.3, allreduce_s=0.0013)
        slow = r == slow_rank
        res["parts"] = {
            "ffn_gemm": {"tflops": 620.0},
            "memory_copy": {"gbps": 1000.0 if slow else 2900.0},
            "h2d": {"gbps": 20.0 if slow else 52.0},
            "d2h": {"gbps": 51.0},
        }
        res["condition"] = {
            "gpu": {
                "throttle_reasons": {"active": ["hw_slowdown", "gpu_idle"] if slow else ["gpu_idle"]},
                "sm_clock_mhz": 1200 if slow else 1980,
                "sm_clock_max_mhz": 1980,
                "pcie": {"gen_current": 5, "gen_max": 5, "width_current": 8 if slow else 16, "width_max": 16},
                "power_limit_w": 700.0,
                "power_limit_default_w": 700.0,
                "processes": [{"pid": 7000 + r}, *([{"pid": 4242}] if slow else [])],
            }
        }
        results[r] = res
    return opts, joins, plan, results


def test_a_slow_gpu_is_named_with_nvmls_reasons_and_its_models_expectation():
    rep, found = build(*h100_world(5))
    f = found["GD-SMOKE-016"]
    assert f["severity"] == "warn" and f["evidence"]["ranks"] == [5]
    message = f["message"]
    assert "rank 5 on n1 GPU 5 (GPU-5): device memory copy 1,000 GB/s, 66% below the job's median 2,900" in message
    for reason in ("clocks held down: hw_slowdown", "SM clock 1200 of 1980 MHz", "PCIe link x8 of x16"):
        assert reason in message
    assert "other processes on the GPU: PID 4242" in message and "7005" not in message  # its own PID is not "other"
    expected = found["GD-SMOKE-017"]
    assert expected["severity"] == "warn" and expected["evidence"]["ranks"] == [5]
    assert "H100 SXM" in expected["message"]
    below = {(b["rank"], b["part"]) for b in rep["expectations"]["below"]}
    assert below == {(5, "memory_copy_gbps"), (5, "h2d_gbps")}
    assert rep["exclude"]["sbatch"] == "--exclude=n1" and rep["exclude"]["note"]  # the only host of the run


def test_a_healthy_gpu_world_meets_its_reference_and_names_nobody():
    rep, found = build(*h100_world(-1))
    assert found["GD-SMOKE-016"]["severity"] == "pass" and found["GD-SMOKE-017"]["severity"] == "pass"
    assert rep["exclude"] is None and rep["ok"]


def test_a_gpu_without_reference_is_info_never_a_fail():
    opts, joins, plan, results = h100_world(-1)
    for j in joins.values():
        j["gpu_name"] = "NVIDIA Imaginary X1"
    rep, found = build(opts, joins, plan, results)
    f = found["GD-SMOKE-017"]
    assert f["severity"] == "info" and "no reference for NVIDIA Imaginary X1: give --baseline" in f["message"]


def test_the_smoke_figures_as_prometheus_gauges():
    from gpudoctor.report import prometheus

    rep, _ = build(*world(4, 1, slow_link=2))
    families = {f.name: f for f in text_string_to_metric_families(prometheus.render_smoke(rep, 1764000000.0))}
    assert families["gpudoctor_smoke_ok"].samples[0].value == 1
    assert {s.labels["host"] for s in families["gpudoctor_smoke_excluded"].samples} == {"node3"}
    links = {(s.labels["a"], s.labels["b"]): s.value for s in families["gpudoctor_smoke_link_gbps"].samples}
    assert links[("node1", "node3")] == 0.01 and links[("node1", "node4")] == 1.0
    assert families["gpudoctor_smoke_last_run_timestamp_seconds"].samples[0].value == 1764000000.0
    problem = {s.labels["id"]: s.value for s in families["gpudoctor_smoke_check_problem"].samples}
    assert problem["GD-SMOKE-018"] == 1 and problem["GD-SMOKE-006"] == 0


def test_deep_names_a_rank_slow_with_every_peer_inside_its_node():
    opts, joins, plan, results = world(1, 4)
    opts.measure.deep = True
    plan["local_rounds"] = outliers.pair_rounds(4, every=True)
    for rank, r in results.items():
        r["local_pairs"] = [
            {"peer": b if rank == a else a, "gbps": 0.02 if 2 in (a, b) else 2.0}
            for pairs in plan["local_rounds"]
            for a, b in pairs
            if rank in (a, b)
        ]
    rep, found = build(opts, joins, plan, results)
    assert [n["slow_ranks"] for n in rep["local_pairs"]] == [[2]] and len(rep["local_pairs"][0]["pairs"]) == 6
    f = found["GD-SMOKE-018"]
    assert f["severity"] == "warn" and f["evidence"]["ranks"] == [2] and "inside node node1, rank 2" in f["message"]
