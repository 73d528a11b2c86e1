"""A model of the measurement (Leviathan et al., 2023): alpha from acceptance length and k,
the draft cost ratio c from the low-load speedup, and the speedup predicted for any k."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import pandas as pd

from pipeline.analysis.samples import finite_number
from pipeline.engines.acceptance import alpha_from_length, expected_length


@dataclass(frozen=True)
class LeviathanFit:
    engine: str
    method: str
    rate: float  # the low load the fit uses
    alpha: float
    c: float
    measured: dict[int, float]  # k -> measured median-TPOT speedup at that rate
    predicted: dict[int, float]  # k -> L(alpha, k) / (k c + 1)


def predicted_speedup(alpha: float, c: float, k: int) -> float:
    return expected_length(alpha, k) / (k * c + 1)


def fit_curves(points: pd.DataFrame, max_k: int = 8) -> tuple[list[LeviathanFit], list[str]]:
    """Per curve (engine, method and every other setting but k and rate), at its lowest
    measured rate. Returns fits and what was skipped."""
    fits, skipped = [], []
    if points.empty:
        return fits, ["no speculative point was measured"]
    # One fit per curve: points that differ in workload, draft or options are not pooled.
    curve = ["engine", "method"] + (
        ["setting_key"] if "setting_key" in points and points["setting_key"].notna().all() else []
    )
    for key, group in points.groupby(curve, sort=True):
        engine, method = key[0], key[1]
        low = group[group["request_rate"] == group["request_rate"].min()]
        alphas, costs, measured = [], [], {}
        for row in low.itertuples():
            length, speedup = row.acceptance_length, row.speedup_median_tpot
            if not finite_number(length) or not finite_number(speedup):
                continue
            k_eff = getattr(row, "acceptance_k_effective", None)
            alpha = alpha_from_length(length, k_eff if finite_number(k_eff) else row.k)
            if alpha is None:
                continue
            alphas.append(alpha)
            costs.append(max((length / speedup - 1) / row.k, 0.0))  # S = L / (k c + 1)
            measured[int(row.k)] = speedup
        if not alphas:
            skipped.append(f"{engine} {method}: no acceptance length or speedup at the lowest rate")
            continue
        alpha, c = statistics.median(alphas), statistics.median(costs)
        ks = range(1, max(max_k, max(measured) + 1) + 1)
        fits.append(
            LeviathanFit(
                engine,
                method,
                float(low["request_rate"].iloc[0]),
                alpha,
                c,
                measured,
                {k: predicted_speedup(alpha, c, k) for k in ks},
            )
        )
    return fits, skipped
