"""The report's Markdown: its first screen, the summary, and the detail the HTML page shares
(:mod:`pipeline.analysis.report_html` renders that page).

Pure rendering: everything it shows was computed before. Its first screen answers the
question; what could not be computed is said, never filled in.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import pandas as pd
from scipy import stats as scipy_stats

from pipeline.analysis.advisor import Advice
from pipeline.analysis.categories import GroupComparisons
from pipeline.analysis.decisions import HELPS, HURTS, INCONCLUSIVE, TOO_FEW, Decision, smallest_resolvable
from pipeline.analysis.drafter_map import DrafterMap
from pipeline.analysis.leviathan import LeviathanFit
from pipeline.analysis.quality import Lossless
from pipeline.analysis.samples import server_spread
from pipeline.analysis.stats import RATIOS
from pipeline.analysis.verdicts import (
    LOAD_BOUND,
    LOAD_BOUND_TEXT,
    P99_FLOOR,
    TPOT,
    WITHHELD,
    Comparisons,
    Crossover,
    aa_log_ratios,
    is_aa,
)
from pipeline.engines.registry import report_note, starts_servers


@dataclass(frozen=True)
class ReportData:
    title: str
    frame: pd.DataFrame  # every point (the sweep's summary table)
    points: pd.DataFrame  # numbers per (engine, method, k, rate); their verdicts are in comparisons
    crossings: list[Crossover]
    fits: list[LeviathanFit]
    advice: list[Advice]
    schedules: list[dict]
    lossless: list[Lossless]
    length_tests: list[tuple[str, float, float]]  # (server, KS statistic, p-value) at temperature > 0
    not_computed: list[str] = field(default_factory=list)
    conditions: list[str] = field(default_factory=list)  # how the windows were measured
    comparisons: Comparisons | None = None
    levels: pd.DataFrame | None = None  # each point's own median TPOT with its interval
    lead: str = ""  # search=capacity's answer, which comes before everything else
    sections: list[str] = field(default_factory=list)  # the searches' own sections, as Markdown lines
    capacity: list = field(default_factory=list)  # search=capacity's curves (search_report.CapacityCurve)
    predictions: pd.DataFrame | None = None  # search=predict's table
    run_url: str = ""  # a run's page in the MLflow UI, "{run}" for its id ("": no links)
    by_type: GroupComparisons | None = None  # verdicts per request type (analysis/categories.py)
    by_turn: GroupComparisons | None = None  # first against later conversation turns (the same module)
    over_time: GroupComparisons | None = None  # a trace replay's speedup per stretch of time (analysis/timeline.py)
    trust: list[str] = field(default_factory=list)  # "Can you trust this run?": one line per check (trust.py)
    drafters: DrafterMap | None = None  # synthetic acceptance: the drafter map (analysis/drafter_map.py)


PREFIX_POLICY_TEXT = {
    "cold": "cold (every window starts from an emptied prefix cache)",
    "warm": "warm (emptied, then the window's prompts sent once, unmeasured, before it)",
    "off": "off (the servers ran without prefix caching)",
    "as_is": "as it is (engine=external: servers specsweep did not start, and cannot reset without vLLM's "
    "dev mode, keep whatever their earlier traffic cached, so each window's hit rate is its own). A production "
    "server's cache is warm with its users' prompts where a fresh copy's is cold, which favours the warm one, "
    "TTFT most; engine.prefix_cache=warm sends each window's prompts to both servers first, so both start warm "
    "for them",
    "warm_external": "warm, not emptied (engine=external: each window's prompts were sent once to both servers, "
    "unmeasured, before it; what else their caches held is as their earlier traffic left it)",
}
SUFFIX_NOTE = (
    "suffix: the method keeps a global suffix tree that survives prefix-cache resets, so its "
    "acceptance can drift with the order in which points ran on one server"
)


def conditions(frame: pd.DataFrame) -> list[str]:
    """The measurement conditions a reader needs to compare these numbers with another tool's."""
    out = []
    if "prefix_cache" in frame:
        external = ~frame["engine"].map(starts_servers) if "engine" in frame else pd.Series(False, index=frame.index)
        policies = frame["prefix_cache"].where(~(external & (frame["prefix_cache"] == "warm")), "warm_external")
        out += [
            f"prefix cache: {PREFIX_POLICY_TEXT.get(p, p)}" for p in sorted(str(p) for p in policies.dropna().unique())
        ]
    if "prefix_cache_hit_rate" in frame:
        rates = frame.dropna(subset=["prefix_cache_hit_rate"])
        if not rates.empty:
            out.append(
                "prefix-cache hit rate per window: "
                + ", ".join(f"{row.point} {100 * row.prefix_cache_hit_rate:.0f}%" for row in rates.itertuples())
            )
    if "trace_requests" in frame and frame["trace_requests"].notna().any():
        out += _trace_conditions(frame[frame["trace_requests"].notna()])
    if (frame.get("method") == "suffix").any():
        out.append(SUFFIX_NOTE)
    # What each engine's figures mean differently, said once per engine that ran.
    engines = frame["engine"].dropna().unique() if "engine" in frame else []
    out += [note for name in sorted(engines) if (note := report_note(str(name)))]
    return out


