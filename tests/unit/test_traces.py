"""Traces: the formats, the slice and the scale, and what a point sends from them."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from pipeline.compose import resolve_trace_rate
from pipeline.config import ConfigError, EngineConfig, JobConfig, LoadConfig, WorkloadConfig
from pipeline.load import lengths_only, traces
from pipeline.load.client import ClientOptions, request_body
from pipeline.run.job import point_requests
from pipeline.run.plan import point_offsets


class WordTokenizer:
    """One token per word of a fixed vocabulary: lengths are exact and easy to check."""

    vocab_size = 64
    all_special_ids = (0,)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [int(w[1:]) if w[:1] == "w" and w[1:].isdigit() else 1 + len(w) % 63 for w in text.split()]

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(f"w{i}" for i in ids)

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool, tokenize: bool) -> str:
        # Four tokens of its own around one message: "<s> user ... </s> assistant".
        return " ".join(f"<s> {m['role']} {m['content']} </s>" for m in messages) + " assistant"


def _write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _job(path: str, rate: float | None = None, **workload: object) -> JobConfig:
    job = JobConfig(
        workload=WorkloadConfig(name="trace", path=path, **workload),  # type: ignore[arg-type]
        load=LoadConfig(request_rate=rate, warmup_requests=1),
    )
    return resolve_trace_rate(job)


OURS = [
    {"timestamp": 0.0, "prompt": "def f(x): return x", "category": "code_edit", "output_tokens": 12},
    {
        "timestamp": 1.5,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "category": "chat",
    },
    {"timestamp": 2.0, "prompt": "Summarise PEP 8.", "category": "summarize"},
    {"timestamp": 6.0, "prompt": "Add type hints.", "category": "code_edit"},
]


def test_our_lines_are_replayed_at_their_own_timestamps_exactly(tmp_path: Path) -> None:
    job = _job(_write(tmp_path / "t.jsonl", OURS))
    assert job.load.request_rate == pytest.approx(3 / 6.0)  # the trace's own mean rate, fixed at compose
    sends = point_requests(job, WordTokenizer())
    assert sends.offsets == (0.0, 1.5, 2.0, 6.0)  # scale 1: the timestamps themselves
    assert [r.category for r in sends.requests] == ["code_edit", "chat", "summarize", "code_edit"]
    assert sends.requests[0].max_tokens == 12 and sends.requests[2].max_tokens == 128  # output_tokens, else the cap
    assert sends.metrics["trace_requests"] == 4 and sends.metrics["trace_scale"] == 1.0
    assert sends.metrics["trace_mean_rate"] == pytest.approx(0.5) and sends.metrics["trace_peak_rate"] == 0.4
    assert sends.warmup[0].prompt == "Add type hints." and sends.warmup[0].max_tokens <= 32  # the slice's last
    # A messages line is sent as its whole history on the chat endpoint.
    _, body = request_body(sends.requests[1], ClientOptions(base_url="http://x", model="m"))
    assert body["messages"] == OURS[1]["messages"]
    _, plain = request_body(sends.requests[0], ClientOptions(base_url="http://x", model="m"))
    assert plain["messages"] == [{"role": "user", "content": "def f(x): return x"}]
    assert point_offsets(job) == sends.offsets  # the plan and the dry run see the same schedule


def test_time_scale_and_rate_scaling_keep_the_shape(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", OURS)
    fast = point_requests(_job(path, time_scale=0.5), WordTokenizer())
    assert fast.offsets == (0.0, 0.75, 1.0, 3.0)
    scaled = point_requests(_job(path, rate=2.0), WordTokenizer())  # mean 0.5/s scaled to 2/s
    assert scaled.offsets == pytest.approx((0.0, 0.375, 0.5, 1.5))
    assert scaled.metrics["trace_scale"] == pytest.approx(0.25)
    # The gaps keep their proportions: bursts stay bursts.
    gaps = [b - a for a, b in zip(scaled.offsets, scaled.offsets[1:], strict=False)]
    assert gaps == pytest.approx([g / 4 for g in (1.5, 0.5, 4.0)])


def test_a_slice_is_cut_on_the_trace_clock_and_starts_at_zero(tmp_path: Path) -> None:
    job = _job(_write(tmp_path / "t.jsonl", OURS), start_s=1.0, duration_s=2.0)
    sends = point_requests(job, WordTokenizer())
    assert sends.offsets == (0.0, 0.5) and [r.category for r in sends.requests] == ["chat", "summarize"]


def test_mooncake_lines_are_in_ms_and_their_text_is_built_from_the_hash_ids(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [7, 8]},
        {"timestamp": 2500, "input_length": 700, "output_length": 5, "hash_ids": [7, 9]},
    ]
    path = _write(tmp_path / "mooncake.jsonl", rows)
    tok = WordTokenizer()
    # The completions endpoint: the token ids themselves, exactly the stated lengths (as vLLM sends them).
    sends = point_requests(_job(path, endpoint="completions"), tok)
    assert sends.offsets == (0.0, 2.5)  # auto: ms for Mooncake lines
    first, second = (list(r.prompt_ids) for r in sends.requests)
    assert (len(first), len(second)) == (600, 700)
    assert [r.prompt_tokens for r in sends.requests] == [600, 700]
    assert first[:512] == second[:512] and first[512:600] != second[512:600]  # hash id 7: a shared prefix block
    assert 0 not in first  # no special token
    assert [r.max_tokens for r in sends.requests] == [20, 5] and sends.metrics["trace_synthetic"] == 1.0
    _, body = request_body(sends.requests[0], ClientOptions(base_url="http://x", model="m", endpoint="completions"))
    assert body["prompt"] == first
    again = point_requests(_job(path, endpoint="completions"), tok)
    assert [r.prompt_ids for r in again.requests] == [r.prompt_ids for r in sends.requests]  # deterministic
    assert {r.category for r in sends.requests} == {"synthetic"}
    # The chat endpoint: text whose templated prompt the tokenizer counts at exactly the stated length.
    chat = point_requests(_job(path), tok)
    assert [lengths_only.chat_tokens(tok, r.prompt) for r in chat.requests] == [600, 700]
    assert not any(r.prompt_ids for r in chat.requests)
    assert tok.encode(chat.requests[0].prompt)[:512] == first[:512]  # the same shared block, as text


def test_ms_timestamps_on_our_lines(tmp_path: Path) -> None:
    job = _job(
        _write(tmp_path / "t.jsonl", [{"timestamp": 0, "prompt": "a"}, {"timestamp": 250, "prompt": "b"}]),
        timestamp_unit="ms",
    )
    assert point_requests(job, WordTokenizer()).offsets == (0.0, 0.25)


def test_sort_replays_a_backwards_file_in_time_order_and_counts_the_moves(tmp_path: Path) -> None:
    rows = [{"timestamp": 5, "prompt": "late"}, {"timestamp": 1, "prompt": "early"}, {"timestamp": 9, "prompt": "x"}]
    path = _write(tmp_path / "t.jsonl", rows)
    with pytest.raises(ConfigError, match="request 2 is due at 1 s, before request 1"):
        _job(path)
    sends = point_requests(_job(path, sort=True), WordTokenizer())
    assert [r.prompt for r in sends.requests] == ["early", "late", "x"] and sends.offsets == (0.0, 4.0, 8.0)
    assert sends.metrics["trace_sorted_lines"] == 2


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"prompt": "a"}, "field 'timestamp' is missing"),
        ({"timestamp": "soon", "prompt": "a"}, "must be a number"),
        ({"timestamp": -1, "prompt": "a"}, "is negative"),
        ({"timestamp": 0}, "neither 'prompt', 'messages' nor 'input_length'"),
        ({"timestamp": 0, "prompt": "  "}, "must be non-empty text"),
        ({"timestamp": 0, "messages": []}, "non-empty list"),
        ({"timestamp": 0, "messages": [{"role": "user"}]}, "non-empty list"),
        ({"timestamp": 0, "input_length": 0, "hash_ids": [1]}, "must be >= 1"),
        ({"timestamp": 0, "input_length": 5, "hash_ids": ["x"]}, "list of integers"),
        ({"timestamp": 0, "prompt": "a", "output_tokens": 0}, "'output_tokens' must be >= 1, found 0"),
        ({"timestamp": 0, "prompt": "a", "output_tokens": 600, "output_length": 60}, "disagree"),
        ({"timestamp": 0, "prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "both 'prompt' and"),
        ({"timestamp": 0, "messages": [{"role": "robot", "content": "b"}]}, "role 'robot'.*system, user"),
        ({"timestamp": 0, "prompt": "a", "input_length": 5}, "keep the text .* or the lengths"),
    ],
)
def test_a_line_that_cannot_be_replayed_is_refused_with_its_number(tmp_path: Path, row: dict, message: str) -> None:
    path = _write(tmp_path / "t.jsonl", [{"timestamp": 0, "prompt": "ok"}, row])
    with pytest.raises(ConfigError, match=message) as refused:
        _job(path)
    assert f"{path}:2" in str(refused.value)


def test_settings_that_contradict_a_trace_are_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", OURS)
    trace = WorkloadConfig(name="trace", path=path)
    cases = [
        (LoadConfig(request_rate=None, burstiness=0.5), trace, "a trace keeps its own"),
        (LoadConfig(request_rate=None, duration_s=10), trace, "slice it with workload.start_s"),
        (LoadConfig(request_rate=2.0), dataclasses.replace(trace, time_scale=0.5), "both set the trace's speed"),
        (LoadConfig(request_rate=None), dataclasses.replace(trace, time_scale=0), "must be a positive number"),
        (LoadConfig(request_rate=None), dataclasses.replace(trace, start_s=50), "selects no request"),
        (LoadConfig(request_rate=None), WorkloadConfig(), "it needs workload=trace"),
    ]
    for load, workload, message in cases:
        with pytest.raises(ConfigError, match=message):
            resolve_trace_rate(JobConfig(load=load, workload=workload))


def test_the_bundled_trace_is_bursty_mixes_three_kinds_and_is_the_same_everywhere() -> None:
    lines = traces.bundled_trace()
    stamps = [line.timestamp_s for line in lines]
    assert stamps == sorted(stamps) and 120 <= stamps[-1] <= 180  # 2 to 3 minutes at 1x
    categories = {line.category for line in lines}
    assert {"code_edit", "chat", "summarize"} <= categories
    mean, peak = traces.own_rates(stamps)
    assert peak > 2 * mean  # bursts between lulls, not a steady stream
    assert all(line.prompt for line in lines)
    assert traces.bundled_trace.__wrapped__() == lines  # built again from scratch: the same trace
    job = _job(traces.BUNDLED_PATH)
    assert len(point_requests(job, WordTokenizer()).requests) == len(lines)


# ---- conversations ----------------------------------------------------------------------

CONVERSATION = [
    {"timestamp": 0.0, "prompt": "def f(x): return x", "category": "code_edit"},
    {"timestamp": 1.0, "conversation_id": "c1", "prompt": "Write a haiku.", "category": "creative"},
    {"timestamp": 2.0, "prompt": "Summarise PEP 8.", "category": "summarize"},
    {"timestamp": 4.0, "conversation_id": "c1", "prompt": "Another, about rain."},
    {"timestamp": 9.0, "conversation_id": "c1", "turn": 3, "delay_s": 0.5, "prompt": "Now one line."},
]


def test_a_conversation_is_numbered_and_paced_by_its_gaps_or_its_delays(tmp_path: Path) -> None:
    job = _job(_write(tmp_path / "t.jsonl", CONVERSATION), time_scale=0.5)
    sends = point_requests(job, WordTokenizer())
    turns = [(r.conversation, r.turn, r.after, r.delay_s) for r in sends.requests]
    assert turns == [
        ("", 0, None, 0.0),
        ("c1", 1, None, 0.0),
        ("", 0, None, 0.0),
        ("c1", 2, 1, 1.5),  # the timestamp gap (3 s), scaled by 0.5
        ("c1", 3, 3, 0.25),
    ]  # its own delay_s, scaled
    assert sends.metrics["trace_conversations"] == 1.0
    thought = point_requests(_job(_write(tmp_path / "t.jsonl", CONVERSATION), think_time_s=2.0), None)
    assert [r.delay_s for r in thought.requests if r.after is not None] == [2.0, 2.0]  # the setting wins, unscaled


def test_a_slice_keeps_or_drops_a_conversation_whole(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", CONVERSATION)
    late = point_requests(_job(path, start_s=1.5), None).requests  # c1 began before the slice
    assert [r.prompt for r in late] == ["Summarise PEP 8."]
    early = point_requests(_job(path, duration_s=1.5), None).requests  # c1's later turns come along
    assert [r.turn for r in early if r.conversation] == [1, 2, 3]


def test_a_later_turn_is_sent_with_the_earlier_turns_and_the_servers_answers() -> None:
    from pipeline.load.client import RequestRecord
    from pipeline.load.items import Request
    from pipeline.load.loadgen import next_turn

    first = Request(0, "Write a haiku.", "creative", 16, conversation="c", turn=1)
    second = Request(1, "Another.", "creative", 16, conversation="c", turn=2, after=0)
    answer = RequestRecord(0, "creative", 0.0, 0.0, text="Old pond, a frog.")
    sent = next_turn(second, ({"role": "user", "content": first.prompt},), answer)
    assert sent.messages == (
        {"role": "user", "content": "Write a haiku."},
        {"role": "assistant", "content": "Old pond, a frog."},
        {"role": "user", "content": "Another."},
    )
    _, body = request_body(sent, ClientOptions(base_url="http://x", model="m"))
    assert body["messages"] == list(sent.messages)


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        ([{"timestamp": 0, "prompt": "a", "turn": 2}], "add its 'conversation_id'"),
        ([{"timestamp": 0, "prompt": "a", "conversation_id": ""}], "conversation_id' must be a non-empty"),
        (
            [
                {"timestamp": 0, "prompt": "a", "conversation_id": "c", "turn": 3},
                {"timestamp": 1, "prompt": "b", "conversation_id": "c", "turn": 1},
            ],
            "turn numbers must increase in time order",
        ),
        ([{"timestamp": 0, "prompt": "a", "conversation_id": "c", "delay_s": -1}], "'delay_s' must be a number"),
        (
            [
                {"timestamp": 0, "prompt": "a", "conversation_id": "c", "turn": 2},
                {"timestamp": 1, "prompt": "b", "conversation_id": "c", "turn": 2},
            ],
            "must increase in time order, each used once",
        ),
        (
            [
                {"timestamp": 0, "prompt": "a", "conversation_id": "c"},
                {"timestamp": 1, "messages": [{"role": "user", "content": "b"}], "conversation_id": "c"},
            ],
            "gives only its new user text",
        ),
    ],
)
def test_bad_conversations_are_refused_with_their_fix(tmp_path: Path, rows: list[dict], match: str) -> None:
    with pytest.raises((traces.TraceError, ConfigError), match=match):
        _job(_write(tmp_path / f"bad{abs(hash(match))}.jsonl", rows))


def test_conversations_need_the_chat_endpoint_and_one_client(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", CONVERSATION)
    with pytest.raises(ConfigError, match="use workload.endpoint=chat"):
        _job(path, endpoint="completions")
    with pytest.raises(ConfigError, match="use load.client_workers=1"):
        resolve_trace_rate(
            JobConfig(
                workload=WorkloadConfig(name="trace", path=path), load=LoadConfig(request_rate=None, client_workers=2)
            )
        )
    with pytest.raises(ConfigError, match="needs workload=trace"):
        resolve_trace_rate(JobConfig(workload=WorkloadConfig(think_time_s=1.0)))
    with pytest.raises(ConfigError, match="think_time_s=-1"):
        _job(path, think_time_s=-1.0)


def test_the_bundled_trace_holds_three_turn_conversations() -> None:
    replayed = traces.load_replay(WorkloadConfig(name="trace", path=traces.BUNDLED_PATH), None)
    assert replayed.conversations >= 3
    by_conversation: dict[str, list[int]] = {}
    for line in replayed.lines:
        if line.conversation:
            by_conversation.setdefault(line.conversation, []).append(line.turn)
    assert all(turns == [1, 2, 3] for turns in by_conversation.values())
    assert len({line.category for line in replayed.lines}) >= 3


def test_fields_not_replayed_are_listed_unless_declared_metadata(tmp_path: Path) -> None:
    rows = [{"timestamp": i, "prompt": "a", "user_id": f"u{i}", "region": "eu"} for i in range(41)]
    rows[0] |= {"region": "us", "tenant": "t"}
    path = _write(tmp_path / "t.jsonl", rows)
    read = traces.read_file(WorkloadConfig(name="trace", path=path))
    assert traces.ignored_text(read.ignored([])) == "region on 41 lines, tenant on 1 line, user_id on 41 lines"
    assert read.ignored(["user_id", "region"]) == (("tenant", 1),)
    sends = point_requests(_job(path, metadata_fields=["region"]), WordTokenizer())
    assert sends.tags == {"trace.ignored_fields": "tenant on 1 line, user_id on 41 lines"}


def test_turns_numbered_from_zero_or_with_gaps_are_replayed_in_order(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 0, "prompt": "a", "conversation_id": "c", "turn": 0},
        {"timestamp": 1, "prompt": "b", "conversation_id": "c", "turn": 1},
        {"timestamp": 2, "prompt": "x", "conversation_id": "d", "turn": 4},
        {"timestamp": 3, "prompt": "y", "conversation_id": "d", "turn": 9},
        {"timestamp": 4, "prompt": "z", "conversation_id": "d"},
    ]
    sends = point_requests(_job(_write(tmp_path / "t.jsonl", rows)), WordTokenizer())
    assert [(r.conversation, r.turn) for r in sends.requests] == [("c", 1), ("c", 2), ("d", 1), ("d", 2), ("d", 3)]


def test_a_lines_stated_output_length_is_sent_past_max_tokens_and_the_dry_run_says_so(tmp_path: Path) -> None:
    from pipeline.run.plan import output_lengths_text

    rows = [
        {"timestamp": 0, "prompt": "a", "output_length": 600},
        {"timestamp": 1, "prompt": "b", "output_tokens": 300},
        {"timestamp": 2, "prompt": "c"},
    ]
    job = _job(_write(tmp_path / "t.jsonl", rows))
    assert [r.max_tokens for r in point_requests(job, WordTokenizer()).requests] == [600, 300, 128]
    text = output_lengths_text(job)
    assert "output lengths median 300, p90 600, max 600 tokens; 2 of 3 lines give their own" in text
    assert "the rest workload.max_tokens=128" in text and "workload.ignore_eos=true keeps to them" in text


def test_a_line_longer_than_the_context_is_refused_with_the_count_and_the_fix(tmp_path: Path) -> None:
    from pipeline.run.job import check_trace

    rows = [{"timestamp": 0, "prompt": "w1 " * 60, "output_tokens": 50}, {"timestamp": 1, "prompt": "w2 w3"}]
    job = dataclasses.replace(_job(_write(tmp_path / "t.jsonl", rows)), engine=EngineConfig(max_model_len=100))
    with pytest.raises(
        ConfigError, match=r"2 line\(s\) of the trace .*max_model_len=100 holds.*raise engine.max_model_len"
    ):
        check_trace(job, WordTokenizer())  # 60 words, 4 template tokens and 50 out: 114
    check_trace(dataclasses.replace(job, engine=EngineConfig(max_model_len=140)), WordTokenizer())  # 6 + 128 the other


class MergingTokenizer(WordTokenizer):
    """Decoding then encoding is not one for one: "w7 w7" reads back as one token (id 63), as a
    BPE tokenizer merges across the boundary of two random tokens."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return super().encode(text.replace("w7 w7", "w63"))


