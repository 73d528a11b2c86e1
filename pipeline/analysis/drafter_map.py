"""The drafter you would need: a sweep's synthetic-acceptance points as a map of speedup over
acceptance length L x load, per proposer and k, and every real drafter of the sweep placed on it.

Per proposer, k and request rate: the speedup at each synthetic L (paired with the baseline as
every other ratio is), the break-even L with its interval (:mod:`pipeline.analysis.breakeven`),
the ceiling (the speedup at L = k+1, every draft accepted: the most any drafter with this
proposer's cost can give), whether the engine produced the L it was told (its counters, with an
interval), and Leviathan's formula fitted to the surface. A real drafter's point is placed at its
measured L on the map of its engine, k and load; the words say whether it pays, by how much, and
how much better a drafter must be to pay. Synthetic points are kept out of the rest of the report:
they are no drafter's own numbers, and losslessness is not claimed for them.

Pure computation: the sweep table and each window's requests in, a :class:`DrafterMap` out.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from pipeline.analysis import breakeven, stats
from pipeline.analysis.advisor import Advice
from pipeline.analysis.breakeven import BreakEven, ModelFit, break_even, leviathan_fit
from pipeline.analysis.decisions import Decision, decide
from pipeline.analysis.samples import Sample, StatsOptions, finite_number
from pipeline.analysis.stats import Ratio
from pipeline.analysis.verdicts import TPOT, measured
from pipeline.engines.acceptance import alpha_from_length

LENGTH = "synthetic_length"  # the sweep table's column: the L the engine was told (empty: a real drafter)
ALPHA_RULES = ("α <", "α >")  # the tutorial's fixed thresholds (advisor.LOW_ALPHA, HIGH_ALPHA), which a map replaces


def synthetic_rows(frame: pd.DataFrame) -> pd.Series:
    """Which rows of the sweep table are synthetic-acceptance points."""
    if LENGTH not in frame:
        return pd.Series(False, index=frame.index)
    return pd.to_numeric(frame[LENGTH], errors="coerce").notna()


def without_synthetic(frame: pd.DataFrame) -> pd.DataFrame:
    """The sweep table less its synthetic points: what the rest of the report reads."""
    return frame[~synthetic_rows(frame)]


@dataclass(frozen=True)
class MapPoint:
    """One synthetic point: the L asked for, the L its counters measured, its speedup."""

    told: float
    measured: Ratio  # the acceptance length, the counters' figure with its interval
    k_effective: float  # drafted tokens per step: k where the proposer drafts every position
    speedup: Decision
    point: str  # the point's name in the sweep
    runs: str

    @property
    def holds(self) -> bool | None:
        """The engine accepted what it was told: the L asked for lies in the measured L's
        interval. None where there is no interval."""
        if not self.measured.resolved:
            return None
        slack = 1e-9 * self.told  # a zero-width interval at an integer L, computed through logs
        return self.measured.low - slack <= self.told <= self.measured.high + slack  # type: ignore[operator]


@dataclass(frozen=True)
class Curve:
    """One proposer, k and load: the speedup at each synthetic L, and what it comes to."""

    engine: str
    method: str
    k: int
    rate: float
    map_key: str
    baselines: frozenset[str]  # the baseline points it was compared with (what a real drafter shares)
    points: tuple[MapPoint, ...]  # by L
    break_even: BreakEven
    fit: ModelFit | None

    @property
    def name(self) -> str:
        return f"{self.engine} {self.method} k={self.k}"

    @property
    def ceiling(self) -> MapPoint | None:
        """The point at L = k+1 (every draft accepted), where one was measured."""
        top = [p for p in self.points if abs(p.told - (self.k + 1)) < 1e-9]
        return top[0] if top else None


@dataclass(frozen=True)
class Placement:
    """A real drafter's point at its measured L on a curve of its engine, k and load."""

    name: str  # "vllm ngram k=3"
    method: str
    rate: float
    length: Ratio  # its acceptance length with its interval
    speedup: Decision | None  # its own measured speedup, for the reader to compare
    curve: Curve
    same_proposer: bool  # measured on its own proposer's map (the same drafting cost)

    @property
    def reading(self) -> str:
        """pays with room | falls short | at the break-even (the intervals overlap) | not resolved.
        Read off the break-even's interval, which has ends where its estimate has none (a curve
        that never reaches 1 + floor within the L measured still says how high L must at least go)."""
        be, have = self.curve.break_even, self.length
        if be.low is None or be.high is None or not have.resolved:
            return "not resolved"
        if math.isfinite(be.high) and have.low > be.high:  # type: ignore[operator]
            return "pays with room"
        if have.high < be.low:  # type: ignore[operator]
            return "falls short"
        return "at the break-even"


