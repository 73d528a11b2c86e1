"""The one statistics core: every ratio the report turns into a word comes from here.

Its neighbours: :mod:`~pipeline.analysis.samples` (a window's requests, the options),
:mod:`~pipeline.analysis.decisions` (ratios to words) and :mod:`~pipeline.analysis.between_runs`
(past runs, for the gate). Pure computation (numpy and scipy); no MLflow, no plotting, no I/O.

- **Within a run**, an interval comes from a bootstrap over requests (``scipy.stats.bootstrap``),
  *paired by prompt*: the baseline and the speculative window send the same prompts on the
  same schedule, so a resample draws prompts, and both windows' answers to them, together.
  That removes prompt-to-prompt variation from the ratio.
  At high load a window's requests share queueing state, so they are serially correlated in
  arrival order, which an iid bootstrap does not see: where the paired log ratios' lag-1
  autocorrelation rho is significantly positive, each run's replicates are spread about its
  estimate by sqrt((1 + rho) / (1 - rho)) (:func:`serial_inflation`).
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

import dataclasses
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import stats as scipy_stats

from pipeline.analysis.samples import Sample, StatsError, StatsOptions
from pipeline.measures import COMPARISONS, Better


@dataclass(frozen=True)
class Metric:
    field: str  # ttft | tpot | e2el | itl | throughput
    percentile: float
    latency: bool  # True: lower is better, the ratio is baseline / speculative


Statistic = Callable[[np.ndarray], np.ndarray]  # a quantile over resampled positions

# The report's ratios, named as the sweep table's columns: every comparison the metrics declare.
RATIOS: dict[str, Metric] = {
    m.ratio: Metric(m.field or "throughput", m.percentile or 0, m.better is Better.LOWER)
    for m in COMPARISONS.values()
    if m.ratio
}


@dataclass(frozen=True)
class Noise:
    """Where an interval's width comes from, on the log scale: what a sample-size hint needs.

    ``within_sd`` is the spread of one window's request-level replicates at ``requests``
    requests (it shrinks as 1/sqrt(requests)); ``server_sd`` the spread between server starts
    (an A/A sweep's, or the one between restarted repeats), which no window size shrinks."""

    within_sd: float | None  # None: one number per window (throughput)
    requests: int
    server_sd: float | None  # None: not measured
    server_df: float
    runs: int
    restarted: bool  # every repeat on fresh servers: the runs themselves measure server_sd
    run_sd: float | None = None  # sd of the runs' own log ratios (repeats only)


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
    df: float | None = None  # the reference distribution's degrees of freedom for p-values (None: normal)
    noise: Noise | None = None

    @property
    def resolved(self) -> bool:
        return self.low is not None and self.high is not None

    @property
    def censored(self) -> bool:
        """A failed request (+inf) reaches the statistic in the estimate or in some replicates:
        the ratio is 0 or infinite there, and is decided by the share of such replicates."""
        ends = (self.estimate, self.low, self.high)
        return any(v is not None and (v == 0.0 or math.isinf(v)) for v in ends) or bool(
            np.isinf(self.log_replicates).any()
        )

    @property
    def text(self) -> str:
        """``2.34x [2.10, 2.61]``: the estimate and its interval, or why there is none. A censored
        end (a failure reached the statistic) prints as 0.00 or ∞."""
        if self.estimate is None or math.isnan(self.estimate):
            return f"— ({self.note})" if self.note else "—"
        if not self.resolved:
            return f"{_times(self.estimate)}x [no interval: {self.note}]"
        return f"{_times(self.estimate)}x [{_times(self.low)}, {_times(self.high)}]"  # type: ignore[arg-type]


def _times(value: float) -> str:
    return "∞" if value == math.inf else f"{value:.2f}"


def _paired_positions(base: Sample, spec: Sample, metric: Metric) -> tuple[np.ndarray, np.ndarray]:
    """Row positions in each window of the prompts both answered with a defined value."""
    common, b_pos, s_pos = np.intersect1d(base.index, spec.index, assume_unique=False, return_indices=True)
    if metric.field in base.values:
        defined = np.isfinite(base.values[metric.field][b_pos]) & np.isfinite(spec.values[metric.field][s_pos])
        b_pos, s_pos = b_pos[defined], s_pos[defined]
    return b_pos, s_pos


def paired_values(base: Sample, spec: Sample, field_name: str) -> tuple[np.ndarray, np.ndarray]:
    """Both windows' values of a per-request latency, one entry per prompt that both windows
    sent and neither left undefined; a failed request is +inf there (censored: a timeout is
    slower than any answer). Dropping failures instead would flatter the side that fails on
    the hard prompts. A prompt that failed on both sides is left out: it says nothing about
    which side is faster."""
    b_vals, s_vals, _ = _paired_by_prompt(base, spec, field_name)
    return b_vals, s_vals


def _paired_by_prompt(base: Sample, spec: Sample, field_name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`paired_values`, and the prompt of each entry (ascending)."""

    def by_prompt(sample: Sample) -> dict[int, float]:
        found = {int(i): float(v) for i, v in zip(sample.index, sample.values[field_name], strict=True)}
        found.update({int(i): math.inf for i in sample.failed_index if int(i) not in found})
        return found

    b, s = by_prompt(base), by_prompt(spec)
    common = sorted(set(b) & set(s))
    b_vals, s_vals = np.array([b[i] for i in common]), np.array([s[i] for i in common])
    # NaN (a one-token request's TPOT) is undefined, not censored; inf on both sides says nothing.
    keep = ~np.isnan(b_vals) & ~np.isnan(s_vals) & ~(np.isinf(b_vals) & np.isinf(s_vals))
    return b_vals[keep], s_vals[keep], np.array(common, dtype=int)[keep]


# One-sided test of "no serial correlation" before widening: rho is taken where its lag-1
# estimate exceeds z / sqrt(n) (Bartlett's standard error under independence), z at 5 %.
SERIAL_TEST_Z = 1.6449


def lag1_autocorrelation(series: np.ndarray) -> float:
    """The lag-1 sample autocorrelation of ``series`` (in arrival order); non-finite entries (a
    censored failure's log ratio) are left out of the mean, the variance and any lag pair they
    are in. 0 where fewer than 3 entries are finite or all are equal."""
    x = np.asarray(series, dtype=float)
    finite = np.isfinite(x)
    if finite.sum() < 3:
        return 0.0
    d = np.where(finite, x - x[finite].mean(), 0.0)
    denominator = float(np.sum(d[finite] ** 2))
    if denominator <= 0:
        return 0.0
    both = finite[:-1] & finite[1:]
    return float(np.sum(d[:-1][both] * d[1:][both]) / denominator)


def serial_inflation(series: np.ndarray, z: float | None = SERIAL_TEST_Z) -> tuple[float, float]:
    """``(rho, factor)``: the lag-1 autocorrelation of a window's per-request log ratios in
    arrival order, and how much wider than an iid bootstrap's its interval must be.

    The factor is that of an AR(1) mean: its variance is (1 + rho) / (1 - rho) times the iid
    one (n requests are worth n (1 - rho) / (1 + rho) independent ones), capped where that
    effective size would fall below one request. For a quantile it errs wide: a quantile's
    error follows the requests' indicators (below it or not), and for a Gaussian pair of
    correlation r their correlation, (2/pi) arcsin r at the median, is at most r. 1.0 (the
    iid bootstrap unchanged) where rho is not above ``z`` / sqrt(n) (None: where rho <= 0)."""
    x = np.asarray(series, dtype=float)
    n = int(np.isfinite(x).sum())
    rho = lag1_autocorrelation(x)
    threshold = 0.0 if z is None or n == 0 else z / math.sqrt(n)
    if rho <= threshold or n < 3:
        return rho, 1.0
    factor = math.sqrt((1 + rho) / (1 - rho)) if rho < 1 else math.inf
    return rho, min(factor, math.sqrt(n))


def _arrival_order(base: Sample, spec: Sample, prompts: np.ndarray) -> np.ndarray:
    """Positions of ``prompts`` in arrival order: by the scheduled send times where every one of
    them has one (both windows share the schedule), else by prompt index (the load generator
    sends prompt i at the i-th of its increasing offsets)."""
    due: dict[int, float] = {}
    for sample in (spec, base):
        if len(sample.scheduled) == sample.size:
            due.update(zip(sample.index.tolist(), sample.scheduled.tolist(), strict=True))
    times = np.array([due.get(int(p), math.nan) for p in prompts])
    if len(prompts) and np.all(np.isfinite(times)):
        return np.argsort(times, kind="stable")
    return np.argsort(prompts, kind="stable")


def _quantile_of(sample: Sample, rows: np.ndarray, metric: Metric) -> Callable[[np.ndarray], np.ndarray]:
    """``positions (..., n) -> statistic (...)`` of the window's requests at ``rows[positions]``."""
    if metric.field == "itl":
        return _pooled_quantile([sample.itl[r] for r in rows], metric.percentile)
    return _quantile(sample.values[metric.field][rows], metric.percentile)


def _quantile(values: np.ndarray, percentile: float) -> Callable[[np.ndarray], np.ndarray]:
    """``positions (..., n) -> percentile (...)``; +inf entries (failures) sort last, so a
    quantile that reaches them is +inf (numpy's interpolation would give NaN next to inf)."""

    def statistic(pos: np.ndarray) -> np.ndarray:
        drawn = values[pos]
        if not np.isinf(drawn).any():
            return np.percentile(drawn, percentile, axis=-1)
        # A sentinel far above any latency: any interpolation weight on it lands above 1e200.
        out = np.percentile(np.where(np.isinf(drawn), 1e300, drawn), percentile, axis=-1)
        return np.where(out > 1e200, math.inf, out)

    return statistic


def censored_percentile(values: np.ndarray, percentile: float) -> float:
    """numpy's percentile of ``values``, +inf where it reaches a failure (+inf entries)."""
    if len(values) == 0:
        return math.nan
    return float(_quantile(np.asarray(values, dtype=float), percentile)(np.arange(len(values))))


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


def request_replicates(
    log_statistic: Callable[[np.ndarray], np.ndarray], n: int, opts: StatsOptions, rng: np.random.Generator
) -> np.ndarray:
    """The bootstrap distribution of ``log_statistic`` over resamples of n request positions."""
    with warnings.catch_warnings(), np.errstate(invalid="ignore"):
        # A window whose values are all equal gives a degenerate (zero-width) distribution:
        # a true answer for that window, not a fault. Censored replicates (+-inf) make scipy's
        # own standard error of them NaN, which is not used.
        warnings.simplefilter("ignore", scipy_stats.DegenerateDataWarning)
        result = scipy_stats.bootstrap(
            (np.arange(n),),
            lambda pos, axis=-1: log_statistic(pos),
            vectorized=True,
            n_resamples=opts.resamples,
            method="percentile",
            confidence_level=opts.confidence,
            batch=500,
            rng=rng,
        )
    return np.asarray(result.bootstrap_distribution, dtype=float)


def _over_runs(
    per_run: np.ndarray, within: np.ndarray | None, opts: StatsOptions, rng: np.random.Generator
) -> tuple[np.ndarray, float | None]:
    """Replicates of the mean log ratio over runs, the wider of two constructions, and the
    degrees of freedom of its reference distribution (R - 1 where t is the wider, else None):

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
        return t_draws, runs - 1
    picks = rng.integers(0, runs, size=(opts.resamples, runs))
    columns = np.stack([rng.permutation(opts.resamples) for _ in range(runs)], axis=1)
    two_stage = within[picks, columns].mean(axis=1)
    if t_draws.std() > _finite_std(two_stage):
        return t_draws, runs - 1
    return two_stage, None


def _finite_std(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.std()) if len(finite) else math.inf


def _combine_runs(
    estimates: list[float], replicates: list[np.ndarray], opts: StatsOptions, rng: np.random.Generator
) -> tuple[float, np.ndarray, float | None]:
    """The estimate over runs (their mean log), its replicates and their df: one run's own
    (a bootstrap: normal reference), or :func:`_over_runs` across several."""
    per_run = np.asarray(estimates)
    within = np.stack(replicates)
    if len(estimates) == 1:
        return float(per_run[0]), within[0], None
    combined, df = _over_runs(per_run, within, opts, rng)
    return float(per_run.mean()), combined, df


def interval_from(
    metric: str,
    estimate: float,
    replicates: np.ndarray,
    opts: StatsOptions,
    runs: int,
    requests: int,
    df: float | None = None,
    noise: Noise | None = None,
) -> Ratio:
    """The percentile interval of ``replicates`` (log scale) around ``estimate``. A replicate of
    +-inf is a censored one (a failure reached the quantile) and counts, and so does an estimate
    of +-inf (the ratio is then 0 or infinite, with its interval); NaN is undefined. Quantiles
    over censored replicates are taken without interpolation (``inverted_cdf``): numpy's linear
    interpolation next to an infinite replicate gives NaN."""
    kept = replicates[~np.isnan(replicates)]
    if len(kept) < 0.9 * len(replicates) or math.isnan(estimate):
        return Ratio(
            metric,
            None,
            level=opts.confidence,
            runs=runs,
            requests=requests,
            note="the statistic is undefined in too many resamples",
            noise=noise,
        )
    method = "inverted_cdf" if np.isinf(kept).any() else "linear"
    low, high = np.quantile(kept, [opts.alpha / 2, 1 - opts.alpha / 2], method=method)
    return Ratio(
        metric,
        math.exp(estimate),
        math.exp(low),
        math.exp(high),
        opts.confidence,
        runs,
        requests,
        log_replicates=kept,
        df=df,
        noise=noise,
    )


def paired_ratio(
    metric: str,
    base: Sequence[Sample],
    spec: Sequence[Sample],
    opts: StatsOptions,
    rng: np.random.Generator | None = None,
    shared_servers: bool = False,
) -> Ratio:
    """The ratio of ``metric`` between two sets of windows; ``base[i]`` pairs with ``spec[i]``
    (the same prompts and schedule: the same repeat).

    ``shared_servers``: every window of each side ran on one server (one run, or repeats
    without restarts). The spread between server starts is then invisible in the windows;
    where an A/A sweep measured it (``opts.server_spread``), it is added to the interval as
    a t-distributed offset, so that the interval covers what a second pair of servers would
    measure."""
    ratio = _paired_ratio(metric, base, spec, opts, rng or np.random.default_rng(opts.seed), not shared_servers)
    spread = opts.server_spread.for_metric(metric) if opts.server_spread and shared_servers else None
    if spread is None or ratio.estimate is None:
        return ratio
    assert opts.server_spread is not None
    # One window's throughput has no spread of its own; the A/A spread is then all there is.
    centre = math.log(ratio.estimate) if ratio.estimate > 0 else -math.inf  # 0: censored
    replicates = ratio.log_replicates if ratio.resolved else np.full(opts.resamples, centre)
    server_df = float(opts.server_spread.comparisons)
    offset = spread * np.random.default_rng([opts.seed, 7]).standard_t(server_df, len(replicates))
    noise = dataclasses.replace(ratio.noise, server_sd=spread, server_df=server_df) if ratio.noise else None
    return interval_from(
        metric,
        centre,
        replicates + offset,
        opts,
        ratio.runs,
        ratio.requests,
        _sum_df(_finite_std(replicates), ratio.df, spread, server_df),
        noise,
    )


def _sum_df(sd_a: float, df_a: float | None, sd_b: float, df_b: float) -> float | None:
    """Welch-Satterthwaite degrees of freedom of a sum of two independent errors (None: normal)."""
    va, vb = sd_a**2, sd_b**2
    if not (math.isfinite(va) and math.isfinite(vb)) or va + vb <= 0:
        return None
    inverse = (va**2 / df_a if df_a else 0.0) + vb**2 / df_b
    return (va + vb) ** 2 / inverse if inverse > 0 else None


def _paired_ratio(
    metric: str,
    base: Sequence[Sample],
    spec: Sequence[Sample],
    opts: StatsOptions,
    rng: np.random.Generator,
    restarted: bool,
) -> Ratio:
    if len(base) != len(spec) or not base:
        raise StatsError(f"{metric}: {len(base)} baseline window(s) against {len(spec)} speculative; pair each repeat")
    m = RATIOS[metric]
    runs = len(base)
    if m.field == "throughput":
        return _window_level_ratio(metric, base, spec, opts, rng, restarted)
    estimates, replicates, sizes = [], [], []
    sign = 1.0 if m.latency else -1.0  # > 1 always means speculation is better
    for b, s in zip(base, spec, strict=True):
        b_stat, s_stat, size, per_request, prompts = _window_quantiles(b, s, m)
        sizes.append(size)
        if size < opts.min_requests:
            return Ratio(
                metric,
                None,
                runs=runs,
                requests=size,
                note=f"not enough requests ({size} paired, fewer than {opts.min_requests})",
            )

        everyone = np.arange(size)
        if 0.0 in (float(b_stat(everyone)), float(s_stat(everyone))):
            # A server that streamed a request's tokens together measures a gap of 0: a ratio to
            # it is no speedup (log 0 would read as the censored -inf of a failed window).
            return Ratio(metric, None, runs=runs, requests=size, note=f"a window's {m.field} quantile is 0 ms")

        def log_ratio(pos: np.ndarray, b_stat=b_stat, s_stat=s_stat) -> np.ndarray:
            b_q, s_q = b_stat(pos), s_stat(pos)
            with np.errstate(divide="ignore", invalid="ignore"):
                # A resample whose quantile is 0 is undefined (NaN), never the +-inf of a failure.
                return np.where((b_q == 0) | (s_q == 0), np.nan, sign * (np.log(b_q) - np.log(s_q)))

        estimate = float(log_ratio(everyone))
        estimates.append(estimate)
        # Serially correlated requests (high load): widen this run's replicates about its estimate.
        _, factor = serial_inflation(per_request[_arrival_order(b, s, prompts)])
        within = request_replicates(log_ratio, size, opts, rng)
        if factor > 1.0 and math.isfinite(estimate):
            with np.errstate(invalid="ignore"):
                within = estimate + factor * (within - estimate)
        replicates.append(within)
    centre, combined, df = _combine_runs(estimates, replicates, opts, rng)
    noise = _noise(estimates, replicates, int(np.median(sizes)), restarted)
    return interval_from(metric, centre, combined, opts, runs, int(np.median(sizes)), df, noise)


def _window_quantiles(b: Sample, s: Sample, m: Metric) -> tuple[Statistic, Statistic, int, np.ndarray, np.ndarray]:
    """One pair of windows' quantile statistics (over resampled positions), the number of
    paired requests, each request's log ratio (for the serial-correlation check) and its prompts."""
    if m.field == "itl":
        b_rows, s_rows = _paired_positions(b, s, m)
        # Each request's own median gap stands for it in the serial-correlation check.
        b_req, s_req = (
            [float(np.median(w.itl[r])) if len(w.itl[r]) else math.nan for r in rows]
            for w, rows in ((b, b_rows), (s, s_rows))
        )
        with np.errstate(divide="ignore", invalid="ignore"):
            per_request = np.log(np.array(b_req)) - np.log(np.array(s_req))
        return _quantile_of(b, b_rows, m), _quantile_of(s, s_rows, m), len(b_rows), per_request, b.index[b_rows]
    b_vals, s_vals, prompts = _paired_by_prompt(b, s, m.field)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_request = np.log(b_vals) - np.log(s_vals)
    return _quantile(b_vals, m.percentile), _quantile(s_vals, m.percentile), len(b_vals), per_request, prompts


def _noise(estimates: list[float], replicates: list[np.ndarray], requests: int, restarted: bool) -> Noise:
    """The components of an interval's width: the windows' own (the median over runs of each
    run's replicate sd) and, across restarted repeats, the servers' (what the runs' spread
    holds beyond the windows' own)."""
    within = float(np.median([_finite_std(r) for r in replicates]))
    runs = len(estimates)
    restarted = restarted and runs >= 2  # one run measures no spread between servers, whatever it ran on
    run_sd = float(np.std(estimates, ddof=1)) if runs >= 2 else None
    server_sd = math.sqrt(max(run_sd**2 - within**2, 0.0)) if run_sd is not None and restarted else None
    return Noise(within, requests, server_sd, runs - 1 if server_sd is not None else 0, runs, restarted, run_sd)


def _window_level_ratio(
    metric: str,
    base: Sequence[Sample],
    spec: Sequence[Sample],
    opts: StatsOptions,
    rng: np.random.Generator,
    restarted: bool,
) -> Ratio:
    """Throughput is one number per window: its spread is measured across windows (repeats).
    Resampling a window's requests would not do: the window's span hangs on its slowest
    request, and a bootstrap of a maximum is known to mislead (it came out far too narrow)."""
    # A window that streamed nothing (every request failed) has throughput 0: no ratio, said below.
    per_run = np.array(
        [
            math.log(s.throughput / b.throughput) if s.throughput > 0 and b.throughput > 0 else math.nan
            for b, s in zip(base, spec, strict=True)
        ]
    )
    requests = int(np.median([min(b.size, s.size) for b, s in zip(base, spec, strict=True)]))
    if not np.all(np.isfinite(per_run)):
        return Ratio(metric, None, runs=len(base), requests=requests, note="a window has no throughput")
    run_sd = float(per_run.std(ddof=1)) if len(base) >= 2 else None
    restarted = restarted and len(base) >= 2
    noise = Noise(None, requests, run_sd if restarted else None, len(base) - 1, len(base), restarted, run_sd)
    if len(base) < 2:
        return Ratio(
            metric,
            math.exp(per_run[0]),
            level=opts.confidence,
            runs=1,
            requests=requests,
            note="throughput is one number per window; repeats.count >= 2 measures its spread",
            noise=noise,
        )
    replicates, df = _over_runs(per_run, None, opts, rng)
    return interval_from(metric, float(per_run.mean()), replicates, opts, len(base), requests, df, noise)


def window_interval(
    field_name: str,
    percentile: float,
    windows: Sequence[Sample],
    opts: StatsOptions,
    rng: np.random.Generator | None = None,
) -> Ratio:
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
    centre, combined, df = _combine_runs(estimates, replicates, opts, rng)
    return interval_from(field_name, centre, combined, opts, len(windows), int(windows[0].size), df)


def acceptance_length_interval(
    windows: Sequence[Sample], counter_length: float | None, opts: StatsOptions, rng: np.random.Generator | None = None
) -> Ratio:
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

        estimate = float(log_length(np.arange(len(rows))))
        estimates.append(estimate)
        replicates.append(
            estimate
            + (request_replicates(log_length, len(rows), opts, rng) - estimate) * _expansion(len(rows), opts.confidence)
        )
    centre, combined, df = _combine_runs(estimates, replicates, opts, rng)
    if counter_length is not None and math.isfinite(counter_length) and counter_length > 0:
        combined = combined - centre + math.log(counter_length)
        centre = math.log(counter_length)
    return interval_from("acceptance_length", centre, combined, opts, len(windows), int(windows[0].size), df)


def _expansion(n: int, confidence: float) -> float:
    """Hesterberg's expanded percentile bootstrap: a percentile interval of a mean-like
    statistic is too narrow at small n (the bootstrap's variance is (n - 1)/n of the true one,
    and its quantiles are the normal's, not Student's). Widening the replicates about the
    estimate by sqrt(n / (n - 1)) * t(n - 1) / z fixes both: the acceptance-length interval
    covered 92.6-93.6 % at 32-128 requests without it (benchmarks/stats_calibration.py)."""
    if n < 2:
        return 1.0
    tail = 1 - (1 - confidence) / 2
    return math.sqrt(n / (n - 1)) * float(scipy_stats.t.ppf(tail, n - 1)) / float(scipy_stats.norm.ppf(tail))


# ---- Kept up: the achieved request rate against the offered one ----------------------------

# A window kept up with its offered load when it completed requests at 90 % or more of the rate
# at which they were sent. One rule for search=capacity's overload check
# (:mod:`~pipeline.analysis.capacity`) and the report's "load-bound" label
# (:mod:`~pipeline.analysis.verdicts`). The achieved rate is taken over the measured span less a
# typical request's latency (the median E2EL): a window that kept up still runs past its last
# arrival by its last request's own latency, which says nothing about the load. A server that
# falls behind stretches the span by the queue it builds: at a service rate mu below the offered
# lambda the share tends to mu / lambda. A smaller overload shows as a rising TTFT (capacity's
# trend test).
KEPT_UP = 0.9


def achieved_share(sample: Sample) -> float:
    """The achieved request rate over the offered one: completed requests per second of the
    measured span (``duration_s``, the window's start to its last response) less the median
    E2EL, over requests sent (failed ones included) per second of the arrival span
    (``scheduled_end_s``, when the last request was due). NaN where a span is unknown; 0
    where every request was due at once (an infinite offered rate never keeps up)."""
    sent = sample.size + sample.failed
    end = sample.scheduled_end_s
    if not sent or not math.isfinite(end) or end < 0 or not sample.duration_s > 0:
        return math.nan
    if end == 0:
        return 0.0
    e2el = sample.values.get("e2el", np.empty(0))
    e2el = e2el[np.isfinite(e2el)]
    lag = float(np.median(e2el)) if len(e2el) else 0.0
    span = max(sample.duration_s - lag, end * 1e-3)  # a window shorter than its latency: all lag
    return (sample.size / span) / (sent / end)


def keeps_up(sample: Sample) -> bool:
    """Whether a window kept up with its offered load (:data:`KEPT_UP`); False where
    :func:`achieved_share` is unknown."""
    share = achieved_share(sample)
    return math.isfinite(share) and share >= KEPT_UP
