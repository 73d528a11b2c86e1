"""The report's figures as specifications: what each one shows, built once from the report's data.

A specification is plain data (frozen dataclasses): series of points with their intervals,
tooltips and MLflow runs, or a heat map's cells. Two renderers draw the same specification:
:mod:`pipeline.analysis.plots` as a PNG (matplotlib, for the Markdown report and the gate) and
:mod:`pipeline.analysis.iplots` as a Plotly figure (the HTML page and MLflow's artifact viewer).
A figure is keyed by :class:`FigureKey`, never by its title. This is how Vega-Lite and
plotnine separate a chart's grammar from its backend.

Pure computation (pandas); no plotting library is imported here.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum

import pandas as pd

from pipeline.analysis.categories import GroupComparisons
from pipeline.analysis.decisions import DECIDED
from pipeline.analysis.drafter_map import DrafterMap, drafter_heatmap_parts
from pipeline.analysis.markdown import ReportData
from pipeline.analysis.search_report import CapacityCurve, newest_predictions
from pipeline.analysis.timeline import TIMELINE_FIGURE
from pipeline.analysis.verdicts import Comparisons, config_label, measured


class FigureKey(Enum):
    """Every figure the report can draw; the value is its name in the report, PNG and Plotly alike."""

    THROUGHPUT_MEDIAN_TPOT = "Output throughput against median TPOT"
    THROUGHPUT_P99_TPOT = "Output throughput against p99 TPOT"
    SPEEDUP_VS_RATE = "Median-TPOT speedup against request rate"
    TTFT_VS_RATE = "TTFT against request rate"
    ACCEPTANCE_VS_K = "Acceptance against k"
    SPEEDUP_HEATMAP = "Median-TPOT speedup over k x request rate"
    DRAFTER_MAP = "Median-TPOT speedup over synthetic acceptance length L x request rate"
    CAPACITY = "Capacity under the SLO"
    K_CURVE = "Median TPOT against k: measured and predicted"
    TIMELINE = TIMELINE_FIGURE
    GATE_TREND = "Since the reference"


@dataclass(frozen=True)
class FigureId:
    """One drawn figure of the report: its key, and which one where a key is drawn once per
    point (the gate's trend charts, ``part`` naming the point's chart)."""

    key: FigureKey
    part: str = ""

    @property
    def title(self) -> str:
        """Its name where the report is written out: "Since the reference (trend1)"."""
        return f"{self.key.value} ({self.part})" if self.part else self.key.value


class Look(Enum):
    """How a series is drawn; both renderers map each look to their own style."""

    LINE = "line"  # lines and markers
    BASELINE = "baseline"  # dashed black, the configuration everything is compared against
    MARKERS = "markers"  # markers only (measured points with intervals)
    HOLLOW = "hollow"  # hollow markers only (predicted, not measured)
    FRONTIER = "frontier"  # a faint step line through the Pareto frontier
    STEP = "step"  # a step line (offered load per stretch)


@dataclass(frozen=True)
class Mark:
    x: float
    y: float
    hover: str = ""  # the tooltip's value line (Plotly); the PNG does not show it
    runs: str = ""  # the MLflow run ids behind the point, space-separated ("": none, e.g. predicted)
    label: str = ""  # an annotation drawn next to the point on both renderers
    x_err: tuple[float, float] | None = None  # (low, high) bounds of an interval on x
    y_err: tuple[float, float] | None = None
    missed: bool = False  # capacity probes: drawn as a cross (the SLO missed), not a circle
    name: str = ""  # the configuration the tooltip names (the series' name where empty)
    rate: float | None = None  # the request rate the tooltip names


@dataclass(frozen=True)
class Series:
    name: str
    points: tuple[Mark, ...]
    look: Look = Look.LINE
    group: str = ""  # series of one group share a colour (a curve's measured and predicted points)
    panel: int = 0  # 0: the main axes; 1: the upper panel, where the chart has one
    boundary: float | None = None  # a vertical line in the series' colour (a capacity boundary)


@dataclass(frozen=True)
class Chart:
    key: FigureKey
    title: str
    x_label: str
    y_label: str
    series: tuple[Series, ...]
    hlines: tuple[float, ...] = ()
    log_x: bool = False
    time_x: bool = False  # x holds epoch milliseconds, drawn as dates
    upper_label: str = ""  # the upper panel's y label; "" for a single panel
    size: tuple[float, float] = (7, 4)  # inches on the PNG


@dataclass(frozen=True)
class Cell:
    value: float
    text: str  # drawn in the cell
    resolved: bool  # False: the interval cannot tell the sign, so the colour is no finding (hatched)
    hover: str = ""
    runs: str = ""


@dataclass(frozen=True)
class Overlay:
    """A line, or markers, drawn over a heat map in its cells' coordinates: (column, row), with
    fractions between cells (a break-even contour; real drafters placed on a drafter map)."""

    name: str
    points: tuple[tuple[float, float], ...]
    line: bool = True  # False: markers only
    labels: tuple[str, ...] = ()  # one per point, drawn beside it ("" for none)


@dataclass(frozen=True)
class Heatmap:
    key: FigureKey
    title: str
    x_label: str
    y_label: str
    columns: tuple[str, ...]
    rows: tuple[str, ...]
    cells: tuple[tuple[Cell | None, ...], ...]  # rows x columns; None: nothing measured there
    low: float = 0.5  # the colour scale's ends
    high: float = 1.5
    notes: tuple[tuple[int, int, str], ...] = field(default=())  # (row, column, tooltip) of empty cells
    overlays: tuple[Overlay, ...] = ()


Figure = Chart | Heatmap


def interval_text(value: float, low: object, high: object, fmt: str, unit: str = "") -> str:
    if _finite_not_bool(low) and _finite_not_bool(high):
        return f"{value:{fmt}}{unit} [{float(low):{fmt}}, {float(high):{fmt}}]"  # type: ignore[arg-type]
    return f"{value:{fmt}}{unit} (no interval: a summary of the window only)"


def _finite_not_bool(value: object) -> bool:
    """:func:`~pipeline.analysis.samples.finite_number`, less a bool: a flag is no value to draw."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _finite_interval(low: object, high: object) -> tuple[float, float] | None:
    return (float(low), float(high)) if _finite_not_bool(low) and _finite_not_bool(high) else None  # type: ignore[arg-type]


