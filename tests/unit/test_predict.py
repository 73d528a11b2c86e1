"""search=predict's model on a synthetic engine with known answers, and the choice of what to confirm."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.analysis.kcurve import (
    WITHIN_WINDOW_NOTE,
    Estimate,
    KWindow,
    RateInputs,
    choose,
    correction,
    extrapolate,
    predicted_length,
    step_cost,
    to_confirm,
)
from pipeline.analysis.samples import StatsOptions

OPTS = StatsOptions(resamples=500)
B = OPTS.resamples

# The synthetic engine: a chain drafter's unconditional acceptance per position, and a step whose
# cost is linear in the number of verified tokens.
TRUE_P = (0.8, 0.6, 0.45, 0.3, 0.2)
K_MAX = len(TRUE_P)
STEP_BASE, STEP_PER_TOKEN = 0.020, 0.004


def true_length(k: int) -> float:
    return 1.0 + sum(TRUE_P[:k])


def true_tpot(k: int) -> float:
    return (STEP_BASE + STEP_PER_TOKEN * k) / true_length(k)


def window(rng: np.random.Generator, k: int, tpot_s: float, length: float = 1.0, noise: float = 0.01) -> KWindow:
    """Exact observed values; noise only in the replicates, around the logs."""
    reps = rng.normal(math.log(tpot_s), noise, B)
    length_reps = rng.normal(math.log(length), noise, B) if k else None
    return KWindow(k, tpot_s, reps, length, length_reps)


def engine(seed: int = 0, anchors: tuple[KWindow, ...] = ()) -> RateInputs:
    rng = np.random.default_rng(seed)
    base = window(rng, 0, true_tpot(0))
    top = window(rng, K_MAX, true_tpot(K_MAX), true_length(K_MAX))
    return RateInputs(1.0, base, top, TRUE_P, anchors)


def test_predicted_length_sums_the_profile() -> None:
    p = (0.8, 0.6, 0.4, 0.2)
    assert predicted_length(p, 0) == 1.0
    assert predicted_length(p, 1) == pytest.approx(1.8)
    assert predicted_length(p, 2) == pytest.approx(2.4)
    assert predicted_length(p, 4) == pytest.approx(3.0)
    assert predicted_length(p, 2, correction=1.5) == pytest.approx(3.1)
    with pytest.raises(ValueError):
        predicted_length(p, 5)


def test_step_cost_is_piecewise_linear() -> None:
    two = [(0.0, 1.0), (4.0, 3.0)]
    assert step_cost(0, two) == 1.0
    assert step_cost(4, two) == 3.0
    assert step_cost(2, two) == pytest.approx(2.0)
    assert step_cost(1, two) == pytest.approx(1.5)
    anchored = [(4.0, 3.0), (0.0, 1.0), (1.0, 2.0)]  # unsorted on purpose
    assert step_cost(1, anchored) == pytest.approx(2.0)
    assert step_cost(0.5, anchored) == pytest.approx(1.5)
    assert step_cost(2.5, anchored) == pytest.approx(2.5)
    with pytest.raises(ValueError):
        step_cost(5, two)


def test_predict_recovers_the_synthetic_engine() -> None:
    inputs = engine()
    for k in range(1, K_MAX):
        got = extrapolate(inputs, k, OPTS)
        assert got.length == pytest.approx(true_length(k), abs=1e-9)
        assert got.tpot_s == pytest.approx(true_tpot(k), abs=1e-9)
        assert got.speedup == pytest.approx(true_tpot(0) / true_tpot(k), abs=1e-9)
        assert got.length_low < true_length(k) < got.length_high
        assert got.tpot_low_s < true_tpot(k) < got.tpot_high_s
        assert got.speedup_low < true_tpot(0) / true_tpot(k) < got.speedup_high
        assert not got.anchored
    # The best k of this engine is interior: a test that the model's shape, not just its ends, is right.
    assert min(range(1, K_MAX + 1), key=true_tpot) not in (1, K_MAX)


def test_predict_at_k_max_reproduces_the_measurement() -> None:
    inputs = engine()
    got = extrapolate(inputs, K_MAX, OPTS)
    assert got.tpot_s == pytest.approx(inputs.top.tpot_s, rel=1e-12)
    assert got.length == pytest.approx(inputs.top.length, rel=1e-12)
    # The interval is the measured window's own (L enters and leaves TPOT again).
    low, high = np.quantile(np.exp(inputs.top.tpot_log_reps), [OPTS.alpha / 2, 1 - OPTS.alpha / 2])
    assert (got.tpot_low_s, got.tpot_high_s) == pytest.approx((low, high), rel=1e-9)


def test_a_profile_that_disagrees_with_the_counters_is_scaled_to_them() -> None:
    inputs = engine()
    scaled = RateInputs(1.0, inputs.base, inputs.top, tuple(0.9 * p for p in TRUE_P))
    assert extrapolate(scaled, K_MAX, OPTS).length == pytest.approx(true_length(K_MAX), rel=1e-12)
    assert extrapolate(scaled, 2, OPTS).length == pytest.approx(true_length(2), rel=1e-12)


def test_an_anchor_corrects_acceptance_and_step_cost() -> None:
    rng = np.random.default_rng(1)
    raw = true_length(2)
    anchor = window(rng, 2, 0.0105, raw + 0.1)  # a small k accepts more than k_max's first positions
    inputs = engine(anchors=(anchor,))
    c2 = correction(2, inputs)
    assert c2 == pytest.approx((raw + 0.1 - 1) / sum(TRUE_P[:2]))
    assert c2 > 1
    assert correction(K_MAX, inputs) == pytest.approx(1.0)
    assert correction(1, inputs) == pytest.approx(c2)  # flat below the lowest anchor
    assert 1.0 < correction(3, inputs) < c2
    assert correction(3, inputs) == pytest.approx(c2 + (1 - c2) / 3)
    at_anchor = extrapolate(inputs, 2, OPTS)
    assert at_anchor.length == pytest.approx(anchor.length, rel=1e-12)
    assert at_anchor.tpot_s == pytest.approx(anchor.tpot_s, rel=1e-12)
    assert at_anchor.anchored
    assert extrapolate(inputs, 1, OPTS).length == pytest.approx(1 + c2 * TRUE_P[0])
    # k=3 lies between the anchor and k_max: its step cost comes from those two knots.
    step3 = step_cost(3, [(2, anchor.tpot_s * anchor.length), (K_MAX, true_tpot(K_MAX) * true_length(K_MAX))])
    three = extrapolate(inputs, 3, OPTS)
    assert three.tpot_s == pytest.approx(step3 / three.length)
    assert three.anchored
    assert not extrapolate(engine(), 3, OPTS).anchored


def test_server_spread_widens_the_interval() -> None:
    inputs = engine()
    within = extrapolate(inputs, 2, OPTS)
    across = extrapolate(inputs, 2, OPTS, server_sd=0.05, server_df=8)
    assert within.note == WITHIN_WINDOW_NOTE
    assert within.note.startswith("within-window noise only")
    assert across.note == ""
    assert across.tpot_high_s - across.tpot_low_s > 2 * (within.tpot_high_s - within.tpot_low_s)
    assert across.speedup_high - across.speedup_low > 2 * (within.speedup_high - within.speedup_low)
    assert across.tpot_s == within.tpot_s  # the spread widens, it does not move the estimate
    assert extrapolate(inputs, 2, OPTS, server_sd=0.05, server_df=8) == across  # seeded
    with pytest.raises(ValueError):
        extrapolate(inputs, 2, OPTS, server_sd=0.05)  # no degrees of freedom


def test_choose_keeps_every_overlapping_interval() -> None:
    estimates = [
        Estimate(1, 0.012, 0.011, 0.013, measured=False),
        Estimate(2, 0.010, 0.009, 0.0110, measured=False),
        Estimate(3, 0.0105, 0.0100, 0.0112, measured=False),
        Estimate(5, 0.0115, 0.0112, 0.0118, measured=True),
    ]
    choice = choose(2.0, estimates)
    assert choice.best.k == 2
    assert [e.k for e in choice.candidates] == [2, 3, 1]
    with pytest.raises(ValueError):
        choose(2.0, [*estimates, Estimate(2, 0.01, 0.01, 0.01, measured=True)])


def test_to_confirm_ranks_unmeasured_candidates_and_caps_them() -> None:
    def est(k: int, tpot: float, half: float = 0.0005, measured: bool = False) -> Estimate:
        return Estimate(k, tpot, tpot - half, tpot + half, measured)

    choices = [
        choose(1.0, [est(2, 0.010), est(3, 0.0102), est(5, 0.0101, measured=True)]),
        choose(2.0, [est(2, 0.012), est(3, 0.0125), est(4, 0.0122)]),
        choose(4.0, [est(3, 0.015), est(4, 0.0152), est(2, 0.020)]),
    ]
    chosen, left_out = to_confirm(choices, cap=2)
    assert list(chosen) == [2, 3]  # best twice, then best once and a candidate at every rate
    assert chosen == {2: (1.0, 2.0), 3: (1.0, 2.0, 4.0)}
    assert left_out == (4,)  # a candidate twice, never the best
    assert 5 not in chosen and 5 not in left_out  # measured: nothing to confirm
    everything, none_left = to_confirm(choices, cap=10)
    assert set(everything) == {2, 3, 4} and none_left == ()
    assert to_confirm(choices, cap=0) == ({}, (2, 3, 4))


def test_check_model_confirms_the_best_prediction_where_a_measured_k_won_outright() -> None:
    told_apart = [
        Estimate(3, 0.010, 0.0098, 0.0102, measured=True),
        Estimate(1, 0.015, 0.0148, 0.0152, False),
        Estimate(2, 0.012, 0.0118, 0.0122, False),
    ]
    choice = choose(2.0, told_apart)
    assert [e.k for e in choice.candidates] == [3] and choice.best_predicted and choice.best_predicted.k == 2
    assert to_confirm([choice], cap=1) == ({}, ())  # the choice needs no measurement
    assert to_confirm([choice], cap=1, check_model=True) == ({2: (2.0,)}, ())
    assert to_confirm([choice], cap=0, check_model=True) == ({}, (2,))  # the cap still holds
    overlapping = choose(2.0, [*told_apart[:2], Estimate(2, 0.0101, 0.0099, 0.0103, False)])
    assert to_confirm([overlapping], cap=1, check_model=True) == to_confirm([overlapping], cap=1)


def test_rate_inputs_name_their_problem() -> None:
    rng = np.random.default_rng(2)
    base = window(rng, 0, 0.02)
    top = window(rng, 3, 0.01, 2.0)
    with pytest.raises(ValueError, match="per-position"):
        RateInputs(1.0, base, top, (0.5, 0.3))
    with pytest.raises(ValueError, match="k_max window has k=0"):
        RateInputs(1.0, base, window(rng, 0, 0.01), (0.5,))
    short = KWindow(3, 0.01, np.zeros(B - 1), 2.0, np.zeros(B - 1))
    with pytest.raises(ValueError, match="one length"):
        RateInputs(1.0, base, short, (0.5, 0.3, 0.2))
    with pytest.raises(ValueError, match="anchors"):
        RateInputs(1.0, base, top, (0.5, 0.3, 0.2), (window(rng, 3, 0.01, 2.0),))
    with pytest.raises(ValueError, match="replicates of log L"):
        RateInputs(1.0, base, KWindow(3, 0.01, np.zeros(B), 2.0), (0.5, 0.3, 0.2))
    RateInputs(1.0, base, top, (0.5, 0.3, 0.2, 0.1))  # a longer profile is fine: k_max's positions are used
