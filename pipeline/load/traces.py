"""Traces: a user's own requests, replayed on their own schedule (docs/traces.md).

A trace is JSONL, one request a line, in either of two shapes:

- ours: ``timestamp`` (seconds from the trace's start, or ms with
  ``workload.timestamp_unit=ms``), ``prompt`` (text) or ``messages`` (a chat list), and
  optional ``output_tokens`` and ``category``;
- vLLM's ``timed_trace`` / Mooncake lines: ``timestamp`` in ms, ``input_length``,
  ``output_length`` and ``hash_ids``. Their text is synthesised, deterministically, from the
  hash ids with the model's tokenizer (a shared hash id is a shared 512-token prefix block,
  as in Mooncake), so acceptance on them says little about real traffic.

Lines with a ``conversation_id`` are the turns of one conversation (ordered by ``turn``, or
by time): the first is due at its timestamp, each later one a think time after the previous
turn's answer has finished (``delay_s``, else the timestamp gap), with the server's actual
answer in its history. The load generator sends them so (loadgen.py).

Reading is strict: a line that cannot be replayed as written is refused with its number and
the fix, before any server starts. Slicing and scaling are pure functions of the parsed lines.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from pipeline.config import ConfigError, WorkloadConfig
from pipeline.load import bundled, lengths_only
from pipeline.load.datasets import OUTPUT_FIELDS, DatasetError, _field, _jsonl, output_length
from pipeline.load.items import Item, Tokenizer

TIMESTAMP_UNITS = {"s": 1.0, "ms": 1e-3}
BUNDLED_PATH = "bundled"  # workload.path=bundled: the trace built from Python's own text
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
    conversation: str = ""  # conversation_id; "" for a request of its own
    turn: int = 0  # its place in the conversation, from 1 (read_trace numbers them)
    delay_s: float | None = None  # think time after the previous turn's answer, as the trace says
    given_turn: int | None = None  # the turn number the line gave, as read (any increasing numbers)

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
    # Per line: the think time before it (seconds after the previous turn's answer), None for
    # a conversation's first turn or a request of its own, whose offset is its due time.
    delays: tuple[float | None, ...] = ()

    @property
    def conversations(self) -> int:
        return len({line.conversation for line in self.lines if line.conversation})

    @property
    def synthetic(self) -> bool:
        return any(line.synthetic for line in self.lines)


# The fields a line may carry; anything else is listed before launch (read_trace's ignored
# fields) unless workload.metadata_fields declares it.
TEXT_FIELDS = ("prompt", "messages")
LENGTH_FIELDS = ("input_length", "hash_ids")
CONVERSATION_FIELDS = ("conversation_id", "turn", "delay_s")
KNOWN_FIELDS = frozenset(("timestamp", "category", *TEXT_FIELDS, *LENGTH_FIELDS, *OUTPUT_FIELDS, *CONVERSATION_FIELDS))
# The roles a chat template knows; a server refuses another at run time, so it is refused here.
ROLES = ("system", "user", "assistant", "tool")


def _file_unit(unit: str, records: Sequence[object]) -> str:
    """The timestamps' unit, one for the whole file: ``auto`` is ms for a file of lengths-only
    lines only (a Mooncake or timed_trace export), seconds for any file that holds a text line,
    so that no two lines of one file are read in different units."""
    if unit != "auto":
        return unit
    lengths_only = all(isinstance(r, dict) and any(name in r for name in LENGTH_FIELDS) for r in records)
    return "ms" if records and lengths_only else "s"


def _line(where: str, record: object, unit: str) -> TraceLine:
    line = _request(where, record, unit)
    assert isinstance(record, dict)  # _request refused anything else
    if "conversation_id" not in record:
        for name in ("turn", "delay_s"):
            if name in record:
                raise TraceError(f"{where}: field '{name}' belongs to a conversation's turn; add its 'conversation_id'")
        return line
    conversation = record["conversation_id"]
    if isinstance(conversation, bool) or not isinstance(conversation, (str, int)) or str(conversation) == "":
        raise TraceError(f"{where}: field 'conversation_id' must be a non-empty string or an integer")
    turn = _field(record, "turn", int, where, required=False)
    delay = record.get("delay_s")
    if delay is not None and (
        isinstance(delay, bool) or not isinstance(delay, (int, float)) or not delay >= 0 or math.isinf(delay)
    ):
        raise TraceError(f"{where}: field 'delay_s' must be a number of seconds >= 0, found {delay!r}")
    return replace(
        line, conversation=str(conversation), given_turn=turn, delay_s=None if delay is None else float(delay)
    )


def _request(where: str, record: object, unit: str) -> TraceLine:
    if not isinstance(record, dict):
        raise TraceError(f"{where}: expected a JSON object, found {type(record).__name__}")
    texts = [name for name in TEXT_FIELDS if name in record]
    lengths = [name for name in LENGTH_FIELDS if name in record]
    if len(texts) > 1:
        raise TraceError(
            f"{where}: the line gives both 'prompt' and 'messages'; a request is one or the other: keep 'messages' "
            f"(the whole chat, its last user turn included) or 'prompt' (one user text)"
        )
    if texts and lengths:
        raise TraceError(
            f"{where}: the line gives its text ('{texts[0]}') and '{lengths[0]}', which says how long a text "
            f"specsweep should make up; keep the text (sent as it is) or the lengths, not both"
        )
    mooncake = bool(lengths)
    factor = TIMESTAMP_UNITS["ms" if unit == "auto" and mooncake else ("s" if unit == "auto" else unit)]
    at = _timestamp(where, record) * factor
    category = _field(record, "category", str, where, required=False) or ("synthetic" if mooncake else "trace")
    output = output_length(where, record)
    if mooncake:
        return _by_length(where, record, at, category, output)
    return _by_text(where, record, at, category, output)


def _timestamp(where: str, record: dict) -> float:
    stamp = record.get("timestamp")
    if stamp is None:
        raise TraceError(f"{where}: field 'timestamp' is missing; every line of a trace says when it is due")
    if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or not math.isfinite(stamp):
        raise TraceError(f"{where}: field 'timestamp' must be a number, found {stamp!r}")
    if stamp < 0:
        raise TraceError(f"{where}: timestamp {stamp} is negative; timestamps count from the trace's start")
    return float(stamp)


def _by_length(where: str, record: dict, at: float, category: str, output: int | None) -> TraceLine:
    """A Mooncake-style line: the prompt's length and its prefix blocks, no text."""
    length = _field(record, "input_length", int, where)
    hashes = _field(record, "hash_ids", list, where, required=False) or []
    if length < 1:
        raise TraceError(f"{where}: input_length={length} must be >= 1")
    if not all(isinstance(h, int) and not isinstance(h, bool) for h in hashes):
        raise TraceError(f"{where}: field 'hash_ids' must be a list of integers")
    return TraceLine(at, category, output_tokens=output, input_length=length, hash_ids=tuple(hashes))


