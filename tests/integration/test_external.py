"""engine=external on real vLLM: two servers this test starts itself, measured by a sweep that
starts and stops nothing. The scripted cases (no /metrics, counters shared with other traffic)
are tests/unit/test_external.py.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from mlflow.tracking import MlflowClient

from pipeline.config import EngineConfig, JobConfig, SpecConfig
from pipeline.engines.acceptance import V1_DRAFTS, parse_scrape
from pipeline.engines.base import EngineServer
from pipeline.run.job import resolve_target, server_spec
from tests import procs

pytestmark = pytest.mark.integration


def _drafts(url: str) -> float:
    return parse_scrape(httpx.get(url + "/metrics", timeout=30, trust_env=False).text).get(V1_DRAFTS) or 0.0


def test_two_running_servers_are_measured_on_the_same_requests_and_left_running(
    tmp_path: Path, no_leftover_servers: None
) -> None:
    base_job = JobConfig(engine=EngineConfig(dtype="float32", cpu_kvcache_gib=1), spec=SpecConfig(method="none"))
    spec_job = dataclasses.replace(
        base_job, spec=SpecConfig(method="ngram", k=3, options={"prompt_lookup_max": 4, "prompt_lookup_min": 2})
    )
    target = resolve_target(base_job)
    with (
        EngineServer(server_spec(target, base_job, tmp_path / "base.log")) as base,
        EngineServer(server_spec(target, spec_job, tmp_path / "spec.log")) as spec,
    ):
        drafts_before = _drafts(spec.base_url)
        args = [
            sys.executable,
            "-m",
            "pipeline.sweep",
            f"hydra.run.dir={tmp_path}/out",
            "sweep_name=ext",
            "engine=external",
            f"engine.url={spec.base_url}",
            f"engine.baseline_url={base.base_url}/v1",
            "spec=ngram",
            "spec.k=3",
            "load.num_requests=6",
            "load.request_rate=4",
            "load.warmup_requests=1",
            "workload.max_tokens=48",
            "lossless.prompts=2",
        ]
        sweep = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        started: list[str] = []  # any vLLM process under the sweep, sampled while it runs
        deadline = time.monotonic() + 600
        while sweep.poll() is None and time.monotonic() < deadline:
            started += [" ".join(procs.cmdline(p)) for p in procs.matching([sweep.pid], procs.SERVER_PATTERN)]
            time.sleep(0.5)
        output = sweep.communicate(timeout=60)[0]
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
    # The comparison and the report name the condition.
    report = next((tmp_path / "out").rglob("report.md")).read_text()
    assert "external servers" in report and "as it is" in report
