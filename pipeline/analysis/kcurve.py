"""search=predict: measure the baseline and the largest k at every rate, predict every other k.

Per request rate, from two measured windows (the baseline, k = 0, and k_max):

- **Acceptance.** vLLM's per-position counters give p_i, the unconditional probability that the
  first i + 1 of the k_max drafts were all accepted. A chain drafter's k = j draft is, to first
  order, the first j tokens of its k_max draft, so L(j) = 1 + sum_{i<j} p_i tokens per step
  (the bonus token included). The profile is scaled so that L(k_max) is the window's measured L.
- **Step cost.** A baseline step costs TPOT_base (one token per step), a k_max step
  TPOT(k_max) * L(k_max); a step verifies k + 1 tokens, so its cost is linear in k between them.
  TPOT(k) = step(k) / L(k) and speedup(k) = TPOT_base / TPOT(k).
- **Anchors.** Rates measured at a small k come out a little above the first positions at
  k_max (0.77/0.67/0.61 at k=3 against 0.73/0.63/0.57 at k=5), so the raw model under-predicts
  L. Every other k measured at the rate (a confirmation) is an anchor: the step cost becomes
  piecewise-linear through the anchors, and L(k) = 1 + c(k) * sum_{i<k} p_i with c = 1 at k_max,
  c(k_a) = (L_a - 1) / sum_{i<k_a} p_i at an anchor, linear in between and flat below the
  lowest anchor. The model then reproduces every measured k exactly.
- **Uncertainty.** Every measured input carries B bootstrap replicates of its log; the whole
  model is evaluated once per replicate and the interval is their quantiles. A confirmation
  runs on a fresh server, which the windows' own replicates cannot see: where an A/A sweep
  measured the spread between servers, it is added as a t-distributed offset.

Pure computation (numpy); no MLflow, no I/O.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pipeline.analysis.samples import StatsOptions

VALIDATED_METHODS = ("ngram", "draft")  # chain drafters whose prediction was validated here (vLLM)

WITHIN_WINDOW_NOTE = "within-window noise only: an A/A sweep (aa=true) measures the spread between servers"


@dataclass(frozen=True, eq=False)
class KWindow:
    """One measured window's inputs to the model."""

    k: int  # 0 for the baseline
    tpot_s: float  # median TPOT, seconds
    tpot_log_reps: np.ndarray  # B bootstrap replicates of log(median TPOT)
    length: float = 1.0  # acceptance length L (counters); 1.0 for the baseline
    length_log_reps: np.ndarray | None = None  # B replicates of log L (None for the baseline)


@dataclass(frozen=True, eq=False)
class RateInputs:
    rate: float
    base: KWindow
    top: KWindow  # the k_max window
    per_position: tuple[float, ...]  # p_0..p_{k_max-1} from the k_max window
    anchors: tuple[KWindow, ...] = ()  # other measured k at this rate (confirmations)

    def __post_init__(self) -> None:
        problem = self._problem()
        if problem:
            raise ValueError(f"rate {self.rate:g}: {problem}")
        # Knots must be in k order; callers may list confirmations in any order.
        object.__setattr__(self, "anchors", tuple(sorted(self.anchors, key=lambda w: w.k)))

    def _problem(self) -> str | None:
        top = self.top
        if top.k < 1:
            return f"the k_max window has k={top.k}; it must be >= 1"
        if self.base.k != 0:
            return f"the baseline window has k={self.base.k}; it must be 0"
        if len(self.per_position) < top.k:
            return f"{len(self.per_position)} per-position acceptance rate(s) for k_max={top.k}"
        if not all(math.isfinite(p) and p >= 0 for p in self.per_position):
            return f"per-position acceptance rates must be finite and >= 0: {self.per_position}"
        if top.length < 1 or (top.length > 1 and sum(self.per_position[: top.k]) <= 0):
            return f"the k_max window's L={top.length} does not fit its per-position rates {self.per_position}"
        ks = [w.k for w in self.anchors]
        if any(not 1 <= k < top.k for k in ks) or len(set(ks)) != len(ks):
            return f"anchors at k={ks} must be distinct and within 1..{top.k - 1}"
        for w in (self.base, top, *self.anchors):
            if not (math.isfinite(w.tpot_s) and w.tpot_s > 0):
                return f"the k={w.k} window's TPOT {w.tpot_s} must be finite and > 0"
            if w is not self.base and w.length_log_reps is None:
                return f"the k={w.k} window has no replicates of log L"
        sizes = {np.shape(a) for a in self._replicates()}
        if len(sizes) != 1 or len(next(iter(sizes))) != 1:
            return f"replicate arrays must be 1-D and of one length, not shapes {sorted(sizes)}"
        return None

    def _replicates(self) -> list[np.ndarray]:
        arrays = [self.base.tpot_log_reps]
        for w in (*self.anchors, self.top):
            arrays += [w.tpot_log_reps, w.length_log_reps] if w.length_log_reps is not None else [w.tpot_log_reps]
        return arrays

    @property
    def windows(self) -> tuple[KWindow, ...]:
        """The model's knots in k order: baseline, anchors, k_max."""
        return (self.base, *self.anchors, self.top)


