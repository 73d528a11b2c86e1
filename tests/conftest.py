"""Test-wide rules: a test under tests/integration/ is an integration test, whatever its file says."""

from __future__ import annotations

from pathlib import Path

import pytest

INTEGRATION = Path(__file__).resolve().parent / "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # By folder, so that `make test-unit` (-m "not integration") never starts a real server
    # because a new file forgot its pytestmark.
    for item in items:
        if INTEGRATION in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.integration)
