"""The two searches' interactive figures: capacity under an SLO, and the k curve (measured and predicted).

Tooltips as in :mod:`pipeline.analysis.iplots`: configuration, rate, the value (with its
interval where one was measured) and the MLflow run behind it. A predicted point has no run,
and says so.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from pipeline.analysis.iplots import HOVER, RunUrl, error_bars, interval_text, layout, run_link
from pipeline.analysis.search_report import CapacityCurve, newest_predictions
from pipeline.analysis.verdicts import measured


def capacity_curve(curves: Sequence[CapacityCurve], names: dict[str, str], url: RunUrl) -> go.Figure | None:
    """Each server's probes (circle: met, cross: missed) and where its search put the boundary."""
    if not curves:
        return None
    fig = go.Figure()
    for curve in curves:
        runs = curve.run_ids or ("",) * len(curve.probes)
        custom = []
        for (rate, value, met), run in zip(curve.probes, runs, strict=True):
            link, target = run_link(run, names, url)
            custom.append(
                [
                    curve.label,
                    f"{rate:g}",
                    f"the SLO metric at its percentile {value:.0f} ms: "
                    f"{'met' if met else 'missed'}<br>boundary {curve.boundary.text}",
                    link,
                    target,
                ]
            )
        baseline = curve.role == "baseline"
        fig.add_trace(
            go.Scatter(
                x=[r for r, _, _ in curve.probes],
                y=[v for _, v, _ in curve.probes],
                mode="lines+markers",
                name=f"{curve.label}: {curve.boundary.text}",
                customdata=custom,
                hovertemplate=HOVER,
                marker={"symbol": ["circle" if m else "x" for *_, m in curve.probes], "size": 9},
                line={"dash": "dash", "color": "black"} if baseline else None,
            )
        )
        if curve.boundary.estimate is not None:
            fig.add_vline(x=curve.boundary.estimate, line={"dash": "dot", "width": 1})
    fig.update_xaxes(type="log")
    return layout(
        fig,
        "Capacity under the SLO: probes (o met, x missed) and boundaries",
        "request rate (req/s, log scale)",
        "the SLO metric at its percentile (ms)",
    )


def _runs_by_setting(frame: pd.DataFrame) -> dict[tuple[str, int, float], str]:
    """(setting, k, rate) -> the run ids that measured it, for the k curve's measured points."""
    if frame.empty or "setting_key" not in frame:
        return {}
    rows = measured(frame, "speculative")
    return {
        (str(s), int(k), float(r)): " ".join(g["run_id"].astype(str))
        for (s, k, r), g in rows.groupby(["setting_key", "k", "request_rate"])
    }


def k_curve(table: pd.DataFrame | None, frame: pd.DataFrame, names: dict[str, str], url: RunUrl) -> go.Figure | None:
    """Median TPOT against k per rate: measured points filled, predicted points hollow."""
    if table is None or table.empty:
        return None
    runs = _runs_by_setting(frame)
    fig = go.Figure()
    for (curve, rate), group in table.groupby(["curve", "request_rate"], sort=True):
        group = group.sort_values("k")
        seen = group.dropna(subset=["measured_tpot_ms"]) if "measured_tpot_ms" in group else group.iloc[0:0]
        custom = []
        for _, row in seen.iterrows():
            link, target = run_link(runs.get((str(row["setting_key"]), int(row["k"]), float(rate)), ""), names, url)
            text = "measured median TPOT " + interval_text(
                row["measured_tpot_ms"], row["measured_tpot_ms_low"], row["measured_tpot_ms_high"], ".1f", " ms"
            )
            custom.append([f"{curve} k={int(row['k'])}", f"{rate:g}", text, link, target])
        fig.add_trace(
            go.Scatter(
                x=seen["k"],
                y=seen["measured_tpot_ms"],
                mode="markers",
                customdata=custom,
                name=f"{curve} @ {rate:g}/s measured",
                hovertemplate=HOVER,
                error_y=error_bars(
                    seen["measured_tpot_ms"], seen["measured_tpot_ms_low"], seen["measured_tpot_ms_high"]
                ),
            )
        )
        guess = newest_predictions(group)
        if not guess.empty:
            custom = [
                [
                    f"{curve} k={int(row.k)}",
                    f"{rate:g}",
                    "predicted median TPOT " + interval_text(row.tpot, row.tpot_low, row.tpot_high, ".1f", " ms"),
                    "predicted, not measured: no MLflow run",
                    "",
                ]
                for row in guess.itertuples()
            ]
            fig.add_trace(
                go.Scatter(
                    x=guess["k"] + 0.06,
                    y=guess["tpot"],
                    mode="markers",
                    customdata=custom,
                    name=f"{curve} @ {rate:g}/s predicted",
                    hovertemplate=HOVER,
                    marker={"symbol": "circle-open", "size": 9},
                    error_y=error_bars(guess["tpot"], guess["tpot_low"], guess["tpot_high"]),
                )
            )
    return layout(fig, "Median TPOT against k (hollow: predicted)", "k (draft tokens per step)", "median TPOT (ms)")
