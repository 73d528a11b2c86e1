"""The sweep-wide table and the baseline pairing, from synthetic outcomes."""

from __future__ import annotations

import dataclasses
import math

from pipeline.config import JobConfig, LoadConfig, SpecConfig
from pipeline.run.outcomes import PointOutcome
from pipeline.run.plan import plan_sweep
from pipeline.run.summary import comparisons, frame


def _plan():
    jobs = [
        dataclasses.replace(JobConfig(), spec=SpecConfig(method="ngram", k=k), load=LoadConfig(request_rate=r))
        for k in (3, 5)
        for r in (1.0, 2.0)
    ]
    return plan_sweep(jobs)


def test_pairs_each_point_with_its_own_rate_and_reports_failures() -> None:
    plan = _plan()
    base_r1, base_r2 = plan.groups[0].points
    outcomes = {
        base_r1.hash: PointOutcome(base_r1.hash, "b1", {"median_tpot_ms": 40.0, "output_throughput": 100.0}),
        base_r2.hash: PointOutcome(base_r2.hash, "b2", error="server exited with code 1", resumed=False),
    }
    for group in plan.groups[1:]:
        for p in group.points:
            outcomes[p.hash] = PointOutcome(p.hash, "s", {"median_tpot_ms": 20.0, "output_throughput": 150.0})
    ratios = comparisons(plan, outcomes)
    rate1 = [p for g in plan.groups[1:] for p in g.points if p.job.load.request_rate == 1.0]
    assert set(ratios) == {p.hash for p in rate1}  # no ratio against the failed baseline at rate 2
    assert ratios[rate1[0].hash]["speedup_median_tpot"] == 2.0
    assert ratios[rate1[0].hash]["output_throughput_ratio"] == 1.5
    table = frame(plan, outcomes, ratios).set_index("point")
    assert table.loc["baseline-r2", "status"] == "failed" and "exited" in table.loc["baseline-r2", "error"]
    assert table.loc["ngram-k5-r1", "speedup_median_tpot"] == 2.0
    assert math.isnan(table.loc["ngram-k5-r2", "speedup_median_tpot"])
    assert list(table.index) == [
        "baseline-r1",
        "baseline-r2",
        "ngram-k3-r1",
        "ngram-k3-r2",
        "ngram-k5-r1",
        "ngram-k5-r2",
    ]


def test_resumed_and_missing_points_are_labelled() -> None:
    plan = _plan()
    first = plan.points[0]
    table = frame(plan, {first.hash: PointOutcome(first.hash, "old", {"median_tpot_ms": 1.0}, resumed=True)}, {})
    assert table["status"].tolist()[0] == "resumed" and set(table["status"].tolist()[1:]) == {"not run"}