def _look(row: pd.Series) -> Look:
    return Look.BASELINE if row.get("role") == "baseline" else Look.LINE


def pareto_mask(x: Sequence[float], y: Sequence[float]) -> list[bool]:
    """Points not dominated by another with lower-or-equal x and higher-or-equal y."""
    return [
        not any((x2 <= x1 and y2 >= y1) and (x2 < x1 or y2 > y1) for x2, y2 in zip(x, y, strict=True))
        for x1, y1 in zip(x, y, strict=True)
    ]


def _configurations(frame: pd.DataFrame) -> Iterator[pd.DataFrame]:
    """One measured configuration's rows at a time, in a stable order."""
    for _, curve in measured(frame).groupby(["engine", "role", "method", "k"], sort=True):
        yield curve


def _median_over_runs(curve: pd.DataFrame, column: str) -> Iterator[tuple[float, pd.DataFrame, float, str]]:
    """Per rate of one configuration: its runs, the column's median over them and their range."""
    for rate, at in curve.groupby("request_rate", sort=True):
        spread = f" (runs {at[column].min():.1f} to {at[column].max():.1f})" if len(at) > 1 else ""
        yield float(rate), at, float(at[column].median()), spread


def _runs(at: pd.DataFrame) -> str:
    return " ".join(at["run_id"].astype(str)) if "run_id" in at else ""


def _frontier(series: Sequence[Series]) -> Series:
    xs = [p.x for s in series for p in s.points]
    ys = [p.y for s in series for p in s.points]
    front = sorted((x, y) for x, y, keep in zip(xs, ys, pareto_mask(xs, ys), strict=True) if keep)
    return Series("Pareto frontier", tuple(Mark(x, y) for x, y in front), Look.FRONTIER)


