"""A trace replay's verdict over its own time: the load it offered, bucket by bucket, and the
paired speedup in each bucket with its interval (docs/traces.md).

A trace's load is not steady: "it pays in the lulls and stops paying at the peak" is what a
user wants to read off. Each bucket's requests are paired with the same requests on the
baseline through the one statistics core (the grouping machinery of
:mod:`pipeline.analysis.categories`), the buckets of every point are one Benjamini-Hochberg
family, and each bucket carries the batch size the baseline ran at (mean requests in flight),
set against the k schedule's band for that batch. Pure: frames and samples in, a
:class:`~pipeline.analysis.categories.GroupComparisons` (a table and its Decisions) and Markdown
lines out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import pandas as pd

from pipeline.analysis import categories, decisions
from pipeline.analysis.categories import GroupComparisons
from pipeline.analysis.samples import Sample, StatsOptions

TIMELINE_FIGURE = "Speedup over the trace"  # the figure's name in the report, PNG and Plotly alike
MIN_PER_BUCKET = 12  # requests a bucket needs for a paired median with a usable interval
MAX_BUCKETS = 8


class ByTime(categories.Grouping):
    """Equal stretches of the point's schedule, as many as hold MIN_PER_BUCKET of its prompts
    each (at least 2, at most MAX_BUCKETS), their edges fixed once per point from the schedule of
    every prompt sent, failed ones included: both servers send the same prompts on the same
    schedule, so a prompt's stretch is its own, and a failure on either server counts in it
    against that server (as +inf), not out of both sides."""

    prefix = "time"

    def __init__(self) -> None:
        self.spans: dict[str, tuple[float, float]] = {}  # label -> (start s, end s), the point's

    @staticmethod
    def _schedule(sample: Sample) -> dict[int, float]:
        """prompt -> its scheduled send time, where the window recorded every one of them."""
        out = {}
        if len(sample.scheduled) == sample.size:
            out.update(zip(sample.index.tolist(), sample.scheduled.tolist(), strict=True))
        if len(sample.failed_scheduled) == sample.failed == len(sample.failed_index):
            out.update(zip(sample.failed_index.tolist(), sample.failed_scheduled.tolist(), strict=True))
        return {int(k): float(v) for k, v in out.items()}

    def point_splits(self, base: Sequence[Sample], spec: Sequence[Sample]) -> list[dict[str, np.ndarray]]:
        schedules = [self._schedule(b) | self._schedule(s) for b, s in zip(base, spec, strict=True)]
        sent = [b.size + b.failed for b in base] + [s.size + s.failed for s in spec]
        if not schedules or any(len(times) < n for times, n in zip(schedules, sent[len(base) :], strict=True)):
            return [{} for _ in schedules]  # a window without every send time: no stretches
        count = min(MAX_BUCKETS, max(sent) // MIN_PER_BUCKET)
        if count < 2:
            return [{} for _ in schedules]
        end = max(max(times.values()) for times in schedules) * (1 + 1e-9) + 1e-9
        edges = np.linspace(0.0, end, count + 1)
        names = [f"{lo:.0f}-{hi:.0f} s" for lo, hi in zip(edges, edges[1:], strict=False)]
        self.spans = {name: (float(lo), float(hi)) for name, lo, hi in zip(names, edges, edges[1:], strict=False)}
        out = []
        for times in schedules:
            prompts = np.array(sorted(times))
            where = np.clip(np.searchsorted(edges, [times[p] for p in prompts], side="right") - 1, 0, count - 1)
            groups = {names[i]: prompts[where == i] for i in range(count) if (where == i).any()}
            out.append(groups)
        return out

    def describe(self, name: str, base: Sequence[Sample], spec: Sequence[Sample]) -> dict[str, float]:
        lo, hi = self.spans[name]
        width = hi - lo
        offered = np.mean([s.size + s.failed for s in base]) / width if width > 0 else math.nan
        return {
            "start_s": lo,
            "end_s": hi,
            "offered_rate": float(offered),
            "in_flight": float(np.mean([in_flight(b, lo, hi) for b in base])),
        }


def in_flight(sample: Sample, lo: float, hi: float) -> float:
    """Mean requests in flight over [lo, hi): each request counted from its scheduled send for
    its end-to-end latency (the batch the server ran, by the same Little's law as the k schedule)."""
    if hi <= lo or len(sample.scheduled) != sample.size:
        return math.nan
    start = sample.scheduled
    end = start + np.nan_to_num(sample.values["e2el"], nan=0.0)
    overlap = np.clip(np.minimum(end, hi) - np.maximum(start, lo), 0.0, None)
    return float(overlap.sum() / (hi - lo))


def compare_stretches(frame: pd.DataFrame, samples: Mapping[str, Sample], opts: StatsOptions) -> GroupComparisons:
    """One row per (speculative trace point, time bucket); empty where no point replayed a trace."""
    if "trace_requests" not in frame or frame["trace_requests"].isna().all():
        return GroupComparisons()
    traced = frame[frame["trace_requests"].notna()]
    found = categories.compare_groups(traced, samples, opts, ByTime())
    return (
        replace(found, table=found.table.rename(columns={"category": "bucket"}), column="bucket")
        if not found.empty
        else found
    )


def schedule_k(schedules: Sequence[dict], method: str, batch: float) -> int | None:
    """The k the sweep's k schedule gives this method at this batch size (None: no schedule)."""
    for schedule in schedules:
        if schedule.get("method") != method or not math.isfinite(batch):
            continue
        for start, end, k in schedule["num_speculative_tokens_per_batch_size"]:
            if start <= max(1, math.ceil(batch)) <= end:
                return int(k)
    return None


def stretch_lines(result: GroupComparisons, schedules: Sequence[dict] = ()) -> list[str]:
    """The report's "Over the trace" section: per point, each bucket's load and verdict, and
    where speculation stopped paying."""
    if result.empty:
        return []
    out = categories.section(
        "Over the trace",
        "The replay cut into equal stretches of its schedule: each stretch's offered load, the batch the baseline "
        "ran at (mean requests in flight), and its requests' median-TPOT speedup against the same requests on the "
        "baseline, paired by request and decided with every other stretch (Benjamini-Hochberg).",
    )
    for (config, rate), group in result.table.groupby(["config", "request_rate"], sort=True):
        group = group.sort_values("start_s")
        method = config.split()[1] if len(config.split()) > 1 else ""
        out.append(f"- {config} at {rate:g} req/s:")
        for r in group.itertuples(index=False):
            k = schedule_k(schedules, method, r.in_flight)
            band = f"; the k schedule gives k={k} at this batch" if k is not None else ""
            decision = result.decision(r)
            out.append(
                f"  - {r.bucket}: {r.offered_rate:.2f} req/s offered, {r.in_flight:.1f} in flight{band}: "
                f"{decision.ratio.text} {decision.label}"
            )
        out += _paid_line(group, result.labels(group))
    return [*out, ""]


def _paid_line(group: pd.DataFrame, labels: pd.Series) -> list[str]:
    """In how many of one point's stretches speculation paid, and what it was at the busiest."""
    # Only decided stretches count: one with too few requests neither paid nor failed to.
    decided = labels[labels.isin([decisions.HELPS, decisions.HURTS, decisions.INCONCLUSIVE])]
    if decided.empty:
        return []
    helps = decided[decided == decisions.HELPS]
    busiest = group["offered_rate"].idxmax()
    unresolved = len(group) - len(decided)
    left = f" ({unresolved} with too few requests to say)" if unresolved else ""
    return [
        f"  - speculation paid in {len(helps)} of the {len(decided)} stretches decided{left}; at the busiest "
        f"({group.loc[busiest, 'bucket']}, {group.loc[busiest, 'offered_rate']:.2f} req/s) it was {labels[busiest]}"
    ]
