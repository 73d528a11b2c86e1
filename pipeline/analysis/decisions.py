"""From ratios to words: helps, hurts or inconclusive; and the load where speculation stops paying.

Decisions compare an interval with a practical floor and adjust for the number of
comparisons in a report (Benjamini-Hochberg). An interval that lies above 1 + floor helps, one below 1 - floor hurts; anything else is
inconclusive, with what would resolve it (more requests, or repeats).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

from pipeline.analysis.samples import StatsOptions
from pipeline.analysis.stats import RATIOS, Metric, Ratio

HELPS, HURTS, INCONCLUSIVE, TOO_FEW = "helps", "hurts", "inconclusive", "not enough requests"


@dataclass(frozen=True)
class Decision:
    label: str  # helps | hurts | inconclusive | not enough requests
    ratio: Ratio
    p_adjusted: float | None = None  # Benjamini-Hochberg over the report's comparisons
    detail: str = ""  # for inconclusive: what would resolve it

    @property
    def text(self) -> str:
        return f"{self.label}: {self.ratio.text}" + (f"; {self.detail}" if self.detail else "")


def tail_p(ratio: Ratio, floor: float) -> tuple[float, float]:
    """Two-sided bootstrap p-values that the ratio lies above 1 + floor (helps) and below
    1 - floor (hurts). With one comparison, p < alpha exactly when the interval clears."""
    rep = ratio.log_replicates
    count = len(rep)
    below_helps = int(np.count_nonzero(rep <= math.log1p(floor)))
    above_hurts = int(np.count_nonzero(rep >= math.log1p(-floor)))
    return min(1.0, 2 * (below_helps + 1) / (count + 1)), min(1.0, 2 * (above_hurts + 1) / (count + 1))


def decide(ratios: Sequence[Ratio], opts: StatsOptions, floor: float | Sequence[float] | None = None) -> list[Decision]:
    """One family of comparisons (e.g. every median-TPOT ratio of a report), adjusted together.
    ``floor``: one for all, or one per ratio (the gate's floors differ by metric)."""
    floors = [opts.floor if floor is None else floor] * len(ratios) if not isinstance(floor, Sequence) else list(floor)
    tested = [i for i, r in enumerate(ratios) if r.resolved and len(r.log_replicates)]
    tails = {i: tail_p(ratios[i], floors[i]) for i in tested}
    adjusted: dict[int, float] = {}
    if tested:
        smallest = np.array([min(tails[i]) for i in tested])
        adjusted = dict(zip(tested, scipy_stats.false_discovery_control(smallest, method="bh"), strict=True))
    out = []
    for i, ratio in enumerate(ratios):
        if ratio.estimate is None or not ratio.resolved:
            label = TOO_FEW if ratio.note.startswith("not enough") else INCONCLUSIVE
            out.append(Decision(label, ratio, detail=ratio.note))
            continue
        p_helps, p_hurts = tails[i]
        p = float(adjusted[i])
        if p < opts.alpha:
            out.append(Decision(HELPS if p_helps <= p_hurts else HURTS, ratio, p))
        elif min(p_helps, p_hurts) < opts.alpha:
            detail = (f"its interval clears the ±{floors[i]:.0%} floor on its own, not after the adjustment for "
                      f"{len(tested)} comparisons")  # fmt: skip
            out.append(Decision(INCONCLUSIVE, ratio, p, detail))
        else:
            out.append(Decision(INCONCLUSIVE, ratio, p, to_resolve(ratio, floors[i])))
    return out


def to_resolve(ratio: Ratio, floor: float) -> str:
    """How many requests per window (repeats, for throughput) would likely resolve it, from
    the observed spread: an interval's half-width shrinks as one over the square root of
    the number of samples."""
    assert ratio.estimate is not None and ratio.low is not None and ratio.high is not None
    effect = abs(math.log(ratio.estimate))
    margin = effect - (math.log1p(floor) if ratio.estimate >= 1 else -math.log1p(-floor))
    if margin <= 0:
        return f"the estimate is within the ±{floor:.0%} floor: no window size would make it helps or hurts"
    half = (math.log(ratio.high) - math.log(ratio.low)) / 2
    factor = (half / margin) ** 2
    if ratio.runs >= 2 or RATIOS.get(ratio.metric, Metric("", 0, True)).field == "throughput":
        # Across repeats the spread between runs sets the width: more runs, not more
        # requests per window, narrow it (throughput is one number per window anyway).
        return f"~{max(3, math.ceil(ratio.runs * factor))} repeats would likely resolve it"
    return f"~{math.ceil(ratio.requests * factor)} requests per window would likely resolve it"


def smallest_resolvable(ratio: Ratio, floor: float) -> float | None:
    """From an A/A comparison: the smallest speedup this setup would call "helps", given the
    interval's measured half-width and the floor."""
    if not ratio.resolved:
        return None
    assert ratio.low is not None and ratio.high is not None
    half = (math.log(ratio.high) - math.log(ratio.low)) / 2
    return (1 + floor) * math.exp(half)


@dataclass(frozen=True)
class Crossing:
    rate: float | None
    low: float | None
    high: float | None
    text: str


def _interpolate(rates: Sequence[float], values: Sequence[float]) -> float | None:
    for (r0, v0), (r1, v1) in zip(zip(rates, values, strict=True), list(zip(rates, values, strict=True))[1:],
                                  strict=False):  # fmt: skip
        if v0 >= 0 > v1:
            if math.isinf(r1):
                return r0
            return r0 + v0 * (r1 - r0) / (v0 - v1)
    return None


def crossing(rates: Sequence[float], decisions: Sequence[Decision], opts: StatsOptions) -> Crossing:
    """Where the median-TPOT speedup falls through 1.0, as an interval over the bootstrap's
    replicates; resolved only where a lower rate "helps" and a higher one "hurts"."""
    pairs = sorted(zip(rates, decisions, strict=True), key=lambda p: p[0])
    usable = [(r, d) for r, d in pairs if d.ratio.resolved]
    if len(usable) < 2:
        return Crossing(None, None, None, "not resolved: needs intervals at two or more request rates")
    labels = [d.label for _, d in usable]
    if labels[0] == HURTS:
        return Crossing(None, None, None, f"below 1.0 already at the lowest rate ({usable[0][0]:g} req/s)")
    first_helps = next((i for i, label in enumerate(labels) if label == HELPS), None)
    first_hurts = next((i for i, label in enumerate(labels) if label == HURTS and (first_helps or 0) < i), None)
    if first_helps is None or first_hurts is None:
        span = f"{usable[0][0]:g}-{usable[-1][0]:g} req/s"
        if first_helps is not None and all(lbl == HELPS for lbl in labels[first_helps:]):
            return Crossing(None, None, None, f"none within {span}: speculation helps at every rate from "
                                              f"{usable[first_helps][0]:g} req/s")  # fmt: skip
        return Crossing(None, None, None, f"not resolved within {span}: no rate where it clearly hurts after one "
                                          "where it clearly helps")  # fmt: skip
    segment = usable[first_helps : first_hurts + 1]
    seg_rates = [r for r, _ in segment]
    point = _interpolate(seg_rates, [math.log(d.ratio.estimate or math.nan) for _, d in segment])
    size = min(len(d.ratio.log_replicates) for _, d in segment)
    replicate_rates = [
        _interpolate(seg_rates, [float(d.ratio.log_replicates[j]) for _, d in segment]) for j in range(size)
    ]
    found = np.array([r for r in replicate_rates if r is not None and math.isfinite(r)])
    if point is None or len(found) < 0.5 * size:
        return Crossing(None, None, None, "not resolved: the resamples rarely cross 1.0 between the measured rates")
    low, high = np.quantile(found, [opts.alpha / 2, 1 - opts.alpha / 2])
    between = f"between {seg_rates[0]:g} and {seg_rates[-1]:g} req/s"
    return Crossing(point, float(low), float(high), f"crosses 1.0 at ~{point:.2f} req/s [{low:.2f}, {high:.2f}] "
                                                    f"({between})")  # fmt: skip
