"""The report's sections for the two searches: capacity under an SLO, and the predicted k curve.

Pure: the sweep table, each window's requests and the predictions table in; numbers and
Markdown out. Capacity is decided here from the probes' requests (not from what the worker
saw), so ``python -m pipeline.report`` decides it the same way again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from pipeline.analysis.capacity import (
    Boundary,
    CapacityRatio,
    boundary,
    capacity_ratio,
    probe,
)
from pipeline.analysis.kcurve_windows import CurveResult
from pipeline.analysis.samples import Sample, StatsOptions, finite_number
from pipeline.analysis.verdicts import config_label, measured
from pipeline.load.slo import SloTarget

PREDICTIONS_CSV = "predict/predictions.csv"  # search=predict's table, on the sweep's parent run


@dataclass(frozen=True, eq=False)
class CapacityCurve:
    label: str  # "vllm baseline", "vllm ngram k=3"
    role: str
    probes: tuple[tuple[float, float, bool], ...]  # (rate, the SLO metric's percentile in ms, passed), by rate
    boundary: Boundary
    ratio: CapacityRatio | None  # against its baseline (speculative curves)
    run_ids: tuple[str, ...] = ()  # each probe's MLflow run, in the order of ``probes``


def capacity_curves(
    frame: pd.DataFrame, samples: Mapping[str, Sample], target: SloTarget, opts: StatsOptions
) -> list[CapacityCurve]:
    """Each server's probes (rows with ``capacity_probe``), its boundary, and speculative
    boundaries against the baseline whose first probe shared their rate and workload."""
    if "capacity_probe" not in frame or not target.active:
        return []
    rows = measured(frame).dropna(subset=["capacity_probe"])
    metric = next(iter(target.thresholds()))
    curves: dict[int, CapacityCurve] = {}
    first_base: dict[str, int] = {}  # a baseline probe's point hash -> its server
    for i, (server, group) in enumerate(rows.groupby("server", sort=True)):
        group = group.sort_values("request_rate")
        probes, shown, runs = [], [], []
        for j, row in enumerate(group.itertuples()):
            sample = samples.get(str(row.run_id))
            if sample is None:
                continue
            found = probe(float(row.request_rate), sample, target, opts, np.random.default_rng([opts.seed, 53, i, j]))
            probes.append(found)
            passed = found.passed
            values = sample.values[metric][np.isfinite(sample.values[metric])]
            level = float(np.percentile(values, target.percentile)) * 1000 if len(values) else math.nan
            shown.append((float(row.request_rate), level, passed))
            runs.append(str(row.run_id))
        if not probes:
            continue
        head = group.iloc[0]
        if head["role"] == "baseline":
            first_base.update({str(h): int(server) for h in group["point_hash"]})
        curves[int(server)] = CapacityCurve(
            config_label(head), str(head["role"]), tuple(shown), boundary(probes, opts), None, tuple(runs)
        )
    out = []
    for server, curve in curves.items():
        if curve.role == "speculative":
            group = rows[rows["server"] == server]
            base_server = next((first_base[str(h)] for h in group["baseline_hash"] if str(h) in first_base), None)
            if base_server is not None:
                curve = CapacityCurve(
                    curve.label,
                    curve.role,
                    curve.probes,
                    curve.boundary,
                    capacity_ratio(curves[base_server].boundary, curve.boundary, opts),
                    curve.run_ids,
                )
        out.append(curve)
    return sorted(out, key=lambda c: (c.role != "baseline", c.label))


def capacity_headline(curves: list[CapacityCurve], target: SloTarget) -> str:
    """The capacity-planning number, first: what one replica sustains under the SLO."""
    if not curves:
        return ""
    parts = []
    for curve in curves:
        text = curve.boundary.text
        if curve.ratio is not None and curve.ratio.estimate is not None:
            text += f" ({curve.ratio.text})"
        parts.append(f"{curve.label.removeprefix('vllm ')} {text}")
    return f"Max sustainable req/s under the SLO ({target.describe()}): " + "; ".join(parts) + "."


def capacity_lines(curves: list[CapacityCurve], target: SloTarget, opts: StatsOptions) -> list[str]:
    if not curves:
        return []
    lines = [
        "## Capacity under the SLO",
        "",
        f"SLO: {target.describe()}. Each server's rate was bracketed, then bisected, on that one server. The "
        f"boundary is where a monotone fit of the SLO's margins across probes crosses zero; its interval "
        f"({opts.confidence:.0%}) re-fits {opts.resamples} draws of each probe's percentile (its order "
        f"statistics) and goodput share (exact binomial).",
        "",
        "| configuration | max sustainable req/s | against the baseline | probes (rate: p-value of the metric, met?) |",
        "|---|---|---|---|",
    ]
    for curve in curves:
        probes = ", ".join(f"{r:g}: {v:.0f} ms {'met' if ok else 'missed'}" for r, v, ok in curve.probes)
        ratio = curve.ratio.text if curve.ratio is not None else "—"
        lines.append(f"| {curve.label} | {curve.boundary.text} | {ratio} | {probes} |")
    return lines + [""]


def newest_predictions(group: pd.DataFrame) -> pd.DataFrame:
    """Each k's newest predicted median TPOT (ms) with its interval, from rows of the predictions
    table: anchored on the confirmations where it was, else the first prediction. Columns k,
    tpot, tpot_low, tpot_high; a k without a prediction is left out."""

    def column(name: str) -> pd.Series:
        return group[name] if name in group else pd.Series(math.nan, index=group.index)

    guess = pd.DataFrame({"k": group["k"]})
    for part in ("", "_low", "_high"):
        guess[f"tpot{part}"] = column(f"final_tpot_ms{part}").fillna(column(f"predicted_tpot_ms{part}"))
    return guess.dropna(subset=["tpot"])


def predictions_table(results: Sequence[CurveResult]) -> pd.DataFrame:
    """Predicted against measured: one row per (curve, k, rate) of search=predict's curve results."""
    rows = []
    for result in results:
        for k, rate in sorted(set(result.first) | set(result.measured)):
            first, final = result.first.get((k, rate)), result.final.get((k, rate))
            seen = result.measured.get((k, rate))
            choice = result.choices.get(rate)
            row: dict[str, object] = {
                "curve": result.label,
                "setting_key": result.setting,
                "k": k,
                "request_rate": rate,
                "predicted": first is not None,
                "confirmed": seen is not None,
                "chosen": bool(choice and choice.best.k == k),
                "notes": "; ".join(result.notes),
                # The sweep's model-error term (log-scale sd), in every final interval.
                "model_error_sd": result.model_error[0] if result.model_error else math.nan,
                "model_error_points": result.model_error[1] if result.model_error else 0,
            }
            if first is not None:
                row |= {
                    "predicted_length": first.length,
                    "predicted_length_low": first.length_low,
                    "predicted_length_high": first.length_high,
                    "predicted_tpot_ms": 1000 * first.tpot_s,
                    "predicted_tpot_ms_low": 1000 * first.tpot_low_s,
                    "predicted_tpot_ms_high": 1000 * first.tpot_high_s,
                }
            if final is not None:
                row |= {
                    "final_tpot_ms": 1000 * final.tpot_s,
                    "final_tpot_ms_low": 1000 * final.tpot_low_s,
                    "final_tpot_ms_high": 1000 * final.tpot_high_s,
                    "final_length": final.length,
                    "anchored": final.anchored,
                }
            if seen is not None:
                row |= {
                    "measured_tpot_ms": 1000 * seen.tpot_s,
                    "measured_tpot_ms_low": 1000 * seen.low_s,
                    "measured_tpot_ms_high": 1000 * seen.high_s,
                }
                length = result.measured_length[(k, rate)]
                row["measured_length"] = length
                if first is not None:
                    row["tpot_error"] = abs(first.tpot_s - seen.tpot_s) / seen.tpot_s
                    row["length_error"] = abs(first.length - length) / length
            rows.append(row)
    return pd.DataFrame(rows)


