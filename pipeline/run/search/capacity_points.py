"""``search=capacity``: its seed points, and the probes' points and rates.

Each probe is a measured window (a point and a child run of its own) at one rate. Whether it
met the SLO decides the next rate: double while every probe passes, halve while every probe
fails, then bisect between the highest pass and the lowest fail until the bracket is within
``capacity.resolution`` or ``capacity.max_probes`` windows ran (:mod:`pipeline.analysis.capacity`).
The server is not restarted between probes, so its start-up is paid once per configuration.
The walk itself is the worker's load profile, :class:`pipeline.run.search.profiles.Bracketing`.
The boundary's interval is computed afterwards from the probes' requests, by the report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pipeline.config import CapacityConfig, ConfigError, JobConfig, SweepSettings
from pipeline.identity import point_hash
from pipeline.run.plan import Point

if TYPE_CHECKING:
    from pipeline.analysis.capacity import SearchSettings


def search_settings(c: CapacityConfig) -> SearchSettings:
    from pipeline.analysis.capacity import SearchSettings  # scipy: only where capacity runs

    return SearchSettings(c.start_rate, c.min_rate, c.resolution, c.max_probes)


def at_rate(seed: Point, rate: float) -> Point:
    """The seed point's server and workload at another request rate: a point of its own."""
    job = dataclasses.replace(seed.job, load=dataclasses.replace(seed.job.load, request_rate=rate))
    base = point_hash(job.baseline()) if seed.role == "speculative" else None
    return Point(seed.role, job, point_hash(job), base)


def rounded(rate: float) -> float:
    # Three significant digits: readable run names, and far finer than any useful resolution.
    return float(f"{rate:.3g}")


def seed_jobs(jobs: Sequence[JobConfig], settings: SweepSettings) -> list[JobConfig]:
    """Each configuration's first probe: the grid's jobs at capacity.start_rate. The search
    picks every later rate itself, so a grid over the rate is refused."""
    rates = sorted({job.load.request_rate for job in jobs})
    if len(rates) > 1:
        raise ConfigError(
            f"search=capacity searches the request rate itself; drop load.request_rate from the grid (got "
            f"{', '.join(f'{r:g}' for r in rates)}) and set capacity.start_rate for the first probe"
        )
    start = settings.capacity.start_rate
    return [dataclasses.replace(j, load=dataclasses.replace(j.load, request_rate=start)) for j in jobs]
