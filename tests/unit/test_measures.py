"""The metric declarations (pipeline/measures.py) against the page that lists them, the peer's
source their vLLM names come from, and the modules that read them."""

from __future__ import annotations

import re
from pathlib import Path

import vllm

from pipeline.analysis import regression, stats
from pipeline.load.metrics import compare_summaries
from pipeline.measures import COMPARISONS, MEASURES, Better, Measure

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
BEGIN, END = "<!-- measures: begin -->", "<!-- measures: end -->"


def _cell(value: str | None) -> str:
    return f"`{value}`" if value else "—"


def _row(m: Measure) -> str:
    better = {Better.LOWER: "lower", Better.HIGHER: "higher", None: "—"}[m.better]
    ratio = f"`{m.ratio}` = {m.ratio_formula}" if m.ratio else "—"
    return f"| `{m.name}` | {m.unit} | {better} | {ratio} | {_cell(m.vllm)} | {_cell(m.aiperf)} | {_cell(m.guidellm)} |"


def expected_table() -> str:
    head = (
        "| metric | unit | better | its ratio against the baseline (> 1: speculation is better) "
        "| `vllm bench serve` | AIPerf | GuideLLM |\n|---|---|---|---|---|---|---|"
    )
    return "\n".join([head, *(_row(m) for m in MEASURES.values())])


def test_the_page_lists_every_metric_as_declared() -> None:
    text = DOC.read_text()
    found = text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip()
    assert found == expected_table(), "docs/metrics.md's table of names differs from pipeline/measures.py"


def test_every_vllm_name_is_a_key_of_vllm_bench_serves_result() -> None:
    """Read from the installed vLLM's vllm/benchmarks/serve.py: a window key literally, a
    latency statistic as its template (mean/median/std/p<N> _ <metric> _ms) with the metric named."""
    source = (Path(vllm.__file__).parent / "benchmarks" / "serve.py").read_text()
    for m in MEASURES.values():
        if m.vllm is None:
            continue
        latency = re.fullmatch(r"(mean|median|std|p\d+)_(ttft|tpot|itl|e2el)_ms", m.vllm)
        if latency:
            stat, field = latency.groups()
            template = 'f"p{p_word}_{metric_attribute_name}_ms"' if stat.startswith("p") else stat
            assert f'"{field}"' in source and (template in source or f"{stat}_{{metric_attribute_name}}_ms" in source)
        else:
            assert f'"{m.vllm}"' in source, m.vllm


def test_the_ratios_the_table_the_intervals_and_the_gate_form_are_the_declared_ones() -> None:
    assert set(stats.RATIOS) == set(COMPARISONS) == {m.ratio for m in MEASURES.values() if m.ratio}
    assert set(compare_summaries({}, {}).ratios) == set(COMPARISONS)
    for gated in regression.GATED:
        assert gated.column in MEASURES and (not gated.ratio or COMPARISONS[gated.ratio].name == gated.column)
    # Each ratio's direction: a latency's is baseline / speculative, a throughput's the other way.
    ratios = compare_summaries(
        {"median_tpot_ms": 40.0, "output_throughput": 10.0}, {"median_tpot_ms": 20.0, "output_throughput": 30.0}
    )
    assert ratios["speedup_median_tpot"] == 2.0 and ratios["output_throughput_ratio"] == 3.0
