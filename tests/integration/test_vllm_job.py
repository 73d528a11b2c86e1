"""Real vLLM on the CPU, a real MLflow store, real HTTP: the job's own paths (a draft model, a
server that dies at start, signals). One job end to end, baseline and ngram, is checked on
test_sweep.py's shared sweep, which measures exactly that among its points.

Each server start costs 30-60 s here, so the windows are small: a handful of requests.
"""

from __future__ import annotations

import dataclasses
import json
import signal
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from pipeline.config import EngineConfig, JobConfig, LoadConfig, SpecConfig, WorkloadConfig
from pipeline.engines.models import ensure_embedded
from pipeline.record.tracking import Tracker, resolve_store
from pipeline.record.tracking import prepare as prepare_store
from pipeline.run.group import run_group
from pipeline.run.outcomes import GroupTask
from pipeline.run.plan import plan_sweep
from tests.integration.conftest import TEST_SERVER, run_sweep, sigterm_once_serving

pytestmark = pytest.mark.integration

# float32: bf16 greedy output can change with batch composition (seen on this CPU); the
# losslessness assertion needs a strict comparison.
SMALL = [
    *TEST_SERVER,
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


def test_model_as_its_own_draft_accepts_nearly_everything(tmp_path: Path, no_leftover_servers: None) -> None:
    # Checks the acceptance measurement itself: a draft equal to the target must be accepted.
    job = dataclasses.replace(
        JobConfig(),
        engine=EngineConfig(dtype="float32", cpu_kvcache_gib=1),  # as TEST_SERVER
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


# SIGTERM once the server serves (its engine core and worker up); Ctrl-C while it is still
# starting, the cheaper moment on the same path (the entry point's handler stops the server's
# whole process group), which spares the test a whole start-up.
@pytest.mark.parametrize(("sig", "code", "moment"), [(signal.SIGTERM, 143, "server ready"),
                                                     (signal.SIGINT, 130, "server starting")],
                         ids=["SIGTERM-serving", "SIGINT-starting"])  # fmt: skip
def test_a_signal_mid_job_stops_every_server_process(tmp_path: Path, no_leftover_servers: None, sig: int,
                                                     code: int, moment: str) -> None:  # fmt: skip
    # What a scheduler sends (or Ctrl-C): the job must stop its server's whole group (API
    # server, engine core, workers), not only the process it started, and say it was stopped.
    proc = sigterm_once_serving([f"hydra.run.dir={tmp_path}/out", "sweep_name=term", "progress_every_s=2", *SMALL],
                                tmp_path, timeout=120, sig=sig, moment=moment)  # fmt: skip
    assert proc.returncode == code, proc.stdout[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    experiment = client.get_experiment_by_name("term")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert runs and {r.info.status for r in runs} == {"KILLED"}, [(r.info.run_name, r.info.status) for r in runs]
