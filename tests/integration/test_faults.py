"""Faults a real engine can be put through on demand: what a cluster does to a sweep.

SIGKILL cannot be caught, so no ``finally`` stops the server: the watchdog between the job and
its server (pipeline/engines/watchdog.py) must. A SIGKILLed Ray worker is test_cluster.py's: a
SIGKILLed Ray Jobs driver takes its task's worker with it, and the worker's server must go too.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests import procs
from tests.cluster import API_SERVER, ENGINE_CORE, served
from tests.integration.conftest import (
    SERVER_PATTERN,
    TEST_SERVER,
    read_until,
    rest_of_output,
    start_sweep,
    vllm_server_pids,
)

pytestmark = pytest.mark.integration

SMALL = [
    *TEST_SERVER,
    "load.num_requests=40",
    "load.min_duration_s=0",
    "load.request_rate=1",
    "load.warmup_requests=1",
    "workload.max_tokens=32",
    "lossless.prompts=0",
]


def _start_until_serving(args: list[str], cwd: Path) -> tuple[subprocess.Popen[str], list[str]]:
    proc = start_sweep(args, cwd)
    seen: list[str] = []
    if read_until(proc, "server ready", seen):
        return proc, seen
    raise AssertionError("the sweep ended before its server became ready:\n" + "".join(seen[-30:]))


def _servers(proc: subprocess.Popen[str]) -> list[psutil.Process]:
    """The server processes below the sweep ``proc`` (watchdog, API server, engine core)."""
    return procs.matching([proc.pid], SERVER_PATTERN)


def _gone_within(servers: list[psutil.Process], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not procs.alive(servers):
            return []
        time.sleep(0.5)
    return [p.pid for p in procs.alive(servers)]


def test_sigkill_of_the_driver_stops_its_server(tmp_path: Path) -> None:
    proc, _ = _start_until_serving([f"hydra.run.dir={tmp_path}/out", "spec=none", "sweep_name=kill9", *SMALL], tmp_path)
    serving = _servers(proc)
    assert serving, "expected the server's processes (API server, engine core) to run"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    left = _gone_within(serving, 60)
    assert not left, f"server processes outlived a SIGKILLed driver: {sorted(left)}"


def _warmed_up(proc: subprocess.Popen[str], requests: int = 1, timeout_s: float = 300) -> None:
    """Until the sweep's server has answered its warm-up request(s) (its own request counter
    says so): the first window starts right after. On a slow machine that takes many seconds.
    After a restart the new server may not listen yet, and the old one may linger a moment."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ports = _api_ports(proc)
        if len(ports) == 1 and served(ports.pop()) >= requests:
            return
        time.sleep(0.5)
    raise AssertionError(f"the warm-up did not finish in {timeout_s:g} s")


def _api_ports(proc: subprocess.Popen[str]) -> set[str]:
    return {
        args[args.index("--port") + 1]
        for args in map(procs.cmdline, procs.matching([proc.pid], API_SERVER))
        if "--port" in args[:-1]
    }


def _next_core(proc: subprocess.Popen[str], old: set[int], timeout_s: float = 300) -> list[psutil.Process]:
    """The engine core of the server the sweep started after ``old``'s (a restart), once there."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        cores = [p for p in procs.matching([proc.pid], ENGINE_CORE) if p.pid not in old]
        if cores:
            return cores
        time.sleep(0.5)
    raise AssertionError(f"no restarted engine core in {timeout_s:g} s")


@pytest.fixture(scope="module")
def faulted(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    """One baseline server measuring three rates, hit twice (the restart costs are the test's):
    its engine core is SIGKILLed a few seconds into the first window (a crash), and the
    restarted server's engine core is SIGSTOPped a few seconds into the second (a hang, which
    only the window deadline ends); the third window runs on a second restart. A decoy that
    looks like someone else's vLLM server on the machine must come through untouched: the
    faults hit this sweep's engine cores only. The log and the runs, by name."""
    from mlflow.tracking import MlflowClient

    tmp_path = tmp_path_factory.mktemp("faults")
    decoy = procs.start_decoy()
    try:
        before = vllm_server_pids()
        args = [
            "-m",
            f"hydra.sweep.dir={tmp_path}/multi",
            "hydra/launcher=basic",
            "spec=none",
            "sweep_name=faults",
            "load.request_rate=1,2,3",
            "load.num_requests=16",
            "load.window_timeout_s=20",
            *[a for a in SMALL if not a.startswith(("load.request_rate", "load.num_requests"))],
        ]
        proc, seen = _start_until_serving(args, tmp_path)
        crashed = procs.matching([proc.pid], ENGINE_CORE)
        assert crashed, "no engine core process found"
        _warmed_up(proc)
        time.sleep(3)  # a few seconds into the first window (16 s long)
        procs.send(crashed, signal.SIGKILL, missing_ok=False)
        hung = _next_core(proc, {p.pid for p in crashed})
        _warmed_up(proc)
        time.sleep(3)  # into the second window
        procs.send(hung, signal.SIGSTOP, missing_ok=False)
        out = rest_of_output(proc)
        assert not vllm_server_pids() - before, "a server outlived the sweep"
        assert procs.untouched(decoy) is None, procs.untouched(decoy)
    finally:
        procs.kill_decoy(decoy)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    experiment = client.get_experiment_by_name("faults")
    assert experiment is not None
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    return "".join(seen) + out + f"\nexit code {proc.returncode}", runs


