"""Entry point: ``python -m pipeline.sweep [overrides]``, or ``-m`` for a sweep.

Hydra composes the config; it is converted once into a frozen :class:`JobConfig` here (or,
in a multirun, in our sweeper plugin), and nothing below sees Hydra or OmegaConf. A single
run is planned and recorded exactly like a sweep of one point. In a multirun, the sweeper
plans the whole grid and launches one job per server group; each of those jobs lands in
:func:`main` with ``group_file`` set.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import hydra

from pipeline.config import GROUP_FILE_KEY, ConfigError, register_schema, to_job_config
from pipeline.signals import exit_on_sigterm

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
EXIT_BAD_INPUT = 2


def run_group_file(path: str, out_dir: Path) -> Any:
    """A launched job of a multirun: run the server group the sweeper wrote for it."""
    from pipeline.group import GroupTask, run_group

    return run_group(GroupTask.load(path), out_dir)


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="config")
def main(cfg: Any) -> Any:
    exit_on_sigterm()
    # Hydra sets the root logger to INFO; a line per HTTP request buries the progress bar.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if cfg.get(GROUP_FILE_KEY):
        return run_group_file(cfg[GROUP_FILE_KEY], Path(cfg.output_dir).resolve())
    try:
        job = to_job_config(cfg)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    # A single run is a sweep of one point and its baseline, run in this process.
    from pipeline.driver import InProcess, run_sweep

    code = run_sweep([job], InProcess(Path(job.output_dir).resolve()), Path.cwd())
    if code:
        sys.exit(code)
    return None


register_schema()

if __name__ == "__main__":
    main()
