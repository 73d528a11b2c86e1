"""Entry point: ``python -m pipeline.sweep [overrides]``.

Hydra composes the config; it is converted once into a frozen :class:`JobConfig` here,
and nothing below this module sees Hydra or OmegaConf.
"""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from typing import Any

import hydra

from pipeline.config import ConfigError, JobConfig, register_schema, to_job_config
from pipeline.engines.vllm import EngineNotInstalled
from pipeline.models import ModelError

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
EXIT_BAD_INPUT = 2
EXIT_FAILED_POINT = 3


def _terminate_as_exit(signum: int, frame: Any) -> None:
    # Default SIGTERM handling skips `finally` blocks; turning it into SystemExit lets
    # every server context manager stop its process group.
    raise SystemExit(128 + signum)


def run(job: JobConfig, project_root: Path) -> int:
    # Imported here, not at the top: a config error should not wait for mlflow and pandas.
    from pipeline import job as jobs
    from pipeline import plan, table, tracking

    try:
        if job.dry_run:
            print(plan.describe(job, jobs.resolve_target(job, build=False)))
            return 0
        prepared = jobs.prepare(job)
    except (ConfigError, EngineNotInstalled, ModelError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    servers = len(jobs.roles(job))
    print(
        f"plan: {servers} server(s), estimated ~{plan.estimate_s(job, prepared.target, prepared.offsets) / 60:.1f} min (rough)"
    )
    store = tracking.resolve_store(job.tracking, project_root)
    experiment = job.tracking.experiment or job.sweep_name
    tracker = tracking.Tracker(store, tracking.prepare(store, experiment))
    out_dir = Path(job.output_dir).resolve()
    print(f"outputs: {out_dir}\nMLflow: {store.tracking_uri} (experiment {experiment!r})")
    try:
        with tracker.parent(f"{job.spec.method}-k{job.spec.k}-r{job.load.request_rate:g}", {"role": "sweep"}):
            result = jobs.run_job(prepared, tracker, out_dir)
    except KeyboardInterrupt:
        print("interrupted: every server was stopped; finished runs are in MLflow", file=sys.stderr)
        return 130
    table.render(result)
    return EXIT_FAILED_POINT if result.failed else 0


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="config")
def main(cfg: Any) -> None:
    signal.signal(signal.SIGTERM, _terminate_as_exit)
    # Hydra sets the root logger to INFO; a line per HTTP request buries the progress bar.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        job = to_job_config(cfg)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    code = run(job, Path.cwd())
    if code:
        sys.exit(code)


register_schema()

if __name__ == "__main__":
    main()
