from __future__ import annotations

import asyncio
import json
import math

import pytest
from aiohttp import web

from pipeline.load.client import ClientOptions
from pipeline.load.items import Request
from pipeline.load.loadgen import TIMER_SLACK_S, run_window
from tests.fakes import FakeServer, Script, chat_chunk, chat_script, usage_chunk


def _request(i: int = 0, max_tokens: int = 16) -> Request:
    return Request(index=i, prompt="def f(): pass", category="code_edit", max_tokens=max_tokens)


def _opts(url: str, **kw: object) -> ClientOptions:
    return ClientOptions(base_url=url, model="m", **kw)  # type: ignore[arg-type]


def test_timing_invariants_and_usage_tokens() -> None:
    # One chunk carries several tokens (as under speculation): 3 chunks, 7 tokens.
    script = chat_script(["def", " f(x: int)", " -> None: pass"], completion_tokens=7, gap_s=0.02, first_s=0.05)
    with FakeServer(lambda body: script) as url:
        record = run_window([_request()], [0.0], _opts(url)).records[0]
    assert record.ok, record.error
    assert record.output_tokens == 7  # from usage, not the 4 chunks
    # The role-only first chunk carries no token; the empty finish chunk does (as in vLLM).
    assert len(record.chunk_s) == 4
    assert record.text == "def f(x: int) -> None: pass"
    assert record.finish_reason == "stop"
    # vLLM's test_endpoint_request_func_timing invariant: latency - ttft == sum(itl).
    assert math.isclose(record.e2el_s - record.ttft_s, sum(record.itl_s), abs_tol=1e-9)
    assert record.ttft_s >= 0.05
    assert math.isclose(record.tpot_s, (record.e2el_s - record.ttft_s) / 6, rel_tol=1e-9)
    assert all(gap >= 0.015 for gap in record.itl_s)


def test_empty_finish_chunk_ends_e2el_as_in_vllm() -> None:
    # vLLM streams a stop on EOS as an empty chunk with finish_reason, one decode step after
    # the last text: E2EL and TPOT must include that step, as `vllm bench serve`'s do.
    steps = [(0.0, chat_chunk("", role="assistant")), (0.0, chat_chunk("a")), (0.05, chat_chunk("b"))]
    steps += [(0.2, chat_chunk("", finish="stop")), (0.0, usage_chunk(3, 3)), (0.0, "[DONE]")]
    with FakeServer(lambda body: Script(steps=steps)) as url:
        record = run_window([_request()], [0.0], _opts(url)).records[0]
    assert record.ok, record.error
    assert len(record.chunk_s) == 3
    assert record.itl_s[-1] >= 0.18  # the last gap is the finish chunk's
    assert record.tpot_s is not None and record.tpot_s >= (0.05 + 0.18) / 2


def test_reasoning_and_tool_call_deltas_are_tokens() -> None:
    import json

    tool = json.dumps({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0}]}, "finish_reason": None}]})
    steps = [(0.0, chat_chunk("", role="assistant")), (0.1, chat_chunk(reasoning="think"))]
    steps += [(0.05, tool), (0.05, chat_chunk("answer")), (0.0, chat_chunk("", finish="stop"))]
    steps += [(0.0, usage_chunk(3, 4)), (0.0, "[DONE]")]
    with FakeServer(lambda body: Script(steps=steps)) as url:
        record = run_window([_request()], [0.0], _opts(url)).records[0]
    assert record.ok, record.error
    assert len(record.chunk_s) == 4  # TTFT is the first thinking token, not the first answer token
    # The first event is the thinking chunk: the answer came two scripted gaps (0.1 s) later.
    assert record.chunk_s[2] - record.chunk_s[0] >= 0.09
    assert record.text == "answer"


def test_stream_without_a_token_is_a_failed_request() -> None:
    steps = [(0.0, chat_chunk("", role="assistant")), (0.0, usage_chunk(3, 0)), (0.0, "[DONE]")]
    with FakeServer(lambda body: Script(steps=steps)) as url:
        record = run_window([_request()], [0.0], _opts(url)).records[0]
    assert not record.ok and "no token" in (record.error or "")


def test_request_body_is_streaming_chat_with_usage() -> None:
    server = FakeServer(lambda body: chat_script(["x"], 1))
    with server as url:
        run_window([_request(max_tokens=9)], [0.0], _opts(url, ignore_eos=True))
    body = server.bodies[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "user", "content": "def f(): pass"}]
    assert body["max_tokens"] == 9 and body["temperature"] == 0.0 and body["ignore_eos"] is True


