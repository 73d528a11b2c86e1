"""Real vLLM on the CPU, a real MLflow store, real HTTP: one job end to end.

Each server start costs 30-50 s here, so the windows are small: a handful of requests.
"""

from __future__ import annotations

import dataclasses
import json
import signal
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from pipeline.config import EngineConfig, JobConfig, LoadConfig, SpecConfig, WorkloadConfig
from pipeline.engines.models import ensure_embedded
from pipeline.record.tracking import Tracker, resolve_store
from pipeline.record.tracking import prepare as prepare_store
from pipeline.run.group import run_group
from pipeline.run.outcomes import GroupTask
from pipeline.run.plan import plan_sweep
from tests.integration.conftest import run_sweep, sigterm_once_serving

pytestmark = pytest.mark.integration

# float32: bf16 greedy output can change with batch composition (seen on this CPU); the
# losslessness assertion needs a strict comparison.
SMALL = [
    "engine.dtype=float32",
    "load.num_requests=6",
    "load.request_rate=2",
    "load.warmup_requests=1",
    "workload.max_tokens=64",
]


def _runs(project: Path, experiment: str) -> list:
    client = MlflowClient(f"sqlite:///{project}/mlruns/mlflow.db")
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    return client.search_runs([exp.experiment_id])


def test_baseline_and_ngram_end_to_end(tmp_path: Path, no_leftover_servers: None) -> None:
    proc = run_sweep(tmp_path, "spec=ngram", "spec.k=3", "sweep_name=itest", *SMALL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ngram-k3-r2" in proc.stdout and "TPOT speedup" in proc.stdout  # the final table

    runs = _runs(tmp_path, "itest")
    by_role = {r.data.tags.get("role"): r for r in runs}
    assert set(by_role) == {"sweep", "baseline", "speculative"}
    parent, base, spec = by_role["sweep"], by_role["baseline"], by_role["speculative"]
    for child in (base, spec):
        assert child.info.status == "FINISHED"
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.data.tags["engine.version"] and child.data.tags["hardware.cpu"]
        assert child.data.metrics["completed"] == 6 and child.data.metrics["failed"] == 0
        assert child.data.params["spec.k"] in ("3", "0")
    # Non-zero counters and a rate strictly inside (0, 100) percent.
    assert spec.data.metrics["spec_decode_num_drafts"] > 0
    assert spec.data.metrics["spec_decode_draft_tokens"] > 0
    assert 0 < spec.data.metrics["spec_decode_acceptance_rate"] < 100
    assert 1 < spec.data.metrics["spec_decode_acceptance_length"] < 4
    assert "spec_decode_num_drafts" not in base.data.metrics
    assert spec.data.metrics["speedup_median_tpot"] > 0 and parent.data.metrics["server_starts"] == 2
    assert spec.data.tags["baseline_hash"] == base.data.tags["point_hash"]

    client = MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    artifacts = {a.path for a in client.list_artifacts(spec.info.run_id)}
    assert {"server.log", "server_command.txt", "requests.csv", "summary.json"} <= artifacts
    command = Path(client.download_artifacts(spec.info.run_id, "server_command.txt", str(tmp_path))).read_text()
    assert '"method":"ngram"' in command and "--host 127.0.0.1" in command

    # Greedy outputs are identical with and without speculation (float32).
    base_rows = pd.read_csv(tmp_path / "out" / "01-baseline" / "baseline-r2" / "requests.csv").set_index("index")
    spec_rows = pd.read_csv(tmp_path / "out" / "02-ngram-k3" / "ngram-k3-r2" / "requests.csv").set_index("index")
    assert len(base_rows) == 6
    assert (base_rows["text"] == spec_rows["text"]).all()
    assert (base_rows["output_tokens"] == spec_rows["output_tokens"]).all()
    # Under speculation one chunk can carry several tokens: tokens come from usage, not chunks.
    assert spec_rows["num_chunks"].sum() < spec_rows["output_tokens"].sum()
    assert (base_rows["category"] == "code_edit").all()
    # The client reports its own health (its timing is pinned by the unit tests).
    assert spec.data.metrics["send_lateness_p50_ms"] <= spec.data.metrics["send_lateness_p99_ms"]
    assert spec.data.metrics["target_request_rate"] == 2.0


def test_model_as_its_own_draft_accepts_nearly_everything(tmp_path: Path, no_leftover_servers: None) -> None:
    # Checks the acceptance measurement itself: a draft equal to the target must be accepted.
    job = dataclasses.replace(
        JobConfig(),
        engine=EngineConfig(dtype="float32"),
        spec=SpecConfig(method="draft", k=3, draft_model="self"),
        load=LoadConfig(request_rate=float("inf"), num_requests=4, warmup_requests=1),
        workload=WorkloadConfig(max_tokens=48),
        sweep_name="self-draft",
        output_dir=str(tmp_path / "out"),
    )
    speculative = plan_sweep([job]).groups[1]  # run its server group alone, without the baseline
    store = resolve_store(job.tracking, tmp_path)
    tracker = Tracker(store, prepare_store(store, job.sweep_name))
    parent = tracker.start_run("self-draft", {"role": "sweep"})
    outcome = run_group(GroupTask(speculative, store, tracker.experiment_id, parent, gpus=0), tmp_path / "out")
    assert outcome.started and len(outcome.points) == 1
    point = outcome.points[0]
    assert point.error is None
    assert point.metrics["spec_decode_num_drafts"] > 0
    assert point.metrics["spec_decode_acceptance_rate"] > 90
    assert "spec_decode_acceptance_rate_pos_2" in point.metrics


def test_server_dying_at_start_is_reported_and_marked_failed(tmp_path: Path, no_leftover_servers: None) -> None:
    proc = run_sweep(tmp_path, "sweep_name=dies", "engine.extra_args=[--no-such-flag]", *SMALL, timeout=300)
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "no-such-flag" in proc.stdout  # the log tail is quoted
    children = [r for r in _runs(tmp_path, "dies") if r.data.tags.get("role") != "sweep"]
    assert len(children) == 2
    for run in children:
        assert run.info.status == "FAILED"
        assert "exited with code" in run.data.tags["error"]


def test_truncated_draft_has_four_layers() -> None:
    folder = ensure_embedded("smollm2-135m-l4")
    config = json.loads((folder / "config.json").read_text())
    assert config["num_hidden_layers"] == 4 and config["vocab_size"] == 49152


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_sigterm_mid_job_stops_every_server_process(tmp_path: Path, no_leftover_servers: None, sig: int,
                                                    code: int) -> None:  # fmt: skip
    # What a scheduler sends (or Ctrl-C): the job must stop its server's whole group (API
    # server, engine core, workers), not only the process it started, and say it was stopped.
    proc = sigterm_once_serving([f"hydra.run.dir={tmp_path}/out", "sweep_name=term", *SMALL], tmp_path, timeout=120,
                                sig=sig)  # fmt: skip
    assert proc.returncode == code, proc.stdout[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    experiment = client.get_experiment_by_name("term")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert runs and {r.info.status for r in runs} == {"KILLED"}, [(r.info.run_name, r.info.status) for r in runs]
