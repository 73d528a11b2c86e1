"""The pure parts of the report, on synthetic sweep tables with known answers."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.analysis import advisor, figures, iplots, leviathan, plots, quality
from pipeline.analysis.assemble import analyse
from pipeline.analysis.figures import FigureKey, pareto_mask
from pipeline.analysis.markdown import ReportData, look_table, markdown
from pipeline.analysis.report_html import page
from pipeline.analysis.samples import Sample, StatsOptions
from pipeline.analysis.verdicts import TPOT
from pipeline.engines.acceptance import alpha_from_length

OPTS = StatsOptions(resamples=500)


def _row(role: str, k: int, rate: float, **metrics: object) -> dict:
    method = metrics.pop("method", "none" if role == "baseline" else "ngram")
    workload = metrics.pop("workload", "code_edit")
    repeat = int(metrics.pop("repeat", 0))  # type: ignore[call-overload]
    name = "baseline" if role == "baseline" else f"{method}-k{k}"
    key = f"{name}-r{rate:g}-{workload}"
    point = f"{key}-rep{repeat}"
    return {
        "point": point,
        "role": role,
        "engine": "vllm",
        "method": method,
        "k": k,
        "request_rate": rate,
        "workload": workload,
        "repeat": repeat,
        "status": "finished",
        "error": "",
        "run_id": point,
        "point_hash": point,
        "point_key": key,
        "setting_key": f"{method}-{workload}",
        "replica": 0,
        "baseline_hash": "" if role == "baseline" else f"baseline-r{rate:g}-{workload}-rep{repeat}",
        "temperature": 0.0,
        "dtype": "bfloat16",
        **metrics,
    }


def _window(
    rng: np.random.Generator,
    prompt: np.ndarray,
    tpot_s: float,
    rate: float,
    ttft_s: float = 0.2,
    chunks: float = 40.0,
    tokens: float = 101.0,
    keeps_up: bool = False,
) -> Sample:
    """One window at ``rate``: requests sent on schedule; unless the server keeps up, each
    waits behind the ones before it, so the window drains long after the last arrival."""
    n = len(prompt)
    tpot = tpot_s * np.exp(prompt + rng.normal(0, 0.05, n))
    ttft = ttft_s * np.exp(rng.normal(0, 0.05, n))
    e2el = ttft + tpot * (tokens - 1)
    sent = np.arange(n) / rate
    if not keeps_up:
        e2el = e2el + np.arange(n) * 40 * float(np.median(e2el)) / max(n, 1)
    finish = sent + e2el
    return Sample(
        index=np.arange(n),
        values={"tpot": tpot, "ttft": ttft, "e2el": e2el},
        itl=tuple(np.full(int(chunks) - 1, t * (tokens - 1) / (chunks - 1)) for t in tpot),
        output_tokens=np.full(n, tokens),
        chunks=np.full(n, chunks),
        duration_s=float(finish.max()) + 0.01,
        scheduled_end_s=float(sent.max()),
    )


def _sweep(
    speedups: dict[tuple[int, float], float],
    n: int = 64,
    runs: int = 1,
    ttft: float = 1.0,
    length: float = 3.0,
    workload: str = "code_edit",
    seed: int = 0,
    keeps_up: bool = False,
) -> tuple[pd.DataFrame, dict[str, Sample]]:
    """A sweep with known effects: each speculative point's median TPOT is the baseline's
    divided by its speedup, prompt by prompt; its TTFT the baseline's divided by ``ttft``."""
    rng = np.random.default_rng(seed)
    rows, samples = [], {}
    for rate in sorted({r for _, r in speedups}):
        for repeat in range(runs):
            prompt = rng.normal(0, 0.3, n)
            base = _window(rng, prompt, 0.04 * rate**0.3, rate, keeps_up=keeps_up)
            row = _row("baseline", 0, rate, workload=workload, repeat=repeat)
            samples[row["run_id"]] = base
            rows.append(row | _levels(base))
            for (k, r), s in speedups.items():
                if r != rate:
                    continue
                spec = _window(
                    rng, prompt, 0.04 * rate**0.3 / s, rate, ttft_s=0.2 / ttft, chunks=101 / length, keeps_up=keeps_up
                )
                srow = _row("speculative", k, rate, workload=workload, repeat=repeat)
                samples[srow["run_id"]] = spec
                acceptance = (
                    {
                        "acceptance_length": length,
                        "acceptance_alpha": alpha_from_length(length, k),
                        "spec_decode_acceptance_rate": 100 * (length - 1) / k,
                    }
                    if k
                    else {}
                )
                rows.append(srow | _levels(spec) | acceptance | {"speedup_median_tpot": s})
    return pd.DataFrame(rows), samples


