"""What one server of a sweep runs, and what one point sends to it.

Everything that can be refused (engine install, device, methods, model paths) is checked in
:func:`resolve_target`, which the driver calls for every server before any of them starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from pipeline.config import JobConfig
from pipeline.engines.base import ServerSpec
from pipeline.engines.engine import Target
from pipeline.engines.process import free_port
from pipeline.engines.registry import engine_of
from pipeline.load import traces
from pipeline.load.items import Request, Tokenizer
from pipeline.load.loadgen import schedule
from pipeline.load.workloads import split_warmup, to_requests
from pipeline.run.plan import WARMUP_MAX_TOKENS


def resolve_target(job: JobConfig, *, build: bool = True, plan_only: bool = False) -> Target:
    """Check the engine, device and models (:meth:`Engine.resolve`). ``build=False`` names
    embedded models unbuilt, and plans an SGLang server even where SGLang cannot run.
    ``plan_only`` (a dry run) plans engine.device=gpu servers from a machine without a GPU, as
    for a cluster's GPU nodes, and contacts no external server."""
    return engine_of(job).resolve(job, build=build, plan_only=plan_only)


@dataclass(frozen=True)
class PointRequests:
    """What a point sends: warm-up prompts, measured prompts, and when each is due."""

    warmup: tuple[Request, ...]
    requests: tuple[Request, ...]
    offsets: tuple[float, ...]  # seconds from the window start
    metrics: dict[str, float] = field(default_factory=dict)  # what the point records of its load's source


def point_requests(job: JobConfig, tokenizer: Tokenizer | None) -> PointRequests:
    if job.workload.name == "trace":
        return _trace_requests(job, tokenizer)
    seed = job.seed + job.repeat  # a repeat draws new prompts and arrivals
    offsets = schedule(job.load, seed)
    warmup, requests = split_warmup(job.workload, len(offsets), job.load.warmup_requests, seed, tokenizer)
    # Warm-up exercises the code paths (prefill, decode, drafting); a few tokens do that.
    capped = tuple(replace(r, max_tokens=min(r.max_tokens, WARMUP_MAX_TOKENS)) for r in warmup)
    return PointRequests(capped, tuple(requests), tuple(offsets))


def _trace_requests(job: JobConfig, tokenizer: Tokenizer | None) -> PointRequests:
    """A trace's slice on its own schedule, scaled to the point's mean rate (compose.py fixed
    it). Every repeat replays the same requests at the same offsets. The warm-up sends the
    slice's last prompts; under the default cold policy the cache is reset after it."""
    replayed = traces.load_replay(job.workload, job.load.request_rate)
    requests = to_requests(traces.replay_items(replayed, tokenizer), job.workload, tokenizer)
    # A warm-up request stands alone: a conversation's turn is sent as its user text only.
    warmup = [
        replace(r.alone(), index=i, max_tokens=min(r.max_tokens, WARMUP_MAX_TOKENS))
        for i, r in enumerate(requests[::-1][: job.load.warmup_requests])
    ]
    metrics = {
        "trace_requests": float(len(requests)),
        "trace_mean_rate": replayed.own_mean_rate,  # the slice's own, before scaling
        "trace_peak_rate": replayed.own_peak_rate,  # its busiest 10 s, per second
        "trace_scale": replayed.scale,  # offsets = trace seconds x this
        "trace_synthetic": float(replayed.synthetic),
        "trace_sorted_lines": float(replayed.sorted_lines),
        "trace_conversations": float(replayed.conversations),
    }
    return PointRequests(tuple(warmup), tuple(requests), replayed.offsets, metrics)


def server_spec(target: Target, job: JobConfig, log_path: Path, port: int | None = None) -> ServerSpec:
    engine = engine_of(job)
    if port is None and engine.starts_servers:
        port = free_port(job.engine.host)
    return engine.server_spec(target, job, log_path, port or 0)
