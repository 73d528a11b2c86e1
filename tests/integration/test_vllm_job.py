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

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from pipeline.compose import resolve_trace_rate
from pipeline.config import (
    EngineConfig,
    JobConfig,
    LoadConfig,
    LosslessConfig,
    SpecConfig,
    SweepSettings,
    WorkloadConfig,
)
from pipeline.engines.models import ensure_embedded
from pipeline.record.tracking import Tracker, resolve_store
from pipeline.record.tracking import prepare as prepare_store
from pipeline.run.group import run_group
from pipeline.run.outcomes import GroupTask
from pipeline.run.plan import plan_sweep
from tests.integration.conftest import FAST_START, TEST_SERVER, run_sweep, sigterm_once_serving

pytestmark = pytest.mark.integration

# float32: bf16 greedy output can change with batch composition (seen on this CPU); the
# losslessness assertion needs a strict comparison.
SMALL = [
    *TEST_SERVER,
    "load.num_requests=6",
    "load.min_duration_s=0",
    "load.request_rate=2",
    "load.warmup_requests=1",
    "workload.max_tokens=64",
]


def _runs(project: Path, experiment: str) -> list:
    client = MlflowClient(f"sqlite:///{project}/mlruns/mlflow.db")
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    return client.search_runs([exp.experiment_id])


# A trace of two kinds of text, one line a chat history, and one 3-turn conversation,
# replayed at twice its speed.
TRACE = [
    {"timestamp": 0.0, "prompt": "Add type hints: def area(w, h): return w * h", "category": "code_edit"},
    {
        "timestamp": 0.8,
        "messages": [
            {"role": "system", "content": "Answer in one line."},
            {"role": "user", "content": "What is a list comprehension?"},
        ],
        "category": "chat",
    },
    {
        "timestamp": 1.0,
        "conversation_id": "c",
        "prompt": "Write a function that doubles a number.",
        "category": "code_edit",
        "output_tokens": 24,
    },
    {"timestamp": 1.3, "prompt": "Rename the variables: def f(a, b): return a + b", "category": "code_edit"},
    {
        "timestamp": 1.6,
        "conversation_id": "c",
        "prompt": "Now add a docstring to it.",
        "delay_s": 0.4,
        "category": "code_edit",
        "output_tokens": 24,
    },
    {
        "timestamp": 2.2,
        "conversation_id": "c",
        "prompt": "Now rename it to twice.",
        "category": "code_edit",
        "output_tokens": 24,
    },
    {"timestamp": 3.1, "prompt": "Write a haiku about Python.", "category": "chat", "output_tokens": 24},
]
LATER_TURNS = (4, 5)  # rows of the conversation's turns 2 and 3