def _by_text(where: str, record: dict, at: float, category: str, output: int | None) -> TraceLine:
    """A line with its text: a prompt, or chat messages."""
    if "messages" in record:
        messages = _field(record, "messages", list, where)
        ok = all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        )
        if not messages or not ok:
            raise TraceError(f"{where}: 'messages' must be a non-empty list of {{'role': ..., 'content': ...}} objects")
        strange = next((m["role"] for m in messages if m["role"] not in ROLES), None)
        if strange is not None:
            raise TraceError(
                f"{where}: a message has role {strange!r}, which a chat template does not know; use one of "
                f"{', '.join(ROLES)}"
            )
        kept = tuple({"role": m["role"], "content": m["content"]} for m in messages)
        return TraceLine(at, category, messages=kept, output_tokens=output)
    prompt = record.get("prompt")
    if prompt is None:
        raise TraceError(
            f"{where}: the line has neither 'prompt', 'messages' nor 'input_length'; give the request's text "
            f"(prompt or messages), or its length (input_length, with hash_ids, as vLLM's timed_trace)"
        )
    if not isinstance(prompt, str) or not prompt.strip():
        raise TraceError(f"{where}: field 'prompt' must be non-empty text")
    return TraceLine(at, category, prompt=prompt, output_tokens=output)


