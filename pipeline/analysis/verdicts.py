"""Per-point comparisons with measured intervals, their verdicts, and the load where
speculation stops paying. Every number that becomes a word comes from
:mod:`pipeline.analysis.stats`; this module only says which windows pair with which.

A point is everything measured at one configuration and load: its repeats share a
``point_key`` (the point's hash without the repeat index), so points that differ in
workload, temperature, model, draft, options, burstiness or concurrency are never pooled.
Each speculative window pairs with its own baseline window (``baseline_hash``): the same
prompts, schedule and repeat.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from pipeline.analysis import decisions, stats
from pipeline.analysis.decisions import Decision
from pipeline.analysis.samples import Sample, StatsOptions
from pipeline.analysis.stats import RATIOS, Ratio
from pipeline.engines.acceptance import alpha_from_length
from pipeline.measures import MEDIAN_TPOT, OUTPUT_THROUGHPUT

CONFIG = ["engine", "method", "k"]
TPOT = MEDIAN_TPOT.ratio or ""
THROUGHPUT = OUTPUT_THROUGHPUT.ratio or ""
# Practical floors: a 1 % change can be real and irrelevant. Tails move more from run to run.
P99_FLOOR = 0.10
LOAD_BOUND = "load-bound"
LOAD_BOUND_TEXT = "load-bound: not a capacity measure (both servers kept up with the offered load)"
# A ratio a failed validity check undermines (analysis/trust.py): no verdict, the reason given.
WITHHELD = "withheld"

MEDIANS = (
    "spec_decode_acceptance_rate",
    "acceptance_length",
    "acceptance_alpha",
    "acceptance_k_effective",
    "median_tpot_ms",
    "p99_tpot_ms",
    "output_throughput",
    "median_ttft_ms",
    "median_e2el_ms",
)


def config_label(row: pd.Series) -> str:
    """A point's configuration as the report names it: ``vllm baseline``, ``vllm ngram k=3``."""
    if row.get("role") == "baseline":
        return f"{row['engine']} baseline"
    return f"{row['engine']} {row['method']} k={int(row['k'])}"


def measured(frame: pd.DataFrame, role: str | None = None) -> pd.DataFrame:
    """The points that have measurements: finished now, or resumed from an earlier run."""
    keep = frame["status"].isin(["finished", "resumed"])
    return frame[keep & (frame["role"] == role)] if role else frame[keep]


def floor_for(metric: str, opts: StatsOptions) -> float:
    return P99_FLOOR if metric.startswith("speedup_p99") else opts.floor


@dataclass(frozen=True)
class Comparisons:
    """One row per speculative point, with every ratio's interval and verdict."""

    table: pd.DataFrame
    decisions: dict[str, dict[str, Decision]]  # point_key -> metric -> decision
    options: StatsOptions

    def decision(self, key: str, metric: str) -> Decision | None:
        return self.decisions.get(key, {}).get(metric)

    def labels(self, rows: pd.DataFrame, metric: str = TPOT) -> pd.Series:
        """Each row's verdict on ``metric`` (the median TPOT's by default), read from its Decision;
        ``rows`` is this table or a slice of it, and the result shares its index ("": no decision)."""
        if rows.empty:
            return pd.Series([], index=rows.index, dtype=object)
        found = (self.decision(str(key), metric) for key in rows["point_key"])
        return pd.Series([d.label if d else "" for d in found], index=rows.index, dtype=object)


def key_column(frame: pd.DataFrame) -> str:
    # Summaries from before point_key existed: every row is a point of its own.
    return "point_key" if "point_key" in frame and frame["point_key"].notna().all() else "point_hash"


def _pairs(group: pd.DataFrame, base: pd.DataFrame) -> list[tuple[pd.Series, pd.Series]]:
    by_hash = base.set_index("point_hash")
    pairs = []
    for _, row in group.sort_values("repeat" if "repeat" in group else "point").iterrows():
        if row["baseline_hash"] in by_hash.index:
            pairs.append((by_hash.loc[row["baseline_hash"]], row))
    return pairs