def test_model_as_its_own_draft_accepts_nearly_everything_on_a_replayed_trace(
    tmp_path: Path, no_leftover_servers: None
) -> None:
    """The acceptance measurement itself: a draft equal to the target must be accepted, and
    each request's own acceptance must add up to the window's counters. The load is a trace,
    replayed on its own (scaled) timestamps."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in TRACE))
    job = resolve_trace_rate(
        dataclasses.replace(
            JobConfig(),
            engine=EngineConfig(dtype="float32", cpu_kvcache_gib=1, env=FAST_START),  # as TEST_SERVER
            spec=SpecConfig(method="draft", k=3, draft_model="self"),
            load=LoadConfig(request_rate=None, warmup_requests=1),
            workload=WorkloadConfig(name="trace", path=str(trace), time_scale=0.5, max_tokens=48),
            sweep_name="self-draft",
            output_dir=str(tmp_path / "out"),
            # No losslessness probe: a draft equal to the target makes every probe token cost two
            # forward passes, and this test's subject is the acceptance, which the window measures.
            lossless=LosslessConfig(prompts=0),
        )
    )
    speculative = plan_sweep([job]).groups[1]  # run its server group alone, without the baseline
    store = resolve_store(job.tracking, tmp_path)
    tracker = Tracker(store, prepare_store(store, job.sweep_name))
    parent = tracker.start_run("self-draft", {"role": "sweep"})
    outcome = run_group(
        GroupTask(speculative, store, tracker.experiment_id, parent, SweepSettings.of([job])), tmp_path / "out"
    )
    assert outcome.started and len(outcome.points) == 1
    point = outcome.points[0]
    assert point.error is None
    assert point.metrics["spec_decode_num_drafts"] > 0
    assert point.metrics["spec_decode_acceptance_rate"] > 90
    assert "spec_decode_acceptance_rate_pos_2" in point.metrics
    # Per request (vLLM's metrics.speculative_decoding), summed: the counters' differences exactly.
    metrics = point.metrics
    assert metrics["spec_requests_counted"] == len(TRACE)
    assert metrics["spec_request_steps"] == metrics["spec_decode_num_drafts"]
    assert metrics["spec_request_accepted_tokens"] == metrics["spec_decode_accepted_tokens"]
    assert metrics["spec_request_draft_tokens"] == metrics["spec_decode_draft_tokens"]
    # The trace's own schedule at time_scale 0.5, exactly; its categories; its rates on the run.
    (path,) = (tmp_path / "out").rglob("requests.csv")
    rows = pd.read_csv(path).sort_values("index").reset_index(drop=True)
    own = [i for i in range(len(TRACE)) if i not in LATER_TURNS]
    assert rows["scheduled_s"][own].tolist() == [TRACE[i]["timestamp"] * 0.5 for i in own]
    assert rows["category"].tolist() == [line["category"] for line in TRACE]
    assert (rows["error"].isna()).all() and (rows["acceptance_length"] > 2.5).all()  # k=3: nearly 4 a step
    assert rows["output_tokens"].iloc[-1] <= 24  # the line's own output length
    # The conversation: each later turn was due its think time (delay_s, else the timestamp gap,
    # both halved) after the previous turn's last token, and was sent with that answer in its
    # history: its prompt holds the previous prompt and answer.
    assert rows["turn"][[2, *LATER_TURNS]].tolist() == [1, 2, 3]
    assert (rows["conversation_id"][[2, *LATER_TURNS]] == "c").all()
    for previous, later, think in ((2, 4, 0.4 * 0.5), (4, 5, (2.2 - 1.6) * 0.5)):
        end = json.loads(rows["chunk_s"][previous])[-1]
        assert rows["scheduled_s"][later] == pytest.approx(end + think, abs=1e-5)
        assert rows["sent_s"][later] >= end + think - 0.002
        assert rows["prompt_tokens"][later] > rows["prompt_tokens"][previous] + rows["output_tokens"][previous]
    # The draft's memory cost, as vLLM reports it: the draft's layers share the 1 GiB KV cache,
    # so a draft equal to the target leaves half the tokens the target alone would hold
    # (30 layers x K and V x 3 KV heads x 64 dims x 4 bytes, float32, per token).
    config = json.loads((ensure_embedded("smollm2-135m") / "config.json").read_text())
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    per_token = config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * head_dim * 4
    assert metrics["kv_cache_size_tokens"] == pytest.approx(2**30 / per_token / 2, rel=0.03)
    assert metrics["trace_requests"] == len(TRACE) and metrics["trace_scale"] == 0.5
    assert metrics["trace_conversations"] == 1
    assert metrics["trace_mean_rate"] == pytest.approx(6 / 3.1) and metrics["trace_peak_rate"] == 0.7


def test_an_eagle3_head_for_the_embedded_model_is_built_served_and_its_acceptance_read(
    tmp_path: Path, no_leftover_servers: None
) -> None:
    """spec=eagle3 on the default engine, with the test-sized head (embedded:smollm2-135m-eagle3-quick,
    trained once per test session, about a minute and a half; the full head, ~10 min, is measured by
    benchmarks/methods_side_by_side.py): the server starts with it, acceptance is read from the
    counters and per position, the head drafts tokens the target accepts (L > 1), and each
    request's own acceptance adds up to the counters, as for the other methods."""
    job = dataclasses.replace(
        JobConfig(),
        engine=EngineConfig(dtype="float32", cpu_kvcache_gib=1, env=FAST_START),  # as TEST_SERVER
        spec=SpecConfig(method="eagle3", k=3, draft_model="embedded:smollm2-135m-eagle3-quick"),
        load=LoadConfig(request_rate=float("inf"), num_requests=6, warmup_requests=1),
        workload=WorkloadConfig(name="code_edit", max_tokens=64),
        sweep_name="eagle3",
        output_dir=str(tmp_path / "out"),
        lossless=LosslessConfig(prompts=0),  # the window is this test's subject
    )
    speculative = plan_sweep([job]).groups[1]  # its server group alone, without the baseline
    store = resolve_store(job.tracking, tmp_path)
    tracker = Tracker(store, prepare_store(store, job.sweep_name))
    parent = tracker.start_run("eagle3", {"role": "sweep"})
    outcome = run_group(
        GroupTask(speculative, store, tracker.experiment_id, parent, SweepSettings.of([job])), tmp_path / "out"
    )
    assert outcome.started and len(outcome.points) == 1
    (point,) = outcome.points
    assert point.error is None
    metrics = point.metrics
    assert metrics["spec_decode_num_drafts"] > 0
    assert 0 < metrics["spec_decode_draft_tokens"] <= 3 * metrics["spec_decode_num_drafts"]
    positions = [metrics[f"spec_decode_acceptance_rate_pos_{i}"] for i in range(3)]
    assert positions[0] > 0 and positions == sorted(positions, reverse=True)  # unconditional: never rising
    assert metrics["spec_decode_acceptance_length"] > 1.0
    assert metrics["spec_decode_acceptance_length"] == pytest.approx(1 + sum(positions), rel=1e-6)
    assert metrics["spec_requests_counted"] == 6
    assert metrics["spec_request_steps"] == metrics["spec_decode_num_drafts"]
    assert metrics["spec_request_accepted_tokens"] == metrics["spec_decode_accepted_tokens"]
    assert metrics["spec_request_draft_tokens"] == metrics["spec_decode_draft_tokens"]
    # The head's own weights (one layer, fc, norms, a 4,096-token output layer; the embeddings
    # are the target's), float32, and the KV cache it leaves of the same 1 GiB.
    assert 5e6 < metrics["draft_parameters"] < 12e6
    assert metrics["draft_parameter_bytes"] == 4 * metrics["draft_parameters"]
    assert metrics["kv_cache_size_tokens"] > 0


