"""The two searches on real vLLM servers, through Hydra's basic launcher and a real MLflow store.

- search=predict over k = 1, 2, 3 at one rate: the baseline and k=3 are measured, k=1 and 2
  predicted, the predicted best confirmed on a fresh server (predict.check_model: even where k=3
  won outright, so that the model's accuracy is always checked); at most 3 servers, not the grid's 4.
- search=capacity on the baseline: bracketing, then bisection, on one server, within the probe cap.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from tests.integration.conftest import TEST_SERVER, vllm_server_pids

pytestmark = pytest.mark.integration

# The basic launcher: a search decides what to measure whatever runs its groups, and a local Ray
# (the default launcher's, about 15 s to start here) is test_sweep.py's to test.
SMALL = [
    "load.num_requests=10",
    "load.warmup_requests=1",
    "workload.max_tokens=32",
    *TEST_SERVER,
    "lossless.prompts=0",
    "hydra/launcher=basic",
]


def multirun(project: Path, *overrides: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.sweep", "-m", *overrides],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _runs(project: Path, experiment: str) -> list:
    client = MlflowClient(f"sqlite:///{project}/mlruns/mlflow.db")
    found = client.get_experiment_by_name(experiment)
    assert found is not None
    return client.search_runs([found.experiment_id])


def test_predict_starts_at_most_three_servers_and_sets_prediction_against_measurement(tmp_path: Path) -> None:
    before = vllm_server_pids()
    proc = multirun(
        tmp_path,
        "search=predict",
        "spec.k=1,2,3",
        "load.request_rate=2",
        "predict.max_confirm=1",
        "predict.check_model=true",
        "sweep_name=ipredict",
        *SMALL,
    )
    assert not vllm_server_pids() - before, "server processes outlived the sweep"
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    runs = _runs(tmp_path, "ipredict")
    (parent,) = [r for r in runs if r.data.tags.get("role") == "sweep"]
    assert parent.data.metrics["server_starts"] <= 3  # the grid starts 4
    measured = [r for r in runs if r.data.tags.get("status") == "finished"]
    predicted = [r for r in runs if r.data.tags.get("predicted") == "true"]
    ks = {int(r.data.params["spec.k"]) for r in measured if r.data.tags["role"] == "speculative"}
    assert 3 in ks and len(ks) <= 2  # k_max, and at most one confirmation
    client = MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    for run in predicted:  # a prediction is a run of its own, with no requests, never a finished measurement
        assert run.data.tags["status"] == "predicted" and run.info.run_name.endswith("(predicted)")
        assert run.data.metrics["median_tpot_ms_low"] <= run.data.metrics["median_tpot_ms"]
        assert "requests.csv" not in {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {int(r.data.params["spec.k"]) for r in predicted} | ks == {1, 2, 3}
    table = pd.read_csv(Path(client.download_artifacts(parent.info.run_id, "predict/predictions.csv", str(tmp_path))))
    confirmed = table[table["confirmed"] & table["predicted"]]
    assert len(confirmed) == len(ks) - 1  # every confirmed k was predicted first
    checked = 0
    for row in confirmed.itertuples():  # predicted against measured, both with their figures
        checked += 1
        assert row.measured_tpot_ms > 0 and row.predicted_tpot_ms > 0
        # The model's accuracy on the real engine: the confirmed point's measured median TPOT lies
        # inside the first prediction's interval widened by 25 % on each side (the model's own bias,
        # e.g. L under-predicted at small k, is not in that interval: docs/search.md).
        assert 0.75 * row.predicted_tpot_ms_low <= row.measured_tpot_ms <= 1.25 * row.predicted_tpot_ms_high, row
        assert row.tpot_error < 0.35, row.tpot_error
        assert row.predicted_length_low <= row.predicted_length <= row.predicted_length_high
    assert checked >= 1, f"no confirmed prediction to check the model's accuracy against:\n{table}"
    assert table["chosen"].sum() == 1  # one best k at the one rate
    text = next((tmp_path / "outputs" / "ipredict").glob("*/report/report.md")).read_text()
    assert "## Predicted k curve (search=predict)" in text and "the best k per rate: 2 req/s: k=" in text
    page = next((tmp_path / "outputs" / "ipredict").glob("*/report/report.html")).read_text()
    assert "Median TPOT against k: measured and predicted" in page  # the k-curve figure, predicted points hollow
    assert "predicted, not measured: no MLflow run" in page and "measured median TPOT " in page  # its tooltips


def test_capacity_search_on_the_baseline_stays_within_its_probe_cap(tmp_path: Path) -> None:
    before = vllm_server_pids()
    proc = multirun(
        tmp_path,
        "search=capacity",
        "spec=none",
        "slo.tpot_ms=150",
        "capacity.start_rate=1",
        "capacity.max_probes=4",
        "load.duration_s=5",
        "sweep_name=icapacity",
        *[o for o in SMALL if not o.startswith("load.num_requests")],
    )
    assert not vllm_server_pids() - before, "server processes outlived the sweep"
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    runs = _runs(tmp_path, "icapacity")
    (parent,) = [r for r in runs if r.data.tags.get("role") == "sweep"]
    probes = sorted(
        (r for r in runs if r.data.tags.get("search") == "capacity"), key=lambda r: r.data.metrics["capacity_probe"]
    )
    assert parent.data.metrics["server_starts"] == 1  # every probe on the one server
    assert 2 <= len(probes) <= 4
    assert [r.data.metrics["capacity_probe"] for r in probes] == list(range(1, len(probes) + 1))
    rates = [float(r.data.params["load.request_rate"]) for r in probes]
    assert rates[0] == 1.0 and len(set(rates)) == len(rates)
    # Bracketing and bisection alike: the next probe is higher after a pass and lower after a miss.
    for (rate, earlier), later in zip(zip(rates, probes, strict=True), rates[1:], strict=False):
        assert (later > rate) == bool(earlier.data.metrics["slo_passed"]), rates
    text = next((tmp_path / "outputs" / "icapacity").glob("*/report/report.md")).read_text()
    assert "## Capacity under the SLO" in text and "p99 TPOT <= 150 ms" in text
    assert text.splitlines()[2].startswith("**Max sustainable req/s under the SLO")  # the report's first line
