"""Process plumbing for servers: free ports, log tails, and signals to a whole process group."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.engines.watchdog import live_members

LOG_TAIL_LINES = 40


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


def port_taken(log_path: Path, offset: int) -> bool:
    """Whether the server's log, from ``offset`` on, says its port was already in use."""
    try:
        with log_path.open("rb") as fh:
            fh.seek(offset)
            text = fh.read().decode(errors="replace").lower()
    except OSError:
        return False
    return "address already in use" in text or "errno 98" in text


def wait_group_gone(proc: subprocess.Popen[bytes], pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        proc.poll()  # reap the leader so that it leaves the table
        if not live_members(pgid):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


@contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM that arrive inside the block are delivered when it ends, to the
    handlers there were before. Not a signal mask: a child started inside would inherit the
    mask through exec, and a server that blocks SIGTERM cannot be stopped. Only the main thread
    receives signals in Python, so elsewhere nothing is deferred."""
    wanted = (signal.SIGINT, signal.SIGTERM)
    before = {s: signal.getsignal(s) for s in wanted}
    if threading.current_thread() is not threading.main_thread() or None in before.values():
        yield
        return
    caught: list[int] = []
    for s in wanted:
        signal.signal(s, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        for signum in caught:
            signal.raise_signal(signum)
