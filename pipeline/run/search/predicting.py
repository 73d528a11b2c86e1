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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pipeline.analysis import kcurve, search_report
from pipeline.analysis.kcurve_windows import (
    CurveResult,
    MeasuredK,
    estimate_of,
    model_error,
    model_windows,
    predicted_metrics,
    trim_windows,
)
from pipeline.analysis.samples import Sample, StatsOptions
from pipeline.config import PredictConfig
from pipeline.identity import point_key, setting_key
from pipeline.run.outcomes import GroupOutcome, PointOutcome
from pipeline.run.plan import Point, SweepPlan
from pipeline.run.search.predict_phases import curves, first_phase, k_max
from pipeline.run.search.strategy import Context, SearchEnd, WindowReads


class Predictor:
    """Builds each curve's inputs from measured points and runs the model on them. ``window``
    reads a resumed point's window (a point measured in this sweep carries its own);
    ``check_model`` is predict.check_model (see :func:`kcurve.to_confirm`); ``error`` is the
    sweep's model-error term (:func:`~pipeline.analysis.kcurve_windows.model_error`) that widens
    every prediction, None before there is one."""

    def __init__(
        self,
        plan: SweepPlan,
        opts: StatsOptions,
        window: Callable[[str, float], Sample | None],
        check_model: bool = False,
        error: tuple[float, int] | None = None,
    ) -> None:
        self.plan, self.opts, self.window = plan, opts, window
        self.check_model = check_model
        self.error = error
        spread = opts.server_spread
        self.server_sd = spread.for_metric("speedup_median_tpot") if spread else None
        self.server_df = spread.comparisons if spread else 0

    def _measured(self, points: Sequence[Point], outcomes: Mapping[str, PointOutcome]) -> MeasuredK | None:
        found = [outcomes.get(p.hash) for p in points]
        if not found or any(o is None or o.error is not None for o in found):
            return None
        done = [o for o in found if o is not None]
        windows = [
            o.sample if o.sample is not None else self.window(o.run_id or "", o.metrics.get("duration", math.nan))
            for o in done
        ]
        if any(w is None for w in windows):
            return None
        return MeasuredK(tuple(w for w in windows if w is not None), tuple(o.metrics for o in done))

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
            estimates += [estimate_of(p, False, self.opts) for (k, r), p in parts.predictions.items() if r == rate]
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
            parts.measured[(k, rate)] = estimate_of(window, True, self.opts)
            parts.lengths[(k, rate)] = window.length
        if base_window is None or top_k not in windows:
            parts.notes.append(
                f"at {rate:g} req/s: no prediction (the baseline or k={top_k} has no measurement with enough requests)"
            )
            return
        anchors = [w for k, w in windows.items() if k != top_k]
        base_window, top, *anchors = trim_windows(base_window, windows[top_k], *anchors)
        try:
            inputs = kcurve.RateInputs(rate, base_window, top, per_position, tuple(anchors))
        except ValueError as exc:  # e.g. no per-position counters: that rate is said, not guessed
            parts.notes.append(f"at {rate:g} req/s: no prediction ({exc})")
            return
        for k in parts.ks:
            if k not in windows:
                parts.predictions[(k, rate)] = kcurve.extrapolate(
                    inputs, k, self.opts, self.server_sd, self.server_df, self.error
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


class PredictSearch:
    """search=predict as a strategy (:class:`pipeline.run.search.strategy.Search`): the baseline and
    the largest k first; then the confirmations the first predictions call for; then nothing.
    :meth:`finish` predicts what is left, with the confirmations as anchors, and records each
    predicted point as a run of its own."""

    def __init__(self, plan: SweepPlan, context: Context) -> None:
        if context.windows is None:
            raise ValueError("search=predict computes on windows: its kind says so (SearchKind.reads_windows)")
        self.plan = plan
        self.reads: WindowReads = context.windows
        self.settings: PredictConfig = context.settings.predict
        self.opts: StatsOptions = context.windows.opts  # with the store's A/A spread once it is read
        self.spread_lookup = context.windows.server_spread
        self.by_hash: dict[str, PointOutcome] = dict(context.done)
        self.outcomes: list[GroupOutcome] = []
        self.phase = 0
        self.firsts: list[CurveResult] = []
        self.curves: list[CurveResult] = []  # each curve's final predictions, once finish() has run

    def next_plan(self, outcomes: Sequence[GroupOutcome]) -> SweepPlan | None:
        self.outcomes += outcomes
        self.by_hash |= {p.hash: p for o in outcomes for p in o.points}
        self.phase += 1
        if self.phase == 1:
            return first_phase(self.plan)
        if self.phase > 2:
            return None
        self._with_measured_spread()
        predictor = self._predictor(None)
        cap = self.settings.max_confirm
        self.firsts = [predictor.curve(s, pts, self.by_hash, None, cap) for s, pts in curves(self.plan).items()]
        for result in self.firsts:
            for k, rates in sorted(result.confirm.items()):
                print(f"predict: {result.label}: confirming k={k} at {', '.join(f'{r:g}' for r in rates)} req/s")
        confirm = confirmation_plan(self.plan, self.firsts)
        return confirm if confirm.points else None

    def _predictor(self, error: tuple[float, int] | None) -> Predictor:
        return Predictor(self.plan, self.opts, self.reads.window, self.settings.check_model, error)

    def _with_measured_spread(self) -> None:
        """The A/A spread of the store for what the first phase measured (its fingerprint:
        hardware, model, window size), once; the options' own where there is no lookup."""
        if self.spread_lookup is None:
            return
        spread = self.spread_lookup()
        self.spread_lookup = None
        if spread is not None:
            self.opts = dataclasses.replace(self.opts, server_spread=spread)

    def finish(self) -> SearchEnd:
        self.curves = self._final_curves()
        predicted = self._predicted(self.curves)
        # Repeats beyond the first of a predicted point: neither measured nor predicted.
        ran = set(self.by_hash) | set(predicted)
        plan = self.plan.without(p.hash for p in self.plan.points if p.hash not in ran)
        table = search_report.predictions_table(self.curves)
        return SearchEnd(plan, self.outcomes, predicted, {search_report.PREDICTIONS_CSV: table})

    def _final_curves(self) -> list[CurveResult]:
        """Every curve predicted again with its confirmations as anchors, and the model's error
        measured on them added to every final interval."""
        self._with_measured_spread()
        curve, cap = curves(self.plan), self.settings.max_confirm

        def predicted(error: tuple[float, int] | None) -> list[CurveResult]:
            predictor = self._predictor(error)
            return [predictor.curve(r.setting, curve[r.setting], self.by_hash, r.first, cap) for r in self.firsts]

        results = predicted(None)
        error = model_error(results)
        if error is not None:
            note = (
                f"model error {error[0]:.1%} (RMS of log measured / first-predicted TPOT over {error[1]} confirmed "
                "point(s)), added to the final intervals"
            )
            results = [dataclasses.replace(r, notes=(*r.notes, note), model_error=error) for r in predicted(error)]
        results = [
            dataclasses.replace(r, confirm=f.confirm, left_out=f.left_out, notes=r.notes + _left_out(f, cap))
            for r, f in zip(results, self.firsts, strict=True)
        ]
        for result in results:
            for note in result.notes:
                print(f"predict: {result.label}: {note}")
        return results

    def _predicted(self, results: Sequence[CurveResult]) -> dict[str, PointOutcome]:
        predicted = {}
        points = {
            (setting_key(p.job), p.job.spec.k, p.job.load.request_rate, p.job.repeat): p for p in self.plan.points
        }
        for result in results:
            for (k, rate), prediction in result.final.items():
                point = points[(result.setting, k, rate, 0)]
                metrics = predicted_metrics(prediction, result.model_error)
                run_id = self.reads.record_predicted(point, metrics)
                predicted[point.hash] = PointOutcome(point.hash, run_id, metrics, predicted=True)
        return predicted


def _left_out(result: CurveResult, cap: int) -> tuple[str, ...]:
    if not result.left_out:
        return ()
    ks = ", ".join(f"k={k}" for k in result.left_out)
    return (f"{ks}: candidate(s) whose interval overlapped the best's, not measured (predict.max_confirm={cap})",)


def confirmation_plan(plan: SweepPlan, results: Sequence[CurveResult]) -> SweepPlan:
    """The points each curve's confirmations measure: k at the rates where it is a candidate."""
    wanted = set()
    for result in results:
        for point in curves(plan)[result.setting]:
            if point.job.load.request_rate in result.confirm.get(point.job.spec.k, ()):
                wanted.add(point.hash)
    return plan.without(p.hash for p in plan.points if p.hash not in wanted)