@dataclass(frozen=True)
class Prediction:
    k: int
    rate: float
    length: float
    length_low: float
    length_high: float
    tpot_s: float
    tpot_low_s: float
    tpot_high_s: float
    speedup: float  # TPOT_base / TPOT(k), interval from the same replicates
    speedup_low: float
    speedup_high: float
    anchored: bool  # whether anchors entered this prediction
    note: str = ""
    # B replicates of log TPOT(k), paired with every other window and prediction of the rate:
    # what lets two predictions be compared replicate by replicate.
    tpot_log_reps: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False, compare=False)


def predicted_length(per_position: Sequence[float], k: int, correction: float = 1.0) -> float:
    """L(k) = 1 + correction * sum_{i<k} p_i: tokens per step, the bonus token included."""
    if not 0 <= k <= len(per_position):
        raise ValueError(f"k={k} outside 0..{len(per_position)} (the per-position profile's length)")
    return 1.0 + correction * float(sum(per_position[:k]))


def _weights(k: float, xs: Sequence[float]) -> np.ndarray:
    """Weights of sorted knots xs for a piecewise-linear value at k (value = weights @ ys), flat
    beyond either end. Weights, not values, so that one call serves every replicate."""
    weights = np.zeros(len(xs))
    if k <= xs[0] or k >= xs[-1]:
        weights[0 if k <= xs[0] else -1] = 1.0
        return weights
    i = int(np.searchsorted(xs, k, side="right")) - 1
    t = (k - xs[i]) / (xs[i + 1] - xs[i])
    weights[i], weights[i + 1] = 1.0 - t, t
    return weights


def step_cost(k: float, knots: Sequence[tuple[float, float]]) -> float:
    """The cost of one engine step at k, piecewise-linear through (k, step) knots."""
    ordered = sorted(knots)
    xs = [x for x, _ in ordered]
    if len(set(xs)) != len(xs) or not ordered:
        raise ValueError(f"step-cost knots need distinct k values: {xs}")
    if not xs[0] <= k <= xs[-1]:
        raise ValueError(f"k={k} outside the knots' range {xs[0]:g}..{xs[-1]:g}")
    return float(_weights(k, xs) @ np.array([y for _, y in ordered]))


def _partial_sums(inputs: RateInputs) -> np.ndarray:
    """sum_{i<k} p_i for k = 0..k_max, the profile scaled so that 1 + the total is the window's L:
    the counters' total and the per-position counts need not agree to the last digit."""
    cum = np.concatenate([[0.0], np.cumsum(inputs.per_position[: inputs.top.k])])
    return cum * ((inputs.top.length - 1) / cum[-1]) if cum[-1] > 0 else cum


def _model(inputs: RateInputs, k: int, tpot: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, ...]:
    """c(k), L(k) and TPOT(k) for each column of draws; rows of ``tpot`` and ``length`` follow
    ``inputs.windows``. Returns also the knots' weights (steps, then corrections)."""
    top_length = inputs.top.length
    # A replicate's L scales the whole profile; clipped at 0 so that no replicate drops below L = 1.
    scale = np.maximum((length[-1] - 1) / (top_length - 1), 0.0) if top_length > 1 else np.ones_like(length[-1])
    cum = _partial_sums(inputs)
    anchors = inputs.anchors
    anchor_sums = cum[np.array([a.k for a in anchors], dtype=int)][:, None] * scale[None, :]
    anchor_c = np.divide(length[1:-1] - 1, anchor_sums, out=np.ones_like(anchor_sums), where=anchor_sums > 0)
    c_weights = _weights(k, [a.k for a in anchors] + [inputs.top.k])
    c = c_weights @ np.vstack([anchor_c, np.ones((1, length.shape[1]))])
    step_weights = _weights(k, [w.k for w in inputs.windows])
    tokens = 1.0 + c * scale * cum[k]
    return c, tokens, (step_weights @ (tpot * length)) / tokens, step_weights, c_weights


