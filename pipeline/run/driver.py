"""The sweep driver: plan, check, record, launch, compare, summarise.

Everything refusable is refused here, before any server starts: the grid, each server's
engine, device, methods and models, the tracking store, and (through the executor's
preflight) the cluster. Then one parent run is opened, the executor runs the server groups
(in this process, or as Ray tasks through the Hydra launcher), and the sweep-wide table is
logged to the parent run.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline import startup
from pipeline.analysis.search_report import PREDICTIONS_CSV
from pipeline.config import ConfigError, JobConfig
from pipeline.engines.models import ModelError
from pipeline.engines.registry import engine_of
from pipeline.engines.vllm import EngineNotInstalled
from pipeline.exitcode import ExitCode
from pipeline.identity import in_this_version, sweep_level
from pipeline.load.workloads import load_items
from pipeline.record.journal import JOURNAL_NAME, JournaledTracker
from pipeline.redact import redact_args, redact_mapping
from pipeline.run import cluster, diskfull, predict_plan, progress_display, search_capacity, search_predict
from pipeline.run.errors import LaunchError, Unreachable
from pipeline.run.group import run_group
from pipeline.run.job import Target, resolve_target, server_spec
from pipeline.run.outcomes import Executor, GroupOutcome, GroupTask, PointOutcome
from pipeline.run.plan import (
    ServerGroup,
    ServerLine,
    SweepPlan,
    describe,
    estimate_s,
    plan_sweep,
    search_note,
)
from pipeline.run.sweep_end import gate_sweep, log_probes, report_sweep, sweep_identity, sync_journals


class InProcess:
    """Runs the groups one after another in this process: single runs, and tests."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir

    def preflight(self, tasks: Sequence[GroupTask]) -> None:
        return None

    def run(self, tasks: Sequence[GroupTask]) -> list[GroupOutcome]:
        return [run_group(task, self.out_dir) for task in tasks]


def _check_sweep_level(jobs: Sequence[JobConfig]) -> None:
    for key in sweep_level():
        values = {repr(getattr(job, key)) for job in jobs}
        if len(values) > 1:
            raise ConfigError(f"{key} is a setting of the whole sweep and cannot be swept (got {sorted(values)})")


def _server_line(target: Target, job: JobConfig) -> ServerLine:
    spec = server_spec(target, job, Path("server.log"), port=0)
    args = list(redact_args(spec.command))
    if "--port" in args:  # an external server has an address, not a command with a port
        args[args.index("--port") + 1] = "<free port>"
    engine = engine_of(job)
    version = spec.engine_version + engine.version_note(target)
    label = engine.label
    inherited = {name: "<from the environment>" for name in spec.env_from}
    ray = cluster.request_text(cluster.group_request(job.ray, target.engine_gpus(job)))
    return ServerLine(label, version, tuple(args), redact_mapping(spec.env) | inherited, ray)


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return ExitCode.BAD_INPUT


def run_guarded(jobs: Sequence[JobConfig], executor: Executor, project_root: Path) -> int:
    """The entry points' sweep: a disk that fills under any of the driver's writes is one
    message and exit 4, not a traceback (every point finished before it is in MLflow)."""
    try:
        return run_sweep(jobs, executor, project_root)
    except OSError as exc:
        if not diskfull.is_disk_full(exc):
            raise
        print(f"error: {diskfull.message(exc, Path(jobs[0].output_dir) if jobs else None)}", file=sys.stderr)
        return ExitCode.INFRA


