"""Past runs of the same point: the spread between them, and one new run against their median (the gate's reference)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pipeline.analysis.samples import StatsOptions
from pipeline.analysis.stats import Ratio, interval_from


def pooled_log_spread(groups: Sequence[Sequence[float]]) -> tuple[float, int]:
    """The spread of log values between runs, pooled over groups (e.g. one group per point,
    one value per past night): sqrt(sum of squared deviations from each group's mean / df),
    with df = sum(n - 1). Groups with fewer than 2 finite values add nothing."""
    squares, df = 0.0, 0
    for values in groups:
        logs = np.log([v for v in values if v is not None and math.isfinite(v) and v > 0])
        if len(logs) >= 2:
            squares += float(np.sum((logs - logs.mean()) ** 2))
            df += len(logs) - 1
    return (math.sqrt(squares / df), df) if df else (math.nan, 0)


def against_history(
    metric: str,
    current: float,
    history: Sequence[float],
    spread: float,
    df: int,
    opts: StatsOptions,
    higher_is_better: bool,
    rng: np.random.Generator,
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
    replicates = centre + scale * rng.standard_t(df, size=opts.resamples)
    return interval_from(metric, centre, replicates, opts, len(past), 0, df=float(df))
