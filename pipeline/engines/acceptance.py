"""Acceptance from a server's Prometheus ``/metrics``: counter differences over a window.

Pure functions over parsed scrapes; fetching the text is the caller's job. Definitions
follow ``vllm bench serve`` (docs/metrics.md):

- acceptance rate = accepted / draft tokens
- acceptance length = 1 + accepted / drafts (the bonus token included)
- per-position rate i = accepted_at_position[i] / drafts (unconditional)

Older (V0) servers expose gauges instead of per-draft counters; those are read as they are,
since a gauge cannot be differenced.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

V1_DRAFTS = "vllm:spec_decode_num_drafts_total"
V1_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
V1_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
V1_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
V0_RATE = "vllm:spec_decode_draft_acceptance_rate"
V0_EFFICIENCY = "vllm:spec_decode_efficiency"
V0_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
V0_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
V0_EMITTED = "vllm:spec_decode_num_emitted_tokens_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"


class MetricsFormatError(ValueError):
    pass


@dataclass(frozen=True)
class Scrape:
    """Sample values of one scrape. Counters are summed over every label but ``position``
    (a window's totals over engines and models); gauges are averaged over their label sets,
    since two engines' acceptance rates added make no rate."""

    values: dict[str, float] = field(default_factory=dict)
    per_position: dict[str, dict[int, float]] = field(default_factory=dict)
    # From vLLM's vllm:cache_config_info labels: the KV cache's size in tokens (summed over
    # engines) and the concurrency it allows at the model's full context (their mean).
    kv_capacity: dict[str, float] = field(default_factory=dict)

    def get(self, name: str) -> float | None:
        return self.values.get(name)


KV_CAPACITY = ("kv_cache_size_tokens", "kv_cache_max_concurrency")


def _kv_capacity_from_labels(label_sets: Sequence[dict[str, str]]) -> dict[str, float]:
    """An info gauge carries its figures as labels (strings); a missing or "None" one is left out."""
    found: dict[str, list[float]] = {name: [] for name in KV_CAPACITY}
    for labels in label_sets:
        for name in KV_CAPACITY:
            try:
                found[name].append(float(labels[name]))
            except (KeyError, ValueError):
                continue
    out = {}
    if found["kv_cache_size_tokens"]:
        out["kv_cache_size_tokens"] = sum(found["kv_cache_size_tokens"])
    if found["kv_cache_max_concurrency"]:
        out["kv_cache_max_concurrency"] = sum(found["kv_cache_max_concurrency"]) / len(
            found["kv_cache_max_concurrency"]
        )
    return out


def parse_scrape(text: str) -> Scrape:
    """Parse Prometheus exposition text with prometheus_client's own parser."""
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    gauges: set[str] = set()
    per_position: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    cache_info: list[dict[str, str]] = []
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:  # the parser's error for malformed lines
        raise MetricsFormatError(f"/metrics is not Prometheus text: {exc}") from exc
    for family in families:
        for sample in family.samples:
            totals[sample.name] += sample.value
            counts[sample.name] += 1
            if family.type == "gauge":
                gauges.add(sample.name)
            if "position" in sample.labels:
                per_position[sample.name][int(sample.labels["position"])] += sample.value
            if sample.name.startswith("vllm:cache_config"):  # the _info suffix, as the parser keeps it or not
                cache_info.append(sample.labels)
    values = {name: total / counts[name] if name in gauges else total for name, total in totals.items()}
    return Scrape(
        values=values,
        per_position={k: dict(v) for k, v in per_position.items()},
        kv_capacity=_kv_capacity_from_labels(cache_info),
    )


@dataclass(frozen=True)
class Acceptance:
    source: str  # "vllm-v1-counters", "vllm-v0-gauges", or "none"
    num_drafts: float | None = None
    num_draft_tokens: float | None = None
    num_accepted_tokens: float | None = None
    acceptance_rate: float | None = None  # a fraction in [0, 1]
    acceptance_length: float | None = None
    per_position: tuple[float, ...] = ()
    efficiency: float | None = None  # V0 only
    note: str | None = None  # why no figures were computed, where the server exposes them

    @property
    def effective_k(self) -> float | None:
        """Draft tokens per draft: below k where ngram or suffix drafts come up short."""
        if self.num_drafts and self.num_draft_tokens is not None:
            return self.num_draft_tokens / self.num_drafts
        return None

    def as_metrics(self) -> dict[str, float]:
        """Names and units of ``vllm bench serve``'s result JSON (the rate in percent)."""
        out: dict[str, float] = {}
        if self.acceptance_rate is not None:
            out["spec_decode_acceptance_rate"] = 100.0 * self.acceptance_rate
        if self.acceptance_length is not None:
            out["spec_decode_acceptance_length"] = self.acceptance_length
        for key, value in (
            ("spec_decode_num_drafts", self.num_drafts),
            ("spec_decode_draft_tokens", self.num_draft_tokens),
            ("spec_decode_accepted_tokens", self.num_accepted_tokens),
            ("spec_decode_efficiency", self.efficiency),
        ):
            if value is not None:
                out[key] = value
        for i, rate in enumerate(self.per_position):
            out[f"spec_decode_acceptance_rate_pos_{i}"] = rate
        return out


@dataclass(frozen=True)
class WindowAcceptance:
    """A window's acceptance as the sweep records it, whatever engine served it: the length L
    (bonus token included) that every engine's figures are compared on, the tag naming where
    it was read, and the engine's own figures under their own names. :meth:`Engine.window_acceptance`
    returns one, so that nothing past the engines knows how an engine counts."""

    length: float | None  # L over the window; None where the engine gave none
    source: str  # the acceptance.source tag, e.g. "vllm-v1-counters"
    metrics: dict[str, float] = field(default_factory=dict)  # the engine's own figures, besides the counters'

    @staticmethod
    def of_counters(counters: Acceptance) -> WindowAcceptance:
        """Where the /metrics counters are the whole story (vLLM, a server that is not ours)."""
        return WindowAcceptance(counters.acceptance_length, counters.source)


RESTARTED = "acceptance not computed: the server restarted during the window ({name} went backwards)"


def _delta(before: Scrape, after: Scrape, name: str) -> float | None:
    a = after.get(name)
    if a is None:
        return None
    return a - (before.get(name) or 0.0)


def _went_backwards(before: Scrape, after: Scrape, names: Sequence[str]) -> str | None:
    """The first counter that decreased: a restarted server counts from zero again."""
    for name in names:
        if (after.get(name) or 0.0) < (before.get(name) or 0.0):
            return name
        for position, value in before.per_position.get(name, {}).items():
            if after.per_position.get(name, {}).get(position, 0.0) < value:
                return f"{name}{{position={position}}}"
    return None


def acceptance_between(before: Scrape, after: Scrape) -> Acceptance:
    drafts = _delta(before, after, V1_DRAFTS)
    if drafts is not None:
        backwards = _went_backwards(before, after, (V1_DRAFTS, V1_DRAFT_TOKENS, V1_ACCEPTED, V1_PER_POS))
        if backwards:
            return Acceptance(source="vllm-v1-counters", note=RESTARTED.format(name=backwards))
        draft_tokens = _delta(before, after, V1_DRAFT_TOKENS)
        accepted = _delta(before, after, V1_ACCEPTED)
        per_pos_after = after.per_position.get(V1_PER_POS, {})
        per_pos_before = before.per_position.get(V1_PER_POS, {})
        per_position: tuple[float, ...] = ()
        if drafts > 0:
            per_position = tuple(
                (per_pos_after[p] - per_pos_before.get(p, 0.0)) / drafts for p in sorted(per_pos_after)
            )
        return Acceptance(
            source="vllm-v1-counters",
            num_drafts=drafts,
            num_draft_tokens=draft_tokens,
            num_accepted_tokens=accepted,
            acceptance_rate=accepted / draft_tokens if accepted is not None and draft_tokens else None,
            acceptance_length=1.0 + accepted / drafts if accepted is not None and drafts > 0 else None,
            per_position=per_position,
        )
    rate = after.get(V0_RATE)
    if rate is not None:
        backwards = _went_backwards(before, after, (V0_ACCEPTED, V0_DRAFT_TOKENS, V0_EMITTED))
        if backwards:
            return Acceptance(source="vllm-v0-gauges", note=RESTARTED.format(name=backwards))
        return Acceptance(
            source="vllm-v0-gauges",
            num_draft_tokens=_delta(before, after, V0_DRAFT_TOKENS),
            num_accepted_tokens=_delta(before, after, V0_ACCEPTED),
            acceptance_rate=rate,
            efficiency=after.get(V0_EFFICIENCY),
        )
    return Acceptance(source="none")


@dataclass(frozen=True)
class PrefixCacheWindow:
    queries: float | None
    hits: float | None

    def as_metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.queries is not None:
            out["prefix_cache_queries"] = self.queries
        if self.hits is not None:
            out["prefix_cache_hits"] = self.hits
        if self.queries and self.hits is not None:
            out["prefix_cache_hit_rate"] = self.hits / self.queries
        return out


def prefix_cache_between(before: Scrape, after: Scrape) -> PrefixCacheWindow:
    if _went_backwards(before, after, (PREFIX_QUERIES, PREFIX_HITS)):
        return PrefixCacheWindow(queries=None, hits=None)  # a restart: no figure beats a wrong one
    return PrefixCacheWindow(queries=_delta(before, after, PREFIX_QUERIES), hits=_delta(before, after, PREFIX_HITS))


# ---- SGLang, and acceptance on one scale for every engine ------------------------------


def expected_length(alpha: float, k: float) -> float:
    """L = (1 - alpha^(k+1)) / (1 - alpha): tokens per step with k drafts accepted i.i.d.

    ``k`` may be fractional: the mean draft length where drafts come up short."""
    if alpha >= 1.0 - 1e-12:
        return k + 1.0  # the limit; the closed form loses all precision here
    return (1.0 - alpha ** (k + 1.0)) / (1.0 - alpha)


def alpha_from_length(length: float, k: float) -> float | None:
    """Invert :func:`expected_length` for alpha in [0, 1] (it increases in alpha).
    None where L is not in [1, k+1]; :func:`normalized` clamps noise above k+1."""
    if k <= 0 or not 1.0 <= length <= k + 1:
        return None
    if length == k + 1:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(60):  # bisection to ~1e-18: far below any measured difference
        mid = (low + high) / 2
        if expected_length(mid, k) < length:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def normalized(length: float | None, k: float) -> dict[str, float]:
    """The cross-engine figures: L (bonus token included) and the alpha it implies.

    ``k`` is the effective draft length (draft tokens per draft) where the engine reports
    it, else the configured k. An L above k+1 can only be noise or rounding: alpha is then
    clamped to 1 and ``acceptance_alpha_clamped`` says so, rather than the figure vanishing.
    """
    if length is None:
        return {}
    out = {"acceptance_length": length, "acceptance_k_effective": float(k)}
    if length > k + 1:
        return out | {"acceptance_alpha": 1.0, "acceptance_alpha_clamped": 1.0}
    alpha = alpha_from_length(length, k)
    return out | ({"acceptance_alpha": alpha} if alpha is not None else {})
