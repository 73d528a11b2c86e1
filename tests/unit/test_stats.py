"""The statistics core on seeded synthetic data with known answers."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from pipeline.analysis import decisions, samples, stats
from pipeline.analysis.decisions import decide
from pipeline.analysis.samples import Sample, StatsError, StatsOptions
from pipeline.analysis.stats import paired_ratio

OPTS = StatsOptions(resamples=1000)


def window(
    rng: np.random.Generator,
    prompt: np.ndarray,
    scale: float,
    noise: float = 0.2,
    tokens: float = 100.0,
    duration: float = 10.0,
) -> Sample:
    """Per-request values exp(prompt effect + request noise) x scale, in seconds."""
    n = len(prompt)
    values = scale * np.exp(prompt + rng.normal(0, noise, n))
    return Sample(
        index=np.arange(n),
        values={"tpot": values, "ttft": values * 3, "e2el": values * 100},
        itl=tuple(values[i] * np.exp(rng.normal(0, noise, 20)) for i in range(n)),
        output_tokens=np.full(n, tokens),
        chunks=np.full(n, 40.0),
        duration_s=duration,
    )


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
    spec = [
        Sample(
            index=spec[0].index[keep],
            values={k: v[keep] for k, v in spec[0].values.items()},
            itl=tuple(g for g, k in zip(spec[0].itl, keep, strict=True) if k),
            output_tokens=spec[0].output_tokens[keep],
            chunks=spec[0].chunks[keep],
            duration_s=10.0,
        )
    ]
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


def _noisy(
    estimate: float,
    within: float,
    n: int,
    server: float | None = None,
    runs: int = 1,
    restarted: bool = False,
    run_sd: float | None = None,
) -> stats.Ratio:
    noise = stats.Noise(within, n, server, 9.0 if server else 0.0, runs, restarted, run_sd)
    return stats.Ratio("speedup_median_tpot", estimate, estimate / 1.1, estimate * 1.1, 0.95, runs, n, noise=noise)


def test_to_resolve_sizes_the_window_for_80_percent_power_from_the_within_window_spread() -> None:
    # se^2 = within^2 * n0 / n: the margin beyond the floor must be (z_0.975 + z_0.8) standard errors,
    # the margin of the effect the hint names: the interval's bound on the estimate's side (1.21),
    # never the estimate itself (post-hoc power at the estimate is circular).
    margin = math.log(1.21) - math.log(1.02)
    need = margin / (1.959964 + 0.841621)
    n = math.ceil(0.1**2 * 50 / need**2)
    hint = decisions.to_resolve(_noisy(1.10, 0.1, 50), 0.02)
    assert f"at ~{n} requests per window, an effect of 1.21x or more resolves with 80% power" in hint
    # The hint's size does not follow the estimate: the same interval, another estimate, the same hint.
    moved = dataclasses.replace(_noisy(1.10, 0.1, 50), estimate=1.04)
    assert f"at ~{n} requests per window" in decisions.to_resolve(moved, 0.02)
    # "No window size would" only where the whole interval lies inside the floor; an estimate
    # inside it with a wide interval still names a size.
    inside = stats.Ratio("speedup_median_tpot", 1.01, 0.99, 1.015, 0.95, 1, 50)
    assert "within the ±2% floor: no window size would" in decisions.to_resolve(inside, 0.02)
    wide = dataclasses.replace(_noisy(1.01, 0.05, 50), low=0.95, high=1.08)
    assert "no window size" not in decisions.to_resolve(wide, 0.02)
    assert "an effect of 1.08x or more resolves" in decisions.to_resolve(wide, 0.02)


def test_to_resolve_says_more_requests_cannot_help_when_the_server_spread_alone_is_too_wide() -> None:
    hint = decisions.to_resolve(_noisy(1.10, 0.01, 50, server=0.05), 0.02)
    assert hint.startswith("more requests cannot resolve this") and "repeats.restart=true and repeats.count >=" in hint
    runs = int(hint.rsplit(">= ", 1)[1].split()[0].rstrip(","))
    # The design is sized by the A/A spread's one-sided 80 % upper bound (9 degrees of freedom here).
    server = 0.05 * math.sqrt(9 / scipy_stats.chi2.ppf(0.2, 9))
    per_run, margin = math.hypot(0.01, server), math.log(1.21 / 1.02)  # the interval's upper bound
    t = scipy_stats.t
    assert (t.ppf(0.975, runs - 1) + t.ppf(0.8, runs - 1)) * per_run / math.sqrt(runs) <= margin
    assert (t.ppf(0.975, runs - 2) + t.ppf(0.8, runs - 2)) * per_run / math.sqrt(runs - 1) > margin


def test_to_resolve_counts_repeats_with_the_t_quantiles_shrinking_in_r_and_caps_the_hint() -> None:
    hint = decisions.to_resolve(_noisy(1.10, 0.02, 50, server=0.04, runs=3, restarted=True, run_sd=0.045), 0.02)
    assert hint.startswith("at ~") and "repeats, an effect of 1.21x or more resolves with 80% power" in hint
    assert decisions.to_resolve(_noisy(1.03, 1.5, 50), 0.02).startswith("not resolvable at practical sizes")
    # A stricter level (the family's adjustment) asks for more.
    loose, strict = (decisions.to_resolve(_noisy(1.10, 0.1, 50), 0.02, level) for level in (0.05, 0.005))
    assert int(strict.split()[1][1:]) > int(loose.split()[1][1:])


def test_benjamini_hochberg_can_withdraw_a_lone_borderline_call() -> None:
    # One comparison whose interval barely clears the floor helps alone, not among 20 nulls.
    rng = np.random.default_rng(0)
    border = stats.Ratio(
        "speedup_median_tpot", 1.1, 1.03, 1.2, 0.95, 1, 50, log_replicates=rng.normal(math.log(1.1), 0.03, 2000)
    )
    nulls = [
        stats.Ratio("speedup_median_tpot", 1.0, 0.9, 1.1, 0.95, 1, 50, log_replicates=rng.normal(0, 0.05, 2000))
        for _ in range(20)
    ]
    assert decide([border], OPTS)[0].label == "helps"
    withdrawn = decide([border, *nulls], OPTS)[0]
    assert withdrawn.label == "inconclusive" and "not after the adjustment for 21 comparisons" in withdrawn.detail


def test_crossing_is_an_interval_only_where_helps_turns_into_hurts() -> None:
    rates = [1.0, 4.0, 16.0]
    ratios = [
        paired_ratio("speedup_median_tpot", *pair(s, 128, t), OPTS, np.random.default_rng(s))
        for s, t in enumerate((2.0, 1.4, 0.7))
    ]
    cross = decisions.crossing(rates, decide(ratios, OPTS), OPTS)
    assert cross.rate is not None and 4.0 < cross.low <= cross.rate <= cross.high < 16.0  # type: ignore[operator]
    flat = [paired_ratio("speedup_median_tpot", *pair(s, 64, 1.0), OPTS, np.random.default_rng(s)) for s in range(3)]
    assert decisions.crossing(rates, decide(flat, OPTS), OPTS).rate is None


def test_crossing_keeps_replicates_that_do_not_cross_censored_at_the_segment_ends() -> None:
    # Helps at 1 req/s, hurts at 4. On 10 % of the replicates the speedup at 4 req/s is still
    # above 1 (no crossing within the segment: censored at 4), on 10 % it is below 1 already at
    # 1 req/s (censored at 1): the interval reaches both ends instead of being confined to the
    # replicates that cross.
    b = 2000
    rng = np.random.default_rng(0)
    low_rate, high_rate = rng.normal(0.3, 0.05, b), rng.normal(-0.3, 0.05, b)
    high_rate[: b // 10] = 0.05
    low_rate[b // 10 : b // 5] = -0.05

    def at(estimate: float, log_replicates: np.ndarray, label: str) -> decisions.Decision:
        ratio = stats.Ratio(
            "speedup_median_tpot", estimate, estimate * 0.9, estimate * 1.1, 0.95, 1, 200, log_replicates=log_replicates
        )
        return decisions.Decision(label, ratio, 0.001)

    cross = decisions.crossing(
        [1.0, 4.0], [at(math.exp(0.3), low_rate, decisions.HELPS), at(math.exp(-0.3), high_rate, decisions.HURTS)], OPTS
    )
    assert cross.rate == pytest.approx(2.5)
    assert cross.low == 1.0 and cross.high == 4.0
    assert cross.text == "crosses 1.0 at ~2.50 req/s [1.00, 4.00] (between 1 and 4 req/s)"
    # Dropping the replicates that do not cross would have confined the interval inside the segment.
    crossed = [
        v
        for v in (decisions._interpolate([1.0, 4.0], [a, c]) for a, c in zip(low_rate, high_rate, strict=True))
        if v is not None
    ]
    assert 1.0 < min(crossed) and max(crossed) < 4.0


def test_kept_up_is_the_achieved_request_rate_against_the_offered_one() -> None:
    w = window(np.random.default_rng(0), np.zeros(40), 0.04)
    lag = float(np.median(w.values["e2el"]))  # a typical request's latency: ~4 s
    # 40 requests over 10 s of arrivals, the last done a typical latency later: it kept up.
    on_time = dataclasses.replace(w, scheduled_end_s=10.0, duration_s=10.0 + lag)
    assert stats.achieved_share(on_time) == pytest.approx(1.0) and stats.keeps_up(on_time)
    # Served at 80 % of the offered rate: the queue stretched the span by a quarter.
    behind = dataclasses.replace(on_time, duration_s=10.0 / 0.8 + lag)
    assert stats.achieved_share(behind) == pytest.approx(0.8) and not stats.keeps_up(behind)
    assert stats.keeps_up(dataclasses.replace(on_time, duration_s=10.0 / 0.95 + lag))
    # Failed requests were offered, not achieved: 40 of 50 completed in the same span is 80 %.
    failing = dataclasses.replace(on_time, failed=10)
    assert stats.achieved_share(failing) == pytest.approx(0.8) and not stats.keeps_up(failing)
    # All at once never keeps up; an unknown schedule is not "kept up".
    assert stats.achieved_share(dataclasses.replace(w, scheduled_end_s=0.0)) == 0.0
    assert math.isnan(stats.achieved_share(w)) and not stats.keeps_up(w)


def test_a_window_that_streamed_nothing_has_no_throughput_ratio_and_no_error() -> None:
    """Every request of a window failed (found by the default sweep on an AVX2-only CPU, whose
    16 req/s windows timed out whole): its throughput is 0, and the ratio says so, not a crash."""
    rng = np.random.default_rng(0)
    base = window(rng, np.zeros(30), 0.04)
    empty = dataclasses.replace(window(rng, np.zeros(30), 0.04), output_tokens=np.zeros(30))
    assert empty.throughput == 0.0
    for a, b in ((base, empty), (empty, base), (empty, empty)):
        ratio = stats.paired_ratio("output_throughput_ratio", [a], [b], OPTS, rng)
        assert ratio.estimate is None and "no throughput" in ratio.note


def test_acceptance_length_interval_is_centred_on_the_counters() -> None:
    rng = np.random.default_rng(0)
    w = window(rng, np.zeros(30), 0.04)
    w = Sample(w.index, w.values, w.itl, np.full(30, 101.0), rng.integers(30, 40, 30).astype(float), 10.0)
    ratio = stats.acceptance_length_interval([w], 3.05, OPTS)
    assert ratio.estimate == pytest.approx(3.05) and ratio.low < 3.05 < ratio.high  # type: ignore[operator]


def test_sample_reads_the_clients_requests_csv() -> None:
    frame = pd.DataFrame(
        {
            "index": [0, 1, 2],
            "ttft_s": [0.1, 0.2, None],
            "tpot_s": [0.01, None, None],
            "e2el_s": [1.0, 0.3, None],
            "num_chunks": [5, 1, 0],
            "output_tokens": [10, 1, None],
            "error": [None, None, "HTTP 500"],
            "chunk_s": ["[0.1, 0.2, 0.4]", "[0.2]", "[]"],
        }
    )
    sample = Sample.from_requests(frame, 2.0)
    assert sample.size == 2 and sample.failed == 1 and sample.throughput == pytest.approx(5.5)
    assert np.allclose(sample.itl[0], [0.1, 0.2]) and math.isnan(sample.values["tpot"][1])


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"confidence": 1.0}, "confidence"), ({"confidence": 0.4}, "confidence"), ({"floor": -0.1}, "floor")],
)
def test_bad_options_are_refused(kw: dict, match: str) -> None:
    with pytest.raises(StatsError, match=match):
        StatsOptions(**kw)


def test_the_aa_spread_between_servers_widens_one_server_comparisons_only() -> None:
    spread = samples.server_spread(
        {"speedup_median_tpot": [0.06, -0.08, 0.02, -0.05], "output_throughput_ratio": [0.03, -0.02, 0.04, -0.01]}, "aa"
    )
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


def test_a_large_effect_is_called_in_a_family_of_sixty_whatever_the_resample_count() -> None:
    # Replicate counts floor a bootstrap p at 2 / (B + 1) = 0.002: after Benjamini-Hochberg over
    # 60 comparisons (0.002 * 60 > 0.05) the largest effect could never be called.
    rng = np.random.default_rng(4)
    huge = paired_ratio("speedup_median_tpot", *pair(5, 128, 3.0), OPTS)
    nulls = [
        stats.Ratio("speedup_median_tpot", 1.0, 0.9, 1.1, 0.95, 1, 50, log_replicates=rng.normal(0, 0.05, 1000))
        for _ in range(59)
    ]
    first = decide([huge, *nulls], OPTS)[0]
    assert first.label == "helps" and first.p_adjusted is not None and first.p_adjusted < 0.05


def test_one_comparison_helps_exactly_when_its_interval_clears_the_floor() -> None:
    for low in (1.019, 1.021):
        ratio = stats.Ratio("speedup_median_tpot", 1.2, low, 1.5, 0.95, 1, 50, log_replicates=np.zeros(5))
        assert (decide([ratio], OPTS)[0].label == "helps") == (low > 1.02)


def test_failed_requests_count_as_censored_latencies_not_as_missing_ones() -> None:
    # The same speed, but speculation fails (times out) on 30 of 100 prompts: dropped from both
    # sides, the failures vanish and the two look alike.
    rng = np.random.default_rng(8)
    prompt = rng.normal(0, 0.5, 100)
    base = window(rng, prompt, 0.04)
    spec_all = window(rng, prompt, 0.04)
    keep = ~np.isin(np.arange(100), rng.choice(100, 30, replace=False))
    spec = Sample(
        index=spec_all.index[keep],
        values={k: v[keep] for k, v in spec_all.values.items()},
        itl=tuple(g for g, k in zip(spec_all.itl, keep, strict=True) if k),
        output_tokens=spec_all.output_tokens[keep],
        chunks=spec_all.chunks[keep],
        duration_s=10.0,
        failed=30,
        failed_index=np.flatnonzero(~keep),
    )
    ratio = paired_ratio("speedup_median_tpot", [base], [spec], OPTS)
    dropped = paired_ratio(
        "speedup_median_tpot", [base], [dataclasses.replace(spec, failed_index=np.empty(0, int))], OPTS
    )
    assert ratio.requests == 100 and dropped.requests == 70
    assert 0.85 < dropped.estimate < 1.15  # type: ignore[operator]  # the failures do not show
    assert ratio.estimate < 0.85 and ratio.high < 0.98  # type: ignore[operator]  # censored, they count against it
    p99 = paired_ratio("speedup_p99_tpot", [base], [spec], OPTS)
    assert p99.estimate == 0.0  # its p99 is a failure: +inf


def test_a_zero_latency_is_no_ratio_and_never_read_as_a_failure() -> None:
    # A server that streams a request's tokens together measures a TPOT of 0 (a scripted server
    # did, in a stand-in night): log(0) once read as the -inf a failed window gives.
    rng = np.random.default_rng(4)
    prompt = rng.normal(0, 0.1, 40)
    base, spec = window(rng, prompt, 0.04), window(rng, prompt, 0.04)
    some = dataclasses.replace(
        spec, values={**spec.values, "tpot": np.where(np.arange(40) < 12, 0.0, spec.values["tpot"])}
    )
    ratio = paired_ratio("speedup_median_tpot", [base], [some], OPTS)
    assert ratio.estimate is not None and math.isfinite(ratio.estimate)
    assert ratio.low is not None and ratio.high is not None  # resamples reaching a 0 are undefined, not censored
    every = dataclasses.replace(spec, values={**spec.values, "tpot": np.zeros(40)})
    none = paired_ratio("speedup_median_tpot", [base], [every], OPTS)
    assert none.estimate is None and none.note == "a window's tpot quantile is 0 ms"


def _failing_spec(spec: Sample, prompts: np.ndarray) -> Sample:
    """The speculative window with these prompts failed: gone from the answers, listed as failures."""
    kept = spec.with_index(np.setdiff1d(spec.index, prompts))
    return dataclasses.replace(kept, failed=len(prompts), failed_index=np.asarray(prompts, dtype=int))


def test_censored_p99_ratios_get_an_interval_and_are_decided_by_their_share_of_infinite_replicates() -> None:
    (base,), (spec,) = pair(4, 128, 1.5)
    fastest = spec.index[np.argsort(spec.values["tpot"])]
    one = paired_ratio("speedup_p99_tpot", [base], [_failing_spec(spec, fastest[:1])], OPTS)
    # One failure: the estimate stays finite; replicates that draw it twice reach it (-inf).
    assert one.resolved and one.low is not None and not math.isnan(one.low) and not math.isnan(one.high)  # type: ignore[arg-type]
    assert one.low == 0.0 and 1.0 < one.high < 3.0 and "nan" not in one.text  # type: ignore[operator]
    two = paired_ratio("speedup_p99_tpot", [base], [_failing_spec(spec, fastest[:2])], OPTS)
    # Two: the p99 itself is a failure (a ratio of 0), censored, with its interval.
    assert two.estimate == 0.0 and two.resolved and "no interval" not in two.text
    many = paired_ratio("speedup_p99_tpot", [base], [_failing_spec(spec, fastest[:8])], OPTS)
    labels = [d.label for d in decide([one, two, many], OPTS, 0.10)]
    # Half of the replicates of two failures reach them, half show 1.5x: neither side is clear.
    # Eight failures reach the p99 in every replicate: speculation's tail is worse, resolved.
    assert labels == [decisions.INCONCLUSIVE, decisions.INCONCLUSIVE, decisions.HURTS]
    assert all(d.p_adjusted is not None and not math.isnan(d.p_adjusted) for d in decide([one, two], OPTS, 0.10))


def test_a_p99_from_fewer_than_100_requests_is_shown_but_gets_no_verdict() -> None:
    small = paired_ratio("speedup_p99_tpot", *pair(1, 40, 3.0), OPTS)
    large = paired_ratio("speedup_p99_tpot", *pair(1, 160, 3.0), OPTS)
    got = decide([small, large], OPTS, 0.10)
    assert small.resolved and got[0].label == decisions.TOO_FEW and "100 or more paired requests" in got[0].detail
    assert got[1].label == "helps"


def _ar1(rng: np.random.Generator, n: int, rho: float, sd: float = 0.15) -> np.ndarray:
    """A stationary Gaussian AR(1) series of lag-1 correlation ``rho`` and marginal sd ``sd``."""
    x = np.empty(n)
    x[0] = rng.normal(0, sd)
    for i in range(1, n):
        x[i] = rho * x[i - 1] + rng.normal(0, sd * math.sqrt(1 - rho**2))
    return x


@pytest.mark.parametrize("rho", [0.3, 0.6])
def test_serial_inflation_is_the_ar1_mean_factor_of_the_series_own_correlation(rho: float) -> None:
    rng = np.random.default_rng(21)
    got, factor = stats.serial_inflation(_ar1(rng, 4000, rho))
    assert got == pytest.approx(rho, abs=0.04)
    assert factor == pytest.approx(math.sqrt((1 + rho) / (1 - rho)), rel=0.06)
    # Censored entries (a failure's log ratio is +-inf) leave the estimate where it was.
    series = _ar1(rng, 4000, rho)
    series[::50] = math.inf
    assert stats.lag1_autocorrelation(series) == pytest.approx(rho, abs=0.04)


def test_serial_inflation_leaves_independent_requests_alone() -> None:
    rng = np.random.default_rng(22)
    # This seed's rho is positive (0.14) but below 1.645 / sqrt(64): not widened.
    assert stats.serial_inflation(rng.normal(0, 0.15, 64)) == (pytest.approx(0.136, abs=0.001), 1.0)
    # In expectation: a one-sided 5 % test, so about one window in twenty is widened, and little.
    factors = np.array([stats.serial_inflation(rng.standard_t(4, 64))[1] for _ in range(1000)])
    assert 0.02 < np.mean(factors > 1) < 0.09
    assert np.mean(factors) < 1.03
    # Too few entries or a constant series: nothing to estimate, nothing widened.
    assert stats.serial_inflation(np.ones(64)) == (0.0, 1.0)
    assert stats.serial_inflation(np.array([1.0, 2.0]))[1] == 1.0


def _correlated_pair(seed: int, n: int, rho: float) -> tuple[Sample, Sample]:
    """One run's two windows whose request noise is AR(1) in arrival order, each server its own."""
    rng = np.random.default_rng(seed)
    prompt = rng.normal(0, 0.1, n)
    out = []
    for scale in (0.04, 0.04 / 1.5):
        w = window(rng, prompt, scale)
        tpot = scale * np.exp(prompt + _ar1(rng, n, rho))
        out.append(dataclasses.replace(w, values={"tpot": tpot, "ttft": tpot * 3, "e2el": tpot * 100}))
    return out[0], out[1]


