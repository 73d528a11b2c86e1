"""The sweep-wide table: one row per point, baselines included, each speculative point
beside its baseline's ratios. Pure: outcomes in, a DataFrame out (column names are the
MLflow metric names)."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from pipeline.engines import synthetic
from pipeline.identity import point_key, setting_key
from pipeline.load.metrics import Comparison, compare_summaries
from pipeline.run.measure import resets_cache
from pipeline.run.outcomes import PointOutcome
from pipeline.run.plan import SweepPlan


def comparisons(plan: SweepPlan, outcomes: Mapping[str, PointOutcome]) -> dict[str, Comparison]:
    """Speculative point hash -> its ratios against its baseline, where both were measured."""
    found: dict[str, Comparison] = {}
    for point in plan.points:
        if point.baseline_hash is None:
            continue
        spec, base = outcomes.get(point.hash), outcomes.get(point.baseline_hash)
        if spec and base and spec.error is None and base.error is None and not spec.predicted:
            found[point.hash] = compare_summaries(base.metrics, spec.metrics)
    return found


def status(outcome: PointOutcome | None) -> str:
    if outcome is None:
        return "not run"
    if outcome.error is not None:
        return "failed"
    if outcome.predicted:
        return "predicted"
    return "resumed" if outcome.resumed else "finished"


def frame(plan: SweepPlan, outcomes: Mapping[str, PointOutcome], ratios: Mapping[str, Comparison]) -> pd.DataFrame:
    rows = []
    for group in plan.groups:
        for point in group.points:
            outcome = outcomes.get(point.hash)
            job = point.job
            row: dict[str, object] = {
                "point": point.label,
                "role": point.role,
                "server": group.index,
                "engine": job.engine.name,
                "method": job.spec.method,
                "k": job.spec.k,
                "request_rate": job.load.request_rate,
                "workload": job.workload.name,
                "repeat": job.repeat,
                "dtype": job.engine.dtype,
                "temperature": job.workload.temperature,
                "prefix_cache": job.engine.prefix_cache
                if resets_cache(job) or job.engine.prefix_cache in ("off", "as_is")
                else f"{job.engine.prefix_cache}, not emptied first (engine.allow_remote=true: no dev-mode reset)",
                "baseline_hash": point.baseline_hash or "",
                "status": status(outcome),
                "error": (outcome.error or "") if outcome else "",
                "run_id": (outcome.run_id or "") if outcome else "",
                "point_hash": point.hash,
                # The report groups repeats by point_key and curves (k x rate) by setting_key.
                "point_key": point_key(job),
                "setting_key": setting_key(job),
                "replica": job.replica,
                # The acceptance length the engine was told to produce (synthetic acceptance);
                # empty for a real drafter's point.
                "synthetic_length": synthetic.requested_length(job.spec),
                "map_key": synthetic.map_key(job),  # its proposer: a drafter map's curves share it
            }
            row.update(outcome.metrics if outcome and outcome.error is None else {})
            if point.hash in ratios:
                row.update(ratios[point.hash].as_metrics())
            rows.append(row)
    return pd.DataFrame(rows)
