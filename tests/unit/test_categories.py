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
    return Sample(index=np.arange(len(cat)), values={"tpot": values, "ttft": values * 5, "e2el": values * 40},
                  itl=tuple(np.full(16, v) for v in values), output_tokens=tokens, chunks=np.full(len(cat), 17.0),
                  duration_s=20.0, scheduled=np.linspace(0, 10, len(cat)), category=cat)  # fmt: skip


def _frame() -> pd.DataFrame:
    """A baseline point and a speculative one paired with it."""
    return pd.DataFrame([
        {"role": "baseline", "status": "finished", "run_id": "b", "point_hash": "pb", "point_key": "kb",
         "engine": "vllm", "method": "none", "k": 0, "request_rate": 1.0, "point": "baseline-r1"},
        {"role": "speculative", "status": "finished", "run_id": "s", "point_hash": "ps", "point_key": "ks",
         "baseline_hash": "pb", "engine": "vllm", "method": "ngram", "k": 3, "request_rate": 1.0,
         "point": "ngram-k3-r1"},
    ])  # fmt: skip


def test_a_category_that_gains_beside_one_that_loses_is_told_apart_and_routed() -> None:
    frame = _frame()
    base = _window({"code_edit": 0.090, "chat": 0.090}, 40, 1)
    spec = _window({"code_edit": 0.036, "chat": 0.108}, 40, 2)  # truth: 2.5x and 0.83x
    table = categories.compare(frame, {"b": base, "s": spec}, StatsOptions(resamples=1000))
    by = table.set_index("category")
    assert set(by.index) == {"chat", "code_edit"}
    code, chat = by.loc["code_edit"], by.loc["chat"]
    assert code["speedup_median_tpot_low"] < 2.5 < code["speedup_median_tpot_high"] and code["verdict"] == "helps"
    assert chat["speedup_median_tpot_low"] < 1 / 1.2 < chat["speedup_median_tpot_high"] and chat["verdict"] == "hurts"
    text = "\n".join(categories.lines(table))
    assert "## By request type" in text and "route by request type" in text
    assert "speculation on for code_edit 2." in text and "off for chat 0.8" in text
    metrics = categories.run_metrics(table)["s"]
    assert metrics["category.code_edit.speedup_median_tpot_low"] == code["speedup_median_tpot_low"]
    assert "category.chat.acceptance_length" in metrics


def test_one_category_gets_no_section() -> None:
    frame = _frame()
    one = {"b": _window({"code_edit": 0.09}, 30, 1), "s": _window({"code_edit": 0.05}, 30, 2)}
    assert categories.compare(frame, one, StatsOptions(resamples=500)).empty
    assert categories.lines(pd.DataFrame()) == []