def correction(k: int, inputs: RateInputs) -> float:
    """c(k) from the observed inputs: 1 without anchors."""
    if not 0 <= k <= inputs.top.k:
        raise ValueError(f"k={k} outside 0..{inputs.top.k}")
    tpot, length = _observed(inputs)
    return float(_model(inputs, k, tpot, length)[0][0])


def _observed(inputs: RateInputs) -> tuple[np.ndarray, np.ndarray]:
    windows = inputs.windows
    return np.array([[w.tpot_s] for w in windows]), np.array([[w.length if w.k else 1.0] for w in windows])


def _quantile_interval(values: np.ndarray, opts: StatsOptions) -> tuple[float, float]:
    finite = values[np.isfinite(values)]
    if not len(finite):
        return math.nan, math.nan
    low, high = np.quantile(finite, [opts.alpha / 2, 1 - opts.alpha / 2])
    return float(low), float(high)


def extrapolate(
    inputs: RateInputs,
    k: int,
    opts: StatsOptions,
    server_sd: float | None = None,
    server_df: int = 0,
    model_error: tuple[float, int] | None = None,
) -> Prediction:
    """TPOT, L and speedup at k (1..k_max) with intervals over the inputs' replicates; at k_max and
    at an anchor's k the point estimate is the measured value. ``server_sd``: the log-scale spread
    between fresh servers (from an A/A sweep, ``server_df`` degrees of freedom)."""
    if not 1 <= k <= inputs.top.k:
        raise ValueError(f"k={k} outside 1..{inputs.top.k}")
    if server_sd is not None and not (math.isfinite(server_sd) and server_sd >= 0 and server_df >= 1):
        raise ValueError(f"server_sd={server_sd} needs to be finite and >= 0, with server_df={server_df} >= 1")
    tpot, length = _observed(inputs)
    _, point_length, point_tpot, step_w, c_w = _model(inputs, k, tpot, length)
    windows = inputs.windows
    rep_tpot = np.exp(np.vstack([w.tpot_log_reps for w in windows]))
    rep_length = np.exp(np.vstack([w.length_log_reps if w.k else np.zeros_like(w.tpot_log_reps) for w in windows]))
    _, reps_length, reps_tpot, _, _ = _model(inputs, k, rep_tpot, rep_length)
    if server_sd:
        # One offset on the prediction, not one per input: it is what the confirmation's own fresh
        # server adds, and the speedup then carries the A/A ratio's spread, as paired_ratio does.
        rng = np.random.default_rng([opts.seed, 7])
        reps_tpot = reps_tpot * np.exp(server_sd * rng.standard_t(server_df, size=reps_tpot.shape))
    if model_error is not None and model_error[0] > 0:
        # The model's own bias (e.g. L under-predicted at small k), as measured on this sweep's
        # confirmed points: (RMS of log measured / predicted TPOT, how many), a t offset.
        # One draw for every k and rate (the seed names neither): a common error, so it cancels
        # where choose() compares two predictions replicate by replicate and widens only the
        # comparison with a measured k. Fair for choosing, as the bias is largely shared across
        # k; the part of it that differs between k is not modelled.
        sd, count = model_error
        rng = np.random.default_rng([opts.seed, 11])
        reps_tpot = reps_tpot * np.exp(sd * rng.standard_t(max(count, 1), size=reps_tpot.shape))
    base_tpot = inputs.base.tpot_s
    tpot_low, tpot_high = _quantile_interval(reps_tpot, opts)
    length_low, length_high = _quantile_interval(reps_length, opts)
    speedup_low, speedup_high = _quantile_interval(rep_tpot[0] / reps_tpot, opts)
    return Prediction(
        k=k,
        rate=inputs.rate,
        length=float(point_length[0]),
        length_low=length_low,
        length_high=length_high,
        tpot_s=float(point_tpot[0]),
        tpot_low_s=tpot_low,
        tpot_high_s=tpot_high,
        speedup=base_tpot / float(point_tpot[0]),
        speedup_low=speedup_low,
        speedup_high=speedup_high,
        anchored=bool(np.any(step_w[1:-1]) or np.any(c_w[:-1])),
        note="" if server_sd is not None else WITHIN_WINDOW_NOTE,
        tpot_log_reps=np.log(np.asarray(reps_tpot, dtype=float)),
    )


