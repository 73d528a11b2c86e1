"""What one server of a sweep runs, and what one point sends to it.

Everything that can be refused (engine install, device, methods, model paths) is checked in
:func:`resolve_target`, which the driver calls for every server before any of them starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from pipeline.analysis.trust import shared_prefix_tokens
from pipeline.config import ConfigError, JobConfig
from pipeline.engines.base import ServerSpec
from pipeline.engines.engine import Target
from pipeline.engines.process import free_port
from pipeline.engines.registry import engine_of
from pipeline.load import lengths_only, traces
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
    tags: dict[str, str] = field(default_factory=dict)  # and in words (a trace's fields not replayed)


def point_requests(job: JobConfig, tokenizer: Tokenizer | None) -> PointRequests:
    if job.workload.name == "trace":
        return _trace_requests(job, tokenizer)
    seed = job.seed + job.repeat  # a repeat draws new prompts and arrivals
    offsets = schedule(job.load, seed)
    warmup, requests = split_warmup(job.workload, len(offsets), job.load.warmup_requests, seed, tokenizer)
    # Warm-up exercises the code paths (prefill, decode, drafting); a few tokens do that.
    capped = tuple(replace(r, max_tokens=min(r.max_tokens, WARMUP_MAX_TOKENS)) for r in warmup)
    return PointRequests(capped, with_shared_prefixes(requests, tokenizer, job.workload.endpoint), tuple(offsets))


def with_shared_prefixes(
    requests: Sequence[Request], tokenizer: Tokenizer | None, endpoint: str
) -> tuple[Request, ...]:
    """Each request with the tokens of its prompt, as the server sees it (the chat template
    applied on the chat endpoint), that an earlier request of the window shares. A later turn
    of a conversation carries answers not known yet: its share is left to the window's check
    (all of its history may be served from the cache)."""
    if tokenizer is None or (endpoint == "chat" and not hasattr(tokenizer, "apply_chat_template")):
        return tuple(requests)

    def seen_by_server(r: Request) -> list[int]:
        if r.prompt_ids:
            return list(r.prompt_ids)
        if endpoint == "chat":
            messages = list(r.messages) or [{"role": "user", "content": r.prompt}]
            rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            return tokenizer.encode(str(rendered), add_special_tokens=False)
        return tokenizer.encode(r.prompt, add_special_tokens=True)

    own = [r for r in requests if r.after is None]
    shares = dict(zip((r.index for r in own), shared_prefix_tokens([seen_by_server(r) for r in own]), strict=True))
    return tuple(replace(r, shared_prefix_tokens=shares.get(r.index)) for r in requests)


def _trace_requests(job: JobConfig, tokenizer: Tokenizer | None) -> PointRequests:
    """A trace's slice on its own schedule, scaled to the point's mean rate (compose.py fixed
    it). Every repeat replays the same requests at the same offsets. The warm-up sends the
    slice's last prompts; under the default cold policy the cache is reset after it."""
    replayed = traces.load_replay(job.workload, job.load.request_rate)
    requests = to_requests(traces.replay_items(replayed, tokenizer, job.workload), job.workload, tokenizer)
    # A warm-up request stands alone: a conversation's turn is sent as its user text only.
    warmup = [
        replace(r.alone(), index=i, max_tokens=min(r.max_tokens, WARMUP_MAX_TOKENS))
        for i, r in enumerate(requests[::-1][: job.load.warmup_requests])
    ]
    requests = list(with_shared_prefixes(requests, tokenizer, job.workload.endpoint))
    metrics = {
        "trace_requests": float(len(requests)),
        "trace_mean_rate": replayed.own_mean_rate,  # the slice's own, before scaling
        "trace_peak_rate": replayed.own_peak_rate,  # its busiest 10 s, per second
        "trace_scale": replayed.scale,  # offsets = trace seconds x this
        "trace_synthetic": float(replayed.synthetic),
        "trace_sorted_lines": float(replayed.sorted_lines),
        "trace_conversations": float(replayed.conversations),
    }
    ignored = traces.read_file(job.workload).ignored(job.workload.metadata_fields)
    tags = {"trace.ignored_fields": traces.ignored_text(ignored)} if ignored else {}
    return PointRequests(tuple(warmup), tuple(requests), replayed.offsets, metrics, tags)


def check_trace(job: JobConfig, tokenizer: Tokenizer) -> None:
    """What a trace point needs the model's tokenizer to refuse, before any server starts: a
    text line whose prompt plus output exceeds engine.max_model_len (compose.py refused the
    lengths-only ones), and a lengths-only line whose chat text cannot be exactly its length."""
    replayed = traces.load_replay(job.workload, job.load.request_rate)
    chat = job.workload.endpoint == "chat"

    def count(line: traces.TraceLine) -> int:
        if chat:
            return lengths_only.chat_tokens(tokenizer, line.messages or line.prompt or "")
        return len(tokenizer.encode(line.prompt or "", add_special_tokens=False))

    over = traces.over_context(replayed.lines, job.engine.max_model_len, job.workload.max_tokens, count)
    if over:
        what = "the prompt's tokens, chat template included" if chat else "the prompt's tokens"
        raise ConfigError(traces.over_context_text(over, job.engine.max_model_len, what))
    traces.replay_items(replayed, tokenizer, job.workload)


def server_spec(target: Target, job: JobConfig, log_path: Path, port: int | None = None) -> ServerSpec:
    engine = engine_of(job)
    if port is None and engine.starts_servers:
        port = free_port(job.engine.host)
    return engine.server_spec(target, job, log_path, port or 0)
