"""A server process with a lifetime: its own process session, a readiness wait, a clean stop.

Modelled on vLLM's benchmark ``ServerProcess``: the engine runs in a new session so that
the whole process group (API server, engine core, workers) can be signalled at once, and
the readiness wait fails fast when the process dies instead of waiting out the deadline.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import httpx

from pipeline.redact import shell_line

LOG_TAIL_LINES = 40


class ServerError(RuntimeError):
    """The server could not be started or died; carries the tail of its log."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(f"{message}\n--- last lines of the server log ---\n{log_tail}" if log_tail else message)
        self.log_tail = log_tail


@dataclass(frozen=True)
class ServerSpec:
    """Everything needed to launch one server; the same spec serves every rate run against it."""

    engine: str
    engine_version: str
    command: tuple[str, ...]
    host: str
    port: int
    log_path: Path
    startup_timeout_s: float
    # Only the variables we set; the inherited environment is never recorded.
    env: dict[str, str] = field(default_factory=dict)
    health_path: str = "/health"

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def redacted_command(self) -> str:
        """The command as a shell line, secrets masked, for logs and MLflow."""
        return shell_line(self.command)


def free_port(host: str = "127.0.0.1") -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with path.open(errors="replace") as fh:
            return "".join(deque(fh, maxlen=lines))
    except FileNotFoundError:
        return ""


class EngineServer:
    """Runs a :class:`ServerSpec` for the duration of a ``with`` block.

    Entering starts the process and returns once ``/health`` answers 200; leaving, for
    whatever reason (normal exit, an exception, Ctrl-C), stops the whole process group.
    """

    def __init__(self, spec: ServerSpec, poll_s: float = 0.5) -> None:
        self.spec = spec
        self.poll_s = poll_s
        self._proc: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None

    @property
    def base_url(self) -> str:
        return self.spec.base_url

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def niceness(self) -> int | None:
        """The server's CPU priority (0 normal; Ray's workers default to 15, and a server
        started from one inherits it and yields the CPU to Ray's own processes)."""
        if self._proc is None:
            return None
        try:
            return os.getpriority(os.PRIO_PROCESS, self._proc.pid)
        except OSError:
            return None

    def rss_mib(self) -> float | None:
        """Resident memory of the whole server (API server, engine core, workers), in MiB.
        Host memory: on a GPU the weights live in device memory, which this does not see."""
        if self._proc is None:
            return None
        total = 0
        for pid in _live_members(self._proc.pid):
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])  # kB
            except (OSError, ValueError, IndexError):
                continue
        return total / 1024 if total else None

    def __enter__(self) -> EngineServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        self.spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.spec.log_path.open("ab")
        try:
            self._proc = subprocess.Popen(
                list(self.spec.command),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.spec.env},
                start_new_session=True,  # its own process group, so stop() reaches every child
            )
        except FileNotFoundError as exc:
            raise ServerError(f"cannot start {self.spec.engine}: {exc}; check engine.python") from exc
        finally:
            log.close()
        self._started_at = time.monotonic()

    def wait_ready(self) -> None:
        assert self._proc is not None
        deadline = self._started_at + self.spec.startup_timeout_s
        url = self.spec.base_url + self.spec.health_path
        with httpx.Client(timeout=5.0, trust_env=False) as client:
            while True:
                code = self._proc.poll()
                if code is not None:
                    raise ServerError(
                        f"{self.spec.engine} server exited with code {code} during start-up "
                        f"(log: {self.spec.log_path})",
                        log_tail(self.spec.log_path),
                    )
                try:
                    if client.get(url).status_code == 200:
                        self.startup_s = time.monotonic() - self._started_at
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise ServerError(
                        f"{self.spec.engine} server not healthy after {self.spec.startup_timeout_s:.0f} s; "
                        f"raise engine.startup_timeout_s if it is still loading (log: {self.spec.log_path})",
                        log_tail(self.spec.log_path),
                    )
                time.sleep(self.poll_s)

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the process group, SIGKILL whatever is left after ``grace_s``, and return
        only once no process of the group runs: the engine core and workers included."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        pgid = proc.pid  # start_new_session makes the child its group's leader
        _signal_group(pgid, signal.SIGTERM)
        if not _wait_group_gone(proc, pgid, grace_s):
            _signal_group(pgid, signal.SIGKILL)
            if not _wait_group_gone(proc, pgid, 10.0):
                raise ServerError(f"processes of group {pgid} survived SIGKILL: {_live_members(pgid)}")


def _live_members(pgid: int) -> list[int]:
    """Processes of the group that still run (zombies excluded: they have exited)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # /proc/PID/stat: "pid (comm) state ppid pgrp ..."; comm may hold spaces.
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def _wait_group_gone(proc: subprocess.Popen[bytes], pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        proc.poll()  # reap the leader so that it leaves the table
        if not _live_members(pgid):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