def test_server_dying_at_start_is_reported_and_marked_failed(tmp_path: Path, no_leftover_servers: None) -> None:
    # A flag vLLM has (a misspelt one is refused before any server starts), with a value its
    # parser rejects: the server exits at start-up. The baseline alone: one start that fails is
    # the path under test, and a second group's would only repeat it.
    proc = run_sweep(
        tmp_path, "sweep_name=dies", "spec=none", "engine.extra_args=[--max-num-seqs,many]", *SMALL, timeout=300
    )
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "invalid int value: 'many'" in proc.stdout  # the log tail is quoted
    assert "report: not written" not in proc.stdout  # a sweep whose every point failed still gets its report
    children = [r for r in _runs(tmp_path, "dies") if r.data.tags.get("role") != "sweep"]
    assert len(children) == 1
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
@pytest.mark.parametrize(
    ("sig", "code", "moment"),
    [(signal.SIGTERM, 143, "server ready"), (signal.SIGINT, 130, "server starting")],
    ids=["SIGTERM-serving", "SIGINT-starting"],
)
def test_a_signal_mid_job_stops_every_server_process(
    tmp_path: Path, no_leftover_servers: None, sig: int, code: int, moment: str
) -> None:
    # What a scheduler sends (or Ctrl-C): the job must stop its server's whole group (API
    # server, engine core, workers), not only the process it started, and say it was stopped.
    proc = sigterm_once_serving(
        [f"hydra.run.dir={tmp_path}/out", "sweep_name=term", "progress_every_s=2", *SMALL],
        tmp_path,
        timeout=120,
        sig=sig,
        moment=moment,
    )
    assert proc.returncode == code, proc.stdout[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    experiment = client.get_experiment_by_name("term")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert runs and {r.info.status for r in runs} == {"KILLED"}, [(r.info.run_name, r.info.status) for r in runs]
