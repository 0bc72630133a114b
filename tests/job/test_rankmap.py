"""gpudoctor/job/rankmap.py: the launcher's rank -> node layout, rebuilt from rank 0's environment.

The srun cases follow srun(1) -m/--distribution's own example (three nodes, four tasks: block puts
tasks one and two on the first node, cyclic puts tasks one and four there).
"""

from __future__ import annotations

import pytest

from gpudoctor.job.rankmap import (
    Located,
    MissingOnNode,
    RankLayout,
    Unknown,
    block_order,
    cyclic_order,
    layout_of,
    locate_missing,
    to_facts,
)


@pytest.mark.parametrize(
    "counts, block, cyclic",
    [
        ([2, 1, 1], [0, 0, 1, 2], [0, 1, 2, 0]),  # srun(1)'s example
        ([2, 2], [0, 0, 1, 1], [0, 1, 0, 1]),
        ([3, 1], [0, 0, 0, 1], [0, 1, 0, 0]),
        ([1, 1, 1], [0, 1, 2], [0, 1, 2]),  # one task per node: the two agree
        ([4], [0, 0, 0, 0], [0, 0, 0, 0]),
        ([0, 2], [1, 1], [1, 1]),
    ],
)
def test_block_and_cyclic_orders(counts, block, cyclic):
    assert block_order(counts) == block
    assert cyclic_order(counts) == cyclic


SRUN_16 = {
    "SLURM_PROCID": "0",
    "SLURM_STEP_NUM_TASKS": "16",
    "SLURM_STEP_NODELIST": "gpu-[016-017]",
    "SLURM_STEP_TASKS_PER_NODE": "8(x2)",
}


@pytest.mark.parametrize(
    "env, launcher, world, node_of, rule",
    [
        (SRUN_16, "srun", 16, [0] * 8 + [1] * 8, "SLURM's block distribution"),
        ({**SRUN_16, "SLURM_DISTRIBUTION": "block"}, "srun", 16, [0] * 8 + [1] * 8, "SLURM's block distribution"),
        ({**SRUN_16, "SLURM_DISTRIBUTION": "*"}, "srun", 16, [0] * 8 + [1] * 8, "SLURM's block distribution"),
        ({**SRUN_16, "SLURM_DISTRIBUTION": "cyclic"}, "srun", 16, [0, 1] * 8, "SLURM's cyclic distribution"),
        ({**SRUN_16, "SLURM_DISTRIBUTION": "cyclic:fcyclic"}, "srun", 16, [0, 1] * 8, "SLURM's cyclic distribution"),
        ({**SRUN_16, "SLURM_DISTRIBUTION": "block,Pack"}, "srun", 16, [0] * 8 + [1] * 8, "SLURM's block distribution"),
        # no step variables (an older srun): the job's
        (
            {"SLURM_STEP_NUM_TASKS": "4", "SLURM_JOB_NODELIST": "a,b,c", "SLURM_TASKS_PER_NODE": "2,1(x2)"},
            "srun",
            4,
            [0, 0, 1, 2],
            "SLURM's block distribution",
        ),
        # a wrapper that exported RANK=$SLURM_PROCID: srun's tasks are still the ranks
        ({**SRUN_16, "RANK": "0", "WORLD_SIZE": "16"}, "env", 16, [0] * 8 + [1] * 8, "SLURM's block distribution"),
        (
            {"LOCAL_WORLD_SIZE": "8", "GROUP_WORLD_SIZE": "2", "GROUP_RANK": "0"},
            "torchrun",
            16,
            [0] * 8 + [1] * 8,
            "torchrun's rank order (8 per agent)",
        ),
    ],
)
def test_layouts_the_launcher_used(env, launcher, world, node_of, rule):
    layout = layout_of(env, launcher, world)
    assert isinstance(layout, RankLayout), layout
    assert list(layout.node_of) == node_of and layout.rule == rule