def test_serially_correlated_windows_get_their_interval_widened_about_the_estimate(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    base, spec = _correlated_pair(5, 64, 0.6)
    series = np.log(base.values["tpot"]) - np.log(spec.values["tpot"])
    rho, factor = stats.serial_inflation(series)
    assert rho > 0.4 and factor > 1.5
    widened = paired_ratio("speedup_median_tpot", [base], [spec], OPTS, np.random.default_rng(1))
    monkeypatch.setattr(stats, "serial_inflation", lambda series: (0.0, 1.0))
    iid = paired_ratio("speedup_median_tpot", [base], [spec], OPTS, np.random.default_rng(1))
    assert widened.estimate == iid.estimate
    centre = math.log(iid.estimate)  # type: ignore[arg-type]
    for got, was in ((widened.low, iid.low), (widened.high, iid.high)):
        assert math.log(got) - centre == pytest.approx(factor * (math.log(was) - centre), rel=1e-9)  # type: ignore[arg-type]


def test_arrival_order_is_the_schedule_where_there_is_one_else_the_prompt_index() -> None:
    # The prompts were sent in a shuffled order: in prompt order the correlation is gone.
    base, spec = _correlated_pair(6, 64, 0.6)
    order = np.random.default_rng(0).permutation(64)  # request j (in arrival order) is prompt order[j]
    due = np.arange(64, dtype=float)
    base, spec = (dataclasses.replace(w, index=order, scheduled=due) for w in (base, spec))
    prompts = np.arange(64)
    positions = stats._arrival_order(base, spec, prompts)
    assert np.array_equal(prompts[positions], order)
    unscheduled = dataclasses.replace(base, scheduled=np.empty(0))
    assert np.array_equal(
        stats._arrival_order(unscheduled, dataclasses.replace(spec, scheduled=np.empty(0)), prompts), prompts
    )
    # Only one window recorded its schedule: both windows share it.
    assert np.array_equal(prompts[stats._arrival_order(unscheduled, spec, prompts)], order)
