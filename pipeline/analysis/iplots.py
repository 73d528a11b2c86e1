"""The Plotly renderer of :mod:`pipeline.analysis.figures`, for the HTML page; the only plotly importer.

Each point's tooltip names its configuration and rate, gives its value with its interval, and
links to its MLflow run; a click opens that run. The same specification renders to PNG in
:mod:`pipeline.analysis.plots`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from html import escape
from typing import Any

import plotly.graph_objects as go

from pipeline.analysis.figures import Chart, Figure, FigureKey, Heatmap, Look, Mark, Series

RunUrl = Callable[[str], str]  # run id -> its page in the MLflow UI
HOVER = "<b>%{customdata[0]}</b><br>rate %{customdata[1]} req/s<br>%{customdata[2]}<br>%{customdata[3]}<extra></extra>"
# Opens a point's run on click; the tooltip's link cannot be reached before it moves away.
CLICK_JS = """window.addEventListener('load', function () {
  document.querySelectorAll('.plotly-graph-div').forEach(function (div) {
    div.on('plotly_click', function (e) { var u = e.points[0].customdata[4]; if (u) { window.open(u, '_blank'); } });
  });
});"""
PREDICTED = "predicted, not measured: no MLflow run"
LOOKS: dict[Look, dict[str, Any]] = {
    Look.LINE: {"mode": "lines+markers"},
    Look.BASELINE: {"mode": "lines+markers", "line": {"dash": "dash", "color": "black"}},
    Look.MARKERS: {"mode": "markers"},
    Look.HOLLOW: {"mode": "markers", "marker": {"symbol": "circle-open", "size": 9}},
    Look.FRONTIER: {"mode": "lines", "line": {"shape": "hv", "color": "rgba(255,0,0,0.4)"}},
    Look.STEP: {"mode": "lines+markers", "line": {"shape": "hvh"}},
}


def run_link(run_ids: str, names: dict[str, str], url: RunUrl) -> tuple[str, str]:
    """The tooltip's link line and the click target: the point's first run."""
    ids = [r for r in str(run_ids or "").split() if r]
    if not ids:
        return "no MLflow run", ""
    shown = ", ".join(names.get(r, r[:8]) for r in ids[:4]) + (" ..." if len(ids) > 4 else "")
    return f'<a href="{url(ids[0])}">MLflow run: {shown}</a> (click the point)', url(ids[0])


def _bars(values: list[float], bounds: list[tuple[float, float] | None]) -> dict | None:
    """Plotly's asymmetric error bars; a point without an interval gets none (zero)."""
    if all(b is None for b in bounds):
        return None
    above = [b[1] - v if b else 0.0 for v, b in zip(values, bounds, strict=True)]
    below = [v - b[0] if b else 0.0 for v, b in zip(values, bounds, strict=True)]
    return {"type": "data", "symmetric": False, "array": above, "arrayminus": below, "thickness": 1}


def _custom(point: Mark, series: Series, names: dict[str, str], url: RunUrl) -> list[str]:
    """The tooltip's fields: configuration, rate, value, link, and the click's target."""
    link, target = run_link(point.runs, names, url)
    if series.look is Look.HOLLOW and not point.runs:
        link = PREDICTED
    rate = "" if point.rate is None else f"{point.rate:g}"
    return [point.name or series.name, rate, point.hover, link, target]


def _trace(chart: Chart, series: Series, names: dict[str, str], url: RunUrl) -> go.Scatter:
    xs, ys = [p.x for p in series.points], [p.y for p in series.points]
    look = dict(LOOKS[series.look])
    if any(p.missed for p in series.points):  # capacity probes: circle met, cross missed
        look["marker"] = {"symbol": ["x" if p.missed else "circle" for p in series.points], "size": 9}
    return go.Scatter(
        x=[_when_iso(x) for x in xs] if chart.time_x else xs,
        y=ys,
        name=series.name,
        customdata=[_custom(p, series, names, url) for p in series.points],
        hovertemplate=HOVER,
        error_x=_bars(xs, [p.x_err for p in series.points]),
        error_y=_bars(ys, [p.y_err for p in series.points]),
        legendgroup=series.group or None,
        **look,
    )


def _when_iso(epoch_ms: float) -> str:
    """ISO 8601, which Plotly's date axis reads; figures labels its marks to the minute instead."""
    import datetime as dt

    return dt.datetime.fromtimestamp(epoch_ms / 1000, tz=dt.UTC).isoformat()


