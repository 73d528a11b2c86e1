"""The fields of a streamed chunk that the load client reads (OpenAI-style and SGLang's /generate), decoded by msgspec.

Only these fields are decoded; the rest of a chunk is skipped, which keeps the client's
per-token cost low enough for the rates it must drive.
"""

from __future__ import annotations

from typing import Any

import msgspec


class Delta(msgspec.Struct):
    role: str | None = None
    content: str | None = None
    # A reasoning parser streams thinking here (vLLM: reasoning_content, later reasoning).
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[Any] | None = None


class Choice(msgspec.Struct):
    delta: Delta | None = None  # chat
    text: str | None = None  # completions
    finish_reason: str | None = None


class Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class SpeculativeDecoding(msgspec.Struct):
    """vLLM's per-request acceptance (``--per-request-spec-decode-metrics summary``, vLLM 0.32):
    counted at the same verify steps as its ``vllm:spec_decode_*`` counters."""

    num_spec_steps: int | None = None  # verify steps that carried drafts: the counters' "drafts"
    num_accepted_draft_tokens: int | None = None
    num_draft_tokens: int | None = None


class RequestMetrics(msgspec.Struct):
    speculative_decoding: SpeculativeDecoding | None = None


class Chunk(msgspec.Struct):
    """The fields of a streamed chunk that the measurement reads; the rest is skipped."""

    choices: list[Choice] = []
    usage: Usage | None = None
    # vLLM puts a request's own metrics on the final usage chunk (include_usage streams only).
    metrics: RequestMetrics | None = None
    error: Any = None


decode_chunk = msgspec.json.Decoder(Chunk).decode


class MetaInfo(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    spec_verify_ct: int | None = None
    finish_reason: Any = None  # null, or {"type": "length" | "stop" | ..., ...}


class GenerateChunk(msgspec.Struct):
    """A chunk of SGLang's native ``/generate`` stream."""

    text: str = ""
    meta_info: MetaInfo | None = None
    error: Any = None


decode_generate = msgspec.json.Decoder(GenerateChunk).decode
