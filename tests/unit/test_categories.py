"""Verdicts per request type on synthetic windows with a known answer."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.analysis import categories
from pipeline.analysis.samples import Sample, StatsOptions


def _window(tpot: dict[str, float], n: int, seed: int) -> Sample:
    """n requests per category, each with its category's TPOT times a little noise."""
    rng = np.random.default_rng(seed)
    names = sorted(tpot)
    cat = np.array([names[i % len(names)] for i in range(n * len(names))], dtype=object)
    values = np.array([tpot[c] for c in cat]) * rng.lognormal(0, 0.05, len(cat))
    tokens = np.full(len(cat), 33.0)
    return Sample(
        index=np.arange(len(cat)),
        values={"tpot": values, "ttft": values * 5, "e2el": values * 40},
        itl=tuple(np.full(16, v) for v in values),
        output_tokens=tokens,
        chunks=np.full(len(cat), 17.0),
        duration_s=20.0,
        scheduled=np.linspace(0, 10, len(cat)),
        category=cat,
    )


def _frame() -> pd.DataFrame:
    """A baseline point and a speculative one paired with it."""
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
            },
        ]
    )


def test_a_category_that_gains_beside_one_that_loses_is_told_apart_and_routed() -> None:
    frame = _frame()
    base = _window({"code_edit": 0.090, "chat": 0.090}, 40, 1)
    spec = _window({"code_edit": 0.036, "chat": 0.108}, 40, 2)  # truth: 2.5x and 0.83x
    groups = categories.compare_groups(frame, {"b": base, "s": spec}, StatsOptions(resamples=1000))
    table = groups.table
    by = table.set_index("category")
    assert set(by.index) == {"chat", "code_edit"}
    code, chat = by.loc["code_edit"], by.loc["chat"]
    assert code["speedup_median_tpot_low"] < 2.5 < code["speedup_median_tpot_high"] and code["verdict"] == "helps"
    assert chat["speedup_median_tpot_low"] < 1 / 1.2 < chat["speedup_median_tpot_high"] and chat["verdict"] == "hurts"
    text = "\n".join(categories.group_lines(groups))
    assert "## By request type" in text and "route by request type" in text
    assert "speculation on for code_edit 2." in text and "off for chat 0.8" in text
    metrics = categories.run_metrics(table)["s"]
    assert metrics["category.code_edit.speedup_median_tpot_low"] == code["speedup_median_tpot_low"]
    assert "category.chat.acceptance_length" in metrics


def test_one_category_gets_no_section() -> None:
    frame = _frame()
    one = {"b": _window({"code_edit": 0.09}, 30, 1), "s": _window({"code_edit": 0.05}, 30, 2)}
    assert categories.compare_groups(frame, one, StatsOptions(resamples=500)).empty
    assert categories.group_lines(categories.GroupComparisons()) == []


def test_later_turns_are_compared_with_the_first_turns_on_their_own() -> None:
    """Truth: the later turns (half the requests) gain 2x, the first turns nothing; the later
    turns' TTFT is a third of the first turns' on both servers (their history is cached)."""
    import dataclasses

    def turned(sample: Sample, later_tpot: float) -> Sample:
        turn = np.array([1 + (i % 2) for i in range(sample.size)])
        values = dict(sample.values)
        values["tpot"] = np.where(turn > 1, values["tpot"] * later_tpot, values["tpot"])
        values["ttft"] = np.where(turn > 1, values["ttft"] / 3, values["ttft"])
        return dataclasses.replace(sample, values=values, turn=turn)

    base = turned(_window({"chat": 0.09}, 60, 1), 1.0)
    spec = turned(_window({"chat": 0.09}, 60, 2), 0.5)
    groups = categories.compare_groups(
        _frame(), {"b": base, "s": spec}, StatsOptions(resamples=1000), categories.BY_TURN
    )
    table = groups.table
    by = table.set_index("category")
    first, later = by.loc[categories.FIRST_TURN], by.loc[categories.LATER_TURNS]
    assert later["speedup_median_tpot_low"] < 2.0 < later["speedup_median_tpot_high"] and later["verdict"] == "helps"
    assert first["speedup_median_tpot_low"] < 1.0 < first["speedup_median_tpot_high"]
    assert later["spec_median_ttft_ms"] < first["spec_median_ttft_ms"] / 2
    assert "## By conversation turn" in "\n".join(categories.turn_lines(groups))
    assert "turn.later_turns.speedup_median_tpot" in categories.run_metrics(table, categories.BY_TURN.prefix)["s"]
    # No conversation, no section.
    plain = {"b": _window({"chat": 0.09}, 30, 1), "s": _window({"chat": 0.05}, 30, 2)}
    assert categories.compare_groups(_frame(), plain, StatsOptions(resamples=200), categories.BY_TURN).empty