def predict_lines(table: pd.DataFrame) -> list[str]:
    """search=predict: the chosen k per rate, then every prediction against what was measured."""
    if table.empty:
        return []
    lines = [
        "## Predicted k curve (search=predict)",
        "",
        "Measured: the baseline and the largest k at every rate; every other k is predicted from the largest "
        "k's per-position acceptance and the two step costs, then the predicted best (and any k whose "
        "interval overlaps it, up to predict.max_confirm servers) is measured on a fresh server. 'predicted' "
        "is the model from the first two servers alone; 'final' adds the confirmations as anchors. Predicted "
        "points are never used in a verdict.",
        "",
    ]
    for curve, group in table.groupby("curve", sort=True):
        chosen = group[group["chosen"].astype(bool)]
        picks = ", ".join(
            f"{r.request_rate:g} req/s: k={r.k}" + ("" if r.confirmed else " (predicted, not measured)")
            for r in chosen.sort_values("request_rate").itertuples()
        )
        lines += [f"**{curve}**: the best k per rate: {picks or 'none'}", ""]
        notes = group["notes"].dropna().astype(str) if "notes" in group else pd.Series(dtype=str)
        lines += [f"- {note}" for note in sorted({n for text in notes for n in text.split("; ") if n})]
        checked = group[group["confirmed"].astype(bool) & group["predicted"].astype(bool)]
        if not checked.empty:
            lines += [
                f"Prediction error over {len(checked)} confirmed point(s): acceptance length L median "
                f"{100 * float(checked['length_error'].median()):.1f} %, median TPOT median "
                f"{100 * float(checked['tpot_error'].median()):.1f} % (worst "
                f"{100 * float(checked['tpot_error'].max()):.1f} %).",
                "",
            ]
        lines += [
            "| k | rate | predicted L | predicted median TPOT | final (anchored) | measured |",
            "|---|---|---|---|---|---|",
        ]
        for r in group.sort_values(["request_rate", "k"]).itertuples():
            lines.append(
                f"| {r.k} | {r.request_rate:g} | {_interval(r, 'predicted_length', '', 2)} | "
                f"{_interval(r, 'predicted_tpot_ms', ' ms')} | {_interval(r, 'final_tpot_ms', ' ms')} | "
                f"{_interval(r, 'measured_tpot_ms', ' ms')}"
                + (f", L {r.measured_length:.2f}" if finite_number(getattr(r, "measured_length", None)) else "")
                + " |"
            )
        lines.append("")
    return lines


def _interval(row: object, name: str, unit: str, digits: int = 1) -> str:
    value, low, high = (getattr(row, f"{name}{s}", None) for s in ("", "_low", "_high"))
    if not finite_number(value):
        return "—"
    bounds = f" [{low:.{digits}f}, {high:.{digits}f}]" if finite_number(low) and finite_number(high) else ""
    return f"{value:.{digits}f}{unit}{bounds}"
