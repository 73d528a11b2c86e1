from __future__ import annotations

import math

import pytest

from pipeline.config import SloConfig
from pipeline.load.client import RequestRecord
from pipeline.load.metrics import compare_summaries, summarize


def rec(i: int, sent: float, chunks: list[float], tokens: int | None, error: str | None = None) -> RequestRecord:
    return RequestRecord(
        index=i,
        category="c",
        scheduled_s=sent,
        sent_s=sent,
        chunk_s=tuple(chunks),
        prompt_tokens=10,
        output_tokens=tokens,
        error=error,
    )


def test_summary_definitions() -> None:
    records = [
        rec(0, 0.0, [0.1, 0.2, 0.3], 5),  # ttft 100 ms, tpot (0.2/4)=50 ms, e2el 300 ms
        rec(1, 1.0, [1.2, 1.6], 3),  # ttft 200 ms, tpot 200 ms, e2el 600 ms
        rec(2, 1.5, [1.7], 1),  # one token: no TPOT
        rec(3, 2.0, [], None, error="HTTP 500"),
    ]
    s = summarize(records, duration_s=2.0, slo=SloConfig())
    assert s["completed"] == 3 and s["failed"] == 1 and s["error_rate"] == pytest.approx(0.25)
    assert s["total_output_tokens"] == 9 and s["output_throughput"] == pytest.approx(4.5)
    assert s["request_throughput"] == pytest.approx(1.5)
    assert s["total_input_tokens"] == 30
    assert s["median_ttft_ms"] == pytest.approx(200.0)
    assert s["mean_tpot_ms"] == pytest.approx(125.0)
    assert s["median_e2el_ms"] == pytest.approx(300.0)
    # ITL pools gaps across requests: 100, 100, 400 ms.
    assert s["mean_itl_ms"] == pytest.approx(200.0) and s["median_itl_ms"] == pytest.approx(100.0)
    assert "request_goodput" not in s  # no SLO configured


def test_goodput_counts_requests_meeting_every_slo() -> None:
    records = [rec(0, 0.0, [0.1, 0.2, 0.3], 5), rec(1, 1.0, [1.2, 1.6], 3)]
    s = summarize(records, duration_s=2.0, slo=SloConfig(ttft_ms=150, tpot_ms=100))
    assert s["request_goodput"] == pytest.approx(0.5)


def test_goodput_takes_a_one_token_request_tpot_as_zero() -> None:
    # vLLM's goodput: TPOT 0 for a request with <= 1 output token, so a TPOT SLO cannot fail it.
    s = summarize([rec(0, 0.0, [0.1], 1)], duration_s=1.0, slo=SloConfig(tpot_ms=10))
    assert s["request_goodput"] == pytest.approx(1.0)


def test_empty_window_is_nan_not_a_crash() -> None:
    s = summarize([rec(0, 0.0, [], None, error="x")], duration_s=1.0, slo=SloConfig())
    assert s["completed"] == 0 and math.isnan(s["median_tpot_ms"])


def test_comparison_is_baseline_over_speculative_for_latency() -> None:
    base = {
        "median_tpot_ms": 40.0,
        "median_e2el_ms": 4000.0,
        "median_ttft_ms": 500.0,
        "p99_tpot_ms": 50.0,
        "output_throughput": 25.0,
    }
    spec = {
        "median_tpot_ms": 18.0,
        "median_e2el_ms": 2000.0,
        "median_ttft_ms": 600.0,
        "p99_tpot_ms": 100.0,
        "output_throughput": 55.0,
    }
    c = compare_summaries(base, spec)
    assert c["speedup_median_tpot"] == pytest.approx(40 / 18)
    assert c["speedup_median_ttft"] == pytest.approx(500 / 600)  # < 1: a TTFT regression
    assert c["speedup_p99_tpot"] == pytest.approx(0.5)
    assert c["output_throughput_ratio"] == pytest.approx(2.2)
    assert math.isnan(compare_summaries(base, {**spec, "median_tpot_ms": math.nan})["speedup_median_tpot"])
    assert math.isnan(c["speedup_median_itl"])  # declared, and missing from both windows here: nan, never 1


def test_per_category_summaries_when_the_window_mixes_kinds() -> None:
    records = [
        RequestRecord(index=0, category="code_edit", scheduled_s=0, sent_s=0, chunk_s=(0.1, 0.2), output_tokens=3),
        RequestRecord(index=1, category="chat", scheduled_s=0, sent_s=0, chunk_s=(0.3, 0.9), output_tokens=3),
    ]
    s = summarize(records, duration_s=1.0, slo=SloConfig())
    assert s["category.code_edit.median_tpot_ms"] == pytest.approx(50.0)
    assert s["category.chat.median_ttft_ms"] == pytest.approx(300.0)
    assert s["category.chat.completed"] == 1
    single = summarize(records[:1], duration_s=1.0, slo=SloConfig())
    assert not any(k.startswith("category.") for k in single)


def test_per_request_acceptance_sums_over_every_request_that_reported_it() -> None:
    def rec(i: int, steps: int | None, accepted: int, drafted: int, error: str | None = None) -> RequestRecord:
        return RequestRecord(
            index=i,
            category="c",
            scheduled_s=0,
            sent_s=0,
            chunk_s=(0.1, 0.2),
            output_tokens=5,
            spec_steps=steps,
            spec_accepted_tokens=accepted,
            spec_draft_tokens=drafted,
            error=error,
        )

    # A failed request's steps count too: the counters it is checked against count them.
    records = [rec(0, 4, 6, 12), rec(1, 2, 1, 6, error="timed out"), rec(2, None, 0, 0)]
    out = summarize(records, 1.0, SloConfig())
    assert out["spec_requests_counted"] == 2 and out["spec_request_steps"] == 6
    assert out["spec_request_accepted_tokens"] == 7 and out["spec_request_draft_tokens"] == 18
    assert out["spec_request_acceptance_length"] == pytest.approx(1 + 7 / 6)
    assert out["spec_request_acceptance_rate"] == pytest.approx(100 * 7 / 18)
    assert "spec_request_steps" not in summarize([rec(0, None, 0, 0)], 1.0, SloConfig())
