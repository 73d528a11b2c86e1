"""Judging a sweep run against its reference, and recording the verdicts: the library under
``python -m pipeline.gate`` and the sweep's own end (``gate.enabled``).

The decision is :mod:`pipeline.analysis.regression`'s; this module reads MLflow, records the
verdicts (child tags ``gate.verdict``, metrics ``gate.<metric>.ratio/low/high``, parent tags
``gate`` and ``gate.reference``, ``gate/summary.md`` and trend plots) and maps the result to
an exit code: 0 pass or improved, 1 regression, 3 insufficient data.
"""

from __future__ import annotations

import ast
import math
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pipeline.analysis import trust
from pipeline.analysis.decisions import GateOutcome
from pipeline.analysis.gate_summary import flips_markdown, gate_markdown, night_markdown
from pipeline.analysis.paired import NightWindow, PairedResult, judge_night_as
from pipeline.analysis.regression import (
    GATED,
    Flip,
    Floors,
    GatedRun,
    GateResult,
    decision_flips,
    judge_against_history,
)
from pipeline.analysis.samples import StatsOptions
from pipeline.config import GateConfig
from pipeline.exitcode import ExitCode
from pipeline.identity import GATE_WATCHES, Identity
from pipeline.record.readers import ChildRun, HistoryReader
from pipeline.record.tracking import (
    CONFIRMATION_TAG,
    TrackingError,
)
from pipeline.record.windows import server_spread_for, window_requests, window_sample

EXIT_CODES = {
    GateOutcome.PASS: ExitCode.OK,
    GateOutcome.FAIL: ExitCode.REGRESSED,
    GateOutcome.INSUFFICIENT: ExitCode.INCOMPLETE,
}
GATE_DIR = "gate"
FLIP_TAG = "gate.decision_flip"  # on a speculative run whose verdict changed, e.g. "helps -> inconclusive"
# The gate settings the decision uses, as the driver records them on a sweep's parent run (gate.<name>).
DECIDING = (("history", int), ("floor_median", float), ("floor_p99", float), ("floor_acceptance_pp", float))
# The paired design's settings; a run recorded before they existed ran the history mode, their default.
PAIRED_DECIDING = (
    ("mode", str),
    ("pairs", int),
    ("primary", str),
    ("alpha", float),
    ("decision_floor", float),
    ("detect", float),
    ("acceptance", lambda v: v == "True"),
    ("gated", ast.literal_eval),
    ("reference", ast.literal_eval),
)


def fingerprint(tags: Mapping[str, str]) -> str:
    """A point's key in the history: its identity (pipeline.identity) less what the gate watches,
    the engine build. "" where the run recorded no identity of this version (a run from before
    it): such a run is no point's history, since its data and draft were not recorded."""
    return Identity.from_tags(tags).key(without=GATE_WATCHES)


def measured_points(children: Sequence[ChildRun]) -> list[ChildRun]:
    """A sweep's finished points, confirmations left out."""
    return [
        c
        for c in children
        if c.tags.get("status") == "finished" and "point_hash" in c.tags and CONFIRMATION_TAG not in c.tags
    ]


def point_runs(
    reader: HistoryReader,
    parent_id: str,
    children: Sequence[ChildRun],
    work: Path,
) -> list[GatedRun]:
    started = reader.started_ms(parent_id)
    out = []
    for child in children:
        sample = window_sample(reader, child.run_id, child.metrics.get("duration", math.nan), work)
        values = {m.column: child.metrics.get(m.column, math.nan) for m in GATED}
        key = fingerprint(child.tags)
        out.append(
            GatedRun(
                child.run_id,
                parent_id,
                key,
                child.name,
                values,
                sample,
                started,
                tuple(sorted(trust.failed_checks(child.metrics))),
            )
        )
    return out


