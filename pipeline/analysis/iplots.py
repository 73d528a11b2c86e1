"""The report's interactive figures (Plotly), for the HTML page; with ``iplots_search``, the only plotly importers.

Each point's tooltip names its configuration and rate, gives its value with its interval, and
links to its MLflow run; a click opens that run. Every figure of the report has a twin here
or in :mod:`pipeline.analysis.iplots_search`; the PNGs of the Markdown report (and the gate's
trend charts, which the gate draws) come from :mod:`pipeline.analysis.plots` (matplotlib):
Plotly's static export needs a browser (kaleido), which a plain install does not have.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from html import escape

import pandas as pd
import plotly.graph_objects as go

from pipeline.analysis.verdicts import config_label, measured

RunUrl = Callable[[str], str]  # run id -> its page in the MLflow UI
HOVER = "<b>%{customdata[0]}</b><br>rate %{customdata[1]} req/s<br>%{customdata[2]}<br>%{customdata[3]}<extra></extra>"
# Opens a point's run on click; the tooltip's link cannot be reached before it moves away.
CLICK_JS = """window.addEventListener('load', function () {
  document.querySelectorAll('.plotly-graph-div').forEach(function (div) {
    div.on('plotly_click', function (e) { var u = e.points[0].customdata[4]; if (u) { window.open(u, '_blank'); } });
  });
});"""


def interval_text(value: float, low: object, high: object, fmt: str, unit: str = "") -> str:
    if isinstance(low, float) and isinstance(high, float) and math.isfinite(low) and math.isfinite(high):
        return f"{value:{fmt}}{unit} [{low:{fmt}}, {high:{fmt}}]"
    return f"{value:{fmt}}{unit} (no interval: a summary of the window only)"


def run_link(run_ids: str, names: dict[str, str], url: RunUrl) -> tuple[str, str]:
    """The tooltip's link line and the click target: the point's first run."""
    ids = [r for r in str(run_ids or "").split() if r]
    if not ids:
        return "no MLflow run", ""
    shown = ", ".join(names.get(r, r[:8]) for r in ids[:4]) + (" ..." if len(ids) > 4 else "")
    return f'<a href="{url(ids[0])}">MLflow run: {shown}</a> (click the point)', url(ids[0])


def error_bars(value: pd.Series, low: pd.Series, high: pd.Series, fill: float | None = None) -> dict:
    """Asymmetric error bars from an interval; ``fill`` stands in where a bound is missing."""
    above, below = high - value, value - low
    if fill is not None:
        above, below = above.fillna(fill), below.fillna(fill)
    return {"type": "data", "symmetric": False, "array": above.tolist(), "arrayminus": below.tolist(), "thickness": 1}


def layout(fig: go.Figure, title: str, x: str, y: str) -> go.Figure:
    fig.update_layout(
        title=title,
        xaxis_title=x,
        yaxis_title=y,
        hovermode="closest",
        template="plotly_white",
        height=460,
        legend={"font": {"size": 10}},
    )
    return fig


def throughput_vs_tpot(levels: pd.DataFrame | None, names: dict[str, str], url: RunUrl) -> go.Figure | None:
    """Throughput against median TPOT, a curve per configuration, each point with its interval."""
    if levels is None or levels.empty:
        return None
    fig = go.Figure()
    for _, curve in levels.groupby(["role", "engine", "method", "k", "setting_key"], sort=True, dropna=False):
        curve = curve.sort_values("request_rate")
        low, high = curve.get("median_tpot_ms_low"), curve.get("median_tpot_ms_high")
        custom = []
        for _, row in curve.iterrows():
            text = "median TPOT " + interval_text(
                row["median_tpot_ms"], row.get("median_tpot_ms_low"), row.get("median_tpot_ms_high"), ".1f", " ms"
            )
            link, target = run_link(row.get("run_ids", ""), names, url)
            custom.append(
                [
                    config_label(row),
                    f"{row['request_rate']:g}",
                    f"{text}<br>throughput {row['output_throughput']:.1f} tok/s",
                    link,
                    target,
                ]
            )
        error = error_bars(curve["median_tpot_ms"], low, high) if low is not None and high is not None else None
        baseline = curve.iloc[0]["role"] == "baseline"
        fig.add_trace(
            go.Scatter(
                x=curve["median_tpot_ms"],
                y=curve["output_throughput"],
                mode="lines+markers",
                name=config_label(curve.iloc[0]),
                customdata=custom,
                hovertemplate=HOVER,
                error_x=error,
                line={"dash": "dash", "color": "black"} if baseline else None,
            )
        )
    return layout(
        fig,
        "Throughput against median TPOT, across request rates",
        "median TPOT, ms (lower is better)",
        "output throughput, tok/s (higher is better)",
    )


def speedup_vs_rate(points: pd.DataFrame, names: dict[str, str], url: RunUrl) -> go.Figure | None:
    if points.empty or "speedup_median_tpot_low" not in points:
        return None
    fig = go.Figure()
    # A point whose window was too small for a ratio has no estimate: nothing to draw (as the PNG).
    estimated = pd.to_numeric(points["speedup_median_tpot"], errors="coerce").notna()
    finite = points[points["request_rate"].apply(math.isfinite) & estimated]
    for _, group in finite.groupby(["engine", "method", "k"], sort=True):
        group = group.sort_values("request_rate")
        estimate = group["speedup_median_tpot"].astype(float)
        custom = []
        for _, row in group.iterrows():
            text = "median-TPOT speedup " + interval_text(
                float(row["speedup_median_tpot"]),
                row["speedup_median_tpot_low"],
                row["speedup_median_tpot_high"],
                ".2f",
                "x",
            )
            link, target = run_link(row.get("run_ids", ""), names, url)
            custom.append(
                [config_label(row), f"{row['request_rate']:g}", f"{text}: {row.get('verdict', '')}", link, target]
            )
        error = error_bars(
            estimate,
            group["speedup_median_tpot_low"].astype(float),
            group["speedup_median_tpot_high"].astype(float),
            fill=0,
        )
        fig.add_trace(
            go.Scatter(
                x=group["request_rate"],
                y=estimate,
                mode="lines+markers",
                name=config_label(group.iloc[0]),
                customdata=custom,
                hovertemplate=HOVER,
                error_y=error,
            )
        )
    fig.add_hline(y=1.0, line={"color": "black", "width": 1})
    return layout(
        fig,
        "Median-TPOT speedup with its interval, against load",
        "request rate (req/s)",
        "median-TPOT speedup (> 1: speculation faster)",
    )


def _median_over_runs(
    curve: pd.DataFrame, column: str, names: dict[str, str], url: RunUrl
) -> Iterator[tuple[float, pd.DataFrame, float, str, str, str]]:
    """Per rate of one configuration: its runs, the column's median over them, their range (none
    for one run), and the link to them."""
    for rate, at in curve.groupby("request_rate", sort=True):
        spread = f" (runs {at[column].min():.1f} to {at[column].max():.1f})" if len(at) > 1 else ""
        yield (rate, at, float(at[column].median()), spread, *run_link(" ".join(at["run_id"].astype(str)), names, url))


def _config_trace(curve: pd.DataFrame, xs: list, ys: list, custom: list) -> go.Scatter:
    """One configuration's curve; the baseline dashed black, as in the PNGs."""
    baseline = curve.iloc[0]["role"] == "baseline"
    return go.Scatter(
        x=xs,
        y=ys,
        mode="lines+markers",
        name=config_label(curve.iloc[0]),
        customdata=custom,
        hovertemplate=HOVER,
        line={"dash": "dash", "color": "black"} if baseline else None,
    )


