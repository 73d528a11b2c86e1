"""A real run that holds more GPU-hours than ``run.confirm_gpu_hours`` is asked about before
anything starts: on a terminal, by a question; anywhere else (Ray Jobs, a scheduler, CI) it is
refused with exit 2 and the fix, unless ``run.confirmed=true`` says the estimate was read.
"""

from __future__ import annotations

import sys
from typing import Protocol, TextIO

from pipeline.config import RunConfig
from pipeline.exitcode import ExitCode


class Estimate(Protocol):
    """What is asked about: pipeline.run.estimate.Estimate."""

    @property
    def gpu_hours(self) -> float: ...

    def summary(self) -> str: ...

    def lines(self) -> list[str]: ...


def over_budget(estimate: Estimate, run: RunConfig) -> str | None:
    """What to say where the run must be confirmed first; None where it may start."""
    if run.confirmed or estimate.gpu_hours <= run.confirm_gpu_hours or estimate.gpu_hours == 0:
        return None
    return f"this sweep's estimate is {estimate.summary()}, above run.confirm_gpu_hours={run.confirm_gpu_hours:g}"


def ask(estimate: Estimate, run: RunConfig, stdin: TextIO | None = None, out: TextIO | None = None) -> int | None:
    """None to go on; else the exit code (2: refused, or answered no). Asks only on a terminal."""
    stdin, out = stdin or sys.stdin, out or sys.stderr
    problem = over_budget(estimate, run)
    if problem is None:
        return None
    account = "\n".join(estimate.lines())
    if not stdin.isatty():
        print(
            f"error: {problem}:\n{account}\nRead the plan with dry_run=true, then start it with run.confirmed=true, "
            f"or set run.confirm_gpu_hours to the GPU-hours you mean to spend",
            file=out,
        )
        return ExitCode.BAD_INPUT
    print(f"{problem}:\n{account}", file=out)
    print("Start it? [y/N] ", end="", file=out, flush=True)
    answer = stdin.readline().strip().lower()
    if answer in ("y", "yes"):
        return None
    print("not started (run.confirmed=true starts it without asking)", file=out)
    return ExitCode.BAD_INPUT
