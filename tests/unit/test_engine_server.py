"""EngineServer's lifetime guarantees, with small scripted processes standing in for vLLM."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pipeline.engines.base import EngineServer, ServerError, ServerSpec
from pipeline.engines.process import free_port
from pipeline.engines.watchdog import KEPT_SERVING

# Serves /health after a delay, and leaves a grandchild running, as vLLM's engine core does.
SERVER = textwrap.dedent(
    """
    import http.server, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(sys.argv[3], "w").write(str(child.pid))
    time.sleep(float(sys.argv[2]))
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a): pass
    print("serving", flush=True)
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
)


def _spec(tmp_path: Path, args: list[str], timeout_s: float = 30.0) -> ServerSpec:
    port = free_port()
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    return ServerSpec(
        engine="fake",
        engine_version="0",
        command=(sys.executable, str(script), str(port), *args),
        host="127.0.0.1",
        port=port,
        log_path=tmp_path / "server.log",
        startup_timeout_s=timeout_s,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it has exited all the same.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def _wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_ready_then_whole_group_stopped(tmp_path: Path) -> None:
    child_file = tmp_path / "child.pid"
    with EngineServer(_spec(tmp_path, ["0.5", str(child_file)]), poll_s=0.05) as server:
        assert server.startup_s is not None and server.startup_s >= 0.5
        leader = server.pid
        child = int(child_file.read_text())
        assert leader is not None and _alive(leader) and _alive(child)
    assert _wait_gone(leader) and _wait_gone(child)


def test_ctrl_c_inside_the_block_still_stops_the_group(tmp_path: Path) -> None:
    child_file = tmp_path / "child.pid"
    with pytest.raises(KeyboardInterrupt):
        with EngineServer(_spec(tmp_path, ["0", str(child_file)]), poll_s=0.05) as server:
            leader = server.pid
            raise KeyboardInterrupt
    assert leader is not None
    assert _wait_gone(leader) and _wait_gone(int(child_file.read_text()))


def test_ctrl_c_while_the_server_is_being_started_stops_what_was_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C that lands inside Popen, after the fork: the server that was started is stopped
    by this object, not left for the watchdog's grace period (seen on a loaded machine)."""
    import signal
    import subprocess

    from pipeline.engines import base

    started: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def interrupted_popen(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        started.append(real_popen(*args, **kwargs))  # type: ignore[call-overload]
        os.kill(os.getpid(), signal.SIGINT)  # the child runs; Popen has not returned yet
        return started[-1]

    monkeypatch.setattr(base.subprocess, "Popen", interrupted_popen)
    child_file = tmp_path / "child.pid"
    with pytest.raises(KeyboardInterrupt):
        with EngineServer(_spec(tmp_path, ["5", str(child_file)]), poll_s=0.05):
            pytest.fail("the block must not be entered")
    assert started and _wait_gone(started[0].pid, 15)
    assert _wait_gone(int(child_file.read_text()), 15) if child_file.exists() else True


def test_process_dying_at_start_fails_fast_with_log_tail(tmp_path: Path) -> None:
    spec = _spec(tmp_path, [])
    spec = ServerSpec(
        **{
            **spec.__dict__,
            "command": (
                sys.executable,
                "-c",
                "import sys; print('error: unrecognized arguments: --bogus'); sys.exit(2)",
            ),
        }
    )
    started = time.monotonic()
    with pytest.raises(ServerError, match="exited with code 2") as info:
        with EngineServer(spec, poll_s=0.05):
            pass
    assert time.monotonic() - started < 10  # not the 30 s deadline
    assert "unrecognized arguments: --bogus" in info.value.log_tail


def test_never_healthy_hits_the_deadline_and_is_stopped(tmp_path: Path) -> None:
    child_file = tmp_path / "child.pid"
    with pytest.raises(ServerError, match="not healthy after 1 s"):
        with EngineServer(_spec(tmp_path, ["600", str(child_file)], timeout_s=1.0), poll_s=0.05):
            pass
    assert _wait_gone(int(child_file.read_text()))


def test_missing_interpreter_is_a_server_error(tmp_path: Path) -> None:
    spec = _spec(tmp_path, [])
    spec = ServerSpec(**{**spec.__dict__, "command": (str(tmp_path / "no-python"), "-m", "vllm")})
    with pytest.raises(ServerError, match="engine.python"):
        with EngineServer(spec):
            pass


def test_redacted_command_masks_api_key(tmp_path: Path) -> None:
    spec = _spec(tmp_path, ["--api-key", "sk-secret-value"])
    assert "sk-secret-value" not in spec.redacted_command()


def test_niceness_is_the_servers_own(tmp_path: Path) -> None:
    # A server started from a Ray worker inherits its niceness (15 by default): it must be seen.
    spec = _spec(tmp_path, ["0", str(tmp_path / "child.pid")])
    niced = ServerSpec(**{**spec.__dict__, "command": ("nice", "-n", "7", *spec.command)})
    with EngineServer(niced, poll_s=0.05) as server:
        assert server.niceness() == os.getpriority(os.PRIO_PROCESS, 0) + 7
    assert server.niceness() is None


# The parent that starts the server, SIGKILLed by the test: nothing may outlive it.
PARENT = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from pipeline.engines.base import EngineServer, ServerSpec
    spec = ServerSpec(**{**json.loads(sys.argv[1]), "log_path": Path(sys.argv[2])})
    with EngineServer(spec, poll_s=0.05, grace_s=2) as server:
        print(server.pid, flush=True)
        time.sleep(600)
    """
)


def test_sigkill_of_the_parent_stops_the_server_and_its_children(tmp_path: Path) -> None:
    import json
    import signal
    import subprocess

    child_file = tmp_path / "child.pid"
    spec = _spec(tmp_path, ["0", str(child_file)])
    fields = {k: v for k, v in spec.__dict__.items() if k != "log_path"}
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, json.dumps(fields), str(spec.log_path)], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    watchdog = int(parent.stdout.readline())  # the server is ready
    grandchild = int(child_file.read_text())
    assert _alive(watchdog) and _alive(grandchild)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert _wait_gone(grandchild, 15) and _wait_gone(watchdog, 15)


def test_a_server_started_from_a_thread_outlives_the_thread(tmp_path: Path) -> None:
    """Linux sends the watchdog's death signal when the thread that forked it ends, with this
    process alive: the server serves on (two servers started at once from a thread pool were
    stopped as soon as the pool's threads ended), and its stop still reaches the whole group."""
    import threading

    child_file = tmp_path / "child.pid"
    server = EngineServer(_spec(tmp_path, ["0", str(child_file)]), poll_s=0.05)
    starter = threading.Thread(target=server.__enter__)
    starter.start()
    starter.join(timeout=30)
    assert not starter.is_alive() and server.pid is not None
    child = int(child_file.read_text())
    try:
        # The thread's end sent the watchdog its death signal: wait for its judgement, in the log.
        log = tmp_path / "server.log"
        deadline = time.monotonic() + 30
        while KEPT_SERVING not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert KEPT_SERVING in log.read_text(), log.read_text()[-2000:]
        assert server.alive() and server.healthy(), log.read_text()[-2000:]
        assert _alive(child)
    finally:
        leader = server.pid
        server.stop()
    assert _wait_gone(leader) and _wait_gone(child)


def test_a_sigkilled_watchdog_still_stops_its_server(tmp_path: Path) -> None:
    """A Ray worker whose raylet died SIGKILLs its children, the watchdog among them: the
    server's own death signal (SIGTERM) stops it; vLLM then stops its engine core and workers."""
    import json
    import signal
    import subprocess

    import psutil

    spec = _spec(tmp_path, ["0", str(tmp_path / "child.pid")])
    fields = {k: v for k, v in spec.__dict__.items() if k != "log_path"}
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, json.dumps(fields), str(spec.log_path)], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    watchdog = int(parent.stdout.readline())
    (server,) = psutil.Process(watchdog).children()
    os.kill(watchdog, signal.SIGKILL)
    try:
        assert _wait_gone(server.pid, 15), "the server outlived its SIGKILLed watchdog"
    finally:
        parent.kill()
        parent.wait()


def test_watchdog_passes_on_the_servers_exit_code(tmp_path: Path) -> None:
    import subprocess

    command = [
        sys.executable,
        "-m",
        "pipeline.engines.watchdog",
        "--parent",
        str(os.getpid()),
        "--",
        sys.executable,
        "-c",
        "import sys; sys.exit(3)",
    ]
    assert subprocess.run(command, timeout=30).returncode == 3


PORT_TAKER = textwrap.dedent(
    """
    import http.server, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers()
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()  # OSError: [Errno 98] Address already in use
    """
)


def test_a_port_taken_before_the_server_binds_it_is_retried_on_a_new_port(tmp_path: Path) -> None:
    import socket

    script = tmp_path / "taker.py"
    script.write_text(PORT_TAKER)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        spec = ServerSpec(
            "fake",
            "0",
            (sys.executable, str(script), "--port", str(taken)),
            "127.0.0.1",
            taken,
            tmp_path / "server.log",
            30.0,
        )
        with EngineServer(spec, poll_s=0.05) as server:
            assert server.spec.port != taken and server.base_url.endswith(f":{server.spec.port}")
        assert "Address already in use" in spec.log_path.read_text()


def test_other_start_failures_are_not_retried(tmp_path: Path) -> None:
    spec = ServerSpec(
        "fake",
        "0",
        (sys.executable, "-c", "import sys; print('bad flag'); sys.exit(2)", "--port", "1"),
        "127.0.0.1",
        1,
        tmp_path / "server.log",
        30.0,
    )
    with pytest.raises(ServerError, match="exited with code 2"):
        with EngineServer(spec, poll_s=0.05):
            pass
    assert spec.log_path.read_text().count("bad flag") == 1  # one start only


def test_the_watchdog_sigkills_a_server_that_ignores_sigterm_once_its_grace_is_over(tmp_path: Path) -> None:
    import signal
    import subprocess

    import psutil

    ready = tmp_path / "ready"
    stubborn = (
        f"import pathlib, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"pathlib.Path({str(ready)!r}).write_text('up'); time.sleep(600)"
    )
    watchdog = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline.engines.watchdog",
            "--parent",
            str(os.getpid()),
            "--grace",
            "2",
            "--",
            sys.executable,
            "-c",
            stubborn,
        ]
    )
    server = None
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert time.monotonic() < deadline and watchdog.poll() is None, "the server never came up"
            time.sleep(0.05)
        (server,) = psutil.Process(watchdog.pid).children()
        watchdog.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert _alive(server.pid), "the server should ignore SIGTERM: this test needs the grace to run out"
        assert watchdog.wait(timeout=30) == 128 + signal.SIGTERM
        assert _wait_gone(server.pid, 10), "the server outlived the watchdog's grace"
    finally:  # only what this test started: its watchdog and that watchdog's server
        for proc in (watchdog, server):
            if proc is not None and _alive(proc.pid):
                proc.kill()


def test_device_memory_is_the_servers_own_processes_from_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nvidia-smi lists every process on the GPUs; only the server's own tree is counted (here
    a stand-in nvidia-smi on PATH, since this machine has no GPU)."""
    from pipeline.engines.hardware import gpu_memory_mib, parse_compute_apps

    text = "101, 40000\n102, 1200\n999, 70000\n103, [N/A]\n"
    assert parse_compute_apps(text, {101, 102, 103}) == 41200
    assert parse_compute_apps(text, {5}) is None
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\nprintf '{text.replace(chr(10), chr(92) + 'n')}'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert gpu_memory_mib({101, 999}) == 110000
    assert gpu_memory_mib(set()) is None
