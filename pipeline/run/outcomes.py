"""What a server group is given and gives back (frozen records that travel to a Ray worker as
the task's argument, serialized once by Ray), and who runs groups."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pipeline.analysis.samples import Sample
from pipeline.config import SweepSettings
from pipeline.identity import System
from pipeline.record.tracking import Store
from pipeline.run.plan import Point, ServerGroup
from pipeline.run.resolve import Resolved
from pipeline.run.search.profiles import LoadProfile, Planned


@dataclass(frozen=True)
class GroupTask:
    """Everything a worker needs to run a group."""

    group: ServerGroup
    store: Store
    experiment_id: str
    parent_run_id: str
    # The sweep-wide settings, as the driver read them once: a worker reads these, never a
    # job's copy (lossless.*, tracking.vllm_result, capacity.*, verbose, gate.*).
    settings: SweepSettings
    # What the group's settings resolved to before the sweep began (pipeline.run.resolve): the
    # system its earlier results were matched against; the node it runs on must be the same.
    system: System | None = None
    # A regression gate's re-measurement: point hash -> the run it confirms (tagged on its run).
    confirms: dict[str, str] = field(default_factory=dict)
    # What the worker measures on this server: the planned points, or (search=capacity) the
    # rates it picks as it goes from its seed point (pipeline.run.search.profiles).
    profile: LoadProfile = field(default_factory=lambda: Planned())
    progress: str | None = None  # the driver's live display (pipeline.run.progress.events)


@dataclass(frozen=True)
class PointOutcome:
    hash: str
    run_id: str | None
    metrics: dict[str, float] = field(default_factory=dict)  # summary + acceptance + prefix cache
    error: str | None = None
    resumed: bool = False  # measured by an earlier run of the sweep, not this one
    predicted: bool = False  # search=predict's model, not a measurement (its run has no requests)
    # The window's requests, as measured in this sweep (None where resumed, predicted or failed):
    # predict and capacity read them here instead of downloading what this process measured.
    sample: Sample | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class ProbeOutput:
    """One answer to the lossless probe: the same prompt, temperature 0, one request at a time."""

    index: int
    text: str
    token_ids: tuple[int, ...]  # the text re-tokenized with the model's tokenizer
    error: str | None = None


@dataclass(frozen=True)
class GroupOutcome:
    index: int
    points: tuple[PointOutcome, ...]
    started: bool = False  # whether a server process was launched
    startup_s: float | None = None
    lossless: tuple[ProbeOutput, ...] = ()  # the lossless probe's answers
    probe_s: float = 0.0  # time spent on the lossless probe (a measurement of its own)
    # The points as the group ran them, in order, where its load profile chose them as it went
    # (search=capacity's probes); empty where they were the planned ones.
    ran: tuple[Point, ...] = ()
    restarts: int = 0  # the server was restarted this often after dying or hanging mid-window

    @staticmethod
    def failed(task: GroupTask, error: str) -> GroupOutcome:
        return GroupOutcome(task.group.index, tuple(PointOutcome(p.hash, None, error=error) for p in task.group.points))


class Executor(Protocol):
    """Runs server groups: in this process (the driver's ``InProcess``) or as Ray tasks (the launcher)."""

    def preflight(self, tasks: Sequence[GroupTask]) -> None:
        """Refuse what cannot run where the groups will (LaunchError, Unreachable), before anything starts."""
        ...

    def resolve(self, tasks: Sequence[GroupTask]) -> Mapping[int, Resolved]:
        """Each group's settings resolved where it will run (pipeline.run.resolve), by group index."""
        ...

    def run(self, tasks: Sequence[GroupTask]) -> list[GroupOutcome]: ...