def _levels(w: Sample) -> dict[str, float]:
    return {
        "median_tpot_ms": 1000 * float(np.median(w.values["tpot"])),
        "output_throughput": w.throughput,
        "median_ttft_ms": 1000 * float(np.median(w.values["ttft"])),
        "duration": w.duration_s,
        "median_e2el_ms": 1000 * float(np.median(w.values["e2el"])),
        "p99_tpot_ms": 1000 * float(np.percentile(w.values["tpot"], 99)),
    }


def test_pareto_frontier_keeps_only_undominated_points() -> None:
    # (TPOT, throughput): lower TPOT and higher throughput dominate.
    x, y = [10, 20, 15, 30, 12], [100, 200, 90, 150, 100]
    assert pareto_mask(x, y) == [True, True, False, False, False]


def test_model_recovers_alpha_and_cost_and_predicts_unmeasured_k() -> None:
    from pipeline.engines.acceptance import expected_length

    alpha, c = 0.8, 0.1
    frame = pd.DataFrame()
    rows = []
    for k in (3, 5):
        rows.append(
            {
                "engine": "vllm",
                "method": "ngram",
                "k": k,
                "request_rate": 1.0,
                "acceptance_length": expected_length(alpha, k),
                "speedup_median_tpot": leviathan.predicted_speedup(alpha, c, k),
            }
        )
    frame = pd.DataFrame(rows)
    fits, skipped = leviathan.fit_curves(frame)
    assert not skipped and len(fits) == 1
    fit = fits[0]
    assert math.isclose(fit.alpha, alpha, abs_tol=1e-6) and math.isclose(fit.c, c, abs_tol=1e-6)
    assert math.isclose(fit.predicted[4], leviathan.predicted_speedup(alpha, c, 4)) and 4 not in fit.measured
    assert set(fit.measured) == {3, 5}


def test_lossless_compare_first_divergence_and_dtype_verdicts() -> None:
    base = [{"index": 0, "token_ids": [1, 2, 3]}, {"index": 1, "token_ids": [4, 5, 6]}]
    same = quality.compare_outputs("s", "b", "float32", base, base)
    assert same.exact_rate == 1.0 and same.verdict == "identical"
    spec = [{"index": 0, "token_ids": [1, 2, 3]}, {"index": 1, "token_ids": [4, 9, 6]}]
    differs = quality.compare_outputs("s", "b", "float32", spec, base)
    assert differs.first_divergence == (None, 1) and differs.exact == 1
    assert differs.verdict.startswith("CORRECTNESS FAILURE")
    assert "numerics alone" in quality.compare_outputs("s", "b", "bfloat16", spec, base).verdict
    assert quality.first_divergence([1, 2], [1, 2, 3]) == 2
    statistic, p = quality.length_test([10, 11, 12, 13, 14] * 4, [10, 11, 12, 13, 14] * 4)
    assert statistic == 0.0 and p == 1.0


def test_report_states_the_cache_policy_hit_rates_and_method_caveats() -> None:
    from pipeline.analysis.markdown import conditions

    frame = pd.DataFrame(
        {
            "point": ["base-r1", "suffix-k3-r1"],
            "engine": ["sglang", "sglang"],
            "method": ["none", "suffix"],
            "prefix_cache": ["warm", "warm"],
            "prefix_cache_hit_rate": [0.5, 0.25],
        }
    )
    text = "\n".join(conditions(frame))
    assert "prefix cache: warm" in text
    assert "base-r1 50%" in text and "suffix-k3-r1 25%" in text
    assert "global suffix tree" in text and "SGLang's own bench spreads" in text
    assert not any("suffix tree" in c for c in conditions(frame.assign(method="ngram", engine="vllm")))


def _analyse(frame: pd.DataFrame, samples: dict[str, Sample], memory: bool = False):  # type: ignore[no-untyped-def]
    return analyse("t", frame, [], [], samples, OPTS)


