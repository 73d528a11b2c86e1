"""An OpenAI-compatible chat server that streams tokens instantly: a load-client benchmark target.

    python benchmarks/fake_openai_server.py --port 8900 [--burst 1]

Every request gets ``max_tokens`` one-token content chunks, a usage trailer and ``[DONE]``.
``--burst 1`` (paced, the default) yields to the event loop after each chunk, so each
arrives in its own read, as a real engine paces them; ``--burst N`` writes N chunks at a
time, which flatters every client. The server, not the client, must not be the limit:
run it on its own core (taskset) and check its CPU share.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from aiohttp import web

CHUNK = b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}\n\n'
ROLE = b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'


def make_app(burst: int) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(ROLE)
        sent = 0
        while sent < tokens:
            n = min(burst, tokens - sent)
            await response.write(CHUNK * n)
            sent += n
            await asyncio.sleep(0)  # let the loop flush: one read per write on the client
        usage = {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": tokens + 8}
        trailer = {"id": "x", "object": "chat.completion.chunk", "choices": [], "usage": usage}
        await response.write(b"data: " + json.dumps(trailer).encode() + b"\n\ndata: [DONE]\n\n")
        await response.write_eof()
        return response

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", models)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--burst", type=int, default=1)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    web.run_app(make_app(args.burst), host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