def throughput_vs_tpot(
    frame: pd.DataFrame, levels: pd.DataFrame | None = None, tpot: str = "median_tpot_ms"
) -> Chart | None:
    """Throughput against per-token latency, a curve per configuration across rates. For the
    median, each point is the point's own level with its interval (``levels``); for p99, or
    without levels, the median over the point's runs."""
    use_levels = tpot == "median_tpot_ms" and levels is not None and not levels.empty and tpot in levels
    source = levels if use_levels else measured(frame)
    if source is None or tpot not in source or "output_throughput" not in source:
        return None
    source = source.dropna(subset=[tpot, "output_throughput"])
    if source.empty:
        return None
    series = []
    keys = ["role", "engine", "method", "k"] + (["setting_key"] if "setting_key" in source else [])
    for _, curve in source.groupby(keys, sort=True, dropna=False):
        points = []
        for rate, at in curve.groupby("request_rate", sort=True):
            row = at.iloc[0]
            x, y = float(at[tpot].median()), float(at["output_throughput"].median())
            bounds = _finite_interval(row.get(f"{tpot}_low"), row.get(f"{tpot}_high")) if use_levels else None
            value = interval_text(x, *(bounds or (None, None)), ".1f", " ms") if use_levels else f"{x:.1f} ms"
            runs = str(row.get("run_ids", "")) if use_levels else _runs(at)
            points.append(
                Mark(
                    x,
                    y,
                    f"{tpot.split('_')[0]} TPOT {value}<br>throughput {y:.1f} tok/s",
                    runs,
                    f"{float(rate):g}/s",
                    x_err=bounds,
                    name=config_label(row),
                    rate=float(rate),
                )
            )
        series.append(Series(config_label(curve.iloc[0]), tuple(points), _look(curve.iloc[0])))
    which = "median" if tpot == "median_tpot_ms" else "p99"
    return Chart(
        FigureKey.THROUGHPUT_MEDIAN_TPOT if which == "median" else FigureKey.THROUGHPUT_P99_TPOT,
        f"Throughput against {which} TPOT, across request rates",
        f"{which} TPOT, ms (lower is better)",
        "output throughput, tok/s (higher is better)",
        (*series, _frontier(series)),
        size=(7, 4.5),
    )


def _speedup_point(row: pd.Series, x: float, verdict: str) -> Mark:
    value = float(row["speedup_median_tpot"])
    text = interval_text(value, row.get("speedup_median_tpot_low"), row.get("speedup_median_tpot_high"), ".2f", "x")
    return Mark(
        x,
        value,
        f"median-TPOT speedup {text}: {verdict}",
        str(row.get("run_ids", "") or ""),
        y_err=_finite_interval(row.get("speedup_median_tpot_low"), row.get("speedup_median_tpot_high")),
        name=config_label(row),
        rate=float(row["request_rate"]),
    )


def speedup_vs_rate(comparisons: Comparisons | None) -> Chart | None:
    """Median-TPOT speedup per configuration against load, each with its interval and verdict."""
    if comparisons is None or comparisons.table.empty or "speedup_median_tpot_low" not in comparisons.table:
        return None
    points = comparisons.table
    # A point whose window was too small for a ratio has no estimate: nothing to draw.
    estimated = pd.to_numeric(points["speedup_median_tpot"], errors="coerce").notna()
    finite = points[points["request_rate"].apply(math.isfinite) & estimated]
    verdict = comparisons.labels(finite)
    series = tuple(
        Series(
            config_label(group.iloc[0]),
            tuple(
                _speedup_point(row, float(row["request_rate"]), verdict[i])
                for i, row in group.sort_values("request_rate").iterrows()
            ),
        )
        for _, group in finite.groupby(["engine", "method", "k"], sort=True)
    )
    return Chart(
        FigureKey.SPEEDUP_VS_RATE,
        "Median-TPOT speedup with its interval, against load",
        "request rate (req/s)",
        "median-TPOT speedup (> 1: speculation faster)",
        series,
        hlines=(1.0,),
    )


