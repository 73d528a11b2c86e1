"""The sweep's entry point, around Hydra: a command line Hydra cannot compose is bad input.

Hydra reports an override it cannot apply (an unknown key, a value of the wrong type, a config
group option that does not exist) and exits 1, the code of a crash. Before our own code has
started, nothing else can end the process with 1, so that exit becomes 2, with the fix.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from pipeline import startup
from pipeline.exitcode import ExitCode


def run_command(main: Callable[[], object]) -> None:
    try:
        main()
    except SystemExit as exc:
        if exc.code == 1 and not startup.begun():  # the code Hydra hands over to begins with it
            print(
                "error: the command line could not be composed into a config (Hydra's message is above); check "
                "the key and group names and the value types (`python -m pipeline.sweep --cfg job` prints the "
                "config with every key)",
                file=sys.stderr,
            )
            sys.exit(ExitCode.BAD_INPUT)
        if startup.exit_code() is not None:  # stopped by SIGTERM: 143, whatever code the exit took on the way
            sys.exit(startup.exit_code())
        raise
