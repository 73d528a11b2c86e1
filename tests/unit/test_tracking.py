"""Tracking against a real MLflow SQLite store in a temporary folder."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from pipeline.config import EngineConfig, JobConfig
from pipeline.record.tracking import Tracker, flatten_params, prepare, resolve_store
from tests.fakes import recorded_identity


def test_params_are_flat_and_secrets_masked() -> None:
    job = dataclasses.replace(
        JobConfig(), engine=EngineConfig(env={"HF_TOKEN": "hf_secret"}, extra_args=["--api-key", "sk-secret"])
    )
    params = flatten_params(job)
    assert params["spec.method"] == "ngram" and params["load.request_rate"] == "1.0"
    assert params["engine.env.HF_TOKEN"] == "***"
    assert "sk-secret" not in params["engine.extra_args"]
    assert all("secret" not in v for v in params.values())


def test_store_runs_and_failed_child(tmp_path: Path) -> None:
    store = resolve_store(JobConfig().tracking, tmp_path)
    assert store.tracking_uri == f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    experiment_id = prepare(store, "unit")
    assert prepare(store, "unit") == experiment_id  # idempotent
    tracker = Tracker(store, experiment_id)
    parent_id = tracker.start_run("p", {"role": "sweep"})
    ok_id = tracker.start_run("ok", {"role": "baseline", **recorded_identity("abc")}, parent_id)
    tracker.log_params(ok_id, {"a": "1"})
    tracker.log_metrics(ok_id, {"median_tpot_ms": 12.5, "nan_metric": float("nan")})
    tracker.log_text(ok_id, "cmd\n", "server_command.txt")
    tracker.set_tags(ok_id, {"status": "finished"})
    tracker.end_run(ok_id)
    bad_id = tracker.start_run("bad", {"role": "speculative", "point_hash": "def"}, parent_id)
    tracker.end_run(bad_id, error="server died")
    tracker.end_run(parent_id)
    client = MlflowClient(store.tracking_uri)
    ok = client.get_run(ok_id)
    assert ok.info.status == "FINISHED" and ok.data.metrics["median_tpot_ms"] == 12.5
    assert "nan_metric" not in ok.data.metrics
    assert ok.data.tags["mlflow.parentRunId"] == parent_id and ok.data.params["a"] == "1"
    bad = client.get_run(bad_id)
    assert bad.info.status == "FAILED" and "server died" in bad.data.tags["error"]
    artifacts = Path(mlflow.artifacts.download_artifacts(run_id=ok_id, tracking_uri=store.tracking_uri))
    assert (artifacts / "server_command.txt").read_text() == "cmd\n"
    assert str(tmp_path / "mlruns" / "artifacts") in client.get_experiment(experiment_id).artifact_location
    # Resume sees only the point that finished, with its metrics and the identity it recorded.
    finished = tracker.finished_points()
    assert set(finished) == {"abc"} and [f.run_id for f in finished["abc"]] == [ok_id]
    assert finished["abc"][0].metrics["median_tpot_ms"] == 12.5
    assert finished["abc"][0].identity.tags() == recorded_identity("abc")
    # A run from before identities is found by its settings hash, with the parts it did not record unknown.
    old_id = tracker.start_run("old", {"role": "baseline", "point_hash": "abc", "status": "finished"}, parent_id)
    tracker.end_run(old_id)
    newest, older = tracker.finished_points()["abc"]
    assert newest.run_id == old_id and not newest.identity.complete and older.identity.complete


def test_unreachable_tracking_server_fails_fast_naming_the_fix() -> None:
    import socket
    import time

    from pipeline.config import TrackingConfig
    from pipeline.record.tracking import TrackingError, check_store_reachable

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = resolve_store(TrackingConfig(uri=f"http://127.0.0.1:{port}"), Path("."))
    started = time.monotonic()
    with pytest.raises(TrackingError, match="does not answer.*tracking-server"):
        check_store_reachable(store, timeout_s=2.0)
    assert time.monotonic() - started < 10


def test_sweep_reader_finds_the_newest_sweep_run_of_an_experiment(tmp_path: Path) -> None:
    from pipeline.record.readers import SweepReader
    from pipeline.record.tracking import TrackingError

    store = resolve_store(JobConfig().tracking, tmp_path)
    tracker = Tracker(store, prepare(store, "reader"))
    import time

    # The older sweep run started a minute before: its start time, not the clock's resolution, orders them.
    old = tracker.client.create_run(
        tracker.experiment_id,
        run_name="reader 1",
        tags={"role": "sweep", "sweep_name": "reader"},
        start_time=int(time.time() * 1000) - 60_000,
    ).info.run_id
    child = tracker.start_run("ngram-k3-r1", {"role": "speculative"}, old)
    new = tracker.start_run("reader 2", {"role": "sweep", "sweep_name": "reader"})
    reader = SweepReader(store.tracking_uri)
    assert reader.find_parent("reader") == new
    assert reader.find_parent(old) == old
    with pytest.raises(TrackingError, match=f"give its parent run {old}"):
        reader.find_parent(child)
    with pytest.raises(TrackingError, match="neither an experiment"):
        reader.find_parent("no-such-sweep")
    assert reader.download(new, "summary.csv", tmp_path / "d") is None


def test_two_sweeps_creating_one_new_store_at_once_both_succeed(tmp_path: Path) -> None:
    import subprocess
    import sys

    # Each process imports all that creating the store needs (MLflow's SQL store, the lock),
    # says it is ready and waits; once both are, both are told to go at the same moment, and
    # each creates the store and its own experiment. (A deadline instead of this barrier
    # passes unseen when the imports take longer than it, and then the two never race.)
    script = (
        "import sys; from pathlib import Path\n"
        "import filelock, mlflow.store.tracking.sqlalchemy_store\n"
        "from pipeline.config import TrackingConfig\n"
        "from pipeline.record.tracking import prepare, resolve_store\n"
        "store = resolve_store(TrackingConfig(), Path(sys.argv[1]))\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        "print(prepare(store, sys.argv[2]))\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path), name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("sweep-a", "sweep-b")
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline() == "ready\n", p.communicate(timeout=120)[1][-2000:]
    for p in procs:  # the barrier: both are ready; both go
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in results]
    assert len({out.strip() for out, _ in results}) == 2  # two experiments in one store


# ---- the commands read the store MLFLOW_TRACKING_URI names ------------------------------------


def test_the_commands_read_mlflow_tracking_uri_before_the_projects_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.record.tracking import command_store

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert command_store(None, tmp_path).tracking_uri == f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.team:5000")
    assert command_store(None, tmp_path).tracking_uri == "http://mlflow.team:5000"
    assert command_store("http://other:5000", tmp_path).tracking_uri == "http://other:5000"  # the flag wins


def test_a_sweep_writes_to_the_store_mlflow_tracking_uri_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, a sweep ignored it (only sweeps/nightly.yaml read it) and wrote to ./mlruns without a
    word. tracking.uri, where given, still wins; an address holding a password is refused, and
    never printed, since the config is logged."""
    from tests.in_process import compose_jobs, sweep_in_process

    def store(*args: str) -> str:
        (job,) = compose_jobs(list(args), False, str(tmp_path / "out"))
        return resolve_store(job.tracking, tmp_path).tracking_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert store() == f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.team:5000")
    assert store() == "http://mlflow.team:5000"
    assert store("tracking.uri=http://other:5000") == "http://other:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://nightly:s3cret@mlflow.team:5000")
    assert sweep_in_process(False, tmp_path, ["dry_run=true"]) == 2
    err = capsys.readouterr().err
    assert "tracking.uri holds a user name or password" in err and "s3cret" not in err


