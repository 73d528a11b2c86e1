"""The one statistics core: every ratio the report turns into a word comes from here.

Its neighbours: :mod:`~pipeline.analysis.samples` (a window's requests, the options),
:mod:`~pipeline.analysis.decisions` (ratios to words) and :mod:`~pipeline.analysis.between_runs`
(past runs, for the gate). Pure computation (numpy and scipy); no MLflow, no plotting, no I/O.

- **Within a run**, an interval comes from a bootstrap over requests (``scipy.stats.bootstrap``),
  *paired by prompt*: the baseline and the speculative window send the same prompts on the
  same schedule, so a resample draws prompts, and both windows' answers to them, together.
  That removes prompt-to-prompt variation from the ratio.
- **Across runs** (repeats), requests inside one window share queueing state and one server
  start, so the run is the unit of noise. The estimate is the geometric mean of the runs'
  ratios; its interval is the wider of a two-stage bootstrap (runs, then requests inside
  each drawn run) and Student's t over the runs' ratios (a bootstrap over 2-5 runs alone
  sees too little of the spread between them).
- **Throughput** is a property of a whole window (tokens over the window's duration), not
  of a request: it is resampled at the window level only (Student's t over the repeats'
  ratios), so its interval needs repeats.

Every ratio is oriented so that > 1 means speculation (the second window) is better:
baseline / speculative for latencies, speculative / baseline for throughput.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import stats as scipy_stats

from pipeline.analysis.samples import Sample, StatsError, StatsOptions


@dataclass(frozen=True)
class Metric:
    field: str  # ttft | tpot | e2el | itl | throughput
    percentile: float
    latency: bool  # True: lower is better, the ratio is baseline / speculative


# The report's ratios, named as the sweep table's columns.
RATIOS: dict[str, Metric] = {
    "speedup_median_tpot": Metric("tpot", 50, True),
    "speedup_p99_tpot": Metric("tpot", 99, True),
    "speedup_median_ttft": Metric("ttft", 50, True),
    "speedup_median_itl": Metric("itl", 50, True),
    "speedup_median_e2el": Metric("e2el", 50, True),
    "output_throughput_ratio": Metric("throughput", 0, False),
}


@dataclass(frozen=True, eq=False)
class Ratio:
    """A ratio of two windows' statistics (or of sets of repeated windows) with its interval."""

    metric: str
    estimate: float | None
    low: float | None = None
    high: float | None = None
    level: float = 0.95
    runs: int = 0
    requests: int = 0  # paired requests per run (the median over runs)
    note: str = ""  # why there is no interval, where there is none
    log_replicates: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False)

    @property
    def resolved(self) -> bool:
        return self.low is not None and self.high is not None

    @property
    def text(self) -> str:
        """``2.34x [2.10, 2.61]``: the estimate and its interval, or why there is none."""
        if self.estimate is None or not math.isfinite(self.estimate):
            return f"— ({self.note})" if self.note else "—"
        if not self.resolved:
            return f"{self.estimate:.2f}x [no interval: {self.note}]"
        return f"{self.estimate:.2f}x [{self.low:.2f}, {self.high:.2f}]"


def _paired_positions(base: Sample, spec: Sample, metric: Metric) -> tuple[np.ndarray, np.ndarray]:
    """Row positions in each window of the prompts both answered with a defined value."""
    common, b_pos, s_pos = np.intersect1d(base.index, spec.index, assume_unique=False, return_indices=True)
    if metric.field in base.values:
        defined = np.isfinite(base.values[metric.field][b_pos]) & np.isfinite(spec.values[metric.field][s_pos])
        b_pos, s_pos = b_pos[defined], s_pos[defined]
    return b_pos, s_pos


def _quantile_of(sample: Sample, rows: np.ndarray, metric: Metric) -> Callable[[np.ndarray], np.ndarray]:
    """``positions (..., n) -> statistic (...)`` of the window's requests at ``rows[positions]``."""
    if metric.field == "itl":
        return _pooled_quantile([sample.itl[r] for r in rows], metric.percentile)
    values = sample.values[metric.field][rows]
    return lambda pos: np.percentile(values[pos], metric.percentile, axis=-1)


