"""The prefix-cache policy on real vLLM: each window starts from the state it names.

One baseline-only sweep with ``engine.prefix_cache=cold,warm,off`` plans two servers (cold
and warm share one; off runs without prefix caching) and three points. The window's own
counters then show the policy: no hits with caching off, more hits warm than cold.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.integration.conftest import TEST_SERVER

pytestmark = pytest.mark.integration


def test_each_cache_policy_shows_in_the_window_hit_rate(tmp_path: Path, no_leftover_servers: None) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.sweep",
            "-m",
            "spec=none",
            "engine.prefix_cache=cold,warm,off",
            "sweep_name=icache",
            "load.num_requests=6",
            "load.request_rate=4",
            "load.warmup_requests=1",
            "workload.max_tokens=16",
            "lossless.prompts=0",
            "hydra/launcher=basic",
            *TEST_SERVER,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("server ready") == 2, proc.stdout[-3000:]  # cold and warm share a server

    client = MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    experiment = client.get_experiment_by_name("icache")
    assert experiment is not None
    runs = [r for r in client.search_runs([experiment.experiment_id]) if r.data.tags.get("role") == "baseline"]
    by_policy = {r.data.tags["prefix_cache.policy"]: r.data.metrics for r in runs}
    assert set(by_policy) == {"cold", "warm", "off"}
    assert by_policy["off"].get("prefix_cache_hits", 0.0) == 0.0
    cold, warm = by_policy["cold"]["prefix_cache_hit_rate"], by_policy["warm"]["prefix_cache_hit_rate"]
    assert warm > cold, (cold, warm)
    assert warm > 0.5  # every prompt was sent once before the window
    print(f"prefix-cache hit rate: cold {cold:.3f}, warm {warm:.3f}, off {by_policy['off'].get('prefix_cache_hits')}")
