"""Past runs of the same point: the spread between them, and one new run against their median (the gate's reference)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats as scipy_stats

from pipeline.analysis.samples import StatsOptions
from pipeline.analysis.stats import Ratio


def pooled_log_spread(groups: Sequence[Sequence[float]], nights: int | None = None) -> tuple[float, int]:
    """The spread of log values between runs, pooled over groups (e.g. one group per point,
    one value per past night): sqrt(sum of squared deviations from each group's mean / sum(n - 1)).
    Groups with fewer than 2 finite values add nothing. ``nights``: how many independent nights
    the values come from. The points of one night share its machine and servers, so they are
    not independent: the degrees of freedom then count the nights, min(sum(n - 1), nights - 1)."""
    squares, df = 0.0, 0
    for values in groups:
        logs = np.log([v for v in values if v is not None and math.isfinite(v) and v > 0])
        if len(logs) >= 2:
            squares += float(np.sum((logs - logs.mean()) ** 2))
            df += len(logs) - 1
    if not df:
        return math.nan, 0
    spread = math.sqrt(squares / df)
    return spread, (min(df, nights - 1) if nights is not None else df)


def against_history(
    metric: str,
    current: float,
    history: Sequence[float],
    spread: float,
    df: int,
    opts: StatsOptions,
    higher_is_better: bool,
    rng: np.random.Generator | None = None,
) -> Ratio:
    """One new run's value against the median of past runs of the same point (> 1: better).

    Each past run's value already holds its window's own noise, so the spread between runs
    (``spread``, on the log scale, with ``df`` degrees of freedom) is the noise of a new run:
    a prediction interval, t-distributed, with sd spread * sqrt(1 + pi / (2 n)) (the median
    of n runs as the reference; pi/2 is its variance relative to the mean's)."""
    past = np.log([v for v in history if v is not None and math.isfinite(v) and v > 0])
    if not (math.isfinite(current) and current > 0) or not len(past):
        return Ratio(metric, None, note="no value to compare")
    sign = 1.0 if higher_is_better else -1.0
    centre = sign * (math.log(current) - float(np.median(past)))
    if df < 1 or not math.isfinite(spread):
        return Ratio(
            metric,
            math.exp(centre),
            level=opts.confidence,
            runs=len(past),
            note="the spread between runs is not measured yet",
        )
    scale = spread * math.sqrt(1 + math.pi / (2 * len(past)))
    # The t quantiles themselves, not resamples of t: the interval (and the p-value the decision
    # reads off it) carries no resampling noise. ``rng`` is no longer drawn from.
    half = float(scipy_stats.t(df).ppf(1 - opts.alpha / 2)) * scale
    return Ratio(
        metric,
        math.exp(centre),
        math.exp(centre - half),
        math.exp(centre + half),
        opts.confidence,
        len(past),
        df=float(df),
    )
