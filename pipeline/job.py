"""One job: a speculative server and its baseline, measured alike, recorded in MLflow.

Everything that can be refused is checked in :func:`prepare`, before any server starts.
Each server then runs inside a context manager, so no process outlives its measurement,
and a failure of one role is recorded (its MLflow run marked failed, with the log tail)
without losing the other's results.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from pipeline.config import JobConfig, LoadConfig
from pipeline.engines import vllm
from pipeline.engines.base import EngineServer, ServerError, ServerSpec, free_port
from pipeline.hardware import hardware_tags, resolve_device
from pipeline.loadgen import arrival_offsets, arrivals_within
from pipeline.measure import Measurement, MeasurementError, measure
from pipeline.metrics import Comparison, compare
from pipeline.models import cache_root, load_tokenizer, resolve_model
from pipeline.redact import redact_text, secret_values
from pipeline.tracking import Tracker, flatten_params
from pipeline.workloads import Request, split_warmup


@dataclass(frozen=True)
class Target:
    """What every server of a job runs: the engine install, the device, the model paths."""

    install: vllm.VllmInstall
    on_gpu: bool
    model_path: str
    draft_path: str | None


def resolve_target(job: JobConfig, *, build: bool = True) -> Target:
    """Check the engine, device and models; ``build=False`` names embedded models unbuilt."""
    on_gpu = resolve_device(job.engine.device)
    install = vllm.detect_install(job.engine.python)
    vllm.validate_engine(job.engine, install, on_gpu)
    vllm.validate_spec(job.spec, install.version)
    model_path = resolve_model(job.model.id, build=build)
    draft = job.spec.draft_model
    draft_path = resolve_model(draft, target=model_path, build=build) if draft else None
    return Target(install, on_gpu, model_path, draft_path)


@dataclass(frozen=True)
class Prepared:
    """A job whose every refusable input has been checked; starting servers is next."""

    job: JobConfig
    target: Target
    warmup: tuple[Request, ...]
    requests: tuple[Request, ...]
    offsets: tuple[float, ...]  # when each request is due, seconds from the window start


def prepare(job: JobConfig) -> Prepared:
    target = resolve_target(job)
    tokenizer = load_tokenizer(target.model_path)
    offsets = schedule(job.load, job.seed)
    warmup, requests = split_warmup(job.workload, len(offsets), job.load.warmup_requests, job.seed, tokenizer)
    return Prepared(job, target, tuple(warmup), tuple(requests), tuple(offsets))


def schedule(load: LoadConfig, seed: int) -> list[float]:
    """The arrival times, from the seed alone: baseline and speculation get the same ones."""
    if load.duration_s is not None:
        return arrivals_within(load.duration_s, load.request_rate, load.burstiness, seed)
    return arrival_offsets(load.num_requests, load.request_rate, load.burstiness, seed)


def point_hash(job: JobConfig) -> str:
    """Identifies a measured point (server config, load, workload, seed), for resume."""
    point = dataclasses.asdict(job)
    for volatile in ("output_dir", "tracking", "sweep_name", "dry_run"):
        point.pop(volatile)
    return hashlib.sha256(json.dumps(point, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RoleResult:
    role: str  # "baseline" or "speculative"
    job: JobConfig
    run_id: str | None
    measurement: Measurement | None
    server_command: str
    startup_s: float | None = None
    error: str | None = None


def server_spec(target: Target, job: JobConfig, log_path: Path, port: int | None = None) -> ServerSpec:
    port = free_port(job.engine.host) if port is None else port
    launch = vllm.build_launch(
        install=target.install,
        engine=job.engine,
        spec=job.spec,
        model_path=target.model_path,
        draft_path=target.draft_path if job.spec.method != "none" else None,
        served_name=job.model.id,
        port=port,
        on_gpu=target.on_gpu,
        seed=job.seed,
        cache_dir=cache_root(),
    )
    return ServerSpec(
        engine="vllm",
        engine_version=str(target.install.version),
        command=tuple(launch.command),
        host=job.engine.host,
        port=port,
        log_path=log_path,
        startup_timeout_s=job.engine.startup_timeout_s,
        env=launch.env,
    )


def roles(job: JobConfig) -> list[tuple[str, JobConfig]]:
    """The servers a job measures, in order: the baseline, then speculation if any."""
    return [("baseline", job.baseline())] + ([("speculative", job)] if job.spec.method != "none" else [])


def _records_frame(measurement: Measurement) -> pd.DataFrame:
    return pd.DataFrame([r.as_row() for r in measurement.window.records])


def run_role(role: str, job: JobConfig, prepared: Prepared, tracker: Tracker, out_dir: Path) -> RoleResult:
    role_dir = out_dir / role
    role_dir.mkdir(parents=True, exist_ok=True)
    spec = server_spec(prepared.target, job, role_dir / "server.log")
    secrets = secret_values(spec.command, {**os.environ, **spec.env})
    command = spec.redacted_command()
    tags = {
        "role": role,
        "engine": "vllm",
        "engine.version": spec.engine_version,
        "engine.distribution": prepared.target.install.distribution,
        "spec.method": job.spec.method,
        "point_hash": point_hash(job),
        **hardware_tags(prepared.target.on_gpu),
    }
    run_id: str | None = None
    server: EngineServer | None = None
    try:
        with tracker.child(
            f"{role}-{job.spec.method}-k{job.spec.k}-r{job.load.request_rate:g}", flatten_params(job), tags
        ) as run_id:
            (role_dir / "server_command.txt").write_text(command + "\n")
            tracker.log_text(command + "\n", "server_command.txt")
            try:
                with EngineServer(spec) as server:
                    print(f"[{role}] server ready in {server.startup_s:.1f} s at {server.base_url}")
                    measurement = measure(
                        server.base_url,
                        job.model.id,
                        job,
                        prepared.warmup,
                        prepared.requests,
                        prepared.offsets,
                        f"{role} rate={job.load.request_rate:g}",
                    )
            finally:
                _redact_log(spec.log_path, secrets)
                tracker.log_file(spec.log_path)
            records = _records_frame(measurement)
            records.to_csv(role_dir / "requests.csv", index=False)
            tracker.log_file(role_dir / "requests.csv")
            metrics = {
                **measurement.summary,
                **measurement.acceptance.as_metrics(),
                **measurement.prefix_cache.as_metrics(),
                "server_startup_s": server.startup_s or 0.0,
            }
            tracker.log_metrics(metrics)
            tracker.log_json(metrics | {"acceptance_source": measurement.acceptance.source}, "summary.json")
            tracker.set_tags({"acceptance.source": measurement.acceptance.source, "status": "finished"})
    except Exception as exc:  # noqa: BLE001 - one role's failure is data; the other role still runs
        detail = str(exc) if isinstance(exc, (ServerError, MeasurementError)) else f"{type(exc).__name__}: {exc}"
        message = redact_text(detail, secrets)
        print(f"[{role}] FAILED: {message}")
        return RoleResult(role, job, run_id, None, command, error=message)
    return RoleResult(role, job, run_id, measurement, command, startup_s=server.startup_s if server else None)


def _redact_log(path: Path, secrets: list[str]) -> None:
    if secrets and path.is_file():
        path.write_text(redact_text(path.read_text(errors="replace"), secrets))


@dataclass(frozen=True)
class JobResult:
    baseline: RoleResult
    speculative: RoleResult | None
    comparison: Comparison | None

    @property
    def failed(self) -> bool:
        return any(r is not None and r.error for r in (self.baseline, self.speculative))


def run_job(prepared: Prepared, tracker: Tracker, out_dir: Path) -> JobResult:
    results = [run_role(role, job, prepared, tracker, out_dir) for role, job in roles(prepared.job)]
    baseline, speculative = results[0], (results[1] if len(results) > 1 else None)
    if speculative is None:
        return JobResult(baseline, None, None)
    comparison = None
    if baseline.measurement and speculative.measurement:
        comparison = compare(baseline.measurement.summary, speculative.measurement.summary)
        tracker.log_metrics(comparison.as_metrics())  # on the parent run
        tracker.log_metrics(comparison.as_metrics(), run_id=speculative.run_id)
    return JobResult(baseline, speculative, comparison)
