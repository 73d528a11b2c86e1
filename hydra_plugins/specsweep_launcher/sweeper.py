"""The sweeper: expands the grid like Hydra's basic sweeper, then plans before running.

Hydra's basic sweeper hands the launcher one job per grid point, so each point would start
its own servers. This one composes every point first (a bad value fails here, before any
server starts), groups the points by server with :mod:`pipeline.run.plan`, and runs the server
groups itself, through whichever launcher is configured: ours runs them as Ray tasks
(``hydra/launcher=ray``, itself an executor), any other runs them in this process, one after
another (``hydra/launcher=basic``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from pipeline import startup
from pipeline.compose import to_job_config
from pipeline.config import ConfigError
from pipeline.exitcode import ExitCode
from pipeline.run.plumbing import diskfull


def executor_for(launcher: Any, sweep_dir: Path) -> Any:
    """The configured launcher where it runs groups itself (ours, on Ray), else this process."""
    if all(callable(getattr(launcher, name, None)) for name in ("preflight", "resolve", "run")):
        return launcher
    from pipeline.run.driver import InProcess  # the driver (MLflow, pandas, ...) only where a sweep runs

    return InProcess(sweep_dir)


class SpecsweepSweeper(BasicSweeper):
    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None) -> None:
        super().__init__(max_batch_size=None, params=params)

    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        startup.begin(verbose=None)  # how loud: once the driver has read the sweep's config
        loader = self.hydra_context.config_loader
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).resolve()
        try:
            overrides = OverridesParser.create(config_loader=loader).parse_overrides(self._parse_config() + arguments)
            grid = self.split_arguments(overrides, None)[0]
            jobs = []
            for point in grid:
                cfg = loader.load_sweep_config(self.config, list(point))
                with open_dict(cfg):
                    cfg.output_dir = str(sweep_dir)  # the driver's own files; groups get Hydra's job folders
                jobs.append(to_job_config(cfg))
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(ExitCode.BAD_INPUT)
        except (HydraException, OmegaConfBaseException) as exc:  # an override no config can take
            print(
                f"error: {exc}\ncheck the key and group names and the value types (`python -m pipeline.sweep "
                f"--cfg job` prints the config with every key)",
                file=sys.stderr,
            )
            sys.exit(ExitCode.BAD_INPUT)
        try:
            sweep_dir.mkdir(parents=True, exist_ok=True)
            OmegaConf.save(self.config, sweep_dir / "multirun.yaml")  # a refused config is never written
        except OSError as exc:
            if not diskfull.is_disk_full(exc):
                raise
            print(f"error: {diskfull.message(exc, sweep_dir)}", file=sys.stderr)
            sys.exit(ExitCode.INFRA)
        from pipeline.run.driver import run_guarded  # a refused command line never imports it (~2 s)

        code = run_guarded(jobs, executor_for(self.launcher, sweep_dir), Path.cwd())
        if code:
            sys.exit(code)
        return []
