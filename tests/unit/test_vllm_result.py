"""The pure part of the `vllm bench serve` result file: vLLM's zeros, never NaN, and its peaks."""

from __future__ import annotations

import json

from pipeline.config import SloConfig
from pipeline.load.client import RequestRecord
from pipeline.load.metrics import summarize
from pipeline.record import vllm_result

SETUP = vllm_result.Setup("chat", "m", "m", 2, 2, 1.0, None, "p")


def test_a_failed_window_is_strict_json_with_vllms_zeros_and_the_prompts_length() -> None:
    records = [RequestRecord(0, "c", 0.0, 0.0, error="HTTP 500"), RequestRecord(1, "c", 0.5, 0.5, error="HTTP 500")]
    out = vllm_result.result(SETUP, summarize(records, 1.0, SloConfig()), records, True, {0: 17, 1: 9})
    json.dumps(out, allow_nan=False)  # NaN is not JSON; vLLM writes 0.0 for a statistic over nothing
    assert out["median_tpot_ms"] == 0.0 and out["p99_itl_ms"] == 0.0 and out["request_goodput"] is None
    assert out["input_lens"] == [17, 9] and out["ttfts"] == [0.0, 0.0] and out["errors"] == ["HTTP 500"] * 2
    assert out["request_rate"] == 2.0 and isinstance(out["request_rate"], float)


def test_peaks_count_chunks_and_active_requests_per_whole_second_from_the_first_send() -> None:
    records = [
        RequestRecord(0, "c", 0.0, 0.0, chunk_s=(0.2, 0.4, 0.6, 1.1), prompt_tokens=4, output_tokens=4),
        RequestRecord(1, "c", 0.5, 0.5, chunk_s=(0.7, 0.9), prompt_tokens=4, output_tokens=2),
    ]
    assert vllm_result.peaks(records) == {"max_output_tokens_per_s": 5.0, "max_concurrent_requests": 2}
    out = vllm_result.result(SETUP, summarize(records, 1.2, SloConfig()), records, False)
    assert "itls" not in out and "latencies" in out and out["latencies"] == [1.1, 0.4]
