"""Writes MLflow could not take are journaled in order and made later, once, on a real store."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from pipeline import sync
from pipeline.config import TrackingConfig
from pipeline.record.journal import JOURNAL_NAME, JournaledTracker, journals, make_tracker, replay_journal
from pipeline.record.tracking import Tracker, prepare, resolve_store


class Flaky:
    """A real tracker that fails every write while ``down``, as an unreachable server does."""

    def __init__(self, tracker: Tracker) -> None:
        self.tracker, self.down = tracker, False
        self.store, self.experiment_id = tracker.store, tracker.experiment_id

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        method = getattr(self.tracker, name)

        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            if self.down:
                raise ConnectionError("Connection refused")
            return method(*args, **kwargs)

        return call


def _store(tmp_path: Path) -> tuple[Tracker, MlflowClient]:
    store = resolve_store(TrackingConfig(), tmp_path)
    tracker = Tracker(store, prepare(store, "journal"))
    return tracker, MlflowClient(store.tracking_uri)


def _journaled_run(tmp_path: Path) -> tuple[Tracker, MlflowClient, Path, str]:
    """MLflow down from the start: one run and one metric, in the journal only."""
    real, client = _store(tmp_path)
    flaky = Flaky(real)
    flaky.down = True
    path = tmp_path / "out" / JOURNAL_NAME
    tracker = JournaledTracker(flaky, path)
    run = tracker.start_run("baseline-r1", {})
    tracker.log_metrics(run, {"completed": 6.0})
    return real, client, path, run


def test_writes_after_an_outage_are_journaled_in_order_and_replayed_once(tmp_path: Path) -> None:
    real, client = _store(tmp_path)
    flaky = Flaky(real)
    journal = tmp_path / "out" / "01-baseline" / JOURNAL_NAME
    tracker = JournaledTracker(flaky, journal)
    parent = tracker.start_run("sweep", {"role": "sweep"})  # MLflow is up: a real run
    tracker.end_run(tracker.start_run("earlier", {}), error="a failed point", killed=False)  # straight through
    flaky.down = True  # the server goes away mid-sweep
    child = tracker.start_run("baseline-r1", {"role": "baseline"}, parent)
    assert child.startswith("pending-") and journal.is_file()
    tracker.log_metrics(child, {"median_tpot_ms": 41.0})
    (tmp_path / "requests.csv").write_text("index,ttft_s\n0,0.1\n")
    tracker.log_file(child, tmp_path / "requests.csv")
    tracker.log_table(parent, pd.DataFrame({"point": ["baseline-r1"]}), "summary_table.json")
    tracker.end_run(child, error=None, killed=False)  # keywords, as the group and the driver pass them
    flaky.down = False  # back; the journaled writes still go to the journal, in order
    tracker.set_tags(child, {"status": "finished"})
    assert tracker.journaled == 6
    runs = {r.info.run_name: r.info.status for r in client.search_runs([real.experiment_id])}
    assert runs == {"sweep": "RUNNING", "earlier": "FAILED"}  # "earlier" went straight through

    made, left = replay_journal(journals(tmp_path / "out"), make_tracker)
    assert (made, left) == (6, 0)
    runs = {r.info.run_name: r for r in client.search_runs([real.experiment_id])}
    done = runs["baseline-r1"]
    assert done.data.tags["mlflow.parentRunId"] == parent and done.data.tags["status"] == "finished"
    assert done.data.metrics["median_tpot_ms"] == 41.0 and done.info.status == "FINISHED"
    assert {a.path for a in client.list_artifacts(done.info.run_id)} == {"requests.csv"}
    assert sync.main([str(tmp_path / "out")]) == 0  # again: nothing made twice
    assert len(client.search_runs([real.experiment_id])) == 3
    assert {r.info.run_name: r.info.status for r in client.search_runs([real.experiment_id])}["earlier"] == "FAILED"


def test_a_replay_that_fails_again_keeps_its_progress(tmp_path: Path) -> None:
    real, client, _, _ = _journaled_run(tmp_path)
    calls = {"n": 0}

    class FailsSecond:
        def __init__(self, inner: Tracker) -> None:
            self.inner = inner

        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            calls["n"] += 1
            if calls["n"] == 2:
                raise ConnectionError("down again")
            return getattr(self.inner, name)

    assert replay_journal(journals(tmp_path / "out"), lambda h: FailsSecond(make_tracker(h))) == (1, 1)
    assert replay_journal(journals(tmp_path / "out"), make_tracker) == (1, 0)  # the rest, not the first again
    (only,) = client.search_runs([real.experiment_id])
    assert only.data.metrics["completed"] == 6.0


def test_sync_refuses_a_folder_that_does_not_exist(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert sync.main([str(tmp_path / "missing")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_a_journal_cut_short_mid_line_replays_what_was_written_whole(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    real, client, path, run = _journaled_run(tmp_path)
    with path.open("a") as fh:  # the process died while writing the next write
        fh.write('{"op": "log_metrics", "args": ["' + run + '", {"comp')
    assert replay_journal(journals(tmp_path / "out"), make_tracker) == (2, 0)
    assert "its last line was cut short" in capsys.readouterr().err
    (only,) = client.search_runs([real.experiment_id])
    assert only.data.metrics["completed"] == 6.0


def test_a_damaged_line_before_the_last_is_refused_with_its_number(tmp_path: Path) -> None:
    _, _, path, _ = _journaled_run(tmp_path)
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "{not json", *lines[1:]]) + "\n")
    with pytest.raises(ValueError, match="line 2 is not a journaled write"):
        replay_journal(journals(tmp_path / "out"), make_tracker)


def test_a_replay_that_died_between_a_write_and_its_mark_makes_no_second_run(tmp_path: Path) -> None:
    real, client, _, _ = _journaled_run(tmp_path)

    class DiesAfterStarting:
        """The run is made in MLflow, then the process dies before the journal marks it done."""

        def __init__(self, inner: Tracker) -> None:
            self.inner = inner

        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            if name != "start_run":
                return getattr(self.inner, name)

            def start(*args, **kwargs):  # type: ignore[no-untyped-def]
                self.inner.start_run(*args, **kwargs)
                raise KeyboardInterrupt  # stands in for a SIGKILL between the write and its mark

            return start

    with pytest.raises(KeyboardInterrupt):
        replay_journal(journals(tmp_path / "out"), lambda h: DiesAfterStarting(make_tracker(h)))
    assert replay_journal(journals(tmp_path / "out"), make_tracker) == (2, 0)
    (only,) = client.search_runs([real.experiment_id])  # one run, not two
    assert only.data.metrics["completed"] == 6.0
