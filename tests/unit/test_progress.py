"""The live progress protocol: a scripted group's events, the sweep's state, the plain-line display."""

from __future__ import annotations

import io
import threading
import time

import pytest

from pipeline.run.progress import events, screen
from pipeline.run.progress.events import Event, Hub, Reporter
from pipeline.run.progress.screen import Display, SweepState


def _scripted_group(reporter: Reporter, points: list[str], total: int) -> None:
    """What run_group emits: a server start, then each point's window, then its end."""
    reporter.emit("server_starting")
    reporter.emit("server_ready")
    for i, point in enumerate(points):
        for done in range(total + 1):
            reporter.window(point, done, total, errors=done // 4, tok_s=100.0 + done)
        reporter.emit("point_done", point, failed=i == 1)


def test_a_scripted_group_drives_the_sweep_state_through_an_in_process_channel() -> None:
    state = SweepState(planned=3, estimate_s=600, started=1000.0)
    seen: list[Event] = []
    events.register("chan", lambda e: (seen.append(e), state.apply(e)))
    try:
        reporter = events.reporter_for("chan", "00-ngram-k3")
        reporter.clock = lambda: 5000.0  # the reporter's time stands still: no second passes mid-window
        reporter.emit("server_starting")
        assert state.lines(time.time())[1].startswith("  [00-ngram-k3] server starting, ")
        _scripted_group(reporter, ["ngram-k3-r1", "ngram-k3-r2"], total=8)
    finally:
        events.unregister("chan")
    assert state.done == 2 and state.failed == 1 and not state.starting and not state.windows
    # Throttled, not one per request: with no time passing, the first update and each window's last
    # arrive, and nothing between (the throttle is the reporter's: the second window's first update too).
    assert [(e.point, e.done) for e in seen if e.kind == "window"] == [
        ("ngram-k3-r1", 0),
        ("ngram-k3-r1", 8),
        ("ngram-k3-r2", 8),
    ]
    head = state.lines(1030.0)[0]  # 30 s after the sweep began: 15 s a point, one point left
    assert head == "progress: 2/3 points done (1 failed), 30 s elapsed, ~15 s left", head


def test_mid_window_updates_pass_once_a_throttle_interval_has_gone_by(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "WINDOW_EVERY_S", 1.0)
    seen: list[Event] = []
    now = [5000.0]
    reporter = Reporter(seen.append, "g", clock=lambda: now[0])
    for done in range(6):  # a request finishes every 0.4 s
        reporter.window("p", done, 5, errors=0, tok_s=1.0)
        now[0] += 0.4
    assert [e.done for e in seen] == [0, 3, 5]  # the first, the first a second later, the last


def test_mid_window_lines_name_the_point_requests_errors_and_rate() -> None:
    state = SweepState(planned=4, estimate_s=120, started=1000.0)
    state.apply(Event("server_starting", "01-baseline", at=1000.0))
    assert state.lines(1042.0) == [
        "progress: 0/4 points done, 42 s elapsed, ~78 s left",
        "  [01-baseline] server starting, 42 s so far",
    ]
    state.apply(Event("server_ready", "01-baseline", at=1045.0))
    state.apply(Event("window", "01-baseline", "baseline-r4", done=12, total=32, errors=1, tok_s=118.4))
    assert state.lines(1050.0)[1] == "  [baseline-r4] 12/32 requests, 1 errors, 118 tok/s"
    assert state.eta_s(10_000.0) == 0.0  # past the plan's estimate with nothing measured: no negative time


class _Lines(io.StringIO):
    """A stream that says when ``want`` progress lines have been written to it."""

    def __init__(self, want: int) -> None:
        super().__init__()
        self.want, self.enough = want, threading.Event()

    def write(self, text: str) -> int:
        written = super().write(text)
        if self.getvalue().count("progress: ") >= self.want:
            self.enough.set()
        return written


def test_plain_lines_come_every_interval_and_are_never_redrawn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(screen, "PLAIN_EVERY_S", 0.05)
    out = _Lines(want=3)
    display = Display(
        SweepState(planned=1, estimate_s=60, started=1000.0), stream=out, interactive=False, clock=lambda: 1000.0
    )
    display(Event("server_starting", "00-baseline", at=1000.0))
    try:
        # Three lines at 0.05 s apart; the deadline only bounds a display that never prints again.
        assert out.enough.wait(timeout=60), out.getvalue()
    finally:
        display.close()
    lines = out.getvalue().splitlines()
    block = ["progress: 0/1 points done, 0 s elapsed, ~60 s left", "  [00-baseline] server starting, 0 s so far"]
    assert lines[:6] == block * 3, lines  # the same two lines each time, appended, never rewritten
    assert "\r" not in out.getvalue() and "\x1b[" not in out.getvalue()  # no cursor movement off a terminal


def test_a_broken_sink_costs_lines_not_the_group() -> None:
    calls = []

    def broken(event: Event) -> None:
        calls.append(event)
        raise ConnectionError("the driver is gone")

    reporter = Reporter(broken, "00-baseline")
    reporter.emit("server_starting")
    reporter.emit("server_ready")  # silently dropped from now on
    assert len(calls) == 1
    assert events.reporter_for(None, "g").sink is None and events.reporter_for("no-such-channel", "g").sink is None


def test_the_ray_hub_hands_events_over_in_order_once() -> None:
    hub = Hub()
    for i in range(3):
        hub.put(Event("window", "g", "p", done=i, total=3))
    assert [e.done for e in hub.drain()] == [0, 1, 2] and hub.drain() == []
