"""``python -m pipeline.ui``: the MLflow UI of the store the sweeps wrote to, on 127.0.0.1.

The store is ``--tracking-uri``, else MLFLOW_TRACKING_URI, else the project's own ``mlruns/``.
A tracking server (http/https) serves its own UI: the command prints the URL of the runs table
there and starts nothing. Any other store (SQLite, PostgreSQL) is served here: it prints the URL
of a sweep's runs table (the newest one unless named) and serves until Ctrl-C. One worker: the
UI is for one person, and each worker costs memory.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from pipeline import startup
from pipeline.engines.process import free_port

READY_TIMEOUT_S = 60.0


def runs_table_url(base_url: str, experiment_id: str) -> str:
    return f"{base_url}/#/experiments/{experiment_id}/runs"


def _experiment_id(tracking_uri: str, name: str | None) -> str:
    # MLflow's client: imported only once the UI runs.
    from pipeline.record.readers import find_experiment
    from pipeline.record.tracking import TrackingError

    try:
        return find_experiment(tracking_uri, name)
    except TrackingError as exc:
        raise SystemExit(f"error: {exc}") from exc


def serves_itself(tracking_uri: str) -> bool:
    """A tracking server has a UI of its own; a database needs one started here."""
    return tracking_uri.startswith(("http://", "https://"))


def start(store: Any, project_root: Path, host: str, port: int) -> tuple[subprocess.Popen[bytes], str, str]:
    """Start the UI over ``store`` (a record.tracking.Store); return the process, its base URL and
    the tracking URI it serves."""
    if store.tracking_uri.startswith("sqlite:///"):
        db = Path(store.tracking_uri.removeprefix("sqlite:///"))
        if not db.is_file():
            raise SystemExit(f"error: no MLflow store at {db}; run a sweep from {project_root} first")
    # A project's store names its artifact root; another database's runs carry their own.
    root = store.artifact_root or (Path(store.tracking_uri.removeprefix("sqlite:///")).parent / "artifacts").as_uri()
    command = [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
        "--backend-store-uri",
        store.tracking_uri,
        "--default-artifact-root",
        str(root),
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    # The UI's own log goes to stderr, so stdout carries only the URL (scripts read it).
    proc = subprocess.Popen(command, start_new_session=True, stdout=sys.stderr)
    base_url = f"http://{host}:{port}"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"error: the MLflow UI exited with code {proc.returncode} at start-up")
        try:
            if httpx.get(base_url + "/health", timeout=2.0, trust_env=False).status_code == 200:
                return proc, base_url, store.tracking_uri
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop(proc)
    raise SystemExit(f"error: the MLflow UI did not answer at {base_url} within {READY_TIMEOUT_S:g} s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipeline.ui", description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", help="sweep name (default: the most recently updated)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    parser.add_argument(
        "--tracking-uri", help="the MLflow store or server (default: $MLFLOW_TRACKING_URI, else the project's)"
    )
    parser.add_argument("--project", type=Path, default=Path.cwd(), help="folder holding mlruns/ (default: here)")
    args = parser.parse_args(argv)
    startup.begin(verbose=False)  # SIGTERM too: `finally` stops the UI's own process group
    from pipeline.record.tracking import command_store

    store = command_store(args.tracking_uri, args.project.resolve())
    if serves_itself(store.tracking_uri):  # nothing to start: the server's own UI
        base = store.tracking_uri.rstrip("/")
        print(f"MLflow UI: {runs_table_url(base, _experiment_id(store.tracking_uri, args.experiment))}", flush=True)
        return
    proc, base_url, uri = start(store, args.project.resolve(), args.host, args.port or free_port(args.host))
    try:
        print(f"MLflow UI: {runs_table_url(base_url, _experiment_id(uri, args.experiment))}", flush=True)
        proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the UI and the server workers it forked (they share its session)."""
    for sig, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


if __name__ == "__main__":
    main()
