"""From ratios to words: helps, hurts or inconclusive; and the load where speculation stops paying.

Decisions compare an interval with a practical floor and adjust for the number of
comparisons in a report (Benjamini-Hochberg). An interval that lies above 1 + floor helps, one below 1 - floor hurts; anything else is
inconclusive, with what would resolve it (more requests, or repeats).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from scipy import stats as scipy_stats

from pipeline.analysis.samples import StatsOptions
from pipeline.analysis.stats import RATIOS, Noise, Ratio


class Verdict(StrEnum):
    """A comparison's verdict, as the report and MLflow show it."""

    HELPS = "helps"
    HURTS = "hurts"
    INCONCLUSIVE = "inconclusive"
    TOO_FEW = "not enough requests"


class GateOutcome(StrEnum):
    """A gated night's outcome, either mode (the gate's exit codes map them: finish/judge.py)."""

    PASS = "pass"
    FAIL = "fail"
    INSUFFICIENT = "insufficient"


HELPS, HURTS, INCONCLUSIVE, TOO_FEW = Verdict.HELPS, Verdict.HURTS, Verdict.INCONCLUSIVE, Verdict.TOO_FEW
DECIDED = (HELPS, HURTS)  # the verdicts a user acts on


@dataclass(frozen=True)
class Decision:
    label: str  # helps | hurts | inconclusive | not enough requests
    ratio: Ratio
    p_adjusted: float | None = None  # Benjamini-Hochberg over the report's comparisons
    detail: str = ""  # for inconclusive: what would resolve it

    @property
    def text(self) -> str:
        return f"{self.label}: {self.ratio.text}" + (f"; {self.detail}" if self.detail else "")


def _reference(ratio: Ratio) -> scipy_stats.rv_continuous:
    return scipy_stats.norm if ratio.df is None or not math.isfinite(ratio.df) else scipy_stats.t(ratio.df)  # type: ignore[return-value]


def tail_p(ratio: Ratio, floor: float) -> tuple[float, float]:
    """Two-sided p-values that the ratio lies above 1 + floor (helps) and below 1 - floor (hurts).

    Each side's standard error is read off that side of the interval (its half-width over the
    reference quantile: the normal's, or Student's t where the interval is t-based), and the
    p-value is that reference's tail. So, for one comparison, p < alpha exactly when the
    interval clears the floor, as before; unlike a count of bootstrap replicates, whose
    smallest p is 2 / (B + 1), it resolves the small p-values a large family needs
    (Benjamini-Hochberg over 50 comparisons asks for p < 0.001)."""
    assert ratio.estimate is not None and ratio.low is not None and ratio.high is not None
    if ratio.censored:
        return censored_p(ratio, floor)
    reference = _reference(ratio)
    q = float(reference.ppf(1 - (1 - ratio.level) / 2))
    centre = math.log(ratio.estimate)

    def two_sided(distance: float, half: float) -> float:
        if not math.isfinite(half):
            return 1.0
        if half <= 0:
            return 0.0 if distance > 0 else 1.0
        return min(1.0, 2 * float(reference.sf(distance / (half / q))))

    low, high = (math.log(v) if v > 0 else -math.inf for v in (ratio.low, ratio.high))
    return (
        two_sided(centre - math.log1p(floor), abs(centre - low)),
        two_sided(math.log1p(-floor) - centre, abs(high - centre)),
    )


def censored_p(ratio: Ratio, floor: float) -> tuple[float, float]:
    """:func:`tail_p` for a censored ratio (a failed request reaches the statistic in some
    replicates, or in the estimate): no standard error can be read off an interval with an end
    at 0 or infinity, so each side's two-sided p-value is the share of replicates on the other
    side of the floor, an infinite replicate counting on its own side ((count + 1) / (B + 1),
    never 0)."""
    replicates = ratio.log_replicates[~np.isnan(ratio.log_replicates)]
    if not len(replicates):
        return 1.0, 1.0
    size = len(replicates) + 1

    def share(count: int) -> float:
        return min(1.0, 2 * (count + 1) / size)

    return (
        share(int(np.sum(replicates <= math.log1p(floor)))),
        share(int(np.sum(replicates >= math.log1p(-floor)))),
    )


def tail_minimum(metric: str, opts: StatsOptions) -> int:
    """Paired requests per window a ratio needs for a verdict: a p99 from fewer than 100
    requests is nearly the window's maximum, and its bootstrap under-covers (86 % at a
    nominal 95 % with 32 requests)."""
    m = RATIOS.get(metric)
    if m is None or m.percentile <= 50:
        return opts.min_requests
    return max(opts.min_requests, math.ceil(100 / (100 - m.percentile)))


