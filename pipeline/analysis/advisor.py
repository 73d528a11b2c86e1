"""The tutorial's tuning rules, evaluated on measured data; each piece of advice quotes the
numbers that triggered it. Plus a per-load k schedule in vLLM's own config format."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from pipeline.analysis.verdicts import Crossover

LOW_ACCEPTANCE = 0.6  # acceptance rate (fraction) below which a closer draft pays
HIGH_ACCEPTANCE = 0.9  # above which a larger k has room
TTFT_REGRESSION = 0.9  # TTFT speedup below this (10 % slower) counts as a regression
DRAFT_MEMORY_RATIO = 1.3
THROUGHPUT_NOISE = 0.10  # a throughput ratio below 1/1.1 is a loss beyond one run's noise  # a separate draft using 30 % more server memory than the baseline


@dataclass(frozen=True)
class Advice:
    rule: str
    advice: str
    evidence: str


def _rate(row: pd.Series) -> float | None:
    value = row.get("spec_decode_acceptance_rate")
    if value is not None and math.isfinite(value):
        return value / 100.0  # stored in percent, as vllm bench serve reports it
    alpha = row.get("acceptance_alpha")
    return alpha if alpha is not None and math.isfinite(alpha) else None


def advise(points: pd.DataFrame, crossings: list[Crossover], memory: dict[str, float]) -> list[Advice]:
    out: list[Advice] = []
    if points.empty:
        return out
    for (engine, method, k), group in points.groupby(["engine", "method", "k"], sort=True):
        name = f"{engine} {method} k={k}"
        low = group.loc[group["request_rate"].idxmin()]
        rate = _rate(low)
        if rate is not None and rate < LOW_ACCEPTANCE:
            closer = ("a smaller k (prompt lookup rarely matches that far ahead), or a draft model"
                      if method in ("ngram", "suffix") else "a draft closer to the target (or EAGLE/MTP heads)")  # fmt: skip
            out.append(Advice("acceptance < 0.6", f"{name}: use {closer}",
                              f"acceptance {rate:.2f} at {low['request_rate']:g} req/s"))  # fmt: skip
        if rate is not None and rate > HIGH_ACCEPTANCE:
            out.append(Advice("acceptance > 0.9", f"{name}: try a larger k; most drafts are accepted",
                              f"acceptance {rate:.2f} at {low['request_rate']:g} req/s"))  # fmt: skip
        high = group.loc[group["request_rate"].idxmax()]
        tput = high.get("output_throughput_ratio")
        if tput is not None and math.isfinite(tput) and tput < 1 / (1 + THROUGHPUT_NOISE) and len(group) > 1:
            out.append(Advice("throughput lost at high load",
                              f"{name}: disable speculation at {high['request_rate']:g} req/s and above",
                              f"output throughput {tput:.2f}x the baseline's at {high['request_rate']:g} req/s"))  # fmt: skip
        ttft = group["speedup_median_ttft"].dropna()
        if not ttft.empty and ttft.min() < TTFT_REGRESSION:
            worst = group.loc[ttft.idxmin()]
            fix = "a smaller k" if method in ("ngram", "suffix") else "a smaller k, or ngram (no draft model to prefill)"
            out.append(Advice("TTFT regression", f"{name}: use {fix}",
                              f"median TTFT {1 / worst['speedup_median_ttft']:.2f}x the baseline's at "
                              f"{worst['request_rate']:g} req/s"))  # fmt: skip
    for cross in crossings:
        if cross.rate is not None:
            out.append(Advice("throughput lost at high load",
                              f"{cross.engine} {cross.method} k={cross.k}: disable speculation above "
                              f"~{cross.rate:.1f} req/s", cross.text))  # fmt: skip
    for key, ratio in memory.items():
        if ratio > DRAFT_MEMORY_RATIO:
            out.append(Advice("high memory with a separate draft", f"{key}: EAGLE or Medusa heads cost less memory",
                              f"server memory {ratio:.2f}x the baseline's"))  # fmt: skip
    return out


def k_schedule(points: pd.DataFrame, baseline_e2el_s: dict[float, float], method: str) -> dict | None:
    """The best k per load band as vLLM's ``num_speculative_tokens_per_batch_size``:
    ``[range_start, range_end, k]`` by batch size, inclusive. A rate's batch size is
    estimated by Little's law (rate x baseline median E2EL); a band where no k helps gets 0."""
    rows = points[points["method"] == method]
    if rows.empty or not baseline_e2el_s:
        return None
    bands: list[tuple[int, int]] = []
    for rate in sorted(rows["request_rate"].unique()):
        at_rate = rows[rows["request_rate"] == rate]
        helping = at_rate[at_rate["verdict"] == "helps"]
        best = int(helping.loc[helping["speedup_median_tpot"].idxmax(), "k"]) if not helping.empty else 0
        e2el = baseline_e2el_s.get(float(rate))
        batch = max(1, math.ceil(rate * e2el)) if e2el and math.isfinite(rate) else None
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
    return {"method": method, "num_speculative_tokens": max(k for _, _, k in schedule) or 1,
            "num_speculative_tokens_per_batch_size": schedule}  # fmt: skip
