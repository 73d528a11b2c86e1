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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline import startup
from pipeline.analysis.search_report import PREDICTIONS_CSV
from pipeline.config import ConfigError, JobConfig, RayConfig, SloConfig, SweepSettings
from pipeline.engines.engine import EngineNotInstalled
from pipeline.engines.models import ModelError, pending_builds
from pipeline.engines.registry import engine_of
from pipeline.exitcode import ExitCode
from pipeline.identity import in_this_version
from pipeline.load.workloads import load_items
from pipeline.record.journal import JOURNAL_NAME, JournaledTracker
from pipeline.redact import redact_args, redact_mapping
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
)
from pipeline.run.plumbing import cluster, diskfull
from pipeline.run.plumbing.errors import LaunchError, Unreachable
from pipeline.run.progress import screen
from pipeline.run.search import predicting
from pipeline.run.search.kinds import SearchKind, kind_of
from pipeline.run.search.strategy import Context, SearchEnd
from pipeline.run.sweep_end import gate_sweep, log_probes, report_sweep, sweep_identity, sync_journals


class InProcess:
    """Runs the groups one after another in this process: single runs, and tests."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir

    def preflight(self, tasks: Sequence[GroupTask]) -> None:
        local_preflight(tasks)

    def run(self, tasks: Sequence[GroupTask]) -> list[GroupOutcome]:
        return [run_group(task, self.out_dir) for task in tasks]


def local_preflight(tasks: Sequence[GroupTask]) -> None:
    """The groups run on this machine: refuse a server it cannot host before any starts."""
    import os

    from pipeline.engines.hardware import gpu_names

    ours = [t for t in tasks if engine_of(t.group.server_job).starts_servers]  # not engine=external's
    needs = [cluster.Need(t.group.label, t.gpus) for t in ours]
    on_cpu = [(t.group.label, t.group.server_job.engine.tensor_parallel_size) for t in ours if not t.gpus]
    gpus = 0
    if any(t.gpus for t in ours):
        # CUDA_VISIBLE_DEVICES narrows what the servers see; nvidia-smi lists every GPU regardless.
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = len([d for d in visible.split(",") if d.strip()]) if visible is not None else len(gpu_names())
    cluster.check_local(needs, on_cpu, gpus, os.cpu_count() or 1)


def _server_line(target: Target, job: JobConfig, ray_config: RayConfig) -> ServerLine:
    spec = server_spec(target, job, Path("server.log"), port=0)
    args = list(redact_args(spec.command))
    if "--port" in args:  # an external server has an address, not a command with a port
        args[args.index("--port") + 1] = "<free port>"
    engine = engine_of(job)
    version = spec.engine_version + engine.version_note(target)
    label = engine.label
    inherited = {name: "<from the environment>" for name in spec.env_from}
    ray = cluster.request_text(cluster.group_request(ray_config, target.engine_gpus(job)))
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
        print(f"error: {diskfull.message(exc, _output_dir(jobs))}", file=sys.stderr)
        return ExitCode.INFRA


def _output_dir(jobs: Sequence[JobConfig]) -> Path | None:
    """The sweep's folder, for a message; None where the jobs make no sweep to name one."""
    try:
        return Path(SweepSettings.of(jobs).output_dir)
    except ConfigError:
        return None


def run_sweep(jobs: Sequence[JobConfig], executor: Executor, project_root: Path) -> int:
    """prepare -> execute -> record -> finish: every refusal before anything starts, then one
    loop over the search's plans, then the sweep's table, its gate and its report."""
    try:
        sweep = Sweep.prepare(jobs, project_root)
    except (ConfigError, EngineNotInstalled, ModelError) as exc:
        return _error(str(exc))
    startup.configure(sweep.settings.verbose)  # before Ray starts: its workers inherit the environment
    if sweep.settings.dry_run:
        sweep.show()
        return ExitCode.OK
    code = sweep.open(executor)
    if code is not None:
        return code
    return sweep.run(executor)


