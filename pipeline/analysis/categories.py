"""Verdicts per request type (and per conversation turn): a window's requests of one group
against the same requests on the baseline, through the one statistics core (docs/traces.md).

Acceptance depends on the kind of text far more than on load: code editing copies its prompt
and n-gram drafting accepts it, creative chat does not. A point's overall ratio can hide a
category that gains beside one that loses; this module says which, each with its interval,
and the median-TPOT verdicts of every (point, category) are one family (Benjamini-Hochberg).
Pure: frames and samples in, a :class:`GroupComparisons` (a table and its Decisions) and Markdown
lines out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from pipeline.analysis import decisions, stats, verdicts
from pipeline.analysis.decisions import Decision
from pipeline.analysis.samples import Sample, StatsOptions
from pipeline.analysis.stats import Ratio
from pipeline.engines.acceptance import alpha_from_length

METRIC = verdicts.TPOT  # the per-category verdict's ratio: median TPOT, baseline / speculative
FIRST_TURN, LATER_TURNS = "first turn", "later turns"


class Grouping:
    """How a window's requests split into the groups compared, each against the same requests
    on the baseline: each request of a speculative window gets a label, and its baseline twin
    (the same prompt index) is cut by the same prompts."""

    prefix = "category"  # of the run metrics: <prefix>.<group>.*

    def labels(self, sample: Sample) -> tuple[Sequence[object], Sequence[object]]:
        """Each successful request's group, and each failed one's (None: in no group)."""
        return sample.category, sample.failed_category

    def prompt_labels(self, sample: Sample) -> dict[int, str]:
        """Each prompt of the window with a group, failed ones included: prompt -> its group."""
        ok, failed = self.labels(sample)
        failed_index = sample.failed_index if len(sample.failed_index) == len(failed) else ()
        pairs = [*zip(ok, sample.index, strict=False), *zip(failed, failed_index, strict=False)]
        return {int(prompt): str(label) for label, prompt in pairs if label is not None}

    def point_splits(self, base: Sequence[Sample], spec: Sequence[Sample]) -> list[dict[str, np.ndarray]]:
        """Each pair of windows (a repeat) cut into groups: prompt indices per group. A prompt's
        group is the prompt's own, read from either window (the speculative one first), so that
        a request that failed on one server, whose group that window may not record, is in the
        same group on both: a failure counts against whichever server failed it."""
        out = []
        for b, s in zip(base, spec, strict=True):
            labels = self.prompt_labels(b) | self.prompt_labels(s)
            groups: dict[str, list[int]] = {}
            for prompt, label in labels.items():
                groups.setdefault(label, []).append(prompt)
            out.append({name: np.array(sorted(groups[name])) for name in sorted(groups)})
        return out

    def describe(self, name: str, base: Sequence[Sample], spec: Sequence[Sample]) -> dict[str, float]:
        """Columns of the group's own beyond the shared ones."""
        return {}


class ByTurn(Grouping):
    """A conversation's first turn (requests of their own with it) against its later turns,
    whose history the server's prefix cache may hold: that shows in TTFT far more than in TPOT."""

    prefix = "turn"

    def labels(self, sample: Sample) -> tuple[Sequence[object], Sequence[object]]:
        turn = sample.turn if len(sample.turn) == sample.size else np.zeros(sample.size, int)
        failed = sample.failed_turn if len(sample.failed_turn) == sample.failed else np.zeros(sample.failed, int)
        if not (turn > 1).any() and not (failed > 1).any():
            return (), ()  # no conversation: nothing to split
        return (
            [LATER_TURNS if t > 1 else FIRST_TURN for t in turn],
            [LATER_TURNS if t > 1 else FIRST_TURN for t in failed],
        )


BY_CATEGORY = Grouping()
BY_TURN = ByTurn()


@dataclass(frozen=True)
class GroupComparisons:
    """One row per (speculative point, group) with its numbers (the run metrics, the figures),
    and each row's median-TPOT Decision: the report and the advice read the verdict and the
    ratio's text from it. The table's verdict column is for a reader of the table only."""

    table: pd.DataFrame = field(default_factory=pd.DataFrame)
    decisions: Mapping[tuple[str, str], Decision] = field(default_factory=dict)  # (point_key, group) -> decision
    column: str = "category"  # the table's column that names each row's group

    @property
    def empty(self) -> bool:
        return self.table.empty

    def decision(self, row: Any) -> Decision:
        """The Decision of one row of the table (from itertuples or iterrows)."""
        return self.decisions[(str(row.point_key), str(getattr(row, self.column)))]

    def labels(self, rows: pd.DataFrame) -> pd.Series:
        """Each row's verdict, from its Decision; ``rows`` is the table or a slice of it."""
        found = [self.decision(row).label for row in rows.itertuples(index=False)]
        return pd.Series(found, index=rows.index, dtype=object)


