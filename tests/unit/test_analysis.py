"""The pure parts of the report, on synthetic sweep tables with known answers."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from pipeline.analysis import advisor, model, quality, verdicts
from pipeline.analysis.plots import pareto_mask
from pipeline.analysis.report import look_table, markdown, page
from pipeline.report import analyse


def _row(role: str, k: int, rate: float, **metrics: float) -> dict:
    method = "none" if role == "baseline" else "ngram"
    point = f"{'baseline' if role == 'baseline' else f'ngram-k{k}'}-r{rate:g}"
    return {"point": point, "role": role, "engine": "vllm", "method": method, "k": k, "request_rate": rate,
            "status": "finished", "error": "", "run_id": point, "point_hash": point, "baseline_hash": "",
            "temperature": 0.0, "dtype": "bfloat16", **metrics}  # fmt: skip


def _sweep(speedups: dict[tuple[int, float], float], length: float = 3.0) -> pd.DataFrame:
    rows = []
    for rate in sorted({r for _, r in speedups}):
        rows.append(_row("baseline", 0, rate, median_tpot_ms=40.0 * rate, output_throughput=100.0 * rate,
                         median_ttft_ms=200.0, median_e2el_ms=5000.0))  # fmt: skip
    for (k, rate), s in speedups.items():
        rows.append(_row("speculative", k, rate, median_tpot_ms=40.0 * rate / s, output_throughput=100.0 * rate,
                         median_ttft_ms=210.0, speedup_median_tpot=s, speedup_median_ttft=200 / 210,
                         output_throughput_ratio=1.0, spec_decode_acceptance_rate=70.0, acceptance_length=length))  # fmt: skip
    return pd.DataFrame(rows)


def test_pareto_frontier_keeps_only_undominated_points() -> None:
    # (TPOT, throughput): lower TPOT and higher throughput dominate.
    x, y = [10, 20, 15, 30, 12], [100, 200, 90, 150, 100]
    assert pareto_mask(x, y) == [True, True, False, False, False]


@pytest.mark.parametrize(
    ("speedups", "rate", "text"),
    [
        ([1.5, 1.2, 0.8], 3.0, "crosses 1.0 at ~3.00 req/s (between 2 and 4)"),
        ([1.5, 1.4, 1.1], None, "none within the measured range (1-4 req/s)"),
        ([0.9, 0.8, 0.7], None, "below 1.0 already at the lowest measured rate (1 req/s)"),
        ([1.5, float("nan"), 0.5], 2.5, "between 1 and 4"),
    ],
)
def test_crossover_interpolates_between_measured_rates(speedups: list[float], rate: float | None, text: str) -> None:
    found, said = verdicts.crossover([1.0, 2.0, 4.0], speedups)
    assert (found is None and rate is None) or math.isclose(found, rate)
    assert text in said
    assert verdicts.crossover([1.0], [1.5])[0] is None
    at_once = verdicts.crossover([1.0, 8.0, float("inf")], [1.6, 1.2, 0.9])
    assert at_once == (8.0, "crosses 1.0 above 8 req/s, by the all-at-once load")


@pytest.mark.parametrize(
    ("speedups", "label"),
    [([1.3], "helps"), ([1.05], "neutral"), ([0.8], "hurts"), ([1.02, 1.2, 1.1], "helps"), ([0.98, 1.3], "neutral"),
     ([], "unknown")],
)  # fmt: skip
def test_a_difference_inside_the_spread_is_neutral_never_helps(speedups: list[float], label: str) -> None:
    assert verdicts.verdict(speedups).label == label


def test_model_recovers_alpha_and_cost_and_predicts_unmeasured_k() -> None:
    from pipeline.acceptance import expected_length

    alpha, c = 0.8, 0.1
    frame = pd.DataFrame()
    rows = []
    for k in (3, 5):
        rows.append({"engine": "vllm", "method": "ngram", "k": k, "request_rate": 1.0,
                     "acceptance_length": expected_length(alpha, k), "speedup_median_tpot": model.predict(alpha, c, k)})  # fmt: skip
    frame = pd.DataFrame(rows)
    fits, skipped = model.fit(frame)
    assert not skipped and len(fits) == 1
    fit = fits[0]
    assert math.isclose(fit.alpha, alpha, abs_tol=1e-6) and math.isclose(fit.c, c, abs_tol=1e-6)
    assert math.isclose(fit.predicted[4], model.predict(alpha, c, 4)) and 4 not in fit.measured
    assert set(fit.measured) == {3, 5}


def test_advice_rules_quote_their_numbers() -> None:
    points = pd.DataFrame([
        {"engine": "vllm", "method": "draft", "k": 3, "request_rate": 1.0, "spec_decode_acceptance_rate": 45.0,
         "speedup_median_ttft": 0.7, "speedup_median_tpot": 1.2, "verdict": "helps"},
        {"engine": "vllm", "method": "eagle", "k": 2, "request_rate": 1.0, "spec_decode_acceptance_rate": 95.0,
         "speedup_median_ttft": 1.0, "speedup_median_tpot": 1.8, "verdict": "helps"},
    ])  # fmt: skip
    crossing = verdicts.Crossover("vllm", "eagle", 2, 6.5, "crosses 1.0 at ~6.50 req/s (between 4 and 8)")
    advice = advisor.advise(points, [crossing], {"draft k=3": 1.6})
    rules = {a.rule: a for a in advice}
    assert "0.45" in rules["acceptance < 0.6"].evidence and "closer" in rules["acceptance < 0.6"].advice
    assert "0.95" in rules["acceptance > 0.9"].evidence and "larger k" in rules["acceptance > 0.9"].advice
    assert "1.43x" in rules["TTFT regression"].evidence
    assert "6.5 req/s" in rules["throughput lost at high load"].advice
    assert "1.60x" in rules["high memory with a separate draft"].evidence
    loaded = pd.DataFrame([
        {"engine": "vllm", "method": "ngram", "k": 3, "request_rate": r, "output_throughput_ratio": t,
         "spec_decode_acceptance_rate": 70.0, "speedup_median_ttft": 1.0} for r, t in ((1.0, 1.1), (16.0, 0.88))
    ])  # fmt: skip
    lost = [a for a in advisor.advise(loaded, [], {}) if a.rule == "throughput lost at high load"]
    assert lost and "16 req/s and above" in lost[0].advice and "0.88x" in lost[0].evidence


def test_k_schedule_picks_the_best_helping_k_per_load_band() -> None:
    points = pd.DataFrame([
        {"method": "ngram", "k": 3, "request_rate": 1.0, "speedup_median_tpot": 1.8, "verdict": "helps"},
        {"method": "ngram", "k": 5, "request_rate": 1.0, "speedup_median_tpot": 2.0, "verdict": "helps"},
        {"method": "ngram", "k": 3, "request_rate": 4.0, "speedup_median_tpot": 1.3, "verdict": "helps"},
        {"method": "ngram", "k": 5, "request_rate": 4.0, "speedup_median_tpot": 1.2, "verdict": "helps"},
        {"method": "ngram", "k": 3, "request_rate": 16.0, "speedup_median_tpot": 0.8, "verdict": "hurts"},
    ])  # fmt: skip
    schedule = advisor.k_schedule(points, {1.0: 2.0, 4.0: 3.0, 16.0: 4.0}, "ngram")
    # Little's law: 1 x 2 s -> batch 2, 4 x 3 s -> 12, 16 x 4 s -> 64.
    assert schedule["num_speculative_tokens_per_batch_size"] == [[1, 2, 5], [3, 12, 3], [13, 1024, 0]]
    assert schedule["num_speculative_tokens"] == 5


def test_lossless_compare_first_divergence_and_dtype_verdicts() -> None:
    base = [{"index": 0, "token_ids": [1, 2, 3]}, {"index": 1, "token_ids": [4, 5, 6]}]
    same = quality.compare("s", "b", "float32", base, base)
    assert same.exact_rate == 1.0 and same.verdict == "identical"
    spec = [{"index": 0, "token_ids": [1, 2, 3]}, {"index": 1, "token_ids": [4, 9, 6]}]
    differs = quality.compare("s", "b", "float32", spec, base)
    assert differs.first_divergence == (None, 1) and differs.exact == 1
    assert differs.verdict.startswith("CORRECTNESS FAILURE")
    assert "numerics alone" in quality.compare("s", "b", "bfloat16", spec, base).verdict
    assert quality.first_divergence([1, 2], [1, 2, 3]) == 2
    statistic, p = quality.length_test([10, 11, 12, 13, 14] * 4, [10, 11, 12, 13, 14] * 4)
    assert statistic == 0.0 and p == 1.0


def test_report_from_a_sweep_with_a_crossover() -> None:
    frame = _sweep({(3, 1.0): 2.0, (3, 4.0): 1.4, (3, 16.0): 0.8, (5, 1.0): 2.2, (5, 4.0): 1.3, (5, 16.0): 0.7})
    data = analyse("t", frame, [], [])
    assert {c.k: round(c.rate, 2) for c in data.crossings} == {3: 12.0, 5: 10.0}
    table = look_table(data)
    assert ["vllm ngram k=3", "TPOT, low load (1/s)", "40.0 ms", "20.0 ms", "2.00x", "helps"] in table
    assert any(row[1] == "TPOT, high load (16/s)" and row[-1] == "hurts" for row in table)
    text = markdown(data)
    assert "Stops paying: ngram k=3 at ~12.0 req/s; ngram k=5 at ~10.0 req/s" in text
    assert "losslessness: no probe outputs" in text
    html = page(data, {"figure": b"\x89PNG"})
    assert html.index("What to look for") < html.index("figure") and "data:image/png;base64," in html


def test_report_says_what_it_could_not_compute() -> None:
    frame = _sweep({(3, 1.0): 1.5})
    frame.loc[len(frame)] = {**_row("speculative", 5, 1.0), "status": "failed", "error": "server died"}
    only_spec = frame[frame["role"] != "baseline"].assign(speedup_median_tpot=float("nan"))
    data = analyse("t", only_spec, [], [])
    gaps = " ".join(data.not_computed)
    assert "no baseline point" in gaps and "failed point(s) left out: ngram-k5-r1" in gaps
    assert "only one request rate" in gaps
    assert "No speculative point could be compared" in markdown(data)


def test_report_states_the_cache_policy_hit_rates_and_method_caveats() -> None:
    from pipeline.analysis.report import conditions

    frame = pd.DataFrame({"point": ["base-r1", "suffix-k3-r1"], "engine": ["sglang", "sglang"],
                          "method": ["none", "suffix"], "prefix_cache": ["warm", "warm"],
                          "prefix_cache_hit_rate": [0.5, 0.25]})  # fmt: skip
    text = "\n".join(conditions(frame))
    assert "prefix cache: warm" in text
    assert "base-r1 50%" in text and "suffix-k3-r1 25%" in text
    assert "global suffix tree" in text and "SGLang's own bench spreads" in text
    assert not any("suffix tree" in c for c in conditions(frame.assign(method="ngram", engine="vllm")))