def test_pipeline_report_reads_the_store_the_environment_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, it read ./mlruns whatever MLFLOW_TRACKING_URI said, and found no sweep there."""
    from pipeline import report

    elsewhere = resolve_store(JobConfig().tracking, tmp_path / "team")
    prepare(elsewhere, "team-sweep")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", elsewhere.tracking_uri)
    with pytest.raises(SystemExit):
        report.main(["no-such-sweep", "--project", str(tmp_path / "empty")])
    assert "'team-sweep'" in capsys.readouterr().err  # the experiments it lists are the named store's


def test_pipeline_ui_points_at_a_tracking_servers_own_ui_and_starts_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A scripted MLflow REST answer (experiments/get-by-name): the UI of a server is the server's."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from pipeline import ui

    class Api(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the stdlib's name
            body = {"experiment": {"experiment_id": "7", "name": "llama70b-nightly", "lifecycle_stage": "active"}}
            data = json.dumps(body).encode()
            self.send_response(200 if "get-by-name" in self.path else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    started: list[object] = []
    monkeypatch.setattr(ui, "start", lambda *a, **k: started.append(a))
    try:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{server.server_port}/")
        ui.main(["--experiment", "llama70b-nightly"])
    finally:
        server.shutdown()
    assert capsys.readouterr().out == f"MLflow UI: http://127.0.0.1:{server.server_port}/#/experiments/7/runs\n"
    assert not started


def test_pipeline_ui_serves_a_database_the_environment_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline import ui

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/elsewhere/mlflow.db")
    with pytest.raises(SystemExit, match=f"no MLflow store at {tmp_path}/elsewhere/mlflow.db"):
        ui.main(["--project", str(tmp_path / "project")])


def test_a_server_that_refuses_its_host_name_is_named_as_such_not_as_bad_credentials() -> None:
    """MLflow 3.17's server answers 403 "Invalid Host header" to a name outside --allowed-hosts (a
    Kubernetes Service's DNS name, mlflow.internal), seen here with a real `mlflow server`."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from pipeline.record.tracking import Store, TrackingError, check_store_reachable

    class Guarded(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the stdlib's name
            health = self.path.startswith("/health")
            body = b"OK" if health else b"Invalid Host header - possible DNS rebinding attack detected"
            self.send_response(200 if health else 403)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Guarded)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(TrackingError, match="refuses the host name it is called by.*--allowed-hosts"):
            check_store_reachable(Store(f"http://127.0.0.1:{server.server_port}", None))
    finally:
        server.shutdown()


def test_preparing_a_store_leaves_the_environment_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow's set_tracking_uri exports the address as MLFLOW_TRACKING_URI, which a sweep reads as
    its default store: a process that prepared one store must not hand it to every sweep it starts."""
    from pipeline.config import TrackingConfig
    from pipeline.record.tracking import prepare, resolve_store

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    prepare(resolve_store(TrackingConfig(), tmp_path), "first")
    assert "MLFLOW_TRACKING_URI" not in os.environ
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://10.0.0.7:5000")
    prepare(resolve_store(TrackingConfig(), tmp_path / "other"), "second")
    assert os.environ["MLFLOW_TRACKING_URI"] == "http://10.0.0.7:5000"
