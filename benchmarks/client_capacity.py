"""How many streamed tokens per second can one client process drive on time?

    .venv/bin/python benchmarks/client_capacity.py [--tokens 256] [--window-s 3]

A fake OpenAI server (benchmarks/fake_openai_server.py) streams tokens instantly, pinned
to its own core; the harness runs on the other. For each offered token rate, the same
seeded Poisson schedule drives (a) specsweep's client and (b) vLLM's own request function
(`vllm bench serve`'s client, `async_request_openai_chat_completions`) behind the same
scheduler. Per rate it reports the achieved token rate, the p99 lateness of sends against
the schedule, and the client's CPU time per token. A client *sustains* a rate when its
p99 lateness stays under 2 ms and every request succeeds.

On 2 cores the fake server's single core caps the achievable rate (~120k tokens/s when
paced): once both clients reach that cap, CPU time per token is the comparison that
remains, and 1 / (CPU per token) is each client's capacity on one core.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.engines.process import free_port  # noqa: E402
from pipeline.load.client import ClientOptions, clock  # noqa: E402
from pipeline.load.items import Request  # noqa: E402
from pipeline.load.loadgen import arrival_offsets, run_window  # noqa: E402

LATENESS_BUDGET_MS = 2.0


def start_server(port: int, burst: int) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "fake_openai_server.py"),
        "--port",
        str(port),
        "--burst",
        str(burst),
    ]
    if shutil.which("taskset") and (os.cpu_count() or 1) >= 2:
        cmd = ["taskset", "-c", "1", *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            import urllib.request

            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("fake server did not start")


Result = tuple[float, list[float], int, float, int]  # duration, lateness ms, tokens, CPU s, failures


def ours(url: str, requests: list[Request], offsets: list[float]) -> Result:
    cpu = time.process_time()
    window = run_window(requests, offsets, ClientOptions(base_url=url, model="fake", timeout_s=60))
    cpu = time.process_time() - cpu
    tokens = sum(r.output_tokens or 0 for r in window.records if r.ok)
    failures = sum(1 for r in window.records if not r.ok)
    return window.duration_s, [r.lateness_s * 1000 for r in window.records], tokens, cpu, failures


def vllms(url: str, requests: list[Request], offsets: list[float]) -> Result:
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_chat_completions

    async def run() -> tuple[float, list[float], list[int]]:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=60)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
            warm = RequestFuncInput(
                prompt="p", api_url=url + "/v1/chat/completions", prompt_len=1, output_len=4, model="fake"
            )
            await async_request_openai_chat_completions(warm, session)
            start = clock()
            lateness: list[float] = []

            async def one(req: Request, due: float) -> int:
                delay = due - (clock() - start)
                if delay > 0:
                    await asyncio.sleep(delay)
                lateness.append((clock() - start - due) * 1000)
                inp = RequestFuncInput(
                    prompt=req.prompt,
                    api_url=url + "/v1/chat/completions",
                    prompt_len=1,
                    output_len=req.max_tokens,
                    model="fake",
                )
                out = await async_request_openai_chat_completions(inp, session)
                return out.output_tokens if out.success else -1

            tokens = await asyncio.gather(*(one(r, d) for r, d in zip(requests, offsets, strict=True)))
            return clock() - start, lateness, tokens

    import uvloop

    cpu = time.process_time()
    duration, lateness, tokens = uvloop.run(run())
    cpu = time.process_time() - cpu
    return duration, lateness, sum(t for t in tokens if t > 0), cpu, sum(1 for t in tokens if t < 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=256, help="output tokens per request")
    parser.add_argument("--window-s", type=float, default=3.0)
    parser.add_argument("--rates", default="20000,40000,60000,80000,100000,120000,140000")
    parser.add_argument("--burst", type=int, default=1, help="tokens per server write (1 = paced)")
    parser.add_argument("--repeats", type=int, default=3, help="windows per point; the median is reported")
    args = parser.parse_args()
    if (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {0})
    port = free_port()
    server = start_server(port, args.burst)
    url = f"http://127.0.0.1:{port}"
    print(f"fake server: {'paced' if args.burst == 1 else f'burst {args.burst}'}, {args.tokens} tokens/request")
    print(f"{'client':<8} {'offered tok/s':>13} {'achieved':>9} {'p99 late ms':>11} {'cpu us/tok':>10}  sustained")
    best: dict[str, float] = {}
    cpu_per_token: dict[str, list[float]] = {"specsweep": [], "vllm": []}
    try:
        for rate in (float(r) for r in args.rates.split(",")):
            request_rate = rate / args.tokens
            count = max(8, int(request_rate * args.window_s))
            requests = [Request(index=i, prompt="p", category="c", max_tokens=args.tokens) for i in range(count)]
            for name, fn in (("specsweep", ours), ("vllm", vllms)):
                rows = []
                for seed in range(args.repeats):
                    offsets = arrival_offsets(count, request_rate, 1.0, seed)
                    duration, lateness, tokens, cpu, failures = fn(url, requests, offsets)
                    p99 = float(np.percentile(lateness, 99))
                    rows.append((tokens / duration, p99, cpu / max(tokens, 1) * 1e6, failures))
                achieved, p99, cpu_tok = (float(np.median([r[i] for r in rows])) for i in range(3))
                ok = p99 < LATENESS_BUDGET_MS and not any(r[3] for r in rows)
                if ok:
                    best[name] = max(best.get(name, 0.0), rate)
                cpu_per_token[name].append(cpu_tok)
                print(
                    f"{name:<8} {rate:13.0f} {achieved:9.0f} {p99:11.2f} {cpu_tok:10.2f}  {'yes' if ok else 'no'}",
                    flush=True,
                )
    finally:
        server.terminate()
        server.wait(timeout=10)
    print()
    for name in ("specsweep", "vllm"):
        median_cpu = float(np.median(cpu_per_token[name]))
        print(
            f"{name:<10} highest sustained offered rate {best.get(name, 0):8.0f} tok/s; "
            f"median CPU {median_cpu:.2f} us/token -> {1e6 / median_cpu:8.0f} tok/s per core"
        )
    ratio = float(np.median(cpu_per_token["vllm"])) / float(np.median(cpu_per_token["specsweep"]))
    print(f"capacity ratio (vLLM CPU per token / ours): {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
