"""Entry point: ``python -m pipeline.sweep [overrides]``, or ``-m`` for a sweep.

Hydra composes the config; it is converted once into a frozen :class:`JobConfig` here (or,
in a multirun, in our sweeper plugin), and nothing below sees Hydra or OmegaConf. A single
run is planned and recorded exactly like a sweep of one point. In a multirun, the sweeper
plans the whole grid and runs its server groups (hydra_plugins/specsweep_launcher).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import hydra

from pipeline import startup
from pipeline.compose import register_schema, to_job_config
from pipeline.config import ConfigError
from pipeline.exitcode import ExitCode
from pipeline.run.plumbing import entry

RAY_PACKAGE_DIR = "runtime_resources/working_dir_files"
STABLE_COPY_ENV = "SPECSWEEP_JOB_COPY"


def run_from_a_stable_copy() -> None:
    """A driver submitted with ``ray job submit --working-dir`` starts inside Ray's unpacked
    package. Ray 2.60 deletes and unpacks that folder again whenever it sets the job's
    environment up on this node (its working-dir plugin unpacks with overwrite=True), which
    happens seconds after the driver joins the cluster: a config file or module read in that
    window is missing. So the driver copies the package once and runs from the copy; the
    tasks still get Ray's package on their nodes."""
    if RAY_PACKAGE_DIR not in os.getcwd() or os.environ.get(STABLE_COPY_ENV):
        return
    copy = tempfile.mkdtemp(prefix="specsweep-job-")
    shutil.copytree(os.getcwd(), copy, dirs_exist_ok=True, symlinks=True)
    os.chdir(copy)
    os.environ[STABLE_COPY_ENV] = copy
    os.execv(sys.executable, [sys.executable, "-m", "pipeline.sweep", *sys.argv[1:]])


CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="config")
def main(cfg: Any) -> Any:
    startup.begin(verbose=None)  # how loud: once the config is read
    try:
        job = to_job_config(cfg)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(ExitCode.BAD_INPUT)
    if job.ray.address:
        print(
            f"error: ray.address={job.ray.address} joins a cluster for a sweep's server groups, but a single run "
            "measures in this process; add -m to run it through the Ray launcher",
            file=sys.stderr,
        )
        sys.exit(ExitCode.BAD_INPUT)
    # A single run is a sweep of one point and its baseline, run in this process.
    from pipeline.run.driver import InProcess, run_guarded

    code = run_guarded([job], InProcess(Path(job.output_dir).resolve()), Path.cwd())
    if code:
        sys.exit(code)
    return None


def cli() -> None:
    """``python -m pipeline.sweep``: only the driver runs this (a Ray task imports the module,
    and must stay put). The schema is Hydra's global state, so it is stored here rather than at
    import; :func:`main` reads it when it composes, a multirun's sweeper and launcher after it."""
    run_from_a_stable_copy()
    register_schema()
    entry.run_command(main)


if __name__ == "__main__":
    cli()
