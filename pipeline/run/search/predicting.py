"""``search=predict``: measure the baseline and the largest k, predict every other k, confirm.

A k grid of K values costs K + 1 server starts per method. Here each curve (one method, draft,
workload, ...) costs two: the baseline and k_max at every rate. The model in
:mod:`pipeline.analysis.kcurve` turns k_max's per-position acceptance and the two step costs
into every other k's TPOT with an interval; the predicted best k at each rate, and any k whose
interval overlaps the best's (up to ``predict.max_confirm`` servers), are then measured on fresh
servers. Those measurements become the model's anchors for the k still unmeasured, and are
set against what was predicted before they existed.

Predicted points are child runs of their own (tag ``predicted=true``, status ``predicted``,
no requests): resume, verdicts and the gate never take them for measurements.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.analysis import kcurve, search_report
from pipeline.analysis.samples import Sample, ServerSpread, StatsOptions
from pipeline.identity import Identity, point_key, setting_key
from pipeline.record.readers import SweepReader
from pipeline.record.tracking import Tracker, flatten_params
from pipeline.record.windows import window_sample
from pipeline.run.outcomes import GroupOutcome, PointOutcome
from pipeline.run.plan import Point, SweepPlan
from pipeline.run.search.predict_phases import curves, first_phase, k_max
from pipeline.run.search.strategy import Context, SearchEnd


@dataclass(frozen=True)
class MeasuredK:
    """A measured point's repeats as the model's inputs: its windows and metrics."""

    windows: tuple[Sample, ...]
    metrics: tuple[Mapping[str, float], ...]

    def mean(self, name: str) -> float | None:
        values = [m[name] for m in self.metrics if name in m and math.isfinite(m[name])]
        return float(np.mean(values)) if values else None


def model_windows(measured: Mapping[int, MeasuredK], opts: StatsOptions, seed: int) -> dict[int, kcurve.KWindow]:
    """The model's view of every measured point at one rate (k -> its repeats; k = 0 is the
    baseline): median TPOT and (speculative) L, each with replicates paired by prompt.

    Paired, because every window of one rate sends the same prompts on the same schedule: per
    repeat, the prompts that every window answered with a defined TPOT are resampled with one
    index matrix, and replicate j of every window reads the same draw. Pairing by row position
    instead would shift every later row past one failed request. Across repeats, the run-level
    part (the spread between server starts, what the runs hold beyond their windows' own noise)
    is drawn independently per window: each ran on servers of its own."""
    ks = sorted(measured)
    runs = {len(m.windows) for m in measured.values()}
    if len(runs) != 1:
        return {}
    rng = np.random.default_rng([opts.seed, 31, seed])
    tpot_est: dict[int, list[float]] = {k: [] for k in ks}
    tpot_reps: dict[int, list[np.ndarray]] = {k: [] for k in ks}
    length_est: dict[int, list[float]] = {k: [] for k in ks if k}
    length_reps: dict[int, list[np.ndarray]] = {k: [] for k in ks if k}
    for r in range(runs.pop()):
        windows = {k: measured[k].windows[r] for k in ks}
        rows = _common_rows(windows)
        size = len(next(iter(rows.values())))
        if size < opts.min_requests:
            return {}
        draws = rng.integers(0, size, size=(opts.resamples, size))
        for k, w in windows.items():
            tpot = w.values["tpot"][rows[k]]
            tpot_est[k].append(math.log(float(np.median(tpot))))
            tpot_reps[k].append(np.log(np.median(tpot[draws], axis=-1)))
            if k:
                multi = w.chunks[rows[k]] >= 2  # a one-chunk request shows no step
                tokens = np.where(multi, w.output_tokens[rows[k]] - 1.0, 0.0)
                steps = np.where(multi, w.chunks[rows[k]] - 1.0, 0.0)
                if steps.sum() <= 0:
                    return {}
                length_est[k].append(math.log(tokens.sum() / steps.sum()))
                with np.errstate(divide="ignore", invalid="ignore"):
                    length_reps[k].append(np.log(tokens[draws].sum(axis=-1) / steps[draws].sum(axis=-1)))
    out = {}
    for k in ks:
        server_rng = np.random.default_rng([opts.seed, 31, seed, k])
        tpot_c, tpot_r = _over_servers(tpot_est[k], tpot_reps[k], server_rng)
        if k == 0:
            out[k] = kcurve.KWindow(0, math.exp(tpot_c), tpot_r)
            continue
        length_c, length_r = _over_servers(length_est[k], length_reps[k], server_rng)
        counter = measured[k].mean("acceptance_length")
        if counter is not None and counter > 0:  # the engine's counters are exact for the window: centre on them
            length_r, length_c = length_r - length_c + math.log(counter), math.log(counter)
        out[k] = kcurve.KWindow(k, math.exp(tpot_c), tpot_r, math.exp(length_c), length_r)
    return out


def _common_rows(windows: Mapping[int, Sample]) -> dict[int, np.ndarray]:
    """Each window's row of every prompt that all of them answered with a defined TPOT, in one prompt order."""
    defined = [set(w.index[np.isfinite(w.values["tpot"])].tolist()) for w in windows.values()]
    common = sorted(set.intersection(*defined)) if defined else []
    return {
        k: np.array([{int(i): j for j, i in enumerate(w.index)}[p] for p in common], dtype=int)
        for k, w in windows.items()
    }


def _over_servers(
    estimates: list[float], replicates: list[np.ndarray], rng: np.random.Generator
) -> tuple[float, np.ndarray]:
    """One window's estimate over its repeats (their mean log) and replicates: the within-window
    part stays paired (the mean of the runs' paired replicates); the part between server
    starts, sd^2 = max(runs' variance - within variance, 0), enters as a t(R - 1) offset of
    this window's own."""
    within = np.mean(np.stack(replicates), axis=0)
    runs = len(estimates)
    if runs == 1:
        return estimates[0], within
    within_var = float(np.mean([np.nanvar(r) for r in replicates]))
    server_var = max(float(np.var(estimates, ddof=1)) - within_var, 0.0)
    offset = math.sqrt(server_var / runs) * rng.standard_t(runs - 1, size=len(within))
    return float(np.mean(estimates)), within + offset


def _trim(*windows: kcurve.KWindow) -> list[kcurve.KWindow]:
    size = min(len(w.tpot_log_reps) for w in windows)
    return [
        dataclasses.replace(
            w,
            tpot_log_reps=w.tpot_log_reps[:size],
            length_log_reps=None if w.length_log_reps is None else w.length_log_reps[:size],
        )
        for w in windows
    ]


@dataclass(frozen=True)
class CurveResult:
    """One curve's predictions, before and after its confirmations, and the choice per rate."""

    setting: str
    label: str  # e.g. "vllm ngram"
    first: dict[tuple[int, float], kcurve.Prediction]  # from the baseline and k_max alone
    final: dict[tuple[int, float], kcurve.Prediction]  # with the confirmations as anchors
    measured: dict[tuple[int, float], kcurve.Estimate]
    measured_length: dict[tuple[int, float], float]
    choices: dict[float, kcurve.BestK]
    confirm: dict[int, tuple[float, ...]]
    left_out: tuple[int, ...]
    notes: tuple[str, ...]
    # The sweep's model-error term added to ``final``: (log-scale sd, confirmed points it rests on).
    model_error: tuple[float, int] | None = None


class Predictor:
    """Builds each curve's inputs from measured points and runs the model on them."""

    def __init__(
        self,
        plan: SweepPlan,
        opts: StatsOptions,
        samples: Callable[[Sequence[PointOutcome]], list[Sample | None]],
        check_model: bool = False,
    ) -> None:
        self.plan, self.opts, self.samples = plan, opts, samples
        self.check_model = check_model  # predict.check_model: see kcurve.to_confirm
        spread = opts.server_spread
        self.server_sd = spread.for_metric("speedup_median_tpot") if spread else None
        self.server_df = spread.comparisons if spread else 0
        self.model_error: tuple[float, int] | None = None  # see model_error()

    def _measured(self, points: Sequence[Point], outcomes: Mapping[str, PointOutcome]) -> MeasuredK | None:
        found = [outcomes.get(p.hash) for p in points]
        if not found or any(o is None or o.error is not None for o in found):
            return None
        windows = self.samples([o for o in found if o is not None])
        if any(w is None for w in windows):
            return None
        return MeasuredK(tuple(w for w in windows if w is not None), tuple(o.metrics for o in found if o is not None))

    def curve(
        self,
        setting: str,
        points: Sequence[Point],
        outcomes: Mapping[str, PointOutcome],
        first: Mapping[tuple[int, float], kcurve.Prediction] | None,
        cap: int,
    ) -> CurveResult:
        """Predict every unmeasured (k, rate) of the curve from what ``outcomes`` measured."""
        by_key: dict[str, list[Point]] = {}
        for p in points:
            by_key.setdefault(point_key(p.job), []).append(p)
        parts = _CurveParts(k_max(points), sorted({p.job.spec.k for p in points}))
        rates = sorted({p.job.load.request_rate for p in points})
        for i, rate in enumerate(rates):
            at_rate = {reps[0].job.spec.k: reps for reps in by_key.values() if reps[0].job.load.request_rate == rate}
            self._predict_rate(i, rate, at_rate, outcomes, parts)
        choices = {}
        for rate in rates:
            estimates = [m for (k, r), m in parts.measured.items() if r == rate]
            estimates += [_estimate(p, False, self.opts) for (k, r), p in parts.predictions.items() if r == rate]
            if estimates:
                choices[rate] = kcurve.choose(rate, estimates, self.opts.alpha)
        confirm, left_out = kcurve.to_confirm(list(choices.values()), cap, self.check_model)
        job = points[0].job
        return CurveResult(
            setting,
            f"{job.engine.name} {job.spec.method}",
            dict(first or parts.predictions),
            parts.predictions,
            parts.measured,
            parts.lengths,
            choices,
            confirm,
            left_out,
            tuple(parts.notes),
        )

    def _found_at(
        self,
        rate: float,
        at_rate: Mapping[int, Sequence[Point]],
        outcomes: Mapping[str, PointOutcome],
        parts: _CurveParts,
    ) -> tuple[dict[int, MeasuredK], tuple[float, ...]]:
        """The measured k at one rate, and k_max's per-position acceptance."""
        top_k, per_position = parts.top_k, ()
        found: dict[int, MeasuredK] = {}
        for k, reps in sorted(at_rate.items()):
            got = self._measured(reps, outcomes)
            if got is None:
                continue
            found[k] = got
            if k == top_k:
                per_position = tuple(got.mean(f"spec_decode_acceptance_rate_pos_{j}") or 0.0 for j in range(k))
                short = got.mean("acceptance_k_effective")
                if short is not None and short < top_k - 0.05:
                    parts.notes.append(
                        f"at {rate:g} req/s the k={top_k} drafts averaged {short:.2f} tokens of {top_k} "
                        "(ngram finds shorter matches): the step cost assumes full drafts"
                    )
        return found, per_position

    def _predict_rate(
        self,
        i: int,
        rate: float,
        at_rate: Mapping[int, Sequence[Point]],
        outcomes: Mapping[str, PointOutcome],
        parts: _CurveParts,
    ) -> None:
        """One rate of the curve: its measured k as estimates, every other k predicted."""
        top_k = parts.top_k
        found, per_position = self._found_at(rate, at_rate, outcomes, parts)
        base_points = {p.hash: p for p in self.plan.points if p.role == "baseline"}
        baseline = [base_points[p.baseline_hash] for p in at_rate.get(top_k, []) if p.baseline_hash in base_points]
        base = self._measured(baseline, outcomes)
        group = ({0: base} if base else {}) | found
        windows = model_windows(group, self.opts, seed=i) if group else {}
        base_window = windows.pop(0, None)
        for k, window in windows.items():
            parts.measured[(k, rate)] = _estimate(window, True, self.opts)
            parts.lengths[(k, rate)] = window.length
        if base_window is None or top_k not in windows:
            parts.notes.append(
                f"at {rate:g} req/s: no prediction (the baseline or k={top_k} has no measurement with enough requests)"
            )
            return
        anchors = [w for k, w in windows.items() if k != top_k]
        base_window, top, *anchors = _trim(base_window, windows[top_k], *anchors)
        try:
            inputs = kcurve.RateInputs(rate, base_window, top, per_position, tuple(anchors))
        except ValueError as exc:  # e.g. no per-position counters: that rate is said, not guessed
            parts.notes.append(f"at {rate:g} req/s: no prediction ({exc})")
            return
        for k in parts.ks:
            if k not in windows:
                parts.predictions[(k, rate)] = kcurve.extrapolate(
                    inputs, k, self.opts, self.server_sd, self.server_df, self.model_error
                )


@dataclass
class _CurveParts:
    """A curve's results as its rates are worked through."""

    top_k: int
    ks: list[int]
    predictions: dict[tuple[int, float], kcurve.Prediction] = field(default_factory=dict)
    measured: dict[tuple[int, float], kcurve.Estimate] = field(default_factory=dict)
    lengths: dict[tuple[int, float], float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _estimate(source: kcurve.KWindow | kcurve.Prediction, is_measured: bool, opts: StatsOptions) -> kcurve.Estimate:
    if isinstance(source, kcurve.KWindow):
        finite = source.tpot_log_reps[np.isfinite(source.tpot_log_reps)]
        low, high = np.exp(np.quantile(finite, [opts.alpha / 2, 1 - opts.alpha / 2]))
        return kcurve.Estimate(source.k, source.tpot_s, float(low), float(high), is_measured, source.tpot_log_reps)
    return kcurve.Estimate(
        source.k, source.tpot_s, source.tpot_low_s, source.tpot_high_s, is_measured, source.tpot_log_reps
    )


def predicted_metrics(prediction: kcurve.Prediction, model_error: tuple[float, int] | None = None) -> dict[str, float]:
    """A predicted point's MLflow metrics: the sweep table's names, each with its interval, and
    ``model_error_sd``, the log-scale model-error term its interval carries (where there is one)."""
    error = {} if model_error is None else {"model_error_sd": model_error[0]}
    return error | {
        "predicted": 1.0,
        "median_tpot_ms": 1000 * prediction.tpot_s,
        "median_tpot_ms_low": 1000 * prediction.tpot_low_s,
        "median_tpot_ms_high": 1000 * prediction.tpot_high_s,
        "acceptance_length": prediction.length,
        "acceptance_length_low": prediction.length_low,
        "acceptance_length_high": prediction.length_high,
        "speedup_median_tpot": prediction.speedup,
        "speedup_median_tpot_low": prediction.speedup_low,
        "speedup_median_tpot_high": prediction.speedup_high,
    }


@dataclass(frozen=True)
class PredictRun:
    outcomes: list[GroupOutcome]
    predicted: dict[str, PointOutcome]  # point hash -> the predicted point's run
    results: list[CurveResult]
    table: pd.DataFrame


class PredictSearch:
    """search=predict as a strategy (:class:`pipeline.run.search.strategy.Search`): the baseline and
    the largest k first; then the confirmations the first predictions call for; then nothing.
    :meth:`finish` predicts what is left, with the confirmations as anchors."""

    resumes = True

    def __init__(
        self, plan: SweepPlan, context: Context, cap: int | None = None, check_model: bool | None = None
    ) -> None:
        """``cap`` and ``check_model`` default to the sweep's predict.max_confirm and predict.check_model."""
        assert context.samples and context.log_predicted and isinstance(context.opts, StatsOptions)
        self.plan = plan
        self.samples = context.samples
        self.log_predicted = context.log_predicted
        self.opts: StatsOptions = context.opts
        settings = context.settings.predict if context.settings else None
        self.cap = cap if cap is not None else (settings.max_confirm if settings else 1)
        self.check_model = check_model if check_model is not None else bool(settings and settings.check_model)
        self.by_hash: dict[str, PointOutcome] = dict(context.done)
        self.outcomes: list[GroupOutcome] = []
        self.phase = 0
        self.firsts: list[CurveResult] = []
        self.spread_lookup = context.server_spread

    def next_plan(self, outcomes: Sequence[GroupOutcome]) -> SweepPlan | None:
        self.outcomes += outcomes
        self.by_hash |= {p.hash: p for o in outcomes for p in o.points}
        self.phase += 1
        if self.phase == 1:
            return first_phase(self.plan)
        if self.phase > 2:
            return None
        self._with_measured_spread()
        predictor = Predictor(self.plan, self.opts, self.samples, self.check_model)
        self.firsts = [predictor.curve(s, pts, self.by_hash, None, self.cap) for s, pts in curves(self.plan).items()]
        for result in self.firsts:
            for k, rates in sorted(result.confirm.items()):
                print(f"predict: {result.label}: confirming k={k} at {', '.join(f'{r:g}' for r in rates)} req/s")
        confirm = confirmation_plan(self.plan, self.firsts)
        return confirm if confirm.points else None

    def _with_measured_spread(self) -> None:
        """The A/A spread of the store for what the first phase measured (its fingerprint:
        hardware, model, window size), once; the options' own where there is no lookup."""
        if self.spread_lookup is None:
            return
        spread = self.spread_lookup()
        self.spread_lookup = None
        if spread is not None:
            assert isinstance(spread, ServerSpread)
            self.opts = dataclasses.replace(self.opts, server_spread=spread)

    def finish(self) -> SearchEnd:
        ran = self.result()
        by_hash = {p.hash for o in self.outcomes for p in o.points} | set(self.by_hash) | set(ran.predicted)
        # Repeats beyond the first of a predicted point: neither measured nor predicted.
        plan = self.plan.without(p.hash for p in self.plan.points if p.hash not in by_hash)
        return SearchEnd(plan, ran.outcomes, ran.predicted, ran.table)

    def result(self) -> PredictRun:
        self._with_measured_spread()
        curve = curves(self.plan)
        predictor = Predictor(self.plan, self.opts, self.samples, self.check_model)
        results = [predictor.curve(r.setting, curve[r.setting], self.by_hash, r.first, self.cap) for r in self.firsts]
        predictor.model_error = model_error(results)
        if predictor.model_error is not None:
            sd, count = predictor.model_error
            results = [
                predictor.curve(r.setting, curve[r.setting], self.by_hash, r.first, self.cap) for r in self.firsts
            ]
            note = (
                f"model error {sd:.1%} (RMS of log measured / first-predicted TPOT over {count} confirmed point(s)), "
                "added to the final intervals"
            )
            results = [
                dataclasses.replace(r, notes=(*r.notes, note), model_error=predictor.model_error) for r in results
            ]
        results = [
            dataclasses.replace(r, confirm=f.confirm, left_out=f.left_out, notes=r.notes + _left_out(f, self.cap))
            for r, f in zip(results, self.firsts, strict=True)
        ]
        for result in results:
            for note in result.notes:
                print(f"predict: {result.label}: {note}")
        return PredictRun(self.outcomes, self._predicted(results), results, search_report.predictions_table(results))

    def _predicted(self, results: Sequence[CurveResult]) -> dict[str, PointOutcome]:
        predicted = {}
        points = {
            (setting_key(p.job), p.job.spec.k, p.job.load.request_rate, p.job.repeat): p for p in self.plan.points
        }
        for result in results:
            for (k, rate), prediction in result.final.items():
                point = points[(result.setting, k, rate, 0)]
                metrics = predicted_metrics(prediction, result.model_error)
                predicted[point.hash] = PointOutcome(
                    point.hash, self.log_predicted(point, metrics), metrics, predicted=True
                )
        return predicted


def run_predict(
    plan: SweepPlan,
    executor_run: Callable[[SweepPlan], list[GroupOutcome]],
    samples: Callable[[Sequence[PointOutcome]], list[Sample | None]],
    log_predicted: Callable[[Point, dict[str, float]], str],
    opts: StatsOptions,
    cap: int,
    done: Mapping[str, PointOutcome],
    check_model: bool = False,
) -> PredictRun:
    """Measure, predict, confirm; then predict what is left with the confirmations as anchors:
    :class:`PredictSearch` driven to its end by ``executor_run``, as the driver drives it."""
    search = PredictSearch(plan, Context(done, samples, log_predicted, opts), cap, check_model)
    outcomes: list[GroupOutcome] = []
    while (part := search.next_plan(outcomes)) is not None:
        outcomes = executor_run(part)
    return search.result()


def model_error(results: Sequence[CurveResult]) -> tuple[float, int] | None:
    """The model's own error, from the points it predicted first and then measured: the RMS of
    log(measured / predicted) median TPOT, and how many points it rests on (None: none).
    It errs wide: each measured point carries its window's own noise too."""
    errors = [
        math.log(seen.tpot_s / r.first[key].tpot_s)
        for r in results
        for key, seen in r.measured.items()
        if key in r.first and seen.tpot_s > 0 and r.first[key].tpot_s > 0
    ]
    return (math.sqrt(float(np.mean(np.square(errors)))), len(errors)) if errors else None


def _left_out(result: CurveResult, cap: int) -> tuple[str, ...]:
    if not result.left_out:
        return ()
    ks = ", ".join(f"k={k}" for k in result.left_out)
    return (f"{ks}: candidate(s) whose interval overlapped the best's, not measured (predict.max_confirm={cap})",)


def download_samples(reader: SweepReader) -> Callable[[Sequence[PointOutcome]], list[Sample | None]]:
    """Each outcome's window: carried by the outcome where this sweep measured it, else (a
    point resumed from an earlier run) from its run's requests.csv in MLflow."""
    folder = Path(tempfile.mkdtemp(prefix="specsweep-predict-"))
    return lambda found: [
        o.sample
        if o.sample is not None
        else window_sample(reader, o.run_id or "", o.metrics.get("duration", math.nan), folder)
        for o in found
    ]


def log_predicted(
    tracker: Tracker, parent: str, identities: Mapping[str, Identity], point: Point, metrics: dict[str, float]
) -> str:
    """A predicted point as a child run of its own: no requests, never status 'finished'. It
    carries the identity its point resolved to, as a measured run does, so a reader keys it alike
    (and its status keeps resume and the gate from taking it for a measurement)."""
    job = point.job
    tags = {
        "role": point.role,
        "predicted": "true",
        "status": "predicted",
        "search": "predict",
        "engine": job.engine.name,
        "spec.method": job.spec.method,
        "point_hash": point.hash,
        **(identities[point.hash].tags() if point.hash in identities else {}),
        **({"baseline_hash": point.baseline_hash} if point.baseline_hash else {}),
    }
    run_id = tracker.start_run(f"{point.label} (predicted)", tags, parent)
    tracker.log_params(run_id, flatten_params(job))
    tracker.log_metrics(run_id, metrics)
    tracker.end_run(run_id)
    return run_id


def confirmation_plan(plan: SweepPlan, results: Sequence[CurveResult]) -> SweepPlan:
    """The points each curve's confirmations measure: k at the rates where it is a candidate."""
    wanted = set()
    for result in results:
        for point in curves(plan)[result.setting]:
            if point.job.load.request_rate in result.confirm.get(point.job.spec.k, ()):
                wanted.add(point.hash)
    return plan.without(p.hash for p in plan.points if p.hash not in wanted)
