"""A sweep-level search is a strategy: given the results so far, the next plan to measure.

The driver runs every search the same way: it asks :meth:`Search.next_plan` for a plan,
measures it, hands the outcomes back, and stops at ``None``; :meth:`Search.finish` then says
what the sweep measured (the plan as it ran, and any predicted points). The grid returns its
plan once; predict returns its first phase, then the confirmations
(:class:`~pipeline.run.search.predicting.PredictSearch`); capacity returns one seed point per
server, whose rates the worker's load profile picks as it goes. The searches are named in
:data:`pipeline.run.search.kinds.SEARCHES`, by ``search``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import pandas as pd

from pipeline.analysis.samples import Sample, ServerSpread, StatsOptions
from pipeline.config import ConfigError, JobConfig, SweepSettings
from pipeline.run.outcomes import GroupOutcome, PointOutcome
from pipeline.run.plan import Point, SweepPlan, plan_sweep
from pipeline.run.search import capacity_points


@dataclass(frozen=True)
class SearchEnd:
    """What a search measured: the plan as it ran, and the points it predicted instead."""

    plan: SweepPlan
    outcomes: list[GroupOutcome]
    # Points the search computed instead of measuring (each its own run, PointOutcome.predicted).
    predicted: dict[str, PointOutcome] = field(default_factory=dict)
    # Tables of its own, by their path under the sweep's folder, where the parent run keeps
    # them too (search=predict's predictions table: analysis.search_report.PREDICTIONS_CSV).
    tables: Mapping[str, pd.DataFrame] = field(default_factory=dict)


@dataclass(frozen=True)
class WindowReads:
    """What a search that computes on windows is given (its kind's ``reads_windows``), once
    the sweep's parent run exists: it reads MLflow and writes runs of its own."""

    # A point's window by its run id and duration (a point resumed from an earlier run: its
    # requests.csv); None where the run has none. A point this sweep measured carries its own.
    window: Callable[[str, float], Sample | None]
    # A point the search predicted, recorded as a run of its own with these metrics: its run id.
    record_predicted: Callable[[Point, dict[str, float]], str]
    opts: StatsOptions  # how intervals are drawn
    # The store's A/A spread for this sweep's measured windows (None: none): read once the first
    # windows are recorded, since its fingerprint is theirs (record.windows.server_spread_for).
    server_spread: Callable[[], ServerSpread | None] | None = None


@dataclass(frozen=True)
class Context:
    """What a search is given when it starts."""

    done: Mapping[str, PointOutcome]  # finished points of earlier runs, resumed
    settings: SweepSettings  # the sweep-wide settings (predict.max_confirm, ...)
    windows: WindowReads | None = None  # where its kind reads windows


class Search(Protocol):
    def next_plan(self, outcomes: Sequence[GroupOutcome]) -> SweepPlan | None:
        """The next plan to measure, given the outcomes of the last one (none at first)."""
        ...

    def finish(self) -> SearchEnd: ...


class Grid:
    """Every point of the plan, once."""

    def __init__(self, plan: SweepPlan, context: Context) -> None:
        self.plan = plan
        self.outcomes: list[GroupOutcome] = []
        self.asked = False

    @staticmethod
    def planned(jobs: Sequence[JobConfig], settings: SweepSettings) -> SweepPlan:
        return plan_sweep(jobs, settings)

    @staticmethod
    def shown(plan: SweepPlan) -> SweepPlan:
        """What the dry run and the time estimate cover."""
        return plan

    def next_plan(self, outcomes: Sequence[GroupOutcome]) -> SweepPlan | None:
        self.outcomes += outcomes
        if self.asked:
            return None
        self.asked = True
        return self.plan

    def finish(self) -> SearchEnd:
        return SearchEnd(self.plan, self.outcomes)


class InOrder(Grid):
    """Every point of the plan, one server group at a time, in the plan's order: a paired
    night's ABBA interleaving then holds on any executor (a Ray launcher given the whole plan
    would start its groups at once, both builds side by side)."""

    def __init__(self, plan: SweepPlan, context: Context) -> None:
        super().__init__(plan, context)
        self.left = list(plan.groups)

    def next_plan(self, outcomes: Sequence[GroupOutcome]) -> SweepPlan | None:
        self.outcomes += outcomes
        if not self.left:
            return None
        return SweepPlan((self.left.pop(0),))


class Capacity(Grid):
    """One seed point per server at capacity.start_rate; each server's worker probes the rates
    itself (:class:`pipeline.run.search.profiles.Bracketing`), and the plan as it ran holds what it probed."""

    @staticmethod
    def planned(jobs: Sequence[JobConfig], settings: SweepSettings) -> SweepPlan:
        plan_sweep(jobs, settings)  # the grid's own refusals first
        return plan_sweep(capacity_points.seed_jobs(jobs, settings), settings)

    @staticmethod
    def check(job: JobConfig, settings: SweepSettings) -> None:
        """What one job of search=capacity must be: an SLO to search under, one server each."""
        slo = job.slo
        if slo.ttft_ms is None and slo.tpot_ms is None and slo.e2el_ms is None:
            raise ConfigError(
                "search=capacity needs an SLO to search under; set at least one of slo.ttft_ms, slo.tpot_ms, "
                "slo.e2el_ms, e.g. slo.tpot_ms=50"
            )
        if settings.repeats.count > 1 or settings.aa:
            raise ConfigError("search=capacity measures each server once; drop repeats.count and aa")
        if settings.gate.enabled:
            raise ConfigError("search=capacity probes adaptive rates that no reference shares; set gate.enabled=false")

    @staticmethod
    def note(settings: SweepSettings) -> str:
        """What search=capacity does beyond the seed points printed for it."""
        c = settings.capacity
        return (
            f"search=capacity: each server probes from {c.start_rate:g} req/s (bracketing, then bisection to "
            f"{c.resolution:.0%}), at most {c.max_probes} windows per server"
        )

    def finish(self) -> SearchEnd:
        ran = {o.index: o.ran for o in self.outcomes if o.ran}
        groups = tuple(replace(g, points=ran.get(g.index, g.points)) for g in self.plan.groups)
        return SearchEnd(SweepPlan(groups), self.outcomes)