@dataclass
class Sweep:
    """One sweep's state between its stages: what was planned, resolved, opened and measured."""

    # The jobs are not kept: what the sweep is set to is read once, below; what each point measures is in the plan.
    settings: SweepSettings  # the sweep-wide settings, read once (SweepSettings.of)
    slo: SloConfig  # the sweep's one SLO (SweepSettings.slo_of), recorded on the parent run
    project_root: Path
    kind: SearchKind
    plan: SweepPlan
    targets: dict[int, Target]
    store: Any = None
    tracker: Any = None
    done: dict[str, Any] = dataclasses.field(default_factory=dict)
    parent: str = ""
    channel: str | None = None
    by_hash: dict[str, PointOutcome] = dataclasses.field(default_factory=dict)  # every point's outcome, once recorded

    @property
    def on_gpu(self) -> bool:
        return any(t.on_gpu for t in self.targets.values())

    @staticmethod
    def prepare(jobs: Sequence[JobConfig], project_root: Path) -> Sweep:
        """Every refusal, nothing built: a bad draft path, store or cluster is not found after a
        model build of half a minute. The embedded models are built once all answer."""
        plan_sweep(jobs)  # an empty grid is refused, with its own message, before anything reads it
        settings = SweepSettings.of(jobs)
        slo = SweepSettings.slo_of(jobs)
        kind = kind_of(settings)
        plan = kind.planned(jobs, settings)
        for workload in {repr(j.workload): j.workload for j in jobs}.values():
            if workload.name != "random":  # a missing or malformed file is refused here, not in a worker
                load_items(workload, 1, 0, None)
        plan_only = settings.dry_run
        targets = {g.index: resolve_target(g.server_job, build=False, plan_only=plan_only) for g in plan.groups}
        return Sweep(settings, slo, project_root, kind, plan, targets)

    def show(self) -> None:
        shown = self.kind.shown(self.plan)
        lines = [_server_line(self.targets[g.index], g.server_job, self.settings.ray) for g in shown.groups]
        print(describe(shown, lines, self.on_gpu))
        paths = {p for t in self.targets.values() for p in (t.model_path, t.draft_path) if p}
        for line in pending_builds(paths):
            print(line)
        print(self.kind.note(self.settings))
        if more := self.kind.describe(shown):
            print(more)

    def open(self, executor: Executor) -> int | None:
        """The store, the resumed points, the cluster and the built models; an exit code where
        one of them refuses, None to go on."""
        from pipeline.record import tracking

        settings = self.settings
        self.store = tracking.resolve_store(settings.tracking, self.project_root)
        try:
            tracking.check_store_reachable(self.store)
            experiment_id = tracking.prepare(self.store, self.experiment)
            self.tracker = JournaledTracker(tracking.Tracker(self.store, experiment_id), self.out_dir / JOURNAL_NAME)
        except tracking.TrackingUnreachable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return ExitCode.INFRA
        except tracking.TrackingError as exc:
            return _error(str(exc))
        if not settings.force and self.kind.resumes:
            self.done = in_this_version(self.tracker.finished_points(), (p.job for p in self.plan.points))
        self.channel = screen.channel_name()
        try:
            executor.preflight(self.tasks(self.plan.without(self.done)))
        except Unreachable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return ExitCode.INFRA
        except LaunchError as exc:
            return _error(str(exc))
        # The cluster answers: now build the embedded models (half a minute the first time), which
        # the sweep's fingerprint names by revision.
        try:
            self.targets = {g.index: resolve_target(g.server_job) for g in self.plan.groups}
        except (ConfigError, EngineNotInstalled, ModelError) as exc:
            return _error(str(exc))
        return None

    @property
    def resumed(self) -> int:
        """Points of the plan that earlier runs finished, and this one does not measure again."""
        return len(self.plan.points) - len(self.plan.without(self.done).points)

    @property
    def experiment(self) -> str:
        return self.settings.tracking.experiment or self.settings.sweep_name

    @property
    def out_dir(self) -> Path:
        return Path(self.settings.output_dir).resolve()

    def tasks(self, part: SweepPlan) -> list[GroupTask]:
        return [
            GroupTask(
                g,
                self.store,
                self.tracker.experiment_id,
                self.parent,
                self.targets[g.index].engine_gpus(g.server_job),
                self.settings,
                profile=self.kind.profile,
                progress=self.channel,
            )
            for g in part.groups
        ]

    def run(self, executor: Executor) -> int:
        from pipeline.record import readers

        identity = sweep_identity(self.plan, self.targets)
        if self.settings.gate.skip_if_done:
            earlier = readers.HistoryReader(self.store.tracking_uri).ran_before(self.tracker.experiment_id, *identity)
            if earlier:
                print(
                    f"skipped: engine {identity[1]} already ran this sweep's fingerprint (sweep run {earlier}); "
                    f"gate.skip_if_done=false measures it again"
                )
                return ExitCode.OK
        shown = self.kind.shown(self.plan).without(self.done)
        self._announce(shown)
        started = time.monotonic()
        self._open_parent(identity)
        try:
            with screen.live(
                self.channel, len(shown.points), estimate_s(shown, self.on_gpu), self.settings.progress_every_s
            ):
                end = self.execute(executor)
            frame, failed = self.record(end, started)
        except KeyboardInterrupt:
            self.tracker.end_run(self.parent, killed=True)
            print("interrupted: every server was stopped; finished points are in MLflow", file=sys.stderr)
            return ExitCode.INTERRUPTED
        except SystemExit:  # SIGTERM (pipeline.startup.exit_on_sigterm): stopped, like Ctrl-C, not failed
            self.tracker.end_run(self.parent, killed=True)
            print("terminated: every server was stopped; finished points are in MLflow", file=sys.stderr)
            raise
        except BaseException as exc:
            full = diskfull.is_disk_full(exc)
            error = diskfull.message(exc, self.out_dir) if full else f"{type(exc).__name__}: {exc}"
            self.tracker.end_run(self.parent, error=error)
            raise
        return self.finish(executor, end, frame, failed)

    def _announce(self, shown: SweepPlan) -> None:
        skipped, settings = self.resumed, self.settings
        print(
            f"plan: {len(shown.groups)} server(s), {len(shown.points)} point(s) to measure"
            + (f", {skipped} already finished (force=true re-measures them)" if skipped else "")
            + f"; estimated ~{estimate_s(shown, self.on_gpu) / 60:.1f} min (rough)\n"
            + (f"{note}\n" if (note := self.kind.note(settings)) else "")
            + f"MLflow: {self.store.tracking_uri} (experiment {self.experiment!r})"
        )

    def _open_parent(self, identity: tuple[str, str]) -> None:
        settings = self.settings
        name = f"{settings.sweep_name} {time.strftime('%Y-%m-%d %H:%M:%S')}"  # one parent run per invocation
        tags = {"role": "sweep", "sweep_name": settings.sweep_name, "fingerprint": identity[0]}
        self.parent = self.tracker.start_run(name, tags | {"engine.versions": identity[1]})
        # How the report and the gate decide, kept with the sweep: `python -m pipeline.report` and
        # `python -m pipeline.gate` decide the same way later (the gate with this run's floors and history).
        self.tracker.log_params(
            self.parent,
            {f"stats.{k}": v for k, v in dataclasses.asdict(settings.stats).items()}
            | {"search": settings.search, **{f"slo.{k}": str(v) for k, v in dataclasses.asdict(self.slo).items()}}
            | {f"gate.{k}": str(v) for k, v in dataclasses.asdict(settings.gate).items()},
        )

    def execute(self, executor: Executor) -> SearchEnd:
        """The search's plans, one after another, each without what earlier runs finished."""
        resumed = {h: PointOutcome(h, f.run_id, f.metrics, resumed=True) for h, f in self.done.items()}
        search = self.kind.start(self.plan, self._context(resumed))
        outcomes: list[GroupOutcome] = []
        while (part := search.next_plan(outcomes)) is not None:
            outcomes = executor.run(self.tasks(part.without(self.done)))
        return search.finish()

    def _context(self, resumed: dict[str, PointOutcome]) -> Context:
        if not self.kind.reads_windows:
            return Context(resumed, settings=self.settings)
        from pipeline.record import readers
        from pipeline.record.windows import stats_options

        reader = readers.SweepReader(self.store.tracking_uri)
        log = functools.partial(predicting.log_predicted, self.tracker, self.parent)
        opts = stats_options(self.settings.stats, reader)
        return Context(resumed, predicting.download_samples(reader), log, opts, self.settings)

    def record(self, end: SearchEnd, started: float) -> tuple[Any, int]:
        """The sweep's table (summary.csv, the MLflow table), the speedups on each run, and the
        sweep's own metrics on the parent run."""
        from pipeline.run import summary

        plan, tracker, out_dir = end.plan, self.tracker, self.out_dir
        in_plan = {p.hash for p in plan.points}
        by_hash = {h: PointOutcome(h, f.run_id, f.metrics, resumed=True) for h, f in self.done.items() if h in in_plan}
        by_hash |= end.predicted
        for outcome in end.outcomes:
            by_hash.update({p.hash: p for p in outcome.points})
        self.by_hash = by_hash
        ratios = summary.comparisons(plan, by_hash)
        for point_hash, ratio in ratios.items():
            outcome = by_hash[point_hash]
            if not outcome.resumed and outcome.run_id:
                tracker.log_metrics(outcome.run_id, ratio.as_metrics())
        frame = summary.frame(plan, by_hash, ratios)
        out_dir.mkdir(parents=True, exist_ok=True)
        frame.to_csv(out_dir / "summary.csv", index=False)
        if end.table is not None:
            (out_dir / PREDICTIONS_CSV).parent.mkdir(parents=True, exist_ok=True)
            end.table.to_csv(out_dir / PREDICTIONS_CSV, index=False)
            tracker.log_file(self.parent, out_dir / PREDICTIONS_CSV, "predict")
        failed = int((frame["status"] == "failed").sum())
        tracker.log_file(self.parent, out_dir / "summary.csv")
        tracker.log_table(self.parent, frame, "summary_table.json")
        tracker.log_metrics(self.parent, self._sweep_metrics(end, failed, started))
        log_probes(tracker, self.parent, plan, end.outcomes)
        tracker.end_run(self.parent)  # the sweep ran to its end; failed points are marked in their own runs
        return frame, failed

    def _sweep_metrics(self, end: SearchEnd, failed: int, started: float) -> dict[str, float]:
        outcomes = end.outcomes
        return {
            "server_starts": sum(o.started for o in outcomes),
            "server_restarts": sum(o.restarts for o in outcomes),
            "points": len(end.plan.points),
            "points_measured": sum(len(o.points) for o in outcomes),
            "points_predicted": len(end.predicted),
            "points_resumed": self.resumed,
            "points_failed": failed,
            "lossless_probe_s": sum(o.probe_s for o in outcomes),
            "sweep_wall_s": time.monotonic() - started,
        }

    def finish(self, executor: Executor, end: SearchEnd, frame: Any, failed: int) -> int:
        """The table printed, the journal synced, then the gate and the report."""
        from pipeline.record import table

        settings, out_dir = self.settings, self.out_dir
        models = ", ".join(sorted({p.job.model.id for p in end.plan.points}))
        table.render(frame, f"sweep {settings.sweep_name!r}: {len(end.plan.points)} points on {models}")
        print(f"summary: {out_dir / 'summary.csv'}; MLflow parent run {self.parent}")
        synced = sync_journals(out_dir)
        if synced is None:
            return ExitCode.INFRA  # every measurement is on disk; MLflow gets it from `python -m pipeline.sync`
        parent = synced.get(self.parent, self.parent)  # a parent started while MLflow was down has its real id now
        errors = (p.error for o in end.outcomes for p in o.points if p.error)
        full = next((e for e in errors if e.startswith(diskfull.PREFIX)), None)
        if full:  # no gate or report: they would judge a sweep cut short, and need the disk too
            print(f"error: {full}", file=sys.stderr)
            return ExitCode.INFRA
        code: int = ExitCode.OK
        if settings.gate.enabled:
            confirm_task = functools.partial(
                _confirm_task, self.store, self.tracker.experiment_id, parent, self.targets, settings
            )
            code = gate_sweep(
                settings, self.store.tracking_uri, parent, end.plan, self.by_hash, executor, confirm_task, out_dir
            )
        report_sweep(self.store.tracking_uri, parent, out_dir, settings.stats)
        return ExitCode.INCOMPLETE if failed else code


def _confirm_task(
    store: Any,
    experiment_id: str,
    parent: str,
    targets: dict[int, Target],
    settings: SweepSettings,
    group: ServerGroup,
    confirms: dict[str, str],
) -> GroupTask:
    gpus = targets[group.index].engine_gpus(group.server_job)
    return GroupTask(group, store, experiment_id, parent, gpus, settings, confirms)
