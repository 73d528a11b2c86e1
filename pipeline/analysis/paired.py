"""The paired gate's decision: one night's candidate build against a reference measured the same night.

A night measures the reference and the candidate build on fresh servers, interleaved (ABBA),
``gate.pairs`` pairs per server configuration, on the same prompts and schedule. What the
night's machine does to both builds (a busy neighbour, a warm page cache) cancels within a pair.

- **The unit is the pair.** Each pair gives one log ratio per point and metric, oriented so that
  > 0 is worse for the candidate: log(candidate / reference) for a latency, the inverse for
  throughput and acceptance. A latency's ratio is of medians (or p99s) over the prompts both
  servers were sent, paired by prompt as the sweep's own verdicts are, a failed request counting
  as +inf (censored).
- **Failed requests** are gated too: per pair, the share of prompts one build failed and the
  other answered, a one-sided t over the pairs, so a candidate cannot pass on the requests it
  did answer, and one crashed server is not read as a regression. A quantile that reaches a
  build's failures is censored against that build (+inf or -inf), never dropped.
- **A night that lost pairs is never a pass**: the night's account (:class:`PairAccount`) says
  how many pairs were planned, measured and lost, and why; a pair keeps the points it has; such
  a night is insufficient unless what was measured regressed.
- **The primary endpoint** (``gate.primary``, default the median TPOT) is the geometric mean
  over the night's points of its ratio: per pair, the mean over points of the log ratios. It
  alone decides the exit code, with one-sided t over the m pairs' values (m - 1 degrees of
  freedom) against the practical floor: "the candidate is slower by more than the floor".
- **Acceptance length** is gated on its own: a drop in L is a correctness smell even where the
  latency holds. The primary and acceptance share the night's false-alarm budget (Holm).
- **Secondary metrics** (p99 TPOT, TTFT, throughput) get Holm's correction among themselves and
  are reported, not gated, unless ``gate.gated`` names them (then they join the gated family).
- **Power**, from the upper confidence bound of this night's own pair spread: the smallest
  slowdown the design detects with 80 % power at its false-alarm level, and how many pairs
  would detect ``gate.detect``.

The t test is scipy's (its special functions), the rank test where pairs are censored scipy's
``wilcoxon``, and the power statsmodels' (``TTestPower``, one-sample, ``alternative="larger"``);
Holm's adjustment is checked against statsmodels' ``multipletests`` (see :func:`holm_adjusted`
for why it is not called). Pure computation; no MLflow, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import special
from scipy import stats as scipy_stats

from pipeline.analysis.decisions import GateOutcome, planning_sd
from pipeline.analysis.samples import Sample
from pipeline.analysis.stats import censored_percentile, paired_values
from pipeline.config import GateConfig

# metric -> (how a pair's ratio is taken, higher is better)
PAIRED_METRICS: dict[str, tuple[str, bool]] = {
    "median_tpot_ms": ("median tpot", False),
    "p99_tpot_ms": ("p99 tpot", False),
    "median_ttft_ms": ("median ttft", False),
    "output_throughput": ("summary", True),
    "acceptance_length": ("summary", True),
}
SECONDARY = ("p99_tpot_ms", "median_ttft_ms", "output_throughput")
ACCEPTANCE = "acceptance_length"
# The night's outcomes (the gate's exit codes map them: pipeline.finish.judge.EXIT_CODES).
FAIL, PASS, INSUFFICIENT = GateOutcome.FAIL, GateOutcome.PASS, GateOutcome.INSUFFICIENT
FAILURES = "failed_requests"  # gated beside the primary: a build that fails requests is worse
# The power the night's smallest detectable slowdown is stated at, and that gate.detect must reach
# for the design to be met; the report's sample-size hints aim at decisions.HINT_POWER.
DESIGN_POWER = 0.80
# The one-sided confidence of the spread's upper bound that a night's power is sized from (as the
# report's sample-size hints are: decisions.planning_sd).
SPREAD_CONFIDENCE = 0.80
MOST_PAIRS = 64  # the largest design the pairs-needed answer searches
# The pair spread of the median TPOT (log sd) that real A/A nights measured at the default design
# on 2 cores, and the degrees of freedom it rests on (benchmarks/gate_power.py --real;
# docs/statistics.md): what a design is sized by before its own night measures its spread.
# Four nights, two of them on a loaded machine (19.2 % [14.0, 30.7] pooled; the quiet two 8.0 %):
# the pooled value, since the machines users gate on are not always quiet either.
PLANNED_SPREAD = (0.176, 16)  # log sd (19.2 %), df
FEWEST_PAIRS = 4  # fewer are refused unless gate.detect is what they can see (validate)


def pair_log_ratio(
    metric: str,
    reference: Sample | None,
    candidate: Sample | None,
    reference_value: float | None = None,
    candidate_value: float | None = None,
) -> float:
    """One pair's log ratio for ``metric``, > 0 where the candidate is worse; NaN where the pair
    cannot give one. Latencies are paired by prompt (the requests both servers answered);
    throughput and acceptance length come from the windows' own summaries."""
    how, higher_is_better = PAIRED_METRICS[metric]
    if how == "summary":
        ref, cand = reference_value, candidate_value
        if ref is None or cand is None or not (ref > 0 and cand > 0):
            return math.nan
        return math.log(ref / cand) if higher_is_better else math.log(cand / ref)
    if reference is None or candidate is None:
        return math.nan
    quantiles = _pair_quantiles(how, reference, candidate)
    if isinstance(quantiles, str):
        return math.nan
    ref_q, cand_q = quantiles
    # A quantile that reaches one build's failures is censored: that build is slower than any
    # answer, and the pair's ratio is +inf (the candidate's) or -inf (the reference's), which the
    # night's test counts by rank.
    if math.isinf(cand_q) or math.isinf(ref_q):
        return math.inf if math.isinf(cand_q) else -math.inf
    return math.log(cand_q / ref_q)


