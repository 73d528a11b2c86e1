from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from pipeline.config import ConfigError, WorkloadConfig
from pipeline.load import bundled
from pipeline.load.bundled import BUNDLED
from pipeline.load.datasets import DatasetError
from pipeline.load.workloads import build_requests, split_warmup


class WordTokenizer:
    """A deterministic stand-in: one token per whitespace-separated word."""

    vocab = tuple(f"w{i}" for i in range(500))
    vocab_size = len(vocab)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [hash(w) % self.vocab_size for w in text.split()]

    def decode(self, ids: list[int]) -> str:
        return " ".join(self.vocab[i] for i in ids)


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_bundled_sets_are_seeded_and_categorised(name: str) -> None:
    a = build_requests(WorkloadConfig(name=name), 12, seed=1, tokenizer=WordTokenizer())
    b = build_requests(WorkloadConfig(name=name), 12, seed=1, tokenizer=WordTokenizer())
    c = build_requests(WorkloadConfig(name=name), 12, seed=2, tokenizer=WordTokenizer())
    assert a == b and a != c
    assert [r.index for r in a] == list(range(12))
    assert all(r.prompt and r.category and r.max_tokens == 128 and r.prompt_tokens for r in a)


def test_mixed_spans_every_kind_of_text() -> None:
    categories = {r.category for r in build_requests(WorkloadConfig(name="mixed"), 16, seed=0)}
    assert {"code_edit", "summarize", "qa"} <= categories and categories & {"chat", "creative"}


def test_warmup_prompts_are_apart_from_measured_ones() -> None:
    warmup, measured = split_warmup(WorkloadConfig(), measured=8, warmup=2, seed=0)
    assert len(warmup) == 2 and len(measured) == 8
    assert not {r.prompt for r in warmup} & {r.prompt for r in measured}


