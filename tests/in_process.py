"""A sweep's command line run in this process: composed as the entry point composes it, then the
driver, with an executor that fails the test if anything reaches a launch. For the refusals
(test_bad_input) and the dry runs of a page's commands (test_gpu_doc), without a subprocess."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from pipeline.compose import register_schema, to_job_config
from pipeline.config import ConfigError, JobConfig
from pipeline.exitcode import ExitCode
from pipeline.run.driver import local_preflight, run_guarded
from pipeline.run.outcomes import GroupOutcome, GroupTask
from pipeline.run.resolve import Resolved, resolve_groups

CONF = Path(__file__).resolve().parents[1] / "conf"


class NoLaunch:
    """The driver's executor for refusals and dry runs: reaching it means an input got through."""

    def preflight(self, tasks: Sequence[GroupTask]) -> None:
        local_preflight(tasks)  # what the CLI's basic launcher checks of this machine

    def resolve(self, tasks: Sequence[GroupTask]) -> dict[int, Resolved]:
        return resolve_groups(t.group for t in tasks)  # each group resolved here, as the basic launcher does

    def run(self, tasks: Sequence[GroupTask]) -> list[GroupOutcome]:
        raise AssertionError(f"a refused input reached the launch of {len(tasks)} server group(s)")


def compose_jobs(args: list[str], multirun: bool, output_dir: str = "outputs") -> list[JobConfig]:
    """The jobs a command line composes to, as the entry point (or, for a sweep, the sweeper,
    one config per grid point) converts them; raises ConfigError."""
    register_schema()
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        if multirun:  # a sweep: one config per grid point, as the sweeper expands its params and the command line
            named = [a for a in args if a.startswith(("+sweep=", "hydra."))]  # where sweeper params come from
            hydra = compose(config_name="config", overrides=named, return_hydra_config=True).hydra
            params = [f"{k}={v}" for k, v in (hydra.sweeper.get("params") or {}).items()]
            grid = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides([*params, *args]), None)[0]
            points = [list(point) for point in grid]
        else:
            points = [args]
        cfgs = [compose(config_name="config", overrides=[*p, f"output_dir={output_dir}"]) for p in points]
    return [to_job_config(cfg) for cfg in cfgs]


def sweep_in_process(multirun: bool, folder: Path, args: list[str]) -> int:
    """Compose as the entry point does, then convert and run the driver: the exit code."""
    try:
        jobs = compose_jobs(args, multirun, f"{folder}/out")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    return run_guarded(jobs, NoLaunch(), folder)