def _length(spec: list[Sample], k: int, opts: StatsOptions, rng: np.random.Generator) -> Ratio | None:
    length = stats.acceptance_length_interval(spec, None, opts, rng)
    return verdicts._within_bounds(length, k) if length.estimate is not None else None


def _median_ms(samples: Sequence[Sample], metric: str) -> float:
    values = np.concatenate([s.values[metric] for s in samples]) if samples else np.empty(0)
    finite = values[np.isfinite(values)]
    return float(np.median(finite)) * 1e3 if len(finite) else math.nan


def compare_groups(
    frame: pd.DataFrame, samples: Mapping[str, Sample], opts: StatsOptions, by: Grouping = BY_CATEGORY
) -> GroupComparisons:
    """One row per (speculative point, group) where a point's windows hold two or more groups
    (categories, or first and later turns): the median-TPOT ratio with its interval and
    verdict, L and alpha with theirs, and each side's median TTFT."""
    spec_rows, base_rows = verdicts.measured(frame, "speculative"), verdicts.measured(frame, "baseline")
    if spec_rows.empty:
        return GroupComparisons()
    found: list[tuple[dict, Ratio]] = []
    for i, (key, group) in enumerate(spec_rows.groupby(verdicts.key_column(frame), sort=False)):
        pairs = verdicts._pairs(group, base_rows)
        base = [samples.get(str(b["run_id"])) for b, _ in pairs]
        spec = [samples.get(str(s["run_id"])) for _, s in pairs]
        if not pairs or any(x is None for x in base + spec):
            continue
        splits = by.point_splits(base, spec)  # type: ignore[arg-type]
        names = list(dict.fromkeys(name for split in splits for name in split))
        if len(names) < 2:
            continue  # one kind of text: the point's own verdict is the category's
        restarted = "server" in group and len(pairs) >= 2 and group["server"].nunique() == len(pairs)
        for j, name in enumerate(names):
            chosen = [split.get(name, np.zeros(0, int)) for split in splits]
            base_c = [b.with_index(c) for b, c in zip(base, chosen, strict=True)]  # type: ignore[union-attr]
            spec_c = [s.with_index(c) for s, c in zip(spec, chosen, strict=True)]  # type: ignore[union-attr]
            rng = np.random.default_rng([opts.seed, 31, i, j])
            ratio = stats.paired_ratio(METRIC, base_c, spec_c, opts, rng, shared_servers=not restarted)
            row = {"point_key": str(key), "category": name} | _group_row(pairs, base_c, spec_c, opts, rng)
            found.append((row | by.describe(name, base_c, spec_c), ratio))
    if not found:
        return GroupComparisons()
    decided: list[Decision] = decisions.decide([r for _, r in found], opts, verdicts.floor_for(METRIC, opts))
    rows = [
        # The verdict column is the word beside its numbers, for a reader of the table.
        row | {METRIC: ratio.estimate, f"{METRIC}_low": ratio.low, f"{METRIC}_high": ratio.high, "verdict": d.label}
        for (row, ratio), d in zip(found, decided, strict=True)
    ]
    chosen = {(row["point_key"], row["category"]): d for (row, _), d in zip(found, decided, strict=True)}
    return GroupComparisons(pd.DataFrame(rows), chosen)


def _group_row(
    pairs: list[tuple[pd.Series, pd.Series]],
    base_c: list[Sample],
    spec_c: list[Sample],
    opts: StatsOptions,
    rng: np.random.Generator,
) -> dict:
    """One group of a point: its configuration, size, L and alpha with their intervals, and
    each side's median TTFT."""
    first = pairs[0][1]
    k = int(first["k"])
    length = _length(spec_c, k, opts, rng)
    resolved = length is not None and length.resolved
    return {
        "config": verdicts.config_label(first),
        "request_rate": float(first["request_rate"]),
        "requests": int(min(s.size for s in spec_c)),
        "spec_run_ids": " ".join(str(s["run_id"]) for _, s in pairs),
        "acceptance_length": length.estimate if length else None,
        "acceptance_length_low": length.low if length else None,
        "acceptance_length_high": length.high if length else None,
        "acceptance_alpha": alpha_from_length(length.estimate, k) if length else None,
        "acceptance_alpha_low": alpha_from_length(length.low, k) if resolved else None,  # type: ignore[union-attr,arg-type]
        "acceptance_alpha_high": alpha_from_length(length.high, k) if resolved else None,  # type: ignore[union-attr,arg-type]
        "base_median_ttft_ms": _median_ms(base_c, "ttft"),
        "spec_median_ttft_ms": _median_ms(spec_c, "ttft"),
    }


