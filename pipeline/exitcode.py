"""The exit codes of every command (sweep, gate, sync, report): one table, the README's.

A scheduler or a CI job branches on these, so each number has one meaning across commands.
"""

from __future__ import annotations

import signal
from enum import IntEnum


def signal_exit_code(signum: int) -> int:
    """The code of a process a signal ended, as a shell reports it: 128 + the signal's number."""
    return 128 + signum


class ExitCode(IntEnum):
    OK = 0  # done; with the gate on: pass, or improved
    REGRESSED = 1  # the gate found a regression (confirmed, with gate.confirm=true)
    BAD_INPUT = 2  # refused before any server starts; the message names the fix
    # No whole answer: a point failed (its error is in its run), or the gate has too little
    # history to judge. Measured results are kept either way.
    INCOMPLETE = 3
    INFRA = 4  # the tracking server or the Ray cluster does not answer, or the disk is full
    INTERRUPTED = signal_exit_code(signal.SIGINT)  # Ctrl-C: every server stopped, finished points kept
    TERMINATED = signal_exit_code(signal.SIGTERM)  # SIGTERM (a scheduler's stop): the same


def sweep_exit(gate: int, failed: int) -> int:
    """A sweep's code from its gate's and its failed points: a regression the gate found in what
    was measured stands (1), whatever else failed; otherwise a failed point leaves the sweep
    incomplete (3), a pass included: what failed may be what would have regressed."""
    if gate == ExitCode.REGRESSED or not failed:
        return gate
    return ExitCode.INCOMPLETE
