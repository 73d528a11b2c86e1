"""The report's figures, as PNG bytes. The only module that imports matplotlib."""

from __future__ import annotations

import io
import math

import pandas as pd

# The object-oriented API without pyplot: a Figure renders to PNG through the Agg canvas on its
# own, so no backend is chosen (matplotlib.use) and no global figure state is kept.
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from pipeline.analysis.search_report import newest_predictions
from pipeline.analysis.verdicts import measured


def _figure(size: tuple[float, float]) -> tuple[Figure, Axes]:
    fig = Figure(figsize=size)
    return fig, fig.subplots()


def _png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()


def _chart(fig: Figure, ax: Axes, xlabel: str, ylabel: str, title: str) -> bytes:
    """Label, legend and grid a line chart, then render it."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _png(fig)


def pareto_mask(x: list[float], y: list[float]) -> list[bool]:
    """Points not dominated by another with lower-or-equal x and higher-or-equal y."""
    return [
        not any((x2 <= x1 and y2 >= y1) and (x2 < x1 or y2 > y1) for x2, y2 in zip(x, y, strict=True))
        for x1, y1 in zip(x, y, strict=True)
    ]


def _curves(frame: pd.DataFrame):  # type: ignore[no-untyped-def]
    for (engine, role, method, k), group in measured(frame).groupby(["engine", "role", "method", "k"], sort=True):
        label = f"{engine} baseline" if role == "baseline" else f"{engine} {method} k={k}"
        yield label, role, group.groupby("request_rate", sort=True).median(numeric_only=True).reset_index()


def throughput_vs_tpot(
    frame: pd.DataFrame, tpot: str = "median_tpot_ms", levels: pd.DataFrame | None = None
) -> bytes | None:
    """Throughput against per-token latency; with ``levels`` (each point's median TPOT and
    its interval), horizontal error bars show how far each point could move."""
    data = measured(frame).dropna(subset=[tpot, "output_throughput"]) if tpot in frame else frame.iloc[0:0]
    if data.empty:
        return None
    fig, ax = _figure((7, 4.5))
    for label, role, curve in _curves(data):
        style = {"color": "black", "linestyle": "--", "marker": "s"} if role == "baseline" else {"marker": "o"}
        ax.plot(curve[tpot], curve["output_throughput"], label=label, **style)
        for row in curve.itertuples():
            ax.annotate(
                f"{row.request_rate:g}/s",
                (getattr(row, tpot), row.output_throughput),
                fontsize=7,
                textcoords="offset points",
                xytext=(3, 3),
            )
    if levels is not None and f"{tpot}_low" in levels:
        bars = levels.dropna(subset=[f"{tpot}_low", f"{tpot}_high"])
        ax.errorbar(
            bars[tpot],
            bars["output_throughput"],
            fmt="none",
            ecolor="grey",
            elinewidth=1,
            capsize=3,
            xerr=[bars[tpot] - bars[f"{tpot}_low"], bars[f"{tpot}_high"] - bars[tpot]],
            label="interval of the median TPOT",
        )
    xs, ys = list(data[tpot]), list(data["output_throughput"])
    front = sorted((x, y) for x, y, m in zip(xs, ys, pareto_mask(xs, ys), strict=True) if m)
    ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="red", alpha=0.4, label="Pareto frontier")
    return _chart(
        fig,
        ax,
        f"{tpot.replace('_', ' ')} (lower is better)",
        "output throughput, tok/s (higher is better)",
        "Throughput against per-token latency, across request rates",
    )


def speedup_vs_rate(points: pd.DataFrame) -> bytes | None:
    """Median-TPOT speedup per configuration against load, each with its interval."""
    if points.empty or "speedup_median_tpot_low" not in points:
        return None
    fig, ax = _figure((7, 4))
    finite = points[points["request_rate"].apply(math.isfinite)]
    for (engine, method, k), group in finite.groupby(["engine", "method", "k"], sort=True):
        group = group.sort_values("request_rate")
        estimate = group["speedup_median_tpot"].astype(float)
        low = (estimate - group["speedup_median_tpot_low"].astype(float)).fillna(0)
        high = (group["speedup_median_tpot_high"].astype(float) - estimate).fillna(0)
        ax.errorbar(
            group["request_rate"], estimate, yerr=[low, high], marker="o", capsize=3, label=f"{engine} {method} k={k}"
        )
    ax.axhline(1.0, color="black", linewidth=1)
    return _chart(
        fig,
        ax,
        "request rate (req/s)",
        "median-TPOT speedup (> 1: speculation faster)",
        "Median-TPOT speedup with its interval, against load",
    )


def ttft_vs_rate(frame: pd.DataFrame) -> bytes | None:
    data = measured(frame).dropna(subset=["median_ttft_ms"]) if "median_ttft_ms" in frame else frame.iloc[0:0]
    if data.empty:
        return None
    fig, ax = _figure((7, 4))
    for label, role, curve in _curves(data):
        ax.plot(
            curve["request_rate"],
            curve["median_ttft_ms"],
            marker="o",
            label=label,
            **({"color": "black", "linestyle": "--"} if role == "baseline" else {}),
        )
    return _chart(fig, ax, "request rate (req/s)", "median TTFT (ms)", "Time to first token against load")


def acceptance_vs_k(points: pd.DataFrame) -> bytes | None:
    if points.empty or points["acceptance_length"].isna().all():
        return None
    fig, ax = _figure((7, 4))
    for (engine, method, rate), group in points.groupby(["engine", "method", "request_rate"], sort=True):
        group = group.sort_values("k")
        ax.plot(group["k"], group["acceptance_length"], marker="o", label=f"{engine} {method} @ {rate:g}/s")
    return _chart(fig, ax, "k (draft tokens per step)", "acceptance length L (tokens per step)", "Acceptance against k")


def speedup_heatmap(points: pd.DataFrame) -> bytes | None:
    if points.empty:
        return None
    rows = points.assign(config=points["engine"] + " " + points["method"] + " k=" + points["k"].astype(str))
    grid = rows.pivot_table(index="config", columns="request_rate", values="speedup_median_tpot", aggfunc="median")
    if grid.empty:
        return None
    fig, ax = _figure((1.4 * len(grid.columns) + 3, 0.7 * len(grid.index) + 2))
    values = grid.to_numpy(dtype=float)
    image = ax.imshow(values, cmap="RdYlGn", vmin=0.5, vmax=1.5, aspect="auto")
    ax.set_xticks(range(len(grid.columns)), [f"{c:g}" for c in grid.columns])
    ax.set_yticks(range(len(grid.index)), [str(i) for i in grid.index])
    verdict = "speedup_median_tpot_verdict" if "speedup_median_tpot_verdict" in rows else "verdict"
    labels = rows.pivot_table(index="config", columns="request_rate", values=verdict, aggfunc="first")
    for (i, j), value in pd.DataFrame(values).stack().items():
        if math.isfinite(value):
            label = labels.iloc[i, j] if verdict in rows else ""
            # Inconclusive cells are hatched and say so: their colour is not a finding.
            resolved = label in ("helps", "hurts")
            if not resolved:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", edgecolor="grey"))
            ax.text(j, i, f"{value:.2f}x" + ("" if resolved else "\n?"), ha="center", va="center", fontsize=9)
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("configuration")
    ax.set_title("Median-TPOT speedup (green > 1; hatched '?': inconclusive)")
    fig.colorbar(image, ax=ax)
    return _png(fig)


def gate_trend(label: str, series: dict[str, list[tuple[float, float]]], reference: dict[str, float]) -> bytes:
    """One point's gated metrics across the sweep's runs (x: run start, the last is this run),
    each against its reference (dashed), as a change from the reference in percent."""
    import datetime as dt

    fig, ax = _figure((6.4, 3.4))
    for metric, points in series.items():
        ref = reference.get(metric)
        if not points or not ref:
            continue
        times = [dt.datetime.fromtimestamp(t / 1000) for t, _ in points]
        change = [100 * (v / ref - 1) for _, v in points]
        (line,) = ax.plot(times, change, marker="o", label=metric)
        ax.plot(times[-1:], change[-1:], marker="o", markersize=10, color=line.get_color(), fillstyle="none")
    ax.axhline(0, color="grey", linestyle="--", linewidth=1)
    fig.autofmt_xdate()
    return _chart(fig, ax, "sweep run", "change from the reference (%)", f"Since the reference: {label}")


def capacity_curve(curves: list) -> bytes | None:
    """search=capacity: each server's probes, the SLO metric's percentile against the rate
    (filled: met, cross: missed), and where each search put the boundary (dotted)."""
    if not curves:
        return None
    fig, ax = _figure((7, 4))
    for curve in curves:
        rates = [r for r, _, _ in curve.probes]
        values = [v for _, v, _ in curve.probes]
        (line,) = ax.plot(
            rates,
            values,
            label=f"{curve.label}: {curve.boundary.text}",
            alpha=0.6,
            **({"color": "black", "linestyle": "--"} if curve.role == "baseline" else {}),
        )
        for rate, value, met in curve.probes:
            ax.plot([rate], [value], marker="o" if met else "x", color=line.get_color(), markersize=7)
        if curve.boundary.estimate is not None:
            ax.axvline(curve.boundary.estimate, color=line.get_color(), linestyle=":", linewidth=1)
    ax.set_xscale("log")
    return _chart(
        fig,
        ax,
        "request rate (req/s, log scale)",
        "the SLO metric at its percentile (ms)",
        "Capacity under the SLO: probes (o met, x missed) and boundaries",
    )


def k_curve(table: pd.DataFrame | None) -> bytes | None:
    """search=predict: median TPOT against k per rate; measured points filled, predicted
    points hollow, each with its interval."""
    if table is None or table.empty:
        return None
    fig, ax = _figure((7, 4))
    for (curve, rate), group in table.groupby(["curve", "request_rate"], sort=True):
        group = group.sort_values("k")
        seen = group.dropna(subset=["measured_tpot_ms"]) if "measured_tpot_ms" in group else group.iloc[0:0]
        guess = newest_predictions(group)
        column = "tpot"
        bars = ax.errorbar(
            seen["k"],
            seen["measured_tpot_ms"],
            marker="o",
            capsize=3,
            linestyle="none",
            yerr=[
                seen["measured_tpot_ms"] - seen["measured_tpot_ms_low"],
                seen["measured_tpot_ms_high"] - seen["measured_tpot_ms"],
            ],
            label=f"{curve} @ {rate:g}/s measured",
        )
        colour = bars[0].get_color()
        if not guess.empty:
            ax.errorbar(
                guess["k"] + 0.06,
                guess[column],
                marker="o",
                markerfacecolor="none",
                capsize=3,
                color=colour,
                linestyle="none",
                yerr=[guess[column] - guess[f"{column}_low"], guess[f"{column}_high"] - guess[column]],
                label=f"{curve} @ {rate:g}/s predicted",
            )
    return _chart(fig, ax, "k (draft tokens per step)", "median TPOT (ms)", "Median TPOT against k (hollow: predicted)")


def trace_timeline(table: pd.DataFrame | None) -> bytes | None:
    """A trace replay over its own time: the offered load per stretch (above) and each
    stretch's median-TPOT speedup with its interval (below), per speculative point."""
    if table is None or table.empty:
        return None
    fig = Figure(figsize=(7, 5.5))
    load, speed = fig.subplots(2, 1, sharex=True, height_ratios=[1, 2])
    for (config, rate), group in table.groupby(["config", "request_rate"], sort=True):
        group = group.sort_values("start_s")
        middle = (group["start_s"] + group["end_s"]) / 2
        width = float((group["end_s"] - group["start_s"]).iloc[0])
        label = f"{config} @ {rate:g}/s"
        load.step(group["start_s"], group["offered_rate"], where="post", label=label)
        estimate = group["speedup_median_tpot"].astype(float)
        low = (estimate - group["speedup_median_tpot_low"].astype(float)).fillna(0)
        high = (group["speedup_median_tpot_high"].astype(float) - estimate).fillna(0)
        speed.errorbar(
            middle, estimate, yerr=[low, high], xerr=width / 2, marker="o", capsize=3, linestyle="none", label=label
        )
    load.set_ylabel("offered (req/s)")
    load.grid(alpha=0.3)
    speed.axhline(1.0, color="black", linewidth=1)
    return _chart(
        fig,
        speed,
        "seconds into the replay",
        "median-TPOT speedup (> 1: faster)",
        "Speedup over the trace, stretch by stretch, with its interval",
    )
