"""search=capacity: the highest request rate at which a server still meets a latency SLO.

The search probes one server at a sequence of rates, one measured window each (as vLLM's
``bench sweep serve_sla``): it doubles the rate while every window passes, halves it while
every window fails, and then bisects (geometrically) between the highest pass and the
lowest fail until the two lie within the configured resolution of each other.

A window *passes* when, for each set threshold, the SLO percentile of the requests' values
is within it, and at least ``min_goodput`` of all sent requests (failed ones count as not
good) meet every threshold.

The boundary has two sources of doubt, and its interval covers both:

- *resolution*: the true boundary lies somewhere between the last pass and the next fail;
- *noise*: a window near the boundary might have come out the other way. Each probe's
  pass/fail call is bootstrapped over its window's requests (``pass_replicates``); replicate
  j re-reads every probe's call from its own j-th resample and places the boundary again.

Pure computation (numpy, and scipy through the stats core); no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.analysis.samples import Sample, StatsOptions
from pipeline.analysis.stats import request_replicates

_METRICS = ("ttft", "tpot", "e2el")
# A share computed as good / sent can land a rounding error below a threshold it equals.
_SHARE_TOLERANCE = 1e-12


@dataclass(frozen=True)
class SloTarget:
    ttft_s: float | None = None  # thresholds in seconds; None = not part of the SLO
    tpot_s: float | None = None
    e2el_s: float | None = None
    percentile: float = 99.0  # the SLO percentile: e.g. p99 TPOT <= tpot_s
    min_goodput: float = 0.99  # share of all sent requests (failed ones count as not good) meeting every threshold

    def __post_init__(self) -> None:
        for name, value in self.thresholds().items():
            if not value > 0:
                raise ValueError(f"SLO {name}_s={value} must be > 0 seconds or None")
        if not 0 < self.percentile <= 100:
            raise ValueError(f"slo.percentile={self.percentile} must lie in (0, 100], e.g. 99 for p99")
        if not 0 <= self.min_goodput <= 1:
            raise ValueError(f"slo.min_goodput={self.min_goodput} must lie in [0, 1], e.g. 0.99")

    def thresholds(self) -> dict[str, float]:
        """The set thresholds by metric name (ttft, tpot, e2el), in seconds."""
        limits = {"ttft": self.ttft_s, "tpot": self.tpot_s, "e2el": self.e2el_s}
        return {name: value for name, value in limits.items() if value is not None}

    @property
    def active(self) -> bool:
        return bool(self.thresholds())

    def describe(self) -> str:
        parts = [f"p{self.percentile:g} {m.upper()} <= {t * 1000:g} ms" for m, t in self.thresholds().items()]
        return ", ".join([*parts, f"goodput >= {self.min_goodput * 100:g}%"])


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
    good = np.ones(sample.size, dtype=bool)
    columns: list[tuple[np.ndarray, float]] = []
    for name, limit in target.thresholds().items():
        if name not in sample.values:
            raise ValueError(f"the window has no per-request {name} values to check slo.{name} against")
        values = np.asarray(sample.values[name], dtype=float)
        columns.append((values, limit))
        # As vLLM's goodput: a one-token request has no decode phase, so its TPOT counts as 0.
        checked = np.where(np.isnan(values), 0.0, values) if name == "tpot" else values
        good &= checked <= limit  # an undefined TTFT or E2EL is not good

    def statistic(pos: np.ndarray) -> np.ndarray:
        ok = good[pos].sum(axis=-1) / sent >= target.min_goodput - _SHARE_TOLERANCE
        for values, limit in columns:
            observed = _finite_percentile(values[pos], target.percentile)
            # No defined value at all (every request one token long, for TPOT) breaks no
            # percentile limit; the goodput share still judges such a window.
            ok = ok & (np.isnan(observed) | (observed <= limit))
        return ok.astype(float)

    return statistic


def window_passes(sample: Sample, target: SloTarget) -> bool:
    """Whether one measured window met the SLO. A window with no successful request fails."""
    if sample.size == 0:
        return False
    return bool(_pass_statistic(sample, target)(np.arange(sample.size)) > 0.5)


def pass_replicates(sample: Sample, target: SloTarget, opts: StatsOptions, rng: np.random.Generator) -> np.ndarray:
    """The pass/fail call on ``opts.resamples`` bootstrap resamples of the window's successful
    requests (the failed count stays fixed), as a bool array."""
    if sample.size < 2:
        # A bootstrap needs two requests; with fewer, the observed call is all there is.
        return np.full(opts.resamples, window_passes(sample, target), dtype=bool)
    return request_replicates(_pass_statistic(sample, target), sample.size, opts, rng) > 0.5


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
    passed: bool
    replicates: np.ndarray  # pass_replicates of its window (bool)


@dataclass(frozen=True, eq=False)
class Boundary:
    estimate: float | None  # the highest probed rate that met the SLO with every lower probe passing too
    low: float | None  # interval (opts.confidence) on the boundary
    high: float | None  # math.inf when no probe failed ("at least ...")
    probes: int
    text: str
    low_replicates: np.ndarray  # per replicate: its highest passing rate (0.0 where none)
    high_replicates: np.ndarray  # per replicate: the next probed rate above it (inf where none)


def _placed(rates: np.ndarray, calls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """From calls (probes sorted by rate, ...): the highest rate of the leading run of passes
    (0.0 if the lowest fails) and the probed rate just above it (inf if none)."""
    leading = np.logical_and.accumulate(calls, axis=0).sum(axis=0)
    return np.concatenate([[0.0], rates])[leading], np.concatenate([rates, [math.inf]])[leading]


def boundary(probes: Sequence[Probe], opts: StatsOptions) -> Boundary:
    """Where the SLO stops holding, with an interval over the probes' bootstrap replicates."""
    if not probes:
        return Boundary(None, None, None, 0, "no probes", np.empty(0), np.empty(0))
    ordered = sorted(probes, key=lambda p: p.rate)
    rates = np.array([p.rate for p in ordered], dtype=float)
    lengths = {len(p.replicates) for p in ordered if len(p.replicates)}
    if len(lengths) > 1:
        raise ValueError(f"the probes' replicates differ in length ({sorted(lengths)}); use one StatsOptions")
    size = lengths.pop() if lengths else opts.resamples
    # A probe without replicates (its window could not be resampled) keeps its observed call.
    calls = np.stack(
        [np.asarray(p.replicates, dtype=bool) if len(p.replicates) else np.full(size, p.passed) for p in ordered]
    )
    observed_lo, observed_hi = _placed(rates, np.array([p.passed for p in ordered]))
    lo_j, hi_j = _placed(rates, calls)
    # The replicates only take probed rates (or 0 and inf): quantiles without interpolation,
    # rounded outward, never name a rate between two probes that was not measured.
    low = float(np.quantile(lo_j, opts.alpha / 2, method="lower"))
    high = float(np.quantile(hi_j, 1 - opts.alpha / 2, method="higher"))
    if math.isinf(observed_hi):
        high = math.inf  # nothing failed: nothing bounds the boundary from above
    if observed_lo == 0.0:
        text = f"cannot meet the SLO at {rates[0]:g} req/s"
        return Boundary(None, low, high, len(ordered), text, lo_j, hi_j)
    estimate = float(observed_lo)
    if math.isinf(observed_hi):
        text = f"at least {estimate:.2f} req/s (no probe failed up to {rates[-1]:g} req/s)"
    else:
        text = f"{estimate:.2f} req/s [{low:.2f}, {high:.2f}]"
    return Boundary(estimate, low, high, len(ordered), text, lo_j, hi_j)


