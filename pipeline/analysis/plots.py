"""The PNG renderer of :mod:`pipeline.analysis.figures`: one specification in, PNG bytes out.

The only module that imports matplotlib. The Markdown report and the gate's trend charts use
it; Plotly's static export would need a browser (kaleido), which a plain install does not have.
"""

from __future__ import annotations

import datetime as dt
import io
import math
from typing import Any

# The object-oriented API without pyplot: a Figure renders to PNG through the Agg canvas on its
# own, so no backend is chosen (matplotlib.use) and no global figure state is kept.
from matplotlib.axes import Axes
from matplotlib.figure import Figure as MplFigure
from matplotlib.patches import Rectangle

from pipeline.analysis.figures import Chart, Figure, Heatmap, Look, Series

STYLE: dict[Look, dict[str, Any]] = {
    Look.LINE: {"marker": "o"},
    Look.BASELINE: {"color": "black", "linestyle": "--", "marker": "s"},
    Look.MARKERS: {"marker": "o", "linestyle": "none"},
    Look.HOLLOW: {"marker": "o", "linestyle": "none", "markerfacecolor": "none"},
    Look.FRONTIER: {"color": "red", "alpha": 0.4, "drawstyle": "steps-post"},
    Look.STEP: {"drawstyle": "steps-post"},
}


def png(figure: Figure) -> bytes:
    """The figure as PNG bytes."""
    return _heatmap(figure) if isinstance(figure, Heatmap) else _chart(figure)


def _render(fig: MplFigure) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()


def _xs(chart: Chart, series: Series) -> list[Any]:
    if chart.time_x:
        return [dt.datetime.fromtimestamp(p.x / 1000, tz=dt.UTC) for p in series.points]
    return [p.x for p in series.points]


def _errors(values: list[float], bounds: list[tuple[float, float] | None]) -> list[list[float]] | None:
    """Matplotlib's asymmetric error bars; a point without an interval gets none (zero)."""
    if all(b is None for b in bounds):
        return None
    below = [v - b[0] if b else 0.0 for v, b in zip(values, bounds, strict=True)]
    above = [b[1] - v if b else 0.0 for v, b in zip(values, bounds, strict=True)]
    return [below, above]


def _draw(ax: Axes, chart: Chart, series: Series, colour: Any) -> Any:
    """One series on its axes; returns the colour it was drawn in (a name, or an RGB tuple
    from the colour cycle), for the other series of its group."""
    xs, ys = _xs(chart, series), [p.y for p in series.points]
    style = dict(STYLE[series.look])
    if colour and "color" not in style:
        style["color"] = colour
    xerr = _errors([p.x for p in series.points], [p.x_err for p in series.points])
    yerr = _errors(ys, [p.y_err for p in series.points])
    if xerr or yerr:
        bars = ax.errorbar(xs, ys, xerr=xerr, yerr=yerr, capsize=3, label=series.name, **style)
        drawn = bars[0].get_color()
    else:
        (line,) = ax.plot(xs, ys, label=series.name, **style)
        drawn = line.get_color()
    for x, point in zip(xs, series.points, strict=True):
        if point.missed:  # a capacity probe that missed the SLO: a cross over its marker
            ax.plot([x], [point.y], marker="x", color=drawn, markersize=9, linestyle="none")
        if point.label:
            ax.annotate(point.label, (x, point.y), fontsize=7, textcoords="offset points", xytext=(3, 3))
    if series.boundary is not None:
        ax.axvline(series.boundary, color=drawn, linestyle=":", linewidth=1)
    return drawn


def _chart(chart: Chart) -> bytes:
    fig = MplFigure(figsize=chart.size)
    if chart.upper_label:
        upper, main = fig.subplots(2, 1, sharex=True, height_ratios=[1, 2])
        upper.set_ylabel(chart.upper_label)
        upper.grid(alpha=0.3)
    else:
        upper, main = None, fig.subplots()
    colours: dict[str, Any] = {}
    for series in chart.series:
        ax = upper if series.panel == 1 and upper is not None else main
        drawn = _draw(ax, chart, series, colours.get(series.group) if series.group else None)
        if series.group:
            colours.setdefault(series.group, drawn)
    for y in chart.hlines:
        main.axhline(y, color="black" if y else "grey", linewidth=1, linestyle="-" if y else "--")
    if chart.log_x:
        main.set_xscale("log")
    if chart.time_x:
        fig.autofmt_xdate()
    main.set_xlabel(chart.x_label)
    main.set_ylabel(chart.y_label)
    (upper or main).set_title(chart.title)
    main.legend(fontsize=7)
    main.grid(alpha=0.3)
    return _render(fig)


def _heatmap(heat: Heatmap) -> bytes:
    # Overlays name themselves in a legend under the map: room for it.
    below = 0.3 * len(heat.overlays) + (0.4 if heat.overlays else 0)
    fig = MplFigure(
        figsize=(1.4 * len(heat.columns) + 3 + (2 if heat.overlays else 0), 0.7 * len(heat.rows) + 2 + below)
    )
    ax = fig.subplots()
    values = [[c.value if c else math.nan for c in line] for line in heat.cells]
    image = ax.imshow(values, cmap="RdYlGn", vmin=heat.low, vmax=heat.high, aspect="auto")
    ax.set_xticks(range(len(heat.columns)), list(heat.columns))
    ax.set_yticks(range(len(heat.rows)), list(heat.rows))
    for i, line in enumerate(heat.cells):
        for j, cell in enumerate(line):
            if cell is None:
                continue
            # Inconclusive cells are hatched and say so: their colour is not a finding.
            if not cell.resolved:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", edgecolor="grey"))
            ax.text(j, i, cell.text.replace(" ?", "\n?"), ha="center", va="center", fontsize=9)
    for overlay in heat.overlays:  # image coordinates: column j is x, row i is y
        xs, ys = [x for x, _ in overlay.points], [y for _, y in overlay.points]
        style = {"color": "black", "linestyle": "--", "marker": "."} if overlay.line else {"linestyle": "none"}
        ax.plot(xs, ys, label=overlay.name, **({"marker": "D", "markersize": 7} | style))
        for x, y, text in zip(xs, ys, overlay.labels, strict=False):
            ax.annotate(text, (x, y), fontsize=7, textcoords="offset points", xytext=(4, 4))
    if heat.overlays:
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    ax.set_xlabel(heat.x_label)
    ax.set_ylabel(heat.y_label)
    ax.set_title(heat.title)
    fig.colorbar(image, ax=ax)
    return _render(fig)
