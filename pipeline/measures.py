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


# Per-request latencies (vLLM's keys): TTFT, TPOT (the first token excluded), ITL (the gap
# between token-bearing chunks, pooled) and E2EL, each as mean, median, std, p90 and p99 over the
# window's successful requests; the medians, and TPOT's p99, are compared with the baseline.
_LATENCIES = (
    Measure(
        "mean_ttft_ms",
        "ms",
        Better.LOWER,
        "the mean time to first token over the window's successful requests",
        vllm="mean_ttft_ms",
        aiperf="time_to_first_token.avg",
        guidellm="time_to_first_token_ms.successful.mean",
        field="ttft",
    ),
    Measure(
        "median_ttft_ms",
        "ms",
        Better.LOWER,
        "the median time to first token over the window's successful requests",
        vllm="median_ttft_ms",
        aiperf="time_to_first_token.p50",
        guidellm="time_to_first_token_ms.successful.median",
        field="ttft",
        percentile=50.0,
        ratio="speedup_median_ttft",
    ),
    Measure(
        "std_ttft_ms",
        "ms",
        Better.LOWER,
        "the standard deviation of the time to first token over the window's successful requests",
        vllm="std_ttft_ms",
        aiperf="time_to_first_token.std",
        guidellm="time_to_first_token_ms.successful.std_dev",
        field="ttft",
    ),
    Measure(
        "p90_ttft_ms",
        "ms",
        Better.LOWER,
        "the p90 time to first token over the window's successful requests",
        vllm="p90_ttft_ms",
        aiperf="time_to_first_token.p90",
        guidellm="time_to_first_token_ms.successful.p90",
        field="ttft",
    ),
    Measure(
        "p99_ttft_ms",
        "ms",
        Better.LOWER,
        "the p99 time to first token over the window's successful requests",
        vllm="p99_ttft_ms",
        aiperf="time_to_first_token.p99",
        guidellm="time_to_first_token_ms.successful.p99",
        field="ttft",
        percentile=99.0,
    ),
    Measure(
        "mean_tpot_ms",
        "ms",
        Better.LOWER,
        "the mean time per output token (the first excluded) over the window's successful requests",
        vllm="mean_tpot_ms",
        aiperf="inter_token_latency.avg",
        guidellm="inter_token_latency_ms.successful.mean",
        field="tpot",
    ),
    Measure(
        "median_tpot_ms",
        "ms",
        Better.LOWER,
        "the median time per output token (the first excluded) over the window's successful requests",
        vllm="median_tpot_ms",
        aiperf="inter_token_latency.p50",
        guidellm="inter_token_latency_ms.successful.median",
        field="tpot",
        percentile=50.0,
        ratio="speedup_median_tpot",
    ),
    Measure(
        "std_tpot_ms",
        "ms",
        Better.LOWER,
        "the standard deviation of the time per output token (the first excluded) over the window's successful requests",
        vllm="std_tpot_ms",
        aiperf="inter_token_latency.std",
        guidellm="inter_token_latency_ms.successful.std_dev",
        field="tpot",
    ),
    Measure(
        "p90_tpot_ms",
        "ms",
        Better.LOWER,
        "the p90 time per output token (the first excluded) over the window's successful requests",
        vllm="p90_tpot_ms",
        aiperf="inter_token_latency.p90",
        guidellm="inter_token_latency_ms.successful.p90",
        field="tpot",
    ),
    Measure(
        "p99_tpot_ms",
        "ms",
        Better.LOWER,
        "the p99 time per output token (the first excluded) over the window's successful requests",
        vllm="p99_tpot_ms",
        aiperf="inter_token_latency.p99",
        guidellm="inter_token_latency_ms.successful.p99",
        field="tpot",
        percentile=99.0,
        ratio="speedup_p99_tpot",
    ),
    Measure(
        "mean_itl_ms",
        "ms",
        Better.LOWER,
        "the mean gap between token-bearing chunks, pooled over the window's successful requests",
        vllm="mean_itl_ms",
        aiperf="inter_chunk_latency.avg",
        field="itl",
    ),
    Measure(
        "median_itl_ms",
        "ms",
        Better.LOWER,
        "the median gap between token-bearing chunks, pooled over the window's successful requests",
        vllm="median_itl_ms",
        aiperf="inter_chunk_latency.p50",
        field="itl",
        percentile=50.0,
        ratio="speedup_median_itl",
    ),
    Measure(
        "std_itl_ms",
        "ms",
        Better.LOWER,
        "the standard deviation of the gap between token-bearing chunks, pooled over the window's successful requests",
        vllm="std_itl_ms",
        aiperf="inter_chunk_latency.std",
        field="itl",
    ),
    Measure(
        "p90_itl_ms",
        "ms",
        Better.LOWER,
        "the p90 gap between token-bearing chunks, pooled over the window's successful requests",
        vllm="p90_itl_ms",
        aiperf="inter_chunk_latency.p90",
        field="itl",
    ),
    Measure(
        "p99_itl_ms",
        "ms",
        Better.LOWER,
        "the p99 gap between token-bearing chunks, pooled over the window's successful requests",
        vllm="p99_itl_ms",
        aiperf="inter_chunk_latency.p99",
        field="itl",
        percentile=99.0,
    ),
    Measure(
        "mean_e2el_ms",
        "ms",
        Better.LOWER,
        "the mean end-to-end latency over the window's successful requests",
        vllm="mean_e2el_ms",
        aiperf="request_latency.avg",
        guidellm="request_latency.successful.mean",
        field="e2el",
    ),
    Measure(
        "median_e2el_ms",
        "ms",
        Better.LOWER,
        "the median end-to-end latency over the window's successful requests",
        vllm="median_e2el_ms",
        aiperf="request_latency.p50",
        guidellm="request_latency.successful.median",
        field="e2el",
        percentile=50.0,
        ratio="speedup_median_e2el",
    ),
    Measure(
        "std_e2el_ms",
        "ms",
        Better.LOWER,
        "the standard deviation of the end-to-end latency over the window's successful requests",
        vllm="std_e2el_ms",
        aiperf="request_latency.std",
        guidellm="request_latency.successful.std_dev",
        field="e2el",
    ),
    Measure(
        "p90_e2el_ms",
        "ms",
        Better.LOWER,
        "the p90 end-to-end latency over the window's successful requests",
        vllm="p90_e2el_ms",
        aiperf="request_latency.p90",
        guidellm="request_latency.successful.p90",
        field="e2el",
    ),
    Measure(
        "p99_e2el_ms",
        "ms",
        Better.LOWER,
        "the p99 end-to-end latency over the window's successful requests",
        vllm="p99_e2el_ms",
        aiperf="request_latency.p99",
        guidellm="request_latency.successful.p99",
        field="e2el",
        percentile=99.0,
    ),
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

MEASURES: dict[str, Measure] = {m.name: m for m in (*_LATENCIES, *_WINDOW, *_ACCEPTANCE)}

# The names every module reads, each spelled here once.
MEDIAN_TPOT = MEASURES["median_tpot_ms"]
P99_TPOT = MEASURES["p99_tpot_ms"]
MEDIAN_TTFT = MEASURES["median_ttft_ms"]
MEDIAN_E2EL = MEASURES["median_e2el_ms"]
OUTPUT_THROUGHPUT = MEASURES["output_throughput"]
ACCEPTANCE_LENGTH = MEASURES["acceptance_length"]
ACCEPTANCE_RATE = MEASURES["spec_decode_acceptance_rate"]

# Each comparison with the baseline, by its own name (speedup_median_tpot -> median_tpot_ms), in
# the order the report lists them; a comparison's replicates are seeded by its place here.
COMPARISONS: dict[str, Measure] = {
    m.ratio: m
    for m in (MEDIAN_TPOT, P99_TPOT, MEDIAN_TTFT, MEASURES["median_itl_ms"], MEDIAN_E2EL, OUTPUT_THROUGHPUT)
    if m.ratio
}