def run_metrics(table: pd.DataFrame, prefix: str = BY_CATEGORY.prefix) -> dict[str, dict[str, float]]:
    """``<prefix>.<group>.*`` metrics for each speculative run: its group's ratio and L
    (``category.code_edit.*``, ``turn.later_turns.*``)."""
    out: dict[str, dict[str, float]] = {}
    for row in table.itertuples(index=False):
        name = f"{prefix}.{re.sub(r'[^A-Za-z0-9_.-]+', '_', str(row.category))}"
        values = {
            f"{name}.{METRIC}": getattr(row, METRIC),
            f"{name}.{METRIC}_low": getattr(row, f"{METRIC}_low"),
            f"{name}.{METRIC}_high": getattr(row, f"{METRIC}_high"),
            f"{name}.acceptance_length": row.acceptance_length,
            f"{name}.acceptance_length_low": row.acceptance_length_low,
            f"{name}.acceptance_length_high": row.acceptance_length_high,
            f"{name}.acceptance_alpha": row.acceptance_alpha,
            f"{name}.acceptance_alpha_low": row.acceptance_alpha_low,
            f"{name}.acceptance_alpha_high": row.acceptance_alpha_high,
            f"{name}.median_ttft_ms": row.spec_median_ttft_ms,
        }
        kept = {k: float(v) for k, v in values.items() if v is not None and math.isfinite(float(v))}
        for run in str(row.spec_run_ids).split():
            out.setdefault(run, {}).update(kept)
    return out


def section(title: str, intro: str) -> list[str]:
    """A report section's head: its title and the one paragraph that says how it was measured."""
    return [f"## {title}", "", intro, ""]


def _length_text(row: pd.Series) -> str:
    if row["acceptance_length"] is None or pd.isna(row["acceptance_length"]):
        return "L not measured"
    if pd.isna(row["acceptance_length_low"]):
        return f"L {row['acceptance_length']:.2f}"
    return f"L {row['acceptance_length']:.2f} [{row['acceptance_length_low']:.2f}, {row['acceptance_length_high']:.2f}]"


def group_lines(result: GroupComparisons) -> list[str]:
    """The report's "By request type" section; with a routing line where the verdicts of one
    point disagree (one category helps while another hurts)."""
    if result.empty:
        return []
    out = section(
        "By request type",
        "Each category's requests against the same requests on the baseline (median TPOT, baseline / "
        "speculation, paired by prompt), its verdict decided with every other category's "
        "(Benjamini-Hochberg); L is the category's acceptance length from its tokens per streamed step.",
    )
    for (config, rate), group in result.table.groupby(["config", "request_rate"], sort=True):
        rows = [(r, result.decision(r)) for r in group.itertuples(index=False)]
        parts = [
            f"{r.category} {d.ratio.text} {d.label} ({_length_text(pd.Series(r._asdict()))}, {r.requests} requests)"
            for r, d in rows
        ]
        out.append(f"- {config} at {rate:g} req/s: " + "; ".join(parts))
        helps = [f"{r.category} {d.ratio.text}" for r, d in rows if d.label == decisions.HELPS]
        hurts = [f"{r.category} {d.ratio.text}" for r, d in rows if d.label == decisions.HURTS]
        if helps and hurts:
            out.append(
                f"  - **route by request type**: speculation on for {', '.join(helps)}; off for {', '.join(hurts)}"
            )
    return [*out, ""]


def turn_lines(result: GroupComparisons) -> list[str]:
    """The report's "By conversation turn" section: first turns against later ones, each paired
    with the same turns on the baseline, with each side's median TTFT."""
    if result.empty:
        return []
    out = section(
        "By conversation turn",
        "A conversation's first turn (with the requests of their own) against its later turns, whose "
        "history is the earlier turns and the server's own answers (and may sit in the prefix cache): "
        "median TPOT, baseline / speculation, paired by request, decided as one family "
        "(Benjamini-Hochberg); TTFT is each group's median on the baseline -> with speculation.",
    )
    for (config, rate), group in result.table.groupby(["config", "request_rate"], sort=True):
        parts = [
            f"{r.category} {d.ratio.text} {d.label} (TTFT {r.base_median_ttft_ms:.0f} -> "
            f"{r.spec_median_ttft_ms:.0f} ms, {_length_text(pd.Series(r._asdict()))}, {r.requests} requests)"
            for r, d in ((r, result.decision(r)) for r in group.itertuples(index=False))
        ]
        out.append(f"- {config} at {rate:g} req/s: " + "; ".join(parts))
    return [*out, ""]
