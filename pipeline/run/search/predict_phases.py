"""search=predict's plans: its curves (one per method, draft and rate set), the first phase, and the confirmations."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.config import ConfigError, JobConfig, SweepSettings
from pipeline.engines.registry import engine_of
from pipeline.identity import setting_key
from pipeline.run.plan import Point, SweepPlan


def check_job(job: JobConfig, settings: SweepSettings) -> None:
    """What one job of search=predict must be: what the k-curve model was validated on."""
    from pipeline.analysis.kcurve import VALIDATED_METHODS

    if job.spec.method not in ("none", *VALIDATED_METHODS):
        raise ConfigError(
            f"search=predict is validated for spec.method in {', '.join(VALIDATED_METHODS)} only (chain drafters "
            f"whose k-draft is the start of a longer one); spec.method={job.spec.method} needs search=grid"
        )
    if not engine_of(job).per_position_counters:
        raise ConfigError(
            f"search=predict reads vLLM's per-position acceptance counters; engine={job.engine.name} needs "
            "search=grid (SGLang's trees with topk > 1 break the prefix property it rests on)"
        )
    if job.workload.temperature > 0:
        raise ConfigError(
            f"search=predict is validated for greedy decoding only; workload.temperature="
            f"{job.workload.temperature} needs search=grid or workload.temperature=0"
        )
    if settings.aa:
        raise ConfigError("search=predict compares speculative k values; aa=true needs search=grid")


def note(settings: SweepSettings) -> str:
    """What search=predict does beyond the plan printed for it."""
    return (
        f"search=predict: the baseline and the largest k of each method are measured first; then at most "
        f"{settings.predict.max_confirm} more server(s) per method confirm the predicted best k"
    )


def curves(plan: SweepPlan) -> dict[str, list[Point]]:
    """The speculative points of each curve (setting_key: every k and rate of one configuration)."""
    found: dict[str, list[Point]] = {}
    for point in plan.points:
        if point.role == "speculative":
            found.setdefault(setting_key(point.job), []).append(point)
    return found


def check_plan(plan: SweepPlan) -> None:
    """Refuse a grid the model cannot serve: each curve needs two or more k values."""
    if not curves(plan):
        raise ConfigError("search=predict needs speculative points; give a method and k values, e.g. spec.k=1,2,3")
    for points in curves(plan).values():
        ks = sorted({p.job.spec.k for p in points})
        if len(ks) < 2:
            spec = points[0].job.spec
            raise ConfigError(
                f"search=predict needs at least 2 values of spec.k per method (got k={ks[0]} for {spec.method}); "
                f"e.g. spec.k=1,2,3,4,5, or search=grid for one k"
            )


def k_max(points: Sequence[Point]) -> int:
    return max(p.job.spec.k for p in points)


def first_phase(plan: SweepPlan) -> SweepPlan:
    """The baseline and the largest k of every curve, at every rate."""
    tops = {p.hash for points in curves(plan).values() for p in points if p.job.spec.k == k_max(points)}
    return plan.without(p.hash for p in plan.points if p.role == "speculative" and p.hash not in tops)