def test_completions_endpoint_reads_text() -> None:
    import json

    steps = [(0.0, json.dumps({"choices": [{"text": t, "finish_reason": None}]})) for t in ("a", "b")]
    steps += [(0.0, usage_chunk(3, 2)), (0.0, "[DONE]")]
    server = FakeServer(lambda body: Script(steps=steps))
    with server as url:
        record = run_window([_request()], [0.0], _opts(url, endpoint="completions")).records[0]
    assert record.ok and record.text == "ab" and record.output_tokens == 2
    assert server.bodies[0]["prompt"] == "def f(): pass"


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        (Script(status=500), "HTTP 500"),
        (Script(steps=[(0.0, chat_chunk("a")), (0.0, chat_chunk("b"))], drop_after=1), "payload is not completed"),
        (Script(steps=[(0.0, chat_chunk("a")), (0.0, "[DONE]")]), "no usage"),
        (
            Script(
                steps=[(0.0, chat_chunk("a")), (0.0, '{"choices": [], "usage": {"prompt_tokens": 3}}'), (0.0, "[DONE]")]
            ),
            "no usage.completion_tokens",
        ),
        (Script(steps=[(0.0, chat_chunk("a")), (0.0, "not json")]), "malformed stream chunk"),
    ],
    ids=["http-500", "dropped-mid-stream", "no-usage", "usage-without-completion-tokens", "malformed-chunk"],
)
def test_faults_become_records_not_exceptions(script: Script, expected: str) -> None:
    with FakeServer(lambda body: script) as url:
        window = run_window([_request(0), _request(1)], [0.0, 0.0], _opts(url))
    assert len(window.records) == 2
    for record in window.records:
        assert not record.ok
        assert expected in (record.error or "")


def test_every_request_has_a_deadline() -> None:
    hang = Script(steps=[(0.0, chat_chunk("a")), (30.0, chat_chunk("b"))])
    with FakeServer(lambda body: hang) as url:
        window = run_window([_request()], [0.0], _opts(url, timeout_s=0.5))
    record = window.records[0]
    assert not record.ok and "timed out" in (record.error or "")
    assert window.duration_s < 10  # bounded by the deadline, not by the server


def test_unreachable_server_is_an_error_record() -> None:
    from pipeline.engines.process import free_port

    url = f"http://127.0.0.1:{free_port()}"
    record = run_window([_request()], [0.0], _opts(url, timeout_s=5)).records[0]
    assert not record.ok and "Cannot connect" in (record.error or "")


class _HoldingServer(FakeServer):
    """Answers nothing until ``expected`` requests are in, then all of them: a client that waits
    for one answer before it sends the next never gets there (``all_in`` stays False)."""

    def __init__(self, script: Script, expected: int, wait_s: float = 30.0) -> None:
        super().__init__(lambda body: script)
        self.expected, self.wait_s = expected, wait_s
        self.arrived, self.all_in = 0, False
        self._gate: asyncio.Event | None = None

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        self._gate = self._gate or asyncio.Event()
        self.arrived += 1
        if self.arrived >= self.expected and not self._gate.is_set():
            self.all_in = True
            self._gate.set()
        try:
            await asyncio.wait_for(self._gate.wait(), self.wait_s)
        except TimeoutError:
            self._gate.set()  # a closed-loop client: answered from now on, and all_in stays False
        return await super()._completions(request)


def test_open_loop_sends_on_schedule_not_after_completion() -> None:
    server = _HoldingServer(chat_script(["a", "b"], 2), expected=3)
    with server as url:
        window = run_window([_request(i) for i in range(3)], [0.0, 0.1, 0.2], _opts(url))
    # All three reached the server before it answered any: each request left on its schedule
    # although the ones before it were still waiting for their answers.
    assert server.all_in, "a request was sent only after an earlier one's answer"
    for record in window.records:
        assert record.ok, record.error
        assert record.sent_s >= record.scheduled_s - TIMER_SLACK_S  # never before it was due
    assert [r.index for r in sorted(window.records, key=lambda r: r.sent_s)] == [0, 1, 2]
    assert window.records[2].sent_s < window.records[0].sent_s + window.records[0].e2el_s


def test_per_request_acceptance_is_read_off_the_usage_chunk() -> None:
    """vLLM 0.32's --per-request-spec-decode-metrics summary: the stats ride on the final usage
    chunk as metrics.speculative_decoding, beside fields the client does not read."""
    spec = {
        "mean_acceptance_length": 2.5,
        "draft_acceptance_rate": 0.5,
        "acceptance_histogram": [1, 0, 1, 2],
        "num_spec_steps": 4,
        "num_accepted_draft_tokens": 6,
        "num_draft_tokens": 12,
        "num_spec_tokens": 3,
    }
    usage = json.dumps(
        {
            "choices": [],
            "usage": {"prompt_tokens": 7, "completion_tokens": 11},
            "metrics": {"time_to_first_token_ms": 3.0, "speculative_decoding": spec},
        }
    )
    script = chat_script(["a", "b"], completion_tokens=11)
    script.steps[-2] = (0.0, usage)
    with FakeServer(lambda body: script) as url:
        record = run_window([_request()], [0.0], _opts(url)).records[0]
    assert record.ok, record.error
    assert (record.spec_steps, record.spec_accepted_tokens, record.spec_draft_tokens) == (4, 6, 12)
    assert record.acceptance_length == 2.5 == spec["mean_acceptance_length"]  # vLLM's own figure, 1 + 6/4
    row = record.as_row()
    assert (row["spec_steps"], row["spec_accepted_tokens"], row["spec_draft_tokens"]) == (4, 6, 12)
    assert row["acceptance_length"] == 2.5


def test_a_stream_without_per_request_acceptance_records_none() -> None:
    with FakeServer(lambda body: chat_script(["a", "b"], completion_tokens=2)) as url:
        record = run_window([_request()], [0.0], _opts(url)).records[0]
    assert record.ok and record.spec_steps is None and record.acceptance_length is None
