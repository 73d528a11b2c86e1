"""Losslessness: the same prompts, greedy, one at a time, to a speculative server and to its
baseline. Exact-match rate and the first token where they diverge; at temperature > 0 a
two-sample test on output lengths."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Lossless:
    server: str
    baseline: str
    dtype: str
    compared: int
    exact: int
    first_divergence: tuple[int | None, ...]  # token index per prompt; None where identical

    @property
    def exact_rate(self) -> float:
        return self.exact / self.compared if self.compared else float("nan")

    @property
    def verdict(self) -> str:
        if not self.compared:
            return "not compared"
        if self.exact == self.compared:
            return "identical"
        if self.dtype == "float32":
            return "CORRECTNESS FAILURE: outputs differ in float32"
        return f"differs in {self.dtype}: numerics alone can cause this (batch shape, kernels; compare in float32 for a strict check)"


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_outputs(server: str, baseline: str, dtype: str, spec: Sequence[dict], base: Sequence[dict]) -> Lossless:
    """``spec``/``base``: probe outputs ({index, token_ids, error}) of the two servers."""
    by_index = {o["index"]: o for o in base if not o.get("error")}
    pairs = [(o, by_index[o["index"]]) for o in spec if not o.get("error") and o["index"] in by_index]
    divergence = tuple(first_divergence(s["token_ids"], b["token_ids"]) for s, b in pairs)
    return Lossless(server, baseline, dtype, len(pairs), sum(d is None for d in divergence), divergence)


def length_test(spec_lengths: Sequence[float], base_lengths: Sequence[float]) -> tuple[float, float] | None:
    """Kolmogorov-Smirnov two-sample test on output lengths: (statistic, p-value)."""
    if len(spec_lengths) < 2 or len(base_lengths) < 2:
        return None
    from scipy.stats import ks_2samp

    result = ks_2samp(spec_lengths, base_lengths)
    return float(result.statistic), float(result.pvalue)
