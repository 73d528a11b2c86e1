"""A trace replay's verdict over its own time, on synthetic windows with a known answer."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.analysis import timeline
from pipeline.analysis.categories import GroupComparisons
from pipeline.analysis.samples import Sample, StatsOptions


def _window(tpot_at: dict[int, float], seed: int) -> Sample:
    """48 requests, one every 2.5 s: four stretches of 12 (MIN_PER_BUCKET each); a request's
    TPOT is its stretch's times a little noise; each takes 2 s, so 0.8 are in flight on average."""
    rng = np.random.default_rng(seed)
    scheduled = np.arange(48) * 2.5
    tpot = np.array([tpot_at[int(t // 30)] for t in scheduled]) * rng.lognormal(0, 0.05, 48)
    return Sample(
        index=np.arange(48),
        values={"tpot": tpot, "ttft": tpot * 3, "e2el": np.full(48, 2.0)},
        itl=tuple(np.full(8, v) for v in tpot),
        output_tokens=np.full(48, 9.0),
        chunks=np.full(48, 9.0),
        duration_s=122.0,
        scheduled=scheduled,
        category=np.full(48, "chat", dtype=object),
    )


def _frame(with_trace: bool = True) -> pd.DataFrame:
    trace = {"trace_requests": 120.0} if with_trace else {}
    return pd.DataFrame(
        [
            {
                "role": "baseline",
                "status": "finished",
                "run_id": "b",
                "point_hash": "pb",
                "point_key": "kb",
                "engine": "vllm",
                "method": "none",
                "k": 0,
                "request_rate": 1.0,
                "point": "baseline-r1",
                **trace,
            },
            {
                "role": "speculative",
                "status": "finished",
                "run_id": "s",
                "point_hash": "ps",
                "point_key": "ks",
                "baseline_hash": "pb",
                "engine": "vllm",
                "method": "ngram",
                "k": 3,
                "request_rate": 1.0,
                "point": "ngram-k3-r1",
                **trace,
            },
        ]
    )


def test_each_stretch_gets_its_own_paired_speedup_and_load() -> None:
    base = _window({0: 0.05, 1: 0.05, 2: 0.05, 3: 0.05}, 1)
    spec = _window({0: 0.025, 1: 0.025, 2: 0.06, 3: 0.025}, 2)  # truth: 2x, 2x, 0.83x, 2x
    stretches = timeline.compare_stretches(_frame(), {"b": base, "s": spec}, StatsOptions(resamples=1000))
    table = stretches.table
    assert list(table["bucket"]) == ["0-29 s", "29-59 s", "59-88 s", "88-118 s"]  # 0 to the last send, in 4
    truth = [2.0, 2.0, 0.05 / 0.06, 2.0]
    for row, expected in zip(table.itertuples(index=False), truth, strict=True):
        assert row.speedup_median_tpot_low < expected < row.speedup_median_tpot_high, row
        assert row.requests == 12 and abs(row.offered_rate - 12 / (117.5 / 4)) < 1e-6
        assert abs(row.in_flight - 0.8) < 0.1
    assert list(table["verdict"]) == ["helps", "helps", "hurts", "helps"]
    schedules = [{"method": "ngram", "num_speculative_tokens_per_batch_size": [[1, 4, 3], [5, 1024, 0]]}]
    text = "\n".join(timeline.stretch_lines(stretches, schedules))
    assert "## Over the trace" in text and "59-88 s: 0.41 req/s offered, 0.8 in flight" in text
    assert "the k schedule gives k=3 at this batch" in text
    assert "speculation paid in 3 of the 4 stretches decided; at the busiest" in text
    # The figure: the load above, each stretch's speedup below, drawn by both renderers.
    from pipeline.analysis import figures, iplots, plots

    chart = figures.trace_timeline(stretches)
    assert chart is not None and chart.upper_label and plots.png(chart).startswith(b"\x89PNG")
    drawn = iplots.plotly(chart, {}, lambda run: run)
    assert [t.name for t in drawn.data] == [s.name for s in chart.series]


def test_no_trace_or_too_few_requests_gets_no_section() -> None:
    base, spec = _window({i: 0.05 for i in range(4)}, 1), _window({i: 0.03 for i in range(4)}, 2)
    assert timeline.compare_stretches(
        _frame(with_trace=False), {"b": base, "s": spec}, StatsOptions(resamples=200)
    ).empty
    few = {"b": base.with_index(np.arange(20)), "s": spec.with_index(np.arange(20))}  # 20 < 2 x 12
    assert timeline.compare_stretches(_frame(), few, StatsOptions(resamples=200)).empty
    assert timeline.stretch_lines(GroupComparisons()) == []
    assert timeline.schedule_k([], "ngram", 3.0) is None


def test_each_stretch_carries_its_verdict_as_a_decision_and_the_report_reads_it_from_there() -> None:
    """The table's verdict column is for a reader of the table: blanking it changes nothing the
    section or the figure says."""
    from dataclasses import replace

    from pipeline.analysis import figures
    from pipeline.analysis.decisions import Decision

    base = _window({0: 0.05, 1: 0.05, 2: 0.05, 3: 0.05}, 1)
    spec = _window({0: 0.025, 1: 0.025, 2: 0.06, 3: 0.025}, 2)
    stretches = timeline.compare_stretches(_frame(), {"b": base, "s": spec}, StatsOptions(resamples=1000))
    assert stretches.column == "bucket" and all(isinstance(d, Decision) for d in stretches.decisions.values())
    assert [stretches.decision(r).label for r in stretches.table.itertuples(index=False)] == [
        "helps",
        "helps",
        "hurts",
        "helps",
    ]
    blank = replace(stretches, table=stretches.table.assign(verdict=""))
    assert timeline.stretch_lines(blank) == timeline.stretch_lines(stretches)
    assert "it was helps" in "\n".join(timeline.stretch_lines(blank))

    def hovers(found: GroupComparisons) -> list[str]:
        chart = figures.trace_timeline(found)
        assert chart is not None
        return [p.hover for s in chart.series for p in s.points]

    assert hovers(blank) == hovers(stretches) and any(h.endswith(": hurts") for h in hovers(blank))


def _fail(window: Sample, prompts: np.ndarray) -> Sample:
    """The window with these prompts failed, each still with its scheduled send time."""
    import dataclasses

    kept = window.with_index(np.setdiff1d(window.index, prompts))
    return dataclasses.replace(
        kept,
        failed=len(prompts),
        failed_index=np.asarray(prompts, dtype=int),
        failed_scheduled=window.scheduled[np.isin(window.index, prompts)],
        failed_category=np.full(len(prompts), "chat", dtype=object),
    )


def test_failures_count_alike_on_both_servers_and_the_stretch_edges_are_the_schedules() -> None:
    same = {0: 0.05, 1: 0.05, 2: 0.05, 3: 0.05}
    base, spec = _window(same, 1), _window(same, 2)  # truth: 1x everywhere
    failing = np.arange(12, 22)  # 10 of the 12 prompts of the second stretch (30-60 s)
    opts = StatsOptions(resamples=1000)

    def verdicts(b: Sample, s: Sample) -> dict[str, str]:
        table = timeline.compare_stretches(_frame(), {"b": b, "s": s}, opts).table
        return dict(zip(table["bucket"], table["verdict"], strict=True))

    # The stretches are the schedule's, whoever failed: four, at the same edges.
    spec_failed, base_failed = verdicts(base, _fail(spec, failing)), verdicts(_fail(base, failing), spec)
    assert list(spec_failed) == list(base_failed) == ["0-29 s", "29-59 s", "59-88 s", "88-118 s"]
    # A failed request is slower than any answer on either side: speculation's failures count
    # against it as the baseline's count for it.
    assert spec_failed["29-59 s"] == "hurts" and base_failed["29-59 s"] == "helps"
    assert [v for k, v in spec_failed.items() if k != "29-59 s"] == ["inconclusive"] * 3
