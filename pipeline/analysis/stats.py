"""The one statistics core: every ratio the report turns into a word comes from here.

Pure computation (numpy and scipy); no MLflow, no plotting, no I/O.

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
- **Decisions** compare the interval with a practical floor and adjust for the number of
  comparisons in a report (Benjamini-Hochberg): "helps" only if the interval lies above
  1 + floor, "hurts" only if below 1 - floor, otherwise "inconclusive".

Every ratio is oriented so that > 1 means speculation (the second window) is better:
baseline / speculative for latencies, speculative / baseline for throughput.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from pipeline.config import stats_problem


class StatsError(ValueError):
    pass


@dataclass(frozen=True)
class ServerSpread:
    """How far two fresh, identical servers differ: the root mean square of the log ratios
    of an A/A sweep's comparisons, per ratio. A comparison whose two windows ran on one pair
    of servers cannot see this spread in its own requests; it is added to its interval."""

    sd: dict[str, float]  # ratio name -> RMS of the A/A log ratios
    comparisons: int  # how many A/A comparisons it rests on (the t distribution's df)
    source: str  # which sweep measured it

    def for_metric(self, metric: str) -> float | None:
        value = self.sd.get(metric)
        return value if value is not None and math.isfinite(value) and value > 0 else None


@dataclass(frozen=True)
class StatsOptions:
    confidence: float = 0.95  # two-sided level of every interval
    floor: float = 0.02  # a ratio within 1 +- floor is no practical effect
    resamples: int = 2000  # bootstrap replicates per interval
    min_requests: int = 5  # fewer paired requests than this: "not enough requests"
    seed: int = 0  # the bootstrap's own seed: a report is reproducible
    server_spread: ServerSpread | None = None  # from an A/A sweep; see paired_ratio

    def __post_init__(self) -> None:
        problem = stats_problem(self.confidence, self.floor, self.resamples)
        if problem:
            raise StatsError(problem)
        if self.min_requests < 2:
            raise StatsError(f"stats.min_requests={self.min_requests} must be >= 2")

    @property
    def alpha(self) -> float:
        return 1.0 - self.confidence


# ---- One window's per-request samples --------------------------------------------------


@dataclass(frozen=True, eq=False)
class Sample:
    """A window's successful requests, keyed by prompt index (what pairs two windows)."""

    index: np.ndarray  # prompt index of each request
    values: dict[str, np.ndarray]  # per-request seconds: ttft, tpot, e2el (NaN where undefined)
    itl: tuple[np.ndarray, ...]  # each request's gaps between token-bearing chunks
    output_tokens: np.ndarray
    chunks: np.ndarray  # token-bearing chunks per request: one per engine step when streamed
    duration_s: float
    failed: int = 0
    scheduled_end_s: float = math.nan  # when the window's last request was due

    @property
    def size(self) -> int:
        return len(self.index)

    @property
    def throughput(self) -> float:
        return float(self.output_tokens.sum()) / self.duration_s if self.duration_s > 0 else math.nan

    @staticmethod
    def from_requests(frame: pd.DataFrame, duration_s: float) -> Sample:
        """From a window's ``requests.csv`` (one row per request, as the client recorded it)."""
        import json

        ok = frame[frame["error"].isna()] if "error" in frame else frame
        chunk_lists = [json.loads(c) if isinstance(c, str) else [] for c in ok.get("chunk_s", [])]
        return Sample(
            index=ok["index"].to_numpy(dtype=int),
            values={name: ok[f"{name}_s"].to_numpy(dtype=float) for name in ("ttft", "tpot", "e2el")},
            itl=tuple(np.diff(np.asarray(c, dtype=float)) for c in chunk_lists),
            output_tokens=ok["output_tokens"].fillna(0).to_numpy(dtype=float),
            chunks=ok["num_chunks"].to_numpy(dtype=float) if "num_chunks" in ok else np.zeros(len(ok)),
            duration_s=float(duration_s),
            failed=len(frame) - len(ok),
            scheduled_end_s=float(frame["scheduled_s"].max()) if "scheduled_s" in frame and len(frame) else math.nan,
        )


# ---- Ratios with intervals ----------------------------------------------------------------


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


def _interval(metric: str, estimate: float, replicates: np.ndarray, opts: StatsOptions, runs: int,
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
    return _interval(metric, centre, replicates + offset, opts, ratio.runs, ratio.requests)


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
    return _interval(metric, centre, combined, opts, runs, int(np.median(sizes)))


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
    return _interval(metric, float(per_run.mean()), _over_runs(per_run, None, opts, rng), opts, len(base), requests)


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
    return _interval(field_name, centre, combined, opts, len(windows), int(windows[0].size))


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
    return _interval("acceptance_length", centre, combined, opts, len(windows), int(windows[0].size))


def server_spread(log_ratios: dict[str, Sequence[float]], source: str) -> ServerSpread | None:
    """From an A/A sweep's comparisons (each a pair of fresh, identical servers): the RMS of
    their log ratios, per ratio. Within-window noise is in it too, so it errs wide."""
    sd = {m: float(np.sqrt(np.mean(np.square(v)))) for m, v in log_ratios.items() if len(v) >= 2}
    counts = [len(v) for v in log_ratios.values() if len(v) >= 2]
    return ServerSpread(sd, min(counts), source) if sd else None


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


def against_history(metric: str, current: float, history: Sequence[float], spread: float, df: int,
                    opts: StatsOptions, higher_is_better: bool, rng: np.random.Generator) -> Ratio:  # fmt: skip
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
        return Ratio(metric, math.exp(centre), level=opts.confidence, runs=len(past),
                     note="the spread between runs is not measured yet")  # fmt: skip
    scale = spread * math.sqrt(1 + math.pi / (2 * len(past)))
    replicates = centre + scale * rng.standard_t(df, size=opts.resamples)
    return _interval(metric, centre, replicates, opts, len(past), 0)


# ---- Decisions ------------------------------------------------------------------------------

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


# ---- The load where speculation stops paying ----------------------------------------------


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