def test_report_from_a_sweep_with_a_crossover_has_an_interval_on_every_ratio() -> None:
    frame, samples = _sweep({(3, 1.0): 2.0, (3, 4.0): 1.4, (3, 16.0): 0.6})
    data = _analyse(frame, samples)
    [cross] = data.crossings
    assert cross.rate is not None and 4.0 < cross.low <= cross.rate <= cross.high < 16.0
    assert "crosses 1.0 at ~" in cross.text and "[" in cross.text
    table = look_table(data)
    ratio_cells = [
        row[4] for row in table if row[1].startswith(("median TPOT", "p99 TPOT", "throughput", "median TTFT"))
    ]
    assert ratio_cells and all("x [" in c or "no interval" in c for c in ratio_cells), ratio_cells
    low = next(row for row in table if row[1] == "median TPOT, low load (1/s)")
    assert low[4].startswith("2.0") and low[5] == "helps"
    assert next(row for row in table if row[1] == "median TPOT, high load (16/s)")[5] == "hurts"
    text = markdown(data)
    assert "Benjamini-Hochberg" in text and "Stops paying: ngram k=3 crosses 1.0 at ~" in text
    html = page(data, {"figure": b"\x89PNG"})
    assert html.index("What to look for") < html.index("figure") and "data:image/png;base64," in html


def test_a_predict_report_shows_each_section_once_in_the_html() -> None:
    """search=predict's own section is headed "## Predicted k curve": the page's Markdown part
    starts at the model's heading, not at the first heading that begins alike."""
    frame, samples = _sweep({(3, 1.0): 2.0, (3, 4.0): 1.4})
    predictions = pd.DataFrame(
        [{"curve": "vllm ngram", "k": 3, "request_rate": 1.0, "chosen": True, "confirmed": False, "predicted": True}]
    )
    data = analyse("t", frame, [], [], samples, OPTS, predictions=predictions)
    html = page(data, {})
    for heading in (
        "Predicted k curve",
        "Where speculation stops paying",
        "Predicted against measured speedup",
        "Advice",
        "k schedule",
        "Losslessness",
        "Not computed",
    ):
        assert html.count(f"## {heading}") + html.count(f"<h2>{heading}") == 1, heading
    assert markdown(data).count("## Predicted k curve") == 1


def test_points_that_differ_in_workload_are_never_pooled() -> None:
    a, sa = _sweep({(3, 1.0): 2.0}, workload="code_edit")
    b, sb = _sweep({(3, 1.0): 1.0}, workload="chat", seed=1)
    data = _analyse(pd.concat([a, b]), sa | sb)
    by_workload = data.points.set_index("workload")
    assert by_workload.loc["code_edit", "verdict"] == "helps" and by_workload.loc["chat", "verdict"] != "helps"
    assert (data.points["runs"] == 1).all()
    # The model too: one fit per workload, each from its own speedup (2.0 and 1.0), never one pooled fit.
    assert [f.method for f in data.fits] == ["ngram", "ngram"]
    assert sorted(round(f.measured[3], 1) for f in data.fits) == [1.0, 2.0]


def test_a_small_true_effect_is_inconclusive_with_the_window_that_would_resolve_it() -> None:
    frame, samples = _sweep({(3, 1.0): 1.06}, n=12, seed=3)
    data = _analyse(frame, samples)
    row = data.points.iloc[0]
    assert row["verdict"] == "inconclusive"
    decision = data.comparisons.decision(row["point_key"], "speedup_median_tpot")  # type: ignore[union-attr]
    assert decision is not None and "requests per window, an effect of" in decision.detail


def test_the_report_advice_and_figures_read_each_verdict_from_its_decision_not_the_table() -> None:
    """The table's verdict column is for a reader of the table: blanking it changes nothing the
    report, the advice, the k schedule or the figures say."""
    from dataclasses import replace as with_

    frame, samples = _sweep({(3, 1.0): 2.0, (3, 4.0): 1.4, (3, 16.0): 0.6})
    data = _analyse(frame, samples)
    assert data.comparisons is not None
    blank = data.points.assign(verdict="")
    blanked = with_(data, points=blank, comparisons=with_(data.comparisons, table=blank))
    assert blanked.comparisons is not None
    assert markdown(blanked) == markdown(data) and "Speculation helps at 2 of 3" in markdown(blanked)
    assert list(blanked.comparisons.labels(blank)) == ["helps", "helps", "hurts"]

    def hovers(d: ReportData) -> list[str]:
        specs = figures.report_figures(d)
        speedup, heat = specs[FigureKey.SPEEDUP_VS_RATE], specs[FigureKey.SPEEDUP_HEATMAP]
        assert isinstance(speedup, figures.Chart) and isinstance(heat, figures.Heatmap)
        cells = [c.hover for line in heat.cells for c in line if c is not None]
        return [p.hover for s in speedup.series for p in s.points] + cells

    assert hovers(blanked) == hovers(data) and any(h.endswith(": helps") for h in hovers(blanked))
    e2el = {1.0: 1.0, 4.0: 1.0, 16.0: 1.0}
    schedule = advisor.k_schedule(blanked.comparisons, e2el, "ngram", lambda slower, faster: False)
    assert schedule == advisor.k_schedule(data.comparisons, e2el, "ngram", lambda slower, faster: False)
    assert schedule is not None and schedule["num_speculative_tokens_per_batch_size"][0][2] == 3
    # A rate whose baseline served nothing (every request failed: its latency is NaN) has no band;
    # the others keep theirs (the default sweep's 16/s windows on an AVX2-only CPU).
    lost = advisor.k_schedule(data.comparisons, e2el | {16.0: math.nan}, "ngram", lambda slower, faster: False)
    assert lost is not None and lost["num_speculative_tokens_per_batch_size"][0][2] == 3


