"""The sweep's entry point, around Hydra: a command line Hydra cannot compose is bad input.

Hydra reports an override it cannot apply (an unknown key, a value of the wrong type, a config
group option that does not exist) and exits 1, the code of a crash. Before our own code has
started, nothing else can end the process with 1, so that exit becomes 2, with the fix.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from pipeline.exitcode import ExitCode
from pipeline.run.plumbing import signals

_entered = False


def entered() -> None:
    """Called first by the code Hydra hands over to (the single run, the sweeper)."""
    global _entered
    _entered = True


def run_command(main: Callable[[], object]) -> None:
    try:
        main()
    except SystemExit as exc:
        if exc.code == 1 and not _entered:
            print(
                "error: the command line could not be composed into a config (Hydra's message is above); check "
                "the key and group names and the value types (`python -m pipeline.sweep --cfg job` prints the "
                "config with every key)",
                file=sys.stderr,
            )
            sys.exit(ExitCode.BAD_INPUT)
        if signals.exit_code() is not None:  # stopped by SIGTERM: 143, whatever code the exit took on the way
            sys.exit(signals.exit_code())
        raise
