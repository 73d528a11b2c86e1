"""The break-even acceptance length: where the median-TPOT speedup over synthetic acceptance
lengths L (one proposer, one k, one load) rises through 1 + floor, with its interval; and how
well the Leviathan et al. model of speculation fits such a surface.

The speedup should not fall as L grows (more tokens per step for the same drafting): each
curve, and each of its bootstrap replicates, is made non-decreasing (isotonic regression)
before its crossing is read, so that noise at neighbouring L cannot put the crossing where the
curve only dips. The interval is the percentile interval of the replicates' crossings, each
censored at the measured ends: a replicate already above 1 + floor at the smallest L crosses
there or below; one never above it crosses beyond k+1, where no drafter of this proposer's
cost pays. Its coverage is measured by ``benchmarks/stats_calibration.py`` (the break-even row).
Pure computation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import isotonic_regression

from pipeline.analysis.samples import StatsOptions
from pipeline.analysis.stats import Ratio, interval_from

# A replicate of +-inf (a censored failure) is no number isotonic regression can pool: clipped here.
LOG_CLIP = 50.0


@dataclass(frozen=True)
class BreakEven:
    """Where the speedup reaches 1 + floor: ``length`` (None: not resolved), its interval
    (``high`` may be inf: beyond the largest L measured), and the words for it."""

    length: float | None
    low: float | None
    high: float | None
    text: str
    lowest: float = math.nan  # the smallest and largest L measured
    highest: float = math.nan

    @property
    def resolved(self) -> bool:
        return self.length is not None and self.low is not None and self.high is not None


def _crossing_at(lengths: np.ndarray, above: np.ndarray) -> float:
    """The L where a non-decreasing curve (``above``: log speedup less the threshold) reaches
    0, linear in log L between the measured ones (where the speedup is proportional to L, as
    Leviathan's model has it, that is exact); the smallest L where it is there already, inf
    where it never is."""
    if above[0] >= 0:
        return float(lengths[0])
    if above[-1] < 0:
        return math.inf
    i = int(np.argmax(above >= 0))
    x0, x1, y0, y1 = math.log(lengths[i - 1]), math.log(lengths[i]), above[i - 1], above[i]
    return float(math.exp(x0 + (x1 - x0) * (0 - y0) / (y1 - y0)))


def _monotone(values: np.ndarray) -> np.ndarray:
    return np.asarray(isotonic_regression(np.clip(values, -LOG_CLIP, LOG_CLIP), increasing=True).x, dtype=float)


def break_even(lengths: Sequence[float], ratios: Sequence[Ratio], floor: float, opts: StatsOptions) -> BreakEven:
    """The break-even L of one curve: ``ratios[i]`` is the median-TPOT speedup measured at
    synthetic acceptance length ``lengths[i]``, with its bootstrap replicates."""
    usable = sorted(
        ((float(x), r) for x, r in zip(lengths, ratios, strict=True) if r.resolved and r.estimate),
        key=lambda p: p[0],
    )
    if len(usable) < 2:
        return BreakEven(None, None, None, "not resolved: needs speedups with intervals at two or more L")
    xs = np.array([x for x, _ in usable])
    threshold = math.log1p(floor)
    lowest, highest = float(xs[0]), float(xs[-1])
    point = _crossing_at(xs, _monotone(np.log([float(r.estimate) for _, r in usable])) - threshold)  # type: ignore[arg-type]
    size = min(len(r.log_replicates) for _, r in usable)
    replicates = np.stack([r.log_replicates[:size] for _, r in usable], axis=1)  # [replicate, L]
    found = np.array([_crossing_at(xs, _monotone(row) - threshold) for row in replicates])
    method = "inverted_cdf" if np.isinf(found).any() else "linear"  # no interpolation towards an open end
    low, high = (float(v) for v in np.quantile(found, [opts.alpha / 2, 1 - opts.alpha / 2], method=method))
    text = _text(point, low, high, lowest, highest, floor)
    return BreakEven(point if math.isfinite(point) else None, low, high, text, lowest, highest)


def _text(point: float, low: float, high: float, lowest: float, highest: float, floor: float) -> str:
    bar = f"1 + {floor:.0%}" if floor else "1"

    def bound(value: float) -> str:
        if math.isinf(value):
            return f"above {highest:g}"
        return f"<= {lowest:g}" if value <= lowest else f"{value:.2f}"

    interval = f"[{bound(low)}, {bound(high)}]"
    if math.isinf(point):
        return f"not reached within L {lowest:g}-{highest:g} (the speedup stays below {bar}); interval {interval}"
    if point <= lowest:
        return f"pays from the smallest L measured ({lowest:g}) on {interval}"
    return f"{point:.2f} {interval}"


def with_shared_baseline_spread(ratios: Sequence[Ratio], opts: StatsOptions, seed: int) -> list[Ratio]:
    """The points of one curve, each on a speculative server of its own and all against one
    baseline server, with the A/A spread between server starts (``opts.server_spread``) added.

    The A/A spread is that of a log ratio of two fresh servers: half its variance is the
    baseline server's, common to the whole curve, half the speculative server's, its own. Each
    replicate gets both parts (Student's t on the A/A comparisons' degrees of freedom), so the
    curve's points move together as far as they share a server and apart as far as they do
    not; an offset common to all (:func:`~pipeline.analysis.stats.paired_ratio`'s, for one
    comparison) would move the break-even too far, one of its own for each too little."""
    spread = opts.server_spread.for_metric(ratios[0].metric) if opts.server_spread and ratios else None
    if spread is None:
        return list(ratios)
    assert opts.server_spread is not None
    df = float(opts.server_spread.comparisons)
    rng = np.random.default_rng([opts.seed, 46, seed])
    size = min((len(r.log_replicates) for r in ratios if r.resolved), default=opts.resamples)
    common = rng.standard_t(df, size) * spread * math.sqrt(0.5)
    out = []
    for ratio in ratios:
        if ratio.estimate is None:
            out.append(ratio)
            continue
        centre = math.log(ratio.estimate)
        replicates = ratio.log_replicates[:size] if ratio.resolved else np.full(size, centre)
        own = rng.standard_t(df, size) * spread * math.sqrt(0.5)
        out.append(
            interval_from(
                ratio.metric, centre, replicates + common + own, opts, ratio.runs, ratio.requests, None, ratio.noise
            )
        )
    return out


@dataclass(frozen=True)
class ModelFit:
    """Leviathan et al.'s speedup L / (k c + 1) fitted to one surface (one k, one load): the
    draft cost c that fits it best, and how far the measured speedups lie from the formula."""

    c: float
    rms_log_error: float  # root mean square of log(measured / formula) over the L measured
    worst: float  # the largest |measured / formula - 1|
    within: int  # measured speedups whose interval holds the formula's value
    points: int


def leviathan_fit(lengths: Sequence[float], ratios: Sequence[Ratio], k: int) -> ModelFit | None:
    """The least-squares (log scale) fit of S(L) = L / (k c + 1): at one k, kc + 1 is one number,
    the geometric mean of L / S over the surface. The formula has no term for load: where
    batching makes the cost of a step depend on L, its error grows."""
    pairs = [(float(x), r) for x, r in zip(lengths, ratios, strict=True) if r.estimate and r.estimate > 0]
    if len(pairs) < 2:
        return None
    logs = np.array([math.log(x) - math.log(float(r.estimate)) for x, r in pairs])  # type: ignore[arg-type]
    cost = float(np.exp(logs.mean()))  # k c + 1
    errors = -(logs - logs.mean())  # log(measured / formula)
    within = sum(1 for x, r in pairs if r.resolved and r.low <= x / cost <= r.high)  # type: ignore[operator]
    return ModelFit(
        c=(cost - 1.0) / k,
        rms_log_error=float(np.sqrt(np.mean(errors**2))),
        worst=float(np.max(np.abs(np.expm1(errors)))),
        within=within,
        points=len(pairs),
    )
