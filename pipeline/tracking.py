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
from pipeline.redact import MASK, is_secret_name, shell_line

# A progress bar per downloaded artifact buries the report's and the gate's output.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
# MLflow retries a write to an unreachable server for minutes by default; a sweep journals the
# write instead (pipeline/journal.py) and keeps measuring, so a few seconds of retries do.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")

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
    mlflow.set_tracking_uri(store.tracking_uri)
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


def check_reachable(store: Store, timeout_s: float = 5.0) -> None:
    """Fail fast on a tracking server that does not answer; MLflow itself retries for minutes."""
    if not store.tracking_uri.startswith(("http://", "https://")):
        return
    import httpx

    base = store.tracking_uri.rstrip("/")
    try:
        httpx.get(base + "/health", timeout=timeout_s, trust_env=False).raise_for_status()
        # /health answers everyone; a search is what MLflow's basic-auth app asks credentials for.
        search = httpx.get(base + "/api/2.0/mlflow/experiments/search", params={"max_results": 1},
                           auth=_credentials(), timeout=timeout_s, trust_env=False)  # fmt: skip
    except httpx.HTTPError as exc:
        raise TrackingUnreachable(
            f"tracking.uri={store.tracking_uri} does not answer ({type(exc).__name__}: {exc}); start it with "
            f"`make tracking-server` (docs/cluster.md), fix the address, or drop tracking.uri for the local store"
        ) from exc
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
        return [PointRun(r.info.run_id, r.data.tags.get("point_hash", ""), r.info.status,
                         r.data.tags.get("status") == "finished", r.data.tags.get(CONFIRMATION_TAG),
                         dict(r.data.metrics)) for r in runs]  # fmt: skip

    def finished_points(self) -> dict[str, FinishedPoint]:
        """Points measured to the end by earlier runs of this experiment, by point hash."""
        runs = self.client.search_runs(
            [self.experiment_id], filter_string="tags.status = 'finished' and attributes.status = 'FINISHED'"
        )
        found: dict[str, FinishedPoint] = {}
        for run in runs:  # newest first: the latest measurement of a point wins
            if CONFIRMATION_TAG in run.data.tags:
                continue
            key = run.data.tags.get("point_hash")
            if key and key not in found:
                found[key] = FinishedPoint(run.info.run_id, dict(run.data.metrics))
        return found


class SweepReader:
    """What the report needs from MLflow: a sweep's parent run and its artifacts."""

    def __init__(self, tracking_uri: str) -> None:
        self.tracking_uri = tracking_uri
        self.client = MlflowClient(tracking_uri)

    def find_parent(self, ref: str) -> str:
        """A parent run id as given, or the newest sweep run of the experiment named ``ref``."""
        experiment = self.client.get_experiment_by_name(ref)
        if experiment is None:
            try:
                run = self.client.get_run(ref)
            except Exception as exc:  # noqa: BLE001 - MLflow raises its own types for a bad id
                names = sorted(e.name for e in self.client.search_experiments())
                raise TrackingError(f"{ref!r} is neither an experiment ({names}) nor a run id") from exc
            if run.data.tags.get("role") != "sweep":
                parent = run.data.tags.get("mlflow.parentRunId")
                raise TrackingError(f"run {ref} is one point of a sweep; give its parent run {parent}")
            return ref
        runs = self.client.search_runs(
            [experiment.experiment_id], "tags.role = 'sweep'", order_by=["attributes.start_time DESC"], max_results=1
        )
        if not runs:
            raise TrackingError(f"experiment {ref!r} has no sweep run yet")
        return runs[0].info.run_id

    def title(self, run_id: str) -> str:
        run = self.client.get_run(run_id)
        return f"{run.data.tags.get('sweep_name', '')} ({run.info.run_name})"

    def params(self, run_id: str) -> dict[str, str]:
        return dict(self.client.get_run(run_id).data.params)

    def run_url(self, run_id: str) -> str:
        """The page of a run of this sweep's experiment in the MLflow UI, with "{run}" for the run's id:
        the tracking server's own UI, or `python -m pipeline.ui --port 5000` for a local store."""
        base = self.tracking_uri if self.tracking_uri.startswith(("http://", "https://")) else LOCAL_UI
        experiment = self.client.get_run(run_id).info.experiment_id
        return f"{base.rstrip('/')}/#/experiments/{experiment}/runs/{{run}}"

    def log_figure(self, run_id: str, figure: Any, artifact_file: str) -> None:
        """A figure MLflow's artifact viewer shows (Plotly: an HTML page that loads plotly.js from its CDN)."""
        self.client.log_figure(run_id, figure, artifact_file)

    def log_metrics(self, run_id: str, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            self.client.log_metric(run_id, key, value)

    def newest_with_metric(self, key: str) -> tuple[str, dict[str, float], str] | None:
        """The newest sweep run of any experiment carrying metric ``key``: (run id, its
        metrics, its title)."""
        ids = [e.experiment_id for e in self.client.search_experiments()]
        if not ids:
            return None
        runs = self.client.search_runs(ids, f"tags.role = 'sweep' and metrics.{key} > 0",
                                       order_by=["attributes.start_time DESC"], max_results=1)  # fmt: skip
        if not runs:
            return None
        run = runs[0]
        return run.info.run_id, dict(run.data.metrics), self.title(run.info.run_id)

    def download(self, run_id: str, path: str, into: Path) -> Path | None:
        """An artifact of the run, or None where it has none by that name."""
        into.mkdir(parents=True, exist_ok=True)
        try:
            return Path(self.client.download_artifacts(run_id, path, str(into)))
        except Exception:  # noqa: BLE001 - absence is reported by the caller, in words
            return None

    def log_file(self, run_id: str, path: Path, folder: str) -> None:
        self.client.log_artifact(run_id, str(path), folder)

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])