def decide(
    ratios: Sequence[Ratio], opts: StatsOptions, floor: float | Sequence[float] | None = None, family: str = ""
) -> list[Decision]:
    """One family of comparisons (e.g. every median-TPOT ratio of a report), adjusted together.
    ``floor``: one for all, or one per ratio (the gate's floors differ by metric)."""
    floors = [opts.floor if floor is None else floor] * len(ratios) if not isinstance(floor, Sequence) else list(floor)
    short = {i for i, r in enumerate(ratios) if r.resolved and r.requests and r.requests < tail_minimum(r.metric, opts)}
    tested = [i for i, r in enumerate(ratios) if r.resolved and i not in short]
    tails = {i: tail_p(ratios[i], floors[i]) for i in tested}
    adjusted: dict[int, float] = {}
    if tested:
        smallest = np.array([min(tails[i]) for i in tested])
        adjusted = dict(zip(tested, scipy_stats.false_discovery_control(smallest, method="bh"), strict=True))
    called = sum(1 for i in tested if adjusted[i] < opts.alpha)
    out = []
    for i, ratio in enumerate(ratios):
        if i in short:
            need = tail_minimum(ratio.metric, opts)
            out.append(
                Decision(
                    TOO_FEW,
                    ratio,
                    detail=f"a tail verdict needs {need} or more paired requests per "
                    f"window, this one has {ratio.requests}",
                )
            )
            continue
        if ratio.estimate is None or not ratio.resolved:
            label = TOO_FEW if ratio.note.startswith("not enough") else INCONCLUSIVE
            out.append(Decision(label, ratio, detail=ratio.note))
            continue
        p_helps, p_hurts = tails[i]
        p = float(adjusted[i])
        if p < opts.alpha:
            out.append(Decision(HELPS if p_helps <= p_hurts else HURTS, ratio, p))
        elif min(p_helps, p_hurts) < opts.alpha:
            detail = (
                f"its interval clears the ±{floors[i]:.0%} floor on its own, not after the adjustment for "
                f"{len(tested)} comparisons"
            )
            out.append(Decision(INCONCLUSIVE, ratio, p, detail))
        else:
            # Benjamini-Hochberg calls one more comparison at p <= (called + 1) / m * alpha.
            level = opts.alpha * (called + 1) / len(tested)
            out.append(Decision(INCONCLUSIVE, ratio, p, to_resolve(ratio, floors[i], level)))
    return out


# What a sample-size hint aims for ("... resolves with 80 % power"), and the confidence of the spread
# bound it is sized from; the paired gate states its design at a power of its own (paired.DESIGN_POWER).
HINT_POWER = 0.80
MAX_REQUESTS = 20_000  # a hint beyond these is "not resolvable at practical sizes"
MAX_REPEATS = 30


