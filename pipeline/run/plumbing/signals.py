"""Signals: SIGTERM ends a job through its ``finally`` blocks, like Ctrl-C does."""

from __future__ import annotations

import signal
from typing import Any

_received: int | None = None


def exit_on_sigterm() -> None:
    """Make SIGTERM (what schedulers send) a SystemExit, so every ``finally`` that stops a
    server runs; the default action would end the process on the spot."""

    def _raise(signum: int, frame: Any) -> None:
        global _received
        _received = signum
        raise SystemExit(128 + signum)

    try:
        signal.signal(signal.SIGTERM, _raise)
    except ValueError:  # not the main thread: whoever owns it handles signals
        pass


def exit_code() -> int | None:
    """128 + the signal that ended this process through :func:`exit_on_sigterm`, if one did.
    Ray's ``ray.get`` turns the SystemExit raised inside it into one of code 1, so the
    entry point reads the code from here."""
    return None if _received is None else 128 + _received