SYNTHETIC_NOTE = (
    "synthetic text: the trace gave lengths only (input_length, hash_ids), so its prompts are random "
    "tokens; acceptance on them says little about real traffic"
)


def _trace_conditions(rows: pd.DataFrame) -> list[str]:
    out = []
    for (mean, peak, count), group in rows.groupby(["trace_mean_rate", "trace_peak_rate", "trace_requests"]):
        scales = ", ".join(f"{s:g}x" for s in sorted(group["trace_scale"].dropna().unique()))
        out.append(
            f"trace replay: {int(count)} requests on the trace's own schedule (its own mean rate {mean:.3g} "
            f"req/s, peak {peak:.3g} req/s over 10 s), replayed with its gaps scaled by {scales}"
        )
    if "trace_conversations" in rows and (rows["trace_conversations"] > 0).any():
        count = int(rows["trace_conversations"].max())
        out.append(
            f"conversations: {count} replayed turn by turn; each later turn is sent once the previous turn's "
            "answer has finished, after its think time, with that answer in its history (so its send time "
            "follows the server, not the trace)"
        )
    if "trace_synthetic" in rows and (rows["trace_synthetic"] == 1).any():
        out.append(SYNTHETIC_NOTE)
    return out


def _f(value: object, digits: int = 1, suffix: str = "") -> str:
    if value is None or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "—"
    return f"{value:.{digits}f}{suffix}"


def _ratio_cell(decision: Decision | None) -> tuple[str, str]:
    """The ratio as "2.34x [2.10, 2.61]" and its verdict (with what would resolve it)."""
    if decision is None:
        return "—", "no comparison"
    text, detail = decision.ratio.text, decision.detail
    if decision.label == LOAD_BOUND:
        return text, LOAD_BOUND_TEXT
    if decision.label == WITHHELD:  # a failed validity check: the reason, not a verdict
        return text, f"withheld: {decision.detail}"
    # An interval's absence is said once, in the ratio's own cell, not again beside the verdict.
    said = bool(detail) and detail in text
    unresolved = decision.label in (INCONCLUSIVE, TOO_FEW) and detail and not said
    return text, decision.label + (f" ({detail})" if unresolved else "")


def _decision(data: ReportData, row: pd.Series, metric: str) -> Decision | None:
    return data.comparisons.decision(str(row.get("point_key")), metric) if data.comparisons else None


def _alpha_cell(row: pd.Series) -> tuple[str, str]:
    alpha, low, high = row.get("acceptance_alpha"), row.get("alpha_low"), row.get("alpha_high")
    rate = row.get("spec_decode_acceptance_rate")
    text = f"L {row.get('acceptance_length_text', '—')}, α {_f(alpha, 2)}"
    if _gt(low, -1) and _gt(high, -1):
        text += f" [{low:.2f}, {high:.2f}]"
    if _gt(rate, -1):
        text += f" (vLLM accepted/draft tokens {rate:.1f}%)"
    label = (
        "low (α < 0.6)" if _lt(high, 0.6) else "high (α > 0.9)" if _gt(low, 0.9) else "within [0.6, 0.9] or unresolved"
    )
    return text, label if _gt(alpha, -1) else "not reported"