def ttft_vs_rate(frame: pd.DataFrame, names: dict[str, str], url: RunUrl) -> go.Figure | None:
    data = measured(frame).dropna(subset=["median_ttft_ms"]) if "median_ttft_ms" in frame else frame.iloc[0:0]
    if data.empty:
        return None
    fig = go.Figure()
    for _, curve in data.groupby(["engine", "role", "method", "k"], sort=True):
        xs, ys, custom = [], [], []
        for rate, at, value, spread, link, target in _median_over_runs(curve, "median_ttft_ms", names, url):
            xs.append(rate)
            ys.append(value)
            custom.append([config_label(at.iloc[0]), f"{rate:g}", f"median TTFT {value:.1f} ms{spread}", link, target])
        fig.add_trace(_config_trace(curve, xs, ys, custom))
    return layout(fig, "Time to first token against load", "request rate (req/s)", "median TTFT (ms)")


def throughput_vs_p99_tpot(frame: pd.DataFrame, names: dict[str, str], url: RunUrl) -> go.Figure | None:
    """Throughput against p99 TPOT: the tail users feel. Each point is the median over its runs."""
    data = measured(frame).dropna(subset=["p99_tpot_ms", "output_throughput"]) if "p99_tpot_ms" in frame else frame
    if data.empty or "p99_tpot_ms" not in data:
        return None
    fig = go.Figure()
    for _, curve in data.groupby(["engine", "role", "method", "k"], sort=True):
        xs, ys, custom = [], [], []
        for rate, at, p99, spread, link, target in _median_over_runs(curve, "p99_tpot_ms", names, url):
            throughput = float(at["output_throughput"].median())
            xs.append(p99)
            ys.append(throughput)
            custom.append(
                [
                    config_label(at.iloc[0]),
                    f"{rate:g}",
                    f"p99 TPOT {p99:.1f} ms{spread}<br>throughput "
                    f"{throughput:.1f} tok/s (the speedup table gives p99 ratios with intervals)",
                    link,
                    target,
                ]
            )
        fig.add_trace(_config_trace(curve, xs, ys, custom))
    return layout(
        fig,
        "Throughput against p99 TPOT, across request rates",
        "p99 TPOT, ms (lower is better)",
        "output throughput, tok/s (higher is better)",
    )


