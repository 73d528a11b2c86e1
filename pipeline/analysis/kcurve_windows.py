"""search=predict's statistics on measured windows, for the k-curve model (:mod:`pipeline.analysis.kcurve`).

Pure: each measured point's windows and metrics in; the model's inputs (median TPOT and
acceptance length with bootstrap replicates paired by prompt, plus the spread between server
starts), each point's estimate, a curve's results, the model's own error and a predicted
point's metrics out. Which points a curve holds and which ones are measured is the strategy's
(:mod:`pipeline.run.search.predicting`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.analysis import kcurve
from pipeline.analysis.samples import Sample, StatsOptions


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


def trim_windows(*windows: kcurve.KWindow) -> list[kcurve.KWindow]:
    """The windows with as many replicates each as the shortest has: the model pairs them by position."""
    size = min(len(w.tpot_log_reps) for w in windows)
    return [
        dataclasses.replace(
            w,
            tpot_log_reps=w.tpot_log_reps[:size],
            length_log_reps=None if w.length_log_reps is None else w.length_log_reps[:size],
        )
        for w in windows
    ]


def estimate_of(source: kcurve.KWindow | kcurve.Prediction, is_measured: bool, opts: StatsOptions) -> kcurve.Estimate:
    """A measured window's or a prediction's median TPOT with its interval, as :func:`kcurve.choose` compares them."""
    if isinstance(source, kcurve.KWindow):
        finite = source.tpot_log_reps[np.isfinite(source.tpot_log_reps)]
        low, high = np.exp(np.quantile(finite, [opts.alpha / 2, 1 - opts.alpha / 2]))
        return kcurve.Estimate(source.k, source.tpot_s, float(low), float(high), is_measured, source.tpot_log_reps)
    return kcurve.Estimate(
        source.k, source.tpot_s, source.tpot_low_s, source.tpot_high_s, is_measured, source.tpot_log_reps
    )


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


def predicted_metrics(prediction: kcurve.Prediction, error: tuple[float, int] | None = None) -> dict[str, float]:
    """A predicted point's MLflow metrics: the sweep table's names, each with its interval, and
    ``model_error_sd``, the log-scale model-error term its interval carries (``error``, from
    :func:`model_error`, where there is one)."""
    term = {} if error is None else {"model_error_sd": error[0]}
    return term | {
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
