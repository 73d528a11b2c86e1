"""A server group's answer to a server that dies or hangs mid-window, with a scripted server."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pipeline.config import EngineConfig, JobConfig, LoadConfig
from pipeline.group import PointOutcome, _measure_all
from pipeline.measure import WINDOW_STOPPED
from pipeline.plan import plan_sweep


class ScriptedServer:
    """Dies (or hangs) during the windows named in ``faults``; a restart brings it back."""

    def __init__(self, log: Path) -> None:
        self.up = True
        self.restarts = 0
        self.returncode: int | None = None
        self.spec = type("Spec", (), {"log_path": log})()

    def alive(self) -> bool:
        return self.up

    def healthy(self) -> bool:
        return self.up

    def restart(self) -> None:
        self.up, self.returncode = True, None
        self.restarts += 1


class Tags:
    def __init__(self) -> None:
        self.tags: dict[str, dict[str, str]] = {}

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        self.tags.setdefault(run_id, {}).update(tags)


def _group(restart: bool = True):  # type: ignore[no-untyped-def]
    job = dataclasses.replace(JobConfig(), engine=EngineConfig(restart_on_crash=restart))
    jobs = [dataclasses.replace(job, load=LoadConfig(request_rate=r)) for r in (1, 2, 4)]
    return plan_sweep(jobs).groups[0]  # the baseline server's three rates


def _run(tmp_path: Path, faults: dict[float, str], restart: bool = True):  # type: ignore[no-untyped-def]
    group = _group(restart)
    log = tmp_path / "server.log"
    log.write_text("engine core died: SIGKILL\n")
    server, tracker, results = ScriptedServer(log), Tags(), {}
    firsts = []

    def measure_one(point, first: bool) -> PointOutcome:  # type: ignore[no-untyped-def]
        firsts.append(first)
        fault = faults.get(point.job.load.request_rate)
        if fault == "crash":
            server.up, server.returncode = False, -9
            results[point.hash] = PointOutcome(point.hash, point.label, error="ServerDisconnectedError")
        elif fault == "hang":
            results[point.hash] = PointOutcome(point.hash, point.label, error=WINDOW_STOPPED + "the window deadline")
        else:
            results[point.hash] = PointOutcome(point.hash, point.label, {"completed": 6.0})
        return results[point.hash]

    run_ids = {p.hash: p.label for p in group.points}
    restarts = _measure_all(group, server, measure_one, tracker, run_ids, results)  # type: ignore[arg-type]
    return group, results, tracker.tags, restarts, firsts


def test_a_crash_fails_its_point_with_the_log_tail_and_the_server_is_restarted_for_the_rest(tmp_path: Path) -> None:
    group, results, tags, restarts, firsts = _run(tmp_path, {2.0: "crash"})
    outcomes = [results[p.hash] for p in group.points]
    assert [o.error is None for o in outcomes] == [True, False, True]
    assert "died during the window (exit code -9)" in outcomes[1].error and "engine core died" in outcomes[1].error
    assert restarts == 1 and firsts == [True, False, True]  # the restarted server is warmed up again
    assert tags["baseline-r2"]["server.fault"].startswith("the server died")
    assert tags["baseline-r4"] == {"server.restarts_before": "1"}


def test_a_hang_fails_its_point_and_restarts_the_server(tmp_path: Path) -> None:
    group, results, _, restarts, _ = _run(tmp_path, {1.0: "hang"})
    assert "stopped answering" in results[group.points[0].hash].error and restarts == 1
    assert all(results[p.hash].error is None for p in group.points[1:])


def test_without_restarts_the_points_after_a_crash_are_failed_and_say_why(tmp_path: Path) -> None:
    group, results, _, restarts, firsts = _run(tmp_path, {1.0: "crash"}, restart=False)
    assert restarts == 0 and len(firsts) == 1
    for point in group.points[1:]:
        assert "engine.restart_on_crash=false" in results[point.hash].error


def test_a_window_stopped_for_errors_is_not_a_server_fault(tmp_path: Path) -> None:
    group = _group()
    server = ScriptedServer(tmp_path / "log")
    outcome = PointOutcome("h", "r", error=WINDOW_STOPPED + "12 of the first 12 requests failed")
    from pipeline.group import _server_fault

    assert _server_fault(server, outcome) is None  # type: ignore[arg-type]
    assert group.points
