"""Reading MLflow back: a sweep's parent run and its artifacts (the report), and its history (the gate).

With :mod:`pipeline.record.tracking`, which writes, the only modules that import MLflow's client
(``pipeline.ui`` starts MLflow's own server as a command, and asks its way here).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow.entities import RunTag
from mlflow.tracking import MlflowClient

from pipeline.record.tracking import LOCAL_UI, TrackingError


def find_experiment(tracking_uri: str, name: str | None) -> str:
    """The id of the experiment named so, or of the most recently updated sweep's."""
    client = MlflowClient(tracking_uri)
    if name:
        found = client.get_experiment_by_name(name)
        if found is None:
            names = sorted(e.name for e in client.search_experiments())
            raise TrackingError(f"no experiment named {name!r} in {tracking_uri}; there are: {names}")
        return found.experiment_id
    experiments = [e for e in client.search_experiments() if e.name != "Default"]
    if not experiments:
        raise TrackingError(f"{tracking_uri} holds no sweep yet; run `python -m pipeline.sweep` first")
    return max(experiments, key=lambda e: e.last_update_time or 0).experiment_id


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
            except Exception as exc:
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

    def experiment_of(self, run_id: str) -> str:
        return str(self.client.get_run(run_id).info.experiment_id)

    def children(self, parent_id: str) -> list[ChildRun]:
        """The sweep's finished point runs (gate confirmations included: they carry a tag)."""
        experiment = self.experiment_of(parent_id)
        runs = self.client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent_id}'", max_results=5000)
        return [
            ChildRun(r.info.run_id, r.info.run_name or r.info.run_id, dict(r.data.tags), dict(r.data.metrics))
            for r in runs
            if r.info.status == "FINISHED"
        ]

    def newest_with_metric(
        self, key: str, tag: tuple[str, str] | None = None
    ) -> tuple[str, dict[str, float], str] | None:
        """The newest sweep run of any experiment carrying metric ``key`` (and ``tag``, a key and
        its value): (run id, its metrics, its title)."""
        ids = [e.experiment_id for e in self.client.search_experiments()]
        if not ids:
            return None
        wanted = f"tags.role = 'sweep' and metrics.{key} > 0"
        if tag is not None:
            wanted += f" and tags.`{tag[0]}` = '{tag[1]}'"
        runs = self.client.search_runs(ids, wanted, order_by=["attributes.start_time DESC"], max_results=1)
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

    def past_sweeps(self, parent_id: str) -> list[str]:
        """Finished runs of the same sweep that started before this one, newest first."""
        run = self.client.get_run(parent_id)
        name = run.data.tags.get("sweep_name", "")
        runs = self.client.search_runs(
            [run.info.experiment_id],
            f"tags.role = 'sweep' and attributes.status = 'FINISHED' and attributes.start_time < {run.info.start_time}",
            order_by=["attributes.start_time DESC"],
            max_results=500,
        )
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
        note = (
            f"Regression gate reference: sweep run `{run_id}` (pinned {time.strftime('%Y-%m-%d %H:%M')}). "
            f"Unpin with `python -m pipeline.gate unpin {run_id}`."
        )
        self.client.set_experiment_tag(experiment_id, "mlflow.note.content", note)

    def sweep_run(self, run_id: str) -> None:
        """Raise unless ``run_id`` is a sweep's parent run that finished."""
        try:
            run = self.client.get_run(run_id)
        except Exception as exc:
            raise TrackingError(f"no run {run_id!r} in {self.tracking_uri}; give a sweep's parent run id") from exc
        if run.data.tags.get("role") != "sweep":
            parent = run.data.tags.get("mlflow.parentRunId", "?")
            raise TrackingError(f"run {run_id} is one point of a sweep, not a sweep; pin its parent run {parent}")
        if run.info.status != "FINISHED":
            raise TrackingError(f"sweep run {run_id} is {run.info.status}, not FINISHED; pin a finished sweep run")