def test_fewer_than_five_requests_get_no_verdict() -> None:
    frame, samples = _sweep({(3, 1.0): 3.0}, n=4)
    data = _analyse(frame, samples)
    assert data.points.iloc[0]["verdict"] == "not enough requests"
    assert "Not enough requests to compare any point" in markdown(data)


def test_throughput_where_both_servers_keep_up_is_load_bound_not_a_verdict() -> None:
    frame, samples = _sweep({(3, 1.0): 2.0}, runs=3, keeps_up=True)

    def throughput_label(data: ReportData) -> str:
        decision = data.comparisons.decision(data.points.iloc[0]["point_key"], "output_throughput_ratio")  # type: ignore[union-attr]
        assert decision is not None
        return decision.label

    data = _analyse(frame, samples)
    assert throughput_label(data) == "load-bound" and bool(data.points.iloc[0]["load_bound"])
    saturated, s2 = _sweep({(3, 16.0): 2.0}, runs=3)
    assert throughput_label(_analyse(saturated, s2)) != "load-bound"


def test_repeats_widen_the_interval_with_the_spread_between_runs() -> None:
    one, s1 = _sweep({(3, 1.0): 1.5}, n=64)
    three, s3 = _sweep({(3, 1.0): 1.5}, n=64, runs=3)
    for run in [r for r in three["run_id"] if "ngram" in r and r.endswith("rep1")]:
        w = s3[run]  # the second repeat's server was slower: a run-to-run shift of 30 %
        s3[run] = Sample(
            w.index,
            {k: v * 1.3 for k, v in w.values.items()},
            w.itl,
            w.output_tokens,
            w.chunks,
            w.duration_s,
            scheduled_end_s=w.scheduled_end_s,
        )
    p1, p3 = _analyse(one, s1).points.iloc[0], _analyse(three, s3).points.iloc[0]
    assert p3["runs"] == 3 and p1["runs"] == 1
    assert p3["high"] / p3["low"] > p1["high"] / p1["low"]
    assert "runs, then requests" in p3["basis"]


def _advice(frame: pd.DataFrame, samples: dict[str, Sample], memory: dict | None = None) -> dict[str, advisor.Advice]:
    data = _analyse(frame, samples)
    return {a.rule: a for a in advisor.advise(data.comparisons, data.crossings, memory or {})}


def test_acceptance_rules_fire_on_a_resolved_alpha_and_quote_it() -> None:
    low = _advice(*_sweep({(3, 1.0): 1.2}, length=1.6))
    assert "α < 0.6" in low and "[" in low["α < 0.6"].evidence and "effective k" in low["α < 0.6"].evidence
    high = _advice(*_sweep({(3, 1.0): 2.5}, length=3.9))
    assert "α > 0.9" in high and "larger k" in high["α > 0.9"].advice
    middle = _advice(*_sweep({(3, 1.0): 2.0}, length=3.0))
    assert not {"α < 0.6", "α > 0.9"} & set(middle)


def test_acceptance_rule_stays_silent_on_an_unresolved_alpha() -> None:
    # Too few multi-step requests to measure the spread: no interval, so no advice.
    assert "α < 0.6" not in _advice(*_sweep({(3, 1.0): 1.2}, n=4, length=1.6))


def test_ttft_rule_fires_only_when_the_whole_interval_is_below_its_threshold() -> None:
    slow = _advice(*_sweep({(3, 1.0): 2.0}, ttft=0.7))
    assert "TTFT regression" in slow and "x [" in slow["TTFT regression"].evidence
    assert "TTFT regression" not in _advice(*_sweep({(3, 1.0): 2.0}, ttft=0.93))


