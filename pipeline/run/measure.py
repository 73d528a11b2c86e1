"""One measured window against a running server: warm up, set the cache, scrape, load, scrape.

Every window starts from the prefix-cache state that ``engine.prefix_cache`` names, so a
baseline and a speculative server, or two rates on one server, see the same cache: emptied
(cold), emptied and then filled with the window's own prompts (warm), or none (off).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import httpx

from pipeline.analysis import trust
from pipeline.config import JobConfig, LoadConfig
from pipeline.engines.acceptance import (
    Acceptance,
    MetricsFormatError,
    PrefixCacheWindow,
    Scrape,
    WindowAcceptance,
    acceptance_between,
    parse_scrape,
    prefix_cache_between,
)
from pipeline.engines.engine import Engine
from pipeline.engines.registry import engine_of
from pipeline.load.client import ClientOptions, RequestRecord
from pipeline.load.items import Request
from pipeline.load.loadgen import StopRule, Window, run_window
from pipeline.load.metrics import summarize
from pipeline.run.progress.events import Reporter


class MeasurementError(RuntimeError):
    """A window that cannot be measured; ``window`` holds what it recorded, if it ran."""

    def __init__(self, message: str, window: Window | None = None) -> None:
        super().__init__(message)
        self.window = window


WINDOW_STOPPED = "window stopped early: "


@dataclass(frozen=True)
class Measurement:
    window: Window
    acceptance: Acceptance  # the /metrics counters' figures
    on_scale: WindowAcceptance  # the window's L and its source, as the engine reads them
    prefix_cache: PrefixCacheWindow
    summary: dict[str, float]
    kv_capacity: dict[str, float] = field(default_factory=dict)  # vLLM's KV cache size (Scrape.kv_capacity)
    validity: dict[str, float] = field(default_factory=dict)  # window.* facts and validity.* checks


def scrape(base_url: str) -> Scrape:
    response = httpx.get(base_url + "/metrics", timeout=30.0, trust_env=False)
    response.raise_for_status()
    return parse_scrape(response.text)


def reset_prefix_cache(base_url: str, engine: Engine) -> None:
    """Empty the server's prefix cache the way its engine does (:attr:`Engine.reset_path`)."""
    path = engine.reset_path
    if path is None:
        raise MeasurementError(f"{engine.label} servers cannot have their prefix cache emptied from here")
    response = httpx.post(base_url + path, timeout=60.0, trust_env=False)
    if response.status_code != 200:
        raise MeasurementError(
            f"POST {path} answered {response.status_code}; {engine.reset_hint}, or set engine.prefix_cache=off"
        )


def resets_cache(job: JobConfig) -> bool:
    """Whether each window empties the prefix cache first (:meth:`Engine.resets_cache`)."""
    return engine_of(job).resets_cache(job.engine)


# A vLLM server's count of finished requests (summed over its finish reasons).
FINISHED = "vllm:request_success_total"


def external_scrape(base_url: str) -> tuple[Scrape, str | None]:
    """A server that is not ours may serve no /metrics (a proxy, another engine): the window is
    still measured, and its acceptance is "not measured", saying why."""
    try:
        return scrape(base_url), None
    except (httpx.HTTPError, MetricsFormatError) as exc:
        return Scrape(), f"acceptance not measured: GET {base_url}/metrics failed ({type(exc).__name__}: {exc})"


# Time spent waiting in the engine's queue, per finished request (a histogram's sum and count).
QUEUE_SUM = "vllm:request_queue_time_seconds_sum"
QUEUE_COUNT = "vllm:request_queue_time_seconds_count"


def _moved(before: Scrape, after: Scrape, name: str) -> float | None:
    if after.get(name) is None:
        return None
    return (after.get(name) or 0.0) - (before.get(name) or 0.0)


def server_facts(before: Scrape, after: Scrape, window: Window) -> dict[str, float]:
    """What the server's counters say of the window: requests it finished beyond the window's
    own (other traffic: other clients, or replicas behind one URL), and how long requests waited
    in its queue (the time-average of vLLM's num_requests_waiting is their summed waits over
    the window's length: Little's law on the queue)."""
    out: dict[str, float] = {}
    counted = _moved(before, after, FINISHED)
    if counted is not None:
        out["window.other_requests"] = counted - sum(1 for r in window.records if not trust.never_sent(r))
    waited, queued = _moved(before, after, QUEUE_SUM), _moved(before, after, QUEUE_COUNT)
    if waited is not None and window.duration_s > 0:
        out["window.server_waiting_mean"] = waited / window.duration_s
        if queued:
            out["window.server_queue_ms"] = 1000.0 * waited / queued
    return out


def shared_counters(facts: dict[str, float], window: Window) -> str | None:
    """Whether the counters saw other traffic than the window's: behind a load balancer with
    several replicas, the /metrics one request reaches is one replica's, not the window's."""
    other = facts.get("window.other_requests")
    if other is None or other <= 0:
        return None
    sent = sum(1 for r in window.records if not trust.never_sent(r))
    return (
        f"acceptance is not the window's alone: the server's counters finished {sent + other:g} request(s) during "
        f"a window that sent {sent}; the URL reaches several replicas (a load balancer) or serves other "
        f"traffic. Point engine.url at one replica with no other load for the window's own acceptance"
    )


