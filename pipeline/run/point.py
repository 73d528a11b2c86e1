"""One point on a running server: measure its window, keep it on disk, record it in its MLflow run."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.analysis import trust
from pipeline.analysis.samples import Sample
from pipeline.engines import synthetic
from pipeline.engines.acceptance import normalized
from pipeline.engines.base import Server
from pipeline.engines.hardware import hardware_tags, where_am_i
from pipeline.identity import Identity
from pipeline.load.loadgen import Window
from pipeline.record import vllm_result
from pipeline.record.journal import JournaledTracker
from pipeline.record.tracking import CONFIRMATION_TAG, Tracker, flatten_params
from pipeline.run.job import Target, point_requests
from pipeline.run.measure import Measurement, MeasurementError, measure
from pipeline.run.outcomes import PointOutcome
from pipeline.run.plan import Point
from pipeline.run.plumbing import diskfull
from pipeline.run.progress import events


def _what_it_is(point: Point, identity: Identity) -> dict[str, str]:
    """What every point run says of itself, measured or predicted: its role, engine, method and
    identity (pipeline.identity: the settings hash and the system and data it resolved to)."""
    return {
        "role": point.role,
        "engine": point.job.engine.name,
        "spec.method": point.job.spec.method,
        **identity.tags(),
        **({"baseline_hash": point.baseline_hash} if point.baseline_hash else {}),
    }


def point_tags(
    point: Point, target: Target, identity: Identity, version: str, confirms: str | None = None
) -> dict[str, str]:
    """A measured point run's tags: what it is, its identity, and the node it ran on."""
    return {
        **({CONFIRMATION_TAG: confirms} if confirms else {}),
        **_what_it_is(point, identity),
        "engine.version": version,
        "engine.distribution": target.install.distribution,
        # Never a drafter's own numbers: the report labels such points "synthetic acceptance L=...".
        **({"spec.synthetic": label} if (label := synthetic.label(point.job.spec)) else {}),
        # gate.mode=paired matches a night's two builds by these (the build, its pair, the point).
        "gate.build": point.job.build,
        "gate.pair": str(point.job.repeat),
        "gate.pair_label": point.pair_label,
        **({"gate.pair_key": point.job.pair_key} if point.job.pair_key else {}),
        "model.revision": identity.system.model,
        **hardware_tags(target.on_gpu),
        **where_am_i(),
    }


def open_point_run(
    tracker: JournaledTracker | Tracker, parent: str, point: Point, tags: Mapping[str, str], name: str | None = None
) -> str:
    """A point's run under the sweep's parent run, measured or predicted alike: named by its
    label, tagged, its settings as params."""
    run_id = tracker.start_run(name or point.label, dict(tags), parent)
    tracker.log_params(run_id, flatten_params(point.job))
    return run_id


def record_predicted(
    tracker: JournaledTracker | Tracker,
    parent: str,
    search: str,
    identity: Identity,
    point: Point,
    metrics: dict[str, float],
) -> str:
    """A point a search computed instead of measuring, as a run of its own beside the measured
    ones: the same tags of what it is and of its identity, so a reader keys it alike; no
    requests; status 'predicted', never 'finished', so resume and the gate never take it for a
    measurement. Its run id."""
    tags = {**_what_it_is(point, identity), "predicted": "true", "status": "predicted", "search": search}
    run_id = open_point_run(tracker, parent, point, tags, f"{point.label} (predicted)")
    tracker.log_metrics(run_id, metrics)
    tracker.end_run(run_id)
    return run_id


def point_metrics(measurement: Measurement, k: int, startup_s: float | None) -> dict[str, float]:
    # One scale for every engine: L over the window, as its engine reads it, and the alpha it
    # implies at k. Each engine's native figures keep their own names.
    on_scale = measurement.on_scale
    k_eff = measurement.acceptance.effective_k or k
    return {
        **measurement.summary,
        **measurement.acceptance.as_metrics(),
        **on_scale.metrics,
        **normalized(on_scale.length, k_eff),
        **measurement.prefix_cache.as_metrics(),
        **measurement.kv_capacity,
        **measurement.validity,
        **({"server_startup_s": startup_s} if startup_s is not None else {}),
    }