@dataclass(frozen=True)
class Reference:
    runs: dict[str, list[GatedRun]]  # fingerprint -> reference runs, newest first
    spread_from: dict[str, list[GatedRun]]  # fingerprint -> past runs that measure the spread
    text: str
    tag: str  # gate.reference on the parent: a run id, or "median:<ids>"
    steps: tuple[str, ...] = ()  # sustained steps found in the points' nightly series, said in the summary
    shown: dict[str, list[GatedRun]] | None = None  # the trend plots' past runs (default: spread_from)


def reference_for(
    reader: HistoryReader,
    parent_id: str,
    current: Sequence[GatedRun],
    history: int,
    work: Path,
) -> Reference:
    keys = {p.key for p in current if p.key}  # a point without an identity has no history
    past: dict[str, list[GatedRun]] = {k: [] for k in keys}
    used: list[str] = []
    for run_id in reader.past_sweeps(parent_id)[: 4 * history]:
        if all(len(v) >= history for v in past.values()):
            break
        wanted = [
            c
            for c in measured_points(reader.children(run_id))
            if fingerprint(c.tags) in keys and len(past[fingerprint(c.tags)]) < history
        ]
        if wanted:
            used.append(run_id)
        for point in point_runs(reader, run_id, wanted, work):
            past[point.key].append(point)
    pinned = reader.pinned(reader.experiment_of(parent_id))
    if pinned and pinned != parent_id:
        runs = point_runs(reader, pinned, measured_points(reader.children(pinned)), work)
        by_key = {p.key: [p] for p in runs if p.key in keys}
        return Reference(by_key, past, f"pinned sweep run {pinned}", pinned)
    text = f"the per-point median of the last {history} runs with the same fingerprint ({len(used)} found)"
    trimmed, steps = after_steps(current, past, nightly_series(reader, parent_id, keys))
    # The spread too is measured on one side of a step: across it, the step itself would widen
    # the interval and hide the slowdown the step was found for. The plots show every night.
    return Reference(trimmed, trimmed, text, "median:" + ",".join(used), steps, shown=past)


CHANGE_NIGHTS = 30  # the past nights a step is searched in (the length its penalty was calibrated on)


def nightly_series(reader: HistoryReader, parent_id: str, keys: set[str]) -> dict[str, list[GatedRun]]:
    """Each point's values over up to CHANGE_NIGHTS past runs, newest first: longer than the
    reference's window, so that a step can be found at all, and with no requests downloaded."""
    found: dict[str, list[GatedRun]] = {k: [] for k in keys}
    for run_id in reader.past_sweeps(parent_id)[:CHANGE_NIGHTS]:
        started = reader.started_ms(run_id)
        for c in measured_points(reader.children(run_id)):
            key = fingerprint(c.tags)
            if key in found:
                values = {m.column: c.metrics.get(m.column, math.nan) for m in GATED}
                found[key].append(GatedRun(c.run_id, run_id, key, c.name, values, None, started))
    return found


def after_steps(
    current: Sequence[GatedRun],
    past: Mapping[str, list[GatedRun]],
    series: Mapping[str, list[GatedRun]] | None = None,
) -> tuple[dict[str, list[GatedRun]], tuple[str, ...]]:
    """Each point's reference across the last sustained step of each gated metric (at least two
    past nights on its far side: tonight alone is what the gate judges, not a step), and a line
    for each step found, with the run it began at. Each metric is searched and trimmed on its
    own: a step in throughput or acceptance alone moves only that metric's reference. A step for
    the worse leaves the nights after it out, so that a persistent slowdown is not absorbed into
    the median of the last nights; a step for the better leaves the nights before it out, so that
    the slower level it left does not hide a later return to it. A night left out of one metric's
    reference stays in the others', with that metric's value blanked (NaN)."""
    trimmed, said = {}, []
    for point in current:
        runs = past.get(point.key, [])  # the reference's runs, newest first
        oldest_first = list(reversed((series if series is not None else past).get(point.key, runs)))
        kept_by_metric = {}
        for metric in GATED:
            kept, line = _across_step(point, runs, oldest_first, metric.column, metric.higher_is_better)
            kept_by_metric[metric.column] = {r.run_id for r in kept}
            if line:
                said.append(line)
            for run in kept:  # a run joins the reference through a metric it has a value of
                measured = math.isfinite(run.values.get(metric.column, math.nan))
                if measured and run.run_id not in {r.run_id for r in trimmed.get(point.key, [])}:
                    trimmed.setdefault(point.key, []).append(run)
        union = sorted(trimmed.get(point.key, []), key=lambda r: r.started_ms, reverse=True)
        trimmed[point.key] = [
            replace(
                r, values={m: v if r.run_id in kept_by_metric.get(m, ()) else math.nan for m, v in r.values.items()}
            )
            for r in union
        ] or runs
    return trimmed, tuple(said)


