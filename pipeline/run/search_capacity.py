"""``search=capacity``, on the worker: probe request rates on one running server.

Each probe is a measured window (a point and a child run of its own) at one rate. Whether it
met the SLO decides the next rate: double while every probe passes, halve while every probe
fails, then bisect between the highest pass and the lowest fail until the bracket is within
``capacity.resolution`` or ``capacity.max_probes`` windows ran (:mod:`pipeline.analysis.capacity`).
The server is not restarted between probes, so its start-up is paid once per configuration.
The boundary's interval is computed afterwards from the probes' requests, by the report.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from pipeline.analysis.capacity import SearchSettings, next_rate, window_passes
from pipeline.analysis.samples import Sample
from pipeline.config import ConfigError, JobConfig
from pipeline.identity import point_hash
from pipeline.load.slo import SloTarget
from pipeline.run.plan import Point


def search_settings(job: JobConfig) -> SearchSettings:
    c = job.capacity
    return SearchSettings(c.start_rate, c.min_rate, c.resolution, c.max_probes)


def at_rate(seed: Point, rate: float) -> Point:
    """The seed point's server and workload at another request rate: a point of its own."""
    job = dataclasses.replace(seed.job, load=dataclasses.replace(seed.job.load, request_rate=rate))
    base = point_hash(job.baseline()) if seed.role == "speculative" else None
    return Point(seed.role, job, point_hash(job), base)


def _rounded(rate: float) -> float:
    # Three significant digits: readable run names, and far finer than any useful resolution.
    return float(f"{rate:.3g}")


def probe(
    seed: Point,
    open_run: Callable[[Point], Point],
    measure: Callable[[Point, bool], object],
    out_dir: Path,
    log: Callable[[Point, dict[str, float]], None],
) -> list[tuple[float, bool]]:
    """Run the search from ``seed`` (already given a run); returns (rate, passed) per probe.
    A probe that fails to measure (an error, not an SLO miss) ends the search."""
    target, settings = SloTarget.from_config(seed.job.slo), search_settings(seed.job)
    history: list[tuple[float, bool]] = []
    point = seed
    while True:
        outcome = measure(point, not history)
        if getattr(outcome, "error", None) is not None:
            break
        frame = pd.read_csv(out_dir / point.label / "requests.csv")
        passed = window_passes(Sample.from_requests(frame, outcome.metrics["duration"]), target)  # type: ignore[attr-defined]
        history.append((point.job.load.request_rate, passed))
        log(point, {"capacity_probe": float(len(history)), "slo_passed": float(passed)})
        print(
            f"[{point.label}] capacity probe {len(history)}: {target.describe()} "
            f"{'met' if passed else 'missed'} at {point.job.load.request_rate:g} req/s"
        )
        rate = next_rate(history, settings)
        if rate is None or not math.isfinite(rate):
            break
        rate = _rounded(rate)
        if any(abs(rate - r) < 1e-12 for r, _ in history):
            break  # rounding reached a probed rate: the bracket is as fine as it gets
        point = open_run(at_rate(seed, rate))
    return history


def seed_jobs(jobs: Sequence[JobConfig]) -> list[JobConfig]:
    """Each configuration's first probe: the grid's jobs at capacity.start_rate. The search
    picks every later rate itself, so a grid over the rate is refused."""
    rates = sorted({job.load.request_rate for job in jobs})
    if len(rates) > 1:
        raise ConfigError(
            f"search=capacity searches the request rate itself; drop load.request_rate from the grid (got "
            f"{', '.join(f'{r:g}' for r in rates)}) and set capacity.start_rate for the first probe"
        )
    return [dataclasses.replace(j, load=dataclasses.replace(j.load, request_rate=j.capacity.start_rate)) for j in jobs]