# ---- Which k to confirm ----------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    """One k at one rate, predicted or measured."""

    k: int
    tpot_s: float
    low_s: float
    high_s: float
    measured: bool
    # Replicates of log TPOT, paired across the rate's estimates (empty: compare the intervals).
    log_reps: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False, compare=False)


@dataclass(frozen=True)
class BestK:
    rate: float
    best: Estimate  # lowest tpot_s estimate
    candidates: tuple[Estimate, ...]  # the best and every estimate not told apart from it, best first
    best_predicted: Estimate | None = None  # the lowest-TPOT estimate that was not measured


def _not_told_apart(e: Estimate, best: Estimate, ceiling: float, alpha: float) -> bool:
    """Can ``e`` not be told from the best? Replicate by replicate where both have paired
    replicates (their predictions share inputs, so their intervals overlap far more than their
    difference is uncertain): the difference's interval reaches 0. Else, the intervals overlap."""
    if len(e.log_reps) and len(e.log_reps) == len(best.log_reps):
        difference = e.log_reps - best.log_reps
        difference = difference[np.isfinite(difference)]
        if len(difference):
            return float(np.quantile(difference, alpha / 2)) <= 0.0
    return (e.low_s if math.isfinite(e.low_s) else e.tpot_s) <= ceiling


def choose(rate: float, estimates: Sequence[Estimate], alpha: float = 0.05) -> BestK:
    """The best k at one rate and every k it cannot be told from. Ties go to the smaller
    k (a shorter draft costs less to make); a missing bound counts as the point estimate."""
    usable = [e for e in estimates if math.isfinite(e.tpot_s)]
    if not usable:
        raise ValueError(f"rate {rate:g}: no estimate with a finite TPOT")
    ks = [e.k for e in usable]
    if len(set(ks)) != len(ks):
        raise ValueError(f"rate {rate:g}: more than one estimate for k in {ks}; pass one per k")
    ordered = sorted(usable, key=lambda e: (e.tpot_s, e.k))
    best = ordered[0]
    ceiling = best.high_s if math.isfinite(best.high_s) else best.tpot_s
    overlap = [e for e in ordered[1:] if _not_told_apart(e, best, ceiling, alpha)]
    best_predicted = next((e for e in ordered if not e.measured), None)
    return BestK(rate, best, (best, *overlap), best_predicted)


def to_confirm(
    choices: Sequence[BestK], cap: int, check_model: bool = False
) -> tuple[dict[int, tuple[float, ...]], tuple[int, ...]]:
    """Unmeasured candidate k values to measure on fresh servers (one server start each), ranked by
    how often each is the best, then how often a candidate, then mean TPOT, then k; at most ``cap``.
    With ``check_model``, a rate whose candidates were all measured offers its best prediction
    instead, so that the model's error is measured even where the choice did not need it.
    Returns ({k: rates where it is an unmeasured candidate}, the candidate ks the cap left out)."""
    if cap < 0:
        raise ValueError(f"cap={cap} must be >= 0")
    rates: dict[int, list[float]] = defaultdict(list)
    tpots: dict[int, list[float]] = defaultdict(list)
    best = Counter(c.best.k for c in choices if not c.best.measured)
    for choice in choices:
        offered = list(choice.candidates)
        if check_model and choice.best_predicted and all(e.measured for e in offered):
            offered.append(choice.best_predicted)
        for e in offered:
            if not e.measured:
                rates[e.k].append(choice.rate)
                tpots[e.k].append(e.tpot_s)
    ranked = sorted(rates, key=lambda k: (-best[k], -len(rates[k]), float(np.mean(tpots[k])), k))
    return {k: tuple(sorted(rates[k])) for k in ranked[:cap]}, tuple(ranked[cap:])
