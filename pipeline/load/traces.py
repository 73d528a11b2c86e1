"""Traces: a user's own requests, replayed on their own schedule (docs/traces.md).

A trace is JSONL, one request a line, in either of two shapes:

- ours: ``timestamp`` (seconds from the trace's start, or ms with
  ``workload.timestamp_unit=ms``), ``prompt`` (text) or ``messages`` (a chat list), and
  optional ``output_tokens`` and ``category``;
- vLLM's ``timed_trace`` / Mooncake lines: ``timestamp`` in ms, ``input_length``,
  ``output_length`` and ``hash_ids``. Their text is synthesised, deterministically, from the
  hash ids with the model's tokenizer (a shared hash id is a shared 512-token prefix block,
  as in Mooncake), so acceptance on them says little about real traffic.

Reading is strict: a line that cannot be replayed as written is refused with its number and
the fix, before any server starts. Slicing and scaling are pure functions of the parsed lines.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pipeline.config import ConfigError, WorkloadConfig
from pipeline.load import bundled
from pipeline.load.datasets import DatasetError, _field, _jsonl
from pipeline.load.items import Item, Tokenizer

TIMESTAMP_UNITS = {"s": 1.0, "ms": 1e-3}
BUNDLED_PATH = "bundled"  # workload.path=bundled: the trace built from Python's own text
MOONCAKE_BLOCK_TOKENS = 512  # tokens per hash id, as Mooncake's traces count them
RATE_BUCKET_S = 10.0  # the trace's peak rate is its busiest bucket of this many seconds


class TraceError(DatasetError):
    pass


@dataclass(frozen=True)
class TraceLine:
    """One request of a trace, as read: its due time in seconds from the trace's start."""

    timestamp_s: float
    category: str
    prompt: str | None = None
    messages: tuple[dict[str, str], ...] = ()
    output_tokens: int | None = None
    input_length: int | None = None  # Mooncake lines: the prompt's length in tokens
    hash_ids: tuple[int, ...] = ()

    @property
    def synthetic(self) -> bool:
        return self.prompt is None and not self.messages


@dataclass(frozen=True)
class Replay:
    """What a point replays: the sliced, scaled lines and when each is due."""

    lines: tuple[TraceLine, ...]
    offsets: tuple[float, ...]  # seconds from the window's start, the first at 0
    own_mean_rate: float  # the slice's mean request rate before scaling (per second)
    own_peak_rate: float  # its busiest RATE_BUCKET_S bucket, per second, before scaling
    scale: float  # offsets = (timestamp - first) * scale
    sorted_lines: int = 0  # lines moved by workload.sort

    @property
    def synthetic(self) -> bool:
        return any(line.synthetic for line in self.lines)


def _line(where: str, record: object, unit: str) -> TraceLine:
    if not isinstance(record, dict):
        raise TraceError(f"{where}: expected a JSON object, found {type(record).__name__}")
    mooncake = "input_length" in record or "hash_ids" in record
    stamp = record.get("timestamp")
    if stamp is None:
        raise TraceError(f"{where}: field 'timestamp' is missing; every line of a trace says when it is due")
    if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or not math.isfinite(stamp):
        raise TraceError(f"{where}: field 'timestamp' must be a number, found {stamp!r}")
    if stamp < 0:
        raise TraceError(f"{where}: timestamp {stamp} is negative; timestamps count from the trace's start")
    factor = TIMESTAMP_UNITS["ms" if unit == "auto" and mooncake else ("s" if unit == "auto" else unit)]
    category = _field(record, "category", str, where, required=False) or ("synthetic" if mooncake else "trace")
    if mooncake:
        length = _field(record, "input_length", int, where)
        output = _field(record, "output_length", int, where, required=False)
        hashes = _field(record, "hash_ids", list, where, required=False) or []
        if length < 1 or (output is not None and output < 1):
            raise TraceError(f"{where}: input_length and output_length must be >= 1")
        if not all(isinstance(h, int) and not isinstance(h, bool) for h in hashes):
            raise TraceError(f"{where}: field 'hash_ids' must be a list of integers")
        return TraceLine(stamp * factor, category, output_tokens=output, input_length=length, hash_ids=tuple(hashes))
    output = _field(record, "output_tokens", int, where, required=False)
    if output is not None and output < 1:
        raise TraceError(f"{where}: output_tokens={output} must be >= 1")
    if "messages" in record:
        messages = _field(record, "messages", list, where)
        ok = all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                 for m in messages)  # fmt: skip
        if not messages or not ok:
            raise TraceError(f"{where}: 'messages' must be a non-empty list of {{'role': ..., 'content': ...}} objects")
        kept = tuple({"role": m["role"], "content": m["content"]} for m in messages)
        return TraceLine(stamp * factor, category, messages=kept, output_tokens=output)
    prompt = record.get("prompt")
    if prompt is None:
        raise TraceError(
            f"{where}: the line has neither 'prompt', 'messages' nor 'input_length'; give the request's text "
            f"(prompt or messages), or its length (input_length, with hash_ids, as vLLM's timed_trace)"
        )
    if not isinstance(prompt, str) or not prompt.strip():
        raise TraceError(f"{where}: field 'prompt' must be non-empty text")
    return TraceLine(stamp * factor, category, prompt=prompt, output_tokens=output)