@dataclass(frozen=True)
class DrafterMap:
    curves: tuple[Curve, ...]
    placements: tuple[Placement, ...]
    floor: float


def drafter_map(frame: pd.DataFrame, samples: Mapping[str, Sample], opts: StatsOptions) -> DrafterMap | None:
    """The map of a sweep's synthetic points, or None where it has none (or none with a baseline)."""
    rows = measured(frame)
    synthetic = rows[synthetic_rows(rows) & (rows["role"] == "speculative")]
    if synthetic.empty:
        return None
    base = measured(frame, "baseline").set_index("point_hash")
    keys = ["engine", "method", "k", "request_rate"] + (["map_key"] if "map_key" in synthetic else [])
    built = []
    for i, (_, group) in enumerate(synthetic.groupby(keys, sort=True)):
        curve = _curve(i, group, base, samples, opts)
        if curve is not None:
            built.append(curve)
    if not built:
        return None
    curves = _decided(built, opts)
    real = rows[~synthetic_rows(rows) & (rows["role"] == "speculative")]
    return DrafterMap(tuple(curves), tuple(_placements(real, base, curves, samples, opts)), opts.floor)


def _windows(group: pd.DataFrame, base: pd.DataFrame, samples: Mapping[str, Sample]) -> tuple[list, list, list]:
    """Each run of a point with its baseline's run (the same repeat): their windows and rows."""
    pairs = [
        (base.loc[row["baseline_hash"]], row)
        for _, row in group.sort_values("repeat" if "repeat" in group else "point").iterrows()
        if row.get("baseline_hash") in base.index
    ]
    return (
        [samples.get(str(b["run_id"])) for b, _ in pairs],
        [samples.get(str(s["run_id"])) for _, s in pairs],
        pairs,
    )


def _curve(
    index: int, group: pd.DataFrame, base: pd.DataFrame, samples: Mapping[str, Sample], opts: StatsOptions
) -> Curve | None:
    first = group.iloc[0]
    points, lengths, ratios, baselines = [], [], [], set()
    within, shared = dataclasses.replace(opts, server_spread=None), True
    for told, at in group.groupby(LENGTH, sort=True):
        base_s, spec_s, pairs = _windows(at, base, samples)
        if not pairs or any(w is None for w in base_s + spec_s):
            continue
        restarted = "server" in at and len(pairs) >= 2 and at["server"].nunique() == len(pairs)
        shared = shared and not restarted
        # One bootstrap seed per curve: its points share the baseline's windows, so resampling the
        # same prompts for each L keeps that shared noise common to the whole curve. The spread
        # between server starts is added below, to the curve as a whole.
        rng = np.random.default_rng([opts.seed, 44, index])
        ratio = stats.paired_ratio(TPOT, base_s, spec_s, within, rng)  # type: ignore[arg-type]
        counter = _median_of(at, "acceptance_length")
        length = _length_interval(spec_s, counter, opts)  # type: ignore[arg-type]
        k_eff = _median_of(at, "acceptance_k_effective")
        runs = " ".join(str(r) for r in at["run_id"])
        points.append((float(told), length, k_eff if k_eff is not None else float(first["k"]), ratio, at, runs))
        lengths.append(float(told))
        ratios.append(ratio)
        baselines |= {str(b.name) for b, _ in pairs}
    if not points:
        return None
    if shared:  # one run each, on servers of their own against one baseline server
        ratios = breakeven.with_shared_baseline_spread(ratios, opts, index)
    made = tuple(
        MapPoint(told, length, k_eff, Decision("", ratio), str(at.iloc[0]["point"]), runs)
        for (told, length, k_eff, _, at, runs), ratio in zip(points, ratios, strict=True)
    )
    k = int(first["k"])
    return Curve(
        str(first["engine"]),
        str(first["method"]),
        k,
        float(first["request_rate"]),
        str(first.get("map_key", "")),
        frozenset(baselines),
        made,
        break_even(lengths, ratios, opts.floor, opts),
        leviathan_fit(lengths, ratios, k),
    )


