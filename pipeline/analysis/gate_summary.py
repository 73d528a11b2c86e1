"""The gate's summaries, fit for a CI comment: the history gate's verdict and what moved, the
nightly's own decisions that flipped, and the paired night's verdict, its endpoints and power.

Pure rendering of what :mod:`pipeline.analysis.regression` and :mod:`pipeline.analysis.paired`
decided: one module, so the two gate modes' summaries read alike.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pipeline.analysis import paired
from pipeline.analysis.paired import PairedResult
from pipeline.analysis.regression import IMPROVED, INSUFFICIENT, REGRESSED, SEVERITY, SUSPECT, Flip, GateResult
from pipeline.analysis.stats import Ratio


def _pct(ratio: Ratio) -> str:
    if ratio.estimate is None:
        return "—"
    text = f"{(ratio.estimate - 1) * 100:+.1f} %"
    if ratio.resolved:
        assert ratio.low is not None and ratio.high is not None
        text += f" [{(ratio.low - 1) * 100:+.1f}, {(ratio.high - 1) * 100:+.1f}]"
    return text


def gate_markdown(result: GateResult, title: str, reference: str) -> str:
    """A short summary fit for a CI comment: the verdict, then what moved."""
    head = {"fail": "❌ regression", "pass": "✅ pass", "insufficient": "⚠️ insufficient data"}[result.overall]
    lines = [f"### Regression gate: {head}", "", f"{title}; reference: {reference}.", ""]
    counts = {v: list(result.points.values()).count(v) for v in SEVERITY}
    lines.append(", ".join(f"{n} {v}" for v, n in counts.items() if n) + f" (of {len(result.points)} points).")
    spreads = [f"{m} {math.expm1(s) * 100:.1f} % (df {df})" for m, (s, df) in result.spread.items() if df]
    lines.append(
        "Spread between runs: " + ", ".join(spreads) + "."
        if spreads
        else "The spread between runs is not measured yet (fewer than two past runs per point)."
    )
    moved = [f for f in result.findings if f.verdict in (REGRESSED, SUSPECT, IMPROVED)]
    if moved:
        lines += [
            "",
            "| point | metric | verdict | change (> 0 better) [interval] | floor | reference → now |",
            "|---|---|---|---|---|---|",
        ]
        for f in sorted(moved, key=lambda f: SEVERITY.index(f.verdict)):
            lines.append(
                f"| {f.label} | {f.metric} | **{f.verdict}** | {_pct(f.ratio)} | ±{f.floor:.0%} | "
                f"{f.reference:.4g} → {f.current:.4g} |" + (f" {f.note}" if f.note else "")
            )
    withheld = result.withheld()
    if withheld:
        lines += [
            "",
            'Not judged: the window failed its own checks (the report\'s "Can you trust this run?" names the fix):',
        ]
        lines += [f"- {result.labels[run]}: {why}" for run, why in withheld.items()]
    missing = [result.labels[r] for r, v in result.points.items() if v == INSUFFICIENT and r not in withheld]
    if missing:
        lines += ["", "No reference for: " + ", ".join(missing) + "."]
    lines.append("")
    lines.append("Change is oriented so that > 0 is better (lower latency, higher throughput and acceptance).")
    return "\n".join(lines) + "\n"


def flips_markdown(flips: Sequence[Flip], compared: int) -> str:
    """The summary's lines on the nightly's own decision: every point whose verdict changed."""
    if not compared:
        return "Speculation's verdicts: no speculative point has a verdict in a reference run to compare with.\n"
    if not flips:
        return f"Speculation's verdicts: unchanged since the reference on all {compared} speculative point(s).\n"
    lines = [
        f"**Speculation's verdict changed** on {len(flips)} of {compared} speculative point(s) (median TPOT "
        "against the baseline, as the report decides it):",
        "",
    ]
    lines += [f"- {f.label}: {f.before} → **{f.after}** (reference: sweep run {f.reference})" for f in flips]
    return "\n".join(lines) + "\n"


def night_markdown(result: PairedResult, title: str, reference: str, label_floor: float) -> str:
    """The night's summary, fit for a CI comment: the verdict, the primary, what else moved, power."""
    head = {paired.FAIL: "❌ regression", paired.PASS: "✅ pass", paired.INSUFFICIENT: "⚠️ insufficient data"}[
        result.overall
    ]
    primary = result.primary
    lines = [
        f"### Regression gate (paired): {head}",
        "",
        f"{title}; reference: {reference}; {result.account.text()}, over {result.points} point(s).",
        "",
        f"Primary endpoint, {primary.metric} (geometric mean over points, > 0: the candidate is slower): "
        f"{primary.text()}, one-sided p {_p(primary.p_adjusted)} (Holm over the gated endpoints; floor "
        f"{primary.floor:.0%}, alpha {primary.alpha_used:g}).",
    ]
    if result.overall == paired.INSUFFICIENT:
        lines.append(f"Insufficient: {result.why_insufficient()}.")
    if result.overall == paired.FAIL:
        failed = [t.metric for t in result.gated if t.regressed]
        lines.append(
            f"Gated and regressed: {', '.join(failed)}; slowest point(s): {', '.join(result.slower_points())}."
        )
    lines += ["", "| endpoint | change [interval] | p (Holm) | gated | verdict |", "|---|---|---|---|---|"]
    for t in (*result.gated, *(s for s in result.secondary if s.metric not in {g.metric for g in result.gated})):
        big = abs(t.change) >= label_floor if math.isfinite(t.change) else False
        verdict = "regressed" if t.regressed else ("past the 5 % label" if big else "within")
        lines.append(f"| {t.metric} | {t.text()} | {_p(t.p_adjusted)} | {'yes' if t.gated else 'no'} | {verdict} |")
    lines += ["", "Per point, the primary metric (Holm across points):", ""]
    lines += [f"- {label}: {t.text()}, p {_p(t.p_adjusted)}" for label, t in result.per_point]
    if result.power is not None:
        lines += ["", "Power: " + result.power.text()]
    else:
        lines += ["", f"Power: not assessed (fewer than two pairs with a finite ratio); gate.detect={result.detect:g}."]
    return "\n".join(lines) + "\n"


def _p(p: float | None) -> str:
    return "—" if p is None else f"{p:.3g}"
