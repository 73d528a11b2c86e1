from __future__ import annotations

import numpy as np
import pytest

from pipeline.loadgen import arrival_offsets


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 4.0])
def test_gamma_arrivals_have_the_requested_rate_and_shape(burstiness: float) -> None:
    offsets = arrival_offsets(20001, rate=4.0, burstiness=burstiness, rng=np.random.default_rng(0))
    gaps = np.diff(offsets)
    assert offsets[0] == 0.0 and np.all(gaps >= 0)
    assert 1 / gaps.mean() == pytest.approx(4.0, rel=0.03)
    # Gamma with shape b has coefficient of variation 1/sqrt(b); Poisson (b=1) has 1.
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.05)


def test_same_seed_same_schedule() -> None:
    a = arrival_offsets(50, 2.0, 1.0, np.random.default_rng(3))
    b = arrival_offsets(50, 2.0, 1.0, np.random.default_rng(3))
    c = arrival_offsets(50, 2.0, 1.0, np.random.default_rng(4))
    assert a == b and a != c


def test_infinite_rate_sends_everything_at_once() -> None:
    assert arrival_offsets(5, float("inf"), 1.0, np.random.default_rng(0)) == [0.0] * 5
    assert arrival_offsets(1, 3.0, 1.0, np.random.default_rng(0)) == [0.0]
