"""Tracking against a real MLflow SQLite store in a temporary folder."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from pipeline.config import EngineConfig, JobConfig
from pipeline.tracking import Tracker, flatten_params, prepare, resolve_store


def test_params_are_flat_and_secrets_masked() -> None:
    job = dataclasses.replace(
        JobConfig(), engine=EngineConfig(env={"HF_TOKEN": "hf_secret"}, extra_args=["--api-key", "sk-secret"])
    )
    params = flatten_params(job)
    assert params["spec.method"] == "ngram" and params["load.request_rate"] == "1.0"
    assert params["engine.env.HF_TOKEN"] == "***"
    assert "sk-secret" not in params["engine.extra_args"]
    assert all("secret" not in v for v in params.values())


def test_store_runs_and_failed_child(tmp_path: Path) -> None:
    store = resolve_store(JobConfig().tracking, tmp_path)
    assert store.tracking_uri == f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    experiment_id = prepare(store, "unit")
    assert prepare(store, "unit") == experiment_id  # idempotent
    tracker = Tracker(store, experiment_id)
    with tracker.parent("p", {"role": "sweep"}) as parent_id:
        with tracker.child("ok", {"a": "1"}, {"role": "baseline"}) as ok_id:
            tracker.log_metrics({"median_tpot_ms": 12.5, "nan_metric": float("nan")})
            tracker.log_text("cmd\n", "server_command.txt")
        with pytest.raises(RuntimeError):
            with tracker.child("bad", {"a": "2"}, {"role": "speculative"}) as bad_id:
                raise RuntimeError("server died")
        tracker.log_metrics({"speedup_median_tpot": 2.0}, run_id=ok_id)
    client = MlflowClient(store.tracking_uri)
    ok = client.get_run(ok_id)
    assert ok.info.status == "FINISHED" and ok.data.metrics["median_tpot_ms"] == 12.5
    assert "nan_metric" not in ok.data.metrics and ok.data.metrics["speedup_median_tpot"] == 2.0
    assert ok.data.tags["mlflow.parentRunId"] == parent_id and ok.data.params["a"] == "1"
    bad = client.get_run(bad_id)
    assert bad.info.status == "FAILED" and "server died" in bad.data.tags["error"]
    artifacts = Path(mlflow.artifacts.download_artifacts(run_id=ok_id, tracking_uri=store.tracking_uri))
    assert (artifacts / "server_command.txt").read_text() == "cmd\n"
    assert str(tmp_path / "mlruns" / "artifacts") in client.get_experiment(experiment_id).artifact_location