def test_more_requests_than_prompts_repeat_rather_than_fail(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    requests = build_requests(WorkloadConfig(name="jsonl", path=str(path)), 5, seed=0)
    assert len(requests) == 5 and {r.prompt for r in requests} == {"a", "b"}


def test_jsonl_with_output_lengths_and_categories(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(
        '{"prompt": "x", "output_tokens": 40, "category": "code"}\n\n{"prompt": "y", "output_tokens": 999}\n'
    )
    path.write_text(path.read_text() + '{"prompt": "z"}\n{"prompt": "v", "output_length": 7}\n')
    requests = build_requests(WorkloadConfig(name="jsonl", path=str(path), max_tokens=64), 4, seed=0)
    by_prompt = {r.prompt: r for r in requests}
    assert by_prompt["x"].max_tokens == 40 and by_prompt["x"].category == "code"
    assert by_prompt["y"].max_tokens == 999  # the length the line states, past workload.max_tokens
    assert by_prompt["z"].max_tokens == 64  # a line without one: workload.max_tokens
    assert by_prompt["v"].max_tokens == 7  # vLLM's and Mooncake's name for it
    assert by_prompt["y"].category == "jsonl" and by_prompt["y"].stated_length and not by_prompt["z"].stated_length
    path.write_text('{"prompt": "x", "output_tokens": 40, "output_length": 41}\n')
    with pytest.raises(ConfigError, match="output_length=41 and output_tokens=40 disagree"):
        build_requests(WorkloadConfig(name="jsonl", path=str(path)), 1, seed=0)


def test_spec_bench_questions(tmp_path: Path) -> None:
    path = tmp_path / "question.jsonl"
    rows = [
        {"question_id": 81, "category": "writing", "turns": ["Compose a travel blog post.", "Rewrite it."]},
        {"question_id": 101, "category": "reasoning", "turns": ["Who overtook whom?"]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    requests = build_requests(WorkloadConfig(name="spec_bench", path=str(path)), 2, seed=0)
    assert {(r.prompt, r.category) for r in requests} == {
        ("Compose a travel blog post.", "writing"),
        ("Who overtook whom?", "reasoning"),
    }


def test_sharegpt_reply_sets_output_length(tmp_path: Path) -> None:
    path = tmp_path / "sharegpt.json"
    data = [
        {
            "id": "a",
            "conversations": [{"from": "human", "value": "hi there"}, {"from": "gpt", "value": "one two three"}],
        },
        {"id": "b", "conversations": [{"from": "human", "value": "no reply"}]},
    ]
    path.write_text(json.dumps(data))
    requests = build_requests(WorkloadConfig(name="sharegpt", path=str(path)), 1, seed=0, tokenizer=WordTokenizer())
    assert requests[0].prompt == "hi there" and requests[0].max_tokens == 3 and requests[0].prompt_tokens == 2


def test_random_lengths_follow_the_settings() -> None:
    workload = WorkloadConfig(name="random", random_input_len=50, random_output_len=20, random_range_ratio=0.5)
    requests = build_requests(workload, 200, seed=0, tokenizer=WordTokenizer())
    inputs = [r.prompt_tokens for r in requests]
    outputs = [r.max_tokens for r in requests]
    assert min(inputs) >= 25 and max(inputs) <= 75 and 45 <= sum(inputs) / len(inputs) <= 55
    assert min(outputs) >= 10 and max(outputs) <= 30 and len(set(outputs)) > 5


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("jsonl", '{"prompt": "ok"}\n{"prompt": 3}\n', r"p\.data:2: field 'prompt' must be str, found int"),
        ("jsonl", '{"prompt": "ok"}\n{"text": "x"}\n', r"p\.data:2: field 'prompt' is missing"),
        ("jsonl", '{"prompt": "ok"}\n{"prompt": "x",\n', r"p\.data:2: not valid JSON"),
        ("jsonl", '{"prompt": "x", "output_tokens": 0}\n', r"p\.data:1: field 'output_tokens' must be >= 1"),
        ("spec_bench", '{"category": "math", "turns": []}\n', r"p\.data:1: field 'turns' must be a non-empty list"),
        ("spec_bench", '{"turns": ["q"]}\n', r"p\.data:1: field 'category' is missing"),
        ("sharegpt", '[{"id": 1}]', "entry 0: field 'conversations' is missing"),
        ("sharegpt", '{"conversations": []}', "expected a JSON list"),
        (
            "sharegpt",
            '[{"conversations": [{"from": "human"}, {"value": "x"}]}]',
            r"conversations\[0\] needs a string field 'value'",
        ),
    ],
)
def test_malformed_files_name_the_line_and_field(tmp_path: Path, name: str, content: str, message: str) -> None:
    path = tmp_path / "p.data"
    path.write_text(content)
    with pytest.raises(DatasetError, match=message):
        build_requests(WorkloadConfig(name=name, path=str(path)), 2, seed=0, tokenizer=WordTokenizer())


def test_file_workloads_need_a_path_that_exists(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="set workload.path"):
        build_requests(WorkloadConfig(name="jsonl"), 1, seed=0)
    with pytest.raises(DatasetError, match="is not a file"):
        build_requests(WorkloadConfig(name="jsonl", path=str(tmp_path / "missing.jsonl")), 1, seed=0)


def test_random_without_tokenizer_is_refused() -> None:
    with pytest.raises(ConfigError, match="needs the model's tokenizer"):
        build_requests(WorkloadConfig(name="random"), 1, seed=0)


def test_the_code_edit_functions_are_the_libraries_own_segments() -> None:
    """bundled._segment gives ast.get_source_segment(padded=True)'s bytes, line endings and
    form feeds included, so the code_edit prompts are what they were before it."""
    import ast
    import inspect
    import io
    import textwrap

    from pipeline.load import bundled

    text = (
        inspect.getsource(textwrap)
        + "\n\x0c\nclass A:\r\n    def f(self):\r\n        return 1\r\ndef g(x): return 2\rdef h(y):\n\treturn 3\n"
    )
    lines = io.StringIO(text, newline="").readlines()
    nodes = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef)]
    assert len(nodes) > 10
    for node in nodes:
        assert bundled._segment(lines, node) == ast.get_source_segment(text, node, padded=True)


def test_a_heads_training_prompts_share_no_text_with_the_bundled_sets() -> None:
    """The embedded EAGLE-3 head is measured on the bundled sets, so it is trained on none of
    their text: no function, saying or passage of theirs, whatever their seeds draw."""
    train = bundled.training_items(random.Random("eagle3-head:0"), 96)
    assert train == bundled.training_items(random.Random("eagle3-head:0"), 96)  # seeded
    assert [i.category for i in train].count("code_edit") == 48 and {i.category for i in train} == {
        "code_edit",
        "chat",
        "summarize",
        "qa",
    }
    text = "\n".join(i.prompt for i in train)
    assert not [f for f in bundled._stdlib_functions() if f in text]
    assert not [line for line in bundled._zen_lines() if line in text]
    pools = {p for _, p in bundled._reference_passages(1500, 5000)} | {
        p for _, p in bundled._reference_passages(600, 2500)
    }
    assert not [p for p in pools if p in text]
