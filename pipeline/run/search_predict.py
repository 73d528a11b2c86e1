"""``search=predict``: measure the baseline and the largest k, predict every other k, confirm.

A k grid of K values costs K + 1 server starts per method. Here each curve (one method, draft,
workload, ...) costs two: the baseline and k_max at every rate. The model in
:mod:`pipeline.analysis.predict` turns k_max's per-position acceptance and the two step costs
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.analysis import predict, search_report
from pipeline.analysis.samples import Sample, StatsOptions
from pipeline.analysis.stats import acceptance_length_interval, window_interval
from pipeline.record.readers import SweepReader
from pipeline.record.tracking import Tracker, flatten_params
from pipeline.record.windows import window_sample
from pipeline.run.outcomes import GroupOutcome, PointOutcome
from pipeline.run.plan import Point, SweepPlan, point_key, setting_key
from pipeline.run.predict_plan import curves, first_phase, k_max


@dataclass(frozen=True)
class Measured:
    """A measured point's repeats as the model's inputs: its windows and metrics."""

    windows: tuple[Sample, ...]
    metrics: tuple[Mapping[str, float], ...]

    def mean(self, name: str) -> float | None:
        values = [m[name] for m in self.metrics if name in m and math.isfinite(m[name])]
        return float(np.mean(values)) if values else None


def model_window(measured: Measured, k: int, opts: StatsOptions, seed: int) -> predict.Window | None:
    """The model's view of a measured point: median TPOT and (speculative) L, each with replicates.

    Every window of one rate is resampled with the same ``seed``: they send the same prompts in
    the same order, so replicate j of each draws the same prompts, and the model's replicates
    stay paired by prompt, as the statistics core pairs a ratio's two windows."""
    tpot = window_interval("tpot", 50, measured.windows, opts, np.random.default_rng([opts.seed, 31, seed]))
    if not tpot.resolved or tpot.estimate is None:
        return None
    if k == 0:
        return predict.Window(0, tpot.estimate, tpot.log_replicates)
    counter = measured.mean("acceptance_length")
    length = acceptance_length_interval(measured.windows, counter, opts, np.random.default_rng([opts.seed, 31, seed]))
    if not length.resolved or length.estimate is None:
        return None
    # Dropped non-finite replicates can leave the two arrays a little apart; the model pairs them by index.
    size = min(len(tpot.log_replicates), len(length.log_replicates))
    return predict.Window(k, tpot.estimate, tpot.log_replicates[:size], length.estimate,
                          length.log_replicates[:size])  # fmt: skip


def _trim(*windows: predict.Window) -> list[predict.Window]:
    size = min(len(w.tpot_log_reps) for w in windows)
    return [dataclasses.replace(w, tpot_log_reps=w.tpot_log_reps[:size],
                                length_log_reps=None if w.length_log_reps is None else w.length_log_reps[:size])
            for w in windows]  # fmt: skip


@dataclass(frozen=True)
class CurveResult:
    """One curve's predictions, before and after its confirmations, and the choice per rate."""

    setting: str
    label: str  # e.g. "vllm ngram"
    first: dict[tuple[int, float], predict.Prediction]  # from the baseline and k_max alone
    final: dict[tuple[int, float], predict.Prediction]  # with the confirmations as anchors
    measured: dict[tuple[int, float], predict.Estimate]
    measured_length: dict[tuple[int, float], float]
    choices: dict[float, predict.Choice]
    confirm: dict[int, tuple[float, ...]]
    left_out: tuple[int, ...]
    notes: tuple[str, ...]


