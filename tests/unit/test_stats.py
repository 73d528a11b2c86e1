"""The statistics core on seeded synthetic data with known answers."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

from pipeline.analysis import decisions, samples, stats
from pipeline.analysis.decisions import decide
from pipeline.analysis.samples import Sample, StatsError, StatsOptions
from pipeline.analysis.stats import paired_ratio

OPTS = StatsOptions(resamples=1000)


def window(rng: np.random.Generator, prompt: np.ndarray, scale: float, noise: float = 0.2,
           tokens: float = 100.0, duration: float = 10.0) -> Sample:  # fmt: skip
    """Per-request values exp(prompt effect + request noise) x scale, in seconds."""
    n = len(prompt)
    values = scale * np.exp(prompt + rng.normal(0, noise, n))
    return Sample(
        index=np.arange(n), values={"tpot": values, "ttft": values * 3, "e2el": values * 100},
        itl=tuple(values[i] * np.exp(rng.normal(0, noise, 20)) for i in range(n)),
        output_tokens=np.full(n, tokens), chunks=np.full(n, 40.0), duration_s=duration,
    )  # fmt: skip


def pair(seed: int, n: int, true: float, runs: int = 1, run_sd: float = 0.0, prompt_sd: float = 0.1):
    rng = np.random.default_rng(seed)
    base, spec = [], []
    for _ in range(runs):
        prompt = rng.normal(0, prompt_sd, n)
        base.append(window(rng, prompt, 0.04))
        spec.append(window(rng, prompt, 0.04 / true * math.exp(rng.normal(0, run_sd))))
    return base, spec


def coverage(sims: int, **kw: float) -> float:
    hits = 0
    for s in range(sims):
        base, spec = pair(s, **kw)  # type: ignore[arg-type]
        ratio = paired_ratio("speedup_median_tpot", base, spec, OPTS, np.random.default_rng(10_000 + s))
        assert ratio.low is not None and ratio.high is not None
        hits += ratio.low <= kw["true"] <= ratio.high
    return hits / sims


def test_within_run_interval_covers_the_true_ratio_at_the_stated_rate() -> None:
    # 500 seeded simulations, one run each, a true 1.5x speedup in the median.
    rate = coverage(500, n=128, true=1.5)
    assert 0.92 <= rate <= 0.98, rate


def test_across_runs_interval_includes_run_to_run_variation() -> None:
    # Each repeat's server adds its own shift (sd 15 % in the ratio): 3 runs of 64 requests.
    rate = coverage(300, n=64, true=1.2, runs=3, run_sd=0.15)
    assert 0.92 <= rate <= 0.98, rate


def test_strongly_paired_medians_give_conservative_intervals_never_narrow_ones() -> None:
    # Where the prompt, not the server, sets most of the variation, the bootstrap of a ratio
    # of medians over-covers (measured: 98-99 %); it must never under-cover.
    rate = coverage(200, n=64, true=2.0, prompt_sd=0.6)
    assert rate >= 0.92, rate


def test_one_window_throughput_has_no_interval_repeats_give_one() -> None:
    base, spec = pair(0, 32, 1.5)
    one = paired_ratio("output_throughput_ratio", base, spec, OPTS)
    assert one.estimate == pytest.approx(1.0) and not one.resolved and "repeats" in one.note
    rng = np.random.default_rng(1)
    base = [window(rng, np.zeros(32), 0.04, duration=10.0 * (1 + 0.02 * i)) for i in range(4)]
    spec = [window(rng, np.zeros(32), 0.03, duration=8.0 * (1 + 0.01 * i)) for i in range(4)]
    four = paired_ratio("output_throughput_ratio", base, spec, OPTS)
    assert four.resolved and four.low < four.estimate < four.high  # type: ignore[operator]
    assert 1.2 < four.estimate < 1.3  # type: ignore[operator]


def test_pairs_by_prompt_index_and_ignores_unpaired_requests() -> None:
    base, spec = pair(3, 40, 2.0)
    keep = np.arange(40) != 7
    spec = [Sample(index=spec[0].index[keep], values={k: v[keep] for k, v in spec[0].values.items()},
                   itl=tuple(g for g, k in zip(spec[0].itl, keep, strict=True) if k),
                   output_tokens=spec[0].output_tokens[keep], chunks=spec[0].chunks[keep], duration_s=10.0)]  # fmt: skip
    ratio = paired_ratio("speedup_median_tpot", base, spec, OPTS)
    assert ratio.requests == 39
    assert 1.7 < ratio.estimate < 2.3  # type: ignore[operator]


def test_fewer_than_five_requests_is_not_enough_never_a_verdict() -> None:
    base, spec = pair(0, 4, 3.0)
    ratio = paired_ratio("speedup_median_tpot", base, spec, OPTS)
    assert ratio.estimate is None and "not enough requests" in ratio.note
    assert decide([ratio], OPTS)[0].label == decisions.TOO_FEW


def test_decisions_need_the_interval_beyond_the_floor() -> None:
    helps = paired_ratio("speedup_median_tpot", *pair(1, 128, 1.5), OPTS)
    hurts = paired_ratio("speedup_median_tpot", *pair(2, 128, 0.7), OPTS)
    tiny = paired_ratio("speedup_median_tpot", *pair(3, 16, 1.03), OPTS)
    labels = [d.label for d in decide([helps, hurts, tiny], OPTS)]
    assert labels == ["helps", "hurts", "inconclusive"]
    detail = decide([tiny], OPTS)[0].detail
    assert "requests per window" in detail or "floor" in detail


def test_to_resolve_scales_the_window_with_the_squared_interval() -> None:
    ratio = stats.Ratio("speedup_median_tpot", 1.10, 1.01, 1.20, 0.95, 1, 50, log_replicates=np.zeros(10))
    half, margin = (math.log(1.20) - math.log(1.01)) / 2, math.log(1.10) - math.log(1.02)
    assert f"~{math.ceil(50 * (half / margin) ** 2)} requests" in decisions.to_resolve(ratio, 0.02)
    inside = stats.Ratio("speedup_median_tpot", 1.01, 0.95, 1.07, 0.95, 1, 50)
    assert "within the ±2% floor" in decisions.to_resolve(inside, 0.02)
    # With repeats, the spread between runs sets the width: the lever is more runs.
    repeated = stats.Ratio("speedup_median_tpot", 1.10, 1.01, 1.20, 0.95, 2, 50)
    assert "repeats would likely resolve it" in decisions.to_resolve(repeated, 0.02)


def test_benjamini_hochberg_can_withdraw_a_lone_borderline_call() -> None:
    # One comparison whose interval barely clears the floor helps alone, not among 20 nulls.
    rng = np.random.default_rng(0)
    border = stats.Ratio("speedup_median_tpot", 1.1, 1.03, 1.2, 0.95, 1, 50,
                         log_replicates=rng.normal(math.log(1.1), 0.03, 2000))  # fmt: skip
    nulls = [stats.Ratio("speedup_median_tpot", 1.0, 0.9, 1.1, 0.95, 1, 50,
                         log_replicates=rng.normal(0, 0.05, 2000)) for _ in range(20)]  # fmt: skip
    assert decide([border], OPTS)[0].label == "helps"
    withdrawn = decide([border, *nulls], OPTS)[0]
    assert withdrawn.label == "inconclusive" and "not after the adjustment for 21 comparisons" in withdrawn.detail


def test_crossing_is_an_interval_only_where_helps_turns_into_hurts() -> None:
    rates = [1.0, 4.0, 16.0]
    ratios = [paired_ratio("speedup_median_tpot", *pair(s, 128, t), OPTS, np.random.default_rng(s))
              for s, t in enumerate((2.0, 1.4, 0.7))]  # fmt: skip
    cross = decisions.crossing(rates, decide(ratios, OPTS), OPTS)
    assert cross.rate is not None and 4.0 < cross.low <= cross.rate <= cross.high < 16.0  # type: ignore[operator]
    flat = [paired_ratio("speedup_median_tpot", *pair(s, 64, 1.0), OPTS, np.random.default_rng(s)) for s in range(3)]
    assert decisions.crossing(rates, decide(flat, OPTS), OPTS).rate is None


def test_acceptance_length_interval_is_centred_on_the_counters() -> None:
    rng = np.random.default_rng(0)
    w = window(rng, np.zeros(30), 0.04)
    w = Sample(w.index, w.values, w.itl, np.full(30, 101.0), rng.integers(30, 40, 30).astype(float), 10.0)
    ratio = stats.acceptance_length_interval([w], 3.05, OPTS)
    assert ratio.estimate == pytest.approx(3.05) and ratio.low < 3.05 < ratio.high  # type: ignore[operator]


def test_sample_reads_the_clients_requests_csv() -> None:
    frame = pd.DataFrame({"index": [0, 1, 2], "ttft_s": [0.1, 0.2, None], "tpot_s": [0.01, None, None],
                          "e2el_s": [1.0, 0.3, None], "num_chunks": [5, 1, 0], "output_tokens": [10, 1, None],
                          "error": [None, None, "HTTP 500"], "chunk_s": ["[0.1, 0.2, 0.4]", "[0.2]", "[]"]})  # fmt: skip
    sample = Sample.from_requests(frame, 2.0)
    assert sample.size == 2 and sample.failed == 1 and sample.throughput == pytest.approx(5.5)
    assert np.allclose(sample.itl[0], [0.1, 0.2]) and math.isnan(sample.values["tpot"][1])


@pytest.mark.parametrize(("kw", "match"), [({"confidence": 1.0}, "confidence"), ({"confidence": 0.4}, "confidence"),
                                           ({"floor": -0.1}, "floor")])  # fmt: skip
def test_bad_options_are_refused(kw: dict, match: str) -> None:
    with pytest.raises(StatsError, match=match):
        StatsOptions(**kw)


def test_the_aa_spread_between_servers_widens_one_server_comparisons_only() -> None:
    spread = samples.server_spread({"speedup_median_tpot": [0.06, -0.08, 0.02, -0.05], "output_throughput_ratio":
                                  [0.03, -0.02, 0.04, -0.01]}, "aa")  # fmt: skip
    assert spread is not None and spread.comparisons == 4
    assert spread.sd["speedup_median_tpot"] == pytest.approx(math.sqrt((0.06**2 + 0.08**2 + 0.02**2 + 0.05**2) / 4))
    opts = dataclasses.replace(OPTS, server_spread=spread)
    base, spec = pair(5, 64, 1.1)
    alone = paired_ratio("speedup_median_tpot", base, spec, opts)
    shared = paired_ratio("speedup_median_tpot", base, spec, opts, shared_servers=True)
    assert shared.estimate == pytest.approx(alone.estimate)
    assert shared.high / shared.low > 1.2 * (alone.high / alone.low)  # type: ignore[operator]
    # One window's throughput has no spread of its own: the A/A spread gives it its interval.
    throughput = paired_ratio("output_throughput_ratio", base, spec, opts, shared_servers=True)
    assert throughput.resolved and throughput.low < 1.0 < throughput.high  # type: ignore[operator]