def speedup_heatmap(points: pd.DataFrame, names: dict[str, str], url: RunUrl) -> go.Figure | None:
    """Median-TPOT speedup per configuration and rate; a cell's tooltip gives its interval and verdict."""
    if points.empty or "speedup_median_tpot_low" not in points:
        return None
    rows = points.assign(config=[config_label(r) for _, r in points.iterrows()])
    configs, rates = sorted(rows["config"].unique()), sorted(rows["request_rate"].unique())
    z = [[math.nan] * len(rates) for _ in configs]
    custom = [[["", "", "", "", ""] for _ in rates] for _ in configs]
    labels = [["" for _ in rates] for _ in configs]
    for _, row in rows.iterrows():
        i, j = configs.index(row["config"]), rates.index(row["request_rate"])
        verdict = str(row.get("verdict", ""))
        if pd.isna(row["speedup_median_tpot"]):  # too few requests for a ratio: an empty cell that says why
            custom[i][j] = [row["config"], f"{row['request_rate']:g}", f"no ratio: {verdict}", "", ""]
            continue
        value = float(row["speedup_median_tpot"])
        z[i][j] = value
        labels[i][j] = f"{value:.2f}x" + ("" if verdict in ("helps", "hurts") else " ?")
        text = "median-TPOT speedup " + interval_text(
            value, row["speedup_median_tpot_low"], row["speedup_median_tpot_high"], ".2f", "x"
        )
        link, target = run_link(row.get("run_ids", ""), names, url)
        custom[i][j] = [row["config"], f"{row['request_rate']:g}", f"{text}: {verdict}", link, target]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=[f"{r:g}" for r in rates],
            y=configs,
            customdata=custom,
            hovertemplate=HOVER,
            text=labels,
            texttemplate="%{text}",
            colorscale="RdYlGn",
            zmin=0.5,
            zmax=1.5,
        )
    )
    return layout(
        fig,
        "Median-TPOT speedup over k x request rate ('?': inconclusive, its colour is no finding)",
        "request rate (req/s)",
        "configuration",
    )


