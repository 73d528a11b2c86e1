"""search=capacity's pure part: the SLO rule, the rate search and the boundary's interval."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from pipeline.analysis import capacity, stats
from pipeline.analysis.capacity import (
    Probe,
    SearchSettings,
    boundary,
    capacity_ratio,
    next_rate,
    window_passes,
)
from pipeline.analysis.samples import Sample, StatsOptions
from pipeline.load.slo import SloTarget

OPTS = StatsOptions(resamples=500)


def window(tpot: np.ndarray, ttft: np.ndarray | None = None, failed: int = 0) -> Sample:
    n = len(tpot)
    ttft = np.full(n, 0.1) if ttft is None else ttft
    return Sample(
        index=np.arange(n),
        values={"tpot": np.asarray(tpot, float), "ttft": ttft, "e2el": ttft + 100 * tpot},
        itl=tuple(np.empty(0) for _ in range(n)),
        output_tokens=np.full(n, 100.0),
        chunks=np.full(n, 100.0),
        duration_s=10.0,
        failed=failed,
    )


def search(boundary_rate: float, settings: SearchSettings) -> list[tuple[float, bool]]:
    """Drives next_rate against a deterministic server: it meets the SLO iff rate <= boundary_rate."""
    history: list[tuple[float, bool]] = []
    while (rate := next_rate(history, settings)) is not None:
        history.append((rate, rate <= boundary_rate))
        assert len(history) <= 50, history
    return history


def bracket(history: list[tuple[float, bool]]) -> tuple[float, float]:
    hi = min(r for r, ok in history if not ok)
    return max(r for r, ok in history if ok and r < hi), hi


# ---- next_rate ---------------------------------------------------------------------------


@pytest.mark.parametrize("start", [1.0, 10.0])
def test_search_brackets_then_bisects_to_the_resolution(start: float) -> None:
    settings = SearchSettings(start_rate=start)
    history = search(3.1, settings)
    lo, hi = bracket(history)
    assert lo <= 3.1 < hi
    assert hi / lo - 1 <= settings.resolution
    assert len(history) <= settings.max_probes
    assert history[0][0] == start
    # Bracketing moves by factors of two: up from a pass, down from a fail.
    assert history[1][0] == (2 * start if start < 3.1 else start / 2)


def test_search_gives_up_after_probing_min_rate_once() -> None:
    history = search(0.05, SearchSettings(start_rate=1.0, min_rate=0.1))
    assert [r for r, _ in history] == [1.0, 0.5, 0.25, 0.125, 0.1]
    assert not any(ok for _, ok in history)
    assert next_rate(history, SearchSettings(start_rate=1.0, min_rate=0.1)) is None


def test_search_bisects_when_min_rate_passes() -> None:
    history = search(0.11, SearchSettings(start_rate=1.0, min_rate=0.1))
    assert (0.1, True) in history
    lo, hi = bracket(history)
    assert lo <= 0.11 < hi


def test_search_stops_at_max_probes() -> None:
    history = search(3.1, SearchSettings(max_probes=3))
    assert [r for r, _ in history] == [1.0, 2.0, 4.0]


def test_search_doubles_while_nothing_fails() -> None:
    history = search(math.inf, SearchSettings(start_rate=0.5, max_probes=5))
    assert [r for r, _ in history] == [0.5, 1.0, 2.0, 4.0, 8.0]


def test_search_brackets_below_the_lowest_fail_when_results_are_not_monotone() -> None:
    settings = SearchSettings()
    assert next_rate([(1.0, True), (2.0, False), (4.0, True)], settings) == pytest.approx(math.sqrt(2))
    assert next_rate([(2.0, False), (4.0, True)], settings) == 1.0  # no pass below the fail: halve it


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"start_rate": 0.0}, "capacity.start_rate"),
        ({"start_rate": math.inf}, "capacity.start_rate"),
        ({"min_rate": 0.0}, "capacity.min_rate"),
        ({"min_rate": 2.0}, "capacity.min_rate"),
        ({"resolution": 0.0}, "capacity.resolution"),
        ({"resolution": 1.0}, "capacity.resolution"),
        ({"max_probes": 1}, "capacity.max_probes"),
    ],
)
def test_search_settings_name_the_bad_key(kwargs: dict[str, float], key: str) -> None:
    with pytest.raises(ValueError, match=key):
        SearchSettings(**kwargs)  # type: ignore[arg-type]


# ---- window_passes ------------------------------------------------------------------------


def test_slo_target_describes_itself() -> None:
    assert SloTarget(tpot_s=0.05).describe() == "p99 TPOT <= 50 ms, goodput >= 99%"
    both = SloTarget(ttft_s=0.2, tpot_s=0.05, percentile=90, min_goodput=0.995)
    assert both.describe() == "p90 TTFT <= 200 ms, p90 TPOT <= 50 ms, goodput >= 99.5%"
    assert both.active and not SloTarget().active
    with pytest.raises(ValueError, match="tpot_s"):
        SloTarget(tpot_s=0.0)


def test_the_percentile_is_over_defined_values_only() -> None:
    rng = np.random.default_rng(3)
    values = rng.lognormal(-4, 0.5, size=(50, 40))
    values[rng.random(values.shape) < 0.2] = np.nan
    got = capacity._finite_percentile(values, 99.0)
    want = [np.percentile(row[np.isfinite(row)], 99.0) for row in values]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_p99_just_under_the_threshold_passes_just_over_fails() -> None:
    tpot = np.linspace(0.001, 0.1, 100)
    p99 = float(np.percentile(tpot, 99))
    # A lenient goodput isolates the percentile check; one-token requests must not move it.
    sample = window(np.concatenate([tpot, np.full(20, np.nan)]))
    assert window_passes(sample, SloTarget(tpot_s=p99 * 1.001, min_goodput=0.5))
    assert not window_passes(sample, SloTarget(tpot_s=p99 * 0.999, min_goodput=0.5))


def test_failed_requests_lower_the_good_share() -> None:
    target = SloTarget(tpot_s=0.05)
    tpot = np.full(100, 0.01)
    assert window_passes(window(tpot), target)
    assert window_passes(window(tpot, failed=1), target)  # 100 / 101 >= 99 %
    assert not window_passes(window(tpot, failed=2), target)  # 100 / 102 < 99 %


def test_a_slow_ttft_makes_a_request_not_good() -> None:
    ttft = np.full(100, 0.1)
    ttft[:2] = 5.0
    target = SloTarget(ttft_s=1.0, tpot_s=0.05, percentile=50)
    assert window_passes(window(np.full(100, 0.01)), target)
    assert not window_passes(window(np.full(100, 0.01), ttft=ttft), target)  # 98 % good


def test_one_token_requests_count_as_good_for_tpot() -> None:
    target = SloTarget(tpot_s=0.02)
    half = np.concatenate([np.full(50, 0.01), np.full(50, np.nan)])
    assert window_passes(window(half), target)
    assert window_passes(window(np.full(10, np.nan)), target)


def test_a_window_without_successful_requests_fails() -> None:
    assert not window_passes(window(np.empty(0), ttft=np.empty(0), failed=5), SloTarget(tpot_s=0.05))


# ---- margins, overload -------------------------------------------------------------------


def lognormal_window(seed: int, n: int = 201, scale: float = 0.01) -> Sample:
    return window(np.random.default_rng(seed).lognormal(math.log(scale), 0.3, n))


def test_margins_are_continuous_where_every_request_passed() -> None:
    # Every request far below the threshold: a pass/fail call is unanimous over resamples, the
    # log margin of the p90 is not (its draws keep their spread).
    target = SloTarget(tpot_s=0.1, percentile=90, min_goodput=0.0)
    observed, replicates = capacity.margins(lognormal_window(0), target, OPTS, np.random.default_rng(1))
    latency = replicates[0]
    assert observed[0] < 0 and (latency < 0).all() and latency.std() > 0.01
    assert observed[-1] == -1.0  # not overloaded


def test_a_p99_of_few_requests_has_no_finite_upper_bound() -> None:
    # 0.99^100 = 37 % of the time all 100 requests lie below the population's p99: nothing in
    # the window bounds it from above, and the draws say so (+inf), where a bootstrap could not.
    target = SloTarget(tpot_s=0.1, min_goodput=0.0)
    _, small = capacity.margins(lognormal_window(0, 100), target, OPTS, np.random.default_rng(1))
    _, large = capacity.margins(lognormal_window(0, 2000), target, OPTS, np.random.default_rng(1))
    assert 0.25 < np.isinf(small[0]).mean() < 0.5 and not np.isinf(large[0]).any()


def test_the_margins_draws_repeat_with_their_seed_and_differ_without_it() -> None:
    # A sweep's capacity interval is reproducible: the same window and seed draw the same replicates.
    target = SloTarget(tpot_s=0.02, min_goodput=0.9)
    sample = lognormal_window(3, 150)
    first, second, other = (capacity.margins(sample, target, OPTS, np.random.default_rng(seed)) for seed in (7, 7, 8))
    np.testing.assert_array_equal(first[1], second[1])
    assert not np.array_equal(first[1], other[1])
    np.testing.assert_array_equal(first[0], other[0])  # the observed margins draw nothing


@pytest.mark.parametrize(
    ("n", "inf_share"),
    # A p99's upper draw is +inf where all n requests may lie below it: 0.99^n of the time.
    [(1, 0.99), (30, 0.99**30)],
)
def test_a_window_of_one_or_thirty_requests_says_how_little_it_bounds_a_p99(n: int, inf_share: float) -> None:
    target = SloTarget(tpot_s=0.1, min_goodput=0.0)
    opts = StatsOptions(resamples=4000)
    observed, replicates = capacity.margins(lognormal_window(0, n), target, opts, np.random.default_rng(2))
    assert replicates.shape == (2, 4000) and observed[0] < 0  # the observed p99 (~10 ms) meets 100 ms
    assert abs(np.isinf(replicates[0]).mean() - inf_share) < 0.03
    assert (replicates[0][np.isfinite(replicates[0])] < 0).all()  # bounded draws lie among the values


def test_a_window_with_no_successful_request_misses_on_its_goodput_in_every_replicate() -> None:
    # No TPOT is defined, so no percentile is broken; the goodput share of 0 of 5 is what misses.
    target = SloTarget(tpot_s=0.1, min_goodput=0.5)
    empty = window(np.empty(0), ttft=np.empty(0), failed=5)
    observed, replicates = capacity.margins(empty, target, OPTS, np.random.default_rng(0))
    assert observed[0] == -math.inf and (replicates[0] == -math.inf).all()
    assert observed[1] > 0 and (replicates[1] > 0).mean() > 0.9  # 0 of 5: the exact upper bound is 0.52
    found = boundary([capacity.probe(0.5, empty, target, OPTS, np.random.default_rng(0))], OPTS)
    assert found.estimate is None and found.text == "cannot meet the SLO at 0.5 req/s"


def test_a_window_whose_ttft_rises_through_it_is_overloaded_and_fails() -> None:
    n = 60
    steady = window(np.full(n, 0.01), ttft=np.full(n, 0.1) * np.exp(np.random.default_rng(0).normal(0, 0.1, n)))
    steady = dataclasses.replace(steady, scheduled=np.linspace(0, 30, n), scheduled_end_s=30.0, duration_s=31.0)
    growing = dataclasses.replace(steady, values=steady.values | {"ttft": np.linspace(0.1, 3.0, n)})
    assert capacity.overloaded(steady) is None and window_passes(steady, SloTarget(tpot_s=0.05))
    assert "queue growing" in (capacity.overloaded(growing) or "")
    assert not window_passes(growing, SloTarget(tpot_s=0.05))


def test_a_window_that_completed_under_90_percent_of_the_offered_rate_did_not_keep_up() -> None:
    # 40 requests sent over 10 s of arrivals offer 4 req/s; each takes 1.1 s. Done 12.6 s after
    # the start, less that latency, is 11.5 s for 40 requests: 3.48 req/s (87 %).
    late = dataclasses.replace(window(np.full(40, 0.01)), scheduled_end_s=10.0, duration_s=12.6)
    assert "did not keep up: it completed 3.48 req/s of the 4.00 req/s offered (87%" in (
        capacity.overloaded(late) or ""
    )
    assert not window_passes(late, SloTarget(tpot_s=0.05, min_goodput=0.0))
    on_time = dataclasses.replace(late, duration_s=12.0)  # 91 %: kept up, by the report's rule too
    assert capacity.overloaded(on_time) is None and stats.keeps_up(on_time)
    # Failed requests were offered but not achieved: 30 of 40 completed is 75 % of 4 req/s,
    # although the arrival span is most of the window's.
    failing = dataclasses.replace(window(np.full(30, 0.01), failed=10), scheduled_end_s=10.0, duration_s=11.1)
    assert "did not keep up" in (capacity.overloaded(failing) or "")
    # Without a recorded schedule the window is not judged on keeping up.
    assert capacity.overloaded(window(np.full(40, 0.01))) is None


# ---- boundary ------------------------------------------------------------------------------


def probes(rates: list[float], limit: float, n: int = 1000, seed: int = 0, goodput: float = 0.0) -> list[Probe]:
    """Probes of a server whose per-request TPOT is lognormal with median 10 ms x rate / limit:
    its p99 reaches 10 ms x e^(0.3 z_0.99) = 20 ms exactly at rate = limit."""
    target = SloTarget(tpot_s=0.010 * math.exp(0.3 * 2.3263), min_goodput=goodput)
    rng = np.random.default_rng(seed)
    return [
        capacity.probe(r, lognormal_window(int(rng.integers(1e9)), n, 0.01 * r / limit), target, OPTS, rng)
        for r in rates
    ]


def margin_probes(rates: list[float], observed: np.ndarray, replicates: np.ndarray) -> list[Probe]:
    """Probes with given margins, one criterion: observed (1, P), replicates (1, P, B)."""
    return [Probe(r, bool(observed[0, i] < 0), observed[:, i], replicates[:, i]) for i, r in enumerate(rates)]


def test_the_boundary_is_where_the_fitted_margin_crosses_zero_between_the_probes() -> None:
    found = boundary(probes([1.0, 2.0, 4.0, 2.83, 3.36, 3.08], 3.1), OPTS)
    assert found.estimate is not None and 2.8 < found.estimate < 3.4
    assert found.low is not None and found.high is not None and found.low < 3.1 < found.high
    assert math.isfinite(found.high) and found.probes == 6
    assert found.text.startswith(f"{found.estimate:.2f} req/s [")


def test_the_boundary_covers_the_truth_at_about_the_stated_rate() -> None:
    # With 400 requests per probe. With 100 a p99 has no finite 95 % upper bound, and the boundary's
    # interval is a sensitivity band, not a calibrated interval (docs/statistics.md).
    hits = 0
    for seed in range(40):
        found = boundary(probes([1.0, 2.0, 4.0, 2.83, 3.36], 3.0, n=400, seed=seed), OPTS)
        hits += found.low is not None and found.high is not None and found.low <= 3.0 <= found.high
    assert hits >= 34, hits  # 95 % nominal; 34 of 40 is its one-sided 1 % binomial bound


def test_a_failing_lowest_probe_has_no_estimate() -> None:
    found = boundary(probes([1.0, 0.5, 0.25, 0.125, 0.1], 0.05), OPTS)
    assert found.estimate is None
    assert found.text == "cannot meet the SLO at 0.1 req/s"
    assert (found.replicates == 0.0).all()


def test_nothing_failing_gives_an_open_interval_that_says_at_least() -> None:
    found = boundary(probes([1.0, 2.0, 4.0, 8.0], 100.0), OPTS)
    assert found.estimate == 8.0 and found.high == math.inf
    assert found.text.startswith("at least 8.00 req/s")


def test_an_open_upper_end_with_a_finite_estimate_prints_at_least_the_highest_probe() -> None:
    # The observed margins cross zero between 2 and 4 req/s; on a tenth of the replicates they
    # never do (the boundary lies above the highest probe), so the upper end is open.
    b = 1000
    observed = np.array([[-1.0, -0.5, 0.5]])
    replicates = np.repeat(observed[:, :, None], b, axis=2) + np.random.default_rng(0).normal(0, 0.05, (1, 3, b))
    replicates[0, 2, : b // 10] = -0.2
    found = boundary(margin_probes([1.0, 2.0, 4.0], observed, replicates), OPTS)
    assert found.estimate is not None and 2.0 < found.estimate < 4.0 and found.high == math.inf
    assert found.low is not None and 2.0 < found.low <= found.estimate
    assert found.text == f"{found.estimate:.2f} req/s [{found.low:.2f}, ≥ 4.00]"


def test_a_pass_above_the_lowest_miss_does_not_lift_the_boundary_past_that_miss() -> None:
    # Noise: 4 req/s met the SLO after 2 req/s missed it. The monotone fit pools the two, so the
    # boundary lies below 2 req/s, where the first miss says it is, and not near 4 or 8.
    observed = np.array([[-1.0, 0.6, -0.2, 1.0]])
    replicates = observed[:, :, None] + np.random.default_rng(0).normal(0, 0.02, (1, 4, 200))
    found = boundary(margin_probes([1.0, 2.0, 4.0, 8.0], observed, replicates), OPTS)
    # The pooled margin at 2 and 4 req/s is 0.2: the fit crosses zero 5/6 of the way from 1 to 2 on the log scale.
    assert found.estimate == pytest.approx(2 ** (5 / 6), rel=1e-9)
    assert found.high is not None and found.high < 2.0


def test_goodput_replicates_are_drawn_to_the_exact_binomial_bounds() -> None:
    # 190 of 200 good (and a window of all good): the replicates' 2.5 % and 97.5 % quantiles are
    # the Clopper-Pearson interval of scipy.stats.binomtest, where a Jeffreys draw was narrower.
    target = SloTarget(tpot_s=0.05, min_goodput=0.9)
    opts = StatsOptions(resamples=40_000)
    for good in (190, 200):
        tpot = np.where(np.arange(200) < good, 0.01, 0.1)
        _, replicates = capacity.margins(window(tpot), target, opts, np.random.default_rng(good))
        share = 0.9 - replicates[1]
        exact = scipy_stats.binomtest(good, 200).proportion_ci(method="exact")
        np.testing.assert_allclose(np.quantile(share, [0.025, 0.975]), [exact.low, exact.high], atol=2e-3)


def test_a_goodput_share_of_all_good_requests_stays_uncertain() -> None:
    # 200 of 200 good is not proof of a 99.9 % share: the interval reaches below the lowest probe.
    found = boundary(probes([1.0, 2.0, 4.0, 2.83, 3.36], 3.0, goodput=0.999), OPTS)
    assert found.low == 0.0


# ---- capacity_ratio ----------------------------------------------------------------------


def test_capacity_ratio_of_twice_the_boundary() -> None:
    base = boundary(probes([1.0, 2.0, 2.4, 2.8, 4.0], 2.5, seed=1), OPTS)
    spec = boundary(probes([2.0, 4.0, 4.8, 5.6, 8.0], 5.0, seed=2), OPTS)
    ratio = capacity_ratio(base, spec, OPTS)
    assert ratio.estimate == pytest.approx(spec.estimate / base.estimate)  # type: ignore[operator]
    assert ratio.low is not None and ratio.high is not None and ratio.low <= 2.0 <= ratio.high
    assert ratio.text.startswith(f"{ratio.estimate:.2f}x [")


def test_capacity_ratio_without_a_boundary_or_with_an_open_one() -> None:
    base = boundary(probes([1.0, 2.0, 2.4, 4.0], 2.5), OPTS)
    none = capacity_ratio(base, boundary(probes([0.1], 0.01), OPTS), OPTS)
    assert none.estimate is None and none.text.startswith("no interval")
    open_spec = capacity_ratio(base, boundary(probes([1.0, 2.0, 4.0, 8.0], 100.0), OPTS), OPTS)
    assert open_spec.high == math.inf and "lower bound" in open_spec.text
