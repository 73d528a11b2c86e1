"""A server's watchdog: the server never outlives the process that started it.

    python -m pipeline.engines.watchdog --parent PID [--grace S] -- COMMAND...

:class:`~pipeline.engines.base.EngineServer` starts this in a new session instead of the server
itself; the watchdog is the group's leader, and it starts COMMAND (the server) in its own group.
When the parent dies, by SIGKILL too, the kernel sends the watchdog SIGUSR1
(``PR_SET_PDEATHSIG``, set on itself here, so that no ``preexec_fn`` runs in a forking parent
with threads), and a once-a-second check of ``getppid()`` catches the rest (a kernel without the
call). Linux ties that signal to the parent's *thread* that forked the watchdog, not to the
process: a server started from a worker thread gets it when the thread ends, with its parent
alive. So the signal is one of its own (SIGUSR1, which nothing else sends it), and it stops the
server only where ``getppid()`` shows the parent gone. Either way the watchdog signals the whole
group: SIGTERM, then SIGKILL after ``--grace`` seconds, and exits. A server that exits by itself ends the watchdog with
the server's exit code, after whatever the server left in the group is stopped. The server has a
death signal of its own (SIGTERM when the watchdog dies), for a watchdog that is SIGKILLed itself.

Why a process and not ``setpriv --pdeathsig``: it works wherever Python does (no util-linux
version needed), it catches what a death signal misses, and it cleans up the server's children
(vLLM's engine core and workers), which a death signal on the server alone would orphan.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1


# The watchdog's own death signal: not SIGTERM, which stop() sends the whole group, since a
# parent thread that ends sends it too, and only getppid() tells the two apart.
PARENT_GONE = signal.SIGUSR1
# What the watchdog logs when its death signal came from a parent thread that ended, the parent alive.
KEPT_SERVING = "the thread that started the server ended, its process lives on: serving on"


def _die_with_parent(sig: signal.Signals = signal.SIGTERM) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the getppid() check below still holds
        pass


def _stop_group(grace_s: float, server: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM every other process of our group, then SIGKILL what is left after the grace."""
    pgid = os.getpgrp()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the group's SIGTERM reaches us too
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _others(pgid):
        if server is not None:
            server.poll()  # reap the server so that it leaves the table
        time.sleep(0.1)
    if _others(pgid):
        for pid in _others(pgid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def live_members(pgid: int) -> list[int]:
    """Processes of the group that still run (zombies excluded: they have exited)."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            # /proc/PID/stat: "pid (comm) state ppid pgrp ..."; comm may hold spaces.
            with open(f"/proc/{entry.name}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def _others(pgid: int) -> list[int]:
    return [pid for pid in live_members(pgid) if pid != os.getpid()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.engines.watchdog", description=__doc__.splitlines()[0])
    parser.add_argument("--parent", type=int, required=True, help="the pid whose death stops the server")
    parser.add_argument("--grace", type=float, default=20.0, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no server command after --")
    if os.getpgrp() != os.getpid():
        os.setsid()  # the group it stops must be its own, never its parent's
    stopping = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    def on_parent_gone(signum: int, frame: object) -> None:
        nonlocal stopping
        # Sent too when the parent's thread that started us ends: the parent may live on.
        gone = os.getppid() != args.parent
        stopping = stopping or gone
        if not gone:  # said in the server's log (os.write: no buffered print inside a handler)
            os.write(2, f"watchdog: {KEPT_SERVING} (parent {args.parent})\n".encode())

    signal.signal(PARENT_GONE, on_parent_gone)  # before it is armed: its default would kill us
    _die_with_parent(PARENT_GONE)
    if os.getppid() != args.parent:  # the parent died before the death signal was armed
        return 1
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle, through stop()
    try:
        # The server's own death signal, for a watchdog that is SIGKILLed itself: a Ray worker
        # that exits because its node's raylet died SIGKILLs its children, this watchdog
        # among them. The server then gets SIGTERM, and stops its engine core and workers.
        # (A preexec_fn is safe here: this process has one thread.)
        server = subprocess.Popen(command, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    except OSError as exc:
        print(f"watchdog: cannot start {command[0]}: {exc}", file=sys.stderr, flush=True)
        return 127
    while not stopping:
        try:
            code = server.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            if os.getppid() != args.parent:
                break  # the parent is gone and no death signal came
            continue
        _stop_group(args.grace, None)  # the server's children (engine core, workers) too
        return code
    _stop_group(args.grace, server)
    return 128 + signal.SIGTERM


if __name__ == "__main__":
    sys.exit(main())