def _name(row: pd.Series) -> str:
    if row.get("replica") == 1:
        return f"{row['engine']} A/A twin"
    return f"{row['engine']} {row['method']} k={row['k']}"


def look_table(data: ReportData) -> list[list[str]]:
    """The tutorial's "what to look for": baseline against speculation at low and high load,
    every ratio with its interval and verdict."""
    return [cells for cells, _ in look_rows(data)]


def look_rows(data: ReportData) -> list[tuple[list[str], str]]:
    """:func:`look_table`'s rows, each with the MLflow runs behind it (space-separated ids)."""
    rows: list[tuple[list[str], str]] = []
    points = data.points
    if points.empty:
        return rows
    curve = ["engine", "method", "k"] + (["setting_key"] if "setting_key" in points else [])
    for _, group in points.groupby(curve, sort=True):
        group = group.sort_values("request_rate")
        config = _name(group.iloc[0])
        loads = [("low", group.iloc[0])] + ([("high", group.iloc[-1])] if len(group) > 1 else [])
        for load, row in loads:
            rate = row["request_rate"]
            for label, base, spec, unit, metric in (
                ("median TPOT", "base_median_tpot_ms", "median_tpot_ms", " ms", "speedup_median_tpot"),
                ("p99 TPOT", "base_p99_tpot_ms", "p99_tpot_ms", " ms", "speedup_p99_tpot"),
                ("throughput", "base_output_throughput", "output_throughput", " tok/s", "output_throughput_ratio"),
            ):
                rows.append(
                    (
                        [
                            config,
                            f"{label}, {load} load ({rate:g}/s)",
                            _f(row.get(base), 1, unit),
                            _f(row.get(spec), 1, unit),
                            *_ratio_cell(_decision(data, row, metric)),
                        ],
                        str(row.get("run_ids", "")),
                    )
                )
        first = group.iloc[0]
        runs = str(first.get("run_ids", ""))
        rows.append(
            (
                [
                    config,
                    f"median TTFT ({first['request_rate']:g}/s)",
                    _f(first.get("base_median_ttft_ms"), 1, " ms"),
                    _f(first.get("median_ttft_ms"), 1, " ms"),
                    *_ratio_cell(_decision(data, first, "speedup_median_ttft")),
                ],
                runs,
            )
        )
        text, label = _alpha_cell(first)
        # The table's six columns: acceptance has no baseline and no ratio, only its own figure.
        rows.append(([config, f"acceptance ({first['request_rate']:g}/s)", "—", text, "—", label], runs))
    return rows


def _gt(v: object, x: float) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v > x


def _lt(v: object, x: float) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v < x


def method_statement(data: ReportData) -> str:
    """How every verdict in the report was decided: the reader's key to the words."""
    points = data.points
    opts = data.comparisons.options if data.comparisons else None
    if points.empty or opts is None:
        return ""
    runs = int(points["runs"].max()) if "runs" in points else 1
    basis = (
        "1 run per point: the bootstrap covers request-to-request variation within the run"
        if runs == 1
        else f"up to {runs} runs per point: the interval covers the spread between runs, then requests"
    )
    spread = opts.server_spread
    if is_aa(data.frame):
        servers = (
            "This is an A/A sweep: the spread it measures between fresh servers is recorded for the other "
            "sweeps of this store. "
        )
    elif spread and spread.for_metric("speedup_median_tpot"):
        servers = (
            f"Where both windows ran on one pair of servers, the spread between server starts measured by "
            f"the A/A sweep {spread.source} ({spread.comparisons} comparisons; median TPOT "
            f"{100 * spread.sd['speedup_median_tpot']:.1f} %) is added to the interval. "
        )
    else:
        servers = (
            "WARNING: the spread between server starts is not measured for one-server comparisons, so "
            "these intervals are too narrow: run `python -m pipeline.sweep +sweep=noise_floor` once with "
            "this store, or use repeats.restart=true (on a 2-core CPU, one-run verdicts without it were "
            "false alarms in 3 of 10 A/A comparisons). "
        )
    return (
        f"{servers}Every ratio reads estimate [{opts.confidence:.0%} interval]: a bootstrap over requests paired by "
        f"prompt ({opts.resamples} resamples); {basis}. A ratio helps only if its interval lies above "
        f"1 + {opts.floor:.0%} (p99: 1 + {P99_FLOOR:.0%}), hurts only if below 1 - that floor; otherwise it is "
        f"inconclusive. Verdicts are adjusted across the {len(points)} comparisons of each ratio "
        f"(Benjamini-Hochberg, false-discovery rate {1 - opts.confidence:.0%}): each ratio (median TPOT, p99 "
        f"TPOT, median TTFT, median ITL, median E2EL, throughput) is a family of its own, so across the report's "
        f"{len(RATIOS)} families the expected share of false verdicts is at most "
        f"{len(RATIOS) * (1 - opts.confidence):.0%}. A p99 gets a verdict only from windows of 100 or more paired "
        f"requests; a failed request counts as slower than any answer."
    )


