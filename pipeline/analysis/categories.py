"""Verdicts per request type: a window's requests of one workload category against the same
requests on the baseline, through the one statistics core (docs/traces.md).

Acceptance depends on the kind of text far more than on load: code editing copies its prompt
and n-gram drafting accepts it, creative chat does not. A point's overall ratio can hide a
category that gains beside one that loses; this module says which, each with its interval,
and the median-TPOT verdicts of every (point, category) are one family (Benjamini-Hochberg).
Pure: frames and samples in, a table and Markdown lines out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from pipeline.analysis import decisions, stats, verdicts
from pipeline.analysis.decisions import Decision
from pipeline.analysis.samples import Sample, StatsOptions
from pipeline.analysis.stats import Ratio
from pipeline.engines.acceptance import alpha_from_length

METRIC = verdicts.TPOT  # the per-category verdict's ratio: median TPOT, baseline / speculative


def _length(spec: list[Sample], k: int, opts: StatsOptions, rng: np.random.Generator) -> Ratio | None:
    length = stats.acceptance_length_interval(spec, None, opts, rng)
    return verdicts._within_bounds(length, k) if length.estimate is not None else None


def compare(frame: pd.DataFrame, samples: Mapping[str, Sample], opts: StatsOptions) -> pd.DataFrame:
    """One row per (speculative point, category) where a point's windows hold two or more
    categories: the median-TPOT ratio with its interval and verdict, and L and alpha with theirs."""
    spec_rows, base_rows = verdicts.measured(frame, "speculative"), verdicts.measured(frame, "baseline")
    if spec_rows.empty:
        return pd.DataFrame()
    found: list[tuple[dict, Ratio]] = []
    for i, (key, group) in enumerate(spec_rows.groupby(verdicts.key_column(frame), sort=False)):
        pairs = verdicts._pairs(group, base_rows)
        base = [samples.get(str(b["run_id"])) for b, _ in pairs]
        spec = [samples.get(str(s["run_id"])) for _, s in pairs]
        if not pairs or any(x is None for x in base + spec):
            continue
        names = sorted({c for s in spec for c in s.categories})  # type: ignore[union-attr]
        if len(names) < 2:
            continue  # one kind of text: the point's own verdict is the category's
        first = pairs[0][1]
        restarted = "server" in group and len(pairs) >= 2 and group["server"].nunique() == len(pairs)
        k = int(first["k"])
        for j, name in enumerate(names):
            base_c = [b.only(name) for b in base]  # type: ignore[union-attr]
            spec_c = [s.only(name) for s in spec]  # type: ignore[union-attr]
            rng = np.random.default_rng([opts.seed, 31, i, j])
            ratio = stats.paired_ratio(METRIC, base_c, spec_c, opts, rng, shared_servers=not restarted)
            length = _length(spec_c, k, opts, rng)
            row = {
                "point_key": str(key),
                "config": verdicts.config_label(first),
                "request_rate": float(first["request_rate"]),
                "category": name,
                "requests": int(min(s.size for s in spec_c)),
                "spec_run_ids": " ".join(str(s["run_id"]) for _, s in pairs),
                "acceptance_length": length.estimate if length else None,
                "acceptance_length_low": length.low if length else None,
                "acceptance_length_high": length.high if length else None,
            }
            row["acceptance_alpha"] = alpha_from_length(row["acceptance_length"], k) if length else None
            row["acceptance_alpha_low"] = alpha_from_length(length.low, k) if length and length.resolved else None
            row["acceptance_alpha_high"] = alpha_from_length(length.high, k) if length and length.resolved else None
            found.append((row, ratio))
    if not found:
        return pd.DataFrame()
    decided: list[Decision] = decisions.decide([r for _, r in found], opts, verdicts.floor_for(METRIC, opts))
    rows = []
    for (row, ratio), decision in zip(found, decided, strict=True):
        rows.append(row | {METRIC: ratio.estimate, f"{METRIC}_low": ratio.low, f"{METRIC}_high": ratio.high,
                           "verdict": decision.label, "text": ratio.text, "detail": decision.detail})  # fmt: skip
    return pd.DataFrame(rows)


def run_metrics(table: pd.DataFrame) -> dict[str, dict[str, float]]:
    """``category.<name>.*`` metrics for each speculative run: its category's ratio and L."""
    out: dict[str, dict[str, float]] = {}
    for row in table.itertuples(index=False):
        values = {
            f"category.{row.category}.{METRIC}": getattr(row, METRIC),
            f"category.{row.category}.{METRIC}_low": getattr(row, f"{METRIC}_low"),
            f"category.{row.category}.{METRIC}_high": getattr(row, f"{METRIC}_high"),
            f"category.{row.category}.acceptance_length": row.acceptance_length,
            f"category.{row.category}.acceptance_length_low": row.acceptance_length_low,
            f"category.{row.category}.acceptance_length_high": row.acceptance_length_high,
            f"category.{row.category}.acceptance_alpha": row.acceptance_alpha,
            f"category.{row.category}.acceptance_alpha_low": row.acceptance_alpha_low,
            f"category.{row.category}.acceptance_alpha_high": row.acceptance_alpha_high,
        }
        kept = {k: float(v) for k, v in values.items() if v is not None and math.isfinite(float(v))}
        for run in str(row.spec_run_ids).split():
            out.setdefault(run, {}).update(kept)
    return out


def _length_text(row: pd.Series) -> str:
    if row["acceptance_length"] is None or pd.isna(row["acceptance_length"]):
        return "L not measured"
    if pd.isna(row["acceptance_length_low"]):
        return f"L {row['acceptance_length']:.2f}"
    return f"L {row['acceptance_length']:.2f} [{row['acceptance_length_low']:.2f}, {row['acceptance_length_high']:.2f}]"


def lines(table: pd.DataFrame) -> list[str]:
    """The report's "By request type" section; with a routing line where the verdicts of one
    point disagree (one category helps while another hurts)."""
    if table.empty:
        return []
    out = ["## By request type", "",
           "Each category's requests against the same requests on the baseline (median TPOT, baseline / "
           "speculation, paired by prompt), its verdict decided with every other category's "
           "(Benjamini-Hochberg); L is the category's acceptance length from its tokens per streamed step.", ""]  # fmt: skip
    for (config, rate), group in table.groupby(["config", "request_rate"], sort=True):
        parts = [f"{r.category} {r.text} {r.verdict} ({_length_text(pd.Series(r._asdict()))}, {r.requests} requests)"
                 for r in group.itertuples(index=False)]  # fmt: skip
        out.append(f"- {config} at {rate:g} req/s: " + "; ".join(parts))
        helps = group[group["verdict"] == decisions.HELPS]
        hurts = group[group["verdict"] == decisions.HURTS]
        if not helps.empty and not hurts.empty:
            on = ", ".join(f"{r.category} {r.text}" for r in helps.itertuples(index=False))
            off = ", ".join(f"{r.category} {r.text}" for r in hurts.itertuples(index=False))
            out.append(f"  - **route by request type**: speculation on for {on}; off for {off}")
    return [*out, ""]
