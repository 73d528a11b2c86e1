from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import procs

REPO = Path(__file__).resolve().parents[2]
SERVER_PATTERN = procs.SERVER_PATTERN


@pytest.fixture(scope="package", autouse=True)
def _tracked() -> Iterator[None]:
    """Every process these tests start is tracked from the start (see tests/procs.py), so
    that one orphaned between two looks at it is still known to be ours."""
    procs.tracker().start()
    yield
    procs.tracker().stop()


def vllm_server_pids() -> set[int]:
    """The vLLM server processes (API servers, engine cores, workers) this test run started
    and that still run: descendants of this process, or of a cluster it made, including
    those whose parent has died since. Never another server on the machine."""
    return {p.pid for p in procs.tracker().processes(SERVER_PATTERN)}


@pytest.fixture()
def no_leftover_servers() -> Iterator[None]:
    before = vllm_server_pids()
    yield
    leftover = vllm_server_pids() - before
    details = {pid: _describe(pid) for pid in sorted(leftover)}
    assert not leftover, f"server processes outlived the job: {details}"


def _describe(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "gone"
    return f"{stat[:120]} | {cmdline[:200]}"


def run_sweep(project: Path, *overrides: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """The real entry point, in a subprocess, with ``project`` as the working directory."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline.sweep", f"hydra.run.dir={project}/out", *overrides],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def sigterm_once_serving(args: list[str], cwd: Path, timeout: float = 180, sig: int | None = None
                         ) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """Start the entry point, wait until a server is ready, then send what a scheduler sends
    (SIGTERM), or ``sig`` (SIGINT: Ctrl-C)."""
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.sweep", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    seen: list[str] = []
    for line in proc.stdout:
        seen.append(line)
        if "server ready" in line:
            break
    assert procs.matching([proc.pid], SERVER_PATTERN), "expected a running server before the signal:\n" + "".join(
        seen[-20:]
    )
    proc.send_signal(sig or signal.SIGTERM)
    out, _ = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(seen) + (out or ""), "")
