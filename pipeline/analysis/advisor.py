"""The tutorial's tuning rules, evaluated on measured data. A rule fires only where the
interval of the quantity it tests clears its threshold, and the advice quotes that interval.
Plus a per-load k schedule in vLLM's own config format."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from pipeline.analysis.categories import GroupComparisons
from pipeline.analysis.decisions import HELPS, HURTS, decide
from pipeline.analysis.samples import finite_number
from pipeline.analysis.stats import Ratio
from pipeline.analysis.verdicts import TPOT, Comparisons, Crossover, config_label

# Every acceptance rule tests alpha: the per-token acceptance probability implied by the
# measured acceptance length L at the effective draft length, one scale for vLLM and SGLang
# (the report's acceptance row shows the same alpha). vLLM's accepted/draft-token rate is
# another quantity: at k=3, alpha 0.75 is a rate of 0.58.
LOW_ALPHA = 0.6  # below: a closer draft pays
HIGH_ALPHA = 0.9  # above: a larger k has room
TTFT_REGRESSION = 0.9  # a TTFT speedup whose whole interval is below this: >10 % slower
DRAFT_MEMORY_RATIO = 1.3  # a separate draft whose server uses 30 % more memory than the baseline's
ALPHA_SCALE = "α: per-token acceptance implied by L at the effective k"


KV_LOSS = 0.10  # a speculative server whose KV cache holds 10 % fewer tokens than the baseline's


@dataclass(frozen=True)
class KvCapacity:
    """A configuration's KV cache against the baseline's (vLLM's vllm:cache_config_info): a
    figure of the server's configuration, the same in every window, so it carries no spread."""

    base_tokens: float
    tokens: float
    base_concurrency: float
    concurrency: float
    draft_bytes: float = math.nan  # the draft's or head's own parameters, at the server's dtype

    @property
    def ratio(self) -> float:
        return self.tokens / self.base_tokens


@dataclass(frozen=True)
class Advice:
    rule: str
    advice: str
    evidence: str


def _curves(table: pd.DataFrame):  # type: ignore[no-untyped-def]
    keys = ["engine", "method", "k"] + (["setting_key"] if "setting_key" in table else [])
    for _, group in table.groupby(keys, sort=True):
        first = group.iloc[0]
        yield f"{first['engine']} {first['method']} k={first['k']}", group.sort_values("request_rate")


def advise(
    comparisons: Comparisons,
    crossings: list[Crossover],
    memory: dict[str, tuple[float, float, float]],
    kv: dict[str, KvCapacity] | None = None,
) -> list[Advice]:
    """``memory``: configuration -> (lowest, median, highest) host-memory ratio to the baseline,
    the CPU fallback; ``kv``: configuration -> its KV capacity against the baseline's."""
    out: list[Advice] = list(_kv_advice(comparisons, kv or {})) + _memory_by_method(comparisons, kv or {})
    if comparisons.table.empty:
        return out
    for name, group in _curves(comparisons.table):
        out += _alpha_advice(name, group.iloc[0])
        out += _load_advice(comparisons, name, group)
    for cross in crossings:
        if cross.rate is not None:
            out.append(
                Advice(
                    "speculation stops paying",
                    f"{cross.engine} {cross.method} k={cross.k}: disable speculation above ~{cross.rate:.1f} req/s",
                    cross.text,
                )
            )
    for key, (lowest, median, highest) in memory.items():
        if lowest > DRAFT_MEMORY_RATIO:
            out.append(
                Advice(
                    "high memory with a separate draft",
                    f"{key}: EAGLE or Medusa heads cost less memory",
                    f"server memory {median:.2f}x [{lowest:.2f}, {highest:.2f}] the baseline's "
                    f"(range over every window's reading)",
                )
            )
    return out


def _alpha_advice(name: str, low: pd.Series) -> list[Advice]:
    """α at the curve's lowest rate, where only a resolved interval past a threshold speaks."""
    alpha, lo, hi = low.get("acceptance_alpha"), low.get("alpha_low"), low.get("alpha_high")
    if not (finite_number(alpha) and finite_number(lo) and finite_number(hi)):
        return []
    evidence = f"α {alpha:.2f} [{lo:.2f}, {hi:.2f}] at {low['request_rate']:g} req/s ({ALPHA_SCALE})"
    out = []
    if hi < LOW_ALPHA:
        closer = (
            "a smaller k (prompt lookup rarely matches that far ahead), or a draft model"
            if low["method"] in ("ngram", "suffix")
            else "a draft closer to the target (or EAGLE/MTP heads)"
        )
        out.append(Advice(f"α < {LOW_ALPHA}", f"{name}: use {closer}", evidence))
    if lo > HIGH_ALPHA:
        out.append(Advice(f"α > {HIGH_ALPHA}", f"{name}: try a larger k; most drafts are accepted", evidence))
    return out


def _load_advice(comparisons: Comparisons, name: str, group: pd.DataFrame) -> list[Advice]:
    """Throughput lost at the curve's highest rate, and a TTFT whose whole interval regressed."""
    out = []
    high = group.iloc[-1]
    tput = comparisons.decision(high["point_key"], "output_throughput_ratio")
    if len(group) > 1 and tput is not None and tput.label == HURTS:
        out.append(
            Advice(
                "throughput lost at high load",
                f"{name}: disable speculation at {high['request_rate']:g} req/s and above",
                f"output throughput {tput.ratio.text} the baseline's at {high['request_rate']:g} req/s",
            )
        )
    slower = group[group["speedup_median_ttft_high"].apply(lambda v: finite_number(v) and v < TTFT_REGRESSION)]
    if not slower.empty:
        worst = slower.loc[slower["speedup_median_ttft"].idxmin()]
        fix = "a smaller k" if worst["method"] in ("ngram", "suffix") else "a smaller k, or ngram (no draft to prefill)"
        text = _ratio_text(comparisons, worst, "speedup_median_ttft")
        out.append(
            Advice(
                "TTFT regression",
                f"{name}: use {fix}",
                f"median TTFT speedup {text} at {worst['request_rate']:g} req/s: the whole interval is below "
                f"{TTFT_REGRESSION}",
            )
        )
    return out


def k_schedule(
    comparisons: Comparisons,
    baseline_e2el_s: dict[float, float],
    method: str,
    compare: Callable[[str, str], Ratio | None],
) -> dict | None:
    """The best k per load band as vLLM's ``num_speculative_tokens_per_batch_size``:
    ``[range_start, range_end, k]`` by batch size, inclusive. A rate's batch size is
    estimated by Little's law (rate x baseline median E2EL); a band where no k helps gets 0.

    A band keeps the previous band's k, whether or not it still helps there, unless the k that
    helps most at this load is resolved faster than it (``compare(previous_key, candidate_key)``:
    the paired ratio of the two speculative windows, None where none can be drawn), or the
    previous k hurts here. Every comparison the schedule may ask is decided as one family
    (Benjamini-Hochberg): a difference inside the noise does not change the schedule, and
    neither does one of several comparisons that clears the floor by chance."""
    table = comparisons.table
    rows = table[table["method"] == method] if not table.empty else table
    if rows.empty or not baseline_e2el_s:
        return None
    rates = sorted(rows["request_rate"].unique())
    resolved = _resolved_switches(comparisons, rows, rates, compare)
    bands: list[tuple[int, int]] = []
    previous: int | None = None
    for rate in rates:
        at_rate = rows[rows["request_rate"] == rate]
        labels = comparisons.labels(at_rate)
        helping = at_rate[labels == HELPS]
        best = 0
        if not helping.empty:
            candidate = helping.loc[helping[TPOT].idxmax()]
            best = int(candidate["k"])
            kept = at_rate[at_rate["k"] == previous]
            if previous and previous != best and not kept.empty and labels[kept.index[0]] != HURTS:
                switch = (str(kept.iloc[0]["point_key"]), str(candidate["point_key"])) in resolved
                best = best if switch else previous
        previous = best or None
        e2el = baseline_e2el_s.get(float(rate))
        # A rate whose baseline window served nothing has no latency (NaN): no batch to place it at.
        batch = max(1, math.ceil(rate * e2el)) if e2el and math.isfinite(e2el) and math.isfinite(rate) else None
        if batch is None:
            continue
        bands.append((batch, best))
    if not bands:
        return None
    schedule, start = [], 1
    for i, (batch, best) in enumerate(bands):
        end = batch if i < len(bands) - 1 else max(batch, 1024)
        if end >= start:
            schedule.append([start, end, best])
            start = end + 1
    return {
        "method": method,
        "num_speculative_tokens": max(k for _, _, k in schedule) or 1,
        "num_speculative_tokens_per_batch_size": schedule,
    }


def _resolved_switches(
    comparisons: Comparisons,
    rows: pd.DataFrame,
    rates: list[float],
    compare: Callable[[str, str], Ratio | None],
) -> set[tuple[str, str]]:
    """(previous key, candidate key) pairs where the candidate is resolved faster: at each rate
    after the first, the k that helps most there against every other k measured there (any of
    them may be the previous band's), all decided as one family."""
    asked: list[tuple[tuple[str, str], Ratio]] = []
    for rate in rates[1:]:
        at_rate = rows[rows["request_rate"] == rate]
        helping = at_rate[comparisons.labels(at_rate) == HELPS]
        if helping.empty:
            continue
        candidate = str(helping.loc[helping[TPOT].idxmax()]["point_key"])
        for other in at_rate["point_key"]:
            if str(other) != candidate and (ratio := compare(str(other), candidate)) is not None:
                asked.append(((str(other), candidate), ratio))
    if not asked:
        return set()
    decided = decide([ratio for _, ratio in asked], comparisons.options)
    return {pair for (pair, _), d in zip(asked, decided, strict=True) if d.label == HELPS}


def _kv_advice(comparisons: Comparisons, kv: dict[str, KvCapacity]) -> list[Advice]:
    """The tutorial's "memory pressure from the draft", from the KV capacity the draft leaves:
    at high load the batch the KV cache holds is what caps throughput. Beside it, the speedup
    the configuration bought, at the highest rate measured."""
    out = []
    table = comparisons.table
    for name, cap in kv.items():
        if cap.ratio > 1 - KV_LOSS:
            continue
        speed = ""
        if not table.empty:
            rows = table[table.apply(config_label, axis=1) == name].sort_values("request_rate")
            if not rows.empty:
                top = rows.iloc[-1]
                speed = f"; median-TPOT speedup {_ratio_text(comparisons, top, TPOT)} at {top['request_rate']:g} req/s"
        concurrency = (
            f", max concurrency {cap.base_concurrency:.1f} -> {cap.concurrency:.1f}"
            if math.isfinite(cap.concurrency) and math.isfinite(cap.base_concurrency)
            else ""
        )
        out.append(
            Advice(
                "KV capacity lost to the draft",
                f"{name}: the draft takes {1 - cap.ratio:.1%} of the KV "
                "cache; at high load that caps the batch: EAGLE heads or a smaller draft cost less",
                f"KV cache {cap.base_tokens:,.0f} -> {cap.tokens:,.0f} tokens{concurrency} (vLLM's "
                f"cache_config_info, the same in every window){speed}",
            )
        )
    return out


def _memory_by_method(comparisons: Comparisons, kv: dict[str, KvCapacity]) -> list[Advice]:
    """The tuning guide's "memory pressure: use EAGLE (no separate model memory)", measured: what
    each configuration's draft costs (its own weights, the KV cache it leaves) beside what it
    bought, for every configuration of the sweep with vLLM's KV figure. Where both a head
    (eagle, eagle3) and a separate draft model were measured, which leaves the larger cache."""
    if not kv:
        return []
    table = comparisons.table
    parts = []
    for name, cap in sorted(kv.items(), key=lambda item: -item[1].ratio):
        weights = f"{cap.draft_bytes / 2**20:,.1f} MiB of its own weights, " if math.isfinite(cap.draft_bytes) else ""
        speed = ""
        rows = (
            table[table.apply(config_label, axis=1) == name].sort_values("request_rate") if not table.empty else table
        )
        if not rows.empty:
            top = rows.iloc[-1]
            speed = f", median-TPOT speedup {_ratio_text(comparisons, top, TPOT)} at {top['request_rate']:g} req/s"
        parts.append(f"{name}: {weights}KV cache {cap.ratio:.1%} of the baseline's ({cap.tokens:,.0f} tokens){speed}")
    heads = {n: c for n, c in kv.items() if n.split(" ")[-2] in ("eagle", "eagle3")}
    drafts = {n: c for n, c in kv.items() if n.split(" ")[-2] == "draft"}
    if heads and drafts:
        head, draft = max(heads.items(), key=lambda i: i[1].ratio), min(drafts.items(), key=lambda i: i[1].ratio)
        advice = (
            f"under memory pressure prefer {head[0]}: it leaves {head[1].ratio:.1%} of the KV cache, "
            f"{draft[0]} {draft[1].ratio:.1%} (measured here, not a rule of thumb)"
        )
    else:
        advice = "what each configuration's draft costs in memory, beside what it bought"
    return [Advice("memory each method costs", advice, "; ".join(parts) + " (vLLM's cache_config_info)")]


def _ratio_text(comparisons: Comparisons, row: pd.Series, metric: str) -> str:
    """A point's ratio with its interval, from its Decision (the record the verdict travels in)."""
    decision = comparisons.decision(str(row["point_key"]), metric)
    return decision.ratio.text if decision else "—"


def _alpha_text(row: pd.Series) -> str:
    alpha, lo, hi = row.get("acceptance_alpha"), row.get("acceptance_alpha_low"), row.get("acceptance_alpha_high")
    if finite_number(alpha) and finite_number(lo) and finite_number(hi):
        return f"α {alpha:.2f} [{lo:.2f}, {hi:.2f}]"
    return "α not resolved"


def by_request_type(groups: GroupComparisons | None) -> list[Advice]:
    """The tuning guide's task-type rules ("code: high acceptance, n-gram"; "creative: low
    acceptance, consider disabling speculation"), fired per measured category from its own
    intervals (analysis/categories.py): off where its speedup is resolved below 1; on where it is
    resolved above; route where one point has both."""
    out: list[Advice] = []
    if groups is None or groups.empty:
        return out
    for (config, rate), group in groups.table.groupby(["config", "request_rate"], sort=True):
        rows = [(row, groups.decision(row)) for _, row in group.iterrows()]
        helps = [(row, d.ratio.text) for row, d in rows if d.label == HELPS]
        hurts = [(row, d.ratio.text) for row, d in rows if d.label == HURTS]
        for row, text in hurts:
            low_alpha = finite_number(row.get("acceptance_alpha_high")) and row["acceptance_alpha_high"] < LOW_ALPHA
            why = " (its drafts are rarely accepted)" if low_alpha else ""
            out.append(
                Advice(
                    "request type: speculation hurts",
                    f"{config}: turn speculation off for {row['category']} requests{why}",
                    f"median-TPOT speedup {text} at {rate:g} "
                    f"req/s, {_alpha_text(row)}, {int(row['requests'])} requests",
                )
            )
        for row, text in helps:
            high_alpha = finite_number(row.get("acceptance_alpha_low")) and row["acceptance_alpha_low"] > HIGH_ALPHA
            if high_alpha:
                out.append(
                    Advice(
                        "request type: high acceptance",
                        f"{config}: {row['category']} requests accept "
                        "nearly every draft; a larger k (or n-gram, which needs no draft) has room",
                        f"{_alpha_text(row)}, median-TPOT speedup {text} at {rate:g} req/s",
                    )
                )
        if helps and hurts:
            out.append(_route(config, rate, helps, hurts))
    return out


def _route(config: str, rate: float, helps: list[tuple[pd.Series, str]], hurts: list[tuple[pd.Series, str]]) -> Advice:
    """One point where one category helps while another hurts: route by request type."""
    on = ", ".join(f"{row['category']} {text}" for row, text in helps)
    off = ", ".join(f"{row['category']} {text}" for row, text in hurts)
    return Advice(
        "route by request type",
        f"{config} at {rate:g} req/s: speculation on for "
        f"{', '.join(row['category'] for row, _ in helps)}, off for {', '.join(row['category'] for row, _ in hurts)}",
        f"on: {on}; off: {off} (median-TPOT speedups, one family)",
    )
