"""The two searches' orchestration on synthetic windows: which points each phase measures,
what the predictor feeds the model, the capacity probe loop, and the report's sections."""

from __future__ import annotations

import ast
import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.analysis import figures, iplots, kcurve_windows, plots, search_report
from pipeline.analysis.samples import Sample, ServerSpread, StatsOptions
from pipeline.config import (
    SEARCH_MODES,
    CapacityConfig,
    ConfigError,
    JobConfig,
    LoadConfig,
    PredictConfig,
    SloConfig,
    SpecConfig,
    SweepSettings,
)
from pipeline.identity import point_hash
from pipeline.load.slo import SloTarget
from pipeline.run.outcomes import GroupOutcome, PointOutcome
from pipeline.run.plan import Point, ServerGroup, SweepPlan, plan_sweep
from pipeline.run.search import capacity_points, predict_phases, predicting
from pipeline.run.search.kinds import SEARCHES
from pipeline.run.search.profiles import Bracketing, Measured
from pipeline.run.search.strategy import Capacity, Context, SearchEnd, WindowReads
from pipeline.validate import validate
from tests.synthetic import PROFILE, measured_outcomes, true_tpot

OPTS = StatsOptions(resamples=400)


def grid(ks: tuple[int, ...], rates: tuple[float, ...], method: str = "ngram") -> SweepPlan:
    jobs = [
        dataclasses.replace(
            JobConfig(), search="predict", spec=SpecConfig(method=method, k=k), load=LoadConfig(request_rate=r)
        )
        for k in ks
        for r in rates
    ]
    return plan_sweep(jobs)


def _reading(samples: dict[str, Sample]):  # type: ignore[no-untyped-def]
    """A window by run id and duration, as the record stage downloads a resumed point's."""
    return lambda run_id, duration: samples.get(run_id)


def test_first_phase_measures_the_baseline_and_the_largest_k_at_every_rate() -> None:
    plan = grid((1, 2, 3), (1.0, 4.0))
    first = predict_phases.first_phase(plan)
    assert len(plan.groups) == 4 and len(first.groups) == 2
    assert sorted((p.role, p.job.spec.k, p.job.load.request_rate) for p in first.points) == [
        ("baseline", 0, 1.0),
        ("baseline", 0, 4.0),
        ("speculative", 3, 1.0),
        ("speculative", 3, 4.0),
    ]