def read_trace(workload: WorkloadConfig) -> tuple[tuple[TraceLine, ...], int]:
    """The trace's lines in time order, and how many ``workload.sort`` moved (0 unsorted)."""
    if workload.path == BUNDLED_PATH:
        return bundled_trace(), 0
    if not workload.path:
        raise ConfigError(
            f"workload.name=trace replays a file: set workload.path=/path/to/trace.jsonl "
            f"(or workload.path={BUNDLED_PATH} for the trace built from Python's own text)"
        )
    path = Path(workload.path).expanduser()
    if not path.is_file():
        raise TraceError(f"workload.path={workload.path}: no such file")
    lines = [_line(where, record, workload.timestamp_unit) for where, record in _jsonl(path)]
    if not lines:
        raise TraceError(f"{path}: the trace has no request")
    moved = 0
    for number, (before, after) in enumerate(zip(lines, lines[1:], strict=False), start=2):
        if after.timestamp_s < before.timestamp_s and not workload.sort:
            raise TraceError(
                f"{path}: request {number} is due at {after.timestamp_s:g} s, before request {number - 1} "
                f"({before.timestamp_s:g} s): timestamps go backwards; sort the file, or set workload.sort=true "
                f"to replay it in time order"
            )
    if workload.sort:
        ordered = sorted(lines, key=lambda line: line.timestamp_s)  # stable: ties keep file order
        moved = sum(a is not b for a, b in zip(lines, ordered, strict=True))
        lines = ordered
    return tuple(lines), moved