def to_resolve(ratio: Ratio, floor: float, level: float | None = None) -> str:
    """What would resolve an inconclusive ratio: "at N requests per window (or R repeats), an
    effect of X or more resolves with 80 % power" at ``level`` (the level the family's
    adjustment asks of it).

    X is the interval's bound on the estimate's side of 1 (the other side where that bound lies
    inside the floor): the largest effect the window still holds plausible in that direction,
    not the estimate. Sizing from the estimate ("if the estimate were the truth") is post-hoc
    power: for one true speedup it names any size from tens to thousands of requests, and calls
    an estimate that fell inside the floor unresolvable. Only an interval wholly inside the
    floor says that no window size would make it helps or hurts.

    The model of the interval's width, on the log scale: se^2 = within^2 * n0 / n + server^2 / R
    (within: the window's own spread at its n0 requests; server: the spread between server
    starts, which no window size shrinks). More requests help only the first term; fresh
    servers per repeat (repeats.restart=true) average the second."""
    assert ratio.estimate is not None and ratio.low is not None and ratio.high is not None
    if ratio.censored:
        reached = float(np.mean(np.isinf(ratio.log_replicates))) if len(ratio.log_replicates) else 1.0
        return (
            f"failed requests reach this statistic in {reached:.0%} of its resamples: the failures, not the "
            "window's size, decide it"
        )
    level = 1 - ratio.level if level is None else level
    effect = _named_effect(ratio, floor)
    if effect is None:
        return f"the interval lies within the ±{floor:.0%} floor: no window size would make it helps or hurts"
    margin = abs(math.log(effect)) - (math.log1p(floor) if effect >= 1 else -math.log1p(-floor))
    noise = ratio.noise
    if noise is None:
        return "no model of its spread to size a fix from"
    server = planning_sd(noise.server_sd, noise.server_df)
    if noise.within_sd is None or noise.restarted or noise.runs >= 2:
        return _repeats_hint(noise, margin, level, server, effect)
    need = margin / (float(scipy_stats.norm.ppf(1 - level / 2)) + float(scipy_stats.norm.ppf(HINT_POWER)))
    # The window's own spread as the verdict sees it: the interval's half-width on the floor's
    # side (a bootstrap of a median is skewed at small n), less the server spread added to it;
    # never below the replicates' sd.
    q = float(_reference(ratio).ppf(1 - (1 - ratio.level) / 2))
    bound = ratio.low if ratio.estimate >= 1 else ratio.high
    side = abs(math.log(ratio.estimate) - math.log(bound)) / q if bound > 0 else math.inf
    within = max(math.sqrt(max(side**2 - server**2, 0.0)), noise.within_sd)
    if not math.isfinite(within):
        return "no model of its spread to size a fix from"
    if server >= need:
        noise = dataclasses.replace(noise, within_sd=within)
        return (
            f"more requests cannot resolve this: the spread between server starts ({noise.server_sd:.1%}) alone is too "
            f"wide; {_repeats_hint(noise, margin, level, server, effect, restart=True)}"
        )
    n = math.ceil(within**2 * noise.requests / (need**2 - server**2))
    if n > MAX_REQUESTS:
        return (
            f"not resolvable at practical sizes: even an effect of {effect:.2f}x (the interval's bound) needs over "
            f"{MAX_REQUESTS:,} requests per window"
        )
    caveat = (
        "" if noise.server_sd is not None else " (if the servers' own spread is small: +sweep=noise_floor measures it)"
    )
    return f"at ~{max(n, noise.requests + 1)} requests per window, {_effect_words(effect)}{caveat}"


def _named_effect(ratio: Ratio, floor: float) -> float | None:
    """The effect a hint is sized for: the interval's bound on the estimate's side of 1 where it
    lies past the floor, else the other bound where that one does; None where both lie inside."""
    assert ratio.estimate is not None and ratio.low is not None and ratio.high is not None
    helps = ratio.high if ratio.high > 1 + floor else None
    hurts = ratio.low if ratio.low < 1 - floor else None
    first, second = (helps, hurts) if ratio.estimate >= 1 else (hurts, helps)
    return first if first is not None else second


def _effect_words(effect: float) -> str:
    more = "more" if effect >= 1 else "less"
    return (
        f"an effect of {effect:.2f}x or {more} resolves with {HINT_POWER:.0%} power (the interval's "
        f"{'upper' if effect >= 1 else 'lower'} bound; a smaller one needs more)"
    )


def planning_sd(sd: float | None, df: float, confidence: float = HINT_POWER) -> float:
    """A spread to size a design by: the one-sided upper confidence bound of a measured sd
    (sd * sqrt(df / chi2_(1 - confidence)(df)), 80 % by default), since a design sized by a
    spread that came out low by chance falls short of its power. Measured here: hints from the
    point estimate of a 20-comparison A/A spread reached 63-82 % power, from this bound 80 % and
    more. The paired gate's power statement is sized the same way (paired.SPREAD_CONFIDENCE)."""
    if not sd:
        return 0.0
    if not df or df < 1:
        return sd
    return sd * math.sqrt(df / float(scipy_stats.chi2.ppf(1 - confidence, df)))


def _repeats_hint(
    noise: Noise, margin: float, level: float, server: float, effect: float, restart: bool = False
) -> str:
    """The repeats on fresh servers that reach 80 % power: per-repeat variance within^2 + server^2
    (for throughput, the runs' own spread), Student's t with R - 1 degrees of freedom."""
    per_run = noise.run_sd if noise.run_sd is not None and (noise.within_sd is None or noise.restarted) else None
    if per_run is not None:
        # Measured from the runs' own spread, on runs - 1 degrees of freedom (3 runs: 2): sized by
        # its 80 % upper bound, as the server spread is. From the estimate itself, hints named
        # after 3 runs reached 63 % power in the calibration.
        per_run = planning_sd(per_run, noise.runs - 1)
    else:
        if noise.within_sd is None and noise.server_sd is None:
            return "repeats.count >= 3 with repeats.restart=true measures its spread"
        per_run = math.sqrt((noise.within_sd or 0.0) ** 2 + server**2)
    for runs in range(2, MAX_REPEATS + 1):
        quantiles = float(scipy_stats.t.ppf(1 - level / 2, runs - 1)) + float(scipy_stats.t.ppf(HINT_POWER, runs - 1))
        if quantiles * per_run / math.sqrt(runs) <= margin:
            runs = max(runs, noise.runs + 1)
            if noise.restarted and not restart:
                return f"at ~{runs} repeats, {_effect_words(effect)}"
            return f"with repeats.restart=true and repeats.count >= {runs}, {_effect_words(effect)}"
    return (
        f"not resolvable at practical sizes: even an effect of {effect:.2f}x (the interval's bound) needs over "
        f"{MAX_REPEATS} repeats"
    )


