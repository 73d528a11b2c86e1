"""The regression gate's decision: one sweep run's points against their reference.

Pure computation on the statistics core (:mod:`pipeline.analysis.stats`); reading MLflow,
recording the verdicts and the exit code are :mod:`pipeline.finish.judge`'s.

- **The reference** of a point is the median of its past runs (the last N runs of the sweep
  with the same fingerprint, or a pinned run).
- **The interval** of a ratio comes from the spread between past runs, pooled over the
  sweep's points per metric (a prediction interval for one new run). With a single past run
  there is no such spread yet: the windows are then paired by prompt (the same prompts and
  schedule every night) and bootstrapped, plus the A/A spread between fresh servers where
  the store has one. Either way a regression is then only "suspect" (and an improvement is not
  called): the A/A spread between servers is narrower than the spread between nights, and an
  interval that leaves the latter out is too narrow to fail a job on.
- **Change points**: where a point's nightly series shows a sustained step
  (:mod:`pipeline.analysis.change_points`), the nights after it never enter its reference, so
  a persistent slowdown is not absorbed into the median of the last nights.
- **The decision** is the core's: a ratio regresses only if its interval lies past the
  metric's floor on the bad side, after a Benjamini-Hochberg adjustment over every point
  and metric of the run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

import numpy as np

from pipeline.analysis import between_runs, decisions, stats, trust
from pipeline.analysis.decisions import GateOutcome
from pipeline.analysis.samples import Sample, ServerSpread, StatsOptions
from pipeline.analysis.stats import Ratio
from pipeline.measures import (
    ACCEPTANCE_RATE,
    MEDIAN_TPOT,
    MEDIAN_TTFT,
    OUTPUT_THROUGHPUT,
    P99_TPOT,
    Better,
    Measure,
)


class PointGate(StrEnum):
    """A point's verdict against the gate's reference; the night's is its worst (SEVERITY)."""

    PASS = "pass"
    IMPROVED = "improved"
    REGRESSED = "regressed"
    SUSPECT = "suspect"
    INSUFFICIENT = "insufficient"


PASS, IMPROVED, REGRESSED, SUSPECT, INSUFFICIENT = PointGate
# A point's verdict is its worst metric's, in this order.
SEVERITY = (REGRESSED, SUSPECT, IMPROVED, PASS, INSUFFICIENT)


@dataclass(frozen=True)
class GateMetric:
    measure: Measure  # its name is the sweep table's column and the child runs' metric
    floor: str  # which floor: median | p99 | acceptance

    @property
    def column(self) -> str:
        return self.measure.name

    @property
    def ratio(self) -> str:
        """The core's paired ratio for the one-past-run case ("" where there is none)."""
        return self.measure.ratio or ""

    @property
    def higher_is_better(self) -> bool:
        return self.measure.better is Better.HIGHER


GATED = (
    GateMetric(MEDIAN_TPOT, "median"),
    GateMetric(P99_TPOT, "p99"),
    GateMetric(MEDIAN_TTFT, "median"),
    GateMetric(OUTPUT_THROUGHPUT, "median"),
    GateMetric(ACCEPTANCE_RATE, "acceptance"),  # in percent; compared night to night, never as a ratio
)


@dataclass(frozen=True)
class Floors:
    median: float = 0.05  # medians and throughput
    p99: float = 0.10
    acceptance_pp: float = 2.0  # percentage points

    def relative(self, metric: GateMetric, reference: float) -> float:
        if metric.floor == "acceptance":  # points, as a fraction of the reference rate
            return min(0.99, self.acceptance_pp / reference) if reference > 0 else 0.99
        return self.p99 if metric.floor == "p99" else self.median


@dataclass(frozen=True, eq=False)
class GatedRun:
    """One measured point of one sweep run."""

    run_id: str
    parent_id: str
    key: str  # fingerprint: point hash, hardware and model revision
    label: str
    values: dict[str, float]
    sample: Sample | None = None  # its requests, for the one-past-run case
    started_ms: int = 0
    failed_checks: tuple[str, ...] = ()  # the validity checks its window failed (trust.CHECKS names)


@dataclass(frozen=True)
class Finding:
    label: str
    key: str
    run_id: str
    metric: str
    verdict: str
    ratio: Ratio
    floor: float
    reference: float
    current: float
    p_adjusted: float | None = None
    note: str = ""
    withheld: str = ""  # the failed validity checks that withhold a pass or an improvement, said


