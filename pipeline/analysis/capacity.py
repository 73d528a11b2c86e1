"""search=capacity: the highest request rate at which a server still meets a latency SLO.

The search probes one server at a sequence of rates, one measured window each (as vLLM's
``bench sweep serve_sla``): it doubles the rate while every window passes, halves it while
every window fails, and then bisects (geometrically) between the highest pass and the
lowest fail until the two lie within the configured resolution of each other.

A window *passes* when, for each set threshold, the SLO percentile of the requests' values
is within it, and at least ``min_goodput`` of all sent requests (failed ones count as not
good) meet every threshold.

A window whose queue is still growing does not pass, whatever its percentiles say: one that
did not keep up with the offered rate (it completed requests at under 90 % of the rate they
were sent, :func:`pipeline.analysis.stats.keeps_up`, the rule the report's "load-bound" label
uses), or whose TTFT rises through the window (a significant, material trend in arrival order).

The boundary is not the highest passing probe but where the SLO's continuous margins cross
zero, modelled across probes: each criterion (log of the SLO percentile over its threshold,
the goodput share's shortfall, an overloaded window) is fitted as a
monotone (isotonic) function of log rate and inverted at zero. Its interval comes from
re-fitting on replicates: draws of each probe's percentile from its order statistics (a
continuous statistic keeps moving where a pass/fail call would be unanimous), and draws of
each probe's goodput share from its exact binomial (Clopper-Pearson) confidence
distribution, which stays uncertain where every request passed. A boundary beyond the
highest probe is open: "at least".

Pure computation (numpy, and scipy through the stats core); no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats
from scipy.optimize import isotonic_regression

from pipeline.analysis import stats
from pipeline.analysis.samples import Sample, StatsOptions
from pipeline.load import slo
from pipeline.load.slo import SloTarget

# A share computed as good / sent can land a rounding error below a threshold it equals.
_SHARE_TOLERANCE = 1e-12


def _finite_percentile(values: np.ndarray, percentile: float) -> np.ndarray:
    """``np.percentile`` (linear) along the last axis over the finite entries only, vectorised
    over the leading axes; NaN where a row has none. The number of finite entries differs
    between resamples, so non-finite ones are sorted to the end and each row is read at its
    own length."""
    finite = np.isfinite(values)
    count = finite.sum(axis=-1)
    ordered = np.sort(np.where(finite, values, np.inf), axis=-1)
    last = np.maximum(count - 1, 0)
    h = percentile / 100.0 * last
    below = np.floor(h).astype(int)
    above = np.minimum(below + 1, last)
    low = np.take_along_axis(ordered, below[..., None], axis=-1)[..., 0]
    high = np.take_along_axis(ordered, above[..., None], axis=-1)[..., 0]
    with np.errstate(invalid="ignore"):
        result = low + (h - below) * (high - low)
    return np.where(count > 0, result, np.nan)


def _pass_statistic(sample: Sample, target: SloTarget) -> Callable[[np.ndarray], np.ndarray]:
    """``positions (..., n) -> 1.0 / 0.0 (...)``: whether the requests at those positions pass."""
    sent = sample.size + sample.failed
    good = _good(sample, target)
    columns = [(np.asarray(sample.values[name], dtype=float), limit) for name, limit in target.thresholds().items()]

    def statistic(pos: np.ndarray) -> np.ndarray:
        ok = good[pos].sum(axis=-1) / sent >= target.min_goodput - _SHARE_TOLERANCE
        for values, limit in columns:
            observed = _finite_percentile(values[pos], target.percentile)
            # No defined value at all (every request one token long, for TPOT) breaks no
            # percentile limit; the goodput share still judges such a window.
            ok = ok & (np.isnan(observed) | (observed <= limit))
        return ok.astype(float)

    return statistic


def overloaded(sample: Sample) -> str | None:
    """Why a window's queue was still growing, or None: it did not keep up with the offered
    rate (:func:`~pipeline.analysis.stats.keeps_up`, the report's load-bound rule too), or
    its TTFT rose through the window (Kendall's tau in arrival order, one-sided p < 0.001, and
    a Theil-Sen rise over the window of at least the median TTFT). A window without a recorded
    schedule is not judged on the first."""
    share = stats.achieved_share(sample)
    if math.isfinite(share) and share < stats.KEPT_UP:  # stats.keeps_up's rule, on the share at hand
        end = sample.scheduled_end_s
        if end > 0:
            offered = (sample.size + sample.failed) / end
            said = f"it completed {share * offered:.2f} req/s of the {offered:.2f} req/s offered"
        else:
            said = "every request was due at once"
        return f"it did not keep up: {said} ({share:.0%}, under {stats.KEPT_UP:.0%})"
    ttft = sample.values.get("ttft", np.empty(0))
    if len(sample.scheduled) == sample.size >= TREND_MIN_REQUESTS and len(ttft) == sample.size:
        ok = np.isfinite(ttft)
        times, values = sample.scheduled[ok], ttft[ok]
        if len(values) >= TREND_MIN_REQUESTS and np.ptp(times) > 0:
            tau = scipy_stats.kendalltau(times, values, alternative="greater")
            rise = float(scipy_stats.theilslopes(values, times).slope) * float(np.ptp(times))
            if tau.pvalue < TREND_P and rise >= float(np.median(values)):
                return f"its TTFT rose by {rise * 1000:.0f} ms through the window (queue growing)"
    return None


TREND_MIN_REQUESTS = 10
TREND_P = 0.001


def window_passes(sample: Sample, target: SloTarget) -> bool:
    """Whether one measured window met the SLO. A window with no successful request fails, and
    so does one whose queue was still growing (:func:`overloaded`)."""
    if sample.size == 0 or overloaded(sample) is not None:
        return False
    return bool(_pass_statistic(sample, target)(np.arange(sample.size)) > 0.5)


def margins(
    sample: Sample, target: SloTarget, opts: StatsOptions, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Each SLO criterion's margin (> 0: missed) for one window, observed and on
    ``opts.resamples`` replicates: (C,) and (C, B). The criteria: log(percentile / threshold)
    per threshold (its replicates drawn from the order statistics, :func:`_quantile_draws`); the goodput share's shortfall min_goodput - share; and
    whether the window was overloaded (+1 / -1)."""
    observed, replicates = [], []
    for name, limit in target.thresholds().items():
        values = slo.checked_values(name, np.asarray(sample.values[name], dtype=float))  # as the goodput rule
        observed.append(_log_margin(values, target.percentile, limit))
        replicates.append(_quantile_draws(values, target.percentile, limit, opts.resamples, rng))
    if target.min_goodput > 0:
        good, sent = int(_good(sample, target).sum()), sample.size + sample.failed
        share = good / sent if sent else 0.0
        # On the probability scale: a share that falls from 1 to 0 between two probes crosses
        # min_goodput near the lower one, as a straight line between them would.
        # The observed margin uses the observed share, as the pass call (window_passes) and
        # vLLM's goodput do: a bound in the call itself would move the boundary estimate and
        # make a high min_goodput unreachable in short windows (100 good of 100 has an exact
        # 95 % lower bound of 0.964). The exact binomial bound enters the interval only: the
        # replicates are drawn so that their quantiles are the Clopper-Pearson bounds.
        observed.append(target.min_goodput - _SHARE_TOLERANCE - share)
        replicates.append(target.min_goodput - _SHARE_TOLERANCE - _share_draws(good, sent, opts.resamples, rng))
    load = 1.0 if overloaded(sample) is not None else -1.0
    observed.append(load)
    replicates.append(np.full(opts.resamples, load))
    return np.array(observed), np.stack(replicates)


def _share_draws(good: int, sent: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """Draws of a binomial share from its exact (Clopper-Pearson) confidence distribution: a
    uniform u below 1/2 reads Beta(good, sent - good + 1) at u, one above reads
    Beta(good + 1, sent - good), the two betas whose quantiles are the exact bounds. The
    draws' alpha/2 and 1 - alpha/2 quantiles are then, for every alpha, the interval of
    ``scipy.stats.binomtest(good, sent).proportion_ci(method="exact")``: at least nominal
    coverage, where the Jeffreys draws used before were narrower (100 good of 100: a lower
    bound of 0.975 against the exact 0.964)."""
    u = rng.random(size)
    lower = scipy_stats.beta.ppf(u, good, sent - good + 1) if good > 0 else np.zeros(size)
    upper = scipy_stats.beta.ppf(u, good + 1, sent - good) if good < sent else np.ones(size)
    return np.where(u < 0.5, lower, upper)


def _log_margin(values: np.ndarray, percentile: float, limit: float) -> float:
    finite = values[np.isfinite(values)]
    if not len(finite):
        return -math.inf  # no defined value breaks no percentile limit (the goodput share still judges)
    level = float(np.percentile(finite, percentile))
    return math.log(level / limit) if level > 0 else -math.inf


def _quantile_draws(
    values: np.ndarray, percentile: float, limit: float, size: int, rng: np.random.Generator
) -> np.ndarray:
    """Draws of log(population quantile / limit) from the order statistics: the number of
    requests below the quantile is Binomial(n, q), so the quantile lies between the K-th and
    the (K+1)-th smallest value, drawn uniformly between them (+inf past the largest). Unlike a
    bootstrap, which cannot exceed the window's maximum and covered a p99 of 400 requests only
    ~89 % of the time, this covers ~96 %; below ~300 requests a p99 has no finite upper bound
    at 95 %, and the draws say so."""
    x = np.sort(values[np.isfinite(values)])
    n = len(x)
    if not n:
        return np.full(size, -math.inf)
    ranks = rng.binomial(n, percentile / 100.0, size)
    padded = np.concatenate([[x[0]], x, [math.inf]])
    with np.errstate(invalid="ignore", divide="ignore"):
        level = np.where(ranks >= n, math.inf, padded[ranks] + rng.random(size) * (padded[ranks + 1] - padded[ranks]))
        return np.log(level / limit)


def _good(sample: Sample, target: SloTarget) -> np.ndarray:
    """Which successful requests meet every threshold: the goodput rule of both the pass call and the margins."""
    return slo.good(sample.values, sample.size, target)


# ---- The search ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SearchSettings:
    start_rate: float = 1.0
    min_rate: float = 0.1  # below this the search gives up ("cannot meet the SLO at 0.1 req/s")
    resolution: float = 0.1  # stop when high / low - 1 <= resolution (relative)
    max_probes: int = 8  # cap on windows per server

    def __post_init__(self) -> None:
        if not 0 < self.start_rate < math.inf:
            raise ValueError(f"capacity.start_rate={self.start_rate} must be a positive, finite rate, e.g. 1")
        if not 0 < self.min_rate <= self.start_rate:
            raise ValueError(
                f"capacity.min_rate={self.min_rate} must lie in (0, capacity.start_rate={self.start_rate}], e.g. 0.1"
            )
        if not 0 < self.resolution < 1:
            raise ValueError(f"capacity.resolution={self.resolution} must lie in (0, 1), e.g. 0.1 for 10 %")
        if self.max_probes < 2:
            raise ValueError(f"capacity.max_probes={self.max_probes} must be >= 2 (a bracket needs two probes), e.g. 8")


def next_rate(history: Sequence[tuple[float, bool]], settings: SearchSettings) -> float | None:
    """The next rate to probe after ``history`` ((rate, passed) in probe order), or None to stop."""
    if len(history) >= settings.max_probes:
        return None
    if not history:
        return settings.start_rate
    fails = [rate for rate, passed in history if not passed]
    if not fails:
        return 2.0 * max(rate for rate, _ in history)
    hi = min(fails)
    # With noise a pass can lie above a fail; only passes below the lowest fail bracket it.
    below = [rate for rate, passed in history if passed and rate < hi]
    if not below:
        # The rates are the ones this function returned, min_rate exactly; the slack only
        # forgives a caller that stored them with rounding.
        if hi <= settings.min_rate * (1 + 1e-9):
            return None
        return max(hi / 2.0, settings.min_rate)
    lo = max(below)
    if hi / lo - 1 <= settings.resolution:
        return None
    return math.sqrt(lo * hi)


# ---- The boundary and its interval --------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Probe:
    rate: float
    passed: bool  # the observed call (window_passes)
    margins: np.ndarray  # (C,) each criterion's observed margin, > 0: missed (see margins())
    replicates: np.ndarray  # (C, B) the same on B replicates


def probe(rate: float, sample: Sample, target: SloTarget, opts: StatsOptions, rng: np.random.Generator) -> Probe:
    observed, replicates = margins(sample, target, opts, rng)
    return Probe(rate, window_passes(sample, target), observed, replicates)


@dataclass(frozen=True, eq=False)
class Boundary:
    estimate: float | None  # where the fitted margins cross zero; None: missed already at the lowest probe
    low: float | None  # interval (opts.confidence); 0.0 where it reaches below the lowest probe
    high: float | None  # math.inf where it reaches above the highest probe ("at least ...")
    probes: int
    text: str
    replicates: np.ndarray  # the boundary on each replicate (0.0 below the lowest probe, inf above the highest)


def _crossing(log_rates: np.ndarray, values: np.ndarray) -> float:
    """Where a monotone (isotonic, non-decreasing) fit of ``values`` against log rate crosses
    zero, on the log-rate scale, linear between probes; -inf if the fit is above zero at the
    lowest probe, +inf if it never rises above zero."""
    fitted = isotonic_regression(values).x if len(values) > 1 else values
    if fitted[0] > 0:
        return -math.inf
    above = np.flatnonzero(fitted > 0)
    if not len(above):
        return math.inf
    i = int(above[0])
    f0, f1 = fitted[i - 1], fitted[i]
    return float(log_rates[i - 1] + (0.0 - f0) * (log_rates[i] - log_rates[i - 1]) / (f1 - f0))


def _boundary_of(log_rates: np.ndarray, criteria: np.ndarray) -> float:
    """The boundary of one set of margins (criteria x probes): the lowest criterion's crossing.
    An infinite margin (no defined value, a share of 0 or 1) is clipped to a large finite one."""
    return min(_crossing(log_rates, np.clip(np.nan_to_num(row, nan=1e6), -1e6, 1e6)) for row in criteria)


def boundary(probes: Sequence[Probe], opts: StatsOptions) -> Boundary:
    """Where the SLO stops holding, with an interval from the probes' replicates."""
    if not probes:
        return Boundary(None, None, None, 0, "no probes", np.empty(0))
    ordered = sorted(probes, key=lambda p: p.rate)
    rates = np.array([p.rate for p in ordered], dtype=float)
    shapes = {p.replicates.shape for p in ordered}
    if len(shapes) > 1:
        raise ValueError(f"the probes' replicates differ in shape ({sorted(shapes)}); use one StatsOptions and SLO")
    log_rates = np.log(rates)
    observed = np.stack([p.margins for p in ordered], axis=1)  # (C, P)
    replicates = np.stack([p.replicates for p in ordered], axis=1)  # (C, P, B)
    point = _boundary_of(log_rates, observed)
    found = np.exp([_boundary_of(log_rates, replicates[:, :, j]) for j in range(replicates.shape[2])])
    # The replicates reach 0 (below every probe) or inf (above): no interpolation towards those.
    low, high = (float(v) for v in np.quantile(found, [opts.alpha / 2, 1 - opts.alpha / 2], method="inverted_cdf"))
    upper = f"{high:.2f}" if math.isfinite(high) else f"≥ {rates[-1]:.2f}"
    if point == -math.inf:
        return Boundary(None, low, high, len(ordered), f"cannot meet the SLO at {rates[0]:g} req/s", found)
    if point == math.inf:
        text = f"at least {rates[-1]:.2f} req/s (no probe missed up to {rates[-1]:g} req/s)"
        return Boundary(float(rates[-1]), low, math.inf, len(ordered), text, found)
    estimate = math.exp(point)
    return Boundary(estimate, low, high, len(ordered), f"{estimate:.2f} req/s [{low:.2f}, {upper}]", found)


@dataclass(frozen=True)
class CapacityRatio:
    estimate: float | None
    low: float | None
    high: float | None
    text: str  # "1.35x [1.10, 1.62]" or why there is none


def capacity_ratio(base: Boundary, spec: Boundary, opts: StatsOptions) -> CapacityRatio:
    """Speculative capacity over baseline capacity (> 1: speculation sustains more load).

    Replicate j of the ratio is replicate j of the speculative boundary over replicate j of
    the baseline's: the two servers' windows are independent, so pairing j with j is a fair draw."""
    for name, side in (("baseline", base), ("speculative", spec)):
        if side.estimate is None:
            return CapacityRatio(None, None, None, f"no interval: the {name} server has no boundary ({side.text})")
    assert base.estimate is not None and spec.estimate is not None
    if len(base.replicates) != len(spec.replicates):
        raise ValueError("the two boundaries' replicates differ in length; use one StatsOptions")
    estimate = spec.estimate / base.estimate
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = spec.replicates / base.replicates  # x / inf = 0: an unbounded baseline; x / 0 = inf
    ratios = ratios[~np.isnan(ratios)]  # both unbounded, or both below their lowest probe: no ratio at all
    if len(ratios) < 0.9 * len(spec.replicates):
        return CapacityRatio(estimate, None, None, f"{estimate:.2f}x [no interval: both boundaries are open]")
    low, high = (float(v) for v in np.quantile(ratios, [opts.alpha / 2, 1 - opts.alpha / 2], method="inverted_cdf"))
    text = f"{estimate:.2f}x [{low:.2f}, {high:.2f}]"
    # A server that passed every probe has only a lower bound on its capacity (its text says
    # "at least"), so the ratio is bounded on one side only, or on neither.
    base_open, spec_open = base.text.startswith("at least"), spec.text.startswith("at least")
    open_note = {
        (True, True): "both servers met the SLO at every probed rate: the ratio bounds nothing",
        (True, False): "the baseline met the SLO at every probed rate: the ratio is an upper bound",
        (False, True): "the speculative server met the SLO at every probed rate: the ratio is a lower bound",
    }.get((base_open, spec_open))
    if open_note:
        text += f" ({open_note})"
    return CapacityRatio(estimate, low, high, text)