class Predictor:
    """Builds each curve's inputs from measured points and runs the model on them."""

    def __init__(self, plan: SweepPlan, opts: StatsOptions, samples: Callable[[Sequence[PointOutcome]],
                 list[Sample | None]]) -> None:  # fmt: skip
        self.plan, self.opts, self.samples = plan, opts, samples
        spread = opts.server_spread
        self.server_sd = spread.for_metric("speedup_median_tpot") if spread else None
        self.server_df = spread.comparisons if spread else 0

    def _measured(self, points: Sequence[Point], outcomes: Mapping[str, PointOutcome]) -> Measured | None:
        found = [outcomes.get(p.hash) for p in points]
        if not found or any(o is None or o.error is not None for o in found):
            return None
        windows = self.samples([o for o in found if o is not None])
        if any(w is None for w in windows):
            return None
        return Measured(tuple(w for w in windows if w is not None), tuple(o.metrics for o in found if o is not None))

    def curve(self, setting: str, points: Sequence[Point], outcomes: Mapping[str, PointOutcome],
              first: Mapping[tuple[int, float], predict.Prediction] | None, cap: int) -> CurveResult:  # fmt: skip
        """Predict every unmeasured (k, rate) of the curve from what ``outcomes`` measured."""
        top_k = k_max(points)
        by_key: dict[str, list[Point]] = {}
        for p in points:
            by_key.setdefault(point_key(p.job), []).append(p)
        base_points = {p.hash: p for p in self.plan.points if p.role == "baseline"}
        rates = sorted({p.job.load.request_rate for p in points})
        ks = sorted({p.job.spec.k for p in points})
        predictions: dict[tuple[int, float], predict.Prediction] = {}
        measured: dict[tuple[int, float], predict.Estimate] = {}
        lengths: dict[tuple[int, float], float] = {}
        notes: list[str] = []
        for i, rate in enumerate(rates):
            at_rate = {k: reps for reps in by_key.values() if (reps[0].job.load.request_rate == rate)
                       for k in [reps[0].job.spec.k]}  # fmt: skip
            windows: dict[int, predict.Window] = {}
            per_position: tuple[float, ...] = ()
            for k, reps in sorted(at_rate.items()):
                got = self._measured(reps, outcomes)
                if got is None:
                    continue
                window = model_window(got, k, self.opts, seed=i)
                if window is not None:
                    windows[k] = window
                    measured[(k, rate)] = _estimate(window, True, self.opts)
                    lengths[(k, rate)] = window.length
                if k == top_k and got is not None:
                    per_position = tuple(got.mean(f"spec_decode_acceptance_rate_pos_{j}") or 0.0 for j in range(k))
                    short = got.mean("acceptance_k_effective")
                    if short is not None and short < top_k - 0.05:
                        notes.append(f"at {rate:g} req/s the k={top_k} drafts averaged {short:.2f} tokens of {top_k} "
                                     "(ngram finds shorter matches): the step cost assumes full drafts")  # fmt: skip
            baseline = [base_points[p.baseline_hash] for p in at_rate.get(top_k, []) if p.baseline_hash in base_points]
            base = self._measured(baseline, outcomes)
            base_window = model_window(base, 0, self.opts, seed=i) if base else None
            if base_window is None or top_k not in windows:
                notes.append(f"at {rate:g} req/s: no prediction (the baseline or k={top_k} has no measurement "
                             "with enough requests)")  # fmt: skip
                continue
            anchors = [w for k, w in windows.items() if k != top_k]
            base_window, top, *anchors = _trim(base_window, windows[top_k], *anchors)
            try:
                inputs = predict.RateInputs(rate, base_window, top, per_position, tuple(anchors))
            except ValueError as exc:  # e.g. no per-position counters: that rate is said, not guessed
                notes.append(f"at {rate:g} req/s: no prediction ({exc})")
                continue
            for k in ks:
                if k not in windows:
                    predictions[(k, rate)] = predict.predict(inputs, k, self.opts, self.server_sd, self.server_df)
        choices = {}
        for rate in rates:
            estimates = [m for (k, r), m in measured.items() if r == rate]
            estimates += [_estimate(p, False, self.opts) for (k, r), p in predictions.items() if r == rate]
            if estimates:
                choices[rate] = predict.choose(rate, estimates)
        confirm, left_out = predict.to_confirm(list(choices.values()), cap)
        job = points[0].job
        return CurveResult(setting, f"{job.engine.name} {job.spec.method}", dict(first or predictions), predictions,
                           measured, lengths, choices, confirm, left_out, tuple(notes))  # fmt: skip


