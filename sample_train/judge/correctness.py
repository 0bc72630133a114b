"""Did every rank compute right? The judgement of the correctness tests each rank ran (selftest.py) (no torch).

- Bitwise agreement: the matmul chains and the training step of every rank are compared with the other ranks of
  the same kind — one GPU model with the same SM count, torch and CUDA (cuBLAS's reproducibility promise holds
  only there), or one CPU model, torch and thread count. A rank whose fingerprint differs from its group's
  majority is named; where there is no majority (two ranks that differ), every rank of the group is named.
- The float64 reference: a rank whose small matmul is further from float64 than its rounding allows is named.
- The memory pattern test: a rank whose device memory read back a wrong word is named.
A rank with no other rank of its kind is compared with float64 only, and the report says so.
"""

from __future__ import annotations

from collections import Counter

from gpudoctor.model import Severity, manual
from gpudoctor.sample_train.judge.findings import make, ranks_text
from gpudoctor.sample_train.judge.slowness import where

BITWISE_TESTS = ("chain_bf16", "chain_fp32", "train_step")
WHAT = {
    "chain_bf16": "bf16 matmul chain",
    "chain_fp32": "fp32 matmul chain",
    "train_step": "MLP training step",
}


def _kind(join: dict) -> tuple:
    if join.get("device_type") == "cuda":
        return (
            "cuda",
            join.get("gpu_name"),
            join.get("multiprocessors"),
            tuple(join.get("compute_capability") or ()),
            join.get("torch"),
            join.get("cuda"),
        )
    return ("cpu", join.get("cpu_model"), join.get("cpu_threads"), join.get("torch"))


def _kind_text(kind: tuple) -> str:
    if kind[0] == "cuda":
        return f"{kind[1]} ({kind[2]} SMs), torch {kind[4]}, CUDA {kind[5]}"
    return f"CPU {kind[1]}, {kind[2]} thread(s), torch {kind[3]}"


def judge(ranks: list[dict], joins: dict, results: list[dict]) -> tuple[dict, list]:
    """(the report's correctness section, findings GD-SMOKE-021 and GD-SMOKE-022)."""
    tests = {r["rank"]: r.get("correctness") or {} for r in results}
    row_of = {r["rank"]: r for r in ranks}
    groups: dict[tuple, list[int]] = {}
    for rank in sorted(tests):
        groups.setdefault(_kind(joins[rank]), []).append(rank)

    wrong: dict[int, list[str]] = {}
    could_not: dict[int, list[str]] = {}
    alone = []
    for members in groups.values():
        if len(members) < 2:
            alone += members
        for test in BITWISE_TESTS:
            prints = {m: tests[m].get(test) for m in members}
            for m, value in prints.items():
                if not isinstance(value, str):
                    could_not.setdefault(m, []).append(f"{WHAT[test]}: {(value or {}).get('error', 'not run')}")
            known = {m: v for m, v in prints.items() if isinstance(v, str)}
            if len(known) < 2:
                continue
            counts = Counter(known.values()).most_common()
            majority = counts[0][0] if len(counts) == 1 or counts[0][1] > counts[1][1] else None
            for m, value in known.items():
                if value != majority:
                    wrong.setdefault(m, []).append(f"{WHAT[test]} differs from its {_peers(len(known), majority)}")
    for rank, t in tests.items():
        for ref in t.get("reference") or []:
            if "error" in ref:
                could_not.setdefault(rank, []).append(f"float64 reference: {ref['error']}")
            elif ref["rel_error"] > ref["tolerance"]:
                wrong.setdefault(rank, []).append(
                    f"{ref['dtype']} matmul (n={ref['n']}) is {ref['rel_error']:.2e} from float64 "
                    f"(tolerance {ref['tolerance']:.1e})"
                )
    memory: dict[int, dict] = {rank: t.get("memory") or {} for rank, t in tests.items()}
    bad_memory = {rank: m for rank, m in memory.items() if m.get("errors")}
    for rank, tested in memory.items():
        if "error" in tested:
            could_not.setdefault(rank, []).append(f"memory pattern test: {tested['error']}")

    section = {
        "verdict": "fail" if wrong or bad_memory else ("incomplete" if could_not else "pass"),
        "compared": "bitwise across ranks of one kind (GPU model, SM count, torch, CUDA; or CPU model, threads, "
        "torch), and each rank's small matmul against float64",
        "groups": [{"kind": _kind_text(kind), "ranks": members} for kind, members in groups.items()],
        "compared_with_float64_only": sorted(alone),
        "per_rank": [{"rank": rank, **tests[rank]} for rank in sorted(tests)],
        "wrong": [{**_identity(row_of[r]), "tests": wrong[r]} for r in sorted(wrong)],
        "could_not_run": [{"rank": r, "tests": could_not[r]} for r in sorted(could_not)],
    }
    return section, [_results_finding(wrong, could_not, alone, row_of, groups), _memory_finding(memory, row_of)]