def test_chat_text_is_grown_or_cut_until_the_templated_prompt_is_exactly_its_length() -> None:
    tok = MergingTokenizer()
    ids = [7] * 40 + list(range(1, 41))
    text = lengths_only.chat_text(ids, 30, tok, list(range(1, 64)))
    assert lengths_only.chat_tokens(tok, text) == 30  # four of the template's own, 26 of the text
    with pytest.raises(
        lengths_only.LengthError, match="use workload.endpoint=completions|with workload.endpoint=completions"
    ):
        lengths_only.chat_text(ids, 3, tok, list(range(1, 64)))  # shorter than the template itself


def test_lengths_only_blocks_depend_on_the_hash_id_alone_and_the_block_size_is_a_setting() -> None:
    vocab = list(range(1, 64))
    a = lengths_only.prompt_ids(40, [5, 6], vocab, 16)
    b = lengths_only.prompt_ids(40, [5, 9], vocab, 16)
    assert len(a) == 40 and a[:16] == b[:16] and a[16:32] != b[16:32]
    assert lengths_only.prompt_ids(20, [], vocab, 16) == lengths_only.prompt_ids(20, [], vocab, 16)  # a tail of its own


def test_a_file_is_read_in_one_unit_whatever_its_lines_shapes(tmp_path: Path) -> None:
    """timestamp_unit=auto: ms for a file of lengths-only lines alone (a Mooncake or timed_trace
    export), seconds for a file with any text line, so no two lines are read in different units."""
    from pipeline.config import WorkloadConfig

    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(
        '{"timestamp": 1.0, "prompt": "hello"}\n{"timestamp": 2.2, "input_length": 30, "output_length": 4}\n'
    )
    lines = traces.read_trace(WorkloadConfig(name="trace", path=str(mixed))).lines
    assert [line.timestamp_s for line in lines] == [1.0, 2.2]
    mooncake = tmp_path / "mooncake.jsonl"
    mooncake.write_text(
        '{"timestamp": 0, "input_length": 30, "output_length": 4}\n{"timestamp": 2200, "input_length": 30, "output_length": 4}\n'
    )
    assert [line.timestamp_s for line in traces.read_trace(WorkloadConfig(name="trace", path=str(mooncake))).lines] == [
        0.0,
        2.2,
    ]