def _pooled_quantile(groups: Sequence[np.ndarray], percentile: float) -> Callable[[np.ndarray], np.ndarray]:
    """A quantile of all gaps of the drawn requests, each request's gaps counted as often as
    it was drawn: a weighted (lower) quantile, vectorised over resamples."""
    n = len(groups)
    owners = np.concatenate([np.full(len(g), i) for i, g in enumerate(groups)]) if n else np.empty(0, int)
    gaps = np.concatenate(groups) if n else np.empty(0)
    order = np.argsort(gaps, kind="stable")
    gaps, owners = gaps[order], owners[order]

    def statistic(pos: np.ndarray) -> np.ndarray:
        flat = pos.reshape(-1, pos.shape[-1])
        counts = np.zeros((flat.shape[0], n))
        np.add.at(counts, (np.arange(flat.shape[0])[:, None], flat), 1.0)
        cumulative = np.cumsum(counts[:, owners], axis=1)
        target = percentile / 100.0 * cumulative[:, -1:]
        at = np.minimum((cumulative < target).sum(axis=1), len(gaps) - 1)
        return gaps[at].reshape(pos.shape[:-1]) if len(gaps) else np.full(pos.shape[:-1], np.nan)

    return statistic


def request_replicates(log_statistic: Callable[[np.ndarray], np.ndarray], n: int, opts: StatsOptions,
                        rng: np.random.Generator) -> np.ndarray:  # fmt: skip
    """The bootstrap distribution of ``log_statistic`` over resamples of n request positions."""
    with warnings.catch_warnings():
        # A window whose values are all equal gives a degenerate (zero-width) distribution:
        # a true answer for that window, not a fault.
        warnings.simplefilter("ignore", scipy_stats.DegenerateDataWarning)
        result = scipy_stats.bootstrap(
            (np.arange(n),), lambda pos, axis=-1: log_statistic(pos), vectorized=True, n_resamples=opts.resamples,
            method="percentile", confidence_level=opts.confidence, batch=500, rng=rng,
        )  # fmt: skip
    return np.asarray(result.bootstrap_distribution, dtype=float)


def _over_runs(per_run: np.ndarray, within: np.ndarray | None, opts: StatsOptions,
               rng: np.random.Generator) -> np.ndarray:  # fmt: skip
    """Replicates of the mean log ratio over runs, the wider of two constructions:

    - a two-stage bootstrap: draw runs with replacement, then a request resample inside
      each drawn run (``within`` holds each run's request-level replicates);
    - Student's t over the runs' own ratios (mean, standard error, R - 1 degrees of
      freedom), drawn as replicates. A bootstrap over 2-5 runs sees too little of the
      spread between runs (it covered 84 % at a nominal 95 % with 3 runs); t does not.

    Throughput, one number per window, has no ``within``: t alone.
    """
    runs = len(per_run)
    spread = per_run.std(ddof=1) / math.sqrt(runs)
    t_draws = per_run.mean() + spread * rng.standard_t(runs - 1, size=opts.resamples)
    if within is None:
        return t_draws
    picks = rng.integers(0, runs, size=(opts.resamples, runs))
    columns = np.stack([rng.permutation(opts.resamples) for _ in range(runs)], axis=1)
    two_stage = within[picks, columns].mean(axis=1)
    return t_draws if t_draws.std() > two_stage.std() else two_stage


def _combine_runs(estimates: list[float], replicates: list[np.ndarray], opts: StatsOptions,
                  rng: np.random.Generator) -> tuple[float, np.ndarray]:  # fmt: skip
    """The estimate over runs (their mean log) and its replicates: one run's own, or
    :func:`_over_runs` across several."""
    per_run = np.asarray(estimates)
    within = np.stack(replicates)
    return float(per_run.mean()), within[0] if len(estimates) == 1 else _over_runs(per_run, within, opts, rng)