def _layout(fig: go.Figure, title: str, x: str, y: str) -> go.Figure:
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


def _chart(chart: Chart, names: dict[str, str], url: RunUrl) -> go.Figure:
    from plotly.subplots import make_subplots

    two = bool(chart.upper_label)
    fig = (
        make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.33, 0.67], vertical_spacing=0.06)
        if two
        else go.Figure()
    )
    for series in chart.series:
        trace = _trace(chart, series, names, url)
        if two:
            fig.add_trace(trace, row=1 if series.panel == 1 else 2, col=1)
        else:
            fig.add_trace(trace)
        if series.boundary is not None:
            fig.add_vline(x=series.boundary, line={"dash": "dot", "width": 1})
    where = {"row": 2, "col": 1} if two else {}
    for y in chart.hlines:
        fig.add_hline(y=y, line={"color": "black" if y else "grey", "width": 1}, **where)
    if chart.log_x:
        fig.update_xaxes(type="log")
    if two:
        _layout(fig, chart.title, "", chart.upper_label)
        fig.update_xaxes(title_text=chart.x_label, row=2, col=1)
        fig.update_yaxes(title_text=chart.y_label, row=2, col=1)
        return fig
    return _layout(fig, chart.title, chart.x_label, chart.y_label)


def _heatmap(heat: Heatmap, names: dict[str, str], url: RunUrl) -> go.Figure:
    custom = [[[row, column, "", "", ""] for column in heat.columns] for row in heat.rows]
    for i, j, note in heat.notes:
        custom[i][j][2] = note
    for i, line in enumerate(heat.cells):
        for j, cell in enumerate(line):
            if cell is not None:
                custom[i][j] = [heat.rows[i], heat.columns[j], cell.hover, *run_link(cell.runs, names, url)]
    fig = go.Figure(
        go.Heatmap(
            z=[[c.value if c else None for c in line] for line in heat.cells],
            x=list(heat.columns),
            y=list(heat.rows),
            customdata=custom,
            hovertemplate=HOVER,
            text=[[c.text if c else "" for c in line] for line in heat.cells],
            texttemplate="%{text}",
            colorscale="RdYlGn",
            zmin=heat.low,
            zmax=heat.high,
        )
    )
    if heat.overlays:
        _overlays(fig, heat)
    return _layout(fig, heat.title, heat.x_label, heat.y_label)


def _overlays(fig: go.Figure, heat: Heatmap) -> None:
    """Lines and markers over the cells, at fractional cell positions: the axes become the cells'
    indices, labelled with the columns' and rows' names."""
    fig.update_traces(x=list(range(len(heat.columns))), y=list(range(len(heat.rows))), selector={"type": "heatmap"})
    fig.update_xaxes(tickvals=list(range(len(heat.columns))), ticktext=list(heat.columns))
    fig.update_yaxes(tickvals=list(range(len(heat.rows))), ticktext=list(heat.rows), autorange="reversed")
    for overlay in heat.overlays:
        fig.add_trace(
            go.Scatter(
                x=[x for x, _ in overlay.points],
                y=[y for _, y in overlay.points],
                name=overlay.name,
                mode="lines+markers" if overlay.line else "markers+text",
                text=list(overlay.labels) or None,
                textposition="top right",
                line={"dash": "dash", "color": "black"},
                marker={"symbol": "diamond", "size": 10},
                hovertemplate=f"{escape(overlay.name)}<extra></extra>",
            )
        )


def plotly(figure: Figure, names: dict[str, str], url: RunUrl) -> go.Figure:
    """The figure as Plotly; ``names`` and ``url`` turn its run ids into links."""
    if isinstance(figure, Heatmap):
        return _heatmap(figure, names, url)
    return _chart(figure, names, url)


def html(figures: Mapping[FigureKey, go.Figure]) -> str:
    """The figures as HTML for one page: plotly.js once, inline, so that the page opens offline."""
    from plotly.offline import get_plotlyjs

    if not figures:
        return ""
    parts = [f"<script>{get_plotlyjs()}</script>", f"<script>{CLICK_JS}</script>"]
    for i, (key, fig) in enumerate(figures.items()):
        div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"figure-{i}", config={"displaylogo": False})
        parts.append(f'<h3>{escape(key.value)}</h3><div class="figure">{div}</div>')
    return "".join(parts)