def _pair_quantiles(how: str, reference: Sample, candidate: Sample) -> tuple[float, float] | str:
    """The two builds' quantiles (``how``: "median tpot") over the prompts both were asked, or
    why they give no ratio: the one place both the ratio and the night's account of a lost
    pair read, so that the reason said is the reason it was lost."""
    statistic, name = how.split()
    # The prompts both servers were asked, a failed request as a latency of +inf (censored): a
    # candidate that fails requests is slower by them, not judged on what it did answer.
    ref_values, cand_values = paired_values(reference, candidate, name)
    if len(ref_values) < 5:  # as the sweep's verdicts: fewer than five paired requests say nothing
        return f"{len(ref_values)} prompt(s) paired, fewer than 5"
    q = 50.0 if statistic == "median" else 99.0
    ref_q, cand_q = censored_percentile(ref_values, q), censored_percentile(cand_values, q)
    if math.isinf(cand_q) and math.isinf(ref_q):  # both censored: nothing says which is slower
        return f"both builds' {how} reached their failed requests"
    if not (ref_q > 0 and cand_q > 0):
        # A zero: the requests' tokens arrived together (a server that streams in one burst),
        # and a ratio to zero measures nothing.
        zero = [b for b, v in (("reference", ref_q), ("candidate", cand_q)) if not v > 0]
        return f"the {' and '.join(zero)} build's {how} is 0 ms"
    return ref_q, cand_q


def why_no_ratio(metric: str, reference: Sample | None, candidate: Sample | None) -> str:
    """Why a pair has no ratio of ``metric`` at a point, for the night's account of lost pairs."""
    if reference is None and candidate is None:
        return "neither build's window was recorded"
    if reference is None or candidate is None:
        return f"no {'reference' if reference is None else 'candidate'} window was recorded"
    how, _ = PAIRED_METRICS[metric]
    if how == "summary":
        return f"a window has no {metric}"
    quantiles = _pair_quantiles(how, reference, candidate)
    return quantiles if isinstance(quantiles, str) else "it has one"