def _estimate(source: predict.Window | predict.Prediction, is_measured: bool, opts: StatsOptions) -> predict.Estimate:
    if isinstance(source, predict.Window):
        low, high = np.exp(np.quantile(source.tpot_log_reps, [opts.alpha / 2, 1 - opts.alpha / 2]))
        return predict.Estimate(source.k, source.tpot_s, float(low), float(high), is_measured)
    return predict.Estimate(source.k, source.tpot_s, source.tpot_low_s, source.tpot_high_s, is_measured)


def predicted_metrics(prediction: predict.Prediction) -> dict[str, float]:
    """A predicted point's MLflow metrics: the sweep table's names, each with its interval."""
    return {
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


def run(plan: SweepPlan, executor_run: Callable[[SweepPlan], list[GroupOutcome]],
        samples: Callable[[Sequence[PointOutcome]], list[Sample | None]], log_predicted: Callable[[Point, dict[str, float]], str],
        opts: StatsOptions, cap: int, done: Mapping[str, PointOutcome]) -> PredictRun:  # fmt: skip
    """Measure, predict, confirm; then predict what is left with the confirmations as anchors."""
    outcomes = executor_run(first_phase(plan))
    by_hash = dict(done) | {p.hash: p for o in outcomes for p in o.points}
    predictor = Predictor(plan, opts, samples)
    firsts = [predictor.curve(s, pts, by_hash, None, cap) for s, pts in curves(plan).items()]
    confirm = confirmation_plan(plan, firsts)
    for result in firsts:
        for k, rates in sorted(result.confirm.items()):
            print(f"predict: {result.label}: confirming k={k} at {', '.join(f'{r:g}' for r in rates)} req/s")

    if confirm.points:
        second = executor_run(confirm)
        outcomes += second
        by_hash |= {p.hash: p for o in second for p in o.points}
    results = [predictor.curve(r.setting, curves(plan)[r.setting], by_hash, r.first, cap) for r in firsts]
    results = [dataclasses.replace(r, confirm=f.confirm, left_out=f.left_out, notes=r.notes + _left_out(f, cap))
               for r, f in zip(results, firsts, strict=True)]  # fmt: skip
    for result in results:
        for note in result.notes:
            print(f"predict: {result.label}: {note}")
    predicted = {}
    points = {(setting_key(p.job), p.job.spec.k, p.job.load.request_rate, p.job.repeat): p for p in plan.points}
    for result in results:
        for (k, rate), prediction in result.final.items():
            point = points[(result.setting, k, rate, 0)]
            metrics = predicted_metrics(prediction)
            predicted[point.hash] = PointOutcome(point.hash, log_predicted(point, metrics), metrics, predicted=True)
    return PredictRun(outcomes, predicted, results, search_report.predictions_table(results))


def _left_out(result: CurveResult, cap: int) -> tuple[str, ...]:
    if not result.left_out:
        return ()
    ks = ", ".join(f"k={k}" for k in result.left_out)
    return (f"{ks}: candidate(s) whose interval overlapped the best's, not measured (predict.max_confirm={cap})",)


def download_samples(reader: SweepReader) -> Callable[[Sequence[PointOutcome]], list[Sample | None]]:
    """Each outcome's window, from its run's requests.csv in MLflow."""
    folder = Path(tempfile.mkdtemp(prefix="specsweep-predict-"))
    return lambda found: [window_sample(reader, o.run_id or "", o.metrics.get("duration", math.nan), folder)
                          for o in found]  # fmt: skip


def log_predicted(tracker: Tracker, parent: str, point: Point, metrics: dict[str, float]) -> str:
    """A predicted point as a child run of its own: no requests, never status 'finished'."""
    job = point.job
    tags = {"role": point.role, "predicted": "true", "status": "predicted", "search": "predict",
            "engine": job.engine.name, "spec.method": job.spec.method, "point_hash": point.hash,
            **({"baseline_hash": point.baseline_hash} if point.baseline_hash else {})}  # fmt: skip
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