def _decided(curves: list[Curve], opts: StatsOptions) -> list[Curve]:
    """Every map point's verdict, one Benjamini-Hochberg family over the map."""
    ratios = [p.speedup.ratio for c in curves for p in c.points]
    verdicts = iter(decide(ratios, opts))
    out = []
    for curve in curves:
        points = tuple(
            MapPoint(p.told, p.measured, p.k_effective, next(verdicts), p.point, p.runs) for p in curve.points
        )
        out.append(dataclasses.replace(curve, points=points))
    return out


def _median_of(rows: pd.DataFrame, column: str) -> float | None:
    if column not in rows:
        return None
    values = [float(v) for v in rows[column] if finite_number(v)]
    return float(np.median(values)) if values else None


def _length_interval(windows: Sequence[Sample], counter: float | None, opts: StatsOptions) -> Ratio:
    """The acceptance length over the windows: the engine's counters, with the report's interval."""
    if counter is None:
        return Ratio("acceptance_length", None, note="the engine reported no acceptance")
    return stats.acceptance_length_interval(windows, counter, opts)


def _placements(
    real: pd.DataFrame,
    base: pd.DataFrame,
    curves: Sequence[Curve],
    samples: Mapping[str, Sample],
    opts: StatsOptions,
) -> list[Placement]:
    """Each real drafter's point on the curves of its engine and k measured against its baseline."""
    out = []
    keys = ["engine", "method", "k", "request_rate"] + (["map_key"] if "map_key" in real else [])
    for _, group in real.groupby(keys, sort=True):
        first = group.iloc[0]
        base_s, spec_s, pairs = _windows(group, base, samples)
        shared = {str(b.name) for b, _ in pairs}
        homes = [c for c in curves if c.engine == first["engine"] and c.k == int(first["k"]) and c.baselines & shared]
        counter = _median_of(group, "acceptance_length")
        if not homes or counter is None:
            continue
        complete = bool(pairs) and all(w is not None for w in base_s + spec_s)
        length = _length_interval(spec_s, counter, opts) if complete else Ratio("acceptance_length", counter)  # type: ignore[arg-type]
        speedup = None
        if complete:
            rng = np.random.default_rng([opts.seed, 45, len(out)])
            speedup = decide([stats.paired_ratio(TPOT, base_s, spec_s, opts, rng, shared_servers=True)], opts)[0]  # type: ignore[arg-type]
        name = f"{first['engine']} {first['method']} k={int(first['k'])}"
        for curve in homes:
            same = curve.map_key == str(first.get("map_key", "")) and bool(curve.map_key)
            out.append(
                Placement(name, str(first["method"]), float(first["request_rate"]), length, speedup, curve, same)
            )
    return out


def map_metrics(found: DrafterMap | None) -> dict[str, float]:
    """The map's answers as the sweep's MLflow metrics, one set per proposer, k and load:
    ``drafter.<method>.k<k>.r<rate>.break_even_L`` (with ``_low``, ``_high``; an open upper end
    is left out) and ``.ceiling_speedup`` (at L = k+1)."""
    out: dict[str, float] = {}
    for curve in found.curves if found else ():
        key = f"drafter.{curve.method}.k{curve.k}.r{curve.rate:g}"
        be = curve.break_even
        values = {"break_even_L": be.length, "break_even_L_low": be.low, "break_even_L_high": be.high}
        top = curve.ceiling
        values["ceiling_speedup"] = top.speedup.ratio.estimate if top else None
        out |= {f"{key}.{name}": float(v) for name, v in values.items() if v is not None and math.isfinite(v)}
    return out


# ---- words -----------------------------------------------------------------------------------


def _l_text(ratio: Ratio) -> str:
    if ratio.estimate is None:
        return "—"
    if not ratio.resolved:
        return f"{ratio.estimate:.2f} (no interval)"
    return f"{ratio.estimate:.2f} [{ratio.low:.2f}, {ratio.high:.2f}]"


