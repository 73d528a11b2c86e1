"""One server group: start the server once, measure each of its points, record each in MLflow.

This is what a launcher runs, in the driver's process or in a Ray worker. Errors are data:
a server that fails to start marks each of its points failed (with the log tail), a point
that fails marks only itself, and the other points still run. The server never outlives
this function.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from pipeline import startup
from pipeline.config import JobConfig, LosslessConfig
from pipeline.engines import head_check, synthetic
from pipeline.engines.base import Server, ServerError, ServerSpec
from pipeline.engines.engine import Target
from pipeline.engines.models import load_tokenizer
from pipeline.engines.process import log_tail
from pipeline.engines.registry import engine_of
from pipeline.identity import System
from pipeline.load.client import ClientOptions
from pipeline.load.loadgen import run_window
from pipeline.record.journal import JOURNAL_NAME, JournaledTracker
from pipeline.record.tracking import Tracker
from pipeline.redact import redact_text, secret_values
from pipeline.run.job import point_requests, server_spec
from pipeline.run.measure import WINDOW_STOPPED
from pipeline.run.outcomes import GroupOutcome, GroupTask, PointOutcome, ProbeOutput
from pipeline.run.plan import Point, ServerGroup
from pipeline.run.plumbing import diskfull
from pipeline.run.point import finish_run, measure_point, open_point_run, point_tags
from pipeline.run.progress import events
from pipeline.run.resolve import identity_of, mismatch, resolve_here
from pipeline.run.search.profiles import Measured


def run_group(task: GroupTask, out_dir: Path) -> GroupOutcome:
    """Start the group's server once, measure what its load profile asks for, record each
    point; the server never outlives this call."""
    group = task.group
    # On a node of a cluster this is the worker's first call; a local Ray's inherit it anyway.
    startup.configure(task.settings.verbose)
    out_dir = out_dir / group.label
    tracker = JournaledTracker(Tracker(task.store, task.experiment_id), out_dir / JOURNAL_NAME)
    out_dir.mkdir(parents=True, exist_ok=True)
    kept = _earlier_attempt(task, tracker)
    if len(kept) == len(group.points):
        return GroupOutcome(group.index, tuple(kept[p.hash] for p in group.points))
    group = replace(group, points=tuple(p for p in group.points if p.hash not in kept))
    # Resolved again on the node this group landed on: its earlier results were matched against
    # the system the sweep resolved it to, and no point is measured on another.
    try:
        target, resolved = resolve_here(group)
    except Exception as exc:  # noqa: BLE001 - reported per point, like a failed start
        return GroupOutcome.failed(task, f"{type(exc).__name__}: {exc}")
    if target is None or resolved.system is None:
        return GroupOutcome.failed(task, f"on {resolved.node}: {resolved.error}")
    problem = mismatch(task.system, resolved.system)
    if problem is not None:
        return GroupOutcome.failed(task, f"on {resolved.node}: {problem}")
    spec = server_spec(target, group.server_job, out_dir / "server.log")
    try:
        (out_dir / "server_command.txt").write_text(spec.redacted_command() + "\n")
    except OSError as exc:
        if not diskfull.is_disk_full(exc):
            raise
        return GroupOutcome.failed(task, diskfull.message(exc, out_dir))  # before any run or server: nothing to lose
    # The tokenizer (an import of transformers and a load: about 5 s on 2 cores) loads while the
    # server starts, which takes longer, instead of before it: every server start is that much
    # shorter. The sweep's validation has found the model's folder before any server started.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenizer") as pool:
        tokenizer = pool.submit(load_tokenizer, target.model_path, target.model_revision)
        outcome = GroupRun(task, group, tracker, target, resolved.system, spec, tokenizer, out_dir).run()
    return replace(outcome, points=tuple(kept.values()) + outcome.points)


class GroupRun:
    """One group's server and its points, with what the run has reached so far."""

    def __init__(
        self,
        task: GroupTask,
        group: ServerGroup,
        tracker: JournaledTracker,
        target: Target,
        system: System,
        spec: ServerSpec,
        tokenizer: Future[Any],
        out_dir: Path,
    ) -> None:
        self.task, self.group, self.tracker, self.target, self.system = task, group, tracker, target, system
        # The draft's or head's own parameters and their bytes, recorded beside the KV capacity.
        job = group.server_job
        self.draft_weights = (
            head_check.weight_metrics(target.draft_path, job.engine.dtype) if job.spec.method != "none" else {}
        )
        self.spec, self.out_dir = spec, out_dir
        self._tokenizer = tokenizer
        self.tokenizer: Any = None  # once the server is ready (see run_group)
        self.reporter = events.reporter_for(task.progress, group.label)
        secrets = secret_values(spec.command, {**os.environ, **spec.env}) + [
            os.environ.get(n, "") for n in spec.env_from
        ]
        self.secrets = [s for s in secrets if s]
        self.run_ids: dict[str, str] = {}
        self.points: list[Point] = []  # every point given a run, in order (a profile's later points as reached)
        self.results: dict[str, PointOutcome] = {}
        self.reported: set[str] = set()  # the points the live display was told of as they finished
        self.server: Server | None = None
        self.lossless: tuple[ProbeOutput, ...] = ()
        self.probe_s = 0.0
        self.restarts = 0

    def open_run(self, point: Point) -> None:
        identity = identity_of(point, self.system)
        tags = point_tags(point, self.target, identity, self.spec.engine_version, self.task.confirms.get(point.hash))
        run_id = open_point_run(self.tracker, self.task.parent_run_id, point, tags | self.task.profile.tags)
        self.run_ids[point.hash] = run_id
        self.points.append(point)

    def run(self) -> GroupOutcome:
        for point in self.group.points if self.task.profile.opens_planned else ():
            self.open_run(point)
        interrupted = False
        try:
            self.reporter.emit("server_starting")
            with engine_of(self.group.server_job).server(self.spec) as server:
                self.server = server
                self._ready(server)
                self.tokenizer = self._loaded_tokenizer()
                if self.tokenizer is not None:
                    self._measure(server)
                    started = time.monotonic()
                    lossless = self.task.settings.lossless
                    self.lossless = lossless_probe(server.base_url, self.group.server_job, lossless, self.tokenizer)
                    self.probe_s = time.monotonic() - started
        except ServerError as exc:
            self._fail_rest(redact_text(str(exc), self.secrets))
        except OSError as exc:
            if not diskfull.is_disk_full(exc):
                interrupted = True
                raise
            self._fail_rest(diskfull.message(exc, self.out_dir))
        except BaseException:
            interrupted = True
            raise
        finally:
            self._finish_runs(interrupted)
        return GroupOutcome(
            self.group.index,
            tuple(self.results[p.hash] for p in self.points),
            started=True,
            startup_s=self.server.startup_s if self.server else None,
            lossless=self.lossless,
            probe_s=self.probe_s,
            ran=tuple(self.points) if self.task.profile.chooses_points else (),
            restarts=self.restarts,
        )

    def _ready(self, server: Server) -> None:
        label = self.group.label
        self.reporter.emit("server_ready")
        started = f"in {server.startup_s:.1f} s " if server.startup_s is not None else "(already running) "
        print(f"[{label}] server ready {started}at {server.base_url}")
        if (server.niceness() or 0) > 0:
            print(
                f"[{label}] warning: the server runs at niceness {server.niceness()} and yields the "
                f"CPU to other processes; on a Ray cluster start its nodes with RAY_worker_niceness=0"
            )

    def _loaded_tokenizer(self) -> Any:
        """The tokenizer loaded while the server started; where it failed to load, each point
        fails with why (and the server stops), as where the server failed to start."""
        try:
            return self._tokenizer.result()
        except Exception as exc:  # noqa: BLE001 - reported per point, like a failed start
            self._fail_rest(redact_text(f"{type(exc).__name__}: {exc}", self.secrets))
            return None

    def _fail_rest(self, message: str) -> None:
        print(f"[{self.group.label}] FAILED: {message}")
        for p in self.points:
            self.results.setdefault(p.hash, PointOutcome(p.hash, self.run_ids[p.hash], error=message))

    def _finish_runs(self, interrupted: bool) -> None:
        _redact_log(self.spec.log_path, self.secrets)
        for p in self.points:  # a point left without an outcome was cut short by an interrupt
            outcome = self.results.get(p.hash) or PointOutcome(p.hash, self.run_ids[p.hash], error="interrupted")
            finish_run(self.tracker, outcome, self.out_dir, interrupted)
            if p.hash not in self.reported:  # never measured: its server failed, or the disk filled, first
                self.reporter.emit("point_done", p.label, failed=True)

    def _measure_one(self, point: Point, first: bool) -> PointOutcome:
        assert self.server is not None
        outcome = measure_point(
            point,
            self.server,
            self.tokenizer,
            self.tracker,
            self.run_ids,
            self.out_dir,
            first,
            self.reporter,
            self.task.settings.tracking.vllm_result,
            self.draft_weights,
        )
        self.results[point.hash] = outcome
        self.reporter.emit("point_done", point.label, failed=outcome.error is not None)
        self.reported.add(point.hash)
        return outcome

    def _measure(self, server: Server) -> None:
        """What the profile asks for, in turn. A server that dies or hangs during a window fails
        that point, with its log tail; it is then restarted for the rest (engine.restart_on_crash),
        or the rest fail."""
        walk = self.task.profile.start(self.group, self.task.settings)
        history: list[Measured] = []
        fresh = True
        while (point := walk.next_point(history)) is not None:
            if point.hash not in self.run_ids:
                self.open_run(point)
            if self.restarts:
                self.tracker.set_tags(self.run_ids[point.hash], {"server.restarts_before": str(self.restarts)})
            outcome = self._measure_one(point, first=fresh)
            fresh = False
            extra = walk.judge(Measured(point, outcome))
            if extra:
                self.tracker.log_metrics(self.run_ids[point.hash], extra)
                outcome = self.results[point.hash] = replace(outcome, metrics={**outcome.metrics, **extra})
            history.append(Measured(point, outcome))
            if outcome.error and outcome.error.startswith(diskfull.PREFIX):
                self._not_measured(walk.left(history), outcome.error)  # no room for their results either
                return
            fault = _server_fault(server, outcome)
            if fault is not None and not self._after_fault(server, point, outcome, fault, walk.left(history)):
                return
            fresh = fresh or fault is not None

    def _after_fault(
        self, server: Server, point: Point, outcome: PointOutcome, fault: str, rest: tuple[Point, ...]
    ) -> bool:
        """Record a fault on its point; restart the server for the rest, and say whether to go on."""
        tail = log_tail(server.spec.log_path)
        error = f"{outcome.error or 'measured'}; {fault}\n--- last lines of the server log ---\n{tail}"
        self.results[point.hash] = replace(outcome, error=error)
        self.tracker.set_tags(self.run_ids[point.hash], {"server.fault": fault})
        if not rest:
            return False
        if not point.job.engine.restart_on_crash:
            self._not_measured(rest, f"{fault} at {point.label}, and engine.restart_on_crash=false")
            return False
        print(f"[{self.group.label}] {fault}; restarting it for the {len(rest)} point(s) left")
        server.restart()
        self.restarts += 1
        return True

    def _not_measured(self, points: tuple[Point, ...], why: str) -> None:
        for later in points:
            self.results[later.hash] = PointOutcome(later.hash, self.run_ids[later.hash], error=f"not measured: {why}")