def measure_point(
    point: Point,
    server: Server,
    tokenizer: Any,
    tracker: JournaledTracker,
    run_ids: dict[str, str],
    out_dir: Path,
    first: bool,
    reporter: events.Reporter,
    vllm_result_mode: str,
    fixed: dict[str, float] | None = None,
) -> PointOutcome:
    """``vllm_result_mode``: the sweep's tracking.vllm_result (off, summary or detailed);
    ``fixed``: figures of the server's configuration, the same in every window (the draft's size)."""
    run_id = run_ids[point.hash]
    sends = point_requests(point.job, tokenizer)
    try:
        measurement = measure(
            server.base_url,
            point.job.model.id,
            point.job,
            sends.warmup if first else (),  # the server is warm after its first point
            sends.requests,
            sends.offsets,
            point.label,
            reporter,
        )
    except Exception as exc:  # noqa: BLE001 - one point's failure is data; the next point still runs
        message = str(exc) if isinstance(exc, MeasurementError) else f"{type(exc).__name__}: {exc}"
        print(f"[{point.label}] FAILED: {message}")
        window = exc.window if isinstance(exc, MeasurementError) else None
        if window is not None:  # a window stopped early: what it recorded is kept
            tracker.log_file(run_id, write_requests(out_dir / point.label, window))
            tracker.set_tags(run_id, {"window.stopped": message})
        return PointOutcome(point.hash, run_id, error=message)
    metrics = point_metrics(measurement, point.job.spec.k, server.startup_s if first else None) | sends.metrics
    metrics |= server_readings(server) | (fixed or {})
    # On disk first: whatever happens to MLflow, the measurement is in the sweep's outputs.
    try:
        prompts = {r.index: r.prompt_tokens for r in sends.requests}
        point_dir = _write_point(point, measurement, metrics, prompts, out_dir, vllm_result_mode)
    except OSError as exc:
        if not diskfull.is_disk_full(exc):
            raise
        message = diskfull.message(exc, out_dir / point.label)
        print(f"[{point.label}] FAILED: {message}")
        tracker.log_metrics(run_id, metrics)  # MLflow may live on another disk: the numbers are kept there
        return PointOutcome(point.hash, run_id, metrics, error=message)
    _log_point(tracker, run_id, point, measurement, metrics, point_dir)
    if sends.tags:
        tracker.set_tags(run_id, sends.tags)
    # The window's requests travel with the outcome: a search reads them from here, not back
    # from MLflow or the disk (the same table as requests.csv).
    rows = pd.DataFrame([r.as_row() for r in measurement.window.records])
    return PointOutcome(point.hash, run_id, metrics, sample=Sample.from_requests(rows, metrics["duration"]))


def server_readings(server: Server) -> dict[str, float]:
    """What the server's own process tree shows after the window: memory and niceness."""
    readings = {
        "server_rss_mib": server.rss_mib(),
        "server_gpu_memory_mib": server.gpu_memory_mib(),
        "server_niceness": server.niceness(),
    }
    return {name: float(value) for name, value in readings.items() if value is not None}


def _write_point(
    point: Point,
    measurement: Measurement,
    metrics: dict[str, float],
    prompts: dict[int, int | None],
    out_dir: Path,
    vllm_result_mode: str,
) -> Path:
    """The point's folder in the sweep's outputs: requests.csv, summary.json, config.json and,
    where tracking.vllm_result asks, the vllm bench serve result file."""
    point_dir = write_requests(out_dir / point.label, measurement.window).parent
    (point_dir / "summary.json").write_text(json.dumps(metrics, indent=2, default=str))
    (point_dir / "config.json").write_text(json.dumps(flatten_params(point.job), indent=2))
    if vllm_result_mode != "off":
        records, detailed = measurement.window.records, vllm_result_mode == "detailed"
        vllm_result.write(
            point_dir / vllm_result.FILE_NAME, point.job, point.label, metrics, records, detailed, prompts
        )
    return point_dir


def _log_point(
    tracker: JournaledTracker,
    run_id: str,
    point: Point,
    measurement: Measurement,
    metrics: dict[str, float],
    point_dir: Path,
) -> None:
    tracker.log_metrics(run_id, metrics)
    tracker.log_file(run_id, point_dir / "summary.json")
    tracker.log_file(run_id, point_dir / "requests.csv")
    tracker.log_file(run_id, point_dir / vllm_result.FILE_NAME)  # where tracking.vllm_result wrote one
    tags = {"acceptance.source": measurement.on_scale.source}
    if measurement.acceptance.note:
        print(f"[{point.label}] {measurement.acceptance.note}")
        tags["acceptance.note"] = measurement.acceptance.note
    tags["prefix_cache.policy"] = point.job.engine.prefix_cache
    tracker.set_tags(run_id, tags)
    failed = trust.failed_checks(measurement.validity)
    if failed:
        print(f"[{point.label}] validity checks failed: {', '.join(failed)} (the report says why, and what to do)")


def write_requests(folder: Path, window: Window) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([r.as_row() for r in window.records]).to_csv(folder / "requests.csv", index=False)
    return folder / "requests.csv"


def finish_run(tracker: JournaledTracker, outcome: PointOutcome, out_dir: Path, interrupted: bool) -> None:
    assert outcome.run_id is not None
    tracker.log_file(outcome.run_id, out_dir / "server_command.txt")
    tracker.log_file(outcome.run_id, out_dir / "server.log")
    if outcome.error is None:
        tracker.set_tags(outcome.run_id, {"status": "finished"})
    tracker.end_run(outcome.run_id, error=outcome.error, killed=interrupted and outcome.error == "interrupted")
