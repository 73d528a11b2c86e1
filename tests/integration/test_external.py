"""engine=external on real vLLM: two servers this module starts itself (a baseline and ngram
k=3), measured by sweeps that start and stop nothing: a window of the bundled prompts, a replayed
trace with a conversation, and a sweep whose tracking server goes away mid-sweep (a fault of the
store, not of the engine, so the engine's start is not what it needs). The scripted cases (no
/metrics, counters shared with other traffic) are tests/unit/test_external.py.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from pipeline.config import EngineConfig, JobConfig, SpecConfig
from pipeline.engines.acceptance import V1_DRAFTS, parse_scrape
from pipeline.engines.base import EngineServer
from pipeline.run.job import resolve_target, server_spec
from tests import procs
from tests.integration.conftest import FAST_START, read_until, rest_of_output, run_sweep, start_sweep, vllm_server_pids

pytestmark = pytest.mark.integration


def _drafts(url: str) -> float:
    return parse_scrape(httpx.get(url + "/metrics", timeout=30, trust_env=False).text).get(V1_DRAFTS) or 0.0


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EngineServer, EngineServer]]:
    """A baseline and an ngram k=3 server, started here as the sweep would start them, for every
    sweep of this module; stopped once it is done."""
    logs = tmp_path_factory.mktemp("external-servers")
    base_job = JobConfig(
        engine=EngineConfig(dtype="float32", cpu_kvcache_gib=1, env=FAST_START), spec=SpecConfig(method="none")
    )
    spec_job = dataclasses.replace(
        base_job, spec=SpecConfig(method="ngram", k=3, options={"prompt_lookup_max": 4, "prompt_lookup_min": 2})
    )
    target = resolve_target(base_job)
    base = EngineServer(server_spec(target, base_job, logs / "base.log"))
    spec = EngineServer(server_spec(target, spec_job, logs / "spec.log"))
    try:
        # Both start at once: nothing is measured while they start, and each start is mostly one
        # process importing vLLM, so on 2 cores the two overlap (~15 s saved). A start that fails
        # is raised here, once the other has finished starting; both are stopped either way.
        with ThreadPoolExecutor(max_workers=2) as pool:
            for started in [pool.submit(server.__enter__) for server in (base, spec)]:
                started.result()
        yield base, spec
    finally:
        for server in (spec, base):
            server.stop()


def _external(base: EngineServer, spec: EngineServer) -> list[str]:
    return ["engine=external", f"engine.url={spec.base_url}", f"engine.baseline_url={base.base_url}/v1"]


@contextmanager
def another_client(url: str) -> Iterator[list[int]]:
    """A third client, sending the server a short request every 0.3 s until the block ends: the
    users a production deployment serves while it is measured. Yields the count it sent."""
    sent = [0]
    stop = threading.Event()

    def send() -> None:
        with httpx.Client(trust_env=False, timeout=60) as client:
            while not stop.wait(0.3):
                client.post(
                    url + "/v1/completions", json={"model": "embedded:smollm2-135m", "prompt": "Hi", "max_tokens": 2}
                )
                sent[0] += 1

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    try:
        yield sent
    finally:
        stop.set()
        thread.join()


def test_two_running_servers_are_measured_on_the_same_requests_and_left_running(
    tmp_path: Path, no_leftover_servers: None, servers: tuple[EngineServer, EngineServer]
) -> None:
    """The sweep starts and stops nothing, says what it will send each URL first (4 req/s is above
    the small default: engine.external_ok_to_load=true sends it), and a third client's traffic on
    the baseline during the window marks its latency ratios "shared with other traffic"."""
    base, spec = servers
    drafts_before = _drafts(spec.base_url)
    args = [
        sys.executable,
        "-m",
        "pipeline.sweep",
        f"hydra.run.dir={tmp_path}/out",
        "sweep_name=ext",
        *_external(base, spec),
        "spec=ngram",
        "spec.k=3",
        "load.num_requests=6",
        "load.min_duration_s=0",
        "load.request_rate=4",
        "load.warmup_requests=1",
        "workload.max_tokens=48",
        "lossless.prompts=2",
        "engine.external_ok_to_load=true",
    ]
    with another_client(base.base_url) as third:
        sweep = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        started: list[str] = []  # any vLLM process under the sweep, sampled while it runs
        deadline = time.monotonic() + 600
        while sweep.poll() is None and time.monotonic() < deadline:
            started += [" ".join(procs.cmdline(p)) for p in procs.matching([sweep.pid], procs.SERVER_PATTERN)]
            time.sleep(0.5)
        output = sweep.communicate(timeout=60)[0]
    assert third[0] > 0
    assert f"9 requests, up to 4 req/s, to {spec.base_url} (engine.url)" in output  # 6, 1 warm-up, 2 probes
    assert sweep.returncode == 0, output[-4000:]
    assert not started, f"the sweep started a server: {started[:2]}"
    # Nothing was stopped: both servers still serve, and the speculative one drafted for
    # the window, its warm-up and the losslessness probe.
    assert base.healthy() and spec.healthy() and base.alive() and spec.alive()
    drafts_during = _drafts(spec.base_url) - drafts_before
    assert "already running" in output
    client = MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    experiment = client.get_experiment_by_name("ext")
    assert experiment is not None
    runs = {r.data.tags.get("role"): r for r in client.search_runs([experiment.experiment_id])}
    baseline, speculative = runs["baseline"], runs["speculative"]
    for run in (baseline, speculative):
        assert run.info.status == "FINISHED", run.data.tags.get("error")
        assert run.data.tags["engine"] == "external" and run.data.tags["prefix_cache.policy"] == "as_is"
        assert run.data.tags["engine.version"] == "0.32.0"  # the server's own /version
        assert run.data.metrics["completed"] == 6
        assert "server_startup_s" not in run.data.metrics and "server_rss_mib" not in run.data.metrics
    # The window's acceptance from the speculative server's counters: a part of what it drafted
    # while the sweep ran (the warm-up and the probe drafted too), and equal to the per-request sums.
    window = speculative.data.metrics
    assert speculative.data.tags["acceptance.source"] == "vllm-v1-counters"
    assert 0 < window["spec_decode_num_drafts"] < drafts_during
    assert window["spec_request_steps"] == window["spec_decode_num_drafts"]
    assert window["spec_decode_acceptance_length"] > 1.0
    assert "spec_decode_num_drafts" not in baseline.data.metrics
    # The third client's requests on the baseline's counters: the window is not the server's alone.
    assert baseline.data.metrics["window.other_requests"] > 0 and baseline.data.metrics["validity.other_traffic"] == 0
    assert speculative.data.metrics["validity.other_traffic"] == 1
    # The comparison and the report name the condition, and withhold the latency verdicts.
    report = next((tmp_path / "out").rglob("report.md")).read_text()
    assert "external servers" in report and "as it is" in report
    assert "FAILED, no other traffic on the server" in report
    rows = [line for line in report.splitlines() if line.startswith("| external ngram k=3 | median TPOT")]
    # Withheld for the other traffic, whatever else the loaded machine's short window failed.
    assert rows and all(r.startswith("withheld: ") for r in (row.split(" | ")[-1] for row in rows))
    assert all("shared with other traffic (baseline: the server finished" in r for r in rows)


def _runs(project: Path, experiment: str) -> list:
    client = MlflowClient(f"sqlite:///{project}/mlruns/mlflow.db")
    found = client.get_experiment_by_name(experiment)
    assert found is not None
    return client.search_runs([found.experiment_id])


def test_a_trace_sweep_with_a_conversation_gets_its_verdicts_per_request_type_and_turn(
    tmp_path: Path, no_leftover_servers: None, servers: tuple[EngineServer, EngineServer]
) -> None:
    """The real entry point on a trace of two kinds of text and one 3-turn conversation, on this
    module's baseline and ngram k=3 servers: the per-request acceptance, the losslessness probe (its 7th prompt a
    later turn, sent alone), the report's 'By request type' and 'By conversation turn', and their metrics on the
    run. The trace is written as a user's export is: two lines ask for 150 output tokens (output_length, above
    workload.max_tokens=48) and get them; two lengths-only lines (input_length, shared hash ids) reach the chat
    endpoint at exactly their length; a later turn carries its history; a field of the user's own is listed."""
    code = "Add type hints to this function: def f{i}(a, b): return a * b + {i}"
    chat = "In one sentence, what is your favourite thing about the number {i}?"
    lines = [
        {
            "timestamp": 0.4 * i,
            "prompt": (code if i % 2 else chat).format(i=i),
            "category": "code_edit" if i % 2 else "chat",
        }
        for i in range(10)
    ]
    lines += [
        {
            "timestamp": 1.0,
            "conversation_id": "c",
            "prompt": "Write a function that doubles a number.",
            "category": "code_edit",
        },
        {
            "timestamp": 2.0,
            "conversation_id": "c",
            "prompt": "Now add a docstring to it.",
            "delay_s": 0.2,
            "category": "code_edit",
        },
        {
            "timestamp": 3.0,
            "conversation_id": "c",
            "prompt": "Now rename it to twice.",
            "delay_s": 0.2,
            "category": "code_edit",
        },
    ]
    lines[1] |= {"output_length": 150}
    lines[4] |= {"output_tokens": 150}
    lines += [
        {"timestamp": 2.2, "input_length": 300, "output_length": 24, "hash_ids": [1, 2], "category": "synthetic"},
        {"timestamp": 2.6, "input_length": 280, "output_length": 24, "hash_ids": [1, 3], "category": "synthetic"},
    ]
    for line in lines:
        line["user_id"] = "u1"  # the user's own field: listed as not replayed
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in sorted(lines, key=lambda x: x["timestamp"])))
    proc = run_sweep(
        tmp_path,
        "sweep_name=traced",
        "workload=trace",
        f"workload.path={trace}",
        "workload.max_tokens=48",
        "workload.ignore_eos=true",
        "workload.hash_block_tokens=128",
        "load.warmup_requests=1",
        "lossless.prompts=7",
        "lossless.max_tokens=16",  # the probe's subject here is a later turn sent alone, not its length
        *_external(*servers),
        "spec=ngram",
        "spec.k=3",
        "engine.external_ok_to_load=true",  # the trace's busiest 10 s are above 1 req/s
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "fields not replayed, ignored: user_id on 15 lines" in proc.stdout
    report = next((tmp_path / "out").rglob("report.md")).read_text()
    by_type = report.split("## By request type", 1)[1].split("\n## ", 1)[0]
    assert "chat " in by_type and "code_edit " in by_type
    by_turn = report.split("## By conversation turn", 1)[1].split("\n## ", 1)[0]
    assert "first turn " in by_turn and "later turns " in by_turn and ", 2 requests)" in by_turn  # turns 2, 3
    assert "conversations: 1 replayed turn by turn" in report
    (spec,) = [r for r in _runs(tmp_path, "traced") if r.data.tags.get("role") == "speculative"]
    assert spec.data.tags["acceptance.source"] == "vllm-v1-counters"
    keys = set(spec.data.metrics)
    assert {"category.code_edit.acceptance_length", "category.chat.acceptance_length"} <= keys
    # The later turns are 2 requests: too few for a ratio, not for their median TTFT.
    assert {"turn.first_turn.speedup_median_tpot", "turn.later_turns.median_ttft_ms"} <= keys
    assert spec.data.metrics["trace_conversations"] == 1
    rows = pd.read_csv(next(p for p in (tmp_path / "out").rglob("requests.csv") if "ngram" in str(p)))
    assert sorted(rows.loc[rows["conversation_id"] == "c", "turn"]) == [1, 2, 3] and rows["error"].isna().all()
    # Every stated length, as the server counted it: 150 output tokens past workload.max_tokens=48,
    # and the lengths-only prompts at exactly their input_length through the chat template.
    assert sorted(rows["output_tokens"])[-2:] == [150, 150] and (rows["output_tokens"] == 48).sum() == 11
    synthetic = rows[rows["category"] == "synthetic"].sort_values("index")
    assert list(synthetic["prompt_tokens"]) == [300, 280] and list(synthetic["output_tokens"]) == [24, 24]
    # A later turn carries its history: the first turn's prompt and the server's answer to it.
    turns = rows[rows["conversation_id"] == "c"].set_index("turn")
    assert turns.loc[2, "prompt_tokens"] > turns.loc[1, "prompt_tokens"] + turns.loc[1, "output_tokens"]
    assert spec.data.tags["trace.ignored_fields"] == "user_id on 15 lines"
    assert spec.data.metrics["validity.failed"] == 1  # nothing cut short: every stated length was kept


def test_a_window_too_short_for_its_rate_is_not_steady_and_a_rate_beyond_the_server_is_overloaded(
    tmp_path: Path, servers: tuple[EngineServer, EngineServer]
) -> None:
    """On this module's two servers: 2 req/s for 3 s of 64-token answers ends before its steady
    state (each answer takes longer than the window), and 16 req/s is more than a 2-core CPU
    streams. Neither gets a latency verdict; the report says why, and the overloaded point keeps
    its throughput ratio (a capacity comparison)."""
    args = [
        "-m",
        f"hydra.sweep.dir={tmp_path}/multi",
        "hydra/launcher=basic",
        *_external(*servers),
        "spec=ngram",
        "spec.k=3",
        "sweep_name=steady",
        "load.request_rate=2,16",
        "load.num_requests=4",
        "load.min_duration_s=3",
        "load.warmup_requests=1",
        "workload.max_tokens=64",
        "workload.ignore_eos=true",
        "lossless.prompts=0",
        "engine.external_ok_to_load=true",
    ]
    proc = start_sweep(args, tmp_path)
    out = rest_of_output(proc)
    assert proc.returncode == 0, out[-4000:]
    report = next((tmp_path / "multi").rglob("report.md")).read_text()
    trust = report.split("## Can you trust this run?", 1)[1].split("\n## ", 1)[0]
    steady = next(line for line in trust.splitlines() if "steady state" in line)
    overload = next(line for line in trust.splitlines() if "keeps up with the offered rate" in line)
    assert "FAILED" in steady and "-r2:" in steady and "load.min_duration_s=" in steady, trust
    assert "FAILED" in overload and "-r16:" in overload and "-r2:" not in overload, trust
    rows = {
        line.split(" | ")[1]: line.split(" | ")[-1]
        for line in report.splitlines()
        if line.startswith("| external ngram")
    }
    assert rows["median TPOT, low load (2/s)"].startswith("withheld: not steady"), rows
    # The baseline could not serve 16/s: its latency ratios are withheld as overloaded (whatever
    # else the speculative window failed), and overload never withholds the throughput ratio.
    high = rows["median TPOT, high load (16/s)"]
    assert high.startswith("withheld: ") and "overloaded (baseline: streamed" in high, rows
    assert "overloaded" not in rows["throughput, high load (16/s)"], rows
    by_name = {r.info.run_name: r.data.metrics for r in _runs(tmp_path, "steady") if r.data.tags.get("role") != "sweep"}
    assert by_name["external-baseline-r16"]["validity.overload"] == 0
    assert by_name["external-baseline-r16"]["window.sent"] == 48  # 3 s of arrivals at 16/s: load.min_duration_s
    assert "validity.steady_state" not in by_name["external-baseline-r16"]  # no steady state to reach


def test_a_tracking_server_gone_mid_sweep_loses_no_measurement(
    tmp_path: Path, servers: tuple[EngineServer, EngineServer]
) -> None:
    """A fault of the tracking server, not of the engine: measured on this module's two servers
    (the baseline's point is recorded, then the tracking server goes away before the speculative
    one is), the journal keeps what MLflow missed, and `pipeline.sync` replays it once."""
    from tests.cluster import free_port, mlflow_server

    before = vllm_server_pids()
    root, port = tmp_path / "mlflow", free_port()
    first = mlflow_server(root, port)
    server = first.__enter__()
    args = [
        "-m",
        f"hydra.sweep.dir={tmp_path}/multi",
        "hydra/launcher=basic",
        *_external(*servers),
        "spec=ngram",
        "spec.k=3",
        f"tracking.uri={server.uri}",
        "sweep_name=outage",
        "load.num_requests=8",
        "load.request_rate=2",
        "load.warmup_requests=1",
        "workload.max_tokens=32",
        "lossless.prompts=0",
        "engine.external_ok_to_load=true",  # 2 req/s is above the small default; these servers are the test's own
    ]
    proc = start_sweep(args, tmp_path)
    seen: list[str] = []
    try:  # the baseline is measured and recorded; then the server goes away
        read_until(proc, "ngram-k3] server ready", seen)
    finally:
        first.__exit__(None, None, None)
    out = "".join(seen) + rest_of_output(proc)
    assert proc.returncode == 4, out[-3000:]  # infrastructure: the measurements are kept, MLflow lacks some
    assert "python -m pipeline.sync" in out and not vllm_server_pids() - before
    assert list((tmp_path / "multi").rglob("external-ngram-k3-r2/requests.csv"))  # on disk whatever MLflow did

    with mlflow_server(root, port) as again:
        sync = [sys.executable, "-m", "pipeline.sync", str(tmp_path / "multi")]
        done = subprocess.run(sync, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        client = MlflowClient(again.uri)
        experiment = client.get_experiment_by_name("outage")
        assert experiment is not None
        runs = client.search_runs([experiment.experiment_id])
        children = {r.info.run_name: r for r in runs if r.data.tags.get("role") != "sweep"}
        assert sorted(children) == ["external-baseline-r2", "external-ngram-k3-r2"]  # each point once
        for run in children.values():
            assert run.info.status == "FINISHED" and run.data.metrics["completed"] == 8
            assert "requests.csv" in {a.path for a in client.list_artifacts(run.info.run_id)}
        assert children["external-ngram-k3-r2"].data.metrics["speedup_median_tpot"] > 0  # the driver's own writes too
        (parent,) = [r for r in runs if r.data.tags.get("role") == "sweep"]
        assert parent.info.status == "FINISHED"
        again_sync = subprocess.run(sync, capture_output=True, text=True, timeout=300)
        assert again_sync.returncode == 0 and len(client.search_runs([experiment.experiment_id])) == len(runs)
        report = subprocess.run(
            [
                sys.executable,
                "-m",
                "pipeline.report",
                parent.info.run_id,
                "--tracking-uri",
                again.uri,
                "--out",
                str(tmp_path / "report"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert report.returncode == 0, report.stderr[-2000:]
