"""The drafter map (search=drafter_needed): the break-even L on surfaces with a known answer, the
Leviathan check, real drafters placed on the map, the report's words and figure, and the advice
that reads the map instead of the tutorial's fixed thresholds."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from pipeline.analysis import breakeven, drafter_map, figures, iplots, plots
from pipeline.analysis.assemble import analyse
from pipeline.analysis.markdown import markdown
from pipeline.analysis.samples import Sample, StatsOptions
from pipeline.analysis.stats import Ratio, paired_ratio
from pipeline.engines.acceptance import alpha_from_length

OPTS = StatsOptions(resamples=400)
FLOOR = OPTS.floor
TOKENS = 101.0


def _window(rng: np.random.Generator, prompt: np.ndarray, tpot_s: float, length: float = 1.0) -> Sample:
    """A window of len(prompt) requests: per-request TPOT around ``tpot_s`` (the prompt's own
    effect shared with its pair), 101 tokens streamed in as many steps as L=``length`` takes."""
    n = len(prompt)
    tpot = tpot_s * np.exp(prompt + rng.normal(0, 0.05, n))
    ttft = np.full(n, 0.2)
    e2el = ttft + tpot * (TOKENS - 1)
    chunks = 1 + (TOKENS - 1) / length
    return Sample(
        index=np.arange(n),
        values={"tpot": tpot, "ttft": ttft, "e2el": e2el},
        itl=tuple(np.full(int(chunks) - 1, t) for t in tpot),
        output_tokens=np.full(n, TOKENS),
        chunks=np.full(n, chunks),
        duration_s=float(e2el.sum()),
        scheduled_end_s=float(n),
    )


def _surface(cost: float, lengths: tuple[float, ...], seed: int = 0, n: int = 64) -> list[Ratio]:
    """Median-TPOT speedups S(L) = L / cost, each L against one shared baseline window."""
    rng = np.random.default_rng(seed)
    prompt = rng.normal(0, 0.2, n)
    base = _window(rng, prompt, 0.05)
    return [
        paired_ratio(
            "speedup_median_tpot", [base], [_window(rng, prompt, 0.05 * cost / x)], OPTS, np.random.default_rng(1)
        )
        for x in lengths
    ]


LENGTHS = (1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0)


def test_the_break_even_interval_holds_the_known_crossing() -> None:
    """S(L) = L / 1.6 reaches 1 + floor at L = 1.02 x 1.6 = 1.632."""
    truth = (1 + FLOOR) * 1.6
    found = breakeven.break_even(LENGTHS, _surface(1.6, LENGTHS), FLOOR, OPTS)
    assert found.resolved and found.low <= truth <= found.high  # type: ignore[operator]
    assert abs(found.length - truth) < 0.15  # type: ignore[operator]
    assert found.high - found.low < 0.6  # type: ignore[operator]
    assert found.text.startswith(f"{found.length:.2f} [")


def test_a_dip_between_neighbours_does_not_move_the_crossing_below_it() -> None:
    """Estimates 0.8, 1.1, 0.99, 1.3 at L 1..4: the curve is made non-decreasing before its crossing
    is read, so the crossing lies between L=1 and L=2 once, not again at the dip."""
    ratios = [
        Ratio("speedup_median_tpot", s, s * 0.99, s * 1.01, log_replicates=np.full(50, math.log(s)))
        for s in (0.8, 1.1, 0.99, 1.3)
    ]
    found = breakeven.break_even([1.0, 2.0, 3.0, 4.0], ratios, FLOOR, OPTS)
    assert found.length is not None and 1.0 < found.length < 2.0


def test_a_surface_above_everywhere_or_below_everywhere_says_so() -> None:
    cheap = breakeven.break_even(LENGTHS, _surface(0.5, LENGTHS), FLOOR, OPTS)  # S(1) = 2: pays even at L=1
    assert cheap.length == 1.0 and cheap.text.startswith("pays from the smallest L measured (1)")
    dear = breakeven.break_even(LENGTHS, _surface(6.0, LENGTHS), FLOOR, OPTS)  # S(4) = 0.67: never
    assert dear.length is None and dear.high == math.inf and dear.text.startswith("not reached within L 1-4")
    assert breakeven.break_even([2.0], _surface(1.6, (2.0,)), FLOOR, OPTS).text.startswith("not resolved")


def test_leviathan_fits_an_exact_surface_and_reports_its_error_on_a_bent_one() -> None:
    exact = breakeven.leviathan_fit(LENGTHS, _surface(1.6, LENGTHS), k=3)
    assert exact is not None and abs(exact.c - 0.2) < 0.02 and exact.rms_log_error < 0.05
    bent = [Ratio("speedup_median_tpot", 0.9 * math.sqrt(x)) for x in LENGTHS]  # gains flatten under load
    fit = breakeven.leviathan_fit(LENGTHS, bent, k=3)
    assert fit is not None and fit.rms_log_error > 0.1 and fit.within == 0


# ---- a sweep table with a map and real drafters ------------------------------------------------

# Per rate: the draft-cost factor of the proposer (S = L / cost); the real ngram drafter's L and speedup.
COSTS = {1.0: 1.6, 16.0: 3.6}
NGRAM_L = 1.9


def _row(role: str, rate: float, method: str = "none", k: int = 0, told: float | None = None, **extra: object) -> dict:
    name = "baseline" if role == "baseline" else f"{method}-k{k}" + (f"-synL{told:g}" if told is not None else "")
    point = f"{name}-r{rate:g}"
    return {
        "point": point,
        "role": role,
        "engine": "vllm",
        "method": method,
        "k": k,
        "request_rate": rate,
        "workload": "code_edit",
        "repeat": 0,
        "status": "finished",
        "run_id": point,
        "point_hash": point,
        "point_key": point,
        "setting_key": name,
        "map_key": "draft-map" if method == "draft" else f"{method}-map",
        "replica": 0,
        "baseline_hash": "" if role == "baseline" else f"baseline-r{rate:g}",
        "synthetic_length": told,
        "temperature": 0.0,
        "dtype": "float32",
        **extra,
    }


def _levels(w: Sample) -> dict[str, float]:
    return {
        "median_tpot_ms": 1000 * float(np.median(w.values["tpot"])),
        "p99_tpot_ms": 1000 * float(np.percentile(w.values["tpot"], 99)),
        "output_throughput": w.throughput,
        "median_ttft_ms": 200.0,
        "median_e2el_ms": 1000 * float(np.median(w.values["e2el"])),
        "duration": w.duration_s,
    }


def _sweep(
    measured_l: dict[float, float] | None = None, synthetic: bool = True, costs: dict[float, float] = COSTS
) -> tuple[pd.DataFrame, dict]:
    """Baseline, draft k=3 at synthetic L 1..4 and a real ngram k=3 point, at 1 and 16 req/s.
    ``measured_l``: what the counters say for a told L (default: what it was told)."""
    rng = np.random.default_rng(4)
    rows, samples = [], {}
    for rate, cost in costs.items():
        prompt = rng.normal(0, 0.2, 64)
        base = _window(rng, prompt, 0.05)
        rows.append(_row("baseline", rate) | _levels(base))
        samples[rows[-1]["run_id"]] = base
        points = [(told, told) for told in (1.0, 2.0, 3.0, 4.0)] if synthetic else []
        for told, length in [*points, (None, NGRAM_L)]:
            speedup = length / cost if told is not None else 1.9 / 1.2 if rate == 1.0 else 0.8
            counted = (measured_l or {}).get(told, length) if told is not None else length
            spec = _window(rng, prompt, 0.05 / speedup, counted)
            method = "draft" if told is not None else "ngram"
            acceptance = {"acceptance_length": counted, "acceptance_alpha": alpha_from_length(counted, 3)}
            rows.append(_row("speculative", rate, method, 3, told, **acceptance) | _levels(spec))
            samples[rows[-1]["run_id"]] = spec
    return pd.DataFrame(rows), samples


def test_the_map_gives_the_break_even_ceiling_and_places_the_real_drafter() -> None:
    frame, samples = _sweep()
    found = drafter_map.drafter_map(frame, samples, OPTS)
    assert found is not None
    low, high = sorted(found.curves, key=lambda c: c.rate)
    for curve, cost in ((low, COSTS[1.0]), (high, COSTS[16.0])):
        truth = (1 + FLOOR) * cost
        assert curve.break_even.low <= truth <= curve.break_even.high, curve.break_even.text  # type: ignore[operator]
        assert curve.ceiling is not None and curve.ceiling.told == 4.0
        assert all(p.holds for p in curve.points)
        assert curve.fit is not None and abs(curve.fit.c - (cost - 1) / 3) < 0.05
    metrics = drafter_map.map_metrics(found)
    assert metrics["drafter.draft.k3.r1.break_even_L"] == low.break_even.length
    assert metrics["drafter.draft.k3.r16.ceiling_speedup"] == high.ceiling.speedup.ratio.estimate  # type: ignore[union-attr]
    readings = {p.rate: p.reading for p in found.placements}
    assert readings == {1.0: "pays with room", 16.0: "falls short"}
    assert all(p.name == "vllm ngram k=3" and not p.same_proposer for p in found.placements)


def test_the_engine_that_produced_another_l_than_it_was_told_is_caught() -> None:
    frame, samples = _sweep(measured_l={3.0: 2.5})
    found = drafter_map.drafter_map(frame, samples, OPTS)
    assert found is not None
    told = {p.told: p.holds for c in found.curves for p in c.points}
    assert told[3.0] is False and told[2.0] is True
    assert "L=3 told, 2.50" in "\n".join(drafter_map.map_lines(found)) and "MISSES" in "\n".join(
        drafter_map.map_lines(found)
    )


def test_the_report_has_the_map_section_keeps_synthetic_points_out_and_reads_the_map_in_its_advice() -> None:
    frame, samples = _sweep()
    data = analyse("t", frame, [], [], samples, OPTS)
    text = markdown(data)
    assert "## The drafter you would need (synthetic acceptance)" in text
    assert "break-even L (median-TPOT speedup reaching 1 + 2%)" in text
    assert "losslessness is not claimed" in text
    line = next(s for s in text.splitlines() if s.startswith("- vllm ngram k=3: L 1.90") and "16 req/s" in s)
    assert "falls short: a drafter needs L +" in line and "(on the draft map: that proposer's drafting cost)" in line
    # Synthetic points are no drafter's numbers: the verdict table holds the real drafter only.
    assert set(data.points["method"]) == {"ngram"}
    rules = {a.rule for a in data.advice}
    assert "acceptance against the break-even L" in rules and not any(r.startswith("α <") for r in rules)
    # The same sweep without its map: the tutorial's fixed threshold speaks (α of L=1.9 at k=3).
    frame2, samples2 = _sweep(synthetic=False)
    plain = analyse("t", frame2, [], [], samples2, OPTS)
    assert any(a.rule.startswith("α <") for a in plain.advice)
    assert "drafter you would need" not in markdown(plain)


def test_the_map_figure_draws_the_contour_and_the_real_drafter_on_both_renderers() -> None:
    frame, samples = _sweep()
    data = analyse("t", frame, [], [], samples, OPTS)
    specs = figures.report_figures(data)
    heat = specs[figures.FigureKey.DRAFTER_MAP]
    assert isinstance(heat, figures.Heatmap)
    assert heat.rows[0] == "vllm draft k=3 L=4" and heat.columns == ("1", "16")
    contour, marker = heat.overlays
    assert contour.line and len(contour.points) == 2 and not marker.line
    # The contour's rows follow the break-even: a higher L (a lower row index) at 16 req/s.
    assert contour.points[1][1] < contour.points[0][1]
    assert plots.png(heat)[:8] == b"\x89PNG\r\n\x1a\n"
    drawn = iplots.plotly(heat, {}, lambda run: run)
    assert [t.type for t in drawn.data] == ["heatmap", "scatter", "scatter"]


@pytest.mark.parametrize("synthetic", [True, False])
def test_a_sweep_table_without_the_column_has_no_map(synthetic: bool) -> None:
    frame, samples = _sweep(synthetic=synthetic)
    assert (drafter_map.drafter_map(frame.drop(columns=["synthetic_length"]), samples, OPTS)) is None


def test_a_drafter_on_a_map_that_never_pays_falls_short_by_the_break_even_s_lower_end() -> None:
    """Measured on the CPU: the 4-layer draft's own map never reached 1 + floor up to L = k+1. The
    break-even then has no estimate but a lower end; a drafter below it falls short, and the words
    quote that end and the ceiling."""
    found = drafter_map.drafter_map(*_sweep(costs={1.0: 5.0, 16.0: 3.6}), OPTS)  # S(4) = 0.8 at 1 req/s
    assert found is not None
    (placed,) = [p for p in found.placements if p.rate == 1.0]
    assert placed.curve.break_even.length is None and placed.reading == "falls short"
    text = drafter_map.placement_text(placed)
    assert (
        "falls short: a drafter needs L of" in text
        and "at the least" in text
        and "the ceiling of this proposer" in text
    )
