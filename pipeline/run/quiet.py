"""Quiet by default: what libraries print on their own stays out of the sweep's terminal.

MLflow draws a progress bar per artifact download (a dozen while the report is built),
matplotlib announces its font cache at INFO (Hydra sets the root logger to INFO), and Ray
notes its own state on every start. The server's log goes to its file either way.
``verbose=true`` keeps all of it.
"""

from __future__ import annotations

import logging
import os

# Loggers that speak about themselves, not about the sweep, and the level they keep. Ray's
# token-auth notice is a WARNING on every start ("Token authentication is enabled ...").
_CHATTY = {"matplotlib": logging.WARNING, "alembic": logging.WARNING,
           "ray._private.authentication.authentication_token_setup": logging.ERROR}  # fmt: skip


def apply(verbose: bool) -> None:
    if verbose:
        return
    # Read by MLflow at each download, and inherited by the workers of a Ray started from here.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    for name, level in _CHATTY.items():
        logging.getLogger(name).setLevel(level)
