"""Who is slow: each part compared with the job's own median, and the search for a slow node or link (no torch).

Robust statistics, so that the slow one cannot hide by dragging the average with it: the median, and the
median absolute deviation (MAD) scaled by 1.4826 to estimate a standard deviation; a value is an outlier
when it falls below the median by more than Z_LIMIT such deviations (Iglewicz and Hoaglin's modified
z-score, 3.5) AND by more than a minimum relative gap, so that a healthy job whose figures agree to a few
per cent (MAD near zero) names nobody for normal jitter. Every figure here is a rate: higher is better.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass

from gpudoctor.sample_train.judge import metrics

MAD_SCALE = 1.4826  # MAD x this estimates the standard deviation of normally distributed data
Z_LIMIT = 3.5  # Iglewicz & Hoaglin (1993): |modified z| > 3.5 is an outlier
# Below this many values the MAD says little (with four, one slow and one lucky rank make it as wide as the
# gap itself), so the minimum gap alone decides.
MIN_FOR_SPREAD = 6


@dataclass(frozen=True)
class Slow:
    key: Hashable
    value: float
    reference: float  # the job's median (or, with two values, the better one)
    shortfall: float  # 0.3: 30 % below the reference


def slow_ones(values: dict, min_gap: float) -> tuple[list[Slow], float | None]:
    """The keys whose rate is an outlier below the others, worst first; and the reference they were held to.

    Three values or more: against the median, by min_gap, and from MIN_FOR_SPREAD values on also by the robust
    z-score. Two: the lower against the higher, by min_gap alone (slowness, not speed, is the fault).
    """
    known = {k: v for k, v in values.items() if v is not None and math.isfinite(v) and v >= 0}
    if len(known) < 2:
        return [], None
    if len(known) == 2:
        reference = max(known.values())
    else:
        reference = metrics.median(list(known.values())) or 0.0
    spread = 0.0
    if len(known) >= MIN_FOR_SPREAD:
        spread = Z_LIMIT * MAD_SCALE * (metrics.median([abs(v - reference) for v in known.values()]) or 0.0)
    if reference <= 0:
        return [], reference
    limit = reference - max(spread, min_gap * reference)
    slow = [Slow(k, v, reference, 1 - v / reference) for k, v in known.items() if v < limit]
    return sorted(slow, key=lambda s: s.value), reference


# -- pairs of nodes ------------------------------------------------------------------------------
def pair_rounds(n: int, every: bool = False) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint node pairs, from the circle method of a round-robin tournament (a node sits a round
    out when n is odd). Enough rounds that there are at least log2(n) of them and every node meets two others
    (so a node is compared through more than one partner); every=True: all rounds (each pair once)."""
    if n < 2:
        return []
    m = n + (n % 2)  # odd: a dummy node, whose partner sits the round out
    order = list(range(m))
    rounds = []
    for _ in range(m - 1):
        pairs = [(order[i], order[m - 1 - i]) for i in range(m // 2)]
        rounds.append([(min(a, b), max(a, b)) for a, b in pairs if a < n and b < n])
        order = [order[0], order[-1], *order[1:-1]]
    if every:
        return rounds
    want = max(1, math.ceil(math.log2(n)))
    met: dict[int, set[int]] = {node: set() for node in range(n)}
    chosen: list[list[tuple[int, int]]] = []
    for pairs in rounds:
        if len(chosen) >= want and all(len(met[v]) >= min(2, n - 1) for v in met):
            break
        chosen.append(pairs)
        for a, b in pairs:
            met[a].add(b)
            met[b].add(a)
    return chosen


@dataclass(frozen=True)
class Localised:
    slow_nodes: list[Slow]  # every pair with it is slow, while the others reach more elsewhere
    slow_links: list[tuple[tuple[int, int], float, float]]  # (pair, its rate, what both ends reach elsewhere)
    undecided: list[tuple[int, int]]  # slow pairs whose ends were measured with nobody else


def localise(pairs: dict[tuple[int, int], float], min_gap: float) -> Localised:
    """From each node pair's rate: the slow node(s), the slow link(s), and the pairs the data cannot split.

    A node's score is the best rate it reached with any partner: a node with a slow link of its own is slow
    with every partner, a healthy node is fast with at least one healthy partner. Slow scores (against the
    median node) name nodes. A pair of two healthy nodes that is slower than both ends reach elsewhere is a
    slow link between them. A slow-looking pair whose two ends met nobody else (two nodes) cannot be split.
    """
    partners: dict[int, list[tuple[int, int]]] = {}
    for pair in pairs:
        for node in pair:
            partners.setdefault(node, []).append(pair)
    score = {node: max(pairs[p] for p in ps) for node, ps in partners.items()}
    slow_nodes, _ = slow_ones(score, min_gap) if len(score) > 2 else ([], None)
    named = {s.key for s in slow_nodes}
    links, undecided = [], []
    for (a, b), rate in sorted(pairs.items()):
        if a in named or b in named:
            continue
        elsewhere = [pairs[p] for node in (a, b) for p in partners[node] if p != (a, b)]
        if len(partners[a]) == 1 and len(partners[b]) == 1:
            undecided.append((a, b))
            continue
        reach = min(score[a], score[b])
        if elsewhere and rate < reach * (1 - min_gap):
            links.append(((a, b), rate, reach))
    return Localised(slow_nodes, links, undecided)
