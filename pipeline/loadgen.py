"""Open-loop load: arrival times fixed up front from a seeded generator, then kept to.

A request is sent at its scheduled time whether or not earlier ones have finished, so a
slow server queues work instead of slowing the client down (closed-loop would hide that).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx
import numpy as np

try:
    import uvloop
except ImportError:  # optional: a faster event loop where it installs
    uvloop = None  # type: ignore[assignment]

from pipeline.client import ClientOptions, RequestRecord, send
from pipeline.workloads import Request


def arrival_offsets(count: int, rate: float, burstiness: float, rng: np.random.Generator) -> list[float]:
    """Seconds from the window start at which each request is due.

    Inter-arrival gaps are gamma-distributed with shape ``burstiness`` and mean ``1/rate``,
    as ``vllm bench serve`` draws them: shape 1 is Poisson, below 1 burstier, above 1
    more regular. ``rate=inf`` sends everything at once. The first request goes at 0.
    """
    if math.isinf(rate):
        return [0.0] * count
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=max(count - 1, 0))
    return [0.0, *np.cumsum(gaps).tolist()][:count]


@dataclass(frozen=True)
class Window:
    records: tuple[RequestRecord, ...]
    duration_s: float  # from the window start to the last response's end


async def _run(
    requests: Sequence[Request], offsets: Sequence[float], opts: ClientOptions, on_done: Callable[[RequestRecord], None]
) -> Window:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(opts.timeout_s, connect=min(30.0, opts.timeout_s))
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        t0 = time.perf_counter()

        async def one(req: Request, due: float) -> RequestRecord:
            delay = due - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            record = await send(client, req, opts, due, t0)
            on_done(record)
            return record

        records = await asyncio.gather(*(one(r, d) for r, d in zip(requests, offsets, strict=True)))
        duration = time.perf_counter() - t0
    return Window(records=tuple(records), duration_s=duration)


def run_window(
    requests: Sequence[Request],
    offsets: Sequence[float],
    opts: ClientOptions,
    on_done: Callable[[RequestRecord], None] = lambda r: None,
) -> Window:
    """Run one measured window to completion; every request ends within its timeout."""
    runner = uvloop.run if uvloop is not None else asyncio.run
    return runner(_run(requests, offsets, opts, on_done))