def ttft_vs_rate(frame: pd.DataFrame) -> Chart | None:
    if "median_ttft_ms" not in frame or measured(frame).dropna(subset=["median_ttft_ms"]).empty:
        return None
    series = []
    for curve in _configurations(frame.dropna(subset=["median_ttft_ms"])):
        points = tuple(
            Mark(
                rate, value, f"median TTFT {value:.1f} ms{spread}", _runs(at), name=config_label(at.iloc[0]), rate=rate
            )
            for rate, at, value, spread in _median_over_runs(curve, "median_ttft_ms")
        )
        series.append(Series(config_label(curve.iloc[0]), points, _look(curve.iloc[0])))
    return Chart(
        FigureKey.TTFT_VS_RATE,
        "Time to first token against load",
        "request rate (req/s)",
        "median TTFT (ms)",
        tuple(series),
    )


def acceptance_vs_k(points: pd.DataFrame) -> Chart | None:
    if points.empty or "acceptance_length" not in points or points["acceptance_length"].isna().all():
        return None
    series = []
    for (engine, method, rate), group in points.groupby(["engine", "method", "request_rate"], sort=True):
        group = group.sort_values("k").dropna(subset=["acceptance_length"])
        made = tuple(
            Mark(
                float(row["k"]),
                float(row["acceptance_length"]),
                f"acceptance length L {row.get('acceptance_length_text', '')}",
                str(row.get("run_ids", "") or ""),
                name=config_label(row),
                rate=float(rate),
            )
            for _, row in group.iterrows()
        )
        series.append(Series(f"{engine} {method} @ {rate:g}/s", made))
    return Chart(
        FigureKey.ACCEPTANCE_VS_K,
        "Acceptance against k",
        "k (draft tokens per step)",
        "acceptance length L (tokens per step)",
        tuple(series),
    )


def speedup_heatmap(comparisons: Comparisons | None) -> Heatmap | None:
    """Median-TPOT speedup per configuration and rate; an inconclusive cell says so."""
    if comparisons is None or comparisons.table.empty or "speedup_median_tpot" not in comparisons.table:
        return None
    points = comparisons.table
    rows = points.assign(config=[config_label(r) for _, r in points.iterrows()])
    configs, rates = sorted(rows["config"].unique()), sorted(rows["request_rate"].unique())
    cells: list[list[Cell | None]] = [[None] * len(rates) for _ in configs]
    notes = []
    labels = comparisons.labels(rows)
    for index, row in rows.iterrows():
        i, j = configs.index(row["config"]), rates.index(row["request_rate"])
        verdict = labels[index]
        if pd.isna(row["speedup_median_tpot"]):  # too few requests for a ratio: an empty cell that says why
            notes.append((i, j, f"no ratio: {verdict}"))
            continue
        value = float(row["speedup_median_tpot"])
        resolved = verdict in DECIDED
        text = interval_text(value, row.get("speedup_median_tpot_low"), row.get("speedup_median_tpot_high"), ".2f", "x")
        cells[i][j] = Cell(
            value,
            f"{value:.2f}x" + ("" if resolved else " ?"),
            resolved,
            f"median-TPOT speedup {text}: {verdict}",
            str(row.get("run_ids", "") or ""),
        )
    if all(c is None for line in cells for c in line):
        return None
    return Heatmap(
        FigureKey.SPEEDUP_HEATMAP,
        "Median-TPOT speedup (green > 1; hatched ?: inconclusive)",
        "request rate (req/s)",
        "configuration",
        tuple(f"{r:g}" for r in rates),
        tuple(configs),
        tuple(tuple(line) for line in cells),
        notes=tuple(notes),
    )


