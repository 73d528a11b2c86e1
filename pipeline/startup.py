"""One set-up for every process that runs specsweep code; nothing here runs at import.

Each entry point (``pipeline.sweep`` and the sweeper Hydra hands a multirun to, report, gate,
sync, ui) calls :func:`begin` first: SIGTERM unwinds like Ctrl-C, logging never raises, and,
where the entry knows it, how loud the libraries are (:func:`configure`). The sweep knows that
only once its config is read, so its driver and each group's worker call :func:`configure`
then. Quiet by default: MLflow draws a progress bar per artifact download (a dozen while the
report is built), matplotlib announces its font cache at INFO (Hydra sets the root logger to
INFO), and Ray notes its own state on every start. ``verbose=true`` keeps all of it. The
server's log goes to its file either way. Imports only the exit codes of the pipeline: every
layer may call it.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

from pipeline.exitcode import signal_exit_code

# Loggers that speak about themselves, not about the sweep, and the level they keep. Ray's
# token-auth notice is a WARNING on every start ("Token authentication is enabled ...").
_CHATTY = {
    "matplotlib": logging.WARNING,
    "alembic": logging.WARNING,
    "ray._private.authentication.authentication_token_setup": logging.ERROR,
}
# MLflow retries a write to an unreachable server for minutes by default; a sweep journals the
# write instead (pipeline/record/journal.py) and keeps measuring, so a few seconds of retries do.
_MLFLOW_RETRIES = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}

_begun = False
_received: int | None = None


def begin(verbose: bool | None) -> None:
    """This process's set-up, the first call of every entry point. ``verbose=None``: the entry
    has not read its config yet (the sweep's), and :func:`configure` follows once it has."""
    global _begun
    _begun = True
    exit_on_sigterm()
    logging.raiseExceptions = False  # a log file on a full disk: no traceback per line
    # Hydra sets the root logger to INFO; a line per HTTP request buries the progress bar.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if verbose is not None:
        configure(verbose)


def begun() -> bool:
    """Whether :func:`begin` ran: our own code has begun, so an exit is no longer Hydra's."""
    return _begun


def configure(verbose: bool) -> None:
    """Read by MLflow at each request and download, and inherited by the workers of a Ray
    started from this process; a value the user set in the environment wins."""
    for name, value in _MLFLOW_RETRIES.items():
        os.environ.setdefault(name, value)
    if verbose:
        return
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    for name, level in _CHATTY.items():
        logging.getLogger(name).setLevel(level)


def exit_on_sigterm() -> None:
    """Make SIGTERM (what schedulers send) a SystemExit, so every ``finally`` that stops a
    server runs; the default action would end the process on the spot. Called again after
    ``ray.init``, which takes SIGTERM over."""

    def _raise(signum: int, frame: Any) -> None:
        global _received
        _received = signum
        raise SystemExit(signal_exit_code(signum))

    try:
        signal.signal(signal.SIGTERM, _raise)
    except ValueError:  # not the main thread: whoever owns it handles signals
        pass


def exit_code() -> int | None:
    """The code of the signal that ended this process through :func:`exit_on_sigterm`, if one did.
    Ray's ``ray.get`` turns the SystemExit raised inside it into one of code 1, so the
    entry point reads the code from here."""
    return None if _received is None else signal_exit_code(_received)
