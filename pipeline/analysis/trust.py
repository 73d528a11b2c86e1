"""Can you trust this run? The checks a window passes before its ratios become verdicts.

Each check is declared once, in :data:`CHECKS`: its name (the ``validity.<name>`` metric, 1
passed and 0 failed, absent where it does not apply), what it tests, the word a verdict it
undermines is withheld under, the ratios it undermines, and the fix it names. A window's facts
are computed once from its requests and the server's counters (:func:`window_facts`, when the
window is measured, logged as ``window.*`` metrics); a check is a pure function of those facts
(:func:`judge_window`), run when the window is recorded and again by the report, which withholds the
verdicts a failed check undermines (:func:`withheld`) and lists every check in its "Can you
trust this run?" section (:func:`trust_lines`). Repeats that disagree are judged across the
windows of a point (:func:`repeat_findings`), by the report alone.

The checks follow what speculators' ``throughput_interactivity.py validate`` flags (offered
against achieved rate, steady state, repeats that differ, synchronized waves, prefix-cache hits,
queueing inside the server), with Little's law and the ramp-up as the steady-state test.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from pipeline.analysis.samples import Sample
from pipeline.analysis.stats import RATIOS
from pipeline.load.client import RequestRecord

THROUGHPUT = "output_throughput_ratio"
ALL, LATENCY = "all", "latency"  # what a failed check undermines: every ratio, or all but throughput

# Thresholds, each with its reason.
LITTLE_MIN = 0.8  # in flight over the arrivals / lambda * W: 1 - W / (2 T) for a constant W, so T >= 2.5 W
RAMP_MAX = 0.5  # the share of the arrivals before in flight first reaches 90 % of Little's level
STEADY_SPANS = 5.0  # the window the fix asks for: 5 mean latencies (exponential latencies need it)
GROWTH_MIN = 1.1  # in flight over the last quarter of the arrivals / over the third: a queue that grows
SERVED_MIN = 0.6  # tokens streamed over the arrivals' second half / those the offered rate asks
ELASTIC_MAX = 0.5  # the pace's growth against the batch's (log / log): below it, more batch bought little
OVERLOAD_MIN = (8, 2.0)  # requests sent in the arrivals' second half, and seconds they span, to judge it
RATE_TOLERANCE = 0.05  # achieved / offered send rate, or 3 / sqrt(n) where the count is small
LAG_MS = (10.0, 50.0)  # p99 send lateness allowed: a quarter of the mean gap, within these bounds
BURSTY_CV = 2.0  # sends per second's coefficient of variation above this: synchronized waves
BURSTY_MIN_RATE = 1.0  # ... where at least this many requests a second are sent
VALIDITY = "validity."  # the metrics' prefix: validity.<check name>
REPEAT_P = 0.01  # repeats disagree when their windows' noise (and the A/A spread) makes it this unlikely


@dataclass(frozen=True)
class Check:
    name: str  # the metric validity.<name>
    title: str  # what it tests, as the report's line says it
    label: str  # the word a withheld verdict carries
    undermines: str  # ALL or LATENCY: the ratios withheld when it fails (undermined())
    fix: str

    def undermined(self) -> tuple[str, ...]:
        return tuple(m for m in RATIOS if self.undermines == ALL or m != THROUGHPUT)


CHECKS: tuple[Check, ...] = (
    Check(
        "offered_rate",
        "offered against achieved rate",
        "rate not delivered",
        ALL,
        "the window did not send the rate it was asked for: a concurrency cap (load.max_concurrency) or a client "
        "that fell behind held it back; remove the cap for an open-loop rate, or add client processes "
        "(load.client_workers)",
    ),
    Check(
        "steady_state",
        "steady state",
        "not steady",
        ALL,
        "the window is too short for its latency: it ends before the rate's steady state; lengthen it "
        "(load.min_duration_s or load.num_requests) to the duration the line names",
    ),
    Check(
        "overload",
        "the server keeps up with the offered rate",
        "overloaded",
        LATENCY,
        "a finding, not a fault: the server cannot serve this rate, and its queue grows for as long as the window "
        "lasts, so a latency ratio there measures the window's length; the throughput ratio stands (a capacity "
        "comparison). For latency, measure lower rates (search=capacity finds the highest one under an SLO)",
    ),
    Check(
        "client_lag",
        "the load generator kept its schedule",
        "client lagged",
        LATENCY,
        "the client sent requests late (its process was short of CPU): add client processes "
        "(load.client_workers=2 or more), or run the client where it has a core of its own",
    ),
    Check(
        "other_traffic",
        "no other traffic on the server",
        "shared with other traffic",
        LATENCY,
        "the server's counters finished requests this window did not send: other clients, or other replicas "
        "behind a load balancer, shared it; measure when the server serves nothing else, or point the URL at "
        "one replica of its own",
    ),
    Check(
        "prefix_cache",
        "prefix-cache hits as the policy says",
        "prefix cache not as declared",
        ALL,
        "the prefix cache served more than engine.prefix_cache allows (off: nothing; cold: only what the "
        "window's own prompts share): the cache was not emptied (a reset that was skipped, e.g. with "
        "engine.allow_remote=true) or another client warmed it; rerun with the cache in the declared state",
    ),
    Check(
        "failed",
        "no failed or cut-short request",
        "failed requests",
        ALL,
        "some requests failed or were cut short (see requests.csv's error column, and output_tokens against "
        "the lengths asked for): lower the load, raise load.request_timeout_s, or fix what the errors name",
    ),
    Check(
        "synchronized",
        "no synchronized arrivals",
        "synchronized arrivals",
        ALL,
        "closed-loop requests of one length finish together and are sent again together, in waves that "
        "overstate throughput: vary the output lengths (a dataset's own, or workload.ignore_eos=false)",
    ),
    Check(
        "repeats",
        "repeats agree",
        "repeats disagree",
        ALL,
        "the repeats of this point differ by more than two servers of one setup do (the A/A spread): something "
        "changed between them (other work on the machine, a throttled CPU); rerun on a quiet machine",
    ),
)
BY_NAME = {check.name: check for check in CHECKS}


@dataclass(frozen=True)
class CheckResult:
    check: Check
    ok: bool
    text: str  # the evidence: what was measured against what was allowed

    @property
    def metric(self) -> float:
        return 1.0 if self.ok else 0.0


# ---- A window's facts, from its requests ---------------------------------------------------


@dataclass(frozen=True)
class WindowShape:
    """How a window was sent: what the facts need to know of its load besides the requests."""

    offered_rate: float  # load.request_rate (inf: all at once)
    capped: bool  # load.max_concurrency set
    conversations: bool  # a trace's later turns wait for answers
    duration_s: float  # the window's start to its last answer


def never_sent(record: RequestRecord) -> bool:
    """A request that did not reach the server: a failed predecessor kept it back, or the window
    stopped first (loadgen's records of these say so)."""
    return (record.error or "").startswith(("not sent", "not finished"))


def _sent(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if not never_sent(r)]


def _occupancy(sent: np.ndarray, end: np.ndarray, start: float, stop: float) -> float:
    """Mean requests in flight over [start, stop]: each request's overlap with it, summed."""
    if stop <= start:
        return math.nan
    overlap = np.clip(np.minimum(end, stop) - np.maximum(sent, start), 0.0, None)
    return float(overlap.sum() / (stop - start))


def _ramp_share(sent: np.ndarray, end: np.ndarray, level: float) -> float:
    """The share of the arrival span before the requests in flight first reach 90 % of
    ``level`` (Little's law's), measured at each send; 1 where they never do."""
    start, stop = float(sent.min()), float(sent.max())
    target = max(1.0, 0.9 * level)
    for t in np.sort(sent):
        if np.sum(sent <= t) - np.sum(end <= t) >= target:
            return (float(t) - start) / (stop - start)
    return 1.0


def _burstiness(times: np.ndarray) -> float:
    """Coefficient of variation of sends per 1 s bin over the sends' span (speculators' rule)."""
    span = float(times.max() - times.min()) if len(times) else 0.0
    bins = int(span)
    if bins < 2:
        return math.nan
    counts = np.bincount(np.minimum((times - times.min()).astype(int), bins - 1), minlength=bins)
    return float(counts.std() / counts.mean()) if counts.mean() > 0 else math.nan


def _tokens_per_s(records: Sequence[RequestRecord], start: float, stop: float) -> float:
    """Output tokens the server streamed per second within [start, stop]: each request's
    tokens spread over its token-bearing chunks (one chunk may carry several under speculation)."""
    if stop <= start:
        return math.nan
    total = 0.0
    for r in records:
        if r.chunk_s and r.output_tokens:
            times = np.asarray(r.chunk_s)
            total += r.output_tokens / len(times) * float(np.sum((times >= start) & (times < stop)))
    return total / (stop - start)


def window_facts(records: Sequence[RequestRecord], shape: WindowShape) -> dict[str, float]:
    """What the checks read of a window's requests, as ``window.*`` metrics. Occupancy, Little's
    law and the server's pace are taken over the arrival span (first to last send), successful
    requests only (a failure's end is not known)."""
    facts = {
        "window.finite_rate": float(math.isfinite(shape.offered_rate)),
        "window.capped": float(shape.capped),
        "window.conversations": float(shape.conversations),
        "window.sent": float(len(_sent(records))),
    }
    ok = [r for r in records if r.ok and r.chunk_s]
    if len(ok) < 3:
        return facts
    sent = np.array([r.sent_s for r in ok])
    end = np.array([r.end_s for r in ok])
    start, stop = float(sent.min()), float(sent.max())
    latency = float(np.mean(end - sent))
    facts |= {"window.latency_mean_s": latency, "window.arrival_span_s": stop - start}
    if stop <= start:
        return facts
    span = stop - start
    rate = (len(ok) - 1) / span
    level = rate * latency
    # The arrivals' third and last quarters: past the start, where a ramp-up and an overload
    # still differ (a ramp's pace grows with its batch; an overload's has stopped growing).
    third, last = (start + 0.5 * span, start + 0.75 * span), (start + 0.75 * span, stop)
    demand = rate * float(np.mean([r.output_tokens or 0 for r in ok]))
    pace = _tokens_per_s(ok, *third)
    facts |= {
        "window.in_flight_mean": _occupancy(sent, end, start, stop),
        "window.in_flight_little": level,
        "window.ramp_up_share": _ramp_share(sent, end, level),
        "window.in_flight_growth": _occupancy(sent, end, *last) / max(_occupancy(sent, end, *third), 1e-9),
        "window.served_share": _tokens_per_s(ok, third[0], stop) / demand if demand > 0 else math.nan,
        "window.served_growth": _tokens_per_s(ok, *last) / pace if pace > 0 else math.nan,
        "window.second_half_sent": float(np.sum(sent >= third[0])),
        "window.send_burstiness": _burstiness(np.array([r.sent_s for r in _sent(records)])),
    }
    facts["window.littles_ratio"] = facts["window.in_flight_mean"] / level if level > 0 else math.nan
    return facts


def truncated(records: Sequence[RequestRecord], asked: Mapping[int, tuple[int | None, int | None]]) -> int:
    """Requests the server cut short: fewer output tokens than a stated length asked for (with
    ignore_eos, so no EOS ends it early), or a prompt not counted at its stated input_length.
    ``asked``: request index -> (its stated output length where the server must keep to it,
    its stated input length)."""
    cut = 0
    for r in records:
        output, prompt = asked.get(r.index, (None, None))
        if not r.ok:
            continue
        if output is not None and r.output_tokens is not None and r.output_tokens < output:
            cut += 1
        elif prompt is not None and r.prompt_tokens is not None and r.prompt_tokens != prompt:
            cut += 1
    return cut


def shared_prefix_tokens(prompts: Sequence[Sequence[int]]) -> list[int]:
    """Per prompt (token ids, as the server sees them), its longest prefix that an earlier prompt
    of the window shares: the most a prefix cache emptied before the window can serve it."""
    trie: dict = {}
    out = []
    for ids in prompts:
        node, depth = trie, 0
        for token in ids:
            if token not in node:
                break
            node, depth = node[token], depth + 1
        out.append(depth)
        node = trie
        for token in ids:
            node = node.setdefault(token, {})
    return out


# ---- The checks ----------------------------------------------------------------------------


def _num(facts: Mapping[str, object], key: str) -> float:
    value = facts.get(key)
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan
    return number


def _finding(name: str, ok: bool, text: str) -> CheckResult:
    return CheckResult(BY_NAME[name], ok, text)


def _offered_rate(facts: Mapping[str, object]) -> CheckResult | None:
    offered, achieved, sent = (_num(facts, k) for k in ("target_request_rate", "achieved_request_rate", "window.sent"))
    if _num(facts, "window.finite_rate") != 1 or _num(facts, "window.conversations") == 1 or not offered > 0:
        return None
    if not (math.isfinite(achieved) and sent >= 2):
        return None
    tolerance = max(RATE_TOLERANCE, 3 / math.sqrt(sent))
    share = achieved / offered
    ok = abs(share - 1) <= tolerance
    return _finding(
        "offered_rate",
        ok,
        f"sent {achieved:.3g} req/s of the {offered:g} offered ({share:.2f}; ±{tolerance:.2f} passes)",
    )


def _client_lag(facts: Mapping[str, object]) -> CheckResult | None:
    lateness = _num(facts, "send_lateness_p99_ms")
    if not math.isfinite(lateness):
        return None
    offered = _num(facts, "target_request_rate")
    gap_ms = 1000.0 / offered if offered > 0 and math.isfinite(offered) else math.inf
    limit = min(LAG_MS[1], max(LAG_MS[0], 0.25 * gap_ms))
    return _finding("client_lag", lateness <= limit, f"p99 send lateness {lateness:.1f} ms (at most {limit:.0f} ms)")


def _overload(facts: Mapping[str, object]) -> CheckResult | None:
    """Overloaded: over the second half of the arrivals the server streamed well under what the
    offered load asks (arrival rate x mean output length), and while the requests in flight kept
    growing from the third quarter its pace did not grow with them (a larger batch bought no more
    throughput: it is saturated). A window still in its ramp-up, whose pace grows with its batch,
    or that streamed nothing yet with an empty server queue, cannot tell: steady_state says so."""
    if _num(facts, "window.finite_rate") != 1 or _num(facts, "window.capped") == 1:
        return None
    keys = ("window.served_share", "window.in_flight_growth", "window.served_growth")
    served, growth, pace = (_num(facts, k) for k in keys)
    if not math.isfinite(pace) and served < SERVED_MIN and _num(facts, "window.server_waiting_mean") > 0:
        # Nothing streamed over the third quarter (no pace to grow from) while requests waited in
        # the server's own queue: not a ramp still finding its pace but a server that took no more
        # work as its batch grew, so its pace counts as flat.
        pace = 1.0
    if not (math.isfinite(served) and math.isfinite(growth) and math.isfinite(pace)):
        return None
    if not (
        _num(facts, "window.second_half_sent") >= OVERLOAD_MIN[0]
        and _num(facts, "window.arrival_span_s") >= OVERLOAD_MIN[1]
    ):
        return None  # too few requests, or too short a span, to tell a pace from its noise
    elastic = math.log(max(pace, 1e-9)) / math.log(growth) if growth > 1 else math.inf
    over = served < SERVED_MIN and growth > GROWTH_MIN and elastic < ELASTIC_MAX
    text = (
        f"streamed {100 * served:.0f} % of the tokens the offered {_num(facts, 'target_request_rate'):g} req/s ask "
        f"(under {100 * SERVED_MIN:.0f} % and saturated is overloaded); in flight grew {growth:.2f}x from the third "
        f"to the last quarter of the arrivals, its pace {pace:.2f}x"
    )
    queue = _num(facts, "window.server_waiting_mean")
    if math.isfinite(queue):
        text += f"; {queue:.1f} requests waited in the server's own queue on average"
    return _finding("overload", not over, text)


def _steady_state(facts: Mapping[str, object]) -> CheckResult | None:
    if _num(facts, "window.finite_rate") != 1 or _num(facts, "window.capped") == 1:
        return None  # a saturation test: it has no steady state to reach
    little, ramp = _num(facts, "window.littles_ratio"), _num(facts, "window.ramp_up_share")
    latency, span = _num(facts, "window.latency_mean_s"), _num(facts, "window.arrival_span_s")
    if not (math.isfinite(little) and math.isfinite(ramp)):
        return None
    ok = little >= LITTLE_MIN and ramp <= RAMP_MAX
    text = (
        f"in flight {_num(facts, 'window.in_flight_mean'):.2f} against Little's law's "
        f"{_num(facts, 'window.in_flight_little'):.2f} ({100 * little:.0f} %, at least {100 * LITTLE_MIN:.0f} % "
        f"passes); ramp-up {100 * ramp:.0f} % of the arrivals (at most {100 * RAMP_MAX:.0f} %)"
    )
    if not ok:
        text += (
            f"; its arrivals span {span:.1f} s against a mean latency of {latency:.1f} s: a window of "
            f"load.min_duration_s={math.ceil(STEADY_SPANS * latency)} reaches steady state"
        )
    return _finding("steady_state", ok, text)


def _other_traffic(facts: Mapping[str, object]) -> CheckResult | None:
    other = _num(facts, "window.other_requests")
    if not math.isfinite(other):
        return None
    return _finding(
        "other_traffic",
        other <= 0,
        f"the server finished {other:g} request(s) beyond the window's own" if other > 0 else "none seen",
    )


def _prefix_cache(facts: Mapping[str, object], policy: str) -> CheckResult | None:
    hits = _num(facts, "prefix_cache_hits")
    if not math.isfinite(hits):
        return None
    declared = policy.split(",")[0].strip()  # "cold, not emptied first (...)": cold was asked for
    if declared == "off":
        return _finding("prefix_cache", hits <= 0, f"{hits:g} prompt tokens served from the cache (off: none)")
    shareable = _num(facts, "window.prefix_shareable_tokens")
    if declared != "cold" or not math.isfinite(shareable):
        return None
    return _finding(
        "prefix_cache",
        hits <= shareable,
        f"{hits:g} prompt tokens served from the cache; the window's prompts share at most {shareable:g} "
        f"(cold: no more)",
    )


def _failed(facts: Mapping[str, object]) -> CheckResult | None:
    failed, cut = _num(facts, "failed"), _num(facts, "window.truncated")
    if not math.isfinite(failed):
        return None
    cut = cut if math.isfinite(cut) else 0.0
    total = _num(facts, "window.sent")
    of = f" of {total:g}" if math.isfinite(total) else ""
    return _finding("failed", failed + cut == 0, f"{failed:g} failed and {cut:g} cut short{of}")


def _synchronized(facts: Mapping[str, object]) -> CheckResult | None:
    if _num(facts, "window.capped") != 1:
        return None  # an open loop sends on its own schedule; a burst there is the schedule's
    cv, rate = _num(facts, "window.send_burstiness"), _num(facts, "achieved_request_rate")
    if not math.isfinite(cv):
        return None
    waves = cv > BURSTY_CV and rate >= BURSTY_MIN_RATE
    return _finding("synchronized", not waves, f"sends per second vary by {cv:.2f}x their mean (at most {BURSTY_CV:g})")


def judge_window(facts: Mapping[str, object], policy: str = "cold") -> dict[str, CheckResult]:
    """Every window check that applies to these facts (a window's metrics, or a report row),
    by name. ``policy``: the window's engine.prefix_cache. An overload is a window that did not
    reach steady state for want of capacity, not of time: it is looked for only in a window
    whose steady state failed, and then stands in its place (there is no steady state to reach)."""
    steady = _steady_state(facts)
    overload = _overload(facts) if steady is not None and not steady.ok else None
    if steady is not None and steady.ok and _num(facts, "window.capped") != 1:
        overload = _finding("overload", True, "steady: the window kept up with its rate")
    found = {
        "offered_rate": _offered_rate(facts),
        "steady_state": None if overload is not None and not overload.ok else steady,
        "overload": overload,
        "client_lag": _client_lag(facts),
        "other_traffic": _other_traffic(facts),
        "prefix_cache": _prefix_cache(facts, policy),
        "failed": _failed(facts),
        "synchronized": _synchronized(facts),
    }
    return {name: finding for name, finding in found.items() if finding is not None}


def validity_metrics(found: Mapping[str, CheckResult]) -> dict[str, float]:
    """``validity.<name>``: 1 where the check passed, 0 where it failed."""
    return {f"{VALIDITY}{name}": finding.metric for name, finding in found.items()}


def failed_checks(metrics: Mapping[str, float]) -> list[str]:
    """The names of the checks a window failed, read back from its metrics (:func:`validity_metrics`)."""
    return [k.removeprefix(VALIDITY) for k, v in metrics.items() if k.startswith(VALIDITY) and not v]


# ---- Across a point's windows, for the report ----------------------------------------------


def _log_median(sample: Sample | None) -> tuple[float, float] | None:
    """A window's log median TPOT and its variance (the median's asymptotic standard error,
    1.2533 sd / sqrt(n), on the log scale), or None with fewer than 3 values."""
    if sample is None:
        return None
    values = sample.values.get("tpot", np.empty(0))
    values = values[np.isfinite(values) & (values > 0)]
    if len(values) < 3:
        return None
    logs = np.log(values)
    return float(np.median(logs)), float((1.2533 * logs.std(ddof=1)) ** 2 / len(logs))


def _disagree(windows: Sequence[tuple[float, float]], spread_sd: float | None) -> tuple[float, float]:
    """Cochran's Q over repeats' log medians, each with its own noise plus half the A/A
    variance between fresh servers (a ratio's spread is two windows'): (spread, p-value)."""
    extra = (spread_sd**2) / 2 if spread_sd else 0.0
    x = np.array([m for m, _ in windows])
    w = 1.0 / (np.array([v for _, v in windows]) + extra)
    mean = float(np.sum(w * x) / np.sum(w))
    q = float(np.sum(w * (x - mean) ** 2))
    return float(x.max() - x.min()), float(scipy_stats.chi2.sf(q, len(x) - 1))


def repeat_findings(
    frame: pd.DataFrame, samples: Mapping[str, Sample], spread_sd: float | None
) -> dict[str, CheckResult]:
    """Per point measured more than once: do its repeats' median TPOT agree, server by server,
    within their windows' own noise plus the A/A spread between fresh servers (where measured)?
    Repeats draw new prompts, so they may differ by sampling alone; a disagreement is one the
    noise makes unlikely (Cochran's Q, p < :data:`REPEAT_P`). Keyed by the speculative point's
    key: a baseline's repeats are judged with each point compared against them."""
    if "repeat" not in frame or "point_key" not in frame:
        return {}
    done = frame[frame["status"].isin(["finished", "resumed"])]
    judged: dict[str, tuple[float, float, str]] = {}
    for key, group in done.groupby("point_key"):
        windows = [w for run in group["run_id"] if (w := _log_median(samples.get(str(run)))) is not None]
        if len(windows) >= 2:
            judged[str(key)] = (*_disagree(windows, spread_sd), str(group.iloc[0]["point"]))
    out = {}
    keys_by_hash = dict(zip(done["point_hash"], done["point_key"].astype(str), strict=True))
    for key, group in done[done["role"] == "speculative"].groupby("point_key"):
        keys = [str(key), *{keys_by_hash[h] for h in group["baseline_hash"] if h in keys_by_hash}]
        found = [judged[k] for k in keys if k in judged]
        if not found:
            continue
        spread, p, name = min(found, key=lambda f: f[1])
        text = (
            f"{name}: repeats' median TPOT differ by {100 * math.expm1(spread):.1f} %, p={p:.2g} against their "
            f"windows' own noise{' and the A/A spread' if spread_sd else ''} (below {REPEAT_P:g} fails)"
        )
        out[str(key)] = CheckResult(BY_NAME["repeats"], p >= REPEAT_P, text)
    return out


def repeat_metrics(frame: pd.DataFrame, repeats: Mapping[str, CheckResult]) -> dict[str, dict[str, float]]:
    """``validity.repeats`` for each speculative run of a point whose repeats were judged."""
    if not repeats or "point_key" not in frame:
        return {}
    spec = frame[frame["role"] == "speculative"]
    return {
        str(run): {"validity.repeats": repeats[str(key)].metric}
        for run, key in zip(spec["run_id"], spec["point_key"], strict=True)
        if str(key) in repeats and isinstance(run, str) and run
    }


def window_findings(frame: pd.DataFrame) -> dict[str, dict[str, CheckResult]]:
    """Every measured window's findings, by run id, judged from its row of the sweep table."""
    done = frame[frame["status"].isin(["finished", "resumed"])] if "status" in frame else frame
    out = {}
    for _, row in done.iterrows():
        facts = row.to_dict()
        out[str(row.get("run_id"))] = judge_window(facts, str(row.get("prefix_cache") or "cold"))
    return out


def withheld(
    frame: pd.DataFrame, found: Mapping[str, Mapping[str, CheckResult]], repeats: Mapping[str, CheckResult]
) -> dict[str, dict[str, str]]:
    """Per speculative point (``point_key``), the ratios a failed check undermines, each with why:
    "not steady (baseline: in flight ...)", every failed check in turn. A check failed on the
    point's own window or its baseline's undermines it."""
    done = frame[frame["status"].isin(["finished", "resumed"])] if "status" in frame else frame
    runs_by_hash = dict(zip(done["point_hash"], done["run_id"].astype(str), strict=True))
    out: dict[str, dict[str, str]] = {}
    for _, row in done[done["role"] == "speculative"].iterrows():
        key = str(row.get("point_key", row.get("point_hash")))
        windows = [("", str(row["run_id"]))]
        if row.get("baseline_hash") in runs_by_hash:
            windows.append(("baseline: ", runs_by_hash[row["baseline_hash"]]))
        failures = [(who, f) for who, run in windows for f in found.get(run, {}).values() if not f.ok]
        if key in repeats and not repeats[key].ok:
            failures.append(("", repeats[key]))
        for who, finding in failures:
            for metric in finding.check.undermined():
                # Every failed check is named, the point's own first: a window both short and
                # shared says both, so neither fix is hidden behind the other.
                text = f"{finding.check.label} ({who}{finding.text})"
                reasons = out.setdefault(key, {})
                reasons[metric] = f"{reasons[metric]}; {text}" if metric in reasons else text
    return out


def trust_lines(
    frame: pd.DataFrame, found: Mapping[str, Mapping[str, CheckResult]], repeats: Mapping[str, CheckResult]
) -> list[str]:
    """The report's "Can you trust this run?": one line per check, the windows it failed on
    (with the evidence) and its fix, or how many windows passed; where it applies to none, so."""
    names = dict(zip(frame["run_id"].astype(str), frame["point"].astype(str), strict=True)) if "point" in frame else {}
    lines = []
    for check in CHECKS:
        if check.name == "repeats":  # its text names the point
            results = [("", f) for f in repeats.values()]
        else:
            results = [(f"{names.get(run, run)}: ", f[check.name]) for run, f in found.items() if check.name in f]
        failed = [(who, f) for who, f in results if not f.ok]
        if not results:
            lines.append(f"- {check.title}: not applicable to these windows")
        elif not failed:
            lines.append(f"- passed, {check.title}: all {len(results)} judged")
        else:
            shown = "; ".join(f"{who}{f.text}" for who, f in failed[:6]) + ("; ..." if len(failed) > 6 else "")
            lines.append(
                f"- **FAILED, {check.title}** ({len(failed)} of {len(results)}: {check.label}): {shown}. "
                f"Fix: {check.fix}"
            )
    return lines