def _across_step(
    point: GatedRun, runs: list[GatedRun], oldest_first: list[GatedRun], metric: str, higher_is_better: bool
) -> tuple[list[GatedRun], str]:
    """One metric's reference runs across its last sustained step (all of ``runs`` where there
    is none), and the summary's line for the step ("" where there is none)."""
    from pipeline.analysis.change_points import last_step

    step = last_step([r.values.get(metric, math.nan) for r in oldest_first])
    if step is None or not 0 < step.night < len(oldest_first):
        return runs, ""
    began = oldest_first[step.night]
    worse = (step.change < 0) if higher_is_better else (step.change > 0)
    if worse:
        kept = [r for r in runs if r.started_ms < began.started_ms]
        left_out = f"the {len(runs) - len(kept)} night(s) since"
        # The window keeps its length with the nights before it, from the series (values only;
        # the reference's own runs, which carry their requests, first).
        have = {r.parent_id for r in kept}
        before = [r for r in reversed(oldest_first) if r.started_ms < began.started_ms and r.parent_id not in have]
        kept = (kept + before)[: max(len(runs), 1)]
    else:
        kept = [r for r in runs if r.started_ms >= began.started_ms]
        left_out = f"the {len(runs) - len(kept)} night(s) before it"
    line = (
        f"{point.label}: a sustained step {'for the worse' if worse else 'for the better'} of "
        f"{step.change:+.1%} in {metric} began at sweep run {began.parent_id}; {left_out} are left out of "
        f"its reference"
    )
    return kept or runs, line


def record_verdicts(
    reader: HistoryReader,
    parent_id: str,
    result: GateResult,
    ref: Reference,
    current: Sequence[GatedRun],
    summary: str,
    out_dir: Path,
) -> list[Path]:
    """Verdicts on the runs, the summary and one trend plot per point on the parent run."""
    from pipeline.analysis import figures, plots

    withheld = result.withheld()
    for run_id, verdict in result.points.items():
        reader.set_tags(
            run_id, {"gate.verdict": verdict} | ({"gate.withheld": withheld[run_id]} if run_id in withheld else {})
        )
    for f in result.findings:
        values = {"ratio": f.ratio.estimate, "low": f.ratio.low, "high": f.ratio.high}
        reader.log_metrics(f.run_id, {f"gate.{f.metric}.{k}": v for k, v in values.items() if v is not None})
    reader.set_tags(parent_id, {"gate": result.overall, "gate.reference": ref.tag[:5000]})
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "summary.md"]
    paths[0].write_text(summary)
    for i, point in enumerate(current, start=1):
        past = list(reversed((ref.shown if ref.shown is not None else ref.spread_from).get(point.key, [])))
        series = {
            m: [(p.started_ms, p.values[m]) for p in [*past, point] if math.isfinite(p.values.get(m, math.nan))]
            for m in ("median_tpot_ms", "p99_tpot_ms", "output_throughput")
        }
        reference = {f.metric: f.reference for f in result.findings if f.run_id == point.run_id}
        if len(past) and reference:
            path = out_dir / f"trend{i}.png"
            path.write_bytes(plots.png(figures.gate_trend(point.label, series, reference)))
            paths.append(path)
    for path in paths:
        reader.log_file(parent_id, path, GATE_DIR)
    return paths