def test_the_task_type_rules_fire_from_the_category_intervals() -> None:
    from pipeline.analysis import advisor

    base = _window({"code_edit": 0.090, "chat": 0.090}, 40, 1)
    spec = _window({"code_edit": 0.036, "chat": 0.108}, 40, 2)  # truth: 2.5x and 0.83x
    groups = categories.compare_groups(_frame(), {"b": base, "s": spec}, StatsOptions(resamples=1000))
    advice = {a.rule: a for a in advisor.by_request_type(groups)}
    assert "turn speculation off for chat requests" in advice["request type: speculation hurts"].advice
    assert "median-TPOT speedup 0.8" in advice["request type: speculation hurts"].evidence
    routed = advice["route by request type"]
    assert "on for code_edit, off for chat" in routed.advice and "on: code_edit 2." in routed.evidence
    # Within the noise, no rule fires.
    even = {
        "b": _window({"code_edit": 0.09, "chat": 0.09}, 40, 1),
        "s": _window({"code_edit": 0.09, "chat": 0.09}, 40, 2),
    }
    assert advisor.by_request_type(categories.compare_groups(_frame(), even, StatsOptions(resamples=1000))) == []


def test_each_group_carries_its_verdict_as_a_decision_and_the_report_reads_it_from_there() -> None:
    """The table's verdict column is for a reader of the table: blanking it changes nothing the
    section or the advice says."""
    from dataclasses import replace

    from pipeline.analysis import advisor
    from pipeline.analysis.decisions import Decision

    base = _window({"code_edit": 0.090, "chat": 0.090}, 40, 1)
    spec = _window({"code_edit": 0.036, "chat": 0.108}, 40, 2)  # truth: 2.5x and 0.83x
    groups = categories.compare_groups(_frame(), {"b": base, "s": spec}, StatsOptions(resamples=1000))
    decided = {name: d for (_, name), d in groups.decisions.items()}
    assert all(isinstance(d, Decision) for d in decided.values())
    assert (decided["code_edit"].label, decided["chat"].label) == ("helps", "hurts")
    assert "text" not in groups.table and "detail" not in groups.table  # they travel in the Decision
    blank = replace(groups, table=groups.table.assign(verdict=""))
    assert categories.group_lines(blank) == categories.group_lines(groups)
    assert f"code_edit {decided['code_edit'].ratio.text} helps" in "\n".join(categories.group_lines(blank))
    assert advisor.by_request_type(blank) == advisor.by_request_type(groups) != []


def test_a_failed_request_stays_in_its_category_on_both_servers() -> None:
    import dataclasses

    base, spec = _window({"chat": 0.05, "code": 0.05}, 24, 1), _window({"chat": 0.05, "code": 0.05}, 24, 2)
    code = spec.index[spec.category == "code"][:20]  # 20 of speculation's 24 code requests failed
    kept = spec.with_index(np.setdiff1d(spec.index, code))
    # Its log records no category for the failed ones: the prompt's own (the baseline's record) holds.
    failed = dataclasses.replace(kept, failed=len(code), failed_index=code, failed_category=np.empty(0, object))
    table = categories.compare_groups(_frame(), {"b": base, "s": failed}, StatsOptions(resamples=1000)).table
    verdict = dict(zip(table["category"], table["verdict"], strict=True))
    assert verdict["code"] == "hurts" and verdict["chat"] == "inconclusive"
