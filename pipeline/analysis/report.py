"""The report: a Markdown summary and one self-contained HTML page (figures inlined).

Pure rendering: everything it shows was computed before. Its first screen answers the
question; what could not be computed is said, never filled in.
"""

from __future__ import annotations

import base64
import html
import json
import math
from dataclasses import dataclass, field

import pandas as pd

from pipeline.analysis.advisor import Advice
from pipeline.analysis.model import Fit
from pipeline.analysis.quality import Lossless
from pipeline.analysis.verdicts import Crossover, measured


@dataclass(frozen=True)
class ReportData:
    title: str
    frame: pd.DataFrame  # every point (the sweep's summary table)
    points: pd.DataFrame  # verdicts per (engine, method, k, rate)
    crossings: list[Crossover]
    fits: list[Fit]
    advice: list[Advice]
    schedules: list[dict]
    lossless: list[Lossless]
    length_tests: list[tuple[str, float, float]]  # (server, KS statistic, p-value) at temperature > 0
    not_computed: list[str] = field(default_factory=list)
    conditions: list[str] = field(default_factory=list)  # how the windows were measured


PREFIX_POLICY_TEXT = {
    "cold": "cold (every window starts from an emptied prefix cache)",
    "warm": "warm (emptied, then the window's prompts sent once, unmeasured, before it)",
    "off": "off (the servers ran without prefix caching)",
}
SUFFIX_NOTE = (
    "suffix: the method keeps a global suffix tree that survives prefix-cache resets, so its "
    "acceptance can drift with the order in which points ran on one server"
)

SGLANG_ITL_NOTE = (
    "ITL on SGLang is the gap between streamed chunks, as vLLM's bench counts it; SGLang's own "
    "bench spreads a multi-token chunk's gap over its tokens, so its ITL reads lower under speculation"
)


def conditions(frame: pd.DataFrame) -> list[str]:
    """The measurement conditions a reader needs to compare these numbers with another tool's."""
    out = []
    if "prefix_cache" in frame:
        policies = sorted(str(p) for p in frame["prefix_cache"].dropna().unique())
        out += [f"prefix cache: {PREFIX_POLICY_TEXT.get(p, p)}" for p in policies]
    if "prefix_cache_hit_rate" in frame:
        rates = frame.dropna(subset=["prefix_cache_hit_rate"])
        if not rates.empty:
            out.append("prefix-cache hit rate per window: " + ", ".join(
                f"{row.point} {100 * row.prefix_cache_hit_rate:.0f}%" for row in rates.itertuples()))  # fmt: skip
    if (frame.get("method") == "suffix").any():
        out.append(SUFFIX_NOTE)
    if (frame.get("engine") == "sglang").any():
        out.append(SGLANG_ITL_NOTE)
    return out


def _f(value: object, digits: int = 1, suffix: str = "") -> str:
    if value is None or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "—"
    return f"{value:.{digits}f}{suffix}"


def look_table(data: ReportData) -> list[list[str]]:
    """The tutorial's "what to look for": baseline against speculation at low and high load."""
    rows: list[list[str]] = []
    frame, points = data.frame, data.points
    if points.empty:
        return rows
    base = measured(frame, "baseline")
    for (engine, method, k), group in points.groupby(["engine", "method", "k"], sort=True):
        config = f"{engine} {method} k={k}"
        rates = sorted(group["request_rate"])
        loads = [("low", rates[0])] + ([("high", rates[-1])] if len(rates) > 1 else [])
        for load, rate in loads:
            row = group[group["request_rate"] == rate].iloc[0]
            b = base[(base["engine"] == engine) & (base["request_rate"] == rate)].median(numeric_only=True)
            tput = row["output_throughput_ratio"]
            tput_verdict = "helps" if _gt(tput, 1.1) else "hurts" if _lt(tput, 1 / 1.1) else "neutral"
            rows.append([config, f"TPOT, {load} load ({rate:g}/s)", _f(b.get("median_tpot_ms"), 1, " ms"),
                         _f(row["median_tpot_ms"], 1, " ms"), _f(row["speedup_median_tpot"], 2, "x"),
                         row["verdict"]])  # fmt: skip
            rows.append([config, f"throughput, {load} load ({rate:g}/s)", _f(b.get("output_throughput"), 1, " tok/s"),
                         _f(row["output_throughput"], 1, " tok/s"), _f(tput, 2, "x"), tput_verdict])  # fmt: skip
        first = group[group["request_rate"] == rates[0]].iloc[0]
        ttft = first["speedup_median_ttft"]
        b0 = base[(base["engine"] == engine) & (base["request_rate"] == rates[0])]["median_ttft_ms"].median()
        rows.append([config, f"TTFT ({rates[0]:g}/s)", _f(b0, 1, " ms"), _f(first["median_ttft_ms"], 1, " ms"),
                     _f(1 / ttft if _gt(ttft, 0) else None, 2, "x slower") if _lt(ttft, 1) else _f(ttft, 2, "x"),
                     "hurts" if _lt(ttft, 0.9) else "neutral" if _lt(ttft, 1.1) else "helps"])  # fmt: skip
        rate_pct, length, alpha = first["spec_decode_acceptance_rate"], first["acceptance_length"], first["acceptance_alpha"]
        rows.append([config, "acceptance", "", f"rate {_f(rate_pct, 1, '%')}, L {_f(length, 2)}, α {_f(alpha, 2)}", "",
                     "low (<0.6)" if _lt(alpha, 0.6) else "high (>0.9)" if _gt(alpha, 0.9) else "ok"])  # fmt: skip
    return rows