def _improvement(placement: Placement) -> str:
    """How much better a drafter must be to pay: its L against the break-even (and the upper
    end of the break-even's interval, where a drafter surely pays), in tokens per step and α."""
    be, k = placement.curve.break_even, placement.curve.k
    have = placement.length.estimate
    if have is None or be.low is None:
        return ""
    if be.length is None:  # not reached within the L measured: only a lower bound to quote
        top = placement.curve.ceiling
        ceiling = f"; the ceiling of this proposer's cost (L = {k + 1}) is {top.speedup.ratio.text}" if top else ""
        return f"needs L of {be.low:.2f} at the least (+{be.low - have:.2f} tokens per step){ceiling}"
    need = be.length - have
    sure = be.high - have if be.high is not None and math.isfinite(be.high) else None
    alpha_have, alpha_need = alpha_from_length(min(have, k + 1), k), alpha_from_length(min(be.length, k + 1), k)
    alphas = f", α {alpha_have:.2f} -> {alpha_need:.2f}" if alpha_have is not None and alpha_need is not None else ""
    if need <= 0:
        return f"needs L {sure:+.2f} tokens per step to clear the break-even's interval" if sure and sure > 0 else ""
    surely = f" ({sure:+.2f} to clear its interval)" if sure is not None else ""
    return f"needs L +{need:.2f} tokens per step ({need / have:+.0%}){surely}{alphas}"


def placement_text(p: Placement) -> str:
    """ "vllm ngram k=3: L 3.15 [3.02, 3.27] at 1 req/s, break-even 1.42 [1.31, 1.60]: pays with room"."""
    be = p.curve.break_even
    head = f"{p.name}: L {_l_text(p.length)} at {p.rate:g} req/s, break-even {be.text}"
    reading = p.reading
    if reading == "pays with room" and be.length is not None and p.length.estimate is not None:
        reading += f" (+{p.length.estimate - be.length:.2f} tokens per step)"
    elif reading in ("falls short", "at the break-even"):
        more = _improvement(p)
        reading += f": a drafter {more}" if more else ""
    own = f"; its own measured speedup {p.speedup.ratio.text}: {p.speedup.label}" if p.speedup else ""
    where = "" if p.same_proposer else f" (on the {p.curve.method} map: that proposer's drafting cost)"
    return f"{head}: {reading}{where}{own}"


def told_text(curve: Curve, point: MapPoint) -> str:
    holds = {True: "holds", False: "MISSES", None: "no interval"}[point.holds]
    short = point.k_effective < curve.k - 0.01
    note = f"; the proposer drafted {point.k_effective:.2f} of k={curve.k} tokens a step" if short else ""
    return f"L={point.told:g} told, {_l_text(point.measured)} measured: {holds}{note}"


def _fit_text(curve: Curve) -> str:
    fit = curve.fit
    if fit is None:
        return f"{curve.rate:g} req/s: too few points to fit"
    return (
        f"{curve.rate:g} req/s: c = {fit.c:.3f}, error {fit.rms_log_error:.1%} RMS (worst {fit.worst:.0%}), "
        f"the formula inside {fit.within} of {fit.points} speedup intervals"
    )


def map_lines(found: DrafterMap | None) -> list[str]:
    """The report's section: the map per proposer and k, the real drafters on it, the checks."""
    if found is None:
        return []
    lines = [
        "## The drafter you would need (synthetic acceptance)",
        "",
        "Each point below ran the proposer with vLLM's synthetic acceptance: every draft token accepted with the "
        "probability asked for, whatever was drafted. The cost of speculation is the engine's own; the acceptance "
        "is not any drafter's. These points are kept out of the verdicts above, and losslessness is not claimed "
        "for them (synthetic acceptance changes the output).",
        "",
    ]
    by_config: dict[str, list[Curve]] = {}
    for curve in found.curves:
        by_config.setdefault(f"{curve.name}|{curve.map_key}", []).append(curve)
    for curves in by_config.values():
        lines += _config_lines(curves, found.floor)
    if found.placements:
        lines += ["### Real drafters on the map", ""]
        lines += [f"- {placement_text(p)}" for p in found.placements]
        lines.append("")
    return lines


def _config_lines(curves: list[Curve], floor: float) -> list[str]:
    first = curves[0]
    lengths = sorted({p.told for c in curves for p in c.points})
    lines = [f"### {first.name}: speedup over synthetic acceptance length L x load", ""]
    lines.append("| L | " + " | ".join(f"{c.rate:g} req/s" for c in curves) + " |")
    lines.append("|---|" + "---|" * len(curves))
    for length in lengths:
        cells = []
        for curve in curves:
            found = [p for p in curve.points if p.told == length]
            cells.append(f"{found[0].speedup.ratio.text}: {found[0].speedup.label}" if found else "—")
        lines.append(f"| {length:g} | " + " | ".join(cells) + " |")
    lines += ["", f"- break-even L (median-TPOT speedup reaching 1 + {floor:.0%}), per load:"]
    lines += [f"  - {c.rate:g} req/s: {c.break_even.text}" for c in curves]
    lines.append(f"- ceiling (L = k+1 = {first.k + 1}, every draft accepted: the most any drafter of this cost gives):")
    for c in curves:
        top = c.ceiling
        lines.append(
            f"  - {c.rate:g} req/s: {top.speedup.ratio.text}: {top.speedup.label}"
            if top
            else f"  - {c.rate:g} req/s: not measured"
        )
    lines.append("- the engine accepts what it is told (acceptance length from its counters, with its interval):")
    lines += [f"  - {c.rate:g} req/s, {told_text(c, p)}" for c in curves for p in c.points]
    lines.append("- Leviathan et al.'s S = L / (k c + 1) fitted to the surface, per load:")
    lines += [f"  - {_fit_text(c)}" for c in curves]
    lines.append("")
    return lines


