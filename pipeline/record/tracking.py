"""Writing to MLflow; with :mod:`pipeline.record.readers`, which reads, the only modules that import it.

One experiment per sweep name, one parent run per invocation, one child run per measured
server configuration and rate (baselines included, tagged with their role). The default
store is SQLite under the project's ``mlruns/``, with the artifact root set explicitly
beside it, and is created by the driver before any job starts.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from pipeline.config import JobConfig, TrackingConfig
from pipeline.identity import Identity
from pipeline.redact import MASK, is_secret_name, shell_line

DB_NAME = "mlflow.db"
# On a point the regression gate re-measured: the run id it confirms. Such runs are not the
# point's measurement (resume and the gate's history skip them).
CONFIRMATION_TAG = "gate.confirmation_of"
LOCAL_UI = "http://127.0.0.1:5000"  # `python -m pipeline.ui --port 5000` serves a local store here
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


def command_store(given: str | None, project_root: Path) -> Store:
    """The store a command reads (pipeline.report, pipeline.gate, pipeline.ui): ``--tracking-uri``,
    else MLFLOW_TRACKING_URI (as MLflow's own clients and a sweep's tracking.uri read it), else the
    project's own SQLite store."""
    uri = given or os.environ.get("MLFLOW_TRACKING_URI")
    return Store(uri, None) if uri else resolve_store(TrackingConfig(), project_root)


def prepare(store: Store, experiment: str) -> str:
    """Create the store (migrations run here, once) and the experiment; return its id."""
    if not store.tracking_uri.startswith("sqlite:///"):
        return _prepare(store, experiment)
    from filelock import FileLock

    database = Path(store.tracking_uri.removeprefix("sqlite:///"))
    database.parent.mkdir(parents=True, exist_ok=True)
    # Two sweeps started together on a new store would both run MLflow's first migration and
    # one would fail on the other's tables: the first creates the store, the second waits.
    with FileLock(str(database) + ".lock", timeout=300):
        return _prepare(store, experiment)


def _prepare(store: Store, experiment: str) -> str:
    # MLflow also exports the address as MLFLOW_TRACKING_URI for subprocesses; a sweep reads that
    # variable as its default store, so every process this one starts (a test's next sweep, a
    # server) would inherit this store as its default. The variable is put back as it was.
    before = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(store.tracking_uri)
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before
    try:
        client = MlflowClient(store.tracking_uri)
        found = client.get_experiment_by_name(experiment)
    except mlflow.exceptions.MlflowException as exc:  # a store MLflow refuses (its file store), or a refusing server
        reason = str(exc).split(". ")[0]
        raise TrackingError(
            f"tracking.uri={store.tracking_uri} cannot be used ({reason}); give a sqlite:///path/to/mlflow.db "
            f"database or an `mlflow server` address, or drop tracking.uri for the project's own store"
        ) from exc
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(experiment, artifact_location=store.artifact_root)
    except mlflow.exceptions.MlflowException:  # created meanwhile by a sweep on a tracking server
        found = client.get_experiment_by_name(experiment)
        if found is None:
            raise
        return found.experiment_id


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


def check_store_reachable(store: Store, timeout_s: float = 5.0) -> None:
    """Fail fast on a tracking server that does not answer; MLflow itself retries for minutes."""
    if not store.tracking_uri.startswith(("http://", "https://")):
        return
    import httpx

    base = store.tracking_uri.rstrip("/")
    try:
        httpx.get(base + "/health", timeout=timeout_s, trust_env=False).raise_for_status()
        # /health answers everyone; a search is what MLflow's basic-auth app asks credentials for.
        search = httpx.get(
            base + "/api/2.0/mlflow/experiments/search",
            params={"max_results": 1},
            auth=_credentials(),
            timeout=timeout_s,
            trust_env=False,
        )
    except httpx.HTTPError as exc:
        raise TrackingUnreachable(
            f"tracking.uri={store.tracking_uri} does not answer ({type(exc).__name__}: {exc}); start it with "
            f"`make tracking-server` (docs/cluster.md), fix the address, or drop tracking.uri for the local store"
        ) from exc
    if search.status_code == 403 and "Invalid Host header" in search.text:
        raise TrackingError(
            f"tracking.uri={store.tracking_uri} refuses the host name it is called by: MLflow's server answers only "
            f"the names in its --allowed-hosts (by default localhost and private IP addresses); start it with "
            f"--allowed-hosts <this address's host:port> (make tracking-server-auth MLFLOW_ALLOWED_HOSTS=..., "
            f"docs/cluster.md), or call it by its private IP address"
        )
    if search.status_code in (401, 403):
        given = "refuses the credentials in" if _credentials() else "asks for credentials: set"
        raise TrackingError(
            f"tracking.uri={store.tracking_uri} {given} MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD "
            f"(HTTP {search.status_code}); put them in the environment of this shell and of every Ray node, "
            f"never in the config (docs/cluster.md)"
        )


