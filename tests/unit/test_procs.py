"""The tests' fault helpers touch only what a test started: a decoy that looks like someone
else's vLLM server on the machine (API server and engine core, on a port that answers
/health) comes through every one of them alive and running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import psutil
import pytest

from tests import cluster, procs
from tests.procs import SERVER_PATTERN

# A stand-in for a vLLM API server: answers /health on --port, and has an "engine core" child.
FAKE_SERVER = r"""
import http.server, subprocess, sys
port = int(sys.argv[sys.argv.index("--port") + 1])

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass

server = http.server.HTTPServer(("127.0.0.1", port), Health)
core = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "VLLM::" + "EngineCore"])
print(core.pid, flush=True)
server.serve_forever()
"""
# A stand-in for a sweep: starts the server, says the pids, waits.
FAKE_SWEEP = r"""
import subprocess, sys
server = subprocess.Popen([sys.executable, "-c", sys.argv[1], "vllm.entrypoints.openai.api_server", "--port",
                           sys.argv[2]], stdout=subprocess.PIPE, text=True)
print(server.pid, server.stdout.readline().strip(), flush=True)
server.wait()
"""


@dataclass
class Sweep:
    root: subprocess.Popen[str]
    server: psutil.Process
    core: psutil.Process
    port: int


@pytest.fixture()
def sweep() -> Iterator[Sweep]:
    port = cluster.free_port()
    root = subprocess.Popen(
        [sys.executable, "-c", FAKE_SWEEP, FAKE_SERVER, str(port)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert root.stdout is not None
        server, core = (psutil.Process(int(p)) for p in root.stdout.readline().split())
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.05)
        yield Sweep(root, server, core, port)
    finally:
        try:
            os.killpg(root.pid, signal.SIGKILL)  # the whole fake tree: its own process group
        except ProcessLookupError:
            pass
        root.wait(timeout=10)


@pytest.fixture()
def decoy(sweep: Sweep) -> Iterator[subprocess.Popen[bytes]]:
    """On the fake server's port, so that it looks ready too; started before any helper runs."""
    proc = procs.start_decoy(sweep.port)
    try:
        deadline = time.monotonic() + 10
        while "VLLM::EngineCore" not in " ".join(procs.cmdline(psutil.Process(proc.pid))):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        yield proc
    finally:
        procs.kill_decoy(proc)


def _pids(found: list[psutil.Process]) -> set[int]:
    return {p.pid for p in found}


def _wait_gone(proc: psutil.Process) -> None:
    """Until it has exited (a zombie its fake parent never reaps counts as exited)."""
    deadline = time.monotonic() + 10
    while procs.running(proc):
        assert time.monotonic() < deadline, proc
        time.sleep(0.01)


def test_matching_finds_the_sweeps_engine_core_and_a_fault_hits_it_alone(
    sweep: Sweep, decoy: subprocess.Popen[bytes]
) -> None:
    assert _pids(procs.descendants(sweep.root.pid)) == {sweep.server.pid, sweep.core.pid}
    assert _pids(procs.matching([sweep.root.pid], SERVER_PATTERN)) == {sweep.server.pid, sweep.core.pid}
    cores = procs.matching([sweep.root.pid], "VLLM::EngineCore")  # what test_faults hits
    assert _pids(cores) == {sweep.core.pid}
    procs.send(cores, signal.SIGSTOP, missing_ok=False)
    try:
        deadline = time.monotonic() + 5
        while sweep.core.status() != psutil.STATUS_STOPPED:
            assert time.monotonic() < deadline, sweep.core.status()
            time.sleep(0.01)
        assert procs.untouched(decoy) is None, procs.untouched(decoy)
    finally:
        procs.send(cores, signal.SIGCONT)
    procs.send(cores, signal.SIGKILL, missing_ok=False)
    _wait_gone(sweep.core)
    assert procs.untouched(decoy) is None, procs.untouched(decoy)


def test_the_tracker_keeps_what_a_killed_sweep_left_and_never_sees_the_decoy(
    sweep: Sweep, decoy: subprocess.Popen[bytes]
) -> None:
    tracker = procs.Tracker([sweep.root.pid])
    assert _pids(tracker.processes(SERVER_PATTERN)) == {sweep.server.pid, sweep.core.pid}
    sweep.root.kill()  # the server is orphaned: no longer anyone's descendant of ours
    sweep.root.wait(timeout=10)
    assert sweep.server.ppid() != sweep.root.pid
    assert _pids(tracker.processes(SERVER_PATTERN)) == {sweep.server.pid, sweep.core.pid}  # still ours
    assert decoy.pid not in _pids(tracker.processes())
    sweep.core.kill()
    _wait_gone(sweep.core)
    assert _pids(tracker.processes(SERVER_PATTERN)) == {sweep.server.pid}
    assert procs.untouched(decoy) is None, procs.untouched(decoy)


def test_stutter_pauses_the_servers_below_its_roots_and_no_other(sweep: Sweep, decoy: subprocess.Popen[bytes]) -> None:
    seen: dict[str, set[str]] = {"server": set(), "core": set(), "decoy": set()}
    watched = {"server": sweep.server, "core": sweep.core, "decoy": psutil.Process(decoy.pid)}
    with cluster.stutter(lambda: [sweep.root.pid], paused=0.5, period_s=0.2):
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            for name, proc in watched.items():
                seen[name].add(proc.status())
            time.sleep(0.005)
    assert psutil.STATUS_STOPPED in seen["server"] and psutil.STATUS_STOPPED in seen["core"], seen
    assert psutil.STATUS_STOPPED not in seen["decoy"], seen
    assert procs.untouched(decoy) is None, procs.untouched(decoy)
    for proc in (sweep.server, sweep.core):  # and the sweep's own server runs again
        assert proc.status() != psutil.STATUS_STOPPED