def failures_test(windows: Sequence[NightWindow], pairs: int, alpha: float) -> PairedTest:
    """Does the candidate fail requests the reference answers? Per pair, over the night's points,
    the share of the paired prompts the candidate failed and the reference answered, less the
    converse; a one-sided t over the pairs (m - 1 degrees of freedom). The pair is the unit, not
    the prompt: failures cluster by server (a crashed server fails every prompt after the crash),
    so prompts counted as independent would call one unlucky server a regression."""
    found = {(w.key, w.build, w.pair): w for w in windows}
    keys = {w.key for w in windows}
    shares: list[float] = []
    only_candidate = only_reference = asked = 0
    for j in range(pairs):
        cand_only = ref_only = paired = 0
        for key in keys:
            ref, cand = found.get((key, "reference", j)), found.get((key, "candidate", j))
            if ref is None or cand is None or ref.sample is None or cand.sample is None:
                continue
            ref_e2e, cand_e2e = paired_values(ref.sample, cand.sample, "e2el")  # both-failed left out
            paired += len(ref_e2e)
            cand_only += int((np.isinf(cand_e2e) & ~np.isinf(ref_e2e)).sum())
            ref_only += int((np.isinf(ref_e2e) & ~np.isinf(cand_e2e)).sum())
        if paired:
            shares.append((cand_only - ref_only) / paired)
            only_candidate, only_reference, asked = (
                only_candidate + cand_only,
                only_reference + ref_only,
                asked + paired,
            )
    note = f"candidate failed {only_candidate}, reference {only_reference} of {asked} paired prompts"
    m = len(shares)
    if m < 2 or not any(shares):
        return PairedTest(FAILURES, m, 0.0, None, None, None, None, alpha_used=alpha, note=note)
    values = np.asarray(shares)
    mean, sd = float(values.mean()), float(values.std(ddof=1))
    if sd == 0.0:  # every pair alike: the sign of the difference is the answer
        p = 0.0 if mean > 0 else 1.0
    else:
        p = float(special.stdtr(m - 1, -mean / (sd / math.sqrt(m))))
    return PairedTest(FAILURES, m, mean, None, None, None, p, alpha_used=alpha, note=note)


def endpoint(per_point: Mapping[str, Sequence[float]]) -> list[float]:
    """The night's endpoint per pair: the mean over points of the pairs' log ratios (the log of
    the geometric mean ratio). ``per_point``: point -> its log ratio in pair 1..m. A pair keeps
    the points it has a finite ratio at: one without a ratio at some point (NaN: a window lost),
    or censored there (+inf: the candidate's quantile reached its failures; -inf: the
    reference's), averages the others, and is never deleted everywhere (the night's account says
    which, and such a night cannot pass). A pair with no finite point is censored as a whole
    (+inf or -inf, for the rank test), or NaN where it has no point at all or both signs."""
    series = [list(v) for v in per_point.values()]
    if not series:
        return []
    out = []
    for j in range(max(len(s) for s in series)):
        values = [s[j] for s in series if j < len(s) and not math.isnan(s[j])]
        finite = [v for v in values if math.isfinite(v)]
        worse, better = math.inf in values, -math.inf in values
        if finite:
            out.append(float(np.mean(finite)))
        elif worse != better:
            out.append(math.inf if worse else -math.inf)
        else:
            out.append(math.nan)
    return out


