"""gate.mode=paired: a night's plan, the reference build measured beside the candidate.

Every server configuration of the grid is measured ``gate.pairs`` times on each build, each
time on a fresh server, in ABBA order: reference then candidate in the first pair, candidate then
reference in the second, and so on. A drift over the night (a neighbour's job starting, the
page cache warming) then falls on both builds alike instead of on the one measured later. The
two servers of a pair send the same prompts on the same schedule (the pair's seed); the pairs
differ from each other, so the night samples prompts as well as server starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from pipeline.config import ConfigError, JobConfig, RepeatsConfig, SweepSettings
from pipeline.identity import point_key, server_key
from pipeline.run.plan import ServerGroup, SweepPlan, plan_sweep
from pipeline.schema import apply_overrides

REFERENCE, CANDIDATE = "reference", "candidate"


def reference_job(job: JobConfig, settings: SweepSettings) -> JobConfig:
    """The job as gate.reference's build runs it: the sweep's settings with its overrides."""
    return dataclasses.replace(apply_overrides(job, settings.gate.reference), build=REFERENCE)


def _fresh(settings: SweepSettings) -> SweepSettings:
    """Each pair on servers of its own: one repeat per pair, each on a fresh server."""
    return dataclasses.replace(settings, repeats=RepeatsConfig(count=settings.gate.pairs, restart=True))


def _repeated(job: JobConfig, fresh: SweepSettings) -> JobConfig:
    # The job carries the night's repeats too: a server's key reads them from the job
    # (pipeline.identity.server_key), and each pair must be a server of its own.
    return dataclasses.replace(job, repeats=fresh.repeats)


def _keyed(group: ServerGroup, twins: ServerGroup) -> ServerGroup:
    """The group with each point marked with the candidate point it pairs with."""
    points = tuple(
        dataclasses.replace(p, job=dataclasses.replace(p.job, pair_key=point_key(twin.job)))
        for p, twin in zip(group.points, twins.points, strict=True)
    )
    return dataclasses.replace(group, points=points)


def paired_plan(jobs: Sequence[JobConfig], settings: SweepSettings) -> SweepPlan:
    """Both builds' servers for every configuration, pair by pair, in ABBA order."""
    fresh = _fresh(settings)
    candidates = plan_sweep([_repeated(dataclasses.replace(j, build=CANDIDATE), fresh) for j in jobs], fresh)
    references = plan_sweep([_repeated(reference_job(j, settings), fresh) for j in jobs], fresh)
    shape = [[(p.role, p.job.load.request_rate, p.job.repeat) for p in g.points] for g in candidates.groups]
    if shape != [[(p.role, p.job.load.request_rate, p.job.repeat) for p in g.points] for g in references.groups]:
        raise ConfigError(
            f"gate.reference={list(settings.gate.reference)} changes which servers the grid needs; a reference "
            f"build may change how a server runs, not which servers there are"
        )
    first_seen: dict[str, int] = {}
    ordered: list[tuple[int, int, ServerGroup]] = []
    for cand, ref in zip(candidates.groups, references.groups, strict=True):
        config = first_seen.setdefault(server_key(dataclasses.replace(cand.server_job, repeat=0)), len(first_seen))
        pair = cand.server_job.repeat
        both = (_keyed(ref, cand), _keyed(cand, cand))
        ordered += [(config, pair, g) for g in (both if pair % 2 == 0 else both[::-1])]  # A B, B A, A B, ...
    ordered.sort(key=lambda item: item[:2])  # stable: each pair keeps its A-B order
    return SweepPlan(tuple(dataclasses.replace(g, index=i) for i, (_, _, g) in enumerate(ordered, start=1)))


def order_text(plan: SweepPlan) -> str:
    """The dry run's line on the interleaving: each server as the reference or the candidate."""
    lines = [f"gate.mode=paired: {len(plan.groups)} server starts, interleaved (ABBA) per configuration:"]
    for group in plan.groups:
        job = group.server_job
        lines.append(f"  {group.index:2d}. pair {job.repeat + 1}: {job.build:9s} {group.label}")
    return "\n".join(lines)
