"""A point as a ``vllm bench serve`` result JSON, so that scripts written for vLLM's files read ours.

The top-level keys, their order and their units are those of vLLM 0.32's writer
(``vllm/benchmarks/serve.py``: ``benchmark()`` builds the result, ``main()`` adds the setup and
traffic keys and drops the per-request arrays unless ``--save-detailed``), as if it had run with
``--percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 90,99``: we summarise all four
latencies at both percentiles. Where vLLM's own numbers need what only its client sees, ours stand
in: request start times are offsets from the window's start (vLLM's are ``perf_counter`` values;
only differences mean anything in either); the chat stream's role-only first chunk is no token
for us, so ``itls`` has one gap fewer per request; and a statistic with nothing to summarise is
0.0, as vLLM writes it (the summary keeps NaN), so that the file is strict JSON.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.config import JobConfig
from pipeline.load.client import RequestRecord
from pipeline.load.metrics import PERCENTILES

FILE_NAME = "vllm_result.json"
# Our endpoint -> vLLM bench serve's --backend for it.
BACKENDS = {"chat": "openai-chat", "completions": "openai", "generate": "sglang"}
DETAILED = ("input_lens", "output_lens", "ttfts", "itls", "start_times", "generated_texts", "errors")
SPEC_KEYS = (
    "spec_decode_acceptance_rate",
    "spec_decode_acceptance_length",
    "spec_decode_num_drafts",
    "spec_decode_draft_tokens",
    "spec_decode_accepted_tokens",
)


@dataclass(frozen=True)
class Setup:
    """What vLLM's writer records of how it was run."""

    endpoint: str  # ours: chat | completions | generate
    model_id: str
    tokenizer_id: str
    num_prompts: int
    request_rate: float
    burstiness: float
    max_concurrency: int | None
    label: str | None = None


def setup_of(job: JobConfig, label: str, num_prompts: int) -> Setup:
    load = job.load
    return Setup(
        job.workload.endpoint,
        job.model.id,
        job.model.id,
        num_prompts,
        load.request_rate,
        load.burstiness,
        load.max_concurrency,
        label,
    )


def write(
    path: Path,
    job: JobConfig,
    label: str,
    summary: Mapping[str, float],
    records: Sequence[RequestRecord],
    detailed: bool,
    prompt_lens: Mapping[int, int | None] | None = None,
) -> None:
    """``detailed``: the sweep's tracking.vllm_result is "detailed" (per-request arrays too)."""
    data = result(setup_of(job, label, len(records)), summary, records, detailed, prompt_lens)
    path.write_text(json.dumps(data, allow_nan=False))


def _number(value: object) -> float:
    """vLLM's value for a statistic over nothing: 0.0 (``np.mean(x or 0)``), never NaN."""
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else 0.0


def result(
    setup: Setup,
    summary: Mapping[str, float],
    records: Sequence[RequestRecord],
    detailed: bool,
    prompt_lens: Mapping[int, int | None] | None = None,
) -> dict:
    """``prompt_lens``: each request's prompt length by the model's tokenizer (by request index),
    for the requests that failed before the server said (vLLM's dataset count)."""
    backend = BACKENDS[setup.endpoint]
    known = prompt_lens or {}
    goodput = summary.get("request_goodput")
    out: dict[str, Any] = {
        "date": time.strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": backend,
        "backend": backend,
        "label": setup.label,
        "model_id": setup.model_id,
        "tokenizer_id": setup.tokenizer_id,
        "num_prompts": setup.num_prompts,
        "request_rate": float(setup.request_rate) if math.isfinite(setup.request_rate) else "inf",
        "burstiness": setup.burstiness,
        "max_concurrency": setup.max_concurrency,
        "duration": _number(summary["duration"]),
        "completed": int(summary["completed"]),
        "failed": int(summary["failed"]),
        "total_input_tokens": int(summary["total_input_tokens"]),
        "total_output_tokens": int(summary["total_output_tokens"]),
        "request_throughput": _number(summary["request_throughput"]),
        "request_goodput": None if goodput is None else _number(goodput),  # None without thresholds, as vLLM
        "output_throughput": _number(summary["output_throughput"]),
        "total_token_throughput": _number(summary["total_token_throughput"]),
        # A failed request is all zeros and empty, as vLLM's RequestFuncOutput defaults are.
        "input_lens": [r.prompt_tokens or known.get(r.index) or 0 for r in records],
        "output_lens": [(r.output_tokens or 0) if r.ok else 0 for r in records],
        "ttfts": [(r.ttft_s or 0.0) if r.ok else 0.0 for r in records],
        "itls": [list(r.itl_s) if r.ok else [] for r in records],
        "latencies": [(r.e2el_s or 0.0) if r.ok else 0.0 for r in records],
        "start_times": [r.sent_s for r in records],
        "queue_times": [r.queued_s for r in records],
        "generated_texts": [r.text if r.ok else "" for r in records],
        "errors": [r.error or "" for r in records],
        **peaks(records),
        "rtfx": 0.0,  # speech recognition only
    }
    out |= _speculative(summary)
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", *(f"p{p}" for p in PERCENTILES)):
            out[f"{stat}_{metric}_ms"] = _number(summary[f"{stat}_{metric}_ms"])
    if not detailed:
        for key in DETAILED:
            del out[key]
    return out


def _speculative(summary: Mapping[str, float]) -> dict[str, Any]:
    """vLLM's spec_decode_* fields, where the window measured acceptance (counts as integers)."""
    if "spec_decode_acceptance_rate" not in summary:
        return {}
    out: dict[str, Any] = {k: summary[k] for k in SPEC_KEYS if k in summary}
    for key in ("spec_decode_num_drafts", "spec_decode_draft_tokens", "spec_decode_accepted_tokens"):
        if key in out:
            out[key] = int(out[key])
    positions = sorted(int(k.rsplit("_", 1)[1]) for k in summary if k.startswith("spec_decode_acceptance_rate_pos_"))
    out["spec_decode_per_position_acceptance_rates"] = [
        summary[f"spec_decode_acceptance_rate_pos_{i}"] for i in positions
    ]
    return out


def peaks(records: Sequence[RequestRecord]) -> dict[str, float | int]:
    """vLLM's peak output rate and concurrency: per whole second from the first successful
    send, the chunks that arrived in it and the successful requests active in it."""
    ok = [r for r in records if r.ok and r.chunk_s]
    if not ok:
        return {"max_output_tokens_per_s": 0.0, "max_concurrent_requests": 0}
    first = min(r.sent_s for r in ok)
    seconds = int(np.ceil(max(r.chunk_s[-1] for r in ok) - first)) + 1
    chunks, active = np.zeros(seconds), np.zeros(seconds)
    for r in ok:
        for t in r.chunk_s:  # vLLM counts a chunk per ITL entry, however many tokens it carries
            bucket = int(t - first)
            if 0 <= bucket < seconds:
                chunks[bucket] += 1
        active[int(r.sent_s - first) : int(r.chunk_s[-1] - first) + 1] += 1
    return {"max_output_tokens_per_s": float(chunks.max()), "max_concurrent_requests": int(active.max())}
