from __future__ import annotations

import logging
import os

import pytest

from pipeline import startup

AUTH_NOTICE = "ray._private.authentication.authentication_token_setup"


def test_quiet_by_default_and_verbose_keeps_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    environ = {k: v for k, v in os.environ.items() if k != "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"}
    monkeypatch.setattr(os, "environ", environ)
    for name in ("matplotlib", AUTH_NOTICE):
        monkeypatch.setattr(logging.getLogger(name), "level", logging.NOTSET)
    startup.configure(verbose=True)
    assert "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR" not in environ
    assert logging.getLogger("matplotlib").level == logging.NOTSET
    startup.configure(verbose=False)
    assert environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] == "false"  # MLflow's download bars
    assert logging.getLogger("matplotlib").level == logging.WARNING  # "generated new fontManager" is INFO
    assert logging.getLogger(AUTH_NOTICE).level == logging.ERROR  # Ray's token-auth WARNING on every start
