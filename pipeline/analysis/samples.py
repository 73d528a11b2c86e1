"""One window's per-request samples, the options every interval is computed with, and the spread between identical servers."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from pipeline.config import stats_problem


def finite_number(value: object) -> bool:
    """An int or a float (NumPy's float64 is one) that is neither NaN nor infinite: a table
    cell or a recorded value worth showing or computing with."""
    return isinstance(value, (int, float)) and math.isfinite(value)


class StatsError(ValueError):
    pass


@dataclass(frozen=True)
class ServerSpread:
    """How far two fresh, identical servers differ: the root mean square of the log ratios
    of an A/A sweep's comparisons, per ratio. A comparison whose two windows ran on one pair
    of servers cannot see this spread in its own requests; it is added to its interval."""

    sd: dict[str, float]  # ratio name -> RMS of the A/A log ratios
    comparisons: int  # how many A/A comparisons it rests on (the t distribution's df)
    source: str  # which sweep measured it

    def for_metric(self, metric: str) -> float | None:
        value = self.sd.get(metric)
        return value if value is not None and math.isfinite(value) and value > 0 else None


@dataclass(frozen=True)
class StatsOptions:
    confidence: float = 0.95  # two-sided level of every interval
    floor: float = 0.02  # a ratio within 1 +- floor is no practical effect
    resamples: int = 2000  # bootstrap replicates per interval
    min_requests: int = 5  # fewer paired requests than this: "not enough requests"
    seed: int = 0  # the bootstrap's own seed: a report is reproducible
    server_spread: ServerSpread | None = None  # from an A/A sweep; see paired_ratio

    def __post_init__(self) -> None:
        problem = stats_problem(self.confidence, self.floor, self.resamples)
        if problem:
            raise StatsError(problem)
        if self.min_requests < 2:
            raise StatsError(f"stats.min_requests={self.min_requests} must be >= 2")

    @property
    def alpha(self) -> float:
        return 1.0 - self.confidence


@dataclass(frozen=True, eq=False)
class Sample:
    """A window's successful requests, keyed by prompt index (what pairs two windows)."""

    index: np.ndarray  # prompt index of each request
    values: dict[str, np.ndarray]  # per-request seconds: ttft, tpot, e2el (NaN where undefined)
    itl: tuple[np.ndarray, ...]  # each request's gaps between token-bearing chunks
    output_tokens: np.ndarray
    chunks: np.ndarray  # token-bearing chunks per request: one per engine step when streamed
    duration_s: float
    failed: int = 0
    scheduled_end_s: float = math.nan  # when the window's last request was due
    # Prompt index of each failed request: a failure is a latency of +inf (censored), not a
    # request that silently drops out of a paired comparison.
    failed_index: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=int))
    # Each successful request's scheduled send time (seconds into the window), where recorded;
    # and each failed one's: the schedule is the prompts', whichever request failed.
    scheduled: np.ndarray = field(default_factory=lambda: np.empty(0))
    failed_scheduled: np.ndarray = field(default_factory=lambda: np.empty(0))
    # Each successful request's workload category, and each failed one's, where recorded.
    category: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object))
    failed_category: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object))
    # Each request's turn in a trace's conversation (0: a request of its own), where recorded.
    turn: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=int))
    failed_turn: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=int))

    @property
    def categories(self) -> list[str]:
        return sorted({str(c) for c in (*self.category, *self.failed_category)})

    def with_index(self, prompts: np.ndarray) -> Sample:
        """The window's requests of these prompt indices, failed ones included: the same window,
        fewer requests (its duration and schedule stay the window's, so throughput and keeping up
        are not per group)."""
        failed = np.isin(self.failed_index, prompts) if len(self.failed_index) == self.failed else np.zeros(0, bool)
        return self._keep(np.isin(self.index, prompts), failed)

    def _keep(self, keep: np.ndarray, failed: np.ndarray) -> Sample:
        rows = np.flatnonzero(keep)
        return dataclasses.replace(
            self,
            index=self.index[keep],
            values={k: v[keep] for k, v in self.values.items()},
            itl=tuple(self.itl[i] for i in rows),
            output_tokens=self.output_tokens[keep],
            chunks=self.chunks[keep],
            failed=int(failed.sum()),
            failed_index=self.failed_index[failed] if len(self.failed_index) == len(failed) else self.failed_index,
            scheduled=self.scheduled[keep] if len(self.scheduled) == len(keep) else self.scheduled,
            failed_scheduled=self.failed_scheduled[failed]
            if len(self.failed_scheduled) == len(failed)
            else self.failed_scheduled,
            category=self.category[keep] if len(self.category) == len(keep) else self.category,
            failed_category=self.failed_category[failed]
            if len(self.failed_category) == len(failed)
            else self.failed_category,
            turn=self.turn[keep] if len(self.turn) == len(keep) else self.turn,
            failed_turn=self.failed_turn[failed] if len(self.failed_turn) == len(failed) else self.failed_turn,
        )

    @property
    def size(self) -> int:
        return len(self.index)

    @property
    def throughput(self) -> float:
        return float(self.output_tokens.sum()) / self.duration_s if self.duration_s > 0 else math.nan

    @staticmethod
    def from_requests(frame: pd.DataFrame, duration_s: float) -> Sample:
        """From a window's ``requests.csv`` (one row per request, as the client recorded it)."""
        import json

        ok = frame[frame["error"].isna()] if "error" in frame else frame
        chunk_lists = [json.loads(c) if isinstance(c, str) else [] for c in ok.get("chunk_s", [])]
        return Sample(
            index=ok["index"].to_numpy(dtype=int),
            values={name: ok[f"{name}_s"].to_numpy(dtype=float) for name in ("ttft", "tpot", "e2el")},
            itl=tuple(np.diff(np.asarray(c, dtype=float)) for c in chunk_lists),
            output_tokens=ok["output_tokens"].fillna(0).to_numpy(dtype=float),
            chunks=ok["num_chunks"].to_numpy(dtype=float) if "num_chunks" in ok else np.zeros(len(ok)),
            duration_s=float(duration_s),
            failed=len(frame) - len(ok),
            scheduled_end_s=float(frame["scheduled_s"].max()) if "scheduled_s" in frame and len(frame) else math.nan,
            failed_index=frame.loc[frame["error"].notna(), "index"].to_numpy(dtype=int)
            if "error" in frame
            else np.empty(0, dtype=int),
            scheduled=ok["scheduled_s"].to_numpy(dtype=float) if "scheduled_s" in ok else np.empty(0),
            failed_scheduled=frame.loc[frame["error"].notna(), "scheduled_s"].to_numpy(dtype=float)
            if "error" in frame and "scheduled_s" in frame
            else np.empty(0),
            category=ok["category"].astype(str).to_numpy(dtype=object) if "category" in ok else np.empty(0, object),
            failed_category=frame.loc[frame["error"].notna(), "category"].astype(str).to_numpy(dtype=object)
            if "error" in frame and "category" in frame
            else np.empty(0, dtype=object),
            turn=ok["turn"].fillna(0).to_numpy(dtype=int) if "turn" in ok else np.empty(0, dtype=int),
            failed_turn=frame.loc[frame["error"].notna(), "turn"].fillna(0).to_numpy(dtype=int)
            if "error" in frame and "turn" in frame
            else np.empty(0, dtype=int),
        )


def server_spread(log_ratios: dict[str, Sequence[float]], source: str) -> ServerSpread | None:
    """From an A/A sweep's comparisons (each a pair of fresh, identical servers): the RMS of
    their log ratios, per ratio. Within-window noise is in it too, so it errs wide."""
    sd = {m: float(np.sqrt(np.mean(np.square(v)))) for m, v in log_ratios.items() if len(v) >= 2}
    counts = [len(v) for v in log_ratios.values() if len(v) >= 2]
    return ServerSpread(sd, min(counts), source) if sd else None
