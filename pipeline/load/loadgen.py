"""Open-loop load: arrival times fixed up front from a seeded generator, then kept to.

A request is sent at its scheduled time whether or not earlier ones have finished, so a
slow server queues work instead of slowing the client down. The one exception is a later turn
of a trace's conversation: it waits for the previous turn's answer, which joins its history,
then for its think time (as a user does). ``max_concurrency`` caps the
requests in flight (closed loop when the rate is infinite), and where one process cannot
keep up, ``workers`` processes share the schedule and one monotonic clock (uncapped only:
a cap split between processes would not be one global cap).
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing as mp
import queue
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import aiohttp
import numpy as np

try:
    import uvloop
except ImportError:  # optional: a faster event loop where it installs
    uvloop = None  # type: ignore[assignment]

from pipeline.config import LoadConfig
from pipeline.load.client import ClientOptions, RequestRecord, clock, send
from pipeline.load.items import Request

WORKER_START_TIMEOUT_S = 60.0
TIMER_SLACK_S = 0.001


def _gamma_gaps(count: int, rate: float, burstiness: float, seed: int) -> np.ndarray:
    # The legacy RandomState, drawn one gap per request: the stream `vllm bench serve`
    # draws after np.random.seed(seed), so one seed gives both tools one schedule.
    return np.random.RandomState(seed).gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=count)


def arrival_offsets(count: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Seconds from the window start at which each request is due, as `vllm bench serve`
    schedules them.

    Every request, the first included, waits a gamma-distributed gap of shape
    ``burstiness`` and mean ``1/rate`` (shape 1 is Poisson, below 1 burstier, above 1 more
    regular); the sum is then scaled so that the last request is due at ``count / rate``,
    which keeps the offered rate exact whatever the seed. ``rate=inf`` sends all at once.
    """
    if math.isinf(rate):
        return [0.0] * count
    if count == 0:
        return []
    due = np.cumsum(_gamma_gaps(count, rate, burstiness, seed))
    return (due * ((count / rate) / due[-1])).tolist()


def arrivals_within(duration_s: float, rate: float, burstiness: float, seed: int) -> list[float]:
    """Every arrival due before ``duration_s``: the schedule of a fixed-duration window.
    Not rescaled: the count is what the seeded process yields in that time."""
    expected = int(duration_s * rate)
    count = max(16, expected + 8 * int(math.sqrt(expected / burstiness) + 1))  # far beyond the tail
    due = np.cumsum(_gamma_gaps(count, rate, burstiness, seed))
    while due[-1] < duration_s:  # never in practice; kept so the bound is exact
        count *= 2
        due = np.cumsum(_gamma_gaps(count, rate, burstiness, seed))
    return [float(t) for t in due if t < duration_s]


def schedule(load: LoadConfig, seed: int) -> list[float]:
    """A point's arrival times, from the seed alone: baseline and speculation get the same ones."""
    if load.duration_s is not None:
        return arrivals_within(load.duration_s, load.request_rate, load.burstiness, seed)
    return arrival_offsets(load.requests_in_window, load.request_rate, load.burstiness, seed)


@dataclass(frozen=True)
class Window:
    # repr=False: asyncio's runner formats the main task's result when it restores the
    # SIGINT handler, and thousands of records took ~0.15 s to format.
    records: tuple[RequestRecord, ...] = field(repr=False)
    duration_s: float = 0.0  # from the window start to the last response's end
    stopped: str | None = None  # why the window was cut short (a StopRule), if it was
    origin_s: float = 0.0  # the window start: the reading of ``clock`` the records' offsets count from


@dataclass(frozen=True)
class StopRule:
    """When a window stops before its last request ends, as GuideLLM's constraints stop a
    benchmark: a window deadline (a server that hangs), or too many errors (a server that
    fails), instead of spending the window's full length on nothing."""

    deadline_s: float | None = None  # from the window start
    max_error_rate: float | None = None  # errors / finished requests, once min_requests finished
    min_requests: int = 10

    def check(self, finished: int, errors: int) -> str | None:
        if self.max_error_rate is not None and finished >= self.min_requests:
            if errors / finished > self.max_error_rate:
                return (
                    f"{errors} of the first {finished} requests failed, more than "
                    f"load.max_error_rate={self.max_error_rate:g}"
                )
        return None


def _not_sent(req: Request, due: float, error: str) -> RequestRecord:
    return RequestRecord(
        index=req.index,
        category=req.category,
        scheduled_s=due,
        sent_s=due,
        error=error,
        conversation=req.conversation,
        turn=req.turn,
    )


def _unfinished(req: Request, due: float, reason: str) -> RequestRecord:
    return _not_sent(req, due, f"not finished: the window stopped ({reason})")


