"""On the worker, a load profile says which point to measure next, given the windows so far.

A server group measures what its profile asks for, one window at a time, on one server: the
grid's profile walks the group's planned points; the capacity profile starts at its seed rate,
brackets the rate the server sustains under the SLO, then bisects
(:func:`pipeline.analysis.capacity.next_rate`). This is how GuideLLM's profiles drive its
benchmarks (``benchmark/profiles/profile.py``). A profile is a small picklable record that
travels in the :class:`~pipeline.run.outcomes.GroupTask`; :meth:`LoadProfile.start` makes the
stateful walk on the worker.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar, Protocol

from pipeline.analysis.samples import Sample
from pipeline.config import SweepSettings
from pipeline.load.slo import SloTarget
from pipeline.run.plan import Point, ServerGroup
from pipeline.run.search.capacity_points import at_rate, rounded, search_settings


class Outcome(Protocol):
    """What a profile reads of a measured point (a :class:`~pipeline.run.outcomes.PointOutcome`)."""

    error: str | None
    metrics: dict[str, float]
    sample: Sample | None  # the window's requests, where the outcome carries them


@dataclass(frozen=True)
class Measured:
    """One window as the profile sees it: its point, and what it gave."""

    point: Point
    outcome: Outcome


class Walk(Protocol):
    def next_point(self, history: Sequence[Measured]) -> Point | None:
        """The next point to measure, or None: the group is done."""
        ...

    def judge(self, measured: Measured) -> dict[str, float]:
        """Metrics this profile adds to a measured point's run (the capacity probe's call)."""
        ...

    def left(self, history: Sequence[Measured]) -> tuple[Point, ...]:
        """Points it would still have measured, for the failures a stopped group records."""
        ...


class LoadProfile(Protocol):
    tags: Mapping[str, str]  # tags on each of the group's runs
    # Whether an earlier attempt's finished points are kept when Ray runs the group again
    # (a capacity search probes afresh: its rates depend on every window before them).
    keeps_earlier: bool
    # Whether the planned points are given runs before the server starts (a failed start then
    # fails each of them), or each as the walk reaches it.
    opens_planned: bool
    # Whether the walk picks its points as it goes (then the group reports the points it ran).
    chooses_points: bool

    def start(self, group: ServerGroup, settings: SweepSettings) -> Walk: ...


@dataclass(frozen=True)
class Planned:
    """The grid's profile: the group's points, in order."""

    tags: ClassVar[Mapping[str, str]] = MappingProxyType({})  # the same for every grid group
    keeps_earlier = True
    opens_planned = True
    chooses_points = False

    def start(self, group: ServerGroup, settings: SweepSettings) -> Walk:
        return _PlannedWalk(group.points)


@dataclass(frozen=True)
class _PlannedWalk:
    points: tuple[Point, ...]

    def next_point(self, history: Sequence[Measured]) -> Point | None:
        return self.points[len(history)] if len(history) < len(self.points) else None

    def judge(self, measured: Measured) -> dict[str, float]:
        return {}

    def left(self, history: Sequence[Measured]) -> tuple[Point, ...]:
        return self.points[len(history) :]


@dataclass(frozen=True)
class Bracketing:
    """search=capacity's profile: from the seed point, the rates :func:`next_rate` picks, until
    the bracket is fine enough, the probes run out, or a probe fails to measure."""

    tags: ClassVar[Mapping[str, str]] = MappingProxyType({"search": "capacity"})
    keeps_earlier = False
    opens_planned = True  # the seed; each later probe is given its run as it is reached
    chooses_points = True

    def start(self, group: ServerGroup, settings: SweepSettings) -> Walk:
        return _BracketingWalk(group.points[0], settings)


class _BracketingWalk:
    def __init__(self, seed: Point, settings: SweepSettings) -> None:
        self.seed = seed
        self.target = SloTarget.from_config(seed.job.slo)
        self.settings = search_settings(settings.capacity)
        self.calls: list[tuple[float, bool]] = []  # (rate, met the SLO) per probe

    def judge(self, measured: Measured) -> dict[str, float]:
        point, outcome = measured.point, measured.outcome
        if outcome.error is not None:
            return {}
        # A measured point's outcome carries its window (pipeline.run.point.measure_point), and
        # this walk is never given an earlier attempt's outcomes (keeps_earlier is False).
        assert outcome.sample is not None
        from pipeline.analysis.capacity import window_passes  # scipy: only where capacity runs

        passed = window_passes(outcome.sample, self.target)
        self.calls.append((point.job.load.request_rate, passed))
        print(
            f"[{point.label}] capacity probe {len(self.calls)}: {self.target.describe()} "
            f"{'met' if passed else 'missed'} at {point.job.load.request_rate:g} req/s"
        )
        return {"capacity_probe": float(len(self.calls)), "slo_passed": float(passed)}

    def next_point(self, history: Sequence[Measured]) -> Point | None:
        if not history:
            return self.seed
        if history[-1].outcome.error is not None:
            return None  # a probe that failed to measure (an error, not an SLO miss) ends the search
        from pipeline.analysis.capacity import next_rate

        rate = next_rate(self.calls, self.settings)
        if rate is None or not math.isfinite(rate):
            return None
        rate = rounded(rate)
        if any(abs(rate - r) < 1e-12 for r, _ in self.calls):
            return None  # rounding reached a probed rate: the bracket is as fine as it gets
        return at_rate(self.seed, rate)

    def left(self, history: Sequence[Measured]) -> tuple[Point, ...]:
        return ()