def interval_from(metric: str, estimate: float, replicates: np.ndarray, opts: StatsOptions, runs: int,
                  requests: int) -> Ratio:  # fmt: skip
    finite = replicates[np.isfinite(replicates)]
    if len(finite) < 0.9 * len(replicates):
        return Ratio(metric, math.exp(estimate), level=opts.confidence, runs=runs, requests=requests,
                     note="the statistic is undefined in too many resamples")  # fmt: skip
    low, high = np.quantile(finite, [opts.alpha / 2, 1 - opts.alpha / 2])
    return Ratio(metric, math.exp(estimate), math.exp(low), math.exp(high), opts.confidence, runs, requests,
                 log_replicates=finite)  # fmt: skip


def paired_ratio(metric: str, base: Sequence[Sample], spec: Sequence[Sample], opts: StatsOptions,
                 rng: np.random.Generator | None = None, shared_servers: bool = False) -> Ratio:  # fmt: skip
    """The ratio of ``metric`` between two sets of windows; ``base[i]`` pairs with ``spec[i]``
    (the same prompts and schedule: the same repeat).

    ``shared_servers``: every window of each side ran on one server (one run, or repeats
    without restarts). The spread between server starts is then invisible in the windows;
    where an A/A sweep measured it (``opts.server_spread``), it is added to the interval as
    a t-distributed offset, so that the interval covers what a second pair of servers would
    measure."""
    ratio = _paired_ratio(metric, base, spec, opts, rng or np.random.default_rng(opts.seed))
    spread = opts.server_spread.for_metric(metric) if opts.server_spread and shared_servers else None
    if spread is None or ratio.estimate is None:
        return ratio
    assert opts.server_spread is not None
    # One window's throughput has no spread of its own; the A/A spread is then all there is.
    centre = math.log(ratio.estimate)
    replicates = ratio.log_replicates if ratio.resolved else np.full(opts.resamples, centre)
    offset = spread * np.random.default_rng([opts.seed, 7]).standard_t(opts.server_spread.comparisons, len(replicates))
    return interval_from(metric, centre, replicates + offset, opts, ratio.runs, ratio.requests)


def _paired_ratio(metric: str, base: Sequence[Sample], spec: Sequence[Sample], opts: StatsOptions,
                  rng: np.random.Generator) -> Ratio:  # fmt: skip
    if len(base) != len(spec) or not base:
        raise StatsError(f"{metric}: {len(base)} baseline window(s) against {len(spec)} speculative; pair each repeat")
    m = RATIOS[metric]
    runs = len(base)
    if m.field == "throughput":
        return _window_level_ratio(metric, base, spec, opts, rng)
    estimates, replicates, sizes = [], [], []
    for b, s in zip(base, spec, strict=True):
        b_rows, s_rows = _paired_positions(b, s, m)
        sizes.append(len(b_rows))
        if len(b_rows) < opts.min_requests:
            return Ratio(metric, None, runs=runs, requests=len(b_rows),
                         note=f"not enough requests ({len(b_rows)} paired, fewer than {opts.min_requests})")  # fmt: skip
        b_stat, s_stat = _quantile_of(b, b_rows, m), _quantile_of(s, s_rows, m)

        sign = 1.0 if m.latency else -1.0  # > 1 always means speculation is better

        def log_ratio(pos: np.ndarray, b_stat=b_stat, s_stat=s_stat, sign=sign) -> np.ndarray:
            with np.errstate(divide="ignore", invalid="ignore"):
                return sign * (np.log(b_stat(pos)) - np.log(s_stat(pos)))

        estimates.append(float(log_ratio(np.arange(len(b_rows)))))
        replicates.append(request_replicates(log_ratio, len(b_rows), opts, rng))
    centre, combined = _combine_runs(estimates, replicates, opts, rng)
    return interval_from(metric, centre, combined, opts, runs, int(np.median(sizes)))