@dataclass(frozen=True)
class PairedTest:
    """One endpoint's one-sided t over the night's pairs."""

    metric: str
    pairs: int  # pairs with a ratio
    change: float  # exp(mean log ratio) - 1: > 0 is worse for the candidate
    low: float | None  # a two-sided (1 - 2 alpha) interval of the change, from the t distribution
    high: float | None
    sd_log: float | None  # the pairs' spread, log scale
    p: float | None  # one-sided: worse by more than the floor
    p_adjusted: float | None = None  # Holm, within its family
    gated: bool = False
    floor: float = 0.0
    alpha_used: float = 0.05  # the family's false-alarm level
    note: str = ""  # what the change counts, where it is not a ratio (the failed requests)
    censored: int = 0  # pairs censored at every point they have, the candidate's quantile at its failures (+inf)
    censored_low: int = 0  # the same, the reference's (-inf)

    @property
    def regressed(self) -> bool:
        return self.p_adjusted is not None and self.p_adjusted < self.alpha_used

    def text(self) -> str:
        if self.note:
            return self.note
        change = "beyond measure" if math.isinf(self.change) else f"{self.change * 100:+.1f} %"
        if self.censored or self.censored_low:
            return (
                f"{change} (median over {self.pairs} pair(s); censored: the candidate's quantile reached its failed "
                f"requests in {self.censored}, the reference's in {self.censored_low}; signed-rank test, no interval)"
            )
        if self.low is None or self.high is None:
            return f"{change} ({self.pairs} pair(s): no interval)"
        return f"{change} [{self.low * 100:+.1f}, {self.high * 100:+.1f}]"


def endpoint_test(
    metric: str, log_ratios: Sequence[float], floor: float, alpha: float, interval_alpha: float | None = None
) -> PairedTest:
    """One endpoint over the night's pairs: :func:`one_sided_t` where every pair has a finite
    ratio; where some are censored (a build's quantile reached its failed requests), Wilcoxon's
    signed-rank test against the floor, a censored pair ranking beyond every finite one on its
    side. NaN (a lost pair) is left out; the night's account of pairs says so."""
    values = [float(v) for v in log_ratios if not math.isnan(v)]
    worse, better = sum(v == math.inf for v in values), sum(v == -math.inf for v in values)
    if not worse and not better:
        return one_sided_t(metric, values, floor, alpha, interval_alpha)
    finite = np.asarray([v for v in values if math.isfinite(v)])
    margin = math.log1p(floor)
    diffs = np.asarray(values) - margin
    # Ranks only: a censored pair beyond every finite one, on its side; the censored pairs get
    # distinct magnitudes (no ties, so the exact distribution applies): they share one sign, so
    # how they are ordered among themselves leaves the statistic as it is.
    big = 2 * float(np.max(np.abs(diffs[np.isfinite(diffs)]), initial=0.0)) + 1.0
    beyond = np.cumsum(np.isinf(diffs))
    diffs = np.where(np.isinf(diffs), np.sign(diffs) * (big + beyond), diffs)
    p = (
        float(scipy_stats.wilcoxon(diffs, alternative="greater").pvalue)
        if np.any(diffs != 0)
        else 1.0  # every pair exactly at the floor: no evidence past it
    )
    with np.errstate(invalid="ignore"):
        centre = float(np.median(values))
    return PairedTest(
        metric,
        len(values),
        math.expm1(centre) if not math.isnan(centre) else math.nan,
        None,
        None,
        float(finite.std(ddof=1)) if len(finite) >= 2 else None,
        p,
        floor=floor,
        alpha_used=alpha,
        censored=worse,
        censored_low=better,
    )