def next_turn(req: Request, sent: Sequence[dict[str, str]], answer: RequestRecord) -> Request:
    """A later turn as it is sent: the previous turn's messages, the server's actual answer to
    them, then this turn's user text."""
    history = (*sent, {"role": "assistant", "content": answer.text}, {"role": "user", "content": req.prompt})
    return replace(req, messages=history)


def _as_sent(req: Request) -> tuple[dict[str, str], ...]:
    return req.messages or ({"role": "user", "content": req.prompt},)


def _check_turns(requests: Sequence[Request]) -> None:
    """A later turn needs its previous turn in the same window: a caller's bug otherwise, said
    as such (send such a request with Request.alone())."""
    indices = {r.index for r in requests}
    orphan = next((r for r in requests if r.after is not None and r.after not in indices), None)
    if orphan is not None:
        raise ValueError(
            f"request {orphan.index} is turn {orphan.turn} of conversation {orphan.conversation!r}, "
            f"but its previous turn (request {orphan.after}) is not in this window"
        )


class _Sending:
    """One window's sending on one event loop: each request at its due time (a later turn once
    its previous turn answered), the counts the stop rule reads, and why the window stopped."""

    def __init__(
        self,
        client: aiohttp.ClientSession,
        opts: ClientOptions,
        on_done: Callable[[RequestRecord], None],
        stop: StopRule,
        start: float,
        max_concurrency: int | None,
    ) -> None:
        self.client, self.opts, self.on_done, self.stop, self.start = client, opts, on_done, stop, start
        self.slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        self.counts = [0, 0]  # finished, errors
        self.stopped = asyncio.Event()
        self.reason: list[str] = []
        self.sent: dict[int, tuple[dict[str, str], ...]] = {}  # a conversation turn's messages, as sent
        self.by_index: dict[int, asyncio.Future[RequestRecord]] = {}  # filled before any task runs

    async def one(self, req: Request, due: float) -> RequestRecord:
        if req.after is not None:  # a later turn: due once the previous turn has answered
            answer = await self.by_index[req.after]
            due = answer.end_s + req.delay_s
            if not answer.ok:
                why = f"not sent: turn {answer.turn} of conversation {req.conversation!r} failed"
                return self.finished(_not_sent(req, due, why))
            req = next_turn(req, self.sent[req.after], answer)
        if req.conversation:
            self.sent[req.index] = _as_sent(req)
        # Event-loop timers have ~1 ms resolution and may fire early; sleeping again for
        # less than that would overshoot by more than it corrects.
        while (delay := due - (clock() - self.start)) > TIMER_SLACK_S:
            await asyncio.sleep(delay)
        if self.slots is None:
            return self.finished(await send(self.client, req, self.opts, due, self.start))
        queued_from = clock()
        async with self.slots:
            record = await send(self.client, req, self.opts, due, self.start, queued_s=clock() - queued_from)
        return self.finished(record)

    def finished(self, record: RequestRecord) -> RequestRecord:
        self.on_done(record)
        self.counts[0] += 1
        self.counts[1] += 0 if record.ok else 1
        if not self.reason and (why := self.stop.check(*self.counts)):
            self.reason.append(why)
            self.stopped.set()
        return record


async def _run(
    requests: Sequence[Request],
    offsets: Sequence[float],
    opts: ClientOptions,
    on_done: Callable[[RequestRecord], None],
    start_at: Callable[[], float] = clock,
    max_concurrency: int | None = None,
    stop: StopRule | None = None,
) -> Window:
    """``start_at`` returns the window's time origin once the client is ready to send."""
    _check_turns(requests)
    stop = stop or StopRule()
    # No pool limit: an open-loop client must never queue requests behind its own sockets.
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=min(30.0, opts.timeout_s))
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
        await _prime(client, opts)
        start = start_at()
        sending = _Sending(client, opts, on_done, stop, start, max_concurrency)
        tasks = [asyncio.ensure_future(sending.one(r, d)) for r, d in zip(requests, offsets, strict=True)]
        # Filled before the loop runs any task: a later turn finds its predecessor's task here.
        sending.by_index.update({r.index: t for r, t in zip(requests, tasks, strict=True)})
        everything = asyncio.ensure_future(asyncio.wait(tasks))
        halt = asyncio.ensure_future(sending.stopped.wait())
        await asyncio.wait([everything, halt], timeout=stop.deadline_s, return_when=asyncio.FIRST_COMPLETED)
        reason = sending.reason
        if not everything.done() and not reason:
            reason.append(
                f"the window deadline of {stop.deadline_s:g} s passed with "
                f"{sum(not t.done() for t in tasks)} request(s) unfinished"
            )
        for task in (*tasks, everything, halt):
            task.cancel()
        await asyncio.gather(*tasks, everything, halt, return_exceptions=True)
        duration = clock() - start
        records = [
            t.result() if t.done() and not t.cancelled() else _unfinished(r, d, reason[0])
            for t, r, d in zip(tasks, requests, offsets, strict=True)
        ]
    return Window(records=tuple(records), duration_s=duration, stopped=reason[0] if reason else None, origin_s=start)


