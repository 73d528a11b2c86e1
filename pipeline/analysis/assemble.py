"""From the sweep's table and its windows' requests to everything the report shows.

Pure: frames and samples in, a :class:`~pipeline.analysis.markdown.ReportData` (and its figures' inputs) out.
Reading MLflow is :mod:`pipeline.report`'s job.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import pandas as pd

from pipeline.analysis import (
    advisor,
    categories,
    drafter_map,
    leviathan,
    quality,
    search_report,
    stats,
    timeline,
    trust,
    verdicts,
)
from pipeline.analysis.markdown import ReportData, conditions
from pipeline.analysis.samples import Sample, StatsOptions
from pipeline.analysis.stats import Ratio
from pipeline.engines.acceptance import alpha_from_length
from pipeline.engines.registry import emits_k_schedule
from pipeline.load.slo import SloTarget


def load_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Columns the analysis reads, present even where a run lacks them (then empty)."""
    frame = frame.copy()
    for column in (
        "speedup_median_tpot",
        "speedup_median_ttft",
        "output_throughput_ratio",
        "speedup_p99_tpot",
        "spec_decode_acceptance_rate",
        "acceptance_length",
        "acceptance_alpha",
        "median_tpot_ms",
        "output_throughput",
        "median_ttft_ms",
        "median_e2el_ms",
    ):
        if column not in frame:
            frame[column] = math.nan
    if "spec_decode_acceptance_length" in frame:  # runs from before acceptance_length existed
        frame["acceptance_length"] = frame["acceptance_length"].fillna(frame["spec_decode_acceptance_length"])
    missing = frame["acceptance_alpha"].isna() & frame["acceptance_length"].notna()
    frame.loc[missing, "acceptance_alpha"] = [
        alpha_from_length(length, int(k))
        for length, k in zip(frame.loc[missing, "acceptance_length"], frame.loc[missing, "k"], strict=True)
    ]
    return frame


def analyse(
    title: str,
    frame: pd.DataFrame,
    probes: list[dict],
    length_tests: list,
    samples: Mapping[str, Sample] | None = None,
    opts: StatsOptions | None = None,
    target: SloTarget | None = None,
    predictions: pd.DataFrame | None = None,
) -> ReportData:
    """Everything the report says, from the sweep table and each window's requests
    (``samples``: run id -> its requests; without them no ratio gets an interval).

    Synthetic-acceptance points (search=drafter_needed) make a map of their own, which the
    advice then reads; everything else is said of the real drafters alone, as if the map had
    not been measured (they are no drafter's own numbers)."""
    frame, samples, opts = load_frame(frame), samples or {}, opts or StatsOptions()
    drafters = drafter_map.drafter_map(frame, samples, opts)
    real = drafter_map.without_synthetic(frame)
    data = _analyse_real(title, real, probes, length_tests, samples, opts, target, predictions)
    sections = [*drafter_map.map_lines(drafters), *data.sections]
    return replace(data, advice=drafter_map.map_advice(data.advice, drafters), sections=sections, drafters=drafters)


def _analyse_real(
    title: str,
    frame: pd.DataFrame,
    probes: list[dict],
    length_tests: list,
    samples: Mapping[str, Sample] | None = None,
    opts: StatsOptions | None = None,
    target: SloTarget | None = None,
    predictions: pd.DataFrame | None = None,
) -> ReportData:
    frame = load_frame(frame)
    samples, opts = samples or {}, opts or StatsOptions()
    comparisons = verdicts.compare_points(frame, samples, opts, (checked := _trust(frame, samples, opts))[0])
    points = comparisons.table
    gaps = _input_gaps(frame, samples) + _comparison_gaps(points)
    crossings = verdicts.crossovers(comparisons)
    fits, skipped = leviathan.fit_curves(points)
    gaps += [f"model: {s}" for s in skipped]
    schedules = _k_schedules(frame, samples, comparisons, gaps)
    # Host RSS cannot see device memory: the KV capacity decides where vLLM reports it.
    kv = _kv_capacity_against_baseline(frame)
    advice = advisor.advise(comparisons, crossings, _memory_ratios(frame) if not kv else {}, kv)
    if not probes:
        gaps.append("losslessness: no probe outputs in this sweep run (lossless.prompts=0, or all points resumed)")
    curves = search_report.capacity_curves(frame, samples, target, opts) if target is not None else []
    sections = search_report.capacity_lines(curves, target, opts) if target is not None else []
    sections += search_report.predict_lines(predictions if predictions is not None else pd.DataFrame())
    # The same comparison within each point: per request type, first against later turns, and
    # per stretch of a trace.
    by_type = categories.compare_groups(frame, samples, opts)
    by_turn = categories.compare_groups(frame, samples, opts, categories.BY_TURN)
    over_time = timeline.compare_stretches(frame, samples, opts)
    advice += advisor.by_request_type(by_type)
    sections += [*categories.group_lines(by_type), *categories.turn_lines(by_turn)]
    sections += timeline.stretch_lines(over_time, schedules)
    return ReportData(
        title,
        frame,
        points,
        crossings,
        fits,
        advice,
        schedules,
        _lossless(probes),
        length_tests,
        gaps,
        conditions(frame),
        comparisons,
        _window_levels(frame, samples, opts),
        search_report.capacity_headline(curves, target) if target is not None else "",
        sections,
        curves,
        predictions,
        by_type=by_type,
        by_turn=by_turn,
        over_time=over_time,
        trust=checked[1],
    )


