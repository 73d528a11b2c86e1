"""search=drafter_needed on real vLLM on the CPU: the 4-layer draft at k=3 with synthetic
acceptance (through specsweep's vLLM plugin, which vLLM-CPU needs for it) at two lengths, the
draft as the real drafter placed on its own map, one rate, Hydra's basic launcher and a real
MLflow store.

Four server starts (the baseline, the draft, the draft at L=2 and at L=4 = k+1): the fewest the
search makes for two L values, since it always measures the ceiling and the proposer's own
acceptance. Another proposer placed on the draft's map (ngram, at its own drafting cost) is the
unit tests' (tests/unit/test_drafter_map.py): here it was one server start more (about a minute
on 2 AVX2 cores) for a line of text.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from pipeline.engines.vllm_synthetic import ACTED
from tests.integration.conftest import TEST_SERVER, vllm_server_pids

pytestmark = pytest.mark.integration

SMALL = [
    "load.num_requests=10",
    "load.warmup_requests=1",
    "workload.max_tokens=32",
    *TEST_SERVER,
    "lossless.prompts=0",
    "hydra/launcher=basic",
]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    project = tmp_path_factory.mktemp("drafter")
    before = vllm_server_pids()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.sweep",
            "-m",
            "search=drafter_needed",
            "spec=draft",
            "spec.k=3",
            "load.request_rate=2",
            "drafter_needed.lengths=[2]",
            "sweep_name=idrafter",
            f"hydra.sweep.dir={project}/out",
            *SMALL,
        ],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert not vllm_server_pids() - before, "server processes outlived the sweep"
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return project, proc


def _runs(project: Path) -> list:
    client = MlflowClient(f"sqlite:///{project}/mlruns/mlflow.db")
    experiment = client.get_experiment_by_name("idrafter")
    assert experiment is not None
    return client.search_runs([experiment.experiment_id])


def test_each_synthetic_point_measures_the_acceptance_it_was_told(sweep: tuple) -> None:
    project, _ = sweep
    told = {
        r.data.tags["spec.synthetic"]: r.data.metrics["acceptance_length"]
        for r in _runs(project)
        if "spec.synthetic" in r.data.tags and r.data.tags.get("status") == "finished"
    }
    assert set(told) == {"synthetic acceptance L=2", "synthetic acceptance L=4"}
    assert abs(told["synthetic acceptance L=2"] - 2.0) < 0.05 and abs(told["synthetic acceptance L=4"] - 4.0) < 0.05
    # The engine survived its requests because the plugin's kernels ran: each synthetic server says so.
    logs = [p for p in (project / "out").rglob("server.log") if "synL" in str(p.parent)]
    assert len(logs) == 2 and all(ACTED in p.read_text() for p in logs)
    real = [p for p in (project / "out").rglob("server.log") if "synL" not in str(p.parent)]
    assert len(real) == 2 and not any(ACTED in p.read_text() for p in real)  # asked for by none of them


def test_the_report_has_the_break_even_and_places_the_real_draft_on_its_map(sweep: tuple) -> None:
    project, _ = sweep
    (report,) = (project / "out").rglob("report.md")
    text = report.read_text()
    assert "## The drafter you would need (synthetic acceptance)" in text
    assert "- break-even L (median-TPOT speedup reaching 1 + 2%), per load:\n  - 2 req/s: " in text
    assert "| 2 | " in text and "| 4 | " in text  # the map's two L rows
    placed = [line for line in text.splitlines() if line.startswith("- vllm draft k=3: L ")]
    assert placed and "at 2 req/s, break-even" in placed[0] and "(on the " not in placed[0]  # its own map
    assert "Median-TPOT speedup over synthetic acceptance length L x request rate" in text
    # The answer in MLflow too: the sweep's run carries the ceiling (and the break-even, where resolved).
    (parent,) = [r for r in _runs(project) if r.data.tags.get("role") == "sweep"]
    assert parent.data.metrics["drafter.draft.k3.r2.ceiling_speedup"] > 0