def test_a_curve_with_one_k_is_refused() -> None:
    with pytest.raises(ConfigError, match="at least 2 values of spec.k"):
        predict_phases.check_plan(grid((3,), (1.0,)))
    predict_phases.check_plan(grid((2, 3), (1.0,)))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"spec": SpecConfig(method="suffix", k=3)}, "validated for spec.method in ngram, draft"),
        ({"workload": dataclasses.replace(JobConfig().workload, temperature=0.7)}, "greedy decoding only"),
        ({"predict": dataclasses.replace(JobConfig().predict, max_confirm=-1)}, "predict.max_confirm=-1"),
    ],
)
def test_predict_settings_are_checked(changes: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate(dataclasses.replace(JobConfig(), search="predict", **changes))


@pytest.mark.parametrize(
    ("capacity", "slo", "message"),
    [
        (CapacityConfig(), SloConfig(), "needs an SLO"),
        (CapacityConfig(start_rate=0), SloConfig(tpot_ms=50), "capacity.start_rate=0"),
        (CapacityConfig(resolution=1.5), SloConfig(tpot_ms=50), "capacity.resolution=1.5"),
        (CapacityConfig(max_probes=1), SloConfig(tpot_ms=50), "capacity.max_probes=1"),
        (CapacityConfig(), SloConfig(tpot_ms=50, percentile=0), "slo.percentile=0"),
    ],
)
def test_capacity_settings_are_checked(capacity: CapacityConfig, slo: SloConfig, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate(dataclasses.replace(JobConfig(), search="capacity", capacity=capacity, slo=slo))


def test_each_search_says_what_it_does_beyond_its_plan() -> None:
    settings = SweepSettings.of([JobConfig()])
    assert SEARCHES["grid"].note(settings) == ""
    assert SEARCHES["predict"].note(settings).startswith("search=predict: the baseline and the largest k")
    assert "at most 1 more server(s) per method" in SEARCHES["predict"].note(settings)
    assert SEARCHES["capacity"].note(settings) == (
        "search=capacity: each server probes from 1 req/s (bracketing, then bisection to 10%), at most 8 windows "
        "per server"
    )
    assert [name for name, kind in SEARCHES.items() if kind.pairable] == ["grid"]  # what gate.mode=paired measures


def test_every_search_mode_is_a_kind() -> None:
    assert set(SEARCHES) == set(SEARCH_MODES)


def _mode_comparisons(path: Path, root: Path) -> list[str]:
    """Comparisons of a value with a search mode's name (==, !=, in a literal tuple, list or set)."""

    def names(node: ast.expr) -> list[object]:
        if isinstance(node, ast.Constant):
            return [node.value]
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return [e.value for e in node.elts if isinstance(e, ast.Constant)]
        return []

    return [
        f"{path.relative_to(root)}:{node.lineno}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Compare)
        and any(name in SEARCH_MODES for side in (node.left, *node.comparators) for name in names(side))
    ]


def test_nothing_outside_run_search_compares_a_value_with_a_search_modes_name() -> None:
    pipeline = Path(__file__).resolve().parents[2] / "pipeline"
    outside = [p for p in pipeline.rglob("*.py") if p.relative_to(pipeline).parts[:2] != ("run", "search")]
    found = [hit for p in outside for hit in _mode_comparisons(p, pipeline.parent)]
    assert not found, f"ask the search's kind (pipeline/run/search/kinds.py) instead: {found}"


def test_the_mode_check_finds_a_comparison(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text('def f(s):\n    return s.search == "predict" or s.search in ("grid", "capacity")\n')
    assert _mode_comparisons(probe, tmp_path) == ["probe.py:2", "probe.py:2"]


def test_slo_decision_settings_are_not_part_of_a_point() -> None:
    job = JobConfig()
    assert point_hash(job) == point_hash(dataclasses.replace(job, slo=SloConfig(percentile=90, min_goodput=0.5)))
    assert point_hash(job) != point_hash(dataclasses.replace(job, slo=SloConfig(tpot_ms=50)))


# ---- The predictor on synthetic windows with a known engine ---------------------------------


def test_predictor_predicts_every_unmeasured_k_and_proposes_the_best_for_confirmation() -> None:
    plan = grid((1, 2, 3, 4), (1.0, 8.0))
    outcomes, samples = measured_outcomes(plan, {4})
    # A confirmation runs on a fresh server: with an A/A spread, k=3's 3 % edge is not resolved.
    spread = dataclasses.replace(OPTS, server_spread=ServerSpread({"speedup_median_tpot": 0.05}, 10, "aa"))
    predictor = predicting.Predictor(plan, spread, _reading(samples))
    ((setting, points),) = predict_phases.curves(plan).items()
    result = predictor.curve(setting, points, outcomes, None, cap=1)
    # Without it, the paired replicates tell k=3 from the measured k=4: nothing to confirm.
    plain = predicting.Predictor(plan, OPTS, _reading(samples))
    assert plain.curve(setting, points, outcomes, None, cap=1).confirm == {}
    assert sorted(result.final) == [(k, r) for k in (1, 2, 3) for r in (1.0, 8.0)]
    for (k, rate), prediction in result.final.items():
        truth = true_tpot(k, rate)
        assert abs(prediction.tpot_s - truth) / truth < 0.05  # the synthetic engine follows the model
        assert prediction.length == pytest.approx(1 + sum(PROFILE[:k]), rel=0.02)
    assert len(result.confirm) == 1 and set(result.measured) == {(4, 1.0), (4, 8.0)}
    confirm = predicting.confirmation_plan(plan, [result])
    (k,) = result.confirm
    assert {(p.job.spec.k, p.job.load.request_rate) for p in confirm.points} == {(k, r) for r in result.confirm[k]}
    table = search_report.predictions_table([result])
    assert set(table["k"]) == {1, 2, 3, 4} and table["chosen"].sum() == 2  # one best k per rate


def test_confirmations_become_anchors_and_the_table_sets_prediction_against_measurement() -> None:
    plan = grid((1, 2, 3, 4), (2.0,))
    outcomes, samples = measured_outcomes(plan, {2, 4})
    first_outcomes = {
        h: o for h, o in outcomes.items() if not any(p.hash == h and p.job.spec.k == 2 for p in plan.points)
    }
    predictor = predicting.Predictor(plan, OPTS, _reading(samples))
    ((setting, points),) = predict_phases.curves(plan).items()
    first = predictor.curve(setting, points, first_outcomes, None, cap=2)
    final = predictor.curve(setting, points, outcomes, first.first, cap=2)
    assert (2, 2.0) in first.final and (2, 2.0) not in final.final  # measured now, no longer predicted
    assert final.final[(1, 2.0)].anchored
    row = search_report.predictions_table([final]).set_index("k").loc[2]
    assert row["confirmed"] and row["predicted"] and math.isfinite(row["tpot_error"]) and row["tpot_error"] < 0.1
    lines = "\n".join(search_report.predict_lines(search_report.predictions_table([final])))
    assert "Prediction error over 1 confirmed point(s)" in lines and "| 2 | 2 |" in lines
    # The interactive k curve: a measured point links to its run, a predicted one says it has none.
    table = search_report.predictions_table([final])
    frame = pd.DataFrame(
        [
            {
                "run_id": f"run-k{k}",
                "setting_key": setting,
                "k": k,
                "request_rate": 2.0,
                "role": "speculative",
                "status": "finished",
            }
            for k in (2, 4)
        ]
    )
    spec = figures.k_curve(table, frame)
    assert spec is not None
    assert plots.png(spec).startswith(b"\x89PNG")  # measured and predicted share a colour per curve
    figure = iplots.plotly(spec, {}, lambda run: f"http://ui/#/runs/{run}")
    seen = [c for trace in figure.data if trace.name.endswith("measured") for c in trace.customdata]
    guessed = [c for trace in figure.data if trace.name.endswith("predicted") for c in trace.customdata]
    assert {c[4] for c in seen} == {"http://ui/#/runs/run-k2", "http://ui/#/runs/run-k4"}
    assert all(" ms [" in c[2] for c in seen)  # the measured value with its interval
    assert {c[0].rsplit("=", 1)[1] for c in guessed} >= {"1", "3"} and all(c[4] == "" for c in guessed)
    assert all(c[3].startswith("predicted, not measured") and " ms [" in c[2] for c in guessed)


# ---- Capacity: the probe loop and the report ----------------------------------------------------


def capacity_sample(rate: float, scale: float, n: int = 30, seed: int = 0, noise: float = 0.03) -> Sample:
    """TPOT 40 ms x rate / scale per request (times noise): p99 passes 50 ms near 1.25 x scale."""
    rng = np.random.default_rng(seed)
    tpot = 0.040 * (rate / scale) * np.exp(rng.normal(0, noise, n))
    # Arrivals at the offered rate; the window ends with its last request: it kept up.
    scheduled = np.arange(n) / rate
    return Sample(
        index=np.arange(n),
        values={"tpot": tpot, "ttft": tpot, "e2el": tpot * 10},
        itl=tuple(np.full(2, v) for v in tpot),
        output_tokens=np.full(n, 10.0),
        chunks=np.full(n, 10.0),
        duration_s=float(scheduled[-1] + tpot[-1] * 10),
        scheduled_end_s=float(scheduled[-1]),
        scheduled=scheduled,
    )


def test_probe_loop_brackets_then_bisects_to_the_resolution(tmp_path: Path) -> None:
    job = dataclasses.replace(
        JobConfig(),
        search="capacity",
        slo=SloConfig(tpot_ms=50),
        capacity=CapacityConfig(start_rate=1.0, resolution=0.1, max_probes=10),
    )
    seed = Point("baseline", job, point_hash(job))
    walk = Bracketing().start(ServerGroup(1, "baseline", (seed,)), SweepSettings.of([job]))
    measured: list[Measured] = []
    logged: list[dict[str, float]] = []
    while (point := walk.next_point(measured)) is not None:
        sample = capacity_sample(point.job.load.request_rate, 3.0, noise=0.0)
        done = Measured(point, PointOutcome(point.hash, "r", {"duration": sample.duration_s}, sample=sample))
        logged.append(walk.judge(done))
        measured.append(done)
    history = [
        (m.point.job.load.request_rate, bool(extra["slo_passed"])) for m, extra in zip(measured, logged, strict=True)
    ]
    rates = [r for r, _ in history]
    assert rates[:3] == [1.0, 2.0, 4.0]  # doubles until the SLO is missed
    passed = max(r for r, ok in history if ok)
    missed = min(r for r, ok in history if not ok)
    assert passed <= 3.0 * 50 / 40 <= missed and missed / passed - 1 <= 0.1  # the true boundary: 3.75 req/s
    assert [m["capacity_probe"] for m in logged] == [float(i) for i in range(1, len(logged) + 1)]
    # A probe that fails to measure ends the walk.
    failed = Measured(seed, PointOutcome(seed.hash, "r", error="server died"))
    assert walk.judge(failed) == {} and walk.next_point([*measured, failed]) is None


def test_a_rate_grid_is_refused_and_the_points_a_group_ran_replace_its_seed() -> None:
    jobs = [dataclasses.replace(JobConfig(), search="capacity", load=LoadConfig(request_rate=r)) for r in (1, 2)]
    with pytest.raises(ConfigError, match="searches the request rate itself"):
        capacity_points.seed_jobs(jobs, SweepSettings.of(jobs))
    plan = plan_sweep(capacity_points.seed_jobs(jobs[:1], SweepSettings.of(jobs[:1])))
    probed = tuple(capacity_points.at_rate(plan.groups[0].points[0], r) for r in (1.0, 2.0))
    outcome = GroupOutcome(plan.groups[0].index, (), ran=probed)
    search = Capacity(plan, Context({}, SweepSettings.of(jobs[:1])))
    assert search.next_plan([]) is plan and search.next_plan([outcome]) is None  # one plan: the seeds
    assert [p.job.load.request_rate for p in search.finish().plan.points[:2]] == [1.0, 2.0]


def test_report_capacity_headline_gives_each_boundary_and_the_ratio_with_intervals() -> None:
    rows, samples = [], {}
    # True boundaries 2.2 and 3.0 req/s; noise-free windows, so every resample makes the same call.
    for server, (role, method, k, boundary) in enumerate(
        [("baseline", "none", 0, 2.2), ("speculative", "ngram", 3, 3.0)]
    ):
        for j, rate in enumerate((1.0, 2.0, 4.0, 2.83, 2.38, 3.36)):
            run = f"s{server}p{j}"
            samples[run] = capacity_sample(rate, boundary / 1.25, noise=0.0)
            rows.append(
                {
                    "run_id": run,
                    "server": server,
                    "role": role,
                    "engine": "vllm",
                    "method": method,
                    "k": k,
                    "request_rate": rate,
                    "status": "finished",
                    "capacity_probe": j + 1,
                    "point_hash": f"{role}{rate}",
                    "baseline_hash": f"baseline{rate}" if k else "",
                }
            )
    target = SloTarget(tpot_s=0.05)
    curves = search_report.capacity_curves(pd.DataFrame(rows), samples, target, OPTS)
    assert [c.label for c in curves] == ["vllm baseline", "vllm ngram k=3"]
    base, spec = curves
    # Every request passes up to the boundary and misses past it: the goodput share falls from 1 to 0
    # between the last pass and the next miss, and crosses 99 % just above the pass.
    assert 2.0 <= base.boundary.estimate < 2.01 and 2.83 <= spec.boundary.estimate < 2.84  # type: ignore[operator]
    # 30 requests, all good, cannot show a 99 % goodput share (its Jeffreys interval reaches 0.91):
    # the interval stays open below, and never reaches past the next miss.
    assert base.boundary.low == 0.0 and base.boundary.high <= 2.38  # type: ignore[operator]
    assert spec.ratio is not None and spec.ratio.estimate == pytest.approx(2.83 / 2.0, rel=0.01)
    headline = search_report.capacity_headline(curves, target)
    assert headline.startswith("Max sustainable req/s under the SLO (p99 TPOT <= 50 ms") and "baseline 2" in headline
    spec = figures.capacity_curve(curves)
    assert spec is not None
    figure = iplots.plotly(spec, {"s0p2": "baseline-4rps"}, lambda run: f"http://ui/#/runs/{run}")
    (base_trace, _) = figure.data
    by_rate = {c[1]: c for c in base_trace.customdata}
    assert by_rate["4"][2].endswith("missed<br>boundary " + base.boundary.text) and by_rate["1"][2].count(": met")
    assert by_rate["4"][4] == "http://ui/#/runs/s0p2" and "MLflow run: baseline-4rps" in by_rate["4"][3]
    assert list(base_trace.marker.symbol) == ["circle" if met else "x" for *_, met in base.probes]


def test_slo_target_comes_back_from_the_parent_runs_params() -> None:
    assert SloTarget.from_params({"slo.ttft_ms": "None", "slo.tpot_ms": "None", "slo.e2el_ms": "None"}) is None
    target = SloTarget.from_params({"slo.tpot_ms": "50.0", "slo.percentile": "90.0", "slo.min_goodput": "0.95"})
    assert target == SloTarget(tpot_s=0.05, percentile=90.0, min_goodput=0.95)


def test_the_final_table_shows_a_predicted_point() -> None:
    import io

    from rich.console import Console

    from pipeline.record import table

    out = io.StringIO()
    frame = pd.DataFrame([{"point": "ngram-k2-r1", "status": "predicted", "median_tpot_ms": 80.0, "error": ""}])
    table.render(frame, "sweep", Console(file=out, width=160))
    assert "predicted" in out.getvalue() and "80.0" in out.getvalue()


def _prompted(tpot: np.ndarray, index: np.ndarray, length: float = 2.0) -> Sample:
    n = len(index)
    return Sample(
        index=index,
        values={"tpot": tpot, "ttft": tpot * 3, "e2el": tpot * 64},
        itl=tuple(np.full(3, v) for v in tpot),
        output_tokens=np.full(n, 65.0),
        chunks=np.full(n, 64 / length + 1),
        duration_s=10.0,
    )


def test_model_windows_pair_replicates_by_prompt_not_by_row() -> None:
    # Prompt effects dominate; speculation halves every prompt's TPOT. The k_max window lost
    # prompt 0 (a failed request), so its rows are one place off the baseline's.
    rng = np.random.default_rng(3)
    prompt = 0.03 * np.exp(rng.normal(0, 0.6, 60))
    base = kcurve_windows.MeasuredK((_prompted(prompt, np.arange(60)),), ({},))
    top = kcurve_windows.MeasuredK((_prompted(prompt[1:] / 2, np.arange(1, 60)),), ({"acceptance_length": 2.0},))
    windows = kcurve_windows.model_windows({0: base, 4: top}, OPTS, seed=0)
    difference = windows[0].tpot_log_reps - windows[4].tpot_log_reps
    assert np.std(windows[0].tpot_log_reps) > 0.05  # each window alone is noisy ...
    assert np.std(difference) < 0.01 and np.allclose(difference, math.log(2), atol=0.03)  # ... their ratio is not


def test_model_windows_draw_each_servers_run_level_offset_independently() -> None:
    # Two repeats per point, no noise inside a window, a different shift per server start: the
    # baseline's and k_max's run-level offsets must not move together (they ran on other servers).
    def repeats(level: float, shifts: tuple[float, ...], length: float) -> kcurve_windows.MeasuredK:
        windows = tuple(_prompted(np.full(40, level * s), np.arange(40), length) for s in shifts)
        return kcurve_windows.MeasuredK(windows, tuple({"acceptance_length": length} for _ in shifts))

    windows = kcurve_windows.model_windows(
        {0: repeats(0.04, (1.0, 1.1), 1.0), 4: repeats(0.02, (1.05, 0.95), 2.0)}, OPTS, seed=0
    )
    base, top = windows[0].tpot_log_reps, windows[4].tpot_log_reps
    assert np.std(base) > 0 and np.std(top) > 0
    assert abs(np.corrcoef(base, top)[0, 1]) < 0.2


def _fake_executor(  # type: ignore[no-untyped-def]
    plan: SweepPlan, fail_baseline: bool = False, off: float = 1.0, k_max_drafted: float | None = None
):
    """Runs a plan's groups against the synthetic engine: every point's window and metrics. A k
    below k_max (a confirmation) comes out ``off`` times the engine's TPOT: an error of the model.
    ``k_max_drafted``: the tokens k_max's drafter proposed a step on average (n-gram drafts stop
    short where the prompt has no longer match), as vLLM's counters give it."""
    outcomes, samples = measured_outcomes(plan, {1, 2, 3, 4})
    for p in plan.points:
        if k_max_drafted is not None and p.job.spec.k == 4:
            outcomes[p.hash].metrics["acceptance_k_effective"] = k_max_drafted
        if 0 < p.job.spec.k < 4:
            sample = samples[str(outcomes[p.hash].run_id)]
            scaled = {m: v * off for m, v in sample.values.items()}
            samples[str(outcomes[p.hash].run_id)] = dataclasses.replace(sample, values=scaled)
    calls: list[SweepPlan] = []

    def run(part: SweepPlan) -> list[GroupOutcome]:
        calls.append(part)
        return [
            GroupOutcome(
                g.index,
                tuple(
                    PointOutcome(p.hash, None, error="server failed")
                    if fail_baseline and p.role == "baseline"
                    else outcomes[p.hash]
                    for p in g.points
                ),
            )
            for g in part.groups
        ]

    return run, _reading(samples), calls


def _predict_search(  # type: ignore[no-untyped-def]
    plan: SweepPlan, window, record=lambda p, m: "x", opts: StatsOptions = OPTS, cap: int = 1, lookup=None
) -> predicting.PredictSearch:
    """search=predict as the driver starts it: the sweep's settings, and what it reads and records."""
    settings = dataclasses.replace(SweepSettings.of([JobConfig()]), predict=PredictConfig(max_confirm=cap))
    return predicting.PredictSearch(plan, Context({}, settings, WindowReads(window, record, opts, lookup)))


def _drive(search: predicting.PredictSearch, run) -> SearchEnd:  # type: ignore[no-untyped-def]
    """The search to its end as the driver drives it: each plan measured, its outcomes handed back."""
    outcomes: list[GroupOutcome] = []
    while (part := search.next_plan(outcomes)) is not None:
        outcomes = run(part)
    return search.finish()


@pytest.mark.parametrize("cap", [0, 1])
def test_predict_runs_whole_with_a_fake_executor_within_its_confirmation_cap(cap: int) -> None:
    plan = grid((1, 2, 3, 4), (1.0, 8.0))
    run, window, calls = _fake_executor(plan)
    spread = dataclasses.replace(OPTS, server_spread=ServerSpread({"speedup_median_tpot": 0.05}, 10, "aa"))
    logged: list[str] = []
    search = _predict_search(plan, window, lambda p, m: logged.append(p.hash) or f"pred-{p.hash}", spread, cap)
    end = _drive(search, run)
    (curve,) = search.curves
    confirmed = {p.job.spec.k for part in calls[1:] for p in part.points}
    assert len(calls) == (2 if cap else 1) and len(confirmed) == cap  # the cap bounds the fresh servers
    if cap:
        assert any("model error" in note for note in curve.notes)  # measured on the confirmed points
    else:
        assert any("predict.max_confirm=0" in note for note in curve.notes)  # the candidates left out are named
    # Every k never measured is a predicted run of its own, none of them a measurement.
    assert {k for k, _ in curve.final} == {1, 2, 3} - confirmed
    assert all(o.predicted and o.run_id == f"pred-{h}" for h, o in end.predicted.items())
    assert len(logged) == len(end.predicted) == len(curve.final)
    # The plan as it ran: what was measured and what was predicted, each k once per rate.
    assert {(p.job.spec.k, p.job.load.request_rate) for p in end.plan.points if p.role == "speculative"} == {
        (k, r) for k in (1, 2, 3, 4) for r in (1.0, 8.0)
    }
    assert list(end.tables) == [search_report.PREDICTIONS_CSV] and len(end.tables[search_report.PREDICTIONS_CSV])


def test_predict_looks_up_the_aa_spread_of_what_it_measured_once_the_first_windows_are_recorded() -> None:
    plan = grid((1, 2, 3, 4), (1.0, 8.0))
    run, window, calls = _fake_executor(plan)
    looked: list[int] = []
    spread = ServerSpread({"speedup_median_tpot": 0.05}, 10, "aa")

    def lookup() -> ServerSpread:
        looked.append(len(calls))  # how many plans had been measured when the spread was read
        return spread

    search = _predict_search(plan, window, lookup=lookup)
    _drive(search, run)
    # Read once, after the first phase measured the windows whose fingerprint it matches.
    assert looked == [1] and search.opts.server_spread is spread


def test_the_model_error_is_stored_as_a_number_and_widens_the_final_intervals_by_it() -> None:
    # k=3 is a candidate at 1 req/s only (at 50 req/s k=4 leads by 8 %), and its confirmation
    # comes out 25 % slower than the model says: the model's error, measured on one point.
    plan = grid((1, 2, 3, 4), (1.0, 50.0))
    run, window, calls = _fake_executor(plan, off=1.25)
    spread = dataclasses.replace(OPTS, server_spread=ServerSpread({"speedup_median_tpot": 0.02}, 10, "aa"))
    logged: dict[str, dict[str, float]] = {}

    def record_predicted(point: Point, metrics: dict[str, float]) -> str:
        logged[point.hash] = metrics
        return f"pred-{point.hash}"

    search = _predict_search(plan, window, record_predicted, spread)
    end = _drive(search, run)
    (curve,) = search.curves
    assert curve.confirm == {3: (1.0,)} and (3, 50.0) in curve.final
    # The term is the confirmed point's |log measured / first-predicted TPOT|, measured from its window.
    (confirmed,) = [p for part in calls[1:] for p in part.points]
    (outcome,) = [p for o in end.outcomes for p in o.points if p.hash == confirmed.hash]
    measured = window(str(outcome.run_id), outcome.metrics["duration"])
    sd = abs(math.log(float(np.median(measured.values["tpot"])) / curve.first[(3, 1.0)].tpot_s))
    assert sd == pytest.approx(math.log(1.25), abs=0.03)
    assert curve.model_error == pytest.approx((sd, 1))
    # Stored as a number: a column of predictions.csv and a metric of every predicted run.
    table = end.tables[search_report.PREDICTIONS_CSV]
    assert table["model_error_sd"].to_numpy() == pytest.approx(np.full(len(table), sd))
    assert set(table["model_error_points"]) == {1}
    assert len(logged) == len(curve.final) and all(m["model_error_sd"] == pytest.approx(sd) for m in logged.values())
    # At 50 req/s nothing was confirmed: the final prediction has the first's inputs, and differs
    # from it only by the term, one t(1) draw shared by every k, scaled by the stored sd.
    offsets = []
    for k in (1, 2, 3):
        first, final = curve.first[(k, 50.0)], curve.final[(k, 50.0)]
        assert final.tpot_s == first.tpot_s
        assert final.tpot_low_s < first.tpot_low_s and final.tpot_high_s > first.tpot_high_s
        offsets.append((final.tpot_log_reps - first.tpot_log_reps) / sd)
    assert np.allclose(offsets[0], offsets[1]) and np.allclose(offsets[0], offsets[2])
    assert np.median(np.abs(offsets[0])) == pytest.approx(1.0, abs=0.2)  # the median of |t(1)|


def test_predict_without_a_baseline_predicts_nothing_and_says_why() -> None:
    plan = grid((1, 2, 3, 4), (1.0,))
    run, window, calls = _fake_executor(plan, fail_baseline=True)
    search = _predict_search(plan, window)
    end = _drive(search, run)
    (curve,) = search.curves
    assert not end.predicted and not curve.final and len(calls) == 1
    assert any("no prediction (the baseline or k=4" in note for note in curve.notes)


def test_predict_notes_drafts_shorter_than_k() -> None:
    plan = grid((1, 2, 3, 4), (1.0,))
    run, window, calls = _fake_executor(plan, k_max_drafted=3.2)
    search = _predict_search(plan, window, lambda p, m: f"pred-{p.hash}")
    _drive(search, run)
    (curve,) = search.curves
    assert any("averaged 3.20 tokens of 4" in note for note in curve.notes), curve.notes
    assert curve.final  # noted, and predicted all the same


def test_predict_refuses_to_start_without_windows_to_read() -> None:
    with pytest.raises(ValueError, match="computes on windows"):
        predicting.PredictSearch(grid((1, 2), (1.0,)), Context({}, SweepSettings.of([JobConfig()])))
    assert SEARCHES["predict"].reads_windows and not SEARCHES["grid"].reads_windows
