"""Sustained steps in a point's nightly series: where one began, so that the nights after it never
enter the history reference (a persistent slowdown is otherwise absorbed into the median of the
last nights within three of them, and never caught).

The detection is ruptures' PELT (Killick et al., 2012) with the least-squares cost on the log of
the series, its penalty scaled to the series' own noise: sigma squared from the median absolute
first difference (robust to the step itself), times ``PENALTY`` times log n. ``PENALTY`` is
calibrated by simulation (``benchmarks/gate_power.py``): a flat series of 30 nights shows a
spurious step in at most about 5 % of series. Apache Otava's E-Divisive and MongoDB's
signal-processing-algorithms were the first choices; both pin numpy and scipy below the
versions vLLM's CPU build installs here (numpy 2.2 and < 2 against 2.3), so ruptures, which
pins neither, does the search.

Pure computation; no MLflow, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PENALTY = 4.0  # x sigma^2 x log(n); calibrated in benchmarks/gate_power.py
MIN_NIGHTS = 6  # fewer and a step cannot be told from a bad night
MIN_SEGMENT = 2  # a step is sustained: at least two nights on its far side


@dataclass(frozen=True)
class Step:
    night: int  # index in the series of the first night after the step
    before: float  # the segments' medians, in the series' own units
    after: float

    @property
    def change(self) -> float:
        return self.after / self.before - 1 if self.before else math.nan


def noise_sd(log_values: np.ndarray) -> float:
    """The series' night-to-night noise on the log scale: the median absolute first difference,
    scaled to a normal sd (1.4826 / sqrt 2), which a step moves by one difference only."""
    diffs = np.abs(np.diff(log_values))
    return float(1.4826 * np.median(diffs) / math.sqrt(2)) if len(diffs) else math.nan


def steps(series: Sequence[float], penalty: float = PENALTY) -> list[Step]:
    """Every sustained step in a nightly series (oldest first), each with the night it began."""
    import ruptures

    # Nights without a value are skipped; a step's night is still its index in ``series``.
    kept = [i for i, v in enumerate(series) if math.isfinite(v) and v > 0]
    values = np.asarray([series[i] for i in kept], dtype=float)
    if len(values) < MIN_NIGHTS:
        return []
    logs = np.log(values)
    sd = noise_sd(logs)
    if not sd > 0:
        return []
    ends = (
        ruptures.Pelt(model="l2", min_size=MIN_SEGMENT, jump=1)
        .fit(logs)
        .predict(pen=penalty * sd**2 * math.log(len(logs)))
    )
    bounds = [0, *ends]
    found = []
    for start, cut, end in zip(bounds, bounds[1:], bounds[2:], strict=False):
        found.append(Step(kept[cut], float(np.median(values[start:cut])), float(np.median(values[cut:end]))))
    return found


def last_step(series: Sequence[float], penalty: float = PENALTY) -> Step | None:
    found = steps(series, penalty)
    return found[-1] if found else None
