"""Every metric a window records and a comparison judges, declared once: its name, unit and
direction, how its ratio against the baseline is formed, and what ``vllm bench serve``, AIPerf
and GuideLLM call it.

The name is the summary key, the MLflow metric and the ``summary.csv`` column. The table, the
report, the gate, the figures and docs/metrics.md read these declarations
(``tests/unit/test_measures.py`` holds the page to them). Pure: imports nothing of the pipeline.

The peers' names, and where a peer defines a quantity differently:
- vLLM: the keys of ``vllm bench serve``'s result JSON (``vllm/benchmarks/serve.py``).
- AIPerf: the metric's ``tag`` (``aiperf/metrics/types/``), with the statistic of its summary
  for a per-request metric (counts and throughputs are one value per run there).
  AIPerf's ``inter_token_latency`` is ``(request latency - TTFT) / (output tokens - 1)``,
  vLLM's TPOT; its ``inter_chunk_latency`` is the gap between chunks, vLLM's ITL.
- GuideLLM: the field of its ``GenerativeMetrics`` (``guidellm/benchmark/schemas/metrics.py``)
  and the statistic of its distribution. GuideLLM's ``inter_token_latency_ms`` is vLLM's TPOT;
  its ``time_per_output_token_ms`` counts the first token too; its ``request_latency`` is in
  seconds; it has no per-chunk latency.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum


class Better(StrEnum):
    LOWER = "lower"
    HIGHER = "higher"


@dataclass(frozen=True)
class Measure:
    name: str  # the summary key, MLflow metric and summary.csv column
    unit: str
    better: Better | None  # None: neither way is better (a count, a duration)
    what: str
    vllm: str | None = None  # vllm bench serve's result key
    aiperf: str | None = None  # AIPerf's metric tag and statistic
    guidellm: str | None = None  # GuideLLM's metric and statistic
    field: str | None = None  # a latency statistic's per-request field: ttft, tpot, itl or e2el
    percentile: float | None = None  # its statistic: 50 (median) or 99; None for the mean or a window figure
    ratio: str | None = None  # the name of its comparison with the baseline, where one is formed

    @property
    def ratio_formula(self) -> str:
        """How its ratio is formed, so that > 1 always means speculation is better."""
        if self.better is Better.LOWER:
            return f"baseline {self.name} / speculative {self.name}"
        return f"speculative {self.name} / baseline {self.name}"


# Per-request latencies: what each is in vLLM's terms, and the peers' names for it.
_LATENCIES = {
    "ttft": ("time to first token", "time_to_first_token", "time_to_first_token_ms"),
    "tpot": ("time per output token, the first excluded", "inter_token_latency", "inter_token_latency_ms"),
    "itl": ("gap between token-bearing chunks, pooled", "inter_chunk_latency", None),
    "e2el": ("end-to-end latency", "request_latency", "request_latency"),
}
# The statistics recorded of each, with the peers' names for them; the ratio formed where one is.
_STATISTICS = {
    "mean": ("avg", "mean", None),
    "median": ("p50", "median", 50.0),
    "std": ("std", "std_dev", None),
    "p90": ("p90", "p90", None),
    "p99": ("p99", "p99", 99.0),
}
_COMPARED = {("median", "tpot"), ("p99", "tpot"), ("median", "ttft"), ("median", "itl"), ("median", "e2el")}


def _latencies() -> Iterator[Measure]:
    for field, (what, aiperf, guidellm) in _LATENCIES.items():
        for stat, (aiperf_stat, guidellm_stat, percentile) in _STATISTICS.items():
            name = f"{stat}_{field}_ms"
            yield Measure(
                name,
                "ms",
                Better.LOWER,
                f"the {stat} {what} over the window's successful requests",
                vllm=name,
                aiperf=f"{aiperf}.{aiperf_stat}",
                guidellm=f"{guidellm}.successful.{guidellm_stat}" if guidellm else None,
                field=field,
                percentile=percentile if stat in ("median", "p99") else None,
                ratio=f"speedup_{stat}_{field}" if (stat, field) in _COMPARED else None,
            )


_WINDOW = (
    Measure("completed", "requests", None, "successful requests", "completed", "request_count"),
    Measure("failed", "requests", Better.LOWER, "failed requests", "failed", "error_request_count"),
    Measure("duration", "s", None, "the window, from its time origin to the last answer", "duration"),
    Measure(
        "request_throughput",
        "requests/s",
        Better.HIGHER,
        "successful requests per second of the window",
        "request_throughput",
        "request_throughput",
        "requests_per_second.successful.mean",
    ),
    Measure(
        "output_throughput",
        "tokens/s",
        Better.HIGHER,
        "output tokens per second of the window",
        "output_throughput",
        "output_token_throughput",
        "output_tokens_per_second.successful.mean",
        ratio="output_throughput_ratio",
    ),
    Measure(
        "total_token_throughput",
        "tokens/s",
        Better.HIGHER,
        "prompt and output tokens per second of the window",
        "total_token_throughput",
        None,
        "tokens_per_second.successful.mean",
    ),
    Measure(
        "request_goodput",
        "requests/s",
        Better.HIGHER,
        "requests per second that met every SLO threshold",
        "request_goodput",
        "goodput",
    ),
)
_ACCEPTANCE = (
    Measure(
        "acceptance_length",
        "tokens/step",
        Better.HIGHER,
        "L, tokens per verification step on the one scale of every engine",
        None,
        None,
        None,
    ),
    Measure(
        "spec_decode_acceptance_rate",
        "%",
        Better.HIGHER,
        "accepted / drafted tokens over the window (vLLM's counters)",
        "spec_decode_acceptance_rate",
    ),
    Measure(
        "spec_decode_acceptance_length",
        "tokens/step",
        Better.HIGHER,
        "1 + accepted / drafts over the window (vLLM's counters)",
        "spec_decode_acceptance_length",
    ),
)

MEASURES: dict[str, Measure] = {m.name: m for m in (*_latencies(), *_WINDOW, *_ACCEPTANCE)}
# Each comparison with the baseline, by its own name: speedup_median_tpot -> median_tpot_ms.
COMPARISONS: dict[str, Measure] = {m.ratio: m for m in MEASURES.values() if m.ratio}

# The names every module reads, each spelled here once.
MEDIAN_TPOT = MEASURES["median_tpot_ms"]
P99_TPOT = MEASURES["p99_tpot_ms"]
MEDIAN_TTFT = MEASURES["median_ttft_ms"]
MEDIAN_E2EL = MEASURES["median_e2el_ms"]
OUTPUT_THROUGHPUT = MEASURES["output_throughput"]
ACCEPTANCE_LENGTH = MEASURES["acceptance_length"]
ACCEPTANCE_RATE = MEASURES["spec_decode_acceptance_rate"]
