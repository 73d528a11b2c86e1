"""Live progress, the driver's side: one display for the whole sweep, fed by the groups' events.

:class:`SweepState` is pure: events in, status lines out. :class:`Display` draws it: redrawn in
place on a terminal (rich), and as plain lines every ``PLAIN_EVERY_S`` seconds elsewhere (CI,
``ray job logs``), never redrawn there.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pipeline.run.progress.events import Event, register, unregister

PLAIN_EVERY_S = 10.0


def _duration(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


@dataclass
class SweepState:
    planned: int  # points to measure
    estimate_s: float  # the plan's rough estimate, until measured points say better
    started: float = field(default_factory=time.time)
    done: int = 0
    failed: int = 0
    starting: dict[str, float] = field(default_factory=dict)  # group -> when its server began starting
    windows: dict[str, Event] = field(default_factory=dict)  # group -> its window's latest update

    def apply(self, event: Event) -> None:
        if event.kind == "server_starting":
            self.starting[event.group] = event.at
            self.windows.pop(event.group, None)
        elif event.kind == "server_ready":
            self.starting.pop(event.group, None)
        elif event.kind == "window":
            self.windows[event.group] = event
        elif event.kind == "point_done":
            self.done += 1
            self.failed += event.failed
            self.windows.pop(event.group, None)

    def eta_s(self, now: float) -> float:
        """Time left: from the points measured so far once there are some, else the plan's estimate."""
        elapsed = now - self.started
        if self.done:
            return elapsed / self.done * max(self.planned - self.done, 0)
        return max(self.estimate_s - elapsed, 0.0)

    def lines(self, now: float) -> list[str]:
        failed = f" ({self.failed} failed)" if self.failed else ""
        head = (
            f"progress: {self.done}/{self.planned} points done{failed}, {_duration(now - self.started)} "
            f"elapsed, ~{_duration(self.eta_s(now))} left"
        )
        out = [head]
        for group, since in sorted(self.starting.items()):
            out.append(f"  [{group}] server starting, {_duration(now - since)} so far")
        for _, w in sorted(self.windows.items()):
            out.append(f"  [{w.point}] {w.done}/{w.total} requests, {w.errors} errors, {w.tok_s:.0f} tok/s")
        return out


class Display:
    """Feed it events (any thread); ``close`` stops it. ``stream``: where it draws (stdout);
    ``clock``: the time its lines are drawn at (wall-clock seconds, as events' ``at``)."""

    def __init__(
        self,
        state: SweepState,
        stream: Any = None,
        interactive: bool | None = None,
        every_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state = state
        self.clock = clock
        self.every_s = every_s or PLAIN_EVERY_S
        self.stream = stream or sys.stdout
        self.interactive = self.stream.isatty() if interactive is None else interactive
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._live: Any = None
        if self.interactive:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(
                self._render(),
                console=Console(file=self.stream),
                refresh_per_second=2,
                redirect_stdout=True,
                redirect_stderr=True,
                get_renderable=self._render,
            )
            self._live.start()
        else:
            self._thread = threading.Thread(target=self._plain, name="specsweep-progress", daemon=True)
            self._thread.start()

    def __call__(self, event: Event) -> None:
        with self._lock:
            self.state.apply(event)

    def _render(self) -> Any:
        from rich.text import Text

        with self._lock:
            return Text("\n".join(self.state.lines(self.clock())))

    def _plain(self) -> None:
        while not self._stop.wait(self.every_s):
            with self._lock:
                text = "\n".join(self.state.lines(self.clock()))
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        self._stop.set()
        if self._live is not None:
            self._live.stop()


def channel_name() -> str:
    return f"specsweep-progress-{uuid.uuid4().hex[:12]}"


@contextmanager
def live(channel: str, planned: int, estimate_s: float, every_s: float = PLAIN_EVERY_S) -> Iterator[None]:
    """The display, open while the groups run: their events reach it under ``channel``."""
    display = Display(SweepState(planned, estimate_s), every_s=every_s)
    register(channel, display)
    try:
        yield
    finally:
        unregister(channel)
        display.close()