@dataclass(frozen=True)
class TraceFile:
    """A trace as read: its lines in time order, how many ``workload.sort`` moved, and the
    fields it carries that specsweep does not read (name, lines), metadata included."""

    lines: tuple[TraceLine, ...]
    moved: int = 0
    extra_fields: tuple[tuple[str, int], ...] = ()

    def ignored(self, metadata: Sequence[str]) -> tuple[tuple[str, int], ...]:
        """The extra fields not declared as metadata (``workload.metadata_fields``)."""
        return tuple((name, count) for name, count in self.extra_fields if name not in metadata)


def ignored_text(ignored: Sequence[tuple[str, int]]) -> str:
    """ "user_id on 41 lines, region on 3 lines": what the trace carries that is not replayed."""
    return ", ".join(f"{name} on {count} line{'s' if count != 1 else ''}" for name, count in ignored)


def read_trace(workload: WorkloadConfig) -> TraceFile:
    """The trace's lines in time order, how many ``workload.sort`` moved, and its extra fields."""
    if workload.path == BUNDLED_PATH:
        return TraceFile(bundled_trace())
    if not workload.path:
        raise ConfigError(
            f"workload.name=trace replays a file: set workload.path=/path/to/trace.jsonl "
            f"(or workload.path={BUNDLED_PATH} for the trace built from Python's own text)"
        )
    path = Path(workload.path).expanduser()
    if not path.is_file():
        raise TraceError(f"workload.path={workload.path}: no such file")
    rows = _jsonl(path)
    unit = _file_unit(workload.timestamp_unit, [record for _, record in rows])
    lines = [_line(where, record, unit) for where, record in rows]
    if not lines:
        raise TraceError(f"{path}: the trace has no request")
    extra = Counter(name for _, record in rows for name in record if name not in KNOWN_FIELDS)
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
    return TraceFile(_number_turns(lines, path), moved, tuple(sorted(extra.items())))


def _number_turns(lines: Sequence[TraceLine], path: Path) -> tuple[TraceLine, ...]:
    """Each conversation's turns numbered 1, 2, ... in time order. Numbers a trace gives need
    only increase within a conversation (from 0, from 1, with gaps): a numbering that repeats
    or contradicts the timestamps is refused."""
    last: dict[str, tuple[int, int | None]] = {}  # conversation -> (its latest place, its given number)
    out = []
    for line in lines:
        if not line.conversation:
            out.append(line)
            continue
        place, given = last.get(line.conversation, (0, None))
        if given is not None and line.given_turn is not None and line.given_turn <= given:
            raise TraceError(
                f"{path}: conversation {line.conversation!r}: turn {line.given_turn} is due at "
                f"{line.timestamp_s:g} s, after turn {given}; a conversation's turn numbers must increase in time "
                f"order, each used once"
            )
        if place and line.messages:
            raise TraceError(
                f"{path}: conversation {line.conversation!r}: turn {place + 1} gives 'messages'; a later turn gives "
                f"only its new user text as 'prompt' (its history is the earlier turns and the server's answers)"
            )
        last[line.conversation] = (place + 1, line.given_turn if line.given_turn is not None else given)
        out.append(replace(line, turn=place + 1))
    return tuple(out)


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
    # A conversation is kept or left whole, by its first turn: a later turn needs its history.
    starts: dict[str, float] = {}
    for line in lines:
        starts.setdefault(line.conversation, line.timestamp_s)
    kept = tuple(
        line
        for line in lines
        if workload.start_s <= (starts[line.conversation] if line.conversation else line.timestamp_s) < end
    )
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
    return Replay(kept, offsets, mean, peak, scale, moved, _delays(kept, workload, scale))


