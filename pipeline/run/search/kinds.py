"""The sweep-level searches by name (``search``): each one's plan, what its dry run shows, and
its strategy (:class:`pipeline.run.search.strategy.Search`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pipeline.config import JobConfig, SweepSettings
from pipeline.run.plan import SweepPlan, plan_sweep
from pipeline.run.search import drafter_grid, paired_night, predict_phases
from pipeline.run.search.profiles import Bracketing, LoadProfile, Planned
from pipeline.run.search.strategy import Capacity, Context, Grid, InOrder, Search


class _PredictPlans:
    """search=predict's plan and its first phase."""

    @staticmethod
    def planned(jobs: Sequence[JobConfig], settings: SweepSettings) -> SweepPlan:
        plan = plan_sweep(jobs, settings)
        predict_phases.check_plan(plan)
        return plan

    @staticmethod
    def shown(plan: SweepPlan) -> SweepPlan:
        return predict_phases.first_phase(plan)


def _start_predict(plan: SweepPlan, context: Context) -> Search:
    # Imported when a predict search starts: it fits curves (the report's statistics, scipy.stats:
    # seconds on a busy machine), which no refusal, dry run or other search needs.
    from pipeline.run.search.predicting import PredictSearch

    return PredictSearch(plan, context)


def _no_check(job: JobConfig, settings: SweepSettings) -> None:
    """The grid measures any job that passes the sweep's own checks."""


def _no_note(settings: SweepSettings) -> str:
    return ""


@dataclass(frozen=True)
class SearchKind:
    """What a search is to everything outside run/search: asked, never compared by name."""

    planned: Callable[[Sequence[JobConfig], SweepSettings], SweepPlan]  # the whole plan, refusals first
    shown: Callable[[SweepPlan], SweepPlan]  # what a dry run shows and the estimate covers
    start: Callable[[SweepPlan, Context], Search]
    # Whether points finished by an earlier run on the same identity are kept, not measured
    # again (a capacity search probes afresh; a paired night measures both builds afresh).
    resumes: bool
    profile: LoadProfile  # what each server's worker measures (pipeline.run.search.profiles)
    # Its strategy computes on the windows, and is given Context.windows to read them: those its
    # groups return, and a resumed point's, read back from MLflow (it did not run in this sweep).
    reads_windows: bool = False
    describe: Callable[[SweepPlan], str] = lambda plan: ""  # more for the dry run to say of its plan
    # One job's settings, with the sweep's as that job carries them, refused before anything
    # starts (pipeline.validate calls it); what needs the whole grid is refused by ``planned``.
    check: Callable[[JobConfig, SweepSettings], None] = _no_check
    # What it does beyond the plan printed for it, said by the dry run and the sweep's start ("" for nothing).
    note: Callable[[SweepSettings], str] = _no_note
    # gate.mode=paired may measure its plan on both builds: the grid's, on fresh servers.
    pairable: bool = False


SEARCHES = {
    "grid": SearchKind(Grid.planned, Grid.shown, Grid, resumes=True, profile=Planned(), pairable=True),
    "predict": SearchKind(
        _PredictPlans.planned,
        _PredictPlans.shown,
        _start_predict,
        resumes=True,
        profile=Planned(),
        reads_windows=True,
        check=predict_phases.check_job,
        note=predict_phases.note,
    ),
    "capacity": SearchKind(
        Capacity.planned,
        Capacity.shown,
        Capacity,
        resumes=False,
        profile=Bracketing(),
        check=Capacity.check,
        note=Capacity.note,
    ),
    # The grid, and each k's proposer at synthetic acceptance lengths (docs/drafter_needed.md).
    "drafter_needed": SearchKind(
        drafter_grid.planned,
        Grid.shown,
        Grid,
        resumes=True,
        profile=Planned(),
        check=drafter_grid.check,
        note=drafter_grid.search_note,
    ),
}
# gate.mode=paired: the grid's plan on both builds, pair by pair, one server after another;
# every night measures afresh.
PAIRED = SearchKind(
    paired_night.paired_plan,
    lambda plan: plan,
    InOrder,
    resumes=False,
    profile=Planned(),
    describe=paired_night.order_text,
)


def kind_of(settings: SweepSettings) -> SearchKind:
    """The sweep's search, or the paired night where the gate measures its own reference."""
    if settings.gate.enabled and settings.gate.paired:
        return PAIRED
    return SEARCHES[settings.search]
