"""search=capacity's pure part: the SLO rule, the rate search and the boundary's interval."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.analysis import capacity
from pipeline.analysis.capacity import (
    Probe,
    SearchSettings,
    SloTarget,
    boundary,
    capacity_ratio,
    next_rate,
    pass_replicates,
    window_passes,
)
from pipeline.analysis.samples import Sample, StatsOptions

OPTS = StatsOptions(resamples=500)


def window(tpot: np.ndarray, ttft: np.ndarray | None = None, failed: int = 0) -> Sample:
    n = len(tpot)
    ttft = np.full(n, 0.1) if ttft is None else ttft
    return Sample(
        index=np.arange(n), values={"tpot": np.asarray(tpot, float), "ttft": ttft, "e2el": ttft + 100 * tpot},
        itl=tuple(np.empty(0) for _ in range(n)), output_tokens=np.full(n, 100.0), chunks=np.full(n, 100.0),
        duration_s=10.0, failed=failed,
    )  # fmt: skip


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


# ---- pass_replicates ---------------------------------------------------------------------


def lognormal_window(seed: int, n: int = 201) -> Sample:
    return window(np.random.default_rng(seed).lognormal(math.log(0.01), 0.3, n))


def test_replicates_pass_far_below_fail_far_above_and_mix_at_the_threshold() -> None:
    sample = lognormal_window(0)
    far_below = pass_replicates(sample, SloTarget(tpot_s=0.1), OPTS, np.random.default_rng(1))
    far_above = pass_replicates(sample, SloTarget(tpot_s=0.001), OPTS, np.random.default_rng(1))
    median = float(np.median(sample.values["tpot"]))
    at = pass_replicates(sample, SloTarget(tpot_s=median, percentile=50, min_goodput=0.4), OPTS,
                         np.random.default_rng(1))  # fmt: skip
    for replicates in (far_below, far_above, at):
        assert replicates.dtype == bool and len(replicates) == OPTS.resamples
    assert far_below.mean() >= 0.99
    assert far_above.mean() <= 0.01
    assert 0.1 <= at.mean() <= 0.9, at.mean()


def test_replicates_are_reproducible_with_a_seed() -> None:
    sample, target = lognormal_window(5), SloTarget(tpot_s=0.015, percentile=90, min_goodput=0.8)
    first = pass_replicates(sample, target, OPTS, np.random.default_rng(7))
    again = pass_replicates(sample, target, OPTS, np.random.default_rng(7))
    np.testing.assert_array_equal(first, again)


def test_replicates_keep_the_failed_count_fixed() -> None:
    target = SloTarget(tpot_s=0.05)
    tpot = np.random.default_rng(2).uniform(0.005, 0.02, 100)
    assert pass_replicates(window(tpot, failed=1), target, OPTS, np.random.default_rng(0)).all()
    assert not pass_replicates(window(tpot, failed=2), target, OPTS, np.random.default_rng(0)).any()


@pytest.mark.parametrize("n", [0, 1, 30])
def test_degenerate_windows_repeat_the_observed_answer(n: int) -> None:
    sample = window(np.full(n, 0.01), ttft=np.full(n, 0.1))
    target = SloTarget(tpot_s=0.05, min_goodput=0.0)
    replicates = pass_replicates(sample, target, OPTS, np.random.default_rng(0))
    assert len(replicates) == OPTS.resamples
    assert (replicates == window_passes(sample, target)).all()
    assert replicates.all() == (n > 0)


# ---- boundary ------------------------------------------------------------------------------


def probes(rates: list[float], limit: float, noisy: dict[float, float] | None = None) -> list[Probe]:
    """Probes of a server that meets the SLO iff rate <= limit; ``noisy`` gives some probes a
    share of passing replicates instead of a unanimous one."""
    rng = np.random.default_rng(0)
    out = []
    for rate in rates:
        share = (noisy or {}).get(rate)
        replicates = rng.random(OPTS.resamples) < share if share is not None else np.full(OPTS.resamples, rate <= limit)
        out.append(Probe(rate, rate <= limit, replicates))
    return out


def test_unanimous_replicates_give_the_bracket_as_interval() -> None:
    found = boundary(probes([1.0, 2.0, 4.0, 2.83, 3.36, 3.08], 3.1), OPTS)
    assert found.estimate == 3.08 and found.low == 3.08 and found.high == 3.36
    assert found.probes == 6
    assert found.text == "3.08 req/s [3.08, 3.36]"


def test_a_noisy_call_at_the_boundary_widens_the_interval_to_the_next_lower_probe() -> None:
    rates = [1.0, 2.0, 2.8, 3.4]
    clean = boundary(probes(rates, 3.0), OPTS)
    noisy = boundary(probes(rates, 3.0, noisy={2.8: 0.7}), OPTS)
    assert (clean.low, clean.high) == (2.8, 3.4)
    assert noisy.estimate == 2.8 and noisy.low == 2.0 and noisy.high == 3.4
    assert set(np.unique(noisy.high_replicates)) == {2.8, 3.4}


def test_the_boundary_stops_at_the_first_fail_even_if_a_higher_probe_passes() -> None:
    found = boundary([Probe(4.0, True, np.ones(500, bool)), *probes([1.0, 2.0], 1.0)], OPTS)
    assert found.estimate == 1.0 and found.high == 2.0


def test_a_failing_lowest_probe_has_no_estimate() -> None:
    found = boundary(probes([1.0, 0.5, 0.25, 0.125, 0.1], 0.05), OPTS)
    assert found.estimate is None
    assert found.text == "cannot meet the SLO at 0.1 req/s"
    assert (found.low_replicates == 0.0).all()


def test_nothing_failing_gives_an_open_interval() -> None:
    found = boundary(probes([1.0, 2.0, 4.0, 8.0], math.inf), OPTS)
    assert found.estimate == 8.0 and found.high == math.inf
    assert found.text.startswith("at least 8.00 req/s")


# ---- capacity_ratio ----------------------------------------------------------------------


def test_capacity_ratio_of_twice_the_boundary() -> None:
    base = boundary(probes([1.0, 2.0, 2.2, 4.0], 2.0), OPTS)
    spec = boundary(probes([2.0, 4.0, 4.4, 8.0], 4.0), OPTS)
    ratio = capacity_ratio(base, spec, OPTS)
    assert ratio.estimate == pytest.approx(2.0)
    assert ratio.low is not None and ratio.high is not None and ratio.low <= 2.0 <= ratio.high
    assert ratio.low == pytest.approx(4.0 / 2.2) and ratio.high == pytest.approx(4.4 / 2.0)
    assert ratio.text == "2.00x [1.82, 2.20]"


def test_capacity_ratio_without_a_boundary_or_with_an_open_one() -> None:
    base = boundary(probes([1.0, 2.0, 2.2, 4.0], 2.0), OPTS)
    none = capacity_ratio(base, boundary(probes([0.1], 0.0), OPTS), OPTS)
    assert none.estimate is None and none.text.startswith("no interval")
    open_spec = capacity_ratio(base, boundary(probes([1.0, 2.0, 4.0, 8.0], math.inf), OPTS), OPTS)
    assert open_spec.estimate == pytest.approx(4.0) and open_spec.high == math.inf
    assert "lower bound" in open_spec.text