def drafter_heatmap(found: DrafterMap | None) -> Heatmap | None:
    """search=drafter_needed: speedup per (proposer, k, L) row and rate column, the break-even
    contour drawn over it (dashed), and each real drafter at its measured L (a marker)."""
    if found is None:
        return None
    parts = drafter_heatmap_parts(found)
    cells = tuple(
        tuple(
            None
            if p is None
            else Cell(
                float(p.speedup.ratio.estimate),  # type: ignore[arg-type]
                f"{p.speedup.ratio.estimate:.2f}x" + ("" if p.speedup.label in DECIDED else " ?"),
                p.speedup.label in DECIDED,
                f"{p.point}: synthetic acceptance L={p.told:g}, median-TPOT speedup {p.speedup.ratio.text}: "
                f"{p.speedup.label}",
                p.runs,
            )
            for p in line
        )
        for line in parts.cells
    )
    if all(c is None for line in cells for c in line):
        return None
    overlays = tuple(Overlay(name, points, line, labels) for name, points, line, labels in parts.overlays)
    return Heatmap(
        FigureKey.DRAFTER_MAP,
        "Speedup over synthetic acceptance L\n(dashed: break-even; markers: real drafters)",
        "request rate (req/s)",
        "proposer, k, synthetic L",
        parts.columns,
        parts.rows,
        cells,
        overlays=overlays,
    )


def capacity_curve(curves: Sequence[CapacityCurve]) -> Chart | None:
    """search=capacity: each server's probes, the SLO metric's percentile against the rate
    (circle: met, cross: missed), and where each search put the boundary (dotted)."""
    if not curves:
        return None
    series = []
    for curve in curves:
        runs = curve.run_ids or ("",) * len(curve.probes)
        points = tuple(
            Mark(
                rate,
                value,
                f"the SLO metric at its percentile {value:.0f} ms: {'met' if met else 'missed'}"
                f"<br>boundary {curve.boundary.text}",
                run,
                missed=not met,
                name=curve.label,
                rate=rate,
            )
            for (rate, value, met), run in zip(curve.probes, runs, strict=True)
        )
        look = Look.BASELINE if curve.role == "baseline" else Look.LINE
        series.append(Series(f"{curve.label}: {curve.boundary.text}", points, look, boundary=curve.boundary.estimate))
    return Chart(
        FigureKey.CAPACITY,
        "Capacity under the SLO: probes (o met, x missed) and boundaries",
        "request rate (req/s, log scale)",
        "the SLO metric at its percentile (ms)",
        tuple(series),
        log_x=True,
    )


def _runs_by_setting(frame: pd.DataFrame) -> dict[tuple[str, int, float], str]:
    """(setting, k, rate) -> the run ids that measured it, for the k curve's measured points."""
    if frame.empty or "setting_key" not in frame:
        return {}
    rows = measured(frame, "speculative")
    return {(str(s), int(k), float(r)): _runs(g) for (s, k, r), g in rows.groupby(["setting_key", "k", "request_rate"])}


def k_curve(table: pd.DataFrame | None, frame: pd.DataFrame) -> Chart | None:
    """search=predict: median TPOT against k per rate; measured points filled, predicted
    points hollow (and a little to the right), each with its interval."""
    if table is None or table.empty:
        return None
    runs = _runs_by_setting(frame)
    series = []
    for (curve, rate), group in table.groupby(["curve", "request_rate"], sort=True):
        group = group.sort_values("k")
        seen = group.dropna(subset=["measured_tpot_ms"]) if "measured_tpot_ms" in group else group.iloc[0:0]
        name = f"{curve} @ {rate:g}/s"
        measured_points = tuple(
            Mark(
                float(row["k"]),
                float(row["measured_tpot_ms"]),
                "measured median TPOT "
                + interval_text(
                    row["measured_tpot_ms"], row["measured_tpot_ms_low"], row["measured_tpot_ms_high"], ".1f", " ms"
                ),
                runs.get((str(row.get("setting_key", "")), int(row["k"]), float(rate)), ""),
                y_err=_finite_interval(row["measured_tpot_ms_low"], row["measured_tpot_ms_high"]),
                name=f"{curve} k={int(row['k'])}",
                rate=float(rate),
            )
            for _, row in seen.iterrows()
        )
        series.append(Series(f"{name} measured", measured_points, Look.MARKERS, group=name))
        guess = newest_predictions(group)
        if not guess.empty:
            predicted = tuple(
                Mark(
                    float(row.k) + 0.06,
                    float(row.tpot),
                    "predicted median TPOT " + interval_text(row.tpot, row.tpot_low, row.tpot_high, ".1f", " ms"),
                    y_err=_finite_interval(row.tpot_low, row.tpot_high),
                    name=f"{curve} k={int(row.k)}",
                    rate=float(rate),
                )
                for row in guess.itertuples()
            )
            series.append(Series(f"{name} predicted", predicted, Look.HOLLOW, group=name))
    return Chart(
        FigureKey.K_CURVE,
        "Median TPOT against k (hollow: predicted)",
        "k (draft tokens per step)",
        "median TPOT (ms)",
        tuple(series),
    )