LOST = (
    "lost: the Ray worker or node measuring it died, and Ray ran its server group again; this point "
    "was measured again in a run of its own"
)


def _earlier_attempt(task: GroupTask, tracker: JournaledTracker) -> dict[str, PointOutcome]:
    """Ray runs a group again when the worker or node running it died. What that attempt
    finished is kept as it is (by point hash); the runs it left RUNNING are ended FAILED, saying
    why, so the sweep never shows a run that runs forever. A capacity search probes again."""
    if not task.parent_run_id:
        return {}
    mine = {p.hash: task.confirms.get(p.hash) for p in task.group.points}
    try:
        runs = [r for r in tracker.point_runs(task.parent_run_id) if mine.get(r.point_hash, "-") == r.confirms]
    except Exception as exc:  # noqa: BLE001 - MLflow is down: the journal takes this attempt's writes
        print(f"[{task.group.label}] MLflow: could not look for an earlier attempt at this group ({exc})")
        return {}
    kept: dict[str, PointOutcome] = {}
    for run in runs:  # newest first
        if run.status == "RUNNING":
            tracker.end_run(run.run_id, error=LOST)
        elif run.finished and task.profile.keeps_earlier and run.point_hash not in kept:
            kept[run.point_hash] = PointOutcome(run.point_hash, run.run_id, run.metrics)
    if runs:
        print(
            f"[{task.group.label}] an earlier attempt at this group died: {len(kept)} finished point(s) kept, "
            f"{sum(r.status == 'RUNNING' for r in runs)} run(s) it left running ended as lost"
        )
    return kept