@dataclass(frozen=True)
class GateResult:
    findings: tuple[Finding, ...]
    points: dict[str, str]  # run id -> verdict
    labels: dict[str, str]  # run id -> point label
    past_runs: int  # how many past sweep runs the reference rests on (at most)
    spread: dict[str, tuple[float, int]]  # metric -> (log sd between runs, df)

    @property
    def overall(self) -> str:
        """fail | pass | insufficient, for the parent run and the exit code."""
        verdicts = set(self.points.values())
        if REGRESSED in verdicts:
            return GateOutcome.FAIL
        # A point measured on a window its own checks reject was not judged: the night is not a pass.
        if self.withheld():
            return GateOutcome.INSUFFICIENT
        if not verdicts or verdicts == {INSUFFICIENT}:
            return GateOutcome.INSUFFICIENT
        return GateOutcome.PASS

    def withheld(self) -> dict[str, str]:
        """Run id -> the failed validity checks, for each point they leave short of a decision
        (every one but a regression: a suspect point on a rejected window is no pass either)."""
        out: dict[str, str] = {}
        for f in self.findings:
            if f.withheld and self.points.get(f.run_id) != REGRESSED:
                out.setdefault(f.run_id, f.withheld)
        return out

    def flagged(self) -> list[str]:
        """Run ids of the points that regressed: what a confirmation re-measures."""
        return [run for run, verdict in self.points.items() if verdict == REGRESSED]


def judge_against_history(
    current: Sequence[GatedRun],
    history: Mapping[str, Sequence[GatedRun]],
    opts: StatsOptions,
    floors: Floors,
    aa: ServerSpread | None = None,
    spread_from: Mapping[str, Sequence[GatedRun]] | None = None,
) -> GateResult:
    """``history[key]``: the reference runs of each point, newest first (one, if pinned).
    ``spread_from``: the past runs that measure the spread between runs (default: history)."""
    spread_from = history if spread_from is None else spread_from
    # The nights the spread rests on: its degrees of freedom count them, not the points in them.
    nights = len({h.parent_id for p in current for h in spread_from.get(p.key, ())})
    groups = {
        m.column: [[h.values.get(m.column, math.nan) for h in spread_from.get(p.key, ())] for p in current]
        for m in GATED
    }
    spread = {m: between_runs.pooled_log_spread(g, nights) for m, g in groups.items()}  # what the summary quotes
    # Each point's own spread, shrunk toward the pooled one (empirical Bayes), is what decides it.
    per_point = {m: between_runs.moderated_log_spreads(g, nights) for m, g in groups.items()}
    ratios: list[Ratio] = []
    slots: list[tuple[GatedRun, GateMetric, float, float, bool]] = []
    for i, point in enumerate(current):
        past = history.get(point.key, ())
        for j, metric in enumerate(GATED):
            value = point.values.get(metric.column, math.nan)
            past_values = [h.values.get(metric.column, math.nan) for h in past]
            finite = [v for v in past_values if math.isfinite(v) and v > 0]
            if not past or not math.isfinite(value) or not finite:
                continue
            reference = float(np.median(finite))
            s, df = per_point[metric.column][i]
            if df >= 1:
                ratio = between_runs.against_history(metric.column, value, finite, s, df, opts, metric.higher_is_better)
                measured = True
            else:
                # Only the bootstrap of one past run resamples: seeded per point and metric.
                rng = np.random.default_rng([opts.seed, 17, i, j])
                ratio, measured = _one_past_run(metric, point, past, value, reference, opts, aa, rng)
            ratios.append(ratio)
            slots.append((point, metric, reference, value, measured))
    decided = decisions.decide(ratios, opts, [floors.relative(m, ref) for _, m, ref, _, _ in slots])
    findings = tuple(_decided_finding(slot, d, floors) for slot, d in zip(slots, decided, strict=True))
    return _gate_result(current, findings, history, spread)


def _decided_finding(
    slot: tuple[GatedRun, GateMetric, float, float, bool], decided: decisions.Decision, floors: Floors
) -> Finding:
    """One metric of one point, decided, with the validity checks that withhold it."""
    point, metric, reference, value, measured = slot
    found = Finding(
        point.label,
        point.key,
        point.run_id,
        metric.column,
        _verdict(decided, measured),
        replace(decided.ratio, metric=metric.column),
        floors.relative(metric, reference),
        reference,
        value,
        decided.p_adjusted,
        decided.detail if not measured else "",
    )
    return _withhold(found, _undermining(point, metric))


def _undermining(point: GatedRun, metric: GateMetric) -> str:
    """The failed checks of the point's window that undermine this metric, each with its label
    ("not steady"), as the report withholds its verdicts (:func:`pipeline.analysis.trust.withheld`)."""
    names = []
    for name in point.failed_checks:
        check = trust.BY_NAME.get(name)
        if check is None:  # a check this version does not know: withheld all the same, by its name
            names.append(name)
        elif check.undermines == trust.ALL or metric.measure is not OUTPUT_THROUGHPUT:
            names.append(f"{check.label} (validity.{name})")
    return "; ".join(names)


def _withhold(finding: Finding, why: str) -> Finding:
    """A window its own checks reject decides no pass and no improvement: that metric is
    "insufficient", saying why. A regression or a suspect one stands, as a night that lost pairs
    still fails on what it did measure: the failed check says the window is not the steady state
    the gate compares, and a slowdown that even keeps a window from reaching it is no pass."""
    if not why:
        return finding
    kept = finding.verdict in (REGRESSED, SUSPECT)
    return replace(finding, verdict=finding.verdict if kept else INSUFFICIENT, withheld=why)