def _trust(
    frame: pd.DataFrame, samples: Mapping[str, Sample], opts: StatsOptions
) -> tuple[dict[str, dict[str, str]], list[str]]:
    """Can you trust this run? Each window's checks, and its repeats': the verdicts a failed one
    undermines (withheld, by point and ratio), and the report's lines (analysis/trust.py)."""
    found = trust.window_findings(frame)
    spread = opts.server_spread.for_metric(verdicts.TPOT) if opts.server_spread else None
    repeats = trust.repeat_findings(frame, samples, spread)
    return trust.withheld(frame, found, repeats), trust.trust_lines(frame, found, repeats)


def _input_gaps(frame: pd.DataFrame, samples: Mapping[str, Sample]) -> list[str]:
    """What the sweep's table and windows cannot support, said before anything is computed."""
    gaps = []
    if not (frame["role"] == "baseline").any():
        gaps.append("speedups, crossover and verdicts: the sweep has no baseline point")
    failed = frame[frame["status"] == "failed"]
    if not failed.empty:
        gaps.append(f"{len(failed)} failed point(s) left out: " + ", ".join(failed["point"]))
    done = verdicts.measured(frame)
    missing = [str(p) for p, r in zip(done["point"], done["run_id"], strict=True) if str(r) not in samples]
    if missing:
        gaps.append("intervals: no per-request data (requests.csv) for " + ", ".join(missing))
    return gaps


def _comparison_gaps(points: pd.DataFrame) -> list[str]:
    if points.empty:
        return []
    gaps = []
    if points["request_rate"].nunique() < 2:
        gaps.append("crossover: only one request rate was measured")
    if points["acceptance_length"].isna().all():
        gaps.append("acceptance, alpha and the model: the engine reported no acceptance metrics")
    return gaps


def _k_schedules(
    frame: pd.DataFrame, samples: Mapping[str, Sample], comparisons: verdicts.Comparisons, gaps: list[str]
) -> list[dict]:
    """The k schedule per method, for engines whose format it is written in; what it could not
    cover goes to ``gaps``."""
    points, opts = comparisons.table, comparisons.options
    base = verdicts.measured(frame, "baseline")
    # The k schedule is written in one engine's format: its points and baselines only.
    scheduled = base[base["engine"].map(emits_k_schedule)] if not base.empty else base
    # A sweep whose every point failed has no measured baseline, and its table no latency columns.
    e2el = (
        {float(r): float(g["median_e2el_ms"].median()) / 1000 for r, g in scheduled.groupby("request_rate")}
        if not scheduled.empty
        else {}
    )
    schedulable = points[points["engine"].map(emits_k_schedule)] if not points.empty else points

    def compare(slower: str, faster: str) -> Ratio | None:
        return verdicts.between_points(frame, samples, slower, faster, opts)

    view = verdicts.Comparisons(schedulable, comparisons.decisions, opts)
    methods = sorted(schedulable["method"].unique()) if not schedulable.empty else []
    schedules = [s for m in methods if (s := advisor.k_schedule(view, e2el, m, compare))]
    if not schedules:
        gaps.append("k schedule: needs vLLM speculative points and baseline latencies")
    unscheduled = (
        sorted({str(e) for e in points["engine"].unique() if not emits_k_schedule(str(e))}) if not points.empty else []
    )
    if unscheduled:
        gaps.append(f"k schedule for {', '.join(unscheduled)}: not emitted in that engine's format (not verified here)")
    return schedules


