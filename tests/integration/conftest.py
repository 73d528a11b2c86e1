from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The API server, and the engine-core and worker processes it spawns (named by setproctitle).
SERVER_PATTERN = "vllm.entrypoints.openai.api_server|VLLM::"


def vllm_server_pids() -> set[int]:
    out = subprocess.run(["pgrep", "-f", SERVER_PATTERN], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


@pytest.fixture()
def no_leftover_servers() -> Iterator[None]:
    before = vllm_server_pids()
    yield
    leftover = vllm_server_pids() - before
    assert not leftover, f"server processes outlived the job: {sorted(leftover)}"


def run_sweep(project: Path, *overrides: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """The real entry point, in a subprocess, with ``project`` as the working directory."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline.sweep", f"hydra.run.dir={project}/out", *overrides],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