def test_throughput_and_crossover_rules_need_resolved_intervals() -> None:
    lost = _advice(*_sweep({(3, 1.0): 2.0, (3, 16.0): 0.6}, runs=3))
    assert "speculation stops paying" in lost and "[" in lost["speculation stops paying"].evidence
    assert (
        "throughput lost at high load" in lost and "16 req/s and above" in lost["throughput lost at high load"].advice
    )
    assert not {"speculation stops paying", "throughput lost at high load"} & set(
        _advice(*_sweep({(3, 1.0): 1.1, (3, 16.0): 0.95}, n=8))
    )


def test_memory_rule_quotes_the_range_of_readings() -> None:
    rules = _advice(*_sweep({(3, 1.0): 2.0}), memory={"draft k=3": (1.4, 1.6, 1.8)})
    assert "1.60x [1.40, 1.80]" in rules["high memory with a separate draft"].evidence
    assert "high memory with a separate draft" not in _advice(
        *_sweep({(3, 1.0): 2.0}), memory={"draft k=3": (1.2, 1.6, 1.8)}
    )


def test_k_schedule_changes_k_only_where_the_difference_is_resolved() -> None:
    import dataclasses

    from pipeline.analysis.samples import ServerSpread

    def ks(at_4: tuple[float, float], opts: StatsOptions) -> list[int]:
        frame, samples = _sweep(
            {(3, 1.0): 1.8, (5, 1.0): 2.6, (3, 4.0): at_4[0], (5, 4.0): at_4[1], (3, 16.0): 0.6, (5, 16.0): 0.5}
        )
        [schedule] = analyse("t", frame, [], [], samples, opts).schedules
        return [band[2] for band in schedule["num_speculative_tokens_per_batch_size"]]

    spread = dataclasses.replace(OPTS, server_spread=ServerSpread({"speedup_median_tpot": 0.03}, 20, "aa"))
    # k=5 is resolved faster at 1/s. At 4/s, k=3's 3 % edge is inside the noise: the band keeps k=5.
    assert ks((1.56, 1.5), spread) == [5, 5, 0]
    # A resolved difference does change it, once the spread between the two servers is in the interval.
    assert ks((2.0, 1.3), spread) == [5, 3, 0]
    # Without a measured server spread, two one-run windows on two servers resolve nothing
    # (that rule called 30 % of A/A comparisons): the schedule keeps the band's k.
    assert ks((2.0, 1.3), OPTS) == [5, 5, 0]


def test_k_schedule_keeps_the_previous_k_where_it_stops_helping_unless_another_is_resolved_better() -> None:
    import dataclasses

    from pipeline.analysis.samples import ServerSpread

    frame, samples = _sweep({(3, 1.0): 1.8, (5, 1.0): 2.6, (3, 4.0): 1.10, (5, 4.0): 1.03}, seed=2)
    spread = dataclasses.replace(OPTS, server_spread=ServerSpread({"speedup_median_tpot": 0.03}, 20, "aa"))
    data = analyse("t", frame, [], [], samples, spread)
    at_4 = data.comparisons.table[data.comparisons.table["request_rate"] == 4.0]  # type: ignore[union-attr]
    labels = dict(zip(at_4["k"], data.comparisons.labels(at_4), strict=True))  # type: ignore[union-attr]
    assert labels == {3: "helps", 5: "inconclusive"}
    # k=5 stopped helping at 4/s and k=3 helps there, but not resolved faster than k=5 in their
    # paired comparison: a switch would be on noise, so the band keeps k=5.
    [schedule] = data.schedules
    assert [band[2] for band in schedule["num_speculative_tokens_per_batch_size"]] == [5, 5]


def test_the_k_schedules_comparisons_are_adjusted_as_one_family() -> None:
    from pipeline.analysis.decisions import Decision
    from pipeline.analysis.stats import Ratio
    from pipeline.analysis.verdicts import Comparisons

    def sweep(rates: tuple[float, ...]) -> Comparisons:
        rows, found = [], {}
        for rate in rates:
            for k, speedup in ((3, 1.5), (5, 1.6 if rate == 1.0 else 1.45)):
                key = f"k{k}@{rate:g}"
                rows.append({"method": "ngram", "request_rate": rate, "k": k, "point_key": key, TPOT: speedup})
                found[key] = {TPOT: Decision("helps", Ratio(TPOT, speedup, speedup / 1.1, speedup * 1.1))}
        return Comparisons(pd.DataFrame(rows), found, OPTS)

    asked: list[tuple[str, str]] = []

    def compare(slower: str, faster: str) -> Ratio:
        asked.append((slower, faster))
        # k=3 over k=5 at 2/s clears the floor on its own (p about 0.04); the rest are null.
        return Ratio(TPOT, 1.06, 1.021, 1.10) if slower == "k5@2" else Ratio(TPOT, 1.0, 0.95, 1.05)

    def ks(rates: tuple[float, ...]) -> list[int]:
        schedule = advisor.k_schedule(sweep(rates), dict.fromkeys(rates, 1.0), "ngram", compare)
        assert schedule is not None
        return [band[2] for band in schedule["num_speculative_tokens_per_batch_size"]]

    # Alone, the one comparison switches k at 2/s; as one of the schedule's three comparisons
    # (Benjamini-Hochberg over them) it does not.
    assert ks((1.0, 2.0)) == [5, 3]
    assert ks((1.0, 2.0, 4.0, 8.0)) == [5, 5, 5, 5] and len(asked) >= 4