def test_slurm_layout_names_the_hosts_and_torchrun_the_group_ranks():
    assert layout_of(SRUN_16, "srun", 16).nodes == ("gpu-016", "gpu-017")
    torchrun = layout_of({"LOCAL_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "2"}, "torchrun", 4)
    assert torchrun.nodes == ("torchrun's group rank 0", "torchrun's group rank 1") and torchrun.by_index


@pytest.mark.parametrize(
    "env, launcher, world, why",
    [
        ({**SRUN_16, "SLURM_DISTRIBUTION": "plane"}, "srun", 16, "SLURM_DISTRIBUTION=plane"),
        ({**SRUN_16, "SLURM_DISTRIBUTION": "arbitrary"}, "srun", 16, "SLURM_DISTRIBUTION=arbitrary"),
        ({**SRUN_16, "SLURM_STEP_TASKS_PER_NODE": "8,7"}, "srun", 16, "add up to 15"),
        ({**SRUN_16, "SLURM_STEP_TASKS_PER_NODE": "8(x3)"}, "srun", 16, "2 node(s)"),
        ({**SRUN_16, "SLURM_STEP_NODELIST": "gpu-[017-016]"}, "srun", 16, "runs backwards"),
        ({**SRUN_16, "SLURM_STEP_TASKS_PER_NODE": "eight"}, "srun", 16, "cannot read"),
        ({k: v for k, v in SRUN_16.items() if k != "SLURM_STEP_NODELIST"}, "srun", 16, "no SLURM_STEP_NODELIST"),
        ({**SRUN_16, "RANK": "3"}, "env", 16, "no layout to read"),  # RANK is not the task id
        ({"RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}, "env", 4, "no layout to read"),
        ({"LOCAL_WORLD_SIZE": "8", "GROUP_WORLD_SIZE": "2"}, "torchrun", 12, "different --nproc-per-node"),
        ({"LOCAL_WORLD_SIZE": "8"}, "torchrun", 16, "no LOCAL_WORLD_SIZE/GROUP_WORLD_SIZE"),
        (SRUN_16, "srun", 0, "world size 0"),
    ],
)
def test_layouts_that_cannot_be_rebuilt_say_why(env, launcher, world, why):
    layout = layout_of(env, launcher, world)
    assert isinstance(layout, Unknown) and why in layout.reason, layout


def test_a_whole_missing_node_is_named_by_host():
    layout = layout_of(SRUN_16, "srun", 16)
    got = locate_missing(layout, list(range(8, 16)), {r: 0 for r in range(8)})
    assert got == Located("SLURM's block distribution", (MissingOnNode("gpu-017", 1, tuple(range(8, 16)), True),))
    assert to_facts(got)["nodes"] == [{"node": "gpu-017", "index": 1, "ranks": list(range(8, 16)), "whole": True}]


def test_missing_ranks_on_a_node_that_reported_are_not_a_missing_node():
    layout = layout_of({**SRUN_16, "SLURM_DISTRIBUTION": "cyclic"}, "srun", 16)
    missing = [3, 8, 10, 12, 14]  # cyclic: odd ranks on gpu-017, even on gpu-016
    arrived = {r: r % 2 for r in range(16) if r not in missing}
    got = locate_missing(layout, missing, arrived)
    assert isinstance(got, Located)
    assert [(m.node, m.ranks, m.whole) for m in got.nodes] == [
        ("gpu-016", (8, 10, 12, 14), False),
        ("gpu-017", (3,), False),
    ]


def test_a_layout_the_arrived_ranks_contradict_names_no_node():
    # the step really ran cyclic, but rank 0 was told block: rank 1 says it is on node 1
    layout = layout_of(SRUN_16, "srun", 16)
    got = locate_missing(layout, [15], {r: r % 2 for r in range(15)})
    assert isinstance(got, Unknown) and "rank 1 reported node index 1" in got.reason
    assert to_facts(got) == {"rule": None, "unknown": got.reason, "nodes": []}


def test_ranks_without_a_node_index_do_not_contradict():
    layout = layout_of({"LOCAL_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "3"}, "torchrun", 6)
    got = locate_missing(layout, [2, 3, 5], {0: None, 1: None, 4: None})
    assert isinstance(got, Located)
    assert [(m.index, m.ranks, m.whole) for m in got.nodes] == [(1, (2, 3), True), (2, (5,), False)]


def test_unknown_passes_through():
    assert locate_missing(Unknown("why"), [1], {0: 0}) == Unknown("why")


def _judged_message(missing: list[int], located) -> str:
    from gpudoctor.facts import SCHEMA, Facts
    from gpudoctor.factschema import first_problem
    from gpudoctor.job.compare import Member, view
    from gpudoctor.model import Context
    from gpudoctor.registry import load_all
    from gpudoctor.runner import run_checks

    world = 16
    members = [
        Member(rank=r, node="gpu-016", hostname="gpu-016", node_index=0) for r in range(world) if r not in missing
    ]
    job = view(members, source="live", world_size=world, missing=missing)
    job.update(timeout_s=6.0, missing_where=to_facts(located), missing_nodes=[])
    assert first_problem({"schema": SCHEMA, "job": job}) is None
    (finding,) = run_checks([load_all()["GD-JOB-001"]], Facts(sections={"job": job}), Context())
    assert finding.severity.value == "fail" and len(finding.message) <= 120
    return f"{finding.message}: {finding.evidence['detail']}" if "detail" in finding.evidence else finding.message


def test_the_finding_names_the_missing_node_and_the_rule():
    layout = layout_of(SRUN_16, "srun", 16)
    missing = list(range(8, 16))
    message = _judged_message(missing, locate_missing(layout, missing, {r: 0 for r in range(8)}))
    assert message == (
        "ranks 8–15 of a world of 16 never reported within 6 s (8 arrived): "
        "node gpu-017 missing entirely (ranks 8–15), by SLURM's block distribution"
    )


def test_the_finding_places_single_ranks_and_says_when_it_cannot():
    layout = layout_of(SRUN_16, "srun", 16)
    message = _judged_message([9], locate_missing(layout, [9], {r: r // 8 for r in range(16) if r != 9}))
    assert message.endswith("(15 arrived): rank 9 on node gpu-017, by SLURM's block distribution")
    plane = layout_of({**SRUN_16, "SLURM_DISTRIBUTION": "plane"}, "srun", 16)
    message = _judged_message([9], locate_missing(plane, [9], {}))
    assert message.endswith(
        "(15 arrived): which node: unknown (SLURM_DISTRIBUTION=plane (only block and cyclic are rebuilt))"
    )


def test_torchrun_nodes_are_named_by_the_host_their_arrived_ranks_reported():
    layout = layout_of({"LOCAL_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "3"}, "torchrun", 6)
    got = locate_missing(layout, [3, 4, 5], {0: 0, 1: 0, 2: 1}, hosts={0: "gpu-001", 1: "gpu-002"})
    assert isinstance(got, Located)
    assert [(m.node, m.ranks, m.whole) for m in got.nodes] == [
        ("gpu-002 (torchrun's group rank 1)", (3,), False),
        ("2 (torchrun's group rank 2)", (4, 5), True),
    ]
