"""An async streaming client for OpenAI-compatible servers that records, never raises.

Every request yields one :class:`RequestRecord`, successful or not: errors are data, as in
vLLM's ``RequestFuncOutput``. Times are offsets in seconds from the window start, read from
``clock`` (the system-wide monotonic clock, so worker processes share one time origin).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec

from pipeline.load.chunks import Delta, GenerateChunk, SpeculativeDecoding, decode_chunk, decode_generate
from pipeline.load.items import Request
from pipeline.load.sse import SSEDecoder

clock = time.monotonic


@dataclass(frozen=True)
class RequestRecord:
    index: int
    category: str
    scheduled_s: float  # offset from window start at which it was due
    sent_s: float  # offset from window start at which it was sent
    queued_s: float = 0.0  # of the lateness, the time spent waiting for a max_concurrency slot
    chunk_s: tuple[float, ...] = ()  # offsets of the chunks that carried text
    prompt_tokens: int | None = None
    output_tokens: int | None = None  # the server's usage.completion_tokens, never a chunk count
    finish_reason: str | None = None
    text: str = ""
    error: str | None = None
    # SGLang's meta_info.spec_verify_ct: verification steps this request took (native API only).
    spec_verify_ct: int | None = None
    # vLLM's per-request acceptance (metrics.speculative_decoding on the usage chunk): the
    # verify steps that carried drafts, and the draft tokens proposed and accepted in them.
    spec_steps: int | None = None
    spec_accepted_tokens: int | None = None
    spec_draft_tokens: int | None = None
    conversation: str = ""  # a trace's conversation id, and this request's turn in it
    turn: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def lateness_s(self) -> float:
        """How late the client sent it, deliberate queueing excluded: the client's own health."""
        return self.sent_s - self.scheduled_s - self.queued_s

    @property
    def end_s(self) -> float:
        """When its answer was complete (its last token's chunk), or when it was sent."""
        return self.chunk_s[-1] if self.chunk_s else self.sent_s

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_s[0] - self.sent_s if self.chunk_s else None

    @property
    def e2el_s(self) -> float | None:
        return self.chunk_s[-1] - self.sent_s if self.chunk_s else None

    @property
    def itl_s(self) -> tuple[float, ...]:
        # Per chunk, as vLLM's bench: under speculation one chunk may carry several tokens.
        # SGLang's bench instead spreads such a gap evenly over the chunk's tokens.
        return tuple(b - a for a, b in itertools.pairwise(self.chunk_s))

    @property
    def acceptance_length(self) -> float | None:
        """Tokens per verify step, the bonus token included, on vLLM's scale (1 + accepted /
        drafts). From SGLang's verify count: (completion tokens - 1) / verify steps, since the
        first token comes from prefill (the window's figure, sglang_acceptance.py)."""
        if self.spec_steps and self.spec_accepted_tokens is not None:
            return 1.0 + self.spec_accepted_tokens / self.spec_steps
        if self.spec_verify_ct and self.output_tokens:
            return (self.output_tokens - 1) / self.spec_verify_ct
        return None

    @property
    def tpot_s(self) -> float | None:
        if not self.ok or self.output_tokens is None or self.output_tokens <= 1 or not self.chunk_s:
            return None
        return (self.chunk_s[-1] - self.chunk_s[0]) / (self.output_tokens - 1)

    def as_row(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "category": self.category,
            "scheduled_s": self.scheduled_s,
            "sent_s": self.sent_s,
            "queued_s": self.queued_s,
            "ttft_s": self.ttft_s,
            "e2el_s": self.e2el_s,
            "tpot_s": self.tpot_s,
            "num_chunks": len(self.chunk_s),
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "finish_reason": self.finish_reason,
            "error": self.error,
            "spec_verify_ct": self.spec_verify_ct,
            "spec_steps": self.spec_steps,
            "spec_accepted_tokens": self.spec_accepted_tokens,
            "spec_draft_tokens": self.spec_draft_tokens,
            "acceptance_length": self.acceptance_length,
            "conversation_id": self.conversation,
            "turn": self.turn,
            "text": self.text,
            "chunk_s": json.dumps([round(t, 6) for t in self.chunk_s]),
        }


