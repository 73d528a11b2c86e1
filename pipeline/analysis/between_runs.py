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


def moderated_log_spreads(groups: Sequence[Sequence[float]], nights: int | None = None) -> list[tuple[float, float]]:
    """Each group's spread of log values between runs, shrunk toward the pooled spread by
    empirical Bayes (Smyth's moderated variance, 2004: s~^2 = (d0 s0^2 + d s^2) / (d0 + d)), with
    its degrees of freedom d0 + d. s0 is the pooled spread (:func:`pooled_log_spread`); d0, the
    prior's degrees of freedom, is estimated by the method of moments from how far the groups'
    log variances scatter beyond what their own degrees of freedom explain: where they scatter
    no more than that, d0 is infinite and every group gets the pooled spread. So one point whose
    nights happen to agree is not given a spread too narrow to trust, nor a noisy one the
    others' quiet. The degrees of freedom never exceed the pooled ones (``nights``: the points of
    a night share its machine, so they are not independent)."""
    pooled, pooled_df = pooled_log_spread(groups, nights)
    own = [_own_spread(values) for values in groups]
    if not pooled_df:
        return [(math.nan, 0.0) for _ in groups]
    d0 = _prior_df([(s2, d) for s2, d in own if d >= 1 and s2 > 0])
    out = []
    for s2, d in own:
        if math.isinf(d0) or d < 1:
            out.append((pooled, float(min(pooled_df, d0))))
            continue
        moderated = (d0 * pooled**2 + d * s2) / (d0 + d)
        out.append((math.sqrt(moderated), float(min(d0 + d, pooled_df))))
    return out


def _own_spread(values: Sequence[float]) -> tuple[float, int]:
    """One group's variance of log values and its degrees of freedom (n - 1)."""
    logs = np.log([v for v in values if v is not None and math.isfinite(v) and v > 0])
    return (float(np.var(logs, ddof=1)), len(logs) - 1) if len(logs) >= 2 else (math.nan, 0)


def _prior_df(variances: Sequence[tuple[float, int]]) -> float:
    """The prior's degrees of freedom d0 (Smyth 2004, the moments of log s^2): the scatter of
    the groups' log variances beyond their own sampling scatter, trigamma(d / 2), is
    trigamma(d0 / 2). Infinite where there is no such excess or fewer than three groups."""
    from scipy.optimize import brentq
    from scipy.special import digamma, polygamma

    if len(variances) < 3:
        return math.inf
    s2, d = np.array([v for v, _ in variances]), np.array([n for _, n in variances], dtype=float)
    e = np.log(s2) - digamma(d / 2) + np.log(d / 2)
    excess = float(np.var(e, ddof=1) - np.mean(polygamma(1, d / 2)))
    if excess <= float(polygamma(1, 1e7)):  # none, or too little to tell from none
        return math.inf
    half = brentq(lambda x: float(polygamma(1, x)) - excess, 1e-6, 1e7)
    return 2 * half


def against_history(
    metric: str,
    current: float,
    history: Sequence[float],
    spread: float,
    df: float,
    opts: StatsOptions,
    higher_is_better: bool,
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
    # reads off it) carries no resampling noise.
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