def test_aa_report_counts_false_alarms_and_the_smallest_resolvable_effect() -> None:
    frame, samples = _sweep({(0, 1.0): 1.0, (0, 4.0): 1.0}, n=64)
    frame.loc[frame["role"] == "speculative", ["method", "replica"]] = ["none", 1]
    data = _analyse(frame, samples)
    text = markdown(data)
    assert text.count("A/A comparison") >= 1 and "false alarm" in text
    assert "Smallest median-TPOT speedup this sweep's windows resolve (1 run(s) per point): 1.0" in text


def test_one_specification_carries_its_intervals_and_both_renderers_draw_it() -> None:
    frame, samples = _sweep({(3, 1.0): 2.0, (3, 4.0): 1.02})
    data = _analyse(frame, samples)
    assert data.levels is not None and data.levels["median_tpot_ms_low"].notna().all()
    specs = figures.report_figures(data)
    tpot = specs[FigureKey.THROUGHPUT_MEDIAN_TPOT]
    assert isinstance(tpot, figures.Chart)
    drawn = [s for s in tpot.series if s.look is not figures.Look.FRONTIER]
    assert drawn and all(p.x_err is not None and p.x_err[0] <= p.x <= p.x_err[1] for s in drawn for p in s.points)
    speedup = specs[FigureKey.SPEEDUP_VS_RATE]
    assert isinstance(speedup, figures.Chart)
    assert all(p.y_err is not None for s in speedup.series for p in s.points)
    for key, spec in specs.items():
        assert plots.png(spec).startswith(b"\x89PNG"), key
        rendered = iplots.plotly(spec, {}, lambda run: run)
        if isinstance(spec, figures.Chart):  # the same series, point for point, in both renderers
            assert [t.name for t in rendered.data] == [s.name for s in spec.series], key
            assert [list(t.y) for t in rendered.data] == [[p.y for p in s.points] for s in spec.series], key


def test_the_aa_spread_is_added_where_repeats_shared_their_servers_not_where_they_restarted() -> None:
    import dataclasses

    from pipeline.analysis.samples import ServerSpread

    frame, samples = _sweep({(3, 1.0): 1.5}, runs=3)
    opts = dataclasses.replace(OPTS, server_spread=ServerSpread({"speedup_median_tpot": 0.2}, 10, "aa"))
    spec = frame["role"] == "speculative"
    shared = frame.assign(server=np.where(spec, 2, 1))
    restarted = frame.assign(server=np.where(spec, 10 + frame["repeat"], frame["repeat"]))
    width = {}
    for name, table in (("shared", shared), ("restarted", restarted)):
        row = analyse("t", table, [], [], samples, opts).points.iloc[0]
        width[name] = row["high"] / row["low"]
    assert width["shared"] > 1.2 * width["restarted"]