def auth_headers() -> dict[str, str]:
    """A bearer token from OPENAI_API_KEY, as ``vllm bench serve`` sends one: how a server
    started with --api-key (an external deployment, typically) is reached. The key is read
    from the environment each time and never written anywhere."""
    key = os.environ.get("OPENAI_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


@dataclass(frozen=True)
class ClientOptions:
    base_url: str
    model: str
    endpoint: str = "chat"  # chat | completions | generate (SGLang's native API)
    temperature: float = 0.0
    ignore_eos: bool = False
    timeout_s: float = 300.0
    headers: dict[str, str] = field(default_factory=auth_headers, repr=False)


def request_body(req: Request, opts: ClientOptions) -> tuple[str, dict[str, Any]]:
    if opts.endpoint == "generate":
        params: dict[str, Any] = {"max_new_tokens": req.max_tokens, "temperature": opts.temperature}
        if opts.ignore_eos:
            params["ignore_eos"] = True
        prompt: dict[str, Any] = {"input_ids": list(req.prompt_ids)} if req.prompt_ids else {"text": req.prompt}
        return "/generate", {**prompt, "sampling_params": params, "stream": True}
    body: dict[str, Any] = {
        "model": opts.model,
        "max_tokens": req.max_tokens,
        "temperature": opts.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if opts.ignore_eos:
        body["ignore_eos"] = True  # a vLLM and SGLang extension
    if opts.endpoint == "chat":
        # Raw prompt: the server applies the chat template, once.
        body["messages"] = list(req.messages) or [{"role": "user", "content": req.prompt}]
        return "/v1/chat/completions", body
    # A lengths-only trace line's token ids, as vLLM's bench sends them: exactly its length.
    body["prompt"] = list(req.prompt_ids) if req.prompt_ids else req.prompt
    return "/v1/completions", body


class _Stream:
    """What a stream has said so far, fed one payload at a time; tells which chunks carry tokens."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.pieces: list[str] = []
        self.finish: str | None = None
        self.prompt_tokens: int | None = None
        self.output_tokens: int | None = None
        self.verify_ct: int | None = None
        self.spec: SpeculativeDecoding | None = None
        self.has_usage = False

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def feed(self, payload: bytes) -> bool:
        """Take one payload; True if it carried output tokens."""
        if self.endpoint == "generate":
            return self._feed_generate(decode_generate(payload))
        chunk = decode_chunk(payload)
        if chunk.error is not None:
            raise _HTTPStatus(f"server error in stream: {chunk.error}")
        if chunk.usage is not None:
            self.has_usage = True
            self.prompt_tokens, self.output_tokens = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
        if chunk.metrics is not None and chunk.metrics.speculative_decoding is not None:
            self.spec = chunk.metrics.speculative_decoding
        if not chunk.choices:
            return False  # the usage trailer carries no token
        choice = chunk.choices[0]
        self.finish = choice.finish_reason or self.finish
        if self.endpoint != "chat":
            # As in vLLM's bench: any chunk with a choice is a token event; its text may be
            # empty (a special token), and the finish chunk marks the last decode step.
            self.pieces.append(choice.text or "")
            return True
        delta = choice.delta or Delta()
        self.pieces.append(delta.content or "")
        # vLLM's bench counts every chunk with a choice. One exception, on purpose: a chunk
        # that carries only the role is no token (vLLM sends it with the first token, but a
        # server that sends it before prefill would make TTFT meaningless).
        role_only = not (delta.content or delta.reasoning_content or delta.reasoning or delta.tool_calls)
        return not (role_only and delta.role is not None and choice.finish_reason is None)

    def _feed_generate(self, chunk: GenerateChunk) -> bool:
        if chunk.error is not None:
            raise _HTTPStatus(f"server error in stream: {chunk.error}")
        meta = chunk.meta_info
        if meta is None:
            return False
        # A token-bearing chunk is one whose completion count grew: text alone can be empty
        # (a token that decodes to nothing yet), and one chunk may carry several tokens.
        grew = (meta.completion_tokens or 0) > (self.output_tokens or 0)
        # SGLang streams the text so far unless the server runs with --stream-output.
        so_far = self.text
        self.pieces = [chunk.text] if chunk.text.startswith(so_far) else [so_far, chunk.text]
        self.has_usage = meta.completion_tokens is not None
        self.prompt_tokens, self.output_tokens = meta.prompt_tokens, meta.completion_tokens
        self.verify_ct = meta.spec_verify_ct if meta.spec_verify_ct is not None else self.verify_ct
        if isinstance(meta.finish_reason, dict):
            self.finish = str(meta.finish_reason.get("type"))
        return grew


async def _read_stream(response: aiohttp.ClientResponse, stream: _Stream, chunks: list[float], t0: float) -> bool:
    """Feed the SSE payloads to ``stream`` and time each token-bearing one; True once [DONE] came."""
    if response.status != 200:
        detail = (await response.read()).decode(errors="replace")[:500]
        raise _HTTPStatus(f"HTTP {response.status}: {detail}")
    decoder = SSEDecoder()
    async for data in response.content.iter_any():
        now = clock()  # one reading per read: events in one read arrived together
        for payload in decoder.feed(data):
            if payload == b"[DONE]":
                return True
            if stream.feed(payload):
                chunks.append(now - t0)
    return False


def _incomplete(done: bool, stream: _Stream, chunks: Sequence[float]) -> str | None:
    """Why a stream that ended without a transport error is still a failed request."""
    if not done:
        return "stream ended before [DONE]"
    if not stream.has_usage or stream.output_tokens is None:
        return "no usage.completion_tokens in the stream; the server ignored stream_options.include_usage"
    if not chunks:
        return "the stream carried no token"  # vLLM's bench marks it failed: it has no TTFT to report
    return None


async def send(
    session: aiohttp.ClientSession,
    req: Request,
    opts: ClientOptions,
    scheduled_s: float,
    t0: float,
    queued_s: float = 0.0,
) -> RequestRecord:
    path, body = request_body(req, opts)
    chunks: list[float] = []
    stream = _Stream(opts.endpoint)
    sent = clock()
    try:
        async with asyncio.timeout(opts.timeout_s):
            async with session.post(opts.base_url + path, json=body, headers=opts.headers) as response:
                done = await _read_stream(response, stream, chunks, t0)
        error = _incomplete(done, stream, chunks)
    except TimeoutError:
        error = f"timed out after {opts.timeout_s:g} s (load.request_timeout_s)"
    except _HTTPStatus as exc:
        error = str(exc)
    except msgspec.DecodeError as exc:
        error = f"malformed stream chunk: {exc}"
    except aiohttp.ClientError as exc:
        error = f"{type(exc).__name__}: {exc}"
    spec = stream.spec
    return RequestRecord(
        index=req.index,
        category=req.category,
        scheduled_s=scheduled_s,
        sent_s=sent - t0,
        queued_s=queued_s,
        chunk_s=tuple(chunks),
        prompt_tokens=stream.prompt_tokens,
        output_tokens=stream.output_tokens,
        finish_reason=stream.finish,
        text=stream.text,
        error=error,
        spec_verify_ct=stream.verify_ct,
        spec_steps=spec.num_spec_steps if spec else None,
        spec_accepted_tokens=spec.num_accepted_draft_tokens if spec else None,
        spec_draft_tokens=spec.num_draft_tokens if spec else None,
        conversation=req.conversation,
        turn=req.turn,
    )


class _HTTPStatus(Exception):
    pass