def _one_past_run(
    metric: GateMetric,
    point: GatedRun,
    runs: Sequence[GatedRun],
    value: float,
    reference: float,
    opts: StatsOptions,
    aa: ServerSpread | None,
    rng: np.random.Generator,
) -> tuple[Ratio, bool]:
    """Against a single past run: the core's paired bootstrap over prompts, widened by the
    A/A spread between servers where there is one. Never trusted to fail a job: one past night
    measures no night-to-night spread (the A/A spread between servers is narrower: 6.4 % against
    7.8 % for the median TPOT, 3.4 % against 7.4 % for p99), so a worse point is "suspect" only."""
    # The newest past run with this metric (a change point may have blanked it in the others).
    past = next(h for h in runs if math.isfinite(h.values.get(metric.column, math.nan)))
    sign = 1.0 if metric.higher_is_better else -1.0
    estimate = math.exp(sign * (math.log(value) - math.log(reference)))
    if not metric.ratio or point.sample is None or past.sample is None:
        return Ratio(metric.column, estimate, note="one past run and no per-request data: no interval"), False
    with_aa = replace(opts, server_spread=aa) if aa is not None and aa.for_metric(metric.ratio) else opts
    # Kept under the core's name (speedup_p99_tpot) until decided: the decision's rules are keyed
    # on it (a p99 needs 100 paired requests); judge_against_history renames it after.
    return stats.paired_ratio(metric.ratio, [past.sample], [point.sample], with_aa, rng, shared_servers=True), False


def _verdict(decision: decisions.Decision, measured: bool) -> str:
    """Only an interval that holds the spread between runs may call a change: without it a
    worse point is "suspect" and a better one stays "pass"."""
    if decision.label == decisions.HURTS:
        return REGRESSED if measured else SUSPECT
    if decision.label == decisions.HELPS:
        return IMPROVED if measured else PASS
    return PASS if decision.ratio.resolved else INSUFFICIENT


def _gate_result(
    current: Sequence[GatedRun],
    findings: Sequence[Finding],
    history: Mapping[str, Sequence[GatedRun]],
    spread: dict[str, tuple[float, int]],
) -> GateResult:
    points = _point_verdicts([p.run_id for p in current], findings)
    past = max((len(history.get(p.key, ())) for p in current), default=0)
    return GateResult(tuple(findings), points, {p.run_id: p.label for p in current}, past, spread)


def confirm(first: GateResult, second: GateResult, remeasured: Mapping[str, str]) -> GateResult:
    """A regression stands only if the re-measurement (``remeasured``: first run id ->
    confirmation run id) regresses on the same metric; otherwise it is "suspect"."""
    again = {(f.run_id, f.metric) for f in second.findings if f.verdict == REGRESSED}
    findings = []
    for f in first.findings:
        if f.verdict == REGRESSED and (remeasured.get(f.run_id), f.metric) not in again:
            f = replace(f, verdict=SUSPECT, note="not seen again when re-measured on a fresh server")
        findings.append(f)
    return replace(first, findings=tuple(findings), points=_point_verdicts(list(first.points), findings))


def _point_verdicts(runs: Sequence[str], findings: Sequence[Finding]) -> dict[str, str]:
    """Each point's verdict: its worst metric's (SEVERITY); a point with a withheld metric and
    no regression is "insufficient", so a throughput that passed hides no withheld latency."""
    points = {}
    for run in runs:
        mine = [f for f in findings if f.run_id == run]
        verdict = next((v for v in SEVERITY if v in {f.verdict for f in mine}), INSUFFICIENT)
        if any(f.withheld for f in mine) and verdict not in (REGRESSED, SUSPECT):
            verdict = INSUFFICIENT
        points[run] = verdict
    return points


# ---- Did the nightly's own decision change? -------------------------------------------------

DECIDED = decisions.DECIDED  # a flip is a change to or from one of these


@dataclass(frozen=True)
class Flip:
    """A speculative point whose median-TPOT verdict against its baseline changed since the reference."""

    label: str
    run_id: str  # the current speculative run
    before: str
    after: str
    reference: str  # the sweep run the verdict was compared with


def decision_flips(current: Mapping[str, tuple[str, str, str]], reference: Mapping[str, tuple[str, str]]) -> list[Flip]:
    """``current``: fingerprint -> (label, run id, verdict); ``reference``: fingerprint ->
    (verdict, sweep run). A point flips where its verdict differs and either side was "helps"
    or "hurts": from "inconclusive" to "not enough requests" is no decision changing."""
    flips = []
    for key, (label, run_id, now) in sorted(current.items(), key=lambda item: item[1][0]):
        if key not in reference:
            continue
        before, run = reference[key]
        if before != now and (before in DECIDED or now in DECIDED):
            flips.append(Flip(label, run_id, before, now, run))
    return flips