def map_advice(advice: Sequence[Advice], found: DrafterMap | None) -> list[Advice]:
    """The tuning advice with the map read in: where a real drafter was placed on a map, the
    tutorial's fixed acceptance thresholds give way to the break-even measured at its load."""
    if found is None or not found.placements:
        return list(advice)
    placed = {p.name for p in found.placements}
    kept = [a for a in advice if not (a.rule.startswith(ALPHA_RULES) and a.advice.split(":")[0] in placed)]
    for p in found.placements:
        reading = p.reading
        if reading == "pays with room":
            words = f"{p.name} at {p.rate:g} req/s: its acceptance clears the break-even; keep it"
        elif reading == "falls short":
            words = f"{p.name} at {p.rate:g} req/s: too little acceptance to pay here; a drafter {_improvement(p)}"
        elif reading == "at the break-even":
            words = f"{p.name} at {p.rate:g} req/s: at the break-even; a drafter {_improvement(p)} to pay surely"
        else:
            continue
        kept.append(Advice("acceptance against the break-even L", words, placement_text(p)))
    return kept


# ---- the figure's layout (pipeline/analysis/figures.py draws it) --------------------------------


@dataclass(frozen=True)
class MapGrid:
    """The heat map's rows (proposer, k and L, highest L on top), columns (rates), cells, and its
    overlays in cell coordinates: (name, (column, row) points, a line or markers, labels)."""

    rows: tuple[str, ...]
    columns: tuple[str, ...]
    cells: tuple[tuple[MapPoint | None, ...], ...]
    overlays: tuple[tuple[str, tuple[tuple[float, float], ...], bool, tuple[str, ...]], ...]


def drafter_heatmap_parts(found: DrafterMap) -> MapGrid:
    rates = sorted({c.rate for c in found.curves})
    blocks: dict[str, list[Curve]] = {}
    for curve in found.curves:
        blocks.setdefault(f"{curve.name}|{curve.map_key}", []).append(curve)
    rows: list[str] = []
    cells: list[tuple[MapPoint | None, ...]] = []
    overlays = []
    for curves in blocks.values():
        lengths = sorted({p.told for c in curves for p in c.points})
        top = len(rows)
        positions = [top + len(lengths) - 1 - i for i in range(len(lengths))]  # ascending L -> its row

        def row_of(value: float, lengths: list[float] = lengths, positions: list[int] = positions) -> float:
            return float(np.interp(value, lengths, positions))

        for length in reversed(lengths):
            rows.append(f"{curves[0].name} L={length:g}")
            by_rate = {c.rate: next((p for p in c.points if p.told == length), None) for c in curves}
            cells.append(tuple(_drawable(by_rate.get(r)) for r in rates))
        contour = tuple(
            (float(rates.index(c.rate)), row_of(c.break_even.length)) for c in curves if c.break_even.length is not None
        )
        if contour:
            overlays.append((f"{curves[0].name}: break-even", contour, True, ()))
        placed = [p for p in found.placements if p.curve in curves and p.length.estimate is not None]
        for name in sorted({p.name for p in placed}):
            mine = [p for p in placed if p.name == name]
            marks = tuple((float(rates.index(p.rate)), row_of(float(p.length.estimate))) for p in mine)  # type: ignore[arg-type]
            overlays.append((f"{name} (measured L)", marks, False, tuple(p.method for p in mine)))
    return MapGrid(tuple(rows), tuple(f"{r:g}" for r in rates), tuple(cells), tuple(overlays))


def _drawable(point: MapPoint | None) -> MapPoint | None:
    return point if point is not None and point.speedup.ratio.estimate is not None else None
