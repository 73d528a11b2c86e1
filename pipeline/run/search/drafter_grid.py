"""search=drafter_needed's plan: the sweep's grid as given (its real drafters and the baseline),
and each k's proposer again at a grid of synthetic acceptance lengths, one server per (k, L)
with its rates sharing it (docs/drafter_needed.md).

A proposer carries the map only where it drafts k tokens at every step (a draft model, EAGLE,
Medusa, MTP: :data:`pipeline.engines.synthetic.DRAFTS_EVERY_STEP`); prompt lookup drafts only
where it finds a match, so its points stay what they are, real drafters placed on the map.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from pipeline.config import ConfigError, JobConfig, SweepSettings
from pipeline.engines import synthetic
from pipeline.engines.registry import engine_of
from pipeline.run.plan import SweepPlan, plan_sweep

STEP = 0.5  # the default grid: 1.0, 1.5, ... k+1


def lengths_for(k: int, given: Sequence[float] | None) -> list[float]:
    """The acceptance lengths measured at ``k``: ``given`` (or the default grid) within [1, k+1],
    and k+1, the ceiling, always."""
    top = float(k + 1)
    grid = given if given is not None else [1.0 + STEP * i for i in range(int(round((top - 1.0) / STEP)) + 1)]
    return sorted({float(v) for v in grid if 1.0 <= v <= top} | {top})


def carries_map(job: JobConfig) -> bool:
    """A speculative job whose proposer drafts k tokens every step, at its own acceptance."""
    return job.spec.method in synthetic.DRAFTS_EVERY_STEP and not synthetic.is_synthetic(job.spec)


def synthetic_jobs(jobs: Sequence[JobConfig], settings: SweepSettings) -> list[JobConfig]:
    """Every job as given, then each map-carrying job at each of its k's lengths."""
    added: list[JobConfig] = []
    for job in jobs:
        if carries_map(job):
            for length in lengths_for(job.spec.k, settings.drafter_needed.lengths):
                spec = dataclasses.replace(job.spec, synthetic_acceptance_length=length)
                added.append(dataclasses.replace(job, spec=spec))
    return [*jobs, *added]


def planned(jobs: Sequence[JobConfig], settings: SweepSettings) -> SweepPlan:
    plan_sweep(jobs, settings)  # the grid's own refusals first
    if not any(carries_map(job) for job in jobs):
        methods = sorted({job.spec.method for job in jobs if job.spec.method != "none"}) or ["none"]
        raise ConfigError(
            f"search=drafter_needed measures a proposer that drafts k tokens at every step ("
            f"{', '.join(sorted(synthetic.DRAFTS_EVERY_STEP))}) at synthetic acceptance lengths; the sweep has "
            f"{', '.join(methods)} only: add one, e.g. spec=draft (ngram drafts only where the prompt matches)"
        )
    return plan_sweep(synthetic_jobs(jobs, settings), settings)


def check(job: JobConfig, settings: SweepSettings) -> None:
    """What one job of search=drafter_needed must be."""
    given = settings.drafter_needed.lengths
    if given is not None and not all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 1 for v in given):
        raise ConfigError(f"drafter_needed.lengths={list(given)} must be acceptance lengths >= 1, e.g. [1, 2, 3, 4]")
    if not engine_of(job).synthetic_acceptance:
        raise ConfigError(
            f"search=drafter_needed runs vLLM's synthetic acceptance, which engine={job.engine.name} cannot: use "
            "engine=vllm"
        )
    if settings.aa:
        raise ConfigError("search=drafter_needed compares speculation with its baseline; aa=true needs search=grid")


def search_note(settings: SweepSettings) -> str:
    """What search=drafter_needed adds to the grid, said before anything starts."""
    given = settings.drafter_needed.lengths
    grid = "1.0, 1.5, ... k+1" if given is None else ", ".join(f"{v:g}" for v in given) + " (those <= k+1) and k+1"
    return (
        f"search=drafter_needed: each k of {', '.join(sorted(synthetic.DRAFTS_EVERY_STEP))} measured again at "
        f"synthetic acceptance L = {grid}, one server per (k, L); other methods are real drafters, placed on the map"
    )
