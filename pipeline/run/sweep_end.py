"""The gate's side of a sweep, and what follows the groups: the journaled writes made, the gate
judged, the probes and the report logged.

The driver calls these once every server group has run; each reads MLflow, so each waits for
the journal's replay, and a failure in the report loses no measurement.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pipeline.config import StatsConfig, SweepSettings
from pipeline.exitcode import ExitCode
from pipeline.run.outcomes import Executor, GroupOutcome, GroupTask, PointOutcome
from pipeline.run.plan import SweepPlan


def sync_journals(out_dir: Path) -> dict[str, str] | None:
    """Make the MLflow writes that failed during the sweep (its groups' and its own); say so if
    some still fail. The report and the gate read MLflow, so they wait for it."""
    from pipeline.record.journal import journals, make_tracker, placeholders, replay_journal

    found = journals(out_dir)
    if not found:
        return {}
    made, left = replay_journal(found, make_tracker)
    if left:
        print(
            f"MLflow: {left} write(s) could not be made and are kept in {len(found)} journal(s) under {out_dir}; "
            f"once the tracking server answers: python -m pipeline.sync {out_dir}",
            file=sys.stderr,
        )
        return None
    print(f"MLflow: {made} write(s) that failed during the sweep were made at its end")
    return placeholders(found)


def gate_sweep(
    settings: SweepSettings,
    tracking_uri: str,
    parent: str,
    plan: SweepPlan,
    by_hash: dict[str, PointOutcome],
    executor: Executor,
    confirm_task: Callable[..., GroupTask],
    out_dir: Path,
) -> int:
    """gate.enabled: judge this run against its reference; with gate.confirm, re-measure the
    flagged points once on fresh servers and judge again."""
    from pipeline.analysis.samples import StatsOptions
    from pipeline.finish import judge
    from pipeline.record.readers import HistoryReader
    from pipeline.record.tracking import Store, TrackingError, check_store_reachable

    opts = StatsOptions(confidence=settings.stats.confidence, resamples=settings.stats.resamples)
    try:
        reader = HistoryReader(tracking_uri)
        result, summary = judge.judge_sweep(reader, parent, settings.gate, opts, out_dir)
        flagged = set(result.flagged())
        if settings.gate.confirm and flagged:
            originals = {h: o.run_id for h, o in by_hash.items() if o.run_id in flagged}
            print(f"gate: {len(originals)} point(s) flagged; re-measuring them on fresh servers to confirm")
            again = plan.without(p.hash for p in plan.points if p.hash not in originals)
            tasks = [
                confirm_task(g, {h: originals[h] for h in originals if h in {p.hash for p in g.points}})
                for g in again.groups
            ]
            executor.run(tasks)
            result, summary = judge.judge_sweep(reader, parent, settings.gate, opts, out_dir)
    except Exception as exc:
        try:
            check_store_reachable(Store(tracking_uri, None))
        except TrackingError:  # the server went away: infrastructure; the measurements are in MLflow
            print(
                f"gate: not decided, the tracking server failed ({type(exc).__name__}: {exc}); once it is back, "
                f"run `python -m pipeline.gate {parent} --tracking-uri {tracking_uri}`",
                file=sys.stderr,
            )
            return ExitCode.INFRA
        raise
    print(summary)
    return judge.EXIT_CODES[result.overall]


def log_probes(tracker: Any, parent: str, plan: SweepPlan, outcomes: Sequence[GroupOutcome]) -> None:
    """Each server's lossless-probe answers, beside the sweep table: the report pairs them."""
    groups = {g.index: g for g in plan.groups}
    group_of = {p.hash: g for g in plan.groups for p in g.points}
    for outcome in outcomes:
        group = groups[outcome.index]
        if not outcome.lossless:
            continue
        job = group.server_job
        base_hash = group.points[0].baseline_hash
        record = {
            "group": group.label,
            "role": group.role,
            "engine": job.engine.name,
            "method": job.spec.method,
            "k": job.spec.k,
            "dtype": job.engine.dtype,
            "baseline_group": group_of[base_hash].label if base_hash in group_of else None,
            "outputs": [dataclasses.asdict(o) for o in outcome.lossless],
        }
        tracker.log_json(parent, record, f"lossless/{group.label}.json")


def report_sweep(tracking_uri: str, parent: str, out_dir: Path, stats: StatsConfig) -> None:
    """The sweep's report; a failure here loses no measurement, so it is reported, not raised."""
    from pipeline.analysis.samples import StatsOptions
    from pipeline.finish.report_build import build
    from pipeline.record.readers import SweepReader

    try:
        opts = StatsOptions(confidence=stats.confidence, floor=stats.floor, resamples=stats.resamples)
        paths = build(SweepReader(tracking_uri), parent, out_dir, opts)
    except Exception as exc:  # noqa: BLE001 - the measurements are already safe in MLflow
        print(f"report: not written ({type(exc).__name__}: {exc}); retry with `python -m pipeline.report {parent}`")
        return
    print(f"report: {paths['html']}")