def request_facts(requests: Sequence[Request], window: Window, ignore_eos: bool) -> dict[str, float]:
    """What the window's requests asked for against what the server did: requests cut short
    (a stated length not kept to), and the prompt tokens an emptied prefix cache may serve."""
    asked = {r.index: (r.max_tokens if r.stated_length and ignore_eos else None, r.input_length) for r in requests}
    out = {"window.truncated": float(trust.truncated(window.records, asked))}
    by_index = {r.index: r for r in requests}
    if all(r.shared_prefix_tokens is not None for r in requests if r.after is None):
        # A later turn's history (earlier turns and answers) may all come from the cache.
        later = sum(rec.prompt_tokens or 0 for rec in window.records if by_index[rec.index].after is not None)
        out["window.prefix_shareable_tokens"] = float(
            sum(r.shared_prefix_tokens or 0 for r in requests if r.after is None) + later
        )
    return out


def fill_prefix_cache(requests: Sequence[Request], opts: ClientOptions) -> None:
    """Send the window's prompts once, unmeasured. One output token each is enough: a
    later request reuses the cached blocks of its prompt, never of an earlier answer."""
    primers = [replace(r.alone(), max_tokens=1) for r in requests]  # a later turn's history is the window's own
    window = run_window(primers, [0.0] * len(primers), replace(opts, ignore_eos=False))
    failed = [r for r in window.records if not r.ok]
    if failed:
        raise MeasurementError(f"warming the prefix cache failed ({len(failed)} request(s)): {failed[0].error}")


def _run_reported(
    label: str,
    requests: Sequence[Request],
    offsets: Sequence[float],
    opts: ClientOptions,
    load: LoadConfig,
    reporter: Reporter,
) -> Window:
    errors = tokens = done = 0
    started = time.perf_counter()
    reporter.window(label, 0, len(requests), 0, 0.0)

    def on_done(record: RequestRecord) -> None:
        nonlocal errors, tokens, done
        done += 1
        errors += 0 if record.ok else 1
        tokens += record.output_tokens or 0
        reporter.window(label, done, len(requests), errors, tokens / max(time.perf_counter() - started, 1e-9))

    stop = StopRule(deadline_s=load.window_timeout_s, max_error_rate=load.max_error_rate)
    return run_window(
        requests,
        offsets,
        opts,
        on_done,
        max_concurrency=load.max_concurrency,
        workers=load.client_workers,
        stop=stop,
    )


def measure(
    base_url: str,
    served_name: str,
    job: JobConfig,
    warmup: Sequence[Request],
    requests: Sequence[Request],
    offsets: Sequence[float],
    label: str,
    reporter: Reporter | None = None,
) -> Measurement:
    opts = ClientOptions(
        base_url=base_url,
        model=served_name,
        endpoint=job.workload.endpoint,
        temperature=job.workload.temperature,
        ignore_eos=job.workload.ignore_eos,
        timeout_s=job.load.request_timeout_s,
    )
    # One at a time: warm-up exercises the code paths, not the scheduler.
    for request in warmup:
        record = run_window([request], [0.0], opts).records[0]
        if not record.ok:
            raise MeasurementError(f"warm-up request failed, so the server cannot be measured: {record.error}")
    engine = engine_of(job)
    if engine.resets_cache(job.engine):
        reset_prefix_cache(base_url, engine)
    if job.engine.prefix_cache == "warm":
        fill_prefix_cache(requests, opts)
    external = not engine.starts_servers  # not ours: /metrics may be missing or see other traffic
    before, unread = external_scrape(base_url) if external else (scrape(base_url), None)
    window = _run_reported(label, requests, offsets, opts, job.load, reporter or Reporter(None, label))
    if window.stopped:
        raise MeasurementError(WINDOW_STOPPED + window.stopped, window)
    after, unread_after = external_scrape(base_url) if external else (scrape(base_url), None)
    note = unread or unread_after
    counters = server_facts(before, after, window)
    if not note and counters.get("window.other_requests", 0.0) != 0:
        time.sleep(1.0)  # a counter may lag the last answer by an engine step: read it once more
        after, note = external_scrape(base_url) if external else (scrape(base_url), None)
        counters = server_facts(before, after, window)
    note = note or shared_counters(counters, window)
    acceptance = acceptance_between(before, after)
    if note:
        acceptance = Acceptance(source="none", note=note)
    summary = summarize(window.records, window.duration_s, job.slo, job.load.request_rate)
    prefix = prefix_cache_between(before, after)
    return Measurement(
        window=window,
        acceptance=acceptance,
        on_scale=engine.window_acceptance(window.records, acceptance, after, base_url),
        prefix_cache=prefix,
        summary=summary,
        kv_capacity=after.kv_capacity,
        validity=window_validity(job, requests, window, summary | prefix.as_metrics() | counters),
    )


def window_validity(
    job: JobConfig, requests: Sequence[Request], window: Window, measured: dict[str, float]
) -> dict[str, float]:
    """The window's facts (``window.*``) and its checks (``validity.*``, analysis/trust.py)."""
    shape = trust.WindowShape(
        offered_rate=job.load.request_rate,
        capped=job.load.max_concurrency is not None,
        conversations=any(r.after is not None for r in requests),
        duration_s=window.duration_s,
    )
    facts = (
        {k: v for k, v in measured.items() if k.startswith("window.")}
        | request_facts(requests, window, job.workload.ignore_eos)
        | trust.window_facts(window.records, shape)
    )
    found = trust.judge_window(measured | facts, job.engine.prefix_cache)
    return facts | trust.validity_metrics(found)
