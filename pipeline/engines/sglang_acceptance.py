"""SGLang's acceptance: the accept length it reports per request and on /server_info, on the same scale as vLLM's counters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from pipeline.engines.acceptance import Acceptance, Scrape, WindowAcceptance
from pipeline.load.client import RequestRecord

SGLANG_ACCEPT_LENGTH = "sglang:spec_accept_length"
SGLANG_ACCEPT_RATE = "sglang:spec_accept_rate"


@dataclass(frozen=True)
class SglangAcceptance:
    """SGLang's acceptance, each figure labelled for what it covers.

    Only the per-request figures cover exactly the window, from ``meta_info.spec_verify_ct``
    (verification steps), summed over the window's requests. A request's first token comes
    from prefill, not from a verification step, so the length comparable with vLLM's
    (tokens per verification step) is (completion tokens - requests) / verify steps. SGLang's
    own scripts and tests divide all completion tokens by the steps; that figure is kept
    under its own name. The ``sglang:spec_accept_*`` gauges hold recent values, and
    ``/get_server_info``'s ``avg_spec_accept_length`` is cumulative since the server started.
    """

    window_length: float | None = None  # (completion tokens - requests) / verify steps
    native_length: float | None = None  # completion tokens / verify steps, as SGLang's own tests compute it
    verify_steps: float | None = None
    completion_tokens: float | None = None
    requests_counted: int = 0
    gauge_length: float | None = None
    gauge_rate: float | None = None  # SGLang's accepted / proposed drafts, a fraction
    since_start_length: float | None = None

    def as_metrics(self) -> dict[str, float]:
        pairs = (
            ("sglang_window_accept_length", self.window_length),
            ("sglang_native_accept_length", self.native_length),
            ("sglang_spec_verify_steps", self.verify_steps),
            ("sglang_spec_accept_length_gauge", self.gauge_length),
            ("sglang_spec_accept_rate_gauge", None if self.gauge_rate is None else 100.0 * self.gauge_rate),
            ("sglang_avg_spec_accept_length_since_start", self.since_start_length),
        )
        return {k: v for k, v in pairs if v is not None}

    def on_scale(self, counters: Acceptance) -> WindowAcceptance:
        """The window's L from the per-request counts, which cover exactly the window; the
        /metrics counters' source stands only where no request was counted."""
        source = "sglang-per-request" if self.window_length else counters.source
        return WindowAcceptance(self.window_length, source, self.as_metrics())


def server_info_accept_length(info: dict) -> float | None:
    """``avg_spec_accept_length`` from /get_server_info: top level in older SGLang, under
    ``internal_states`` (one entry per data-parallel rank) in newer ones."""
    values = [info.get("avg_spec_accept_length")]
    values += [s.get("avg_spec_accept_length") for s in info.get("internal_states") or [] if isinstance(s, dict)]
    found = [float(v) for v in values if isinstance(v, (int, float))]
    return sum(found) / len(found) if found else None


def sglang_acceptance(
    records: Sequence[RequestRecord], after: Scrape | None, server_info: dict | None
) -> SglangAcceptance:
    counted = [r for r in records if r.ok and r.spec_verify_ct and r.output_tokens]
    steps = float(sum(r.spec_verify_ct or 0 for r in counted))
    tokens = float(sum(r.output_tokens or 0 for r in counted))
    return SglangAcceptance(
        window_length=(tokens - len(counted)) / steps if steps else None,
        native_length=tokens / steps if steps else None,
        verify_steps=steps if counted else None,
        completion_tokens=tokens if counted else None,
        requests_counted=len(counted),
        gauge_length=after.get(SGLANG_ACCEPT_LENGTH) if after else None,
        gauge_rate=after.get(SGLANG_ACCEPT_RATE) if after else None,
        since_start_length=server_info_accept_length(server_info) if server_info else None,
    )


def server_info(base_url: str) -> dict | None:
    """SGLang's /get_server_info (cumulative acceptance since start); None if it has none."""
    try:
        response = httpx.get(base_url + "/get_server_info", timeout=30.0, trust_env=False)
        return response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