def _summary_only(metric: str, pairs: list[tuple[pd.Series, pd.Series]]) -> Ratio:
    values = [float(s.get(metric)) for _, s in pairs if _finite_any_float(s.get(metric))]
    estimate = math.exp(float(np.mean(np.log(values)))) if values else None
    return Ratio(metric, estimate, runs=len(pairs), note="no per-request data (requests.csv) for an interval")


def _within_bounds(length: Ratio, k_eff: float) -> Ratio:
    """L lies in [1, k + 1] by construction: an interval reaching past that says only that
    the bound is not excluded."""
    if not length.resolved:
        return length
    assert length.low is not None and length.high is not None
    return replace(length, low=min(max(length.low, 1.0), k_eff + 1), high=min(max(length.high, 1.0), k_eff + 1))


def _alpha_bounds(length: Ratio, k_eff: float) -> tuple[float | None, float | None]:
    if not length.resolved or not k_eff:
        return None, None
    assert length.low is not None and length.high is not None
    return alpha_from_length(length.low, k_eff), alpha_from_length(length.high, k_eff)


def compare_points(
    frame: pd.DataFrame,
    samples: Mapping[str, Sample],
    opts: StatsOptions,
    withheld: Mapping[str, Mapping[str, str]] | None = None,
) -> Comparisons:
    """Every speculative point against its baseline, for every ratio of :data:`stats.RATIOS`,
    with the verdicts of each ratio decided together across the sweep. ``withheld``: per
    point_key, the ratios a failed validity check undermines and why; they get no verdict and
    stay out of their family's adjustment."""
    spec_rows, base_rows = measured(frame, "speculative"), measured(frame, "baseline")
    rows: list[dict] = []
    ratios: dict[str, dict[str, Ratio]] = {}
    load_bound: dict[str, bool] = {}
    for i, (key, group) in enumerate(spec_rows.groupby(key_column(frame), sort=False)):
        pairs = _pairs(group, base_rows)
        if not pairs:
            continue
        base_s = [samples.get(str(b["run_id"])) for b, _ in pairs]
        spec_s = [samples.get(str(s["run_id"])) for _, s in pairs]
        complete = all(x is not None for x in base_s + spec_s)
        ratios[str(key)] = _point_ratios(i, group, pairs, base_s, spec_s, opts) if complete else _summaries(pairs)
        load_bound[str(key)] = complete and all(stats.keeps_up(x) for x in [*base_s, *spec_s])  # type: ignore[arg-type]
        rows.append(_point_row(str(key), group, pairs, [s for s in spec_s if s is not None] if complete else [], opts))
    decided = _decide(ratios, load_bound, opts, withheld or {})
    for row in rows:
        for metric, decision in decided[row["point_key"]].items():
            ratio = decision.ratio
            # Numbers only, for the table's CSV and the figures; the verdict itself is the
            # Decision in Comparisons.decisions, which the report reads.
            row |= {metric: ratio.estimate, f"{metric}_low": ratio.low, f"{metric}_high": ratio.high}
        tpot = decided[row["point_key"]][TPOT]
        row |= {
            # The word beside its numbers, for a reader of the table; code reads each verdict
            # from its Decision (Comparisons.labels), never back from this column.
            "verdict": tpot.label,
            "low": tpot.ratio.low,
            "high": tpot.ratio.high,
            "basis": _basis(tpot.ratio),
            "load_bound": load_bound[row["point_key"]],
        }
    table = pd.DataFrame(rows)
    if table.empty:
        table = pd.DataFrame(columns=["point_key", *CONFIG, "request_rate", TPOT, "verdict", "low", "high", *MEDIANS])
    return Comparisons(table.sort_values([*CONFIG, "request_rate"]) if not table.empty else table, decided, opts)


