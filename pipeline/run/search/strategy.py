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

from pipeline.config import ConfigError, JobConfig, SweepSettings
from pipeline.run.outcomes import GroupOutcome, PointOutcome
from pipeline.run.plan import Point, SweepPlan, plan_sweep
from pipeline.run.search import capacity_points


@dataclass(frozen=True)
class SearchEnd:
    """What a search measured: the plan as it ran, and the points it predicted instead."""

    plan: SweepPlan
    outcomes: list[GroupOutcome]
    predicted: dict[str, PointOutcome] = field(default_factory=dict)
    table: pd.DataFrame | None = None  # search=predict's predictions table


@dataclass(frozen=True)
class Context:
    """What a search may need once the sweep's parent run exists (predict reads and writes MLflow)."""

    done: Mapping[str, PointOutcome]  # finished points of earlier runs, resumed
    samples: Callable[[Sequence[PointOutcome]], list] | None = None
    log_predicted: Callable[[Point, dict[str, float]], str] | None = None
    opts: object | None = None  # StatsOptions: how intervals are drawn
    settings: SweepSettings | None = None  # the sweep-wide settings (predict.max_confirm, ...)
    # The store's A/A spread for this sweep's measured windows (None: none): read once the first
    # windows are recorded, since its fingerprint is theirs (record.windows.server_spread_for).
    server_spread: Callable[[], object] | None = None


class Search(Protocol):
    # Whether points finished by an earlier run are kept (a capacity search probes afresh).
    resumes: bool

    def next_plan(self, outcomes: Sequence[GroupOutcome]) -> SweepPlan | None:
        """The next plan to measure, given the outcomes of the last one (none at first)."""
        ...

    def finish(self) -> SearchEnd: ...


class Grid:
    """Every point of the plan, once."""

    resumes = True

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

    resumes = False

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

    resumes = False

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
