"""A real run that holds more GPU-hours than ``run.confirm_gpu_hours`` is asked about before
anything starts: on a terminal, by a question; anywhere else (Ray Jobs, a scheduler, CI) it is
refused with exit 2 and the fix, unless ``run.confirmed=true`` says the estimate was read.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

from pipeline.config import RunConfig
from pipeline.exitcode import ExitCode


def over_budget(gpu_hours: float, summary: str, run: RunConfig) -> str | None:
    """What to say where the run must be confirmed first; None where it may start."""
    if run.confirmed or gpu_hours == 0 or gpu_hours <= run.confirm_gpu_hours:
        return None
    return f"this sweep's estimate is {summary}, above run.confirm_gpu_hours={run.confirm_gpu_hours:g}"


def ask(
    gpu_hours: float,
    summary: str,
    account: Sequence[str],
    run: RunConfig,
    stdin: TextIO | None = None,
    out: TextIO | None = None,
) -> int | None:
    """None to go on; else the exit code (2: refused, or answered no). ``summary`` and
    ``account`` are the estimate's (pipeline/run/estimate.py); it asks only on a terminal."""
    stdin, out = stdin or sys.stdin, out or sys.stderr
    problem = over_budget(gpu_hours, summary, run)
    if problem is None:
        return None
    said = "\n".join([f"{problem}:", *account])
    if not stdin.isatty():
        print(
            f"error: {said}\nRead the plan with dry_run=true, then start it with run.confirmed=true, or set "
            f"run.confirm_gpu_hours to the GPU-hours you mean to spend",
            file=out,
        )
        return ExitCode.BAD_INPUT
    print(said, file=out)
    print("Start it? [y/N] ", end="", file=out, flush=True)
    if stdin.readline().strip().lower() in ("y", "yes"):
        return None
    print("not started (run.confirmed=true starts it without asking)", file=out)
    return ExitCode.BAD_INPUT