def _peers(n: int, majority: str | None) -> str:
    return f"{n - 1} peer(s)' majority" if majority else "peer (no majority: either may be wrong)"


def _identity(row: dict) -> dict:
    return {k: row.get(k) for k in ("rank", "host", "gpu_index", "gpu_uuid")}


DIAGNOSE = manual(
    "Take the named GPU(s) out of service and run the vendor's diagnostics",
    "dcgmi diag -r 3   (or -r 4: the memory and SM stress tests)",
    "nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER",
)


def _results_finding(wrong: dict, could_not: dict, alone: list, row_of: dict, groups: dict):
    n = len(row_of)
    if wrong:
        named = "; ".join(f"{where(row_of[r])}: {', '.join(wrong[r])}" for r in sorted(wrong))
        return make(
            "GD-SMOKE-021",
            Severity.FAIL,
            f"{ranks_text(wrong)} computed wrong results: {named}. Identical inputs on identical devices must give "
            "identical bits; a GPU that computes wrong values trains to NaN or diverges days later",
            DIAGNOSE,
            ranks=sorted(wrong),
            wrong={r: wrong[r] for r in sorted(wrong)},
        )
    if could_not:
        named = "; ".join(f"rank {r}: {', '.join(could_not[r])}" for r in sorted(could_not))
        return make(
            "GD-SMOKE-021",
            Severity.WARN,
            f"the correctness tests could not run on {ranks_text(could_not)} ({named}): these ranks' results are "
            "not known to be right",
            could_not_run={r: could_not[r] for r in sorted(could_not)},
        )
    kinds = len(groups)
    message = (
        f"all {n} rank(s) computed right: bit-identical matmul chains (bf16, fp32) and training step across each "
        f"kind of device ({kinds} kind(s)), and within rounding of float64"
    )
    if alone:
        message += f"; {ranks_text(alone)} had no other rank of its kind and was compared with float64 only"
    return make("GD-SMOKE-021", Severity.PASS, message, compared_with_float64_only=sorted(alone))


def _memory_finding(memory: dict, row_of: dict):
    bad = {r: m for r, m in memory.items() if m.get("errors")}
    if bad:
        named = "; ".join(
            f"{where(row_of[r])}: {m['errors']} wrong word(s) in {m['bytes'] / 2**20:,.0f} MiB" for r, m in bad.items()
        )
        return make(
            "GD-SMOKE-022",
            Severity.FAIL,
            f"device memory read back wrong values on {ranks_text(bad)}: {named}",
            DIAGNOSE,
            ranks=sorted(bad),
            errors={r: m["errors"] for r, m in bad.items()},
        )
    tested = [m for m in memory.values() if m.get("bytes")]
    if len(tested) < len(memory):
        missing = sorted(r for r, m in memory.items() if not m.get("bytes"))
        reasons = {m.get("error") or m.get("reason") for r, m in memory.items() if not m.get("bytes")}
        return make(
            "GD-SMOKE-022",
            Severity.WARN,
            f"the memory pattern test did not run on {ranks_text(missing)} ({'; '.join(sorted(map(str, reasons)))})",
            ranks_not_tested=missing,
        )
    least = min((m["bytes"] for m in tested), default=0)
    return make(
        "GD-SMOKE-022",
        Severity.PASS,
        f"device memory read back right on all {len(tested)} rank(s) ({least / 2**20:,.0f} MiB or more each, "
        f"{tested[0].get('patterns', 3) if tested else 3} patterns)",
    )
