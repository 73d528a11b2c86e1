"""Finding the processes a test started, and only those.

A test that signals, pauses or counts processes never matches them by name across the
machine: a developer's machine may serve a model of its own, and its vLLM looks exactly like
ours. Processes are found as descendants of a process the test started itself (the sweep, a
server, a Ray node of a cluster it made), and :class:`Tracker` remembers every descendant it
has seen, so that a server orphaned by a killed parent (reparented to init) is still known
to be ours.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterable

import psutil

Root = int | psutil.Process
# A vLLM server's processes: the API server, and the engine-core and worker processes it
# spawns (named by setproctitle).
SERVER_PATTERN = "vllm.entrypoints.openai.api_server|VLLM::"


def _process(root: Root) -> psutil.Process | None:
    try:
        return root if isinstance(root, psutil.Process) else psutil.Process(root)
    except psutil.Error:
        return None


def running(proc: psutil.Process) -> bool:
    """Still the same process (not a reused pid), and not a zombie (which has exited)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def alive(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    return [p for p in procs if running(p)]


def cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def descendants(*roots: Root) -> list[psutil.Process]:
    """Every live process below ``roots`` (the roots themselves not), each once."""
    found: dict[int, psutil.Process] = {}
    for root in roots:
        proc = _process(root)
        if proc is None or not running(proc):
            continue
        try:
            children = proc.children(recursive=True)
        except psutil.Error:
            continue
        for child in children:
            if running(child):
                found.setdefault(child.pid, child)
    return sorted(found.values(), key=lambda p: p.pid)


def matching(roots: Iterable[Root], pattern: str) -> list[psutil.Process]:
    """The descendants of ``roots`` whose command line (its arguments joined by spaces)
    matches the regular expression ``pattern``."""
    regex = re.compile(pattern)
    return [p for p in descendants(*roots) if regex.search(" ".join(cmdline(p)))]


def send(procs: Iterable[psutil.Process], sig: int, missing_ok: bool = True) -> None:
    """``sig`` to each process, if it is still the one found (psutil checks that the pid
    was not reused); one that has exited meanwhile is skipped, or raises without ``missing_ok``."""
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            if not missing_ok:
                raise


class Tracker:
    """Every process that descends from ``roots`` (those given, and those :meth:`add` adds),
    kept after its parent dies. :meth:`start` polls in a thread, so that a process started
    and orphaned between two calls of :meth:`processes` is still seen; each call polls too."""

    # A server lives tens of seconds: a poll every 2 s sees each one while its parents live, and
    # costs the measured servers' shared cores a quarter of what polling every 0.5 s did.
    def __init__(self, roots: Iterable[Root] = (), period_s: float = 2.0) -> None:
        self.period_s = period_s
        self._lock = threading.Lock()
        self._roots: dict[int, psutil.Process] = {}
        self._known: dict[int, psutil.Process] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.add(*roots)

    def add(self, *roots: Root) -> None:
        with self._lock:
            for root in roots:
                proc = _process(root)
                if proc is not None:
                    self._roots[proc.pid] = proc

    def poll(self) -> None:
        with self._lock:
            self._known = {pid: p for pid, p in self._known.items() if running(p)}
            self._roots = {pid: p for pid, p in self._roots.items() if running(p)}
            # Only the tops need a walk: the roots, and known processes whose parent is not
            # known (orphans, reparented to init or to a subreaper).
            tops = list(self._roots.values())
            for proc in self._known.values():
                try:
                    if proc.ppid() not in self._known and proc.pid not in self._roots:
                        tops.append(proc)
                except psutil.Error:
                    continue
            for proc in descendants(*tops):
                old = self._known.get(proc.pid)
                if old is None or not running(old):
                    self._known[proc.pid] = proc

    def processes(self, pattern: str | None = None) -> list[psutil.Process]:
        """The live processes seen so far (roots excluded), those matching ``pattern`` if given."""
        self.poll()
        with self._lock:
            procs = [p for pid, p in sorted(self._known.items()) if pid not in self._roots and running(p)]
        if pattern is None:
            return procs
        regex = re.compile(pattern)
        return [p for p in procs if regex.search(" ".join(cmdline(p)))]

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="procs-tracker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.poll()


_TRACKER: Tracker | None = None


def tracker() -> Tracker:
    """This test run's tracker: everything this process starts, and what :meth:`Tracker.add`
    adds (a ``ray start`` cluster's processes, which ``ray start`` leaves to init)."""
    global _TRACKER
    if _TRACKER is None:
        _TRACKER = Tracker([os.getpid()])
    return _TRACKER


DECOY_ARGS = ("VLLM::EngineCore", "vllm.entrypoints.openai.api_server", "--port")


def start_decoy(port: int = 1) -> subprocess.Popen[bytes]:
    """A process that looks like a vLLM server (API server and engine core, on ``port``) but
    is no part of what a test starts: the stand-in for a server of someone else's on the
    machine, which no fault helper may touch. The caller kills it."""
    code = "import time; time.sleep(600)"
    return subprocess.Popen([sys.executable, "-c", code, *DECOY_ARGS, str(port)], stdin=subprocess.DEVNULL)


def untouched(decoy: subprocess.Popen[bytes]) -> str | None:
    """Why ``decoy`` was hit (it exited, or it is stopped), or None if it was not."""
    if decoy.poll() is not None:
        return f"the decoy exited with {decoy.returncode}"
    try:
        status = psutil.Process(decoy.pid).status()
    except psutil.Error as exc:
        return f"the decoy is gone ({exc})"
    return f"the decoy is {status}" if status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP) else None


def kill_decoy(decoy: subprocess.Popen[bytes]) -> None:
    if decoy.poll() is None:
        decoy.kill()
    decoy.wait(timeout=10)
