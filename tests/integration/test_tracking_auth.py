"""A tracking server other machines can reach sits behind MLflow's basic-auth app, started as
``make tracking-server-auth`` starts it. A sweep signs in with the credentials in its
environment, refuses to start without them, and writes no secret anywhere: sentinel values
for the MLflow password, an HF token and a server secret passed by name are searched for in
every file the sweep and the server wrote and in every MLflow field."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from mlflow.tracking import MlflowClient

from tests.cluster import mlflow_server
from tests.integration.conftest import TEST_SERVER, vllm_server_pids

pytestmark = pytest.mark.integration

PASSWORD = "mlflow-pw-sentinel-5f1c"
SECRETS = {
    "MLFLOW_TRACKING_PASSWORD": PASSWORD,
    "HF_TOKEN": "hf_sentinel_token_93ab",
    "SPECSWEEP_TEST_SECRET": "server-secret-sentinel-77d2",
}
SMALL = [
    "spec=none",
    *TEST_SERVER,
    "load.num_requests=4",
    "load.min_duration_s=0",
    "load.request_rate=2",
    "load.warmup_requests=1",
    "workload.max_tokens=16",
    "lossless.prompts=0",
]


def _sweep(tmp_path: Path, uri: str, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.sweep",
            f"hydra.run.dir={tmp_path}/out",
            f"tracking.uri={uri}",
            "sweep_name=auth",
            *SMALL,
            *extra,
        ],
        cwd=tmp_path,
        env=clean | env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_basic_auth_server_takes_the_credentials_from_the_environment_and_no_secret_is_written(
    tmp_path: Path,
) -> None:
    with mlflow_server(tmp_path / "mlflow", admin_password=PASSWORD) as server:
        anonymous = httpx.get(f"{server.uri}/api/2.0/mlflow/experiments/search", params={"max_results": 1})
        assert anonymous.status_code == 401  # nobody in without signing in

        before = vllm_server_pids()
        refused = _sweep(tmp_path, server.uri, {})
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert "asks for credentials: set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD" in refused.stderr
        wrong = _sweep(tmp_path, server.uri, {"MLFLOW_TRACKING_USERNAME": "admin", "MLFLOW_TRACKING_PASSWORD": "nope"})
        assert wrong.returncode == 2 and "refuses the credentials" in wrong.stderr, wrong.stderr[-2000:]
        assert vllm_server_pids() == before  # refused before any server started

        signed_in = {"MLFLOW_TRACKING_USERNAME": "admin", **SECRETS}
        done = _sweep(tmp_path, server.uri, signed_in, "engine.env_from=[SPECSWEEP_TEST_SECRET]")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert not vllm_server_pids() - before

        client = MlflowClient(server.uri)
        os.environ.update(MLFLOW_TRACKING_USERNAME="admin", MLFLOW_TRACKING_PASSWORD=PASSWORD)
        try:
            experiment = client.get_experiment_by_name("auth")
            assert experiment is not None
            runs = client.search_runs([experiment.experiment_id])
        finally:
            for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
                os.environ.pop(name)
        assert {r.data.tags.get("role") for r in runs} == {"sweep", "baseline"}
        fields = [(k, v) for r in runs for d in (r.data.params, r.data.tags) for k, v in d.items()]
        fields += [(k, "") for r in runs for k in r.data.metrics]
    secrets = [s.encode() for s in SECRETS.values()]
    leaks = [f"{k}={v[:80]}" for k, v in fields if any(s.decode() in f"{k} {v}" for s in secrets)]
    assert not leaks, leaks
    # Every file: the sweep's outputs, the server's log, the artifacts the server holds, MLflow's stores.
    files = [f for f in tmp_path.rglob("*") if f.is_file()]
    assert any(f.name == "requests.csv" for f in files) and any(f.name == "server.log" for f in files)
    leaked = [str(f) for f in files if any(s in f.read_bytes() for s in secrets)]
    assert not leaked, leaked
    assert not any(s.decode() in done.stdout + done.stderr for s in secrets)
