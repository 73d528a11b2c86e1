from __future__ import annotations

import numpy as np
import pytest

from pipeline.load.client import ClientOptions, RequestRecord, clock
from pipeline.load.items import Request
from pipeline.load.loadgen import TIMER_SLACK_S, StopRule, arrival_offsets, arrivals_within, run_window
from pipeline.load.metrics import client_health
from tests.fakes import FakeServer, Script, chat_script


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 4.0])
def test_gamma_arrivals_have_the_requested_rate_and_shape(burstiness: float) -> None:
    offsets = arrival_offsets(20000, rate=4.0, burstiness=burstiness, seed=0)
    gaps = np.diff([0.0, *offsets])
    assert np.all(gaps >= 0)
    # Rescaled as vllm bench serve does: the last request is due at count / rate exactly.
    assert offsets[-1] == pytest.approx(20000 / 4.0)
    assert 1 / gaps.mean() == pytest.approx(4.0, rel=1e-9)
    # Gamma with shape b has coefficient of variation 1/sqrt(b); Poisson (b=1) has 1.
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.05)


def test_same_seed_same_schedule_as_vllm_bench_serve_draws_it() -> None:
    a = arrival_offsets(50, 2.0, 1.0, seed=3)
    assert a == arrival_offsets(50, 2.0, 1.0, seed=3) and a != arrival_offsets(50, 2.0, 1.0, seed=4)
    # vLLM: np.random.seed(seed), one np.random.gamma per request, cumulative, rescaled.
    np.random.seed(3)
    gaps = [np.random.gamma(shape=1.0, scale=1.0 / 2.0) for _ in range(50)]
    due = np.cumsum(gaps)
    assert a == pytest.approx((due * (25.0 / due[-1])).tolist(), rel=1e-12)


def test_infinite_rate_sends_everything_at_once() -> None:
    assert arrival_offsets(5, float("inf"), 1.0, seed=0) == [0.0] * 5
    assert arrival_offsets(1, 3.0, 1.0, seed=0) == [pytest.approx(1 / 3)]


def test_duration_schedule_keeps_every_arrival_before_the_end() -> None:
    offsets = arrivals_within(30.0, rate=5.0, burstiness=1.0, seed=1)
    assert max(offsets) < 30.0
    assert 100 < len(offsets) < 200  # about 150 = 30 s x 5 req/s


# ---- the window runner against a scripted server (real HTTP) ----------------------------


def _requests(n: int) -> list[Request]:
    return [Request(index=i, prompt=f"p{i}", category="c", max_tokens=8) for i in range(n)]


def test_max_concurrency_caps_requests_in_flight() -> None:
    slow = chat_script(["a", "b"], 2, gap_s=0.2)
    with FakeServer(lambda body: slow) as url:
        window = run_window(_requests(6), [0.0] * 6, ClientOptions(base_url=url, model="m"), max_concurrency=2)
    records = sorted(window.records, key=lambda r: r.sent_s)
    assert all(r.ok for r in records)
    # At any send, at most one other request is still streaming.
    for r in records:
        in_flight = [o for o in records if o.sent_s <= r.sent_s < o.sent_s + o.e2el_s]
        assert len(in_flight) <= 2
    assert records[-1].queued_s > 0.3  # the last pair waited for two rounds
    # Queueing is not client lateness: a queued request's wait for a slot (at least one round of
    # 0.6 s on the server) is in queued_s; what is left as lateness is the client's own delay.
    for r in records[2:]:
        assert -1e-6 < r.lateness_s < r.queued_s, (r.lateness_s, r.queued_s)


def test_worker_processes_share_one_schedule() -> None:
    script = chat_script(["a", "b"], 2, gap_s=0.01)
    offsets = [i * 0.05 for i in range(10)]
    received: dict[str, float] = {}  # prompt -> when the server had it, on the workers' monotonic clock

    def answer(body: dict) -> Script:
        received[body["messages"][0]["content"]] = clock()
        return script

    with FakeServer(answer) as url:
        window = run_window(_requests(10), offsets, ClientOptions(base_url=url, model="m"), workers=2)
    assert [r.index for r in window.records] == list(range(10))
    assert all(r.ok for r in window.records)
    # Both workers measured against the parent's one origin, and the sends follow the one schedule:
    # the server had no request before its due time on that origin, and each recorded send time,
    # read on it, comes before the server had the request. A worker timing from an origin of its
    # own, taken before the shared one, would send early and fail both; nothing here is a speed bound.
    for r in window.records:
        at = received[f"p{r.index}"]
        assert r.sent_s >= r.scheduled_s - TIMER_SLACK_S
        assert window.origin_s + r.scheduled_s - TIMER_SLACK_S <= at, (r.index, at - window.origin_s)
        assert window.origin_s + r.sent_s <= at, (r.index, r.sent_s, at - window.origin_s)


def test_client_health_reports_lateness_and_achieved_rate() -> None:
    # Known sends: every request 2 ms late, the last one 12 ms late; deliberate queueing excluded.
    records = [
        RequestRecord(index=i, category="c", scheduled_s=i * 0.05, sent_s=i * 0.05 + 0.002) for i in range(20)
    ] + [RequestRecord(index=20, category="c", scheduled_s=1.0, sent_s=1.032, queued_s=0.020)]
    health = client_health(records, target_rate=20.0)
    assert health["target_request_rate"] == 20.0
    assert health["achieved_request_rate"] == pytest.approx(20 / (1.032 - 0.002))
    assert health["send_lateness_p50_ms"] == pytest.approx(2.0)
    assert health["send_lateness_max_ms"] == pytest.approx(12.0)
    assert health["send_lateness_p50_ms"] <= health["send_lateness_p99_ms"] <= health["send_lateness_max_ms"]