def _tpot_labels(data: ReportData) -> pd.Series:
    """Each point's median-TPOT verdict, from its Decision ("" where there is none)."""
    if data.comparisons is None:
        return pd.Series("", index=data.points.index, dtype=object)
    return data.comparisons.labels(data.points)


def headline(data: ReportData) -> str:
    points = data.points
    verdict = _tpot_labels(data)
    if not points.empty and (verdict == TOO_FEW).all():
        return "Not enough requests to compare any point: a verdict needs 5 or more paired requests per window."
    if points.empty or points["speedup_median_tpot"].isna().all():
        return "No speculative point could be compared with a baseline: no answer yet (see below)."
    counts = {label: int((verdict == label).sum()) for label in (HELPS, HURTS, INCONCLUSIVE, TOO_FEW, WITHHELD)}
    if is_aa(data.frame):
        return _aa_headline(data, counts)
    helps = points[verdict == HELPS]
    if helps.empty:
        text = "No point clearly helps in median TPOT. "
    else:
        best = helps.loc[helps["speedup_median_tpot"].idxmax()]
        text = (
            f"Best: {_name(best)} at {best['request_rate']:g} req/s, {_ratio_cell(_decision(data, best, 'speedup_median_tpot'))[0]} "
            f"median TPOT (helps). "
        )
    text += (
        f"Speculation helps at {counts[HELPS]} of {len(points)} measured points, hurts at {counts[HURTS]}, "
        f"inconclusive at {counts[INCONCLUSIVE] + counts[TOO_FEW]}"
        + (f", no verdict at {counts[WITHHELD]} (see Can you trust this run?)" if counts[WITHHELD] else "")
        + ". "
    )
    crossed = [c for c in data.crossings if c.rate is not None]
    if crossed:
        text += "Stops paying: " + "; ".join(f"{c.method} k={c.k} {c.text}" for c in crossed) + "."
    else:
        text += "Where it stops paying is not resolved within the measured loads."
    return text


def _aa_headline(data: ReportData, counts: dict[str, int]) -> str:
    points = data.points
    opts = data.comparisons.options if data.comparisons else None
    false = counts[HELPS] + counts[HURTS]
    text = (
        f"A/A comparison: two identical servers without speculation, the second compared as if it were "
        f"speculative. {false} of {len(points)} median-TPOT comparisons gave a verdict (each a false alarm). "
    )
    floors = []
    for row in points.sort_values("request_rate").itertuples():
        decision = data.comparisons.decision(row.point_key, TPOT) if data.comparisons else None
        reach = smallest_resolvable(decision.ratio, opts.floor) if opts and decision else None
        if reach is not None:
            floors.append(f"{reach:.3f}x at {row.request_rate:g} req/s")
    if floors:
        runs = int(points["runs"].max()) if "runs" in points else 1
        text += (
            f"Smallest median-TPOT speedup this sweep's windows resolve ({runs} run(s) per point): "
            + ", ".join(floors)
            + ". "
        )
    spread = server_spread(aa_log_ratios(data.frame), "this sweep")
    sd = spread.for_metric("speedup_median_tpot") if spread else None
    if opts and spread and sd:
        reach = (1 + opts.floor) * math.exp(float(scipy_stats.t.ppf(1 - opts.alpha / 2, spread.comparisons)) * sd)
        text += (
            f"Between fresh servers the median TPOT differed by {100 * sd:.1f} % (RMS over "
            f"{spread.comparisons} comparisons): with that spread added, as the other sweeps of this store "
            f"add it, one run resolves a speedup of {reach:.2f}x or more."
        )
    return text


