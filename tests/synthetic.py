"""A synthetic engine with a known answer: its TPOT at each k and rate, and windows drawn from it,
for the predictor's tests and the driver's whole-sweep tests."""

from __future__ import annotations

import numpy as np

from pipeline.analysis.samples import Sample
from pipeline.run.outcomes import PointOutcome
from pipeline.run.plan import SweepPlan

PROFILE = (0.8, 0.6, 0.45, 0.3)  # unconditional per-position acceptance at k_max = 4


def true_tpot(k: int, rate: float) -> float:
    step = 0.040 * (1 + 0.1 * rate) + 0.004 * k  # linear in the verified tokens
    return step / (1 + sum(PROFILE[:k]))


def window(tpot: float, length: float, seed: int, n: int = 40) -> Sample:
    rng = np.random.default_rng(seed)
    values = tpot * np.exp(rng.normal(0, 0.05, n))
    tokens = np.full(n, 65.0)
    steps = np.round(64 / length) * np.ones(n)
    return Sample(
        index=np.arange(n),
        values={"tpot": values, "ttft": values * 3, "e2el": values * 64},
        itl=tuple(np.full(3, v) for v in values),
        output_tokens=tokens,
        chunks=steps + 1,
        duration_s=10.0,
    )


def measured_outcomes(plan: SweepPlan, ks: set[int]) -> tuple[dict[str, PointOutcome], dict[str, Sample]]:
    outcomes, samples = {}, {}
    for i, p in enumerate(plan.points):
        k, rate = p.job.spec.k, p.job.load.request_rate
        if k and k not in ks:
            continue
        length = 1 + sum(PROFILE[:k])
        metrics = {"duration": 10.0, "acceptance_length": length} if k else {"duration": 10.0}
        if k == 4:
            metrics |= {f"spec_decode_acceptance_rate_pos_{j}": v for j, v in enumerate(PROFILE)}
        run = f"run{i}"
        outcomes[p.hash] = PointOutcome(p.hash, run, metrics)
        samples[run] = window(true_tpot(k, rate), length, seed=i)
    return outcomes, samples