def smallest_resolvable(ratio: Ratio, floor: float) -> float | None:
    """From an A/A comparison: the smallest speedup this setup would call "helps", given the
    interval's measured half-width and the floor."""
    if not ratio.resolved or ratio.censored:
        return None
    assert ratio.low is not None and ratio.high is not None
    half = (math.log(ratio.high) - math.log(ratio.low)) / 2
    return (1 + floor) * math.exp(half)


@dataclass(frozen=True)
class Crossing:
    rate: float | None
    low: float | None
    high: float | None
    text: str


def _interpolate(rates: Sequence[float], values: Sequence[float]) -> float | None:
    for (r0, v0), (r1, v1) in zip(
        zip(rates, values, strict=True), list(zip(rates, values, strict=True))[1:], strict=False
    ):
        if v0 >= 0 > v1:
            if math.isinf(r1):
                return r0
            return r0 + v0 * (r1 - r0) / (v0 - v1)
    return None


def _censored(rates: Sequence[float], values: Sequence[float]) -> float:
    """A replicate's crossing, or where it is censored: at the segment's start if it is below
    1.0 there already, at its end if it never falls below 1.0 within it."""
    if math.isnan(values[0]) or values[0] < 0:
        return rates[0]
    found = _interpolate(rates, values)
    return rates[-1] if found is None else found


def crossing(rates: Sequence[float], decisions: Sequence[Decision], opts: StatsOptions) -> Crossing:
    """Where the median-TPOT speedup falls through 1.0, as an interval over the bootstrap's
    replicates; resolved only where a lower rate "helps" and a higher one "hurts"."""
    pairs = sorted(zip(rates, decisions, strict=True), key=lambda p: p[0])
    usable = [(r, d) for r, d in pairs if d.ratio.resolved]
    if len(usable) < 2:
        return Crossing(None, None, None, "not resolved: needs intervals at two or more request rates")
    labels = [d.label for _, d in usable]
    if labels[0] == HURTS:
        return Crossing(None, None, None, f"below 1.0 already at the lowest rate ({usable[0][0]:g} req/s)")
    first_helps = next((i for i, label in enumerate(labels) if label == HELPS), None)
    first_hurts = next((i for i, label in enumerate(labels) if label == HURTS and (first_helps or 0) < i), None)
    if first_helps is None or first_hurts is None:
        span = f"{usable[0][0]:g}-{usable[-1][0]:g} req/s"
        if first_helps is not None and all(lbl == HELPS for lbl in labels[first_helps:]):
            return Crossing(
                None,
                None,
                None,
                f"none within {span}: speculation helps at every rate from {usable[first_helps][0]:g} req/s",
            )
        return Crossing(
            None,
            None,
            None,
            f"not resolved within {span}: no rate where it clearly hurts after one where it clearly helps",
        )
    segment = usable[first_helps : first_hurts + 1]
    seg_rates = [r for r, _ in segment]
    point = _interpolate(seg_rates, [math.log(d.ratio.estimate or math.nan) for _, d in segment])
    size = min(len(d.ratio.log_replicates) for _, d in segment)
    # Every replicate counts: one that does not cross within the segment is censored at its
    # ends, so the interval can reach them instead of being confined to the replicates that cross.
    found = np.array(
        [_censored(seg_rates, [float(d.ratio.log_replicates[j]) for _, d in segment]) for j in range(size)]
    )
    if point is None:
        return Crossing(None, None, None, "not resolved: the estimates do not cross 1.0 between the measured rates")
    method = "inverted_cdf" if np.isinf(found).any() else "linear"  # no interpolation towards an unbounded end
    low, high = (float(v) for v in np.quantile(found, [opts.alpha / 2, 1 - opts.alpha / 2], method=method))
    between = f"between {seg_rates[0]:g} and {seg_rates[-1]:g} req/s"
    upper = f"{high:.2f}" if math.isfinite(high) else f"above {max(r for r in seg_rates if math.isfinite(r)):g}"
    return Crossing(point, low, high, f"crosses 1.0 at ~{point:.2f} req/s [{low:.2f}, {upper}] ({between})")
