"""Live progress, the groups' side: events a server group emits while it runs, wherever it runs.

A group reports to a channel named in its task. In the driver's own process (the in-process
executor, Hydra's basic launcher) the name finds the driver's display directly. In a Ray worker
it finds a named Ray actor, :class:`Hub`, that the Ray launcher started in the driver, and the
launcher drains it into the display. Reporting never fails a group: a display that cannot be
reached loses a line, not a measurement.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

NAMESPACE = "specsweep"
# Window updates are throttled: a line per second is more than any display draws.
WINDOW_EVERY_S = 1.0


@dataclass(frozen=True)
class Event:
    kind: str  # server_starting | server_ready | window | point_done
    group: str
    point: str = ""
    done: int = 0  # window: requests finished so far
    total: int = 0  # window: requests in it
    errors: int = 0
    tok_s: float = 0.0
    failed: bool = False  # point_done: the point failed
    at: float = field(default_factory=time.time)


Sink = Callable[[Event], None]
_LOCAL: dict[str, Sink] = {}  # channel name -> the display, in the driver's process


def register(name: str, sink: Sink) -> None:
    _LOCAL[name] = sink


def unregister(name: str) -> None:
    _LOCAL.pop(name, None)


def local_sink(name: str) -> Sink | None:
    return _LOCAL.get(name)


class Reporter:
    """What a group holds: ``emit`` never raises. ``clock`` paces window updates (monotonic)."""

    def __init__(self, sink: Sink | None, group: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.sink, self.group, self.clock = sink, group, clock
        self._last_window = 0.0

    def emit(self, kind: str, point: str = "", **fields: object) -> None:
        if self.sink is None:
            return
        try:
            self.sink(Event(kind, self.group, point, **fields))  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 - progress is a courtesy; the measurement goes on
            self.sink = None

    def window(self, point: str, done: int, total: int, errors: int, tok_s: float) -> None:
        now = self.clock()
        if done < total and now - self._last_window < WINDOW_EVERY_S:
            return
        self._last_window = now
        self.emit("window", point, done=done, total=total, errors=errors, tok_s=tok_s)


def reporter_for(channel: str | None, group: str) -> Reporter:
    if not channel:
        return Reporter(None, group)
    sink = local_sink(channel)
    if sink is not None:
        return Reporter(sink, group)
    try:
        import ray

        if not ray.is_initialized():
            return Reporter(None, group)
        hub = ray.get_actor(channel, namespace=NAMESPACE)
    except Exception:  # noqa: BLE001 - no hub (an older driver, a lost head): no progress
        return Reporter(None, group)
    return Reporter(lambda event: hub.put.remote(event), group)


class Hub:
    """The Ray actor between the workers and the driver: events wait here until drained."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def put(self, event: Event) -> None:
        self.events.append(event)

    def drain(self) -> list[Event]:
        out, self.events = self.events, []
        return out