# MLflow has no aliases for runs: the gate's pinned reference is an experiment tag holding one.
PIN_TAG = "specsweep.gate.reference"


@dataclass(frozen=True)
class ChildRun:
    run_id: str
    name: str
    tags: dict[str, str]
    metrics: dict[str, float]


class HistoryReader(SweepReader):
    """What the regression gate reads: a sweep's points, the earlier runs of that sweep, its pin."""

    def experiment_of(self, run_id: str) -> str:
        return str(self.client.get_run(run_id).info.experiment_id)

    def children(self, parent_id: str) -> list[ChildRun]:
        """The sweep's finished point runs (gate confirmations included: they carry a tag)."""
        experiment = self.experiment_of(parent_id)
        runs = self.client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent_id}'", max_results=5000)
        return [ChildRun(r.info.run_id, r.info.run_name or r.info.run_id, dict(r.data.tags), dict(r.data.metrics))
                for r in runs if r.info.status == "FINISHED"]  # fmt: skip

    def past_sweeps(self, parent_id: str) -> list[str]:
        """Finished runs of the same sweep that started before this one, newest first."""
        run = self.client.get_run(parent_id)
        name = run.data.tags.get("sweep_name", "")
        runs = self.client.search_runs(
            [run.info.experiment_id],
            f"tags.role = 'sweep' and attributes.status = 'FINISHED' and attributes.start_time < {run.info.start_time}",
            order_by=["attributes.start_time DESC"], max_results=500,
        )  # fmt: skip
        return [r.info.run_id for r in runs if r.data.tags.get("sweep_name") == name]

    def started_ms(self, run_id: str) -> int:
        return int(self.client.get_run(run_id).info.start_time)

    def pinned(self, experiment_id: str) -> str | None:
        return self.client.get_experiment(experiment_id).tags.get(PIN_TAG)

    def pin(self, run_id: str | None, experiment_id: str) -> None:
        """Pin ``run_id`` as the experiment's reference (None unpins), shown in the UI's note."""
        if run_id is None:
            self.client.delete_experiment_tag(experiment_id, PIN_TAG)
            self.client.set_experiment_tag(
                experiment_id, "mlflow.note.content", "Regression gate: no pinned reference."
            )
            return
        self.client.set_experiment_tag(experiment_id, PIN_TAG, run_id)
        note = (f"Regression gate reference: sweep run `{run_id}` (pinned {time.strftime('%Y-%m-%d %H:%M')}). "
                f"Unpin with `python -m pipeline.gate unpin {run_id}`.")  # fmt: skip
        self.client.set_experiment_tag(experiment_id, "mlflow.note.content", note)

    def sweep_run(self, run_id: str) -> None:
        """Raise unless ``run_id`` is a sweep's parent run that finished."""
        try:
            run = self.client.get_run(run_id)
        except Exception as exc:  # noqa: BLE001 - MLflow raises its own types for a bad id
            raise TrackingError(f"no run {run_id!r} in {self.tracking_uri}; give a sweep's parent run id") from exc
        if run.data.tags.get("role") != "sweep":
            parent = run.data.tags.get("mlflow.parentRunId", "?")
            raise TrackingError(f"run {run_id} is one point of a sweep, not a sweep; pin its parent run {parent}")
        if run.info.status != "FINISHED":
            raise TrackingError(f"sweep run {run_id} is {run.info.status}, not FINISHED; pin a finished sweep run")

    def ran_before(self, experiment_id: str, fingerprint: str, engine_versions: str) -> str | None:
        """A finished sweep run with this fingerprint and these engine versions, if any."""
        runs = self.client.search_runs(
            [experiment_id],
            f"tags.role = 'sweep' and attributes.status = 'FINISHED' and tags.fingerprint = '{fingerprint}' "
            f"and tags.`engine.versions` = '{engine_versions}'",
            max_results=1,
        )  # fmt: skip
        return runs[0].info.run_id if runs else None
