"""One set-up for every process that runs specsweep code; nothing here runs at import.

Each entry point (the sweep's driver, a group's worker, report, gate, sync, ui) calls
:func:`configure` first. It sets what MLflow reads from the environment and how loud the
libraries are. Quiet by default: MLflow draws a progress bar per artifact download (a dozen
while the report is built), matplotlib announces its font cache at INFO (Hydra sets the root
logger to INFO), and Ray notes its own state on every start. ``verbose=true`` keeps all of it.
The server's log goes to its file either way. Imports nothing of the pipeline: every layer may
call it.
"""

from __future__ import annotations

import logging
import os

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