def markdown(data: ReportData) -> str:
    return "\n".join([*answer_lines(data), "", *detail_lines(data)]) + "\n"


def answer_lines(data: ReportData) -> list[str]:
    """The summary's first part, the answer: headline, method, conditions, what to look for, the
    searches' own sections and where speculation stops paying (the HTML page draws these itself)."""
    lead = [f"**{data.lead}**", ""] if data.lead else []
    lines = [f"# {data.title}", "", *lead, f"**{headline(data)}**", "", method_statement(data), ""]
    lines += [f"- {c}" for c in data.conditions] + ["", "## What to look for", ""]
    lines += ["| configuration | metric | baseline | speculation | ratio | verdict |", "|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in look_table(data)]
    lines += ["", "## Can you trust this run?", "", *data.trust] if data.trust else []
    lines += ["", *data.sections, "## Where speculation stops paying", ""]
    lines += [f"- {c.engine} {c.method} k={c.k}: {c.text}" for c in data.crossings] or ["- not computed: no pairs"]
    return lines


def detail_lines(data: ReportData) -> list[str]:
    """The summary's second part, from its first heading on: the model, advice, k schedule,
    losslessness and what was not computed. The HTML page shows these as the Markdown has them,
    so both renderers take this list rather than cutting the text at a heading a search's own
    section can share ("## Predicted k curve")."""
    lines = ["## Predicted against measured speedup (Leviathan et al.)", ""]
    for fit in data.fits:
        lines.append(f"- {fit.engine} {fit.method} at {fit.rate:g} req/s: α={fit.alpha:.3f}, c={fit.c:.3f}")
        lines += [
            f"  - k={k}: predicted {p:.2f}x (a model figure, no interval)"
            + (f", measured {_measured_text(data, fit, k)}" if k in fit.measured else "")
            for k, p in fit.predicted.items()
        ]
    lines += ["", "## Advice", ""]
    lines += [f"- **{a.advice}** ({a.rule}: {a.evidence})" for a in data.advice] or ["- no rule triggered"]
    lines += ["", "## k schedule", ""]
    lines += ["Put into vLLM's `--speculative-config` (batch-size bands, inclusive; 0 = no drafting in that band):"]
    lines += [f"```json\n{json.dumps(s)}\n```" for s in data.schedules] or ["not computed"]
    lines += ["", "## Losslessness", ""]
    lines += [
        f"- {q.server} vs {q.baseline}: {q.exact}/{q.compared} identical{_divergences(q)}; {q.verdict}"
        for q in data.lossless
    ] or ["- not measured"]
    lines += [f"- {name}: output-length KS statistic {stat:.3f}, p={p:.3f}" for name, stat, p in data.length_tests]
    lines += ["", "## Not computed", ""] + ([f"- {n}" for n in data.not_computed] or ["- everything was computed"])
    return lines


def _divergences(q: object) -> str:
    """Where the outputs that differ first differ: "; prompt 1 at token 57"."""
    found = [f"prompt {i} at token {t}" for i, t in enumerate(getattr(q, "first_divergence", ())) if t is not None]
    return f"; first divergence: {', '.join(found)}" if found else ""


def _measured_text(data: ReportData, fit: LeviathanFit, k: int) -> str:
    points = data.points
    match = points[
        (points["engine"] == fit.engine)
        & (points["method"] == fit.method)
        & (points["k"] == k)
        & (points["request_rate"] == fit.rate)
    ]
    decision = _decision(data, match.iloc[0], "speedup_median_tpot") if not match.empty else None
    return decision.ratio.text if decision else f"{fit.measured[k]:.2f}x"


def run_names(frame: pd.DataFrame) -> dict[str, str]:
    """Each run id of the sweep's table by its point's name, for links that say what they open."""
    return dict(zip(frame["run_id"].astype(str), frame["point"].astype(str), strict=True))