def _window_level_ratio(metric: str, base: Sequence[Sample], spec: Sequence[Sample], opts: StatsOptions,
                        rng: np.random.Generator) -> Ratio:  # fmt: skip
    """Throughput is one number per window: its spread is measured across windows (repeats).
    Resampling a window's requests would not do: the window's span hangs on its slowest
    request, and a bootstrap of a maximum is known to mislead (it came out far too narrow)."""
    per_run = np.array([math.log(s.throughput / b.throughput) for b, s in zip(base, spec, strict=True)])
    requests = int(np.median([min(b.size, s.size) for b, s in zip(base, spec, strict=True)]))
    if not np.all(np.isfinite(per_run)):
        return Ratio(metric, None, runs=len(base), requests=requests, note="a window has no throughput")
    if len(base) < 2:
        return Ratio(metric, math.exp(per_run[0]), level=opts.confidence, runs=1, requests=requests,
                     note="throughput is one number per window; repeats.count >= 2 measures its spread")  # fmt: skip
    return interval_from(metric, float(per_run.mean()), _over_runs(per_run, None, opts, rng), opts, len(base), requests)


def window_interval(field_name: str, percentile: float, windows: Sequence[Sample], opts: StatsOptions,
                    rng: np.random.Generator | None = None) -> Ratio:  # fmt: skip
    """One set of windows' own statistic (e.g. median TPOT in seconds) with its interval:
    the error bar of a point in a plot."""
    rng = rng or np.random.default_rng(opts.seed)
    metric = Metric(field_name, percentile, True)
    estimates, replicates = [], []
    for w in windows:
        rows = np.arange(w.size)
        if metric.field in w.values:
            rows = rows[np.isfinite(w.values[metric.field])]
        if len(rows) < opts.min_requests:
            return Ratio(field_name, None, note=f"not enough requests ({len(rows)})")
        stat = _quantile_of(w, rows, metric)

        def log_stat(pos: np.ndarray, stat=stat) -> np.ndarray:
            with np.errstate(divide="ignore", invalid="ignore"):
                return np.log(stat(pos))

        estimates.append(float(log_stat(np.arange(len(rows)))))
        replicates.append(request_replicates(log_stat, len(rows), opts, rng))
    centre, combined = _combine_runs(estimates, replicates, opts, rng)
    return interval_from(field_name, centre, combined, opts, len(windows), int(windows[0].size))


def acceptance_length_interval(windows: Sequence[Sample], counter_length: float | None, opts: StatsOptions,
                               rng: np.random.Generator | None = None) -> Ratio:  # fmt: skip
    """Acceptance length L with an interval from the requests' tokens per streamed step.

    Each engine step streams one chunk per request, so a request's (tokens - 1) / (chunks - 1)
    is its own L; their ratio of sums over a resample of requests is the window's. The interval's
    relative width comes from that bootstrap; it is centred on ``counter_length`` (the
    engine's own counters, exact for the window) where there is one."""
    rng = rng or np.random.default_rng(opts.seed)
    estimates, replicates = [], []
    for w in windows:
        rows = np.flatnonzero(w.chunks >= 2)
        if len(rows) < opts.min_requests:
            return Ratio("acceptance_length", counter_length, note=f"not enough multi-step requests ({len(rows)})")
        tokens, steps = w.output_tokens[rows] - 1.0, w.chunks[rows] - 1.0

        def log_length(pos: np.ndarray, tokens=tokens, steps=steps) -> np.ndarray:
            return np.log(tokens[pos].sum(axis=-1) / steps[pos].sum(axis=-1))

        estimates.append(float(log_length(np.arange(len(rows)))))
        replicates.append(request_replicates(log_length, len(rows), opts, rng))
    centre, combined = _combine_runs(estimates, replicates, opts, rng)
    if counter_length is not None and math.isfinite(counter_length) and counter_length > 0:
        combined = combined - centre + math.log(counter_length)
        centre = math.log(counter_length)
    return interval_from("acceptance_length", centre, combined, opts, len(windows), int(windows[0].size))