def one_sided_t(
    metric: str, log_ratios: Sequence[float], floor: float, alpha: float, interval_alpha: float | None = None
) -> PairedTest:
    """H0: the candidate is at most ``floor`` worse; H1: worse by more. m - 1 degrees of freedom.
    The interval is at ``interval_alpha`` (default ``alpha``): a test one of a Holm family of k
    shows its interval at alpha / k, so that its bound passes the floor exactly where Holm's
    first step would reject it (the p-value does not depend on it)."""
    values = np.asarray([v for v in log_ratios if math.isfinite(v)], dtype=float)
    m = len(values)
    if m == 0:
        return PairedTest(metric, 0, math.nan, None, None, None, None, floor=floor, alpha_used=alpha)
    mean = float(values.mean())
    if m < 2:
        return PairedTest(metric, m, math.expm1(mean), None, None, None, None, floor=floor, alpha_used=alpha)
    sd = float(values.std(ddof=1))
    margin = math.log1p(floor)
    if sd == 0.0:  # identical pairs: the sign of the difference is the answer
        p = 0.0 if mean > margin else 1.0
        return PairedTest(
            metric, m, math.expm1(mean), math.expm1(mean), math.expm1(mean), sd, p, floor=floor, alpha_used=alpha
        )
    se = sd / math.sqrt(m)
    # Student's t through scipy.special (stdtr, stdtrit): the same numbers as scipy.stats.t
    # without building a frozen distribution per call, which cost more than the rest of a night's
    # decision (simulated nights call this thousands of times).
    p = float(special.stdtr(m - 1, -(mean - margin) / se))
    half = float(special.stdtrit(m - 1, 1 - (alpha if interval_alpha is None else interval_alpha))) * se
    return PairedTest(
        metric,
        m,
        math.expm1(mean),
        math.expm1(mean - half),
        math.expm1(mean + half),
        sd,
        p,
        floor=floor,
        alpha_used=alpha,
    )