@dataclass(frozen=True)
class CapacityRatio:
    estimate: float | None
    low: float | None
    high: float | None
    text: str  # "1.35x [1.10, 1.62]" or why there is none


def capacity_ratio(base: Boundary, spec: Boundary, opts: StatsOptions) -> CapacityRatio:
    """Speculative capacity over baseline capacity (> 1: speculation sustains more load).

    The bounds pair the two servers' extreme ends, replicate by replicate: the lowest the
    speculative boundary could be over the highest the baseline's could, and vice versa.
    The two servers' windows are independent, so pairing replicate j with j is a fair draw."""
    for name, side in (("baseline", base), ("speculative", spec)):
        if side.estimate is None:
            return CapacityRatio(None, None, None, f"no interval: the {name} server has no boundary ({side.text})")
    assert base.estimate is not None and spec.estimate is not None
    if len(base.low_replicates) != len(spec.low_replicates):
        raise ValueError("the two boundaries' replicates differ in length; use one StatsOptions")
    estimate = spec.estimate / base.estimate
    with np.errstate(divide="ignore", invalid="ignore"):
        lows = spec.low_replicates / base.high_replicates  # x / inf = 0: an unbounded baseline
        highs = spec.high_replicates / base.low_replicates  # x / 0 = inf: a baseline that failed
    lows = np.where(np.isnan(lows), 0.0, lows)
    highs = np.where(np.isnan(highs), math.inf, highs)
    low = float(np.quantile(lows, opts.alpha / 2, method="lower"))
    high = float(np.quantile(highs, 1 - opts.alpha / 2, method="higher"))
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