def _point_ratios(
    i: int,
    group: pd.DataFrame,
    pairs: list[tuple[pd.Series, pd.Series]],
    base_s: list[Sample | None],
    spec_s: list[Sample | None],
    opts: StatsOptions,
) -> dict[str, Ratio]:
    """Every ratio of one point, paired by prompt, with its interval."""
    # Repeats on fresh servers measure the spread between server starts themselves; one
    # run, or repeats sharing their servers, cannot (the A/A spread is added instead).
    restarted = "server" in group and len(pairs) >= 2 and group["server"].nunique() == len(pairs)
    found = {}
    for j, metric in enumerate(RATIOS):
        rng = np.random.default_rng([opts.seed, i, j])
        found[metric] = stats.paired_ratio(metric, base_s, spec_s, opts, rng, shared_servers=not restarted)  # type: ignore[arg-type]
    return found


def _summaries(pairs: list[tuple[pd.Series, pd.Series]]) -> dict[str, Ratio]:
    """Without every window's requests: each ratio from the summaries alone, no interval."""
    return {metric: _summary_only(metric, pairs) for metric in RATIOS}


def _point_row(
    key: str, group: pd.DataFrame, pairs: list[tuple[pd.Series, pd.Series]], spec_s: list[Sample], opts: StatsOptions
) -> dict:
    """One point's row of the table: its configuration, medians over runs, its baseline's
    medians and its acceptance with intervals (``spec_s`` empty: no per-request data)."""
    first = pairs[0][1]
    row = {c: first.get(c) for c in ("engine", "method", "k", "workload", "setting_key", "replica")}
    row |= {"point_key": key, "request_rate": float(first["request_rate"]), "runs": len(pairs), "k": int(first["k"])}
    # The MLflow runs behind the row, speculation's first: the report links to them.
    row["run_ids"] = " ".join([str(s["run_id"]) for _, s in pairs] + [str(b["run_id"]) for b, _ in pairs])
    row |= {c: _median(group, c) for c in MEDIANS}
    baseline = pd.DataFrame([b for b, _ in pairs])
    row |= {
        f"base_{c}": _median(baseline, c)
        for c in ("median_tpot_ms", "p99_tpot_ms", "output_throughput", "median_ttft_ms")
    }
    length = (
        stats.acceptance_length_interval(spec_s, row["acceptance_length"], opts)
        if spec_s and _finite_any_float(row["acceptance_length"])
        else None
    )
    k_eff = row["acceptance_k_effective"] if _finite_any_float(row["acceptance_k_effective"]) else row["k"]
    length = _within_bounds(length, k_eff) if length else None
    row["alpha_low"], row["alpha_high"] = _alpha_bounds(length, k_eff) if length else (None, None)
    row["acceptance_length_text"] = length.text.replace("x", "") if length else "—"
    return row


def _decide(
    ratios: dict[str, dict[str, Ratio]],
    load_bound: dict[str, bool],
    opts: StatsOptions,
    withheld: Mapping[str, Mapping[str, str]],
) -> dict[str, dict[str, Decision]]:
    """Each ratio is one family across the sweep, adjusted together (Benjamini-Hochberg)."""
    out: dict[str, dict[str, Decision]] = {key: {} for key in ratios}
    for metric in RATIOS:
        keys = [k for k in ratios if not (metric == THROUGHPUT and load_bound[k]) and metric not in withheld.get(k, {})]
        for key in ratios:
            if metric in withheld.get(key, {}):
                out[key][metric] = Decision(WITHHELD, ratios[key][metric], detail=withheld[key][metric])
            elif key not in keys:
                out[key][metric] = Decision(LOAD_BOUND, ratios[key][metric], detail=LOAD_BOUND_TEXT)
        family = decisions.decide([ratios[k][metric] for k in keys], opts, floor_for(metric, opts))
        for key, decision in zip(keys, family, strict=True):
            out[key][metric] = decision
    return out


def _basis(ratio: Ratio) -> str:
    runs = f"{ratio.runs} run{'s' if ratio.runs != 1 else ''}"
    if not ratio.resolved:
        return f"{runs}; {ratio.note}"
    spread = "requests within the run" if ratio.runs == 1 else "runs, then requests within each"
    return f"{runs}, {ratio.requests} paired requests per window; {ratio.level:.0%} interval over {spread}"


