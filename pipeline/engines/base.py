"""A server process with a lifetime: its own process session, a readiness wait, a clean stop.

Modelled on vLLM's benchmark ``ServerProcess``: the engine runs in a new session so that
the whole process group (API server, engine core, workers) can be signalled at once, and
the readiness wait fails fast when the process dies instead of waiting out the deadline.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Protocol

import httpx

from pipeline.config import EngineConfig
from pipeline.engines.process import free_port, log_tail, port_taken, signal_group, signals_deferred, wait_group_gone
from pipeline.engines.watchdog import live_members
from pipeline.redact import shell_line

PORT_RETRIES = 3  # a start that lost its port to another process is retried on a new one


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
    # Variables passed on from this process's environment at start, by name; their values are
    # never part of the spec, so no record of it can hold them.
    env_from: tuple[str, ...] = ()

    @classmethod
    def for_engine(
        cls, engine: EngineConfig, version: str, command: Sequence[str], env: dict[str, str], port: int, log_path: Path
    ) -> ServerSpec:
        """A server this sweep starts, with the engine settings every engine shares."""
        return cls(
            engine=engine.name,
            engine_version=version,
            command=tuple(command),
            host=engine.host,
            port=port,
            log_path=log_path,
            startup_timeout_s=engine.startup_timeout_s,
            env=env,
            env_from=tuple(engine.env_from),
        )

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def with_port(self, port: int) -> ServerSpec:
        """The same server on another port (``--port`` in its command, as vLLM and SGLang take it)."""
        command = list(self.command)
        if "--port" not in command:
            raise ValueError(f"{self.engine}'s command has no --port to change")
        command[command.index("--port") + 1] = str(port)
        return dataclasses.replace(self, command=tuple(command), port=port)

    def redacted_command(self) -> str:
        """The command as a shell line, secrets masked, for logs and MLflow."""
        return shell_line(self.command)


class Server(Protocol):
    """What a measurement needs of a server: :class:`EngineServer`, one this process started, or
    :class:`~pipeline.engines.external.ExternalServer`, one that already ran."""

    spec: ServerSpec
    startup_s: float | None

    @property
    def base_url(self) -> str: ...
    @property
    def returncode(self) -> int | None: ...
    def alive(self) -> bool: ...
    def healthy(self, timeout_s: float = 10.0) -> bool: ...
    def restart(self) -> None: ...
    def rss_mib(self) -> float | None: ...
    def gpu_memory_mib(self) -> float | None: ...
    def niceness(self) -> int | None: ...


def inherited(names: tuple[str, ...]) -> dict[str, str]:
    """engine.env_from's values, from this process's environment."""
    missing = [n for n in names if n not in os.environ]
    if missing:
        raise ServerError(
            f"engine.env_from names {', '.join(missing)}, which this process's environment lacks; "
            f"export it where the server starts (on a cluster: every node)"
        )
    return {n: os.environ[n] for n in names}


class EngineServer:
    """Runs a :class:`ServerSpec` for the duration of a ``with`` block.

    Entering starts the process and returns once ``/health`` answers 200; leaving, for
    whatever reason (normal exit, an exception, Ctrl-C), stops the whole process group.
    """

    def __init__(self, spec: ServerSpec, poll_s: float = 0.5, watchdog: bool = True, grace_s: float = 20.0) -> None:
        self.spec = spec
        self.poll_s = poll_s
        self.watchdog = watchdog
        self.grace_s = grace_s
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
        pid = self._server_pid()
        if pid is None:
            return None
        try:
            return os.getpriority(os.PRIO_PROCESS, pid)
        except OSError:
            return None

    def _server_pid(self) -> int | None:
        """The server's own process: the watchdog's child, where there is a watchdog."""
        if self._proc is None or not self.watchdog:
            return self._proc.pid if self._proc else None
        leader = self._proc.pid
        for pid in live_members(leader):
            try:
                if int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) == leader:
                    return pid
            except (OSError, IndexError, ValueError):
                continue
        return None

    def rss_mib(self) -> float | None:
        """Resident memory of the whole server (API server, engine core, workers), in MiB.
        Host memory: on a GPU the weights live in device memory, which this does not see."""
        if self._proc is None:
            return None
        total = 0
        # The watchdog (the group's leader) is ours, not the server's.
        for pid in (p for p in live_members(self._proc.pid) if not (self.watchdog and p == self._proc.pid)):
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])  # kB
            except (OSError, ValueError, IndexError):
                continue
        return total / 1024 if total else None

    def gpu_memory_mib(self) -> float | None:
        """Device memory the server's own processes hold (nvidia-smi), in MiB; None on a CPU."""
        from pipeline.engines.hardware import gpu_memory_mib

        if self._proc is None:
            return None
        return gpu_memory_mib(set(live_members(self._proc.pid)))

    def __enter__(self) -> EngineServer:
        # free_port() only finds a port free at that moment: another process can take it before
        # the server binds it. That start is retried on a new port; no other start failure is.
        for attempt in range(PORT_RETRIES + 1):
            offset = self.spec.log_path.stat().st_size if self.spec.log_path.is_file() else 0
            try:
                # Inside the try: a Ctrl-C or SIGTERM that lands while the server is being
                # started stops what was started, instead of leaving it to the watchdog's grace.
                self.start()
                self.wait_ready()
                return self
            except ServerError:
                self.stop()
                if attempt < PORT_RETRIES and "--port" in self.spec.command and port_taken(self.spec.log_path, offset):
                    taken = self.spec.port
                    self.spec = self.spec.with_port(free_port(self.spec.host))
                    print(
                        f"[{self.spec.engine}] port {taken} was taken before the server bound it; "
                        f"retrying on port {self.spec.port}"
                    )
                    continue
                raise
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        if shutil.which(self.spec.command[0]) is None:  # the watchdog would start, and then fail
            raise ServerError(f"cannot start {self.spec.engine}: {self.spec.command[0]} not found; check engine.python")
        self.spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.spec.log_path.open("ab")
        try:
            # Ctrl-C and SIGTERM wait until the child is recorded: one that interrupted Popen
            # after the fork would leave a server this object does not know to stop.
            with signals_deferred():
                self._proc = subprocess.Popen(
                    self._watched(list(self.spec.command)),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env={**os.environ, **self.spec.env, **inherited(self.spec.env_from)},
                    start_new_session=True,  # its own process group, so stop() reaches every child
                )
        except FileNotFoundError as exc:
            raise ServerError(f"cannot start {self.spec.engine}: {exc}; check engine.python") from exc
        finally:
            log.close()
        self._started_at = time.monotonic()

    def _watched(self, command: list[str]) -> list[str]:
        """The command under the watchdog, which stops it if this process dies (SIGKILL too)."""
        if not self.watchdog:
            return command
        return [
            sys.executable,
            "-m",
            "pipeline.engines.watchdog",
            "--parent",
            str(os.getpid()),
            "--grace",
            f"{self.grace_s:g}",
            "--",
            *command,
        ]

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

    def healthy(self, timeout_s: float = 10.0) -> bool:
        """Whether the server still answers its health check (an engine core that died can
        leave the API server up but unable to serve)."""
        try:
            response = httpx.get(self.spec.base_url + self.spec.health_path, timeout=timeout_s, trust_env=False)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def restart(self) -> None:
        """Stop whatever is left of the server and start it again on the same spec."""
        self.stop()
        self.__enter__()

    def stop(self, grace_s: float | None = None) -> None:
        """SIGTERM the process group, SIGKILL whatever is left after ``grace_s``, and return
        only once no process of the group runs: the engine core and workers included."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        pgid = proc.pid  # start_new_session makes the child its group's leader
        signal_group(pgid, signal.SIGTERM)
        if not wait_group_gone(proc, pgid, self.grace_s if grace_s is None else grace_s):
            signal_group(pgid, signal.SIGKILL)
            if not wait_group_gone(proc, pgid, 10.0):
                raise ServerError(f"processes of group {pgid} survived SIGKILL: {live_members(pgid)}")
