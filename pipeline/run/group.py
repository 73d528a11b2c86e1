"""One server group: start the server once, measure each of its points, record each in MLflow.

This is what a launcher runs, in the driver's process or in a Ray worker. Errors are data:
a server that fails to start marks each of its points failed (with the log tail), a point
that fails marks only itself, and the other points still run. The server never outlives
this function.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from pipeline import startup
from pipeline.config import JobConfig
from pipeline.engines.base import Server, ServerError
from pipeline.engines.models import load_tokenizer
from pipeline.engines.process import log_tail
from pipeline.engines.registry import engine_of
from pipeline.load.client import ClientOptions
from pipeline.load.loadgen import run_window
from pipeline.record.journal import JOURNAL_NAME, JournaledTracker
from pipeline.record.tracking import Tracker, flatten_params
from pipeline.redact import redact_text, secret_values
from pipeline.run import diskfull, progress, search_capacity
from pipeline.run.job import point_requests, resolve_target, server_spec
from pipeline.run.measure import WINDOW_STOPPED
from pipeline.run.outcomes import GroupOutcome, GroupTask, PointOutcome, ProbeOutput
from pipeline.run.plan import Point, ServerGroup
from pipeline.run.point import finish_run, measure_point, point_tags


def run_group(task: GroupTask, out_dir: Path) -> GroupOutcome:
    group = task.group
    # On a node of a cluster this is the worker's first call; a local Ray's inherit it anyway.
    startup.configure(group.server_job.verbose)
    out_dir = out_dir / group.label
    tracker = JournaledTracker(Tracker(task.store, task.experiment_id), out_dir / JOURNAL_NAME)
    out_dir.mkdir(parents=True, exist_ok=True)
    kept = _earlier_attempt(task, tracker)
    if len(kept) == len(group.points):
        return GroupOutcome(group.index, tuple(kept[p.hash] for p in group.points))
    group = replace(group, points=tuple(p for p in group.points if p.hash not in kept))
    reporter = progress.reporter_for(task.progress, group.label)
    try:
        target = resolve_target(group.server_job)
        tokenizer = load_tokenizer(target.model_path, target.model_revision)
    except Exception as exc:  # noqa: BLE001 - reported per point, like a failed start
        return GroupOutcome.failed(task, f"{type(exc).__name__}: {exc}")
    spec = server_spec(target, group.server_job, out_dir / "server.log")
    secrets = secret_values(spec.command, {**os.environ, **spec.env}) + [os.environ.get(n, "") for n in spec.env_from]
    secrets = [s for s in secrets if s]
    command = spec.redacted_command()
    try:
        (out_dir / "server_command.txt").write_text(command + "\n")
    except OSError as exc:
        if not diskfull.is_disk_full(exc):
            raise
        return GroupOutcome.failed(task, diskfull.message(exc, out_dir))  # before any run or server: nothing to lose
    run_ids: dict[str, str] = {}
    points: list[Point] = []  # every point given a run, in order (capacity probes are added as they run)

    def open_run(p: Point) -> Point:
        tags = point_tags(p, target, spec.engine_version, task.confirms.get(p.hash))
        run_ids[p.hash] = tracker.start_run(
            p.label, tags | ({"search": "capacity"} if task.capacity else {}), task.parent_run_id
        )
        tracker.log_params(run_ids[p.hash], flatten_params(p.job))
        points.append(p)
        return p

    results: dict[str, PointOutcome] = {}
    for p in group.points:
        open_run(p)
    probe: tuple[ProbeOutput, ...] = ()
    probe_s = 0.0
    server: Server | None = None
    interrupted = False
    restarts = 0
    reported: set[str] = set()  # the points the live display was told of as they finished
    try:
        reporter.emit("server_starting")
        with engine_of(group.server_job).server(spec) as server:
            reporter.emit("server_ready")
            started = f"in {server.startup_s:.1f} s " if server.startup_s is not None else "(already running) "
            print(f"[{group.label}] server ready {started}at {server.base_url}")
            if (server.niceness() or 0) > 0:
                print(
                    f"[{group.label}] warning: the server runs at niceness {server.niceness()} and yields the "
                    f"CPU to other processes; on a Ray cluster start its nodes with RAY_worker_niceness=0"
                )

            def measure_one(point: Point, first: bool) -> PointOutcome:
                results[point.hash] = measure_point(
                    point, server, tokenizer, tracker, run_ids, out_dir, first, reporter
                )
                reporter.emit("point_done", point.label, failed=results[point.hash].error is not None)
                reported.add(point.hash)
                return results[point.hash]

            if task.capacity:

                def log_probe(p: Point, metrics: dict[str, float]) -> None:
                    tracker.log_metrics(run_ids[p.hash], metrics)
                    results[p.hash] = replace(results[p.hash], metrics={**results[p.hash].metrics, **metrics})

                search_capacity.probe(group.points[0], open_run, measure_one, out_dir, log_probe)
            else:
                restarts = _measure_all(group, server, measure_one, tracker, run_ids, results)
            probe_started = time.monotonic()
            probe = lossless_probe(server.base_url, group.server_job, tokenizer)
            probe_s = time.monotonic() - probe_started
    except ServerError as exc:
        message = redact_text(str(exc), secrets)
        print(f"[{group.label}] FAILED: {message}")
        for p in points:
            results.setdefault(p.hash, PointOutcome(p.hash, run_ids[p.hash], error=message))
    except OSError as exc:
        if not diskfull.is_disk_full(exc):
            interrupted = True
            raise
        message = diskfull.message(exc, out_dir)
        print(f"[{group.label}] FAILED: {message}")
        for p in points:
            results.setdefault(p.hash, PointOutcome(p.hash, run_ids[p.hash], error=message))
    except BaseException:
        interrupted = True
        raise
    finally:
        _redact_log(spec.log_path, secrets)
        for p in points:  # a point left without an outcome was cut short by an interrupt
            outcome = results.get(p.hash) or PointOutcome(p.hash, run_ids[p.hash], error="interrupted")
            finish_run(tracker, outcome, out_dir, interrupted)
            if p.hash not in reported:  # never measured: its server failed, or the disk filled, first
                reporter.emit("point_done", p.label, failed=True)
    startup_s = server.startup_s if server else None
    outcomes = tuple(kept.values()) + tuple(results[p.hash] for p in points)
    return GroupOutcome(
        group.index,
        outcomes,
        started=True,
        startup_s=startup_s,
        lossless=probe,
        probe_s=probe_s,
        ran=tuple(points) if task.capacity else (),
        restarts=restarts,
    )


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
        elif run.finished and not task.capacity and run.point_hash not in kept:
            kept[run.point_hash] = PointOutcome(run.point_hash, run.run_id, run.metrics)
    if runs:
        print(
            f"[{task.group.label}] an earlier attempt at this group died: {len(kept)} finished point(s) kept, "
            f"{sum(r.status == 'RUNNING' for r in runs)} run(s) it left running ended as lost"
        )
    return kept


def _measure_all(
    group: ServerGroup,
    server: Server,
    measure_one: Any,
    tracker: JournaledTracker,
    run_ids: dict[str, str],
    results: dict[str, PointOutcome],
) -> int:
    """Each point in turn. A server that dies or hangs during a window fails that point, with
    its log tail; it is then restarted for the rest (engine.restart_on_crash), or the rest fail.
    Returns the number of restarts."""
    restarts, fresh = 0, True
    for i, point in enumerate(group.points):
        if restarts:
            tracker.set_tags(run_ids[point.hash], {"server.restarts_before": str(restarts)})
        outcome = measure_one(point, first=fresh)
        fresh = False
        if outcome.error and outcome.error.startswith(diskfull.PREFIX):
            for later in group.points[i + 1 :]:  # no room for their results either
                results[later.hash] = PointOutcome(
                    later.hash, run_ids[later.hash], error=f"not measured: {outcome.error}"
                )
            break
        fault = _server_fault(server, outcome)
        if fault is None:
            continue
        tail = log_tail(server.spec.log_path)
        results[point.hash] = replace(
            outcome, error=f"{outcome.error or 'measured'}; {fault}\n--- last lines of the server log ---\n{tail}"
        )
        tracker.set_tags(run_ids[point.hash], {"server.fault": fault})
        rest = group.points[i + 1 :]
        if not rest:
            break
        if not point.job.engine.restart_on_crash:
            for later in rest:
                results[later.hash] = PointOutcome(
                    later.hash,
                    run_ids[later.hash],
                    error=(f"not measured: {fault} at {point.label}, and engine.restart_on_crash=false"),
                )
            break
        print(f"[{group.label}] {fault}; restarting it for the {len(rest)} point(s) left")
        server.restart()
        restarts, fresh = restarts + 1, True
    return restarts


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


def lossless_probe(base_url: str, job: JobConfig, tokenizer: Any) -> tuple[ProbeOutput, ...]:
    """Greedy answers to the first prompts of the workload (the same for every server of a
    sweep with this workload and seed), sent one at a time so that batch shape cannot
    change the numerics."""
    if job.lossless.prompts <= 0:
        return ()
    prompts = point_requests(replace(job, repeat=0), tokenizer).requests[: job.lossless.prompts]
    prompts = tuple(replace(r.alone(), max_tokens=min(r.max_tokens, job.lossless.max_tokens)) for r in prompts)
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