def acceptance_vs_k(points: pd.DataFrame, names: dict[str, str], url: RunUrl) -> go.Figure | None:
    if points.empty or points["acceptance_length"].isna().all():
        return None
    fig = go.Figure()
    for (engine, method, rate), group in points.groupby(["engine", "method", "request_rate"], sort=True):
        group = group.sort_values("k")
        custom = []
        for _, row in group.iterrows():
            link, target = run_link(row.get("run_ids", ""), names, url)
            custom.append(
                [
                    config_label(row),
                    f"{rate:g}",
                    f"acceptance length L {row.get('acceptance_length_text', '')}",
                    link,
                    target,
                ]
            )
        fig.add_trace(
            go.Scatter(
                x=group["k"],
                y=group["acceptance_length"],
                mode="lines+markers",
                name=f"{engine} {method} @ {rate:g}/s",
                customdata=custom,
                hovertemplate=HOVER,
            )
        )
    return layout(fig, "Acceptance against k", "k (draft tokens per step)", "acceptance length L (tokens per step)")


def html(figures: dict[str, go.Figure]) -> str:
    """The figures as HTML for one page: plotly.js once, inline, so that the page opens offline."""
    from plotly.offline import get_plotlyjs

    if not figures:
        return ""
    parts = [f"<script>{get_plotlyjs()}</script>", f"<script>{CLICK_JS}</script>"]
    for i, (name, fig) in enumerate(figures.items()):
        div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"figure-{i}", config={"displaylogo": False})
        parts.append(f'<h3>{escape(name)}</h3><div class="figure">{div}</div>')
    return "".join(parts)


def trace_timeline(table: pd.DataFrame | None) -> go.Figure | None:
    """The twin of plots.trace_timeline: offered load above, each stretch's speedup below."""
    from plotly.subplots import make_subplots

    if table is None or table.empty:
        return None
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.33, 0.67], vertical_spacing=0.06)
    for (config, rate), group in table.groupby(["config", "request_rate"], sort=True):
        group = group.sort_values("start_s")
        middle = (group["start_s"] + group["end_s"]) / 2
        name = f"{config} @ {rate:g}/s"
        estimate = group["speedup_median_tpot"].astype(float)
        hover = [
            f"<b>{name}</b><br>{r.bucket}: {r.offered_rate:.2f} req/s offered, {r.in_flight:.1f} in flight"
            f"<br>median-TPOT speedup {r.text}: {r.verdict}"
            for r in group.itertuples(index=False)
        ]
        fig.add_trace(
            go.Scatter(
                x=middle,
                y=group["offered_rate"],
                mode="lines+markers",
                name=f"{name} load",
                line={"shape": "hvh"},
                hovertext=hover,
                hoverinfo="text",
            ),
            row=1,
            col=1,
        )
        error = error_bars(
            estimate,
            group["speedup_median_tpot_low"].astype(float),
            group["speedup_median_tpot_high"].astype(float),
            fill=0,
        )
        fig.add_trace(
            go.Scatter(
                x=middle, y=estimate, mode="markers", name=name, error_y=error, hovertext=hover, hoverinfo="text"
            ),
            row=2,
            col=1,
        )
    fig.add_hline(y=1.0, line={"color": "black", "width": 1}, row=2, col=1)
    layout(fig, "Speedup over the trace, stretch by stretch, with its interval", "", "offered (req/s)")
    fig.update_xaxes(title_text="seconds into the replay", row=2, col=1)
    fig.update_yaxes(title_text="median-TPOT speedup (> 1: faster)", row=2, col=1)
    return fig