def _delays(lines: Sequence[TraceLine], workload: WorkloadConfig, scale: float) -> tuple[float | None, ...]:
    """Each later turn's think time: workload.think_time_s where set, else the line's delay_s,
    else the gap to the previous turn's timestamp; a trace's own figures scale with the replay."""
    previous: dict[str, float] = {}
    out: list[float | None] = []
    for line in lines:
        if not line.conversation or line.conversation not in previous:
            out.append(None)
        elif workload.think_time_s is not None:
            out.append(workload.think_time_s)
        else:
            gap = line.delay_s if line.delay_s is not None else line.timestamp_s - previous[line.conversation]
            out.append(gap * scale)
        if line.conversation:
            previous[line.conversation] = line.timestamp_s
    return tuple(out)


def load_replay(workload: WorkloadConfig, rate: float | None) -> Replay:
    read = read_file(workload)
    return replay(read.lines, workload, rate, read.moved)


def read_file(workload: WorkloadConfig) -> TraceFile:
    """The trace, read once per file and settings in a process: the sweeper, the driver's
    check and every point of a group read the same trace."""
    path = Path(workload.path).expanduser() if workload.path and workload.path != BUNDLED_PATH else None
    stamp = path.stat().st_mtime_ns if path is not None and path.is_file() else 0
    return _read(workload.path, workload.timestamp_unit, workload.sort, stamp)


@cache
def _read(path: str | None, unit: str, sort: bool, _mtime: int) -> TraceFile:
    return read_trace(WorkloadConfig(name="trace", path=path, timestamp_unit=unit, sort=sort))


def replay_items(replayed: Replay, tokenizer: Tokenizer | None, workload: WorkloadConfig | None = None) -> list[Item]:
    """The replay's requests as prompt items. A lengths-only line's prompt is ``input_length``
    token ids (lengths_only.py): sent as ids on the completions and generate endpoints, and as text
    the tokenizer counts to exactly that length on the chat endpoint (``workload.endpoint``)."""
    workload = workload or WorkloadConfig(name="trace")
    out = []
    vocab: list[int] | None = None
    for number, (line, delay) in enumerate(
        zip(replayed.lines, replayed.delays or [None] * len(replayed.lines), strict=True), start=1
    ):
        ids: list[int] = []
        if line.synthetic:
            if tokenizer is None:
                raise ConfigError("a trace with input_length lines needs the model's tokenizer to build its prompts")
            vocab = vocab if vocab is not None else lengths_only.vocabulary(tokenizer)  # one scan per replay
            ids, prompt = _lengths_only(line, tokenizer, vocab, workload, number)
        else:
            prompt = line.prompt or line.messages[-1]["content"]
        out.append(
            Item(
                prompt=prompt,
                category=line.category,
                output_tokens=line.output_tokens,
                messages=line.messages,
                conversation=line.conversation,
                turn=line.turn,
                delay_s=delay,
                prompt_ids=tuple(ids) if workload.endpoint != "chat" else (),
                input_length=line.input_length,
            )
        )
    return out


def _lengths_only(
    line: TraceLine, tokenizer: Tokenizer, vocab: Sequence[int], workload: WorkloadConfig, number: int
) -> tuple[list[int], str]:
    length = line.input_length or 1
    ids = lengths_only.prompt_ids(length, line.hash_ids, vocab, workload.hash_block_tokens)
    if workload.endpoint != "chat":
        return ids, tokenizer.decode(ids)
    try:
        return ids, lengths_only.chat_text(ids, length, tokenizer, vocab)
    except lengths_only.LengthError as exc:
        raise TraceError(f"the slice's request {number} (due at {line.timestamp_s:g} s): {exc}") from exc