def test_interactive_figures_hover_with_config_rate_interval_and_run_link_and_the_table_links_runs() -> None:
    from dataclasses import replace as with_

    from pipeline.finish.report_build import interactive_figures

    frame, samples = _sweep({(3, 1.0): 2.0, (3, 4.0): 1.4, (5, 1.0): 1.8, (5, 4.0): 1.2})
    data = with_(_analyse(frame, samples), run_url="http://mlflow:5000/#/experiments/7/runs/{run}")
    drawn = interactive_figures(data)
    assert {key.value for key in drawn} == {
        "Output throughput against median TPOT",
        "Output throughput against p99 TPOT",
        "Median-TPOT speedup against request rate",
        "TTFT against request rate",
        "Acceptance against k",
        "Median-TPOT speedup over k x request rate",
    }
    (heat,) = drawn[FigureKey.SPEEDUP_HEATMAP].data
    cell = heat.customdata[list(heat.y).index("vllm ngram k=3")][list(heat.x).index("1")]
    assert cell[2].startswith("median-TPOT speedup 2.") and "x [" in cell[2] and cell[2].endswith(": helps")
    assert cell[4] == "http://mlflow:5000/#/experiments/7/runs/ngram-k3-r1-code_edit-rep0"
    p99 = drawn[FigureKey.THROUGHPUT_P99_TPOT]
    assert all(
        c[2].startswith("p99 TPOT ") and c[4].startswith("http://mlflow:5000/")
        for t in p99.data[:-1]
        for c in t.customdata
    )  # the last trace is the Pareto frontier, which has no runs
    speedup = drawn[FigureKey.SPEEDUP_VS_RATE]
    (k3,) = [t for t in speedup.data if t.name == "vllm ngram k=3"]
    config, rate, value, link, target = k3.customdata[0]
    assert (config, rate) == ("vllm ngram k=3", "1") and value.startswith("median-TPOT speedup 2.")
    assert "x [" in value and value.endswith(": helps")  # the estimate with its interval, and the verdict
    assert link.startswith('<a href="http://mlflow:5000/#/experiments/7/runs/ngram-k3-r1-code_edit-rep0">MLflow run: ')
    assert target == "http://mlflow:5000/#/experiments/7/runs/ngram-k3-r1-code_edit-rep0"
    pareto = drawn[FigureKey.THROUGHPUT_MEDIAN_TPOT]
    assert any("median TPOT " in c[2] and " ms [" in c[2] for t in pareto.data for c in t.customdata)
    html = page(data, {}, iplots.html(drawn))
    assert html.count("Plotly.newPlot") == 6 and "plotly_click" in html and "<script src=" not in html  # offline
    assert "<th>MLflow runs</th>" in html
    assert (
        '<a href="http://mlflow:5000/#/experiments/7/runs/ngram-k5-r4-code_edit-rep0">ngram-k5-r4-code_edit-rep0</a>'
        in html
    )


def test_every_look_table_row_has_six_cells_and_says_a_missing_interval_once() -> None:
    frame, samples = _sweep({(3, 1.0): 2.0, (3, 4.0): 1.4})
    data = _analyse(frame, samples)
    table = look_table(data)
    assert {len(row) for row in table} == {6}  # acceptance rows too: the run links stay under their column
    acceptance = next(row for row in table if row[1].startswith("acceptance"))
    assert acceptance[2] == "—" and acceptance[3].startswith("L ") and acceptance[4] == "—"
    throughput = next(row for row in table if row[1].startswith("throughput"))
    assert "no interval" in throughput[4] and "no interval" not in throughput[5]


def test_the_losslessness_line_names_where_outputs_first_differ_not_a_python_list() -> None:
    from dataclasses import replace as with_

    frame, samples = _sweep({(3, 1.0): 2.0})
    lossless = quality.Lossless("ngram", "baseline", "float32", 4, 3, (None, 57, None, None))
    text = markdown(with_(_analyse(frame, samples), lossless=[lossless]))
    line = next(x for x in text.splitlines() if x.startswith("- ngram vs baseline"))
    assert "3/4 identical; first divergence: prompt 1 at token 57;" in line and "[None" not in line


def test_the_kv_capacity_rule_fires_from_vllms_own_figures_beside_the_speedup() -> None:
    frame, samples = _sweep({(3, 1.0): 2.0})
    data = _analyse(frame, samples)
    name = f"{frame[frame['role'] == 'speculative'].iloc[0]['engine']} ngram k=3"
    lost = {name: advisor.KvCapacity(93184, 82176, 45.5, 40.1)}  # the 4-layer draft on this CPU
    rule = {a.rule: a for a in advisor.advise(data.comparisons, data.crossings, {}, lost)}[
        "KV capacity lost to the draft"
    ]
    assert "takes 11.8% of the KV cache" in rule.advice
    assert "93,184 -> 82,176 tokens, max concurrency 45.5 -> 40.1" in rule.evidence
    assert "median-TPOT speedup 2." in rule.evidence  # the speedup it bought, beside it
    kept = {name: advisor.KvCapacity(93184, 93184, 45.5, 45.5)}  # ngram: no draft weights
    assert all(
        a.rule != "KV capacity lost to the draft" for a in advisor.advise(data.comparisons, data.crossings, {}, kept)
    )


