from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import procs

REPO = Path(__file__).resolve().parents[2]
SERVER_PATTERN = procs.SERVER_PATTERN
# Every test server: float32 (greedy outputs then match exactly; bf16 may differ by numerics) and
# a 1 GiB KV cache (~23k float32 tokens, far more than any test window holds), which vLLM
# allocates and profiles in about half the time of the default 2 GiB (4.3 s against 9 s here).
#
# VLLM_ENABLE_V1_MULTIPROCESSING=0 runs the model in the engine core's own process instead of a
# worker process of its own: two processes (API server, engine core) instead of three, each of
# which imports all of vLLM (~9 s here). A start took 30-32 s and takes 22-24 s (measured with
# the test servers' settings, two starts each). The tests of a server's process group still see a
# group (the API server and its engine core); benchmarks/ measure vLLM as users run it, without it.
FAST_START = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
TEST_SERVER = [
    "engine.dtype=float32",
    "engine.cpu_kvcache_gib=1",
    *(f"+engine.env.{k}={v}" for k, v in FAST_START.items()),
]


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


def read_until(proc: subprocess.Popen[str], marker: str | None, seen: list[str], timeout_s: float = 600) -> bool:
    """Read ``proc``'s output into ``seen`` until a line contains ``marker`` (True), the output
    ends (False; ``marker=None`` reads to the end), or ``timeout_s`` passes (AssertionError, with
    the process killed): a server that never becomes ready fails its test in minutes, not at the
    suite's timeout."""
    import queue
    import threading

    assert proc.stdout is not None
    lines: queue.Queue[str | None] = getattr(proc, "_lines", None) or queue.Queue()
    if not hasattr(proc, "_lines"):  # one reader per process, kept for later calls
        proc._lines = lines  # type: ignore[attr-defined]

        def pump() -> None:
            for line in proc.stdout:  # type: ignore[union-attr]
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if line is None:
            lines.put(None)
            return False
        seen.append(line)
        if marker is not None and marker in line:
            return True
    proc.kill()
    waited = f"no {marker!r}" if marker else "no end of the output"
    raise AssertionError(f"{waited} within {timeout_s:g} s:\n" + "".join(seen[-30:]))


def rest_of_output(proc: subprocess.Popen[str], timeout_s: float = 600) -> str:
    """What ``proc`` prints until it exits (after :func:`read_until`), within ``timeout_s``."""
    seen: list[str] = []
    read_until(proc, None, seen, timeout_s)
    proc.wait(timeout=60)
    return "".join(seen)


def start_sweep(args: list[str], cwd: Path, ctrl_c: bool = False) -> subprocess.Popen[str]:
    """``python -m pipeline.sweep`` with its output (stdout and stderr) on one text pipe.
    ``ctrl_c``: SIGINT at its default in the sweep, for a test that sends it. A suite started in
    the background by a non-interactive shell inherits SIGINT ignored, and Python keeps an
    ignored SIGINT ignored: the Ctrl-C case would test nothing."""
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline.sweep", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_sigint_default if ctrl_c else None,
    )


def _sigint_default() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def sigterm_once_serving(
    args: list[str], cwd: Path, timeout: float = 180, sig: int | None = None, moment: str = "server ready"
) -> subprocess.CompletedProcess[str]:
    """Start the entry point, wait until a server is ready (or the output line ``moment``: "server
    starting"), then send what a scheduler sends (SIGTERM), or ``sig`` (SIGINT: Ctrl-C)."""
    import signal

    proc = start_sweep(args, cwd, ctrl_c=sig == signal.SIGINT)
    seen: list[str] = []
    read_until(proc, moment, seen)
    assert procs.matching([proc.pid], SERVER_PATTERN), "expected a running server before the signal:\n" + "".join(
        seen[-20:]
    )
    proc.send_signal(sig or signal.SIGTERM)
    out = rest_of_output(proc, timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(seen) + out, "")
