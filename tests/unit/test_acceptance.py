from __future__ import annotations

import pytest

from pipeline.engines.acceptance import (
    MetricsFormatError,
    Scrape,
    acceptance_between,
    parse_scrape,
    prefix_cache_between,
)


def v1_text(drafts: float, draft_tokens: float, accepted: float, per_pos: list[float], engines: int = 1) -> str:
    lines = [
        "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
        "# TYPE vllm:spec_decode_num_drafts_total counter",
    ]
    for e in range(engines):
        lines.append(f'vllm:spec_decode_num_drafts_total{{engine="{e}",model_name="m"}} {drafts / engines}')
    lines += ["# TYPE vllm:spec_decode_num_draft_tokens_total counter"]
    lines += [
        f'vllm:spec_decode_num_draft_tokens_total{{engine="{e}",model_name="m"}} {draft_tokens / engines}'
        for e in range(engines)
    ]
    lines += ["# TYPE vllm:spec_decode_num_accepted_tokens_total counter"]
    lines += [
        f'vllm:spec_decode_num_accepted_tokens_total{{engine="{e}",model_name="m"}} {accepted / engines}'
        for e in range(engines)
    ]
    lines += ["# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter"]
    for e in range(engines):
        lines += [
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="{e}",model_name="m",position="{i}"}} {v / engines}'
            for i, v in enumerate(per_pos)
        ]
    lines += [
        "# TYPE vllm:prefix_cache_queries_total counter",
        f'vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {drafts * 10}',
        "# TYPE vllm:prefix_cache_hits_total counter",
        f'vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {drafts * 2}',
    ]
    return "\n".join(lines) + "\n"


def test_v1_counter_deltas_follow_the_definitions() -> None:
    before = parse_scrape(v1_text(10, 30, 20, [9, 7, 4]))
    after = parse_scrape(v1_text(110, 330, 230, [99, 77, 54]))
    acc = acceptance_between(before, after)
    assert acc.source == "vllm-v1-counters"
    assert (acc.num_drafts, acc.num_draft_tokens, acc.num_accepted_tokens) == (100, 300, 210)
    assert acc.acceptance_rate == pytest.approx(0.7)
    assert acc.acceptance_length == pytest.approx(3.1)
    assert acc.per_position == pytest.approx((0.9, 0.7, 0.5))
    metrics = acc.as_metrics()
    # vllm bench serve reports the rate in percent.
    assert metrics["spec_decode_acceptance_rate"] == pytest.approx(70.0)
    assert metrics["spec_decode_acceptance_rate_pos_2"] == pytest.approx(0.5)
    prefix = prefix_cache_between(before, after)
    assert (prefix.queries, prefix.hits) == (1000, 200)
    assert prefix.as_metrics()["prefix_cache_hit_rate"] == pytest.approx(0.2)


def test_counters_are_summed_over_engines() -> None:
    acc = acceptance_between(Scrape(), parse_scrape(v1_text(100, 300, 150, [60, 50, 40], engines=2)))
    assert acc.num_drafts == 100 and acc.acceptance_rate == pytest.approx(0.5)
    assert acc.per_position == pytest.approx((0.6, 0.5, 0.4))


def test_no_drafts_in_window_gives_no_rate_not_a_crash() -> None:
    same = parse_scrape(v1_text(10, 30, 20, [9, 7, 4]))
    acc = acceptance_between(same, same)
    assert acc.num_drafts == 0 and acc.acceptance_rate is None and acc.acceptance_length is None
    assert "spec_decode_acceptance_rate" not in acc.as_metrics()


def test_v0_gauges_when_v1_counters_are_absent() -> None:
    text = (
        "# TYPE vllm:spec_decode_draft_acceptance_rate gauge\n"
        'vllm:spec_decode_draft_acceptance_rate{model_name="m"} 0.62\n'
        "# TYPE vllm:spec_decode_efficiency gauge\n"
        'vllm:spec_decode_efficiency{model_name="m"} 0.55\n'
        "# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n"
        'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 620\n'
        "# TYPE vllm:spec_decode_num_draft_tokens_total counter\n"
        'vllm:spec_decode_num_draft_tokens_total{model_name="m"} 1000\n'
    )
    acc = acceptance_between(Scrape(), parse_scrape(text))
    assert acc.source == "vllm-v0-gauges"
    assert acc.acceptance_rate == pytest.approx(0.62) and acc.efficiency == pytest.approx(0.55)
    assert acc.num_draft_tokens == 1000 and acc.acceptance_length is None


def test_baseline_server_has_no_acceptance() -> None:
    text = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 0\n'
    acc = acceptance_between(Scrape(), parse_scrape(text))
    assert acc.source == "none" and acc.as_metrics() == {}


def test_malformed_metrics_text_is_a_clear_error() -> None:
    with pytest.raises(MetricsFormatError, match="not Prometheus text"):
        parse_scrape("vllm:spec_decode_num_drafts_total{engine=0 12 13 14\n")


def test_counter_going_backwards_gives_no_figures_and_says_why() -> None:
    before = parse_scrape(v1_text(110, 330, 230, [99, 77, 54]))
    after = parse_scrape(v1_text(20, 60, 40, [18, 14, 8]))  # the server restarted mid-window
    acc = acceptance_between(before, after)
    assert acc.acceptance_rate is None and acc.acceptance_length is None and acc.as_metrics() == {}
    assert acc.note is not None and "server restarted during the window" in acc.note
    assert prefix_cache_between(before, after).as_metrics() == {}


def test_a_position_counter_going_backwards_is_a_restart_too() -> None:
    before = parse_scrape(v1_text(10, 30, 20, [9, 7, 4]))
    after = parse_scrape(v1_text(110, 330, 230, [99, 77, 3]))
    assert "position=2" in (acceptance_between(before, after).note or "")


def test_gauges_are_averaged_over_label_sets_counters_summed() -> None:
    text = (
        "# TYPE sglang:spec_accept_length gauge\n"
        'sglang:spec_accept_length{tp_rank="0"} 3.0\n'
        'sglang:spec_accept_length{tp_rank="1"} 2.0\n'
        "# TYPE sglang:num_requests counter\n"
        'sglang:num_requests_total{tp_rank="0"} 3\n'
        'sglang:num_requests_total{tp_rank="1"} 4\n'
    )
    scrape = parse_scrape(text)
    assert scrape.get("sglang:spec_accept_length") == pytest.approx(2.5)
    assert scrape.get("sglang:num_requests_total") == 7


def test_effective_k_is_draft_tokens_per_draft() -> None:
    acc = acceptance_between(Scrape(), parse_scrape(v1_text(100, 250, 150, [60, 50, 40])))
    assert acc.effective_k == pytest.approx(2.5)


def test_the_kv_capacity_comes_from_the_cache_config_info_labels() -> None:
    text = (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16",engine="0",kv_cache_max_concurrency="45.5",'
        'kv_cache_size_tokens="93184",model_name="m"} 1.0\n'
        'vllm:cache_config_info{block_size="16",engine="1",kv_cache_max_concurrency="44.5",'
        'kv_cache_size_tokens="91136",model_name="m"} 1.0\n'
    )
    assert parse_scrape(text).kv_capacity == {"kv_cache_size_tokens": 93184 + 91136, "kv_cache_max_concurrency": 45.0}
    older = 'vllm:cache_config_info{block_size="16",kv_cache_size_tokens="None"} 1.0\n'  # not set: left out
    assert parse_scrape(older).kv_capacity == {}