def _window_levels(frame: pd.DataFrame, samples: Mapping[str, Sample], opts: StatsOptions) -> pd.DataFrame:
    """Each point's own median TPOT with its interval (the plots' error bars), repeats together."""
    data = verdicts.measured(frame)
    key = verdicts.key_column(data)
    rows = []
    for i, (_, group) in enumerate(data.groupby(key, sort=False)):
        windows = [samples.get(str(r)) for r in group["run_id"]]
        first = group.iloc[0]
        row = {c: first.get(c) for c in ("role", "engine", "method", "k", "request_rate", "setting_key", "replica")}
        row["output_throughput"] = float(group["output_throughput"].median())
        row["median_tpot_ms"] = float(group["median_tpot_ms"].median())
        row["run_ids"] = " ".join(str(r) for r in group["run_id"])
        if windows and all(w is not None for w in windows):
            level = stats.window_interval("tpot", 50, windows, opts, np.random.default_rng([opts.seed, 99, i]))  # type: ignore[arg-type]
            if level.resolved:
                row["median_tpot_ms_low"], row["median_tpot_ms_high"] = 1000 * level.low, 1000 * level.high  # type: ignore[operator]
        rows.append(row)
    return pd.DataFrame(rows)


def _kv_capacity_against_baseline(frame: pd.DataFrame) -> dict[str, advisor.KvCapacity]:
    """Each speculative configuration's KV cache against the baseline's, from vLLM's own
    vllm:cache_config_info (a draft model's layers take their share of the same memory)."""
    if "kv_cache_size_tokens" not in frame:
        return {}
    rows = frame[frame["status"] == "finished"] if "status" in frame else frame
    base = rows[rows["role"] == "baseline"]
    out = {}
    for (engine, _, _), group in rows[rows["role"] == "speculative"].groupby(["engine", "method", "k"]):
        mine = base[base["engine"] == engine]
        tokens, base_tokens = group["kv_cache_size_tokens"].dropna(), mine["kv_cache_size_tokens"].dropna()
        if tokens.empty or base_tokens.empty or base_tokens.median() <= 0:
            continue
        concurrency = group.get("kv_cache_max_concurrency", pd.Series(dtype=float)).dropna()
        base_concurrency = mine.get("kv_cache_max_concurrency", pd.Series(dtype=float)).dropna()
        weights = group.get("draft_parameter_bytes", pd.Series(dtype=float)).dropna()
        out[verdicts.config_label(group.iloc[0])] = advisor.KvCapacity(
            float(base_tokens.median()),
            float(tokens.median()),
            float(base_concurrency.median()) if not base_concurrency.empty else math.nan,
            float(concurrency.median()) if not concurrency.empty else math.nan,
            float(weights.median()) if not weights.empty else math.nan,
        )
    return out


def _memory_ratios(frame: pd.DataFrame) -> dict[str, tuple[float, float, float]]:
    """Draft-model server memory over the baseline's: (lowest, median, highest) over every
    window's reading, so the rule tests a measured range, not one sample. Device memory
    (nvidia-smi) where every server reported it, else host RSS (a CPU)."""
    column = "server_gpu_memory_mib"
    if column not in frame or frame.loc[frame["status"].isin(["finished", "resumed"]), column].isna().any():
        column = "server_rss_mib"
    if column not in frame:
        return {}
    base = frame[frame["role"] == "baseline"][column].dropna()
    out = {}
    drafts = frame[(frame["role"] == "speculative") & (frame["method"] == "draft")]
    for (method, k), group in drafts.groupby(["method", "k"]):
        values = group[column].dropna()
        if base.empty or values.empty or base.min() <= 0:
            continue
        out[f"{method} k={k}"] = (values.min() / base.max(), values.median() / base.median(), values.max() / base.min())
    return out


def _lossless(probes: list[dict]) -> list[quality.Lossless]:
    by_group = {p["group"]: p for p in probes}
    found = []
    for probe in probes:
        base = by_group.get(probe.get("baseline_group") or "")
        if probe["role"] == "speculative" and base:
            found.append(
                quality.compare_outputs(
                    probe["group"], base["group"], probe["dtype"], probe["outputs"], base["outputs"]
                )
            )
    return found


def output_length_tests(frame: pd.DataFrame, requests: Mapping[str, pd.DataFrame]) -> list[tuple[str, float, float]]:
    """At temperature > 0, outputs may differ legitimately: compare the length distributions."""
    if "temperature" not in frame or not (frame["temperature"] > 0).any():
        return []
    by_hash = frame.set_index("point_hash")
    tests = []
    for row in frame[(frame["role"] == "speculative") & (frame["temperature"] > 0)].itertuples():
        if row.baseline_hash not in by_hash.index:
            continue
        spec, base = requests.get(str(row.run_id)), requests.get(str(by_hash.loc[row.baseline_hash, "run_id"]))
        if spec is not None and base is not None:
            result = quality.length_test(
                spec["output_tokens"].dropna().tolist(), base["output_tokens"].dropna().tolist()
            )
            if result:
                tests.append((row.point, *result))
    return tests