def trace_timeline(stretches: GroupComparisons | None) -> Chart | None:
    """A trace replay over its own time: the offered load per stretch (upper panel) and each
    stretch's median-TPOT speedup with its interval, per speculative point."""
    if stretches is None or stretches.empty:
        return None
    series = []
    for (config, rate), group in stretches.table.groupby(["config", "request_rate"], sort=True):
        group = group.sort_values("start_s")
        name = f"{config} @ {rate:g}/s"
        hovers = [
            f"{r.bucket}: {r.offered_rate:.2f} req/s offered, {r.in_flight:.1f} in flight"
            f"<br>median-TPOT speedup {d.ratio.text}: {d.label}"
            for r, d in ((r, stretches.decision(r)) for r in group.itertuples(index=False))
        ]
        middles = ((group["start_s"] + group["end_s"]) / 2).tolist()
        load = tuple(
            Mark(float(m), float(r), h) for m, r, h in zip(middles, group["offered_rate"], hovers, strict=True)
        )
        speed = tuple(
            Mark(
                float(m),
                float(r.speedup_median_tpot),
                h,
                y_err=_finite_interval(float(r.speedup_median_tpot_low), float(r.speedup_median_tpot_high)),
            )
            for m, r, h in zip(middles, group.itertuples(index=False), hovers, strict=True)
        )
        series += [
            Series(f"{name} load", load, Look.STEP, group=name, panel=1),
            Series(name, speed, Look.MARKERS, group=name),
        ]
    return Chart(
        FigureKey.TIMELINE,
        "Speedup over the trace, stretch by stretch, with its interval",
        "seconds into the replay",
        "median-TPOT speedup (> 1: faster)",
        tuple(series),
        hlines=(1.0,),
        upper_label="offered (req/s)",
        size=(7, 5.5),
    )


def gate_trend(label: str, series: dict[str, list[tuple[float, float]]], reference: dict[str, float]) -> Chart:
    """One point's gated metrics across the sweep's runs (x: run start in epoch ms, the last is
    this run), each as its change from its reference in percent."""
    lines = []
    for metric, points in series.items():
        ref = reference.get(metric)
        if not points or not ref:
            continue
        made = [Mark(t, 100 * (v / ref - 1), _when_label(t)) for t, v in points]
        made[-1] = Mark(made[-1].x, made[-1].y, made[-1].hover, label="this run")
        lines.append(Series(metric, tuple(made)))
    return Chart(
        FigureKey.GATE_TREND,
        f"Since the reference: {label}",
        "sweep run",
        "change from the reference (%)",
        tuple(lines),
        hlines=(0.0,),
        time_x=True,
        size=(6.4, 3.4),
    )


def _when_label(epoch_ms: float) -> str:
    """A mark's label, to the minute; the Plotly renderer's axis takes ISO times (iplots._when_iso)."""
    return dt.datetime.fromtimestamp(epoch_ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def report_figures(data: ReportData) -> dict[FigureKey, Figure]:
    """Every figure the report's data can draw, in the report's order; figures with nothing
    to show are left out."""
    made = (
        throughput_vs_tpot(data.frame, data.levels),
        throughput_vs_tpot(data.frame, tpot="p99_tpot_ms"),
        speedup_vs_rate(data.comparisons),
        ttft_vs_rate(data.frame),
        acceptance_vs_k(data.points),
        speedup_heatmap(data.comparisons),
        capacity_curve(data.capacity),
        k_curve(data.predictions, data.frame),
        trace_timeline(data.over_time),
        drafter_heatmap(data.drafters),
    )
    return {figure.key: figure for figure in made if figure is not None}