def test_memory_pressure_to_eagle_is_a_measured_line_from_each_methods_kv_and_weights() -> None:
    """The tuning guide's "memory pressure: use EAGLE" from the figures: each configuration's own
    weights and the KV cache it leaves, and which to prefer only where a head and a draft were
    both measured (the figures below: a head and the 4-layer draft, bf16, a 2 GiB cache)."""
    frame, samples = _sweep({(3, 1.0): 2.0})
    data = _analyse(frame, samples)
    engine = frame[frame["role"] == "speculative"].iloc[0]["engine"]
    both = {
        f"{engine} ngram k=3": advisor.KvCapacity(93184, 93184, 45.5, 45.5),
        f"{engine} eagle3 k=3": advisor.KvCapacity(93184, 90080, 45.5, 44.0, 6.3e6 * 2),
        f"{engine} draft k=3": advisor.KvCapacity(93184, 82176, 45.5, 40.1, 44.3e6 * 2),
    }
    rule = {a.rule: a for a in advisor.advise(data.comparisons, data.crossings, {}, both)}["memory each method costs"]
    assert rule.advice.startswith(f"under memory pressure prefer {engine} eagle3 k=3: it leaves 96.7% of the KV cache")
    assert f"{engine} draft k=3 88.2%" in rule.advice
    assert (
        f"{engine} eagle3 k=3: 12.0 MiB of its own weights, KV cache 96.7% of the baseline's (90,080 tokens)"
        in rule.evidence
    )
    assert f"{engine} draft k=3: 84.5 MiB of its own weights" in rule.evidence
    assert "median-TPOT speedup 2." in rule.evidence  # ngram's, which the sweep measured
    alone = {k: v for k, v in both.items() if "eagle3" not in k}
    rule = {a.rule: a for a in advisor.advise(data.comparisons, data.crossings, {}, alone)}["memory each method costs"]
    assert "prefer" not in rule.advice  # no head measured: nothing to prefer it over
    assert all(a.rule != "memory each method costs" for a in advisor.advise(data.comparisons, data.crossings, {}, {}))


def test_a_point_too_small_for_a_ratio_is_left_out_of_the_interactive_figures_not_a_crash() -> None:
    from dataclasses import replace as with_

    frame, samples = _sweep({(3, 1.0): 2.0, (3, 4.0): 1.5})
    comparisons = _analyse(frame, samples).comparisons
    assert comparisons is not None
    points = comparisons.table.copy()
    points.loc[points.index[0], ["speedup_median_tpot", "speedup_median_tpot_low", "speedup_median_tpot_high"]] = None
    key = str(points.iloc[0]["point_key"])  # its verdict travels in its Decision
    too_few = with_(comparisons.decisions[key][TPOT], label="not enough requests")
    decided = comparisons.decisions | {key: comparisons.decisions[key] | {TPOT: too_few}}
    comparisons = with_(comparisons, table=points, decisions=decided)
    curve = figures.speedup_vs_rate(comparisons)
    assert curve is not None and [len(s.points) for s in curve.series] == [1]  # the other rate only
    heat = figures.speedup_heatmap(comparisons)
    assert heat is not None
    assert "no ratio: not enough requests" in str(iplots.plotly(heat, {}, lambda run: run).data[0].customdata)


def test_the_memory_rule_reads_device_memory_where_every_server_reports_it() -> None:
    from pipeline.analysis.assemble import _memory_ratios

    frame = pd.DataFrame(
        {
            "role": ["baseline", "speculative"],
            "method": ["none", "draft"],
            "k": [0, 3],
            "status": ["finished", "finished"],
            "server_rss_mib": [1000.0, 1000.0],
            "server_gpu_memory_mib": [40000.0, 60000.0],
        }
    )
    assert _memory_ratios(frame) == {"draft k=3": (1.5, 1.5, 1.5)}
    cpu = frame.assign(server_gpu_memory_mib=[None, None])  # no GPU reading: host RSS, as before
    assert _memory_ratios(cpu) == {"draft k=3": (1.0, 1.0, 1.0)}


def test_the_gate_trends_reach_the_report_keyed_by_their_figure_key(tmp_path: Path) -> None:
    from pipeline.finish.report_build import _since_reference

    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "summary.md").write_text("pass\n")
    (gate / "trend1.png").write_bytes(b"\x89PNG")

    class Reader:
        def download(self, parent: str, name: str, work: object) -> object:
            return gate if name == "gate" else None

    since, trends = _since_reference(Reader(), "parent", tmp_path)  # type: ignore[arg-type]
    assert since == "pass\n" and list(trends) == [figures.FigureId(FigureKey.GATE_TREND, "trend1")]
    assert [f.title for f in trends] == ["Since the reference (trend1)"]  # the name the report shows
    assert figures.FigureId(FigureKey.SPEEDUP_VS_RATE).title == FigureKey.SPEEDUP_VS_RATE.value
