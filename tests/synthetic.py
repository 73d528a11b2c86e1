"""A synthetic engine with a known answer: its TPOT at each k and rate, and windows drawn from it,
for the predictor's tests and the driver's whole-sweep tests; and a continuous-batching server
whose capacity is known, for the validity checks' tests and their calibration
(benchmarks/validity.py --simulate)."""

from __future__ import annotations

import numpy as np

from pipeline.analysis.samples import Sample
from pipeline.load.client import RequestRecord
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


def batching_server(
    sends: np.ndarray, tokens: int, per_request: float, capacity: float, dt: float = 0.005
) -> list[RequestRecord]:
    """A continuous-batching server, simulated in ``dt`` steps: every request in flight streams
    at ``per_request`` tokens/s until the batch would need more than ``capacity`` tokens/s,
    which they then share (stable while rate x tokens < capacity). Each token is one chunk, at
    the step it completes."""
    done = np.zeros(len(sends))
    chunks: list[list[float]] = [[] for _ in sends]
    t = 0.0
    while (done < tokens).any():
        active = np.flatnonzero((sends <= t) & (done < tokens))
        if len(active):
            rate = min(per_request, capacity / len(active))
            before = np.floor(done[active])
            done[active] = np.minimum(done[active] + rate * dt, tokens)
            for i in active[np.floor(done[active]) > before]:
                chunks[i].append(t + dt)
        t += dt
    return [
        RequestRecord(
            index=i, category="c", scheduled_s=float(s), sent_s=float(s), chunk_s=tuple(c), output_tokens=tokens
        )
        for i, (s, c) in enumerate(zip(sends, chunks, strict=True))
    ]
