"""Per-point verdicts (helps, neutral, hurts) and the load where speculation stops paying."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

# With one run per point there is no spread to test against: assume the repeat-to-repeat
# spread measured on this 2-core machine (about +-10 % in median-TPOT speedup, issue 2's
# three repeats) and say so. With repeats, the measured spread is used instead.
ASSUMED_NOISE = 0.10
CONFIG = ["engine", "method", "k"]


@dataclass(frozen=True)
class Verdict:
    label: str  # helps | neutral | hurts | unknown
    median: float | None
    low: float | None
    high: float | None
    runs: int
    basis: str  # how the interval was obtained

    @property
    def text(self) -> str:
        if self.median is None:
            return f"unknown ({self.basis})"
        return f"{self.label}: {self.median:.2f}x [{self.low:.2f}, {self.high:.2f}] ({self.basis})"


def verdict(speedups: Sequence[float]) -> Verdict:
    """Helps only if the whole interval is above 1; inside the spread is neutral, never helps."""
    values = [v for v in speedups if v is not None and math.isfinite(v)]
    if not values:
        return Verdict("unknown", None, None, None, 0, "no paired baseline measurement")
    median = statistics.median(values)
    if len(values) == 1:
        low, high = median / (1 + ASSUMED_NOISE), median * (1 + ASSUMED_NOISE)
        basis = f"1 run; +-{ASSUMED_NOISE:.0%} spread assumed"
    else:
        low, high = min(values), max(values)
        basis = f"{len(values)} runs; min-max"
    label = "helps" if low > 1 else "hurts" if high < 1 else "neutral"
    return Verdict(label, median, low, high, len(values), basis)


MEDIANS = (
    "speedup_p99_tpot", "speedup_median_ttft", "output_throughput_ratio", "spec_decode_acceptance_rate",
    "acceptance_length", "acceptance_alpha", "median_tpot_ms", "output_throughput", "median_ttft_ms",
)  # fmt: skip
POINT_COLUMNS = (*CONFIG, "request_rate", "speedup_median_tpot", "low", "high", "runs", "verdict", "basis", *MEDIANS)


def measured(frame: pd.DataFrame, role: str | None = None) -> pd.DataFrame:
    """The points that have measurements: finished now, or resumed from an earlier run."""
    keep = frame["status"].isin(["finished", "resumed"])
    return frame[keep & (frame["role"] == role)] if role else frame[keep]


def point_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (engine, method, k, rate): the verdict over repeats and the key ratios.
    Always has :data:`POINT_COLUMNS`, so an empty table can be filtered like a full one."""
    rows = []
    for key, group in measured(frame, "speculative").groupby([*CONFIG, "request_rate"], sort=True):
        engine, method, k, rate = key
        v = verdict(list(group.get("speedup_median_tpot", pd.Series(dtype=float))))
        rows.append(
            {
                "engine": engine, "method": method, "k": int(k), "request_rate": float(rate),
                "speedup_median_tpot": v.median, "low": v.low, "high": v.high, "runs": v.runs,
                "verdict": v.label, "basis": v.basis, **{col: _median(group, col) for col in MEDIANS},
            }
        )  # fmt: skip
    return pd.DataFrame(rows, columns=list(POINT_COLUMNS))


def _median(group: pd.DataFrame, column: str) -> float | None:
    if column not in group:
        return None
    values = [v for v in group[column] if isinstance(v, (int, float)) and math.isfinite(v)]
    return statistics.median(values) if values else None


@dataclass(frozen=True)
class Crossover:
    engine: str
    method: str
    k: int
    rate: float | None  # where the median-TPOT speedup crosses 1.0, interpolated
    text: str


def crossover(rates: Sequence[float], speedups: Sequence[float | None]) -> tuple[float | None, str]:
    pairs = [(r, s) for r, s in sorted(zip(rates, speedups, strict=True)) if s is not None and math.isfinite(s)]
    if len(pairs) < 2:
        return None, "not computed: needs speedups at two or more request rates"
    if pairs[0][1] < 1:
        return None, f"below 1.0 already at the lowest measured rate ({pairs[0][0]:g} req/s)"
    for (r0, s0), (r1, s1) in zip(pairs, pairs[1:], strict=False):
        if s0 >= 1 > s1:
            if math.isinf(r1):  # "all at once" has no rate to interpolate towards
                return r0, f"crosses 1.0 above {r0:g} req/s, by the all-at-once load"
            rate = r0 + (s0 - 1) * (r1 - r0) / (s0 - s1)
            return rate, f"crosses 1.0 at ~{rate:.2f} req/s (between {r0:g} and {r1:g})"
    return None, f"none within the measured range ({pairs[0][0]:g}-{pairs[-1][0]:g} req/s): speedup stays >= 1"


def crossovers(points: pd.DataFrame) -> list[Crossover]:
    found = []
    if points.empty:
        return found
    for (engine, method, k), group in points.groupby(CONFIG, sort=True):
        rate, text = crossover(list(group["request_rate"]), list(group["speedup_median_tpot"]))
        found.append(Crossover(engine, method, int(k), rate, text))
    return found
