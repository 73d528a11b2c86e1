"""What a server group's settings resolve to where it runs, and so the identity of its points.

The driver plans; it resolves nothing of a real run (it may be a laptop or a Ray head without a
GPU, an engine or the model). Each executor resolves its groups where they will run: the
in-process one here, the Ray launcher in a task with the group's own resource request, so on a
node of the kind the group gets. Resolving checks the engine's install, the device and the
models (building an embedded one) and a trace's lines against the model's tokenizer, then reads the system a point's identity holds
(:class:`pipeline.identity.System`). The group does the same again on the node it lands on, and
a point is measured only on the system it was planned for (:func:`mismatch`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pipeline.config import ConfigError, EngineConfig
from pipeline.engines.engine import EngineNotInstalled, Target
from pipeline.engines.hardware import where_am_i
from pipeline.engines.models import ModelError
from pipeline.identity import Identity, System
from pipeline.load.workloads import data_fingerprint
from pipeline.run.job import check_trace, resolve_target
from pipeline.run.plan import Point, ServerGroup, SweepPlan

REFUSED = (ConfigError, EngineNotInstalled, ModelError)  # what a resolution refuses, with the fix in its message


@dataclass(frozen=True)
class Resolved:
    """A group's settings as one node resolved them: the system, or why it could not."""

    system: System | None
    node: str  # where: host (and Ray node id)
    error: str | None = None

    def identity(self, point: Point) -> Identity:
        assert self.system is not None
        return identity_of(point, self.system)


def identity_of(point: Point, system: System) -> Identity:
    """A point's identity on ``system``: its settings, the system, and its prompts' content."""
    return Identity(point.hash, system, data_fingerprint(point.job.workload))


def node_name() -> str:
    where = where_am_i()
    return where["node.host"] + (f" (Ray node {where['node.ray_id'][:8]})" if "node.ray_id" in where else "")


def resolve_here(group: ServerGroup) -> tuple[Target | None, Resolved]:
    """Resolve ``group`` on this machine: its target (None where refused) and what it resolved to."""
    try:
        target = resolve_target(group.server_job)
        check_traces(group, target)
    except REFUSED as exc:
        return None, Resolved(None, node_name(), str(exc))
    return target, Resolved(target.system(), node_name())


def check_traces(group: ServerGroup, target: Target) -> None:
    """A trace's lines against the model's own tokenizer (job.check_trace), once per trace and
    rate: on the node that holds the model, before any server starts."""
    jobs = {
        repr((p.job.workload, p.job.load.request_rate)): p.job for p in group.points if p.job.workload.name == "trace"
    }
    if not jobs:
        return
    from pipeline.engines.models import load_tokenizer

    tokenizer = load_tokenizer(target.model_path, target.model_revision)
    for job in jobs.values():
        check_trace(job, tokenizer)


def resolve_group(group: ServerGroup) -> Resolved:
    """What an executor runs for each group before any server starts (on the group's kind of node)."""
    return resolve_here(group)[1]


def resolve_groups(groups: Iterable[ServerGroup]) -> dict[int, Resolved]:
    """Every group resolved on this machine, by index: where the groups run here."""
    return {group.index: resolve_group(group) for group in groups}


def mismatch(planned: System | None, found: System) -> str | None:
    """Why a node's system is not the one its group was planned on, or None where it is."""
    if planned is None or planned == found:
        return None
    names = [f.name for f in dataclasses.fields(System)]
    changed = [
        f"{name} {have!r} where the sweep resolved {want!r}"
        for name, want, have in zip(names, dataclasses.astuple(planned), dataclasses.astuple(found), strict=True)
        if want != have
    ]
    return (
        f"this node has {'; '.join(changed)}: the group's earlier results were matched against the node the "
        f"sweep resolved it on. Run a comparison on one node type (ray.resources_per_group names one)"
    )


def server_gpus(engine: EngineConfig, gpus_present: bool) -> int:
    """The GPUs a group's server asks for where it runs: engine.tensor_parallel_size on a GPU
    (engine.device=gpu, or auto where the machine or cluster has GPUs), none on the CPU."""
    on_gpu = engine.device == "gpu" or (engine.device == "auto" and gpus_present)
    return engine.tensor_parallel_size if on_gpu else 0


def failed_resolutions(resolved: Mapping[int, Resolved], labels: Mapping[int, str]) -> list[str]:
    return [f"server group {labels[i]} on {r.node}: {r.error}" for i, r in sorted(resolved.items()) if r.error]


def across_hardware(plan: SweepPlan, resolved: Mapping[int, Resolved], one_type: bool) -> str | None:
    """Why the plan's comparisons would cross hardware, or None: a speculative server and the
    baseline it is compared with must resolve to the same hardware (device, GPU model and
    count), and so must every server of a night whose builds are compared pair by pair
    (``one_type``, gate.mode=paired). Which node of that type each ran on is recorded."""
    hardware = {i: r.system.hardware for i, r in resolved.items() if r.system is not None}
    group_of = {p.hash: g for g in plan.groups for p in g.points}
    pairs = {
        (group_of[p.baseline_hash].index, g.index) for g in plan.groups for p in g.points if p.baseline_hash in group_of
    }
    if one_type:
        first = plan.groups[0].index if plan.groups else 0
        pairs |= {(first, g.index) for g in plan.groups}
    labels = {g.index: g.label for g in plan.groups}
    for a, b in sorted(pairs):
        if a in hardware and b in hardware and hardware[a] != hardware[b]:
            return (
                f"server groups {labels[a]} ({hardware[a]}) and {labels[b]} ({hardware[b]}) are compared, but "
                f"resolved on different hardware; name one node type for the sweep with ray.resources_per_group "
                f"(a custom resource only the nodes of that type declare, e.g. +ray.resources_per_group.h100_node=1)"
            )
    return None