def holm_adjusted(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values, in the order given: the i-th smallest p times the
    number of tests not yet rejected (m - i), made non-decreasing in that order, at most 1.

    The same values as statsmodels' ``multipletests(p, method="holm")[1]`` (the unit tests hold
    it as the oracle), without the ``gc.collect()`` that function runs on every call: a gate
    process judges a family per night, per point and per secondary set, and each collection
    walks the whole heap (0.1 s in a bare process, 0.4 s in the test suite's)."""
    p = np.asarray(p_values, dtype=float)
    order = np.argsort(p, kind="stable")
    stepped = np.maximum.accumulate(p[order] * np.arange(len(p), 0, -1))
    adjusted = np.empty_like(p)
    adjusted[order] = np.minimum(stepped, 1.0)
    return adjusted


def holm(tests: Sequence[PairedTest]) -> list[PairedTest]:
    """Holm's step-down adjustment over a family, each test's p adjusted."""
    scored = [i for i, t in enumerate(tests) if t.p is not None]
    out = list(tests)
    if not scored:
        return out
    adjusted = holm_adjusted([tests[i].p for i in scored])  # type: ignore[misc]
    for i, p in zip(scored, adjusted, strict=True):
        out[i] = replace(tests[i], p_adjusted=float(p))
    return out


@dataclass(frozen=True)
class Power:
    """What this night's design could see, from its own pair spread: sized from the spread's
    one-sided 80 % upper confidence bound (sd * sqrt(df / chi2_0.2(df))), not the estimate. With
    df = pairs - 1 of 1-4 the estimate alone scatters widely (a true 6.4 % read as 4-12 %), and a
    design judged by a spread that came out low by chance claims power it does not have."""

    pairs: int
    sd_log: float
    alpha: float
    floor: float
    detectable: float | None  # the smallest slowdown detected with DESIGN_POWER at sd_bound (None: not within 10x)
    target: float  # gate.detect
    power_at_target: float  # at sd_bound
    pairs_for_target: int | None  # None: more than MOST_PAIRS
    sd_bound: float = math.nan  # the spread's upper bound the rest is sized from
    df: int = 0

    @property
    def met(self) -> bool:
        return self.power_at_target >= DESIGN_POWER

    def text(self) -> str:
        seen = f"{self.detectable:.1%}" if self.detectable is not None else "more than 10x"
        line = (
            f"this night's design ({self.pairs} pairs, pair spread {math.expm1(self.sd_log):.1%}, its "
            f"{SPREAD_CONFIDENCE:.0%} upper bound {math.expm1(self.sd_bound):.1%} on {self.df} df, one-sided alpha "
            f"{self.alpha:g}) detects a slowdown of {seen} with {DESIGN_POWER:.0%} power at that upper bound; for "
            f"{self.target:.0%} its power is {self.power_at_target:.0%}"
        )
        if self.met:
            return line + f": it meets gate.detect={self.target:g}."
        more = f"{self.pairs_for_target} pairs would" if self.pairs_for_target else f"over {MOST_PAIRS} pairs would"
        return line + f": it misses gate.detect={self.target:g}; {more}."


def power_of(slowdown: float, sd_log: float, pairs: int, alpha: float, floor: float = 0.0) -> float:
    """The one-sided paired t's power against a true slowdown (statsmodels' TTestPower)."""
    from statsmodels.stats.power import TTestPower

    if pairs < 2 or not sd_log > 0:
        return math.nan
    effect = (math.log1p(slowdown) - math.log1p(floor)) / sd_log
    power = float(TTestPower().power(effect_size=effect, nobs=pairs, alpha=alpha, alternative="larger"))
    if math.isnan(power):
        # scipy's noncentral t gives NaN far in its tail (a shift of 20+ standard errors), where
        # the power is 1 to machine precision: the normal approximation is exact enough there.
        critical = float(scipy_stats.t(pairs - 1).ppf(1 - alpha))
        power = float(scipy_stats.norm.sf(critical - effect * math.sqrt(pairs)))
    return power


def detectable_slowdown(sd_log: float, pairs: int, alpha: float, floor: float) -> float | None:
    """The smallest slowdown a one-sided t over ``pairs`` pairs detects with DESIGN_POWER at this
    spread (None: not within 10x)."""
    from scipy.optimize import brentq

    def short(x: float) -> float:
        return power_of(x, sd_log, pairs, alpha, floor) - DESIGN_POWER

    top = 10.0
    if pairs < 2 or not sd_log > 0 or not short(top) > 0:
        return None
    low = floor + 1e-9
    return float(brentq(short, low, top)) if short(low) < 0 else low


def design_detectable(pairs: int, alpha: float, floor: float) -> float | None:
    """The slowdown a design of ``pairs`` pairs detects with DESIGN_POWER at the upper bound of
    the planned spread (PLANNED_SPREAD), its primary sharing alpha with acceptance length (Holm's
    first step at alpha / 2): what ``gate.detect`` may ask of fewer than FEWEST_PAIRS pairs."""
    sd, df = PLANNED_SPREAD
    return detectable_slowdown(planning_sd(sd, df, SPREAD_CONFIDENCE), pairs, alpha / 2, floor)


def power_statement(
    sd_log: float, pairs: int, alpha: float, floor: float, target: float, df: int | None = None
) -> Power:
    """The smallest slowdown detected with 80 % power, the power at ``target``, and the pairs
    that would reach 80 % there, all from the upper bound of one spread measured on ``df``
    degrees of freedom (default pairs - 1)."""
    df = pairs - 1 if df is None else df
    bound = planning_sd(sd_log, df, SPREAD_CONFIDENCE)
    needed = next(
        (m for m in range(2, MOST_PAIRS + 1) if power_of(target, bound, m, alpha, floor) >= DESIGN_POWER),
        None,
    )
    return Power(
        pairs,
        sd_log,
        alpha,
        floor,
        detectable_slowdown(bound, pairs, alpha, floor),
        target,
        power_of(target, bound, pairs, alpha, floor),
        needed,
        bound,
        df,
    )


@dataclass(frozen=True)
class NightWindow:
    """One measured point of a paired night: which build and pair measured it, and what it gave."""

    key: str  # the point, whichever build measured it (gate.pair_key)
    pair_label: str  # its name (gate.pair_label)
    role: str  # baseline | speculative
    build: str  # reference | candidate
    pair: int
    sample: Sample | None
    metrics: Mapping[str, float]


@dataclass(frozen=True)
class PairAccount:
    """The night's pairs against its design: how many were planned, how many have a value of the
    primary endpoint, and why each of the others has none. A night that lost pairs, or windows of
    a pair, is never a pass: what is missing may be the candidate's crash."""

    planned: int
    measured: int  # pairs with a value of the primary endpoint (finite or censored)
    lost: tuple[str, ...] = ()  # one line per pair with none: which pair, and why
    partial: tuple[str, ...] = ()  # one line per pair that kept only some of its points

    @property
    def complete(self) -> bool:
        return not self.lost and not self.partial and self.measured >= self.planned

    def text(self) -> str:
        head = f"{self.measured} of {self.planned} planned pair(s) measured"
        if self.lost:
            head += f", {len(self.lost)} lost (" + "; ".join(self.lost) + ")"
        if self.partial:
            head += "; kept with the points they have: " + "; ".join(self.partial)
        return head


def pair_account(windows: Sequence[NightWindow], planned: int, metric: str) -> PairAccount:
    """Which of the ``planned`` pairs have ``metric`` at every point, at some, or at none, and
    why; a point where a build's quantile reached its failed requests counts as lacking (it is
    censored: the pair averages its other points)."""
    found = {(w.key, w.build, w.pair): w for w in windows}
    names = {w.key: w.pair_label for w in windows}
    lost, partial, measured = [], [], 0
    for j in range(planned):
        missing, has = [], 0
        for key in sorted(names, key=lambda k: names[k]):
            ref, cand = found.get((key, "reference", j)), found.get((key, "candidate", j))
            value = math.nan
            if ref is not None and cand is not None:
                value = pair_log_ratio(
                    metric, ref.sample, cand.sample, ref.metrics.get(metric), cand.metrics.get(metric)
                )
            if math.isnan(value):
                missing.append(
                    f"{names[key]}: {why_no_ratio(metric, ref.sample if ref else None, cand.sample if cand else None)}"
                )
            elif math.isinf(value):
                whose = "candidate" if value > 0 else "reference"
                missing.append(f"{names[key]}: the {whose}'s {PAIRED_METRICS[metric][0]} reached its failed requests")
                has += 1
            else:
                has += 1
        if not has:
            lost.append(f"pair {j + 1}: " + ", ".join(missing))
        else:
            measured += 1
            if missing:
                partial.append(f"pair {j + 1} lacks " + ", ".join(missing))
    return PairAccount(planned, measured, tuple(lost), tuple(partial))


@dataclass(frozen=True)
class PairedResult:
    primary: PairedTest
    gated: tuple[PairedTest, ...]  # the primary, acceptance and the named secondaries, Holm together
    secondary: tuple[PairedTest, ...]  # reported, Holm among themselves
    per_point: tuple[tuple[str, PairedTest], ...]  # the primary metric per point, Holm across points
    power: Power | None
    pairs: int
    points: int
    account: PairAccount = PairAccount(0, 0)
    detect: float = math.nan  # gate.detect: the slowdown the design must see, printed in every summary

    @property
    def overall(self) -> str:
        """fail | pass | insufficient, for the parent run and the exit code. A regression the
        pairs show fails the night whatever was lost; otherwise a night that lost pairs or
        windows, or whose candidate's quantile reached its failed requests in some pair, is
        insufficient, never a pass."""
        if any(t.regressed for t in self.gated):
            return FAIL
        if self.primary.p is None or not self.account.complete or self.primary.censored:
            return INSUFFICIENT
        return PASS

    def why_insufficient(self) -> str:
        """What kept the night from a decision (empty where it has one)."""
        if self.overall != INSUFFICIENT:
            return ""
        if self.primary.censored:
            return (
                f"the candidate's {self.primary.metric} reached its failed requests in {self.primary.censored} "
                f"pair(s): it is slower there by more than any ratio can say, and the pairs do not show a "
                f"regression past the family's level; re-run the night"
            )
        if not self.account.complete:
            return f"{self.account.text()}: a night that lost pairs or windows is not a pass; re-run it"
        return f"fewer than two pairs have a ratio of {self.primary.metric}"

    def flagged(self) -> list[str]:
        return []  # the pairs are the design's replication: nothing is re-measured

    def slower_points(self) -> list[str]:
        """The points the failure names: those whose own test regressed, else the worst one."""
        named = [label for label, t in self.per_point if t.regressed]
        if named or not self.per_point:
            return named
        return [max(self.per_point, key=lambda item: item[1].change)[0]]


def point_log_ratios(windows: Sequence[NightWindow], metric: str, pairs: int) -> dict[str, list[float]]:
    """point -> its log ratio per pair, for the points that have the metric at all."""
    found = {(w.key, w.build, w.pair): w for w in windows}
    names = {w.key: w.pair_label for w in windows}
    out = {}
    for key in sorted(names, key=lambda k: names[k]):
        values = []
        for j in range(pairs):
            ref, cand = found.get((key, "reference", j)), found.get((key, "candidate", j))
            if ref is None or cand is None:
                values.append(math.nan)
                continue
            values.append(
                pair_log_ratio(metric, ref.sample, cand.sample, ref.metrics.get(metric), cand.metrics.get(metric))
            )
        if any(not math.isnan(v) for v in values):
            # Keyed by the point itself: two points may share a label (they differ in workload,
            # temperature, ...); the label is made unique only for display.
            out[names[key] if names[key] not in out else f"{names[key]} ({key[:8]})"] = values
    return out


def judge_night_as(windows: Sequence[NightWindow], gate: GateConfig) -> PairedResult:
    """:func:`judge_night` with the night's gate settings, as the gate and its calibration call it."""
    return judge_night(
        windows, gate.pairs, gate.primary, gate.gated, gate.alpha, gate.decision_floor, gate.detect, gate.acceptance
    )


def judge_night(
    windows: Sequence[NightWindow],
    pairs: int,
    primary: str,
    gated: Sequence[str],
    alpha: float,
    floor: float,
    detect: float,
    acceptance: bool = True,
) -> PairedResult:
    """The night's decision: the primary endpoint, acceptance and named secondaries gated together
    (Holm at ``alpha``), every secondary reported, each point's own primary ratio, and the power."""
    by_metric = {m: point_log_ratios(windows, m, pairs) for m in PAIRED_METRICS}
    tests = {m: endpoint_test(m, endpoint(by_metric[m]), floor, alpha) for m in PAIRED_METRICS}
    family = [tests[primary]]
    if acceptance and tests[ACCEPTANCE].p is not None:
        family.append(tests[ACCEPTANCE])
    failures = failures_test(windows, pairs, alpha)
    if failures.p is not None:
        family.append(failures)
    family += [tests[m] for m in gated if m != primary]

    def at_holm_level(test: PairedTest, size: int) -> PairedTest:
        # A family's intervals at alpha / its size: what Holm's first step tests against.
        if test.metric not in by_metric:  # the failed requests: a share, no interval
            return test
        return endpoint_test(test.metric, endpoint(by_metric[test.metric]), floor, alpha, alpha / max(size, 1))

    decided = [replace(t, gated=True) for t in holm([at_holm_level(t, len(family)) for t in family])]
    reported = [tests[m] for m in SECONDARY if m != primary]
    secondary = tuple(holm([at_holm_level(t, len(reported)) for t in reported]))
    level = alpha / max(len(by_metric[primary]), 1)
    per_point = [
        (label, endpoint_test(primary, values, floor, alpha, interval_alpha=level))
        for label, values in by_metric[primary].items()
    ]
    adjusted = holm([t for _, t in per_point])
    head = decided[0]
    # The primary clears Holm's first step at alpha / (the gated family's size) where nothing else
    # in the family regressed: the power statement is made at that level, not at alpha. Its
    # spread is the finite pairs' (a censored pair has no size).
    level = alpha / len(family)
    finite = sum(math.isfinite(v) for v in endpoint(by_metric[primary]))
    power = power_statement(head.sd_log, finite, level, floor, detect) if head.sd_log and finite >= 2 else None
    return PairedResult(
        head,
        tuple(decided),
        secondary,
        tuple((label, t) for (label, _), t in zip(per_point, adjusted, strict=True)),
        power,
        head.pairs,
        len(by_metric[primary]),
        pair_account(windows, pairs, primary),
        detect,
    )