def judge_sweep(
    reader: HistoryReader, parent_id: str, config: GateConfig, opts: StatsOptions, out_dir: Path
) -> tuple[GateResult | PairedResult, str]:
    """Judge a sweep run and record the result; returns it and its Markdown summary. Points
    re-measured by a confirmation (children tagged ``gate.confirmation_of``) are judged
    again, and a regression stands only if the re-measurement shows it too."""
    from pipeline.analysis.regression import confirm

    if config.paired:
        return judge_paired(reader, parent_id, config, out_dir)
    floors = Floors(config.floor_median, config.floor_p99, config.floor_acceptance_pp)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        children = reader.children(parent_id)
        current = point_runs(reader, parent_id, measured_points(children), work)
        ref = reference_for(reader, parent_id, current, config.history, work)
        aa = server_spread_for(reader, parent_id)
        result = judge_against_history(current, ref.runs, opts, floors, aa, spread_from=ref.spread_from)
        remeasured = [c for c in children if CONFIRMATION_TAG in c.tags and c.tags.get("status") == "finished"]
        if remeasured:
            again = point_runs(reader, parent_id, remeasured, work)  # the same fingerprints as the originals
            second = judge_against_history(again, ref.runs, opts, floors, aa, spread_from=ref.spread_from)
            result = confirm(result, second, {c.tags[CONFIRMATION_TAG]: c.run_id for c in remeasured})
        flips, compared = _flips(reader, parent_id, ref, work, opts)
    summary = gate_markdown(result, reader.title(parent_id), ref.text) + "\n" + flips_markdown(flips, compared)
    if ref.steps:
        summary += "\nChange points:\n\n" + "\n".join(f"- {line}" for line in ref.steps) + "\n"
    record_verdicts(reader, parent_id, result, ref, current, summary, out_dir / GATE_DIR)
    for flip in flips:
        reader.set_tags(flip.run_id, {FLIP_TAG: f"{flip.before} -> {flip.after} (since sweep run {flip.reference})"})
    reader.set_tags(parent_id, {"gate.decision_flips": str(len(flips))})
    return result, summary


def night_windows(reader: HistoryReader, parent_id: str, work: Path) -> list[NightWindow]:
    """A paired night's measured windows, each with its build, pair and requests (downloaded
    into ``work``): what the night's decision reads, and what a calibration re-reads."""
    return [
        NightWindow(
            c.tags.get("gate.pair_key", c.tags["gate.pair_label"]),
            c.tags["gate.pair_label"],
            c.tags.get("role", ""),
            c.tags["gate.build"],
            int(c.tags["gate.pair"]),
            window_sample(reader, c.run_id, c.metrics.get("duration", math.nan), work),
            c.metrics,
        )
        for c in measured_points(reader.children(parent_id))
        if "gate.build" in c.tags and "gate.pair_label" in c.tags
    ]


def judge_paired(reader: HistoryReader, parent_id: str, config: GateConfig, out_dir: Path) -> tuple[PairedResult, str]:
    """gate.mode=paired: tonight's candidate against the reference build measured beside it,
    pair by pair; the summary and the decision go to the parent run."""
    with tempfile.TemporaryDirectory() as tmp:
        windows = night_windows(reader, parent_id, Path(tmp))
    result = judge_night_as(windows, config)
    reference = (
        f"the build of gate.reference={list(config.reference)}"
        if config.reference
        else "the candidate's own build (an A/A night)"
    )
    summary = night_markdown(result, reader.title(parent_id), reference, config.floor_median)
    tags = {"gate": result.overall, "gate.mode": "paired", "gate.reference": reference[:5000]}
    if result.power is not None:
        tags["gate.power"] = result.power.text()[:5000]
    reader.set_tags(parent_id, tags)
    counts = {
        "gate.paired.pairs_planned": float(result.account.planned),
        "gate.paired.pairs_measured": float(result.account.measured),
    }
    if math.isfinite(result.primary.change):
        counts[f"gate.paired.{result.primary.metric}.change"] = result.primary.change
    reader.log_metrics(parent_id, counts)
    folder = out_dir / GATE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.md").write_text(summary)
    reader.log_file(parent_id, folder / "summary.md", GATE_DIR)
    return result, summary


