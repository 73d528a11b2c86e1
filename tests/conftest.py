"""Test-wide rules.

- A test under tests/integration/ is an integration test, whatever its file says.
- The session runs in a home of its own: HOME, TMPDIR, the model cache (``SPECSWEEP_CACHE``)
  and Ray's temp dir all point into folders made for this session, so that a test run reads
  nothing a developer's earlier runs left (a built model, a Ray token, MLflow's config) and
  leaves nothing behind in theirs. Every process the tests start inherits them. The embedded
  model is built once per session, in the session's cache, by the first test that needs it.
- Under pytest-xdist (``make test-unit`` runs the unit tests on both cores) the workers are
  part of their controller's session: they inherit its home and make none of their own.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.tmpdirs import outside_tmpdir

INTEGRATION = Path(__file__).resolve().parent / "integration"

# Set for the session, removed with it. Ray's sockets live under its temp dir and a Unix
# socket path holds ~107 characters, so Ray gets a short folder of its own under /tmp.
_ISOLATED = ("HOME", "TMPDIR", "SPECSWEEP_CACHE", "RAY_TMPDIR", "XDG_CACHE_HOME", "MPLCONFIGDIR")
_saved: dict[str, str | None] = {}
_made: list[Path] = []


def pytest_configure(config: pytest.Config) -> None:
    if _made:  # pytest_configure runs once per session; a re-entrant call (pytester) keeps the first
        return
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the controller made the session's home: inherited
        return
    root = Path(tempfile.mkdtemp(prefix="sst", dir=os.environ.get("TMPDIR") or "/tmp"))
    ray_tmp = outside_tmpdir("ssr")
    _made.extend([root, ray_tmp])
    home = root / "home"
    values = {
        "HOME": home,
        "TMPDIR": root / "tmp",
        "SPECSWEEP_CACHE": root / "cache",
        "RAY_TMPDIR": ray_tmp,
        "XDG_CACHE_HOME": home / ".cache",
        "MPLCONFIGDIR": home / ".config" / "matplotlib",
    }
    for name in _ISOLATED:
        _saved[name] = os.environ.get(name)
        Path(values[name]).mkdir(parents=True, exist_ok=True)
        os.environ[name] = str(values[name])
    tempfile.tempdir = None  # tempfile caches the temp dir it found first: look again
    # No test reaches a model hub (none is reachable from these machines): a hub id's commit is
    # looked up in the cache alone, and found in none.
    _saved.setdefault("HF_HUB_OFFLINE", os.environ.get("HF_HUB_OFFLINE"))
    os.environ["HF_HUB_OFFLINE"] = "1"


def pytest_unconfigure(config: pytest.Config) -> None:
    for name, value in _saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    tempfile.tempdir = None
    for folder in _made:
        shutil.rmtree(folder, ignore_errors=True)
    _made.clear()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # By folder, so that `make test-unit` (-m "not integration") never starts a real server
    # because a new file forgot its pytestmark.
    for item in items:
        if INTEGRATION in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.integration)