# The bundled trace: about 150 s at 1x, bursts between lulls, three kinds of text (code
# editing accepts n-gram drafts well, chat poorly), from Python's own text and source.
_BUNDLED_PHASES = ((30.0, 0.3), (20.0, 1.2), (40.0, 0.2), (20.0, 1.0), (40.0, 0.35))  # (seconds, req/s)
_BUNDLED_KINDS = (("code_edit", bundled.code_edit), ("chat", bundled.chat), ("summarize", bundled.summarize_items))


# Its conversations: (start s, kind, think time s), three turns each. A code conversation asks
# for edits of the function just written (n-gram drafts copy it); a chat one, for more words.
_BUNDLED_CONVERSATIONS = ((8.0, "code_edit", 4.0), (36.0, "chat", 6.0), (94.0, "code_edit", 3.0), (118.0, "chat", 5.0))
_FOLLOW_UPS = {
    "code_edit": (
        "Now add a short docstring to the function you wrote. Reply with the full function only.",
        "Finally, give the function a clearer name. Reply with the full function only.",
    ),
    "chat": ("Tell me more about that, in a few sentences.", "Now sum it all up in one sentence."),
}


def _bundled_conversations() -> list[TraceLine]:
    lines = []
    for n, (start, kind, think) in enumerate(_BUNDLED_CONVERSATIONS):
        first = dict(_BUNDLED_KINDS)[kind](random.Random(f"bundled-conversation:{n}"), 1)[0]
        turns = (first.prompt, *_FOLLOW_UPS[kind])
        for turn, prompt in enumerate(turns, start=1):
            lines.append(
                TraceLine(
                    start + (turn - 1) * think,
                    first.category,
                    prompt=prompt,
                    output_tokens=first.output_tokens,
                    conversation=f"bundled-{n + 1}",
                    turn=turn,
                    delay_s=think if turn > 1 else None,
                )
            )
    return lines


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
    return tuple(sorted([*lines, *_bundled_conversations()], key=lambda line: line.timestamp_s))


def over_context(
    lines: Sequence[TraceLine],
    max_model_len: int,
    max_tokens: int,
    count: Callable[[TraceLine], int] | None = None,
) -> list[TraceLine]:
    """The lines whose prompt plus output exceeds ``max_model_len``, which a server refuses at
    run time: a lengths-only line by its input_length, a text line by ``count`` (the model's
    tokenizer; without it, by its output length and one prompt token, the least it can be). A
    conversation's later turn carries its history: the earlier turns' prompts and outputs too."""
    history: dict[str, int] = {}
    over = []
    for line in lines:
        prompt = line.input_length if line.synthetic else (count(line) if count is not None else 1)
        assert prompt is not None
        output = line.output_tokens or max_tokens
        context = history.get(line.conversation, 0) + prompt
        if line.conversation:
            history[line.conversation] = context + output
        if context + output > max_model_len:
            over.append(line)
    return over


def over_context_text(over: Sequence[TraceLine], max_model_len: int, counted: str) -> str:
    """The refusal of :func:`over_context`'s lines: how many, the first, and the fix."""
    return (
        f"{len(over)} line(s) of the trace ask for more tokens than engine.max_model_len={max_model_len} holds "
        f"({counted} plus the output length; the first is due at {over[0].timestamp_s:g} s); a server would "
        f"refuse them at run time: raise engine.max_model_len (the servers' --max-model-len), or remove those "
        f"lines from the trace"
    )


def with_rate(workload: WorkloadConfig, rate: float | None) -> float:
    """The mean rate a trace point replays at: ``rate`` where a sweep sets one, else the
    slice's own mean rate divided by ``workload.time_scale``."""
    if rate is not None:
        return rate
    own = load_replay(workload, None)
    return own.own_mean_rate / workload.time_scale if workload.time_scale > 0 else math.inf