def _credentials() -> tuple[str, str] | None:
    """MLflow's own basic-auth variables, which its client sends with every request."""
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    return (user, password) if user and password else None


class TrackingError(RuntimeError):
    pass


class TrackingUnreachable(TrackingError):
    """The tracking server does not answer: infrastructure, not input."""


@dataclass(frozen=True)
class FinishedPoint:
    run_id: str
    metrics: dict[str, float]
    identity: Identity  # as the run recorded it (a part it did not record is unknown)


@dataclass(frozen=True)
class PointRun:
    run_id: str
    point_hash: str
    status: str  # MLflow's: RUNNING, FINISHED, FAILED, KILLED
    finished: bool  # measured to the end (tags.status = finished)
    confirms: str | None  # the run a regression gate's re-measurement confirms
    metrics: dict[str, float]


class Tracker:
    """Runs addressed by id, not MLflow's active-run stack: a sweep's child runs are made in
    other processes (Ray workers) than its parent run."""

    def __init__(self, store: Store, experiment_id: str) -> None:
        self.store = store
        self.experiment_id = experiment_id
        self.client = MlflowClient(store.tracking_uri)

    def start_run(self, name: str, tags: Mapping[str, str], parent_id: str | None = None) -> str:
        tags = dict(tags) | ({"mlflow.parentRunId": parent_id} if parent_id else {})
        return self.client.create_run(self.experiment_id, run_name=name, tags=tags).info.run_id

    def run_tagged(self, key: str, value: str) -> str | None:
        """The run of this experiment whose tag ``key`` is ``value``, if there is one."""
        found = self.client.search_runs([self.experiment_id], filter_string=f"tags.`{key}` = '{value}'", max_results=1)
        return found[0].info.run_id if found else None

    def end_run(self, run_id: str, error: str | None = None, killed: bool = False) -> None:
        if error is not None:
            self.set_tags(run_id, {"status": "failed", "error": error[:5000]})
        status = "KILLED" if killed else ("FAILED" if error is not None else "FINISHED")
        self.client.set_terminated(run_id, status=status)

    def log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        self.client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()])

    def log_metrics(self, run_id: str, metrics: Mapping[str, float]) -> None:
        now = int(time.time() * 1000)
        self.client.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in _finite(metrics).items()])

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_text(self, run_id: str, text: str, name: str) -> None:
        self.client.log_text(run_id, text, name)

    def log_json(self, run_id: str, data: Any, name: str) -> None:
        self.client.log_text(run_id, json.dumps(data, indent=2, default=str), name)

    def log_file(self, run_id: str, path: Path, folder: str | None = None) -> None:
        if path.is_file():
            self.client.log_artifact(run_id, str(path), folder)

    def log_table(self, run_id: str, frame: Any, name: str) -> None:
        """A table the MLflow UI shows in its artifact view (and ``mlflow.load_table`` reads)."""
        self.client.log_table(run_id, frame, name)

    def point_runs(self, parent_id: str) -> list[PointRun]:
        """The point runs under a sweep's parent, newest first, whatever their state."""
        runs = self.client.search_runs(
            [self.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'", max_results=5000
        )
        return [
            PointRun(
                r.info.run_id,
                r.data.tags.get("point_hash", ""),
                r.info.status,
                r.data.tags.get("status") == "finished",
                r.data.tags.get(CONFIRMATION_TAG),
                dict(r.data.metrics),
            )
            for r in runs
        ]

    def finished_points(self) -> dict[str, list[FinishedPoint]]:
        """Points measured to the end by earlier runs of this experiment, by settings hash
        (``point_hash``), newest first, each with the identity it recorded: whether one is this
        point's is :func:`pipeline.identity.reusable`'s to say."""
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string="tags.status = 'finished' and attributes.status = 'FINISHED'",
            max_results=50000,
        )
        found: dict[str, list[FinishedPoint]] = {}
        for run in runs:  # newest first
            tags = run.data.tags
            if CONFIRMATION_TAG in tags or not tags.get("point_hash"):
                continue
            point = FinishedPoint(run.info.run_id, dict(run.data.metrics), Identity.from_tags(tags))
            found.setdefault(tags["point_hash"], []).append(point)
        return found