# ---- windows that stop early --------------------------------------------------------------


def test_a_window_with_too_many_errors_stops_after_the_minimum_and_says_why() -> None:
    from tests.fakes import Script

    failing = Script(status=500)
    offsets = [i * 0.02 for i in range(40)]
    with FakeServer(lambda body: failing) as url:
        window = run_window(
            _requests(40),
            offsets,
            ClientOptions(base_url=url, model="m"),
            stop=StopRule(max_error_rate=0.5, min_requests=10),
        )
    assert window.stopped is not None and "load.max_error_rate=0.5" in window.stopped
    assert len(window.records) == 40  # every request has a record: answered, or marked not finished
    unfinished = [r for r in window.records if r.error and r.error.startswith("not finished")]
    assert unfinished and window.duration_s < 40 * 0.02  # it did not wait for the schedule's end


def test_errors_under_the_rate_let_the_window_run_to_its_end() -> None:
    from tests.fakes import Script

    good = chat_script(["a"], 1)
    with FakeServer(lambda body: Script(status=500) if body["messages"][0]["content"] == "p3" else good) as url:
        window = run_window(
            _requests(20), [0.0] * 20, ClientOptions(base_url=url, model="m"), stop=StopRule(max_error_rate=0.5)
        )
    assert window.stopped is None and sum(not r.ok for r in window.records) == 1


@pytest.mark.parametrize("workers", [1, 2])
def test_a_hung_server_ends_the_window_at_its_deadline(workers: int) -> None:
    hang = chat_script(["a"], 1, first_s=30.0)
    with FakeServer(lambda body: hang) as url:
        window = run_window(
            _requests(4),
            [0.0] * 4,
            ClientOptions(base_url=url, model="m"),
            workers=workers,
            stop=StopRule(deadline_s=1.0),
        )
    assert window.stopped is not None and "deadline of 1 s" in window.stopped
    assert [r.index for r in window.records] == [0, 1, 2, 3] and not any(r.ok for r in window.records)


def test_a_later_turn_waits_for_its_predecessors_answer_and_carries_it() -> None:
    bodies: list[dict] = []

    def script(body: dict) -> Script:
        bodies.append(body)
        turn = len(body["messages"]) // 2 + 1
        return chat_script([f"answer{turn} ", "done"], 2, gap_s=0.3)  # each answer takes 0.3 s

    requests = [
        Request(0, "first", "chat", 8, conversation="c", turn=1),
        Request(1, "alone", "code", 8),
        Request(2, "second", "chat", 8, conversation="c", turn=2, after=0, delay_s=0.2),
        Request(3, "third", "chat", 8, conversation="c", turn=3, after=2, delay_s=0.1),
    ]
    with FakeServer(script) as url:
        # The later turns' own offsets (0) are not their due times: their predecessors' ends are.
        window = run_window(requests, [0.0, 0.0, 0.0, 0.0], ClientOptions(base_url=url, model="m"))
    first, alone, second, third = sorted(window.records, key=lambda r: r.index)
    assert all(r.ok for r in window.records)
    assert alone.sent_s < first.end_s  # a request of its own keeps its schedule: it waits for no answer
    assert second.scheduled_s == pytest.approx(first.end_s + 0.2)  # the think time after the answer
    assert third.scheduled_s == pytest.approx(second.end_s + 0.1)
    assert second.sent_s >= first.end_s + 0.2 - TIMER_SLACK_S
    assert (second.conversation, second.turn) == ("c", 2)
    last = next(b for b in bodies if b["messages"][-1]["content"] == "third")["messages"]
    assert [m["content"] for m in last] == ["first", first.text, "second", second.text, "third"]
    assert [m["role"] for m in last] == ["user", "assistant", "user", "assistant", "user"]


def test_a_turn_whose_predecessor_failed_is_not_sent() -> None:
    def script(body: dict) -> Script:
        return Script(status=500) if len(body["messages"]) == 1 else chat_script(["x"], 1)

    requests = [
        Request(0, "first", "chat", 8, conversation="c", turn=1),
        Request(1, "second", "chat", 8, conversation="c", turn=2, after=0),
    ]
    with FakeServer(script) as url:
        window = run_window(requests, [0.0, 0.0], ClientOptions(base_url=url, model="m"))
    failed, skipped = sorted(window.records, key=lambda r: r.index)
    assert failed.error and "HTTP 500" in failed.error
    assert skipped.error == "not sent: turn 1 of conversation 'c' failed" and skipped.turn == 2
    with pytest.raises(ValueError, match="single client worker"):
        run_window(requests, [0.0, 0.0], ClientOptions(base_url="http://127.0.0.1:9", model="m"), workers=2)


def test_a_later_turn_without_its_predecessor_is_a_clear_error_and_alone_sends_it_by_itself() -> None:
    turn = Request(3, "second", "chat", 8, conversation="c", turn=2, after=1, delay_s=0.5)
    with pytest.raises(ValueError, match="request 3 is turn 2 of conversation 'c', but its previous turn"):
        run_window([turn], [0.0], ClientOptions(base_url="http://127.0.0.1:9", model="m"))
    alone = turn.alone()  # as a warm-up, a cache primer or the losslessness probe sends it
    assert (alone.after, alone.conversation, alone.turn, alone.delay_s, alone.prompt) == (None, "", 0, 0.0, "second")
    with FakeServer(lambda body: chat_script(["x"], 1)) as url:
        assert run_window([alone], [0.0], ClientOptions(base_url=url, model="m")).records[0].ok
