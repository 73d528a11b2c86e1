"""From request records to a flat summary, and from two summaries to a comparison.

Pure functions. Key names and units are those of ``vllm bench serve``'s result JSON
(``median_tpot_ms``, ``output_throughput`` in tokens/s, ...), so users can diff the two;
they are also the MLflow metric names and the DataFrame columns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.config import SloConfig
from pipeline.load.client import RequestRecord
from pipeline.load.slo import SloTarget, good
from pipeline.measures import COMPARISONS, Better

PERCENTILES = (90, 99)


def _stats(prefix: str, values_s: Sequence[float]) -> dict[str, float]:
    """mean/median/std/p90/p99 in milliseconds; NaN when there is nothing to summarise."""
    names = ["mean", "median", "std", *(f"p{p}" for p in PERCENTILES)]
    if not values_s:
        return {f"{n}_{prefix}_ms": math.nan for n in names}
    ms = np.asarray(values_s, dtype=float) * 1000.0
    out = {
        f"mean_{prefix}_ms": float(ms.mean()),
        f"median_{prefix}_ms": float(np.median(ms)),
        f"std_{prefix}_ms": float(ms.std()),
    }
    for p in PERCENTILES:
        out[f"p{p}_{prefix}_ms"] = float(np.percentile(ms, p))
    return out


def good_requests(ok: Sequence[RequestRecord], target: SloTarget) -> int:
    """How many successful requests meet every threshold (the SLO module's rule)."""

    def column(values: Sequence[float | None]) -> np.ndarray:
        return np.asarray([math.nan if v is None else v for v in values], dtype=float)

    values = {
        "ttft": column([r.ttft_s for r in ok]),
        "tpot": column([r.tpot_s for r in ok]),
        "e2el": column([r.e2el_s for r in ok]),
    }
    return int(good(values, len(ok), target).sum())


def client_health(records: Sequence[RequestRecord], target_rate: float) -> dict[str, float]:
    """Was the client on schedule? Lateness excludes deliberate max_concurrency queueing."""
    if not records:
        return {}
    lateness_ms = np.asarray([r.lateness_s for r in records]) * 1000.0
    sends = sorted(r.sent_s for r in records)
    span = sends[-1] - sends[0]
    return {
        "send_lateness_p50_ms": float(np.percentile(lateness_ms, 50)),
        "send_lateness_p99_ms": float(np.percentile(lateness_ms, 99)),
        "send_lateness_max_ms": float(lateness_ms.max()),
        "target_request_rate": target_rate,
        "achieved_request_rate": (len(sends) - 1) / span if span > 0 else math.inf,
    }


def summarize(
    records: Sequence[RequestRecord], duration_s: float, slo: SloConfig, target_rate: float = math.nan
) -> dict[str, float]:
    ok = [r for r in records if r.ok]
    output_tokens = sum(r.output_tokens or 0 for r in ok)
    input_tokens = sum(r.prompt_tokens or 0 for r in ok)
    summary: dict[str, float] = {
        "completed": float(len(ok)),
        "failed": float(len(records) - len(ok)),
        "error_rate": (len(records) - len(ok)) / len(records) if records else math.nan,
        "duration": duration_s,
        "total_input_tokens": float(input_tokens),
        "total_output_tokens": float(output_tokens),
        "request_throughput": len(ok) / duration_s if duration_s > 0 else math.nan,
        "output_throughput": output_tokens / duration_s if duration_s > 0 else math.nan,
        "total_token_throughput": (input_tokens + output_tokens) / duration_s if duration_s > 0 else math.nan,
    }
    target = SloTarget.from_config(slo)
    if target.active:
        met = good_requests(ok, target)
        summary["request_goodput"] = met / duration_s if duration_s > 0 else math.nan
    summary |= client_health(records, target_rate)
    summary |= _stats("ttft", [r.ttft_s for r in ok if r.ttft_s is not None])
    summary |= _stats("tpot", [r.tpot_s for r in ok if r.tpot_s is not None])
    summary |= _stats("itl", [gap for r in ok for gap in r.itl_s])
    summary |= _stats("e2el", [r.e2el_s for r in ok if r.e2el_s is not None])
    summary |= by_category(records)
    summary |= per_request_acceptance(records)
    return summary


def per_request_acceptance(records: Sequence[RequestRecord]) -> dict[str, float]:
    """The window's acceptance summed from the requests' own figures (vLLM's per-request
    metrics): over every request that reported them, failed ones included, since the
    ``/metrics`` counters count those steps too. Equal to the counter differences when every
    step of the window belongs to a request that reported (docs/traces.md)."""
    counted = [r for r in records if r.spec_steps is not None]
    if not counted:
        return {}
    steps = float(sum(r.spec_steps or 0 for r in counted))
    accepted = float(sum(r.spec_accepted_tokens or 0 for r in counted))
    drafted = float(sum(r.spec_draft_tokens or 0 for r in counted))
    return {
        "spec_requests_counted": float(len(counted)),
        "spec_request_steps": steps,
        "spec_request_accepted_tokens": accepted,
        "spec_request_draft_tokens": drafted,
        "spec_request_acceptance_length": 1.0 + accepted / steps if steps else math.nan,
        "spec_request_acceptance_rate": 100.0 * accepted / drafted if drafted else math.nan,
    }


CATEGORY_KEYS = ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_e2el_ms", "p99_e2el_ms")


def by_category(records: Sequence[RequestRecord]) -> dict[str, float]:
    """Latency summaries per workload category, as ``category.<name>.<metric>``.

    Acceptance differs by kind of text (code editing gains where chat may lose), so an
    overall median can hide both. Throughputs are left out: categories share one window.
    """
    categories = sorted({r.category for r in records})
    if len(categories) < 2:
        return {}
    out: dict[str, float] = {}
    for category in categories:
        ok = [r for r in records if r.category == category and r.ok]
        stats = {
            **_stats("ttft", [r.ttft_s for r in ok if r.ttft_s is not None]),
            **_stats("tpot", [r.tpot_s for r in ok if r.tpot_s is not None]),
            **_stats("e2el", [r.e2el_s for r in ok if r.e2el_s is not None]),
        }
        out[f"category.{category}.completed"] = float(len(ok))
        out |= {f"category.{category}.{k}": stats[k] for k in CATEGORY_KEYS}
    return out


@dataclass(frozen=True)
class Comparison:
    """How many times better speculation is than its baseline, one ratio per comparison the
    metrics declare (:data:`pipeline.measures.COMPARISONS`); > 1 means better."""

    ratios: Mapping[str, float]

    def __getitem__(self, name: str) -> float:
        return self.ratios[name]

    def as_metrics(self) -> dict[str, float]:
        return dict(self.ratios)


def _ratio(numerator: float | None, denominator: float | None) -> float:
    if numerator is None or denominator is None or denominator == 0 or math.isnan(numerator) or math.isnan(denominator):
        return math.nan
    return numerator / denominator


def compare_summaries(baseline: Mapping[str, float], speculative: Mapping[str, float]) -> Comparison:
    """Each declared ratio, formed so that > 1 is better: baseline / speculative for a latency,
    speculative / baseline for a throughput."""
    ratios = {}
    for ratio, measure in COMPARISONS.items():
        base, spec = baseline.get(measure.name), speculative.get(measure.name)
        ratios[ratio] = _ratio(base, spec) if measure.better is Better.LOWER else _ratio(spec, base)
    return Comparison(ratios)
