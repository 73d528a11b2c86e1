"""A server group's answer to a server that dies or hangs mid-window, with a scripted server."""

from __future__ import annotations

import dataclasses
import errno
from pathlib import Path

import pytest

from pipeline.config import EngineConfig, JobConfig, LoadConfig, SweepSettings
from pipeline.record.tracking import PointRun
from pipeline.run.group import LOST, GroupRun, _earlier_attempt
from pipeline.run.measure import WINDOW_STOPPED
from pipeline.run.outcomes import GroupTask, PointOutcome
from pipeline.run.plan import plan_sweep
from pipeline.run.plumbing import diskfull

TOO_MANY_ERRORS = "12 of the first 12 requests failed"


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
        elif fault == "full":
            error = diskfull.message(OSError(errno.ENOSPC, "No space left on device", "/out/requests.csv"))
            results[point.hash] = PointOutcome(point.hash, point.label, {"completed": 6.0}, error=error)
        elif fault == "hang":
            results[point.hash] = PointOutcome(point.hash, point.label, error=WINDOW_STOPPED + "the window deadline")
        elif fault == "errors":  # the server answers, with errors: load.max_error_rate stops the window
            results[point.hash] = PointOutcome(point.hash, point.label, error=WINDOW_STOPPED + TOO_MANY_ERRORS)
        else:
            results[point.hash] = PointOutcome(point.hash, point.label, {"completed": 6.0})
        return results[point.hash]

    run = ScriptedGroup(group, tracker, measure_one, tmp_path)
    run._measure(server)  # type: ignore[arg-type]
    return group, run.results, tracker.tags, run.restarts, firsts


class ScriptedGroup(GroupRun):
    """A group's measuring loop (GroupRun._measure) over a scripted server and window."""

    def __init__(self, group, tracker, measure_one, out_dir: Path) -> None:  # type: ignore[no-untyped-def]
        self.task = GroupTask(group, None, "0", "parent", SweepSettings.of([group.server_job]))  # type: ignore[arg-type]
        self.group, self.tracker, self.out_dir = group, tracker, out_dir
        self.run_ids = {p.hash: p.label for p in group.points}
        self.results: dict[str, PointOutcome] = {}
        self.restarts = 0
        self.scripted = measure_one

    def _measure_one(self, point, first: bool) -> PointOutcome:  # type: ignore[no-untyped-def]
        self.results[point.hash] = self.scripted(point, first)
        return self.results[point.hash]


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
    server = ScriptedServer(tmp_path / "log")
    outcome = PointOutcome("h", "r", error=WINDOW_STOPPED + TOO_MANY_ERRORS)
    from pipeline.run.group import _server_fault

    assert _server_fault(server, outcome) is None  # type: ignore[arg-type]
    # In a group: the point keeps its own error; the server is neither blamed nor restarted.
    group, results, tags, restarts, firsts = _run(tmp_path, {1.0: "errors"})
    assert results[group.points[0].hash].error == WINDOW_STOPPED + TOO_MANY_ERRORS
    assert restarts == 0 and firsts == [True, False, False]
    assert not any("server.fault" in t or "server.restarts_before" in t for t in tags.values()), tags
    assert all(results[p.hash].error is None for p in group.points[1:])


def test_a_full_disk_stops_the_group_and_names_the_fix(tmp_path: Path) -> None:
    group, results, tags, restarts, firsts = _run(tmp_path, {1.0: "full"})
    first, *rest = [results[p.hash] for p in group.points]
    assert first.error.startswith("the output disk is full (No space left on device writing /out/requests.csv)")
    assert "hydra.sweep.dir" in first.error and first.metrics == {"completed": 6.0}
    assert all(o.error == f"not measured: {first.error}" for o in rest) and len(firsts) == 1
    assert restarts == 0 and not tags  # the server is fine: no restart, no fault tag


class EarlierRuns:
    """MLflow as an attempt that died left it: one point finished, one mid-window, one failed."""

    def __init__(self, runs: list[PointRun]) -> None:
        self.runs, self.ended = runs, {}

    def point_runs(self, parent_id: str) -> list[PointRun]:
        assert parent_id == "parent"
        return self.runs

    def end_run(self, run_id: str, error: str | None = None) -> None:
        self.ended[run_id] = error


def test_a_group_run_again_after_its_node_died_keeps_what_finished_and_ends_what_was_left_running() -> None:
    group = _group()
    a, b, c = group.points
    runs = [
        PointRun("b1", b.hash, "RUNNING", False, None, {}),
        PointRun("a1", a.hash, "FINISHED", True, None, {"completed": 6.0}),
        PointRun("c1", c.hash, "FAILED", False, None, {}),
        PointRun("x", "other-hash", "RUNNING", False, None, {}),
    ]
    task = GroupTask(group, None, "0", "parent", SweepSettings.of([group.server_job]))  # type: ignore[arg-type]
    mlflow = EarlierRuns(runs)
    kept = _earlier_attempt(task, mlflow)  # type: ignore[arg-type]
    assert kept == {a.hash: PointOutcome(a.hash, "a1", {"completed": 6.0})}
    assert mlflow.ended == {"b1": LOST}  # another group's run is not this one's to end
    confirming = dataclasses.replace(task, confirms={a.hash: "a0"})  # a gate's re-measurement measures again
    assert _earlier_attempt(confirming, EarlierRuns(runs)) == {}  # type: ignore[arg-type]


def test_a_tokenizer_that_fails_to_load_while_the_server_starts_fails_each_point_and_measures_none(
    tmp_path: Path,
) -> None:
    """The tokenizer loads while the server starts (run_group); where it fails, each point fails
    with why, as where the server failed to start, and no window runs."""
    from concurrent.futures import Future

    failed: Future[object] = Future()
    failed.set_exception(OSError("tokenizer.json is missing"))
    run = ScriptedGroup(_group(), Tags(), lambda point, first: pytest.fail("measured without a tokenizer"), tmp_path)
    run.points, run.secrets, run._tokenizer = list(run.group.points), [], failed
    run.reporter = type("Quiet", (), {"emit": lambda *a, **k: None})()

    assert run._loaded_tokenizer() is None
    assert len(run.results) == 3
    assert {o.error for o in run.results.values()} == {"OSError: tokenizer.json is missing"}
    loaded: Future[object] = Future()
    loaded.set_result("tokenizer")
    run._tokenizer = loaded
    assert run._loaded_tokenizer() == "tokenizer"