def own_rates(stamps: Sequence[float]) -> tuple[float, float]:
    """Mean rate (requests after the first, over the span) and the busiest bucket's rate."""
    if len(stamps) < 2 or stamps[-1] <= stamps[0]:
        return math.inf, math.inf
    mean = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    counts: dict[int, int] = {}
    for t in stamps:
        bucket = int((t - stamps[0]) // RATE_BUCKET_S)
        counts[bucket] = counts.get(bucket, 0) + 1
    return mean, max(counts.values()) / RATE_BUCKET_S


def slice_lines(lines: Sequence[TraceLine], workload: WorkloadConfig) -> tuple[TraceLine, ...]:
    """The lines due in [start_s, start_s + duration_s) of the trace's own clock."""
    end = math.inf if workload.duration_s is None else workload.start_s + workload.duration_s
    kept = tuple(line for line in lines if workload.start_s <= line.timestamp_s < end)
    if not kept:
        span = f"{lines[0].timestamp_s:g}-{lines[-1].timestamp_s:g} s" if lines else "empty"
        raise TraceError(
            f"workload.start_s={workload.start_s:g} with workload.duration_s={workload.duration_s} selects no "
            f"request; the trace spans {span}"
        )
    return kept


def replay(lines: Sequence[TraceLine], workload: WorkloadConfig, rate: float | None, moved: int = 0) -> Replay:
    """Slice, then scale: to ``rate`` (the mean request rate a sweep asks for), keeping the
    trace's shape, or by ``workload.time_scale`` when no rate is given (0.5: twice as fast)."""
    kept = slice_lines(lines, workload)
    stamps = [line.timestamp_s for line in kept]
    mean, peak = own_rates(stamps)
    if rate is None or rate == mean / workload.time_scale:
        # On the trace's own schedule (compose.py fixed the rate this way): the time scale
        # itself, so that the offsets are the timestamps times it, exactly.
        scale = workload.time_scale
    elif math.isinf(rate) or math.isinf(mean):
        scale = 0.0  # all at once, as load.request_rate=inf sends a generated schedule
    else:
        scale = mean / rate
    offsets = tuple((t - stamps[0]) * scale for t in stamps)
    return Replay(kept, offsets, mean, peak, scale, moved)


def load_replay(workload: WorkloadConfig, rate: float | None) -> Replay:
    lines, moved = _read_cached(workload)
    return replay(lines, workload, rate, moved)


def _read_cached(workload: WorkloadConfig) -> tuple[tuple[TraceLine, ...], int]:
    # One read per file and settings in a process: the sweeper, the driver's check and every
    # point of a group read the same trace.
    path = Path(workload.path).expanduser() if workload.path and workload.path != BUNDLED_PATH else None
    stamp = path.stat().st_mtime_ns if path is not None and path.is_file() else 0
    return _read(workload.path, workload.timestamp_unit, workload.sort, stamp)


@cache
def _read(path: str | None, unit: str, sort: bool, _mtime: int) -> tuple[tuple[TraceLine, ...], int]:
    return read_trace(WorkloadConfig(name="trace", path=path, timestamp_unit=unit, sort=sort))


def _vocab(tokenizer: Tokenizer) -> list[int]:
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    return [i for i in range(tokenizer.vocab_size) if i not in special]


def synthesize_prompt(line: TraceLine, tokenizer: Tokenizer, vocab: Sequence[int] | None = None) -> str:
    """Deterministic text from the line's hash ids: ``input_length`` token ids, decoded; block i
    is 512 ids drawn by a generator seeded with hash id i, so lines that share hash ids share a
    prefix (and hit the prefix cache) as Mooncake's requests do. ``vocab``: the tokenizer's ids
    less its special ones, made once per replay by the caller."""
    length = line.input_length or 1
    vocab = vocab if vocab is not None else _vocab(tokenizer)
    ids: list[int] = []
    for block, hash_id in enumerate(line.hash_ids or (length,)):
        rng = random.Random(f"trace-block:{hash_id}:{block}")
        ids += [vocab[rng.randrange(len(vocab))] for _ in range(MOONCAKE_BLOCK_TOKENS)]
    while len(ids) < length:  # more tokens than the hash ids cover: a tail of its own
        rng = random.Random(f"trace-tail:{line.hash_ids}:{len(ids)}")
        ids += [vocab[rng.randrange(len(vocab))] for _ in range(MOONCAKE_BLOCK_TOKENS)]
    return tokenizer.decode(ids[:length])


def items(replayed: Replay, tokenizer: Tokenizer | None) -> list[Item]:
    """The replay's requests as prompt items, text synthesised where the trace gives lengths."""
    out = []
    vocab: list[int] | None = None
    for line in replayed.lines:
        if line.synthetic:
            if tokenizer is None:
                raise ConfigError("a trace with input_length lines needs the model's tokenizer to build its prompts")
            vocab = vocab if vocab is not None else _vocab(tokenizer)  # one scan of the vocabulary per replay
            prompt = synthesize_prompt(line, tokenizer, vocab)
        else:
            prompt = line.prompt or line.messages[-1]["content"]
        out.append(Item(prompt=prompt, category=line.category, output_tokens=line.output_tokens,
                        messages=line.messages))  # fmt: skip
    return out


# The bundled trace: about 150 s at 1x, bursts between lulls, three kinds of text (code
# editing accepts n-gram drafts well, chat poorly), from Python's own text and source.
_BUNDLED_PHASES = ((30.0, 0.3), (20.0, 1.2), (40.0, 0.2), (20.0, 1.0), (40.0, 0.35))  # (seconds, req/s)
_BUNDLED_KINDS = (("code_edit", bundled.code_edit), ("chat", bundled.chat), ("summarize", bundled.summarize))


@cache
def bundled_trace() -> tuple[TraceLine, ...]:
    rng = random.Random("specsweep-bundled-trace")
    stamps: list[float] = []
    start = 0.0
    for seconds, rate in _BUNDLED_PHASES:
        t = start + rng.expovariate(rate)
        while t < start + seconds:
            stamps.append(round(t, 3))
            t += rng.expovariate(rate)
        start += seconds
    pools = {name: make(random.Random(f"bundled-trace:{name}"), len(stamps)) for name, make in _BUNDLED_KINDS}
    lines = []
    for i, t in enumerate(stamps):
        name = _BUNDLED_KINDS[rng.randrange(len(_BUNDLED_KINDS))][0]
        item = pools[name][i]
        lines.append(TraceLine(t, item.category, prompt=item.prompt, output_tokens=item.output_tokens))
    return tuple(lines)


def with_rate(workload: WorkloadConfig, rate: float | None) -> float:
    """The mean rate a trace point replays at: ``rate`` where a sweep sets one, else the
    slice's own mean rate divided by ``workload.time_scale``."""
    if rate is not None:
        return rate
    own = load_replay(workload, None)
    return own.own_mean_rate / workload.time_scale if workload.time_scale > 0 else math.inf