def speculation_verdicts(
    reader: HistoryReader,
    parent_id: str,
    work: Path,
    opts: StatsOptions,
) -> dict[str, tuple[str, str, str]]:
    """Each speculative point of a sweep run, by fingerprint: (label, run id, its median-TPOT
    verdict against the baseline), decided from the run's own summary and requests as the
    report decides it (the same intervals, the same correction across the sweep)."""
    import pandas as pd

    from pipeline.analysis import verdicts
    from pipeline.analysis.samples import Sample

    folder = work / f"verdicts-{parent_id}"
    path = reader.download(parent_id, "summary.csv", folder)
    if path is None:
        return {}
    frame = pd.read_csv(path)
    samples = {run: Sample.from_requests(t, d) for run, (t, d) in window_requests(reader, frame, folder).items()}
    spread = server_spread_for(reader, parent_id)
    comparisons = verdicts.compare_points(
        frame, samples, opts if spread is None else replace(opts, server_spread=spread)
    )
    children = {c.run_id: c for c in reader.children(parent_id)}
    out = {}
    for row, label in zip(comparisons.table.itertuples(), comparisons.labels(comparisons.table), strict=True):
        child = children.get(str(row.run_ids).split()[0])  # the speculative run comes first
        if child is not None and CONFIRMATION_TAG not in child.tags and fingerprint(child.tags):
            out[fingerprint(child.tags)] = (child.name, child.run_id, label)
    return out


def _flips(
    reader: HistoryReader,
    parent_id: str,
    ref: Reference,
    work: Path,
    opts: StatsOptions,
) -> tuple[list[Flip], int]:
    """The points whose speculation verdict changed since the newest reference run that holds
    them (the pinned run, where one is pinned), and how many points could be compared."""
    now = speculation_verdicts(reader, parent_id, work, opts)
    cache: dict[str, dict[str, tuple[str, str, str]]] = {}
    before: dict[str, tuple[str, str]] = {}
    for key in now:
        runs = ref.runs.get(key) or ref.spread_from.get(key) or []
        if not runs:
            continue
        past = runs[0].parent_id
        if past not in cache:
            cache[past] = speculation_verdicts(reader, past, work, opts)
        if key in cache[past]:
            before[key] = (cache[past][key][2], past)
    return decision_flips(now, before), len(before)


def recorded_config(params: Mapping[str, str], history: int | None = None) -> tuple[GateConfig, list[str]]:
    """The gate settings a sweep ran with, read back from its parent run's params; ``history``
    (the --history flag) wins over the recorded one. A setting the run does not hold (it ran
    before they were recorded) keeps its default: returns the config and the names defaulted."""
    chosen: dict[str, Any] = {}
    defaulted = []
    for name, cast in DECIDING:
        value = params.get(f"gate.{name}")
        if name == "history" and history is not None:
            chosen[name] = history
        elif value is None:
            defaulted.append(name)
        else:
            try:
                chosen[name] = cast(value)
            except ValueError as exc:
                raise TrackingError(f"the sweep run's param gate.{name}={value!r} is not a number") from exc
    for name, cast in PAIRED_DECIDING:
        if f"gate.{name}" in params:
            try:
                chosen[name] = cast(params[f"gate.{name}"])
            except (ValueError, SyntaxError) as exc:
                raise TrackingError(
                    f"the sweep run's param gate.{name}={params[f'gate.{name}']!r} is malformed"
                ) from exc
    return GateConfig(**chosen), defaulted