def _median(group: pd.DataFrame, column: str) -> float | None:
    if column not in group:
        return None
    values = [v for v in group[column] if _finite_any_float(v)]
    return float(np.median(values)) if values else None


def _finite_any_float(value: object) -> bool:
    """:func:`~pipeline.analysis.samples.finite_number`, and a NumPy float of any width too."""
    return isinstance(value, (int, float, np.floating)) and math.isfinite(float(value))  # type: ignore[arg-type]


@dataclass(frozen=True)
class Crossover:
    engine: str
    method: str
    k: int
    rate: float | None  # where the median-TPOT speedup crosses 1.0, interpolated
    text: str
    low: float | None = None
    high: float | None = None


def crossovers(comparisons: Comparisons) -> list[Crossover]:
    """Per curve (one configuration across loads): where speculation stops paying, as an
    interval over the bootstrap's replicates, or "not resolved"."""
    table = comparisons.table
    found: list[Crossover] = []
    if table.empty:
        return found
    curve = [*CONFIG, "setting_key"] if "setting_key" in table and table["setting_key"].notna().all() else CONFIG
    for _, group in table.groupby(curve, sort=True):
        group = group.sort_values("request_rate")
        decided = [comparisons.decisions[key][TPOT] for key in group["point_key"]]
        cross = decisions.crossing(list(group["request_rate"]), decided, comparisons.options)
        first = group.iloc[0]
        found.append(
            Crossover(
                str(first["engine"]),
                str(first["method"]),
                int(first["k"]),
                cross.rate,
                cross.text,
                cross.low,
                cross.high,
            )
        )
    return found


def between_points(
    frame: pd.DataFrame, samples: Mapping[str, Sample], slower: str, faster: str, opts: StatsOptions
) -> Ratio | None:
    """Point ``faster``'s median TPOT against point ``slower``'s (> 1: ``faster`` is faster), for
    the caller to decide with the rest of its family. Two speculative windows at one load send
    the same prompts too, so they pair by repeat.

    They ran on two servers, so the spread between server starts belongs in the interval, as
    in :func:`compare_points`: measured by restarted repeats, or added from an A/A sweep. With
    neither, the answer is None (not resolved): without it the one-run rule called 30 % of
    A/A comparisons, and a k schedule would switch k on noise."""
    key_col = key_column(frame)
    spec = measured(frame, "speculative")
    runs, restarted = [], []
    for key in (slower, faster):
        rows = spec[spec[key_col] == key].sort_values("repeat" if "repeat" in spec else "point")
        runs.append([samples.get(str(r)) for r in rows["run_id"]])
        restarted.append("server" in rows and len(rows) >= 2 and rows["server"].nunique() == len(rows))
    if not runs[0] or len(runs[0]) != len(runs[1]) or any(s is None for s in runs[0] + runs[1]):
        return None
    shared = not all(restarted)
    if shared and (opts.server_spread is None or opts.server_spread.for_metric(TPOT) is None):
        return None
    return stats.paired_ratio(TPOT, runs[0], runs[1], opts, shared_servers=shared)  # type: ignore[arg-type]


def is_aa(frame: pd.DataFrame) -> bool:
    """An A/A sweep: every compared point is an identical twin of its baseline."""
    spec = measured(frame, "speculative")
    return not spec.empty and "replica" in spec and bool((spec["replica"] == 1).all())


def aa_log_ratios(frame: pd.DataFrame) -> dict[str, list[float]]:
    """Each A/A comparison's log ratio, per ratio: one pair of fresh servers each."""
    spec = measured(frame, "speculative")
    out: dict[str, list[float]] = {}
    for metric in RATIOS:
        if metric in spec:
            out[metric] = [math.log(float(v)) for v in spec[metric] if _finite_any_float(v) and float(v) > 0]
    return out
