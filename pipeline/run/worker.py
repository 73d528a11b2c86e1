"""What a Ray task runs on the node Ray picked: a group's resolution, or the group itself.

The launcher hands Ray these two functions and the frozen records they take (Ray serializes them
once, as the task's arguments); a worker imports this module and what a group needs, never the
command line, the sweeper or the driver.
"""

from __future__ import annotations

from pathlib import Path

from pipeline import startup
from pipeline.run.group import run_group
from pipeline.run.outcomes import GroupOutcome, GroupTask
from pipeline.run.plan import ServerGroup
from pipeline.run.resolve import Resolved, resolve_group


def resolve_task(group: ServerGroup, verbose: bool) -> Resolved:
    """The group's settings resolved on this node (its engine, device and models)."""
    startup.begin(verbose)
    return resolve_group(group)


def run_task(task: GroupTask, out_dir: str) -> GroupOutcome:
    """The group, on this node: its server, its points, each recorded in MLflow."""
    startup.begin(task.settings.verbose)
    return run_group(task, Path(out_dir))
