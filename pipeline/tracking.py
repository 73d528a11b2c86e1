"""MLflow: the only module that imports it.

One experiment per sweep name, one parent run per invocation, one child run per measured
server configuration and rate (baselines included, tagged with their role). The default
store is SQLite under the project's ``mlruns/``, with the artifact root set explicitly
beside it, and is created by the driver before any job starts.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
from mlflow.tracking import MlflowClient

from pipeline.config import JobConfig, TrackingConfig
from pipeline.redact import MASK, is_secret_name, shell_line

DB_NAME = "mlflow.db"
MAX_PARAM_CHARS = 6000


@dataclass(frozen=True)
class Store:
    tracking_uri: str
    artifact_root: str | None  # None: the tracking server decides


def resolve_store(tracking: TrackingConfig, project_root: Path) -> Store:
    if tracking.uri:
        return Store(tracking_uri=tracking.uri, artifact_root=None)
    mlruns = (project_root / "mlruns").resolve()
    return Store(tracking_uri=f"sqlite:///{mlruns / DB_NAME}", artifact_root=(mlruns / "artifacts").as_uri())


def prepare(store: Store, experiment: str) -> str:
    """Create the store (migrations run here, once) and the experiment; return its id."""
    if store.tracking_uri.startswith("sqlite:///"):
        Path(store.tracking_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(store.tracking_uri)
    client = MlflowClient(store.tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is not None:
        return found.experiment_id
    return client.create_experiment(experiment, artifact_location=store.artifact_root)


def flatten_params(job: JobConfig) -> dict[str, str]:
    """The config as dotted params, secrets masked, long values cut to MLflow's limit."""
    flat: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            if not value:
                flat[prefix] = "{}"
            for key, item in value.items():
                walk(f"{prefix}.{key}", item)
        elif isinstance(value, list):
            flat[prefix] = shell_line(str(v) for v in value)
        elif is_secret_name(prefix):
            flat[prefix] = MASK
        else:
            flat[prefix] = "null" if value is None else str(value)

    for key, value in dataclasses.asdict(job).items():
        walk(key, value)
    return {k: v[:MAX_PARAM_CHARS] for k, v in flat.items()}


def _finite(metrics: Mapping[str, float]) -> dict[str, float]:
    # MLflow stores NaN and inf, but the UI's compare view chokes on them; a missing metric is clearer.
    return {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}


class Tracker:
    def __init__(self, store: Store, experiment_id: str) -> None:
        self.store = store
        self.experiment_id = experiment_id
        mlflow.set_tracking_uri(store.tracking_uri)

    @contextmanager
    def parent(self, name: str, tags: Mapping[str, str]) -> Iterator[str]:
        with mlflow.start_run(experiment_id=self.experiment_id, run_name=name, tags=dict(tags)) as run:
            yield run.info.run_id

    @contextmanager
    def child(self, name: str, params: Mapping[str, str], tags: Mapping[str, str]) -> Iterator[str]:
        """A nested run; an exception inside marks it FAILED with the error as a tag."""
        with mlflow.start_run(experiment_id=self.experiment_id, run_name=name, nested=True, tags=dict(tags)) as run:
            mlflow.log_params(dict(params))
            try:
                yield run.info.run_id
            except BaseException as exc:
                mlflow.set_tag("error", f"{type(exc).__name__}: {exc}"[:5000])
                mlflow.set_tag("status", "failed")
                raise

    def log_metrics(self, metrics: Mapping[str, float], run_id: str | None = None) -> None:
        """Log to the active run, or to ``run_id`` (a run that has already ended)."""
        if run_id is None:
            mlflow.log_metrics(_finite(metrics))
            return
        client = MlflowClient(self.store.tracking_uri)
        for key, value in _finite(metrics).items():
            client.log_metric(run_id, key, value)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        mlflow.set_tags(dict(tags))

    def log_text(self, text: str, name: str) -> None:
        mlflow.log_text(text, name)

    def log_json(self, data: Any, name: str) -> None:
        mlflow.log_text(json.dumps(data, indent=2, default=str), name)

    def log_file(self, path: Path, folder: str | None = None) -> None:
        if path.is_file():
            mlflow.log_artifact(str(path), folder)
