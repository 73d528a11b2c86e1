from __future__ import annotations

import pytest

from pipeline.load.sse import SSEDecoder


def _all(chunks: list[bytes]) -> list[bytes]:
    decoder = SSEDecoder()
    return [p for c in chunks for p in decoder.feed(c)]


STREAM = b'data: {"a":1}\n\ndata: {"b":2}\n\ndata: [DONE]\n\n'


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_events_survive_any_split_across_reads(size: int) -> None:
    chunks = [STREAM[i : i + size] for i in range(0, len(STREAM), size)]
    assert _all(chunks) == [b'{"a":1}', b'{"b":2}', b"[DONE]"]


@pytest.mark.parametrize("newline", [b"\r\n", b"\r", b"\n"])
def test_every_line_ending_of_the_spec(newline: bytes) -> None:
    stream = STREAM.replace(b"\n", newline)
    for size in (1, 5, len(stream)):
        assert _all([stream[i : i + size] for i in range(0, len(stream), size)])[-1] == b"[DONE]"
        assert len(_all([stream[i : i + size] for i in range(0, len(stream), size)])) == 3


def test_multi_line_data_comments_and_other_fields() -> None:
    stream = b": keep-alive\n\nevent: message\nid: 7\ndata: first\ndata:second\n\nretry: 10\n\n"
    assert _all([stream]) == [b"first\nsecond"]


def test_an_unfinished_event_is_held_back() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: partial") == []
    assert decoder.feed(b"\n\n") == [b"partial"]


def test_single_event_reads_take_the_fast_path_and_agree_with_the_general_one() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"a":1}\n\n') == [b'{"a":1}']
    assert decoder.feed(b"data: x") == []  # a partial event disables the fast path
    assert decoder.feed(b'\n\ndata: {"b":2}\n\n') == [b"x", b'{"b":2}']
    assert decoder.feed(b"data:no-space\n\n") == [b"no-space"]