async def _prime(client: aiohttp.ClientSession, opts: ClientOptions) -> None:
    """One cheap request before the clock starts: the first request of a process pays
    lazy imports and connection set-up, which would show as client lateness."""
    try:
        async with client.get(opts.base_url + "/v1/models", headers=opts.headers) as response:
            await response.read()
    except (aiohttp.ClientError, TimeoutError):
        pass  # only warming up; the window reports any real fault


def _event_loop_run(coro):  # type: ignore[no-untyped-def]
    return (uvloop.run if uvloop is not None else asyncio.run)(coro)


def _worker(
    requests: Sequence[Request],
    offsets: Sequence[float],
    opts: ClientOptions,
    ready: mp.Queue,
    go: mp.Queue,
    out: mp.Queue,
) -> None:
    def start_at() -> float:
        # Blocking is fine here: nothing is scheduled yet. The parent hands every worker
        # the same reading of the system-wide monotonic clock, one time origin for all.
        ready.put(True)
        return float(go.get())

    try:
        _event_loop_run(_run(requests, offsets, opts, out.put, start_at=start_at))
    finally:
        out.put(None)


def _await_ready(ready: mp.Queue, procs: Sequence[mp.process.BaseProcess]) -> None:
    deadline = clock() + WORKER_START_TIMEOUT_S
    waiting = len(procs)
    while waiting:
        try:
            ready.get(timeout=1.0)
            waiting -= 1
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs) or clock() > deadline:
                raise RuntimeError("a load-generator worker failed to start; see its output above") from None


def run_window(
    requests: Sequence[Request],
    offsets: Sequence[float],
    opts: ClientOptions,
    on_done: Callable[[RequestRecord], None] = lambda r: None,
    *,
    max_concurrency: int | None = None,
    workers: int = 1,
    stop: StopRule | None = None,
) -> Window:
    """Run one measured window to its end, or until ``stop`` cuts it short; every request
    ends within its timeout."""
    if workers <= 1:
        return _event_loop_run(_run(requests, offsets, opts, on_done, max_concurrency=max_concurrency, stop=stop))
    if max_concurrency is not None:
        # Per-worker caps are not one global cap (config validation says so to users).
        raise ValueError("max_concurrency needs a single client worker")
    if any(r.after is not None for r in requests):
        # A turn waits for its predecessor's answer, which another process would not see.
        raise ValueError("a trace's conversations need a single client worker")
    return _run_workers(requests, offsets, opts, on_done, workers, stop or StopRule())


def _run_workers(
    requests: Sequence[Request],
    offsets: Sequence[float],
    opts: ClientOptions,
    on_done: Callable[[RequestRecord], None],
    workers: int,
    stop: StopRule,
) -> Window:
    """The window split over client processes that share one time origin."""
    ctx = mp.get_context("spawn")  # no fork: the parent holds threads (MLflow, progress)
    ready, go, out = ctx.Queue(), ctx.Queue(), ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker,
            args=(requests[i::workers], offsets[i::workers], opts, ready, go, out),
            daemon=True,
        )
        for i in range(workers)
    ]
    for proc in procs:
        proc.start()
    reason: str | None = None
    try:
        _await_ready(ready, procs)
        t0 = clock() + 0.05
        for _ in procs:
            go.put(t0)
        records, reason = _gather_records(procs, out, on_done, stop, t0)
        duration = clock() - t0
        if reason is not None:  # the workers are stopped below; what they had not finished is marked
            seen = {r.index for r in records}
            records += [
                _unfinished(r, d, reason) for r, d in zip(requests, offsets, strict=True) if r.index not in seen
            ]
    finally:
        for proc in procs:
            if reason is not None:
                proc.kill()
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    return Window(
        records=tuple(sorted(records, key=lambda r: r.index)), duration_s=duration, stopped=reason, origin_s=t0
    )


def _gather_records(
    procs: Sequence[mp.process.BaseProcess],
    out: mp.Queue,
    on_done: Callable[[RequestRecord], None],
    stop: StopRule,
    t0: float,
) -> tuple[list[RequestRecord], str | None]:
    """The workers' records as they finish, until every worker is done or the stop rule (or
    the window's deadline) says why the window ends early."""
    records: list[RequestRecord] = []
    finished = 0
    while finished < len(procs):
        if stop.deadline_s is not None and clock() - t0 > stop.deadline_s:
            return records, f"the window deadline of {stop.deadline_s:g} s passed"
        try:
            item = out.get(timeout=0.2)
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                raise RuntimeError("a load-generator worker died; see its output above") from None
            continue
        if item is None:
            finished += 1
            continue
        records.append(item)
        on_done(item)
        if reason := stop.check(len(records), sum(not r.ok for r in records)):
            return records, reason
    return records, None