def test_an_engine_killed_mid_window_fails_that_point_and_is_restarted_for_the_next(
    faulted: tuple[str, dict],
) -> None:
    log, runs = faulted
    assert log.endswith("exit code 3"), log[-3000:]  # a failed point
    (parent,) = [r for r in runs.values() if r.data.tags.get("role") == "sweep"]
    assert parent.data.metrics["server_restarts"] == 2  # once after the crash, once after the hang
    crashed, after = runs["baseline-r1"], runs["baseline-r2"]
    assert crashed.info.status == "FAILED" and "server.fault" in crashed.data.tags
    assert "--- last lines of the server log ---" in crashed.data.tags["error"]
    assert after.data.tags["server.restarts_before"] == "1"  # it ran on the restarted server


def test_an_engine_that_hangs_mid_window_hits_the_window_deadline_and_is_restarted(faulted: tuple[str, dict]) -> None:
    _, runs = faulted
    hung = runs["baseline-r2"]
    assert hung.info.status == "FAILED" and "stopped answering" in hung.data.tags["server.fault"]
    assert "the window deadline of 20 s passed" in hung.data.tags["window.stopped"]
    last = runs["baseline-r3"]
    assert last.info.status == "FINISHED" and last.data.tags["server.restarts_before"] == "2"
    assert last.data.metrics["completed"] > 0


def test_a_full_output_disk_is_one_message_and_exit_4_and_keeps_the_numbers_in_mlflow(tmp_path: Path) -> None:
    """The disk fills under the first point's results: /dev/full answers every write with ENOSPC,
    as a full file system does."""
    from mlflow.tracking import MlflowClient

    before = vllm_server_pids()
    args = [
        "-m",
        f"hydra.sweep.dir={tmp_path}/multi",
        "hydra/launcher=basic",
        "spec=none",
        "sweep_name=full",
        "load.request_rate=1,2",
        "load.num_requests=6",
        *[a for a in SMALL if not a.startswith(("load.request_rate", "load.num_requests"))],
    ]
    proc, seen = _start_until_serving(args, tmp_path)
    (command,) = (tmp_path / "multi").rglob("server_command.txt")
    (command.parent / "baseline-r1").mkdir()
    (command.parent / "baseline-r1" / "requests.csv").symlink_to("/dev/full")
    out = "".join(seen) + rest_of_output(proc)
    assert proc.returncode == 4, out[-3000:]
    assert "the output disk is full (No space left on device writing" in out and "hydra.sweep.dir" in out
    assert "Traceback" not in out, out[-3000:]
    assert not vllm_server_pids() - before, "a server outlived the sweep"
    client = MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    experiment = client.get_experiment_by_name("full")
    assert experiment is not None
    points = {
        r.info.run_name: r
        for r in client.search_runs([experiment.experiment_id])
        if r.data.tags.get("role") == "baseline"
    }
    first, second = points["baseline-r1"], points["baseline-r2"]
    assert first.info.status == "FAILED" and "output disk is full" in first.data.tags["error"]
    assert first.data.metrics["completed"] == 6  # measured, and kept where there was room
    assert second.info.status == "FAILED" and second.data.tags["error"].startswith("not measured: the output disk")