def run_sweep(jobs: Sequence[JobConfig], executor: Executor, project_root: Path) -> int:
    from pipeline.record import readers, table, tracking
    from pipeline.run import summary

    try:
        plan = plan_sweep(jobs)
        _check_sweep_level(jobs)
        first = jobs[0]
        if first.search == "capacity":
            plan = plan_sweep(search_capacity.seed_jobs(jobs))
        if first.search == "predict":
            predict_plan.check_plan(plan)
        for workload in {repr(j.workload): j.workload for j in jobs}.values():
            if workload.name != "random":  # a missing or malformed file is refused here, not in a worker
                load_items(workload, 1, 0, None)
        # Every refusal first, nothing built: a bad draft path, store or cluster is not found
        # after a model build of half a minute. The embedded models are built once all answer.
        targets = {g.index: resolve_target(g.server_job, build=False, plan_only=first.dry_run) for g in plan.groups}
    except (ConfigError, EngineNotInstalled, ModelError) as exc:
        return _error(str(exc))
    startup.configure(first.verbose)  # before Ray starts: its workers inherit the environment
    on_gpu = any(t.on_gpu for t in targets.values())
    if first.dry_run:
        shown = predict_plan.first_phase(plan) if first.search == "predict" else plan
        print(describe(shown, [_server_line(targets[g.index], g.server_job) for g in shown.groups], on_gpu))
        print(search_note(first))
        return 0

    store = tracking.resolve_store(first.tracking, project_root)
    experiment = first.tracking.experiment or first.sweep_name
    try:
        tracking.check_reachable(store)
        out_dir = Path(first.output_dir).resolve()
        tracker = JournaledTracker(tracking.Tracker(store, tracking.prepare(store, experiment)), out_dir / JOURNAL_NAME)
    except tracking.TrackingUnreachable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.INFRA
    except tracking.TrackingError as exc:
        return _error(str(exc))
    # A capacity search picks its rates as it goes: earlier probes are no point of this search.
    done = (
        {}
        if first.force or first.search == "capacity"
        else in_this_version(tracker.finished_points(), (p.job for p in plan.points))
    )
    todo = plan.without(done)
    capacity = first.search == "capacity"

    channel = progress_display.channel_name()

    def tasks_of(part: SweepPlan, parent_id: str) -> list[GroupTask]:
        return [
            GroupTask(
                g,
                store,
                tracker.experiment_id,
                parent_id,
                targets[g.index].engine_gpus(g.server_job),
                capacity=capacity,
                progress=channel,
            )
            for g in part.groups
        ]

    tasks = tasks_of(todo, "")
    try:
        executor.preflight(tasks)
    except Unreachable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.INFRA
    except LaunchError as exc:
        return _error(str(exc))
    # The cluster answers: now build the embedded models (half a minute the first time), which the
    # sweep's fingerprint names by revision.
    try:
        targets = {g.index: resolve_target(g.server_job) for g in plan.groups}
    except (ConfigError, EngineNotInstalled, ModelError) as exc:
        return _error(str(exc))
    identity = sweep_identity(plan, targets)
    if first.gate.skip_if_done:
        earlier = readers.HistoryReader(store.tracking_uri).ran_before(tracker.experiment_id, *identity)
        if earlier:
            print(
                f"skipped: engine {identity[1]} already ran this sweep's fingerprint (sweep run {earlier}); "
                f"gate.skip_if_done=false measures it again"
            )
            return 0

    skipped = len(plan.points) - len(todo.points)
    shown = predict_plan.first_phase(plan).without(done) if first.search == "predict" else todo
    print(
        f"plan: {len(shown.groups)} server(s), {len(shown.points)} point(s) to measure"
        + (f", {skipped} already finished (force=true re-measures them)" if skipped else "")
        + f"; estimated ~{estimate_s(shown, on_gpu) / 60:.1f} min (rough)\n"
        + (f"{search_note(first)}\n" if first.search != "grid" else "")
        + f"MLflow: {store.tracking_uri} (experiment {experiment!r})"
    )
    started = time.monotonic()
    name = f"{first.sweep_name} {time.strftime('%Y-%m-%d %H:%M:%S')}"  # one parent run per invocation
    parent = tracker.start_run(
        name,
        {"role": "sweep", "sweep_name": first.sweep_name, "fingerprint": identity[0], "engine.versions": identity[1]},
    )
    # How the report and the gate decide, kept with the sweep: `python -m pipeline.report` and
    # `python -m pipeline.gate` decide the same way later (the gate with this run's floors and history).
    tracker.log_params(
        parent,
        {f"stats.{k}": v for k, v in dataclasses.asdict(first.stats).items()}
        | {"search": first.search, **{f"slo.{k}": str(v) for k, v in dataclasses.asdict(first.slo).items()}}
        | {f"gate.{k}": str(v) for k, v in dataclasses.asdict(first.gate).items()},
    )
    predicted: search_predict.PredictRun | None = None
    try:
        with progress_display.live(channel, len(shown.points), estimate_s(shown, on_gpu), first.progress_every_s):
            if first.search == "predict":
                from pipeline.record.windows import stats_options

                reader = readers.SweepReader(store.tracking_uri)
                resumed = {h: PointOutcome(h, f.run_id, f.metrics, resumed=True) for h, f in done.items()}
                predicted = search_predict.run(
                    plan,
                    lambda part: executor.run(tasks_of(part.without(done), parent)),
                    search_predict.download_samples(reader),
                    functools.partial(search_predict.log_predicted, tracker, parent),
                    stats_options(first.stats, reader),
                    first.predict.max_confirm,
                    resumed,
                    first.predict.check_model,
                )
                outcomes = predicted.outcomes
            else:
                outcomes = executor.run(tasks_of(todo, parent))
        if capacity:  # the points are the rates each server probed
            plan = search_capacity.probed_plan(plan, outcomes)
        in_plan = {p.hash for p in plan.points}
        by_hash = {h: PointOutcome(h, f.run_id, f.metrics, resumed=True) for h, f in done.items() if h in in_plan}
        if predicted is not None:
            by_hash |= predicted.predicted
        for outcome in outcomes:
            by_hash.update({p.hash: p for p in outcome.points})
        if predicted is not None:  # repeats beyond the first of a predicted point: neither measured nor predicted
            plan = plan.without(p.hash for p in plan.points if p.hash not in by_hash)
        ratios = summary.comparisons(plan, by_hash)
        for point_hash, ratio in ratios.items():
            outcome = by_hash[point_hash]
            if not outcome.resumed and outcome.run_id:
                tracker.log_metrics(outcome.run_id, ratio.as_metrics())
        frame = summary.frame(plan, by_hash, ratios)
        out_dir.mkdir(parents=True, exist_ok=True)
        frame.to_csv(out_dir / "summary.csv", index=False)
        if predicted is not None:
            (out_dir / PREDICTIONS_CSV).parent.mkdir(parents=True, exist_ok=True)
            predicted.table.to_csv(out_dir / PREDICTIONS_CSV, index=False)
            tracker.log_file(parent, out_dir / PREDICTIONS_CSV, "predict")
        failed = int((frame["status"] == "failed").sum())
        tracker.log_file(parent, out_dir / "summary.csv")
        tracker.log_table(parent, frame, "summary_table.json")
        tracker.log_metrics(
            parent,
            {
                "server_starts": sum(o.started for o in outcomes),
                "server_restarts": sum(o.restarts for o in outcomes),
                "points": len(plan.points),
                "points_measured": sum(len(o.points) for o in outcomes),
                "points_predicted": len(predicted.predicted) if predicted else 0,
                "points_resumed": skipped,
                "points_failed": failed,
                "lossless_probe_s": sum(o.probe_s for o in outcomes),
                "sweep_wall_s": time.monotonic() - started,
            },
        )
        log_probes(tracker, parent, plan, outcomes)
        tracker.end_run(parent)  # the sweep ran to its end; failed points are marked in their own runs
    except KeyboardInterrupt:
        tracker.end_run(parent, killed=True)
        print("interrupted: every server was stopped; finished points are in MLflow", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except SystemExit:  # SIGTERM (pipeline.run.signals): stopped, like Ctrl-C, not failed
        tracker.end_run(parent, killed=True)
        print("terminated: every server was stopped; finished points are in MLflow", file=sys.stderr)
        raise
    except BaseException as exc:
        full = diskfull.is_disk_full(exc)
        tracker.end_run(parent, error=diskfull.message(exc, out_dir) if full else f"{type(exc).__name__}: {exc}")
        raise
    table.render(frame, f"sweep {first.sweep_name!r}: {len(plan.points)} points on {first.model.id}")
    print(f"summary: {out_dir / 'summary.csv'}; MLflow parent run {parent}")
    synced = sync_journals(out_dir)
    if synced is None:
        return ExitCode.INFRA  # every measurement is on disk; MLflow gets it from `python -m pipeline.sync`
    parent = synced.get(parent, parent)  # a parent run started while MLflow was down has its real id now
    full = next((p.error for o in outcomes for p in o.points if p.error and p.error.startswith(diskfull.PREFIX)), None)
    if full:  # no gate or report: they would judge a sweep cut short, and need the disk too
        print(f"error: {full}", file=sys.stderr)
        return ExitCode.INFRA
    code = 0
    if first.gate.enabled:
        confirm_task = functools.partial(_confirm_task, store, tracker.experiment_id, parent, targets)
        code = gate_sweep(first, store.tracking_uri, parent, plan, by_hash, executor, confirm_task, out_dir)
    report_sweep(store.tracking_uri, parent, out_dir, first.stats)
    return ExitCode.INCOMPLETE if failed else code


def _confirm_task(
    store: Any,
    experiment_id: str,
    parent: str,
    targets: dict[int, Target],
    group: ServerGroup,
    confirms: dict[str, str],
) -> GroupTask:
    gpus = targets[group.index].engine_gpus(group.server_job)
    return GroupTask(group, store, experiment_id, parent, gpus, confirms)
