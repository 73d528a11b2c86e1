"""Signals: SIGTERM ends a job through its ``finally`` blocks, like Ctrl-C does."""

from __future__ import annotations

import signal
from typing import Any


def exit_on_sigterm() -> None:
    """Make SIGTERM (what schedulers send) a SystemExit, so every ``finally`` that stops a
    server runs; the default action would end the process on the spot."""

    def _raise(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    try:
        signal.signal(signal.SIGTERM, _raise)
    except ValueError:  # not the main thread: whoever owns it handles signals
        pass
