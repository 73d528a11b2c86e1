"""The service-level objective: its thresholds, and what a request must do to meet them.

One place for the rule every user of an SLO shares: the window's goodput (``load.metrics``),
the capacity search's pass call and margins (``analysis.capacity``), and the report, which
reads the SLO back from a sweep's parent run. As in vLLM's goodput
(``vllm/benchmarks/serve.py``), a finished request with one output token has no decode phase:
its TPOT counts as 0, so it meets any TPOT limit instead of failing it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from pipeline.config import SloConfig

METRICS = ("ttft", "tpot", "e2el")


@dataclass(frozen=True)
class SloTarget:
    ttft_s: float | None = None  # thresholds in seconds; None = not part of the SLO
    tpot_s: float | None = None
    e2el_s: float | None = None
    percentile: float = 99.0  # the SLO percentile: e.g. p99 TPOT <= tpot_s
    min_goodput: float = 0.99  # share of all sent requests (failed ones count as not good) meeting every threshold

    def __post_init__(self) -> None:
        for name, value in self.thresholds().items():
            if not value > 0:
                raise ValueError(f"SLO {name}_s={value} must be > 0 seconds or None")
        if not 0 < self.percentile <= 100:
            raise ValueError(f"slo.percentile={self.percentile} must lie in (0, 100], e.g. 99 for p99")
        if not 0 <= self.min_goodput <= 1:
            raise ValueError(f"slo.min_goodput={self.min_goodput} must lie in [0, 1], e.g. 0.99")

    @classmethod
    def from_config(cls, slo: SloConfig) -> SloTarget:
        seconds = [None if v is None else v / 1000.0 for v in (slo.ttft_ms, slo.tpot_ms, slo.e2el_ms)]
        return cls(*seconds, percentile=slo.percentile, min_goodput=slo.min_goodput)

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> SloTarget | None:
        """The SLO a sweep ran under, from its parent run's params (None: no threshold set)."""

        def number(key: str) -> float | None:
            value = params.get(f"slo.{key}")
            return None if value in (None, "None", "null", "") else float(value)  # type: ignore[arg-type]

        seconds = [None if (v := number(f"{m}_ms")) is None else v / 1000 for m in METRICS]
        if all(v is None for v in seconds):
            return None
        return cls(*seconds, percentile=number("percentile") or 99.0, min_goodput=number("min_goodput") or 0.99)

    def thresholds(self) -> dict[str, float]:
        """The set thresholds by metric name (ttft, tpot, e2el), in seconds."""
        limits = {"ttft": self.ttft_s, "tpot": self.tpot_s, "e2el": self.e2el_s}
        return {name: value for name, value in limits.items() if value is not None}

    @property
    def active(self) -> bool:
        return bool(self.thresholds())

    def describe(self) -> str:
        parts = [f"p{self.percentile:g} {m.upper()} <= {t * 1000:g} ms" for m, t in self.thresholds().items()]
        return ", ".join([*parts, f"goodput >= {self.min_goodput * 100:g}%"])


def checked_values(name: str, values: np.ndarray) -> np.ndarray:
    """A metric's per-request values of successful requests as the SLO checks them: an
    undefined TPOT (one output token) is 0; an undefined TTFT or E2EL stays undefined (not good)."""
    return np.where(np.isnan(values), 0.0, values) if name == "tpot" else values


def good(values: Mapping[str, np.ndarray], size: int, target: SloTarget) -> np.ndarray:
    """Which of ``size`` successful requests meet every threshold."""
    met = np.ones(size, dtype=bool)
    for name, limit in target.thresholds().items():
        if name not in values:
            raise ValueError(f"the window has no per-request {name} values to check slo.{name} against")
        met &= checked_values(name, np.asarray(values[name], dtype=float)) <= limit
    return met