def _server_fault(server: Server, outcome: PointOutcome) -> str | None:
    """What went wrong with the server itself during a point's window, if anything did."""
    if not server.alive():
        return f"the server died during the window (exit code {server.returncode})"
    if outcome.error and outcome.error.startswith(WINDOW_STOPPED) and "deadline" in outcome.error:
        return "the server stopped answering (load.window_timeout_s passed)"
    # An engine core that died can leave the API server up for a moment, answering with errors.
    if (outcome.error or outcome.metrics.get("failed", 0) > 0) and not server.healthy():
        return "the server failed its health check after the window"
    return None


def lossless_probe(base_url: str, job: JobConfig, lossless: LosslessConfig, tokenizer: Any) -> tuple[ProbeOutput, ...]:
    """Greedy answers to the first prompts of the workload (the same for every server of a
    sweep with this workload and seed), sent one at a time so that batch shape cannot
    change the numerics. ``lossless``: the sweep's, not ``job``'s copy."""
    if lossless.prompts <= 0 or synthetic.is_synthetic(job.spec):
        return ()  # synthetic acceptance changes the output by design: nothing to check
    prompts = point_requests(replace(job, repeat=0), tokenizer).requests[: lossless.prompts]
    prompts = tuple(replace(r.alone(), max_tokens=min(r.max_tokens, lossless.max_tokens)) for r in prompts)
    opts = ClientOptions(
        base_url=base_url,
        model=job.model.id,
        endpoint=job.workload.endpoint,
        temperature=0.0,
        ignore_eos=job.workload.ignore_eos,
        timeout_s=job.load.request_timeout_s,
    )
    outputs = []
    for request in prompts:
        record = run_window([request], [0.0], opts).records[0]
        ids = tuple(tokenizer.encode(record.text, add_special_tokens=False)) if tokenizer and record.ok else ()
        outputs.append(ProbeOutput(request.index, record.text, ids, record.error))
    return tuple(outputs)


def _redact_log(path: Path, secrets: list[str]) -> None:
    if secrets and path.is_file():
        text = redact_text(path.read_text(errors="replace"), secrets)
        try:
            path.write_text(text)
        except OSError as exc:  # truncated before the write failed: what is left holds no secret
            print(f"warning: {path} could not be rewritten with its secrets masked ({exc.strerror}); it is cut short")