def _gt(v: object, x: float) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v > x


def _lt(v: object, x: float) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v < x


def headline(data: ReportData) -> str:
    points = data.points
    if points.empty or points["speedup_median_tpot"].isna().all():
        return "No speculative point could be compared with a baseline: no answer yet (see below)."
    best = points.loc[points["speedup_median_tpot"].idxmax()]
    helps = points[points["verdict"] == "helps"]
    text = (f"Best: {best['engine']} {best['method']} k={best['k']} at {best['request_rate']:g} req/s, "
            f"{best['speedup_median_tpot']:.2f}x median TPOT ({best['verdict']}). ")  # fmt: skip
    text += f"Speculation helps at {len(helps)} of {len(points)} measured points. "
    fades = []
    for (_, method, k), group in points.sort_values("request_rate").groupby(["engine", "method", "k"], sort=True):
        after = group[group["verdict"] != "helps"]
        if not after.empty and (group["verdict"] == "helps").any():
            fades.append(f"{method} k={k} from {after['request_rate'].iloc[0]:g} req/s")
    if fades:
        text += "No longer clearly helps (inside the noise or worse): " + "; ".join(fades) + ". "
    crossed = [c for c in data.crossings if c.rate is not None]
    if crossed:
        text += "Stops paying: " + "; ".join(f"{c.method} k={c.k} at ~{c.rate:.1f} req/s" for c in crossed) + "."
    else:
        text += "The median-TPOT speedup does not fall below 1.0 within the measured loads."
    return text


def markdown(data: ReportData) -> str:
    lines = [f"# {data.title}", "", f"**{headline(data)}**", ""]
    lines += [f"- {c}" for c in data.conditions] + ["", "## What to look for", ""]
    lines += ["| configuration | metric | baseline | speculation | ratio | verdict |", "|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in look_table(data)]
    lines += ["", "## Where speculation stops paying", ""]
    lines += [f"- {c.engine} {c.method} k={c.k}: {c.text}" for c in data.crossings] or ["- not computed: no pairs"]
    lines += ["", "## Predicted against measured speedup (Leviathan et al.)", ""]
    for fit in data.fits:
        lines.append(f"- {fit.engine} {fit.method} at {fit.rate:g} req/s: α={fit.alpha:.3f}, c={fit.c:.3f}")
        lines += [f"  - k={k}: predicted {p:.2f}x" + (f", measured {fit.measured[k]:.2f}x" if k in fit.measured else "")
                  for k, p in fit.predicted.items()]  # fmt: skip
    lines += ["", "## Advice", ""]
    lines += [f"- **{a.advice}** ({a.rule}: {a.evidence})" for a in data.advice] or ["- no rule triggered"]
    lines += ["", "## k schedule", ""]
    lines += ["Put into vLLM's `--speculative-config` (batch-size bands, inclusive; 0 = no drafting in that band):"]
    lines += [f"```json\n{json.dumps(s)}\n```" for s in data.schedules] or ["not computed"]
    lines += ["", "## Losslessness", ""]
    lines += [f"- {q.server} vs {q.baseline}: {q.exact}/{q.compared} identical; first divergence "
              f"{list(q.first_divergence)}; {q.verdict}" for q in data.lossless] or ["- not measured"]  # fmt: skip
    lines += [f"- {name}: output-length KS statistic {stat:.3f}, p={p:.3f}" for name, stat, p in data.length_tests]
    lines += ["", "## Not computed", ""] + ([f"- {n}" for n in data.not_computed] or ["- everything was computed"])
    return "\n".join(lines) + "\n"


CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:24px;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}
th{background:#f3f3f3}.helps{background:#d9f2d9}.hurts{background:#f8d7d7}.neutral{background:#f4f4f4}
.headline{font-size:18px;padding:10px;background:#eef4ff;border-left:4px solid #3b6fd8}img{max-width:100%}
code,pre{background:#f6f6f6}"""


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f'<td class="{html.escape(c)}">{html.escape(c)}</td>' if i == len(row) - 1
                         else f"<td>{html.escape(c)}</td>" for i, c in enumerate(row)) + "</tr>"
        for row in rows
    )  # fmt: skip
    return f"<table><tr>{head}</tr>{body}</table>"


def page(data: ReportData, figures: dict[str, bytes]) -> str:
    parts = [f"<h1>{html.escape(data.title)}</h1>", f'<p class="headline">{html.escape(headline(data))}</p>',
             "<ul>" + "".join(f"<li>{html.escape(c)}</li>" for c in data.conditions) + "</ul>",
             "<h2>What to look for</h2>",
             _table(["configuration", "metric", "baseline", "speculation", "ratio", "verdict"], look_table(data)),
             "<h2>Where speculation stops paying</h2><ul>"]  # fmt: skip
    parts += [f"<li>{html.escape(f'{c.engine} {c.method} k={c.k}: {c.text}')}</li>" for c in data.crossings]
    parts.append("</ul>")
    for name, png in figures.items():
        parts.append(f'<h3>{html.escape(name)}</h3><img alt="{html.escape(name)}" '
                     f'src="data:image/png;base64,{base64.b64encode(png).decode()}">')  # fmt: skip
    # The rest (model, advice, k schedule, losslessness, gaps) as the Markdown summary has it.
    rest = "## Predicted" + markdown(data).split("## Predicted", 1)[1]
    parts.append(f"<h2>Model, advice, k schedule, losslessness</h2><pre>{html.escape(rest)}</pre>")
    return f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(data.title)}</title>" \
           f"<style>{CSS}</style></head><body>{''.join(parts)}</body></html>"
