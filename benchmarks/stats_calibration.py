"""Coverage of every interval the report shows, and power of every sample-size hint, on simulated
windows with a known truth.

The windows are shaped like real ones: heavy-tailed per-request TPOT (a lognormal prompt effect
times Student-t(4) request noise on the log scale), the same prompts on both servers, a
between-server offset with the A/A spread measured on this project's machines (6.4 % in median
TPOT), and failed requests. TTFT and E2EL have shapes of their own (a prefill effect and an output
length per prompt); the acceptance length comes from simulated drafting steps. Each interval is
computed by the project's own code, exactly as the report computes it.

    python benchmarks/stats_calibration.py              # >= 1,000 trials per gated interval
    python benchmarks/stats_calibration.py --quick      # a reduced run (CI, checking): under 5 minutes
    python benchmarks/stats_calibration.py --trials 20  # a smoke run: 20 trials per interval (with --quick:
                                                        # the quick run's resamples)

Exit 1 when an interval misses its coverage goal (93-97 %; above 97 % only where CONSERVATIVE
gives the reason, and then at most 99.5 % unless the reason explains more), when a gated
interval ran fewer trials than its mode asks (1,000 in the full run), or when a hint misses 80 %
power at the size and effect it names ("at N requests per window, an effect of X or more resolves
with 80 % power": windows of N requests with X as the truth; observed at a fixed truth of 1.12x);
0 otherwise. The last line is a one-line summary.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.analysis import decisions, verdicts
from pipeline.analysis.breakeven import break_even, with_shared_baseline_spread
from pipeline.analysis.capacity import boundary, probe
from pipeline.analysis.categories import GroupComparisons
from pipeline.analysis.decisions import decide
from pipeline.analysis.samples import Sample, ServerSpread, StatsOptions
from pipeline.analysis.stats import acceptance_length_interval, paired_ratio
from pipeline.load.slo import SloTarget

AA_SD = 0.064  # the A/A spread between fresh servers in median TPOT (log scale), measured on this machine
AA_TTFT_SD = 0.080  # the same A/A sweep's spread in median TTFT (docs/statistics.md)
COVERAGE_GOAL = (0.93, 0.97)
POWER_GOAL = 0.80  # what the hints claim: an effect of the size they name resolves with 80 % power


def window(rng: np.random.Generator, prompt: np.ndarray, scale: float, fail: float = 0.0) -> Sample:
    """One window: per-request TPOT = scale x exp(prompt + 0.15 t4), a share ``fail`` of requests failed."""
    n = len(prompt)
    tpot = scale * np.exp(prompt + 0.15 * rng.standard_t(4, n))
    failed = rng.random(n) < fail
    ok = ~failed
    return Sample(
        index=np.arange(n)[ok],
        values={"tpot": tpot[ok], "ttft": tpot[ok] * 5, "e2el": tpot[ok] * 64},
        itl=tuple(np.full(2, v) for v in tpot[ok]),
        output_tokens=np.full(ok.sum(), 65.0),
        chunks=np.full(ok.sum(), 33.0),
        duration_s=30.0,
        failed=int(failed.sum()),
        failed_index=np.flatnonzero(failed),
    )


def pair(
    rng: np.random.Generator,
    n: int,
    true: float,
    runs: int,
    offset_sd: float,
    fail: float = 0.0,
    prompt_sd: float = 0.1,
) -> tuple[list[Sample], list[Sample]]:
    """Baseline and speculative windows of ``runs`` repeats; each repeat's pair of servers moves the
    ratio by a N(0, offset_sd) log offset (0: the truth is these servers' own)."""
    base, spec = [], []
    for _ in range(runs):
        prompt = rng.normal(0, prompt_sd, n)
        base.append(window(rng, prompt, 0.04, fail))
        spec.append(window(rng, prompt, 0.04 / true * math.exp(rng.normal(0, offset_sd)), fail))
    return base, spec


def covers(ratio, truth: float) -> bool:  # type: ignore[no-untyped-def]
    return ratio.low is not None and ratio.high is not None and ratio.low <= truth <= ratio.high


def aa_spread(
    rng: np.random.Generator, comparisons: int = 10, metric: str = "speedup_median_tpot", sd: float = AA_SD
) -> ServerSpread:
    """What an A/A sweep of ``comparisons`` pairs would have stored for ``metric`` (true spread
    ``sd``): the RMS of as many draws."""
    draws = rng.normal(0, sd, comparisons)
    return ServerSpread({metric: float(np.sqrt(np.mean(draws**2)))}, comparisons, "simulated")


# ---- the experiments: each returns (hits, trials) ----------------------------------------


def paired_coverage(
    seed: int, trials: int, opts: StatsOptions, n: int, true: float, runs: int = 1, offset_sd: float = 0.0, **kw: float
) -> tuple[int, int]:
    """How often the median-TPOT interval of ``runs`` repeats of ``n`` requests covers ``true``
    (``offset_sd``: each repeat's own pair of servers, so the truth is the mean over servers)."""
    rng = np.random.default_rng(seed)
    hits = 0
    for s in range(trials):
        base, spec = pair(rng, n, true, runs, offset_sd, **kw)
        hits += covers(paired_ratio("speedup_median_tpot", base, spec, opts, np.random.default_rng(s)), true)
    return hits, trials


def serially_correlated(trials: int, opts: StatsOptions) -> tuple[int, int]:
    """At high load a window's requests share queueing state: each server's request noise is
    AR(1) in arrival order (rho 0.6, its own per server). An iid bootstrap over requests covered
    ~79 % here; the paired ratio's interval is widened by its lag-1 autocorrelation."""
    rng = np.random.default_rng(12)
    hits = 0
    for s in range(trials):
        prompt = rng.normal(0, 0.1, 64)
        windows = []
        for scale in (0.04, 0.04 / 1.5):
            noise = np.empty(64)
            noise[0] = rng.normal(0, 0.15)
            for i in range(1, 64):
                noise[i] = 0.6 * noise[i - 1] + rng.normal(0, 0.15 * math.sqrt(1 - 0.36))
            w = window(rng, prompt, scale)
            tpot = scale * np.exp(prompt + noise)
            windows.append(dataclasses.replace(w, values={"tpot": tpot, "ttft": tpot * 5, "e2el": tpot * 64}))
        ratio = paired_ratio("speedup_median_tpot", [windows[0]], [windows[1]], opts, np.random.default_rng(s))
        hits += covers(ratio, 1.5)
    return hits, trials


def one_run_with_aa_spread(trials: int, opts: StatsOptions) -> tuple[int, int]:
    rng = np.random.default_rng(4)
    hits = 0
    for s in range(trials):
        base, spec = pair(rng, 64, 1.3, 1, AA_SD)
        with_spread = dataclasses.replace(opts, server_spread=aa_spread(rng))
        ratio = paired_ratio("speedup_median_tpot", base, spec, with_spread, np.random.default_rng(s), True)
        hits += covers(ratio, 1.3)
    return hits, trials


def repeats_shared_with_aa_spread(trials: int, opts: StatsOptions) -> tuple[int, int]:
    """3 repeats on one pair of servers: one offset for all of them, the A/A spread added."""
    rng = np.random.default_rng(5)
    hits = 0
    for s in range(trials):
        offset = math.exp(rng.normal(0, AA_SD))
        base, spec = pair(rng, 32, 1.3 * offset, 3, 0.0)
        with_spread = dataclasses.replace(opts, server_spread=aa_spread(rng))
        ratio = paired_ratio("speedup_median_tpot", base, spec, with_spread, np.random.default_rng(s), True)
        hits += covers(ratio, 1.3)
    return hits, trials


PROFILE = (0.8, 0.6, 0.45, 0.3)


def predict_interval(trials: int, opts: StatsOptions) -> tuple[int, int]:
    """search=predict's TPOT at k=2 from the baseline and k=4, against a synthetic engine that
    follows the model exactly (step cost linear in k, L from the per-position rates)."""
    from pipeline.analysis import kcurve
    from pipeline.analysis.kcurve_windows import MeasuredK, model_windows

    def tpot(k: int) -> float:
        return (0.044 + 0.004 * k) / (1 + sum(PROFILE[:k]))

    def measured(rng: np.random.Generator, prompt: np.ndarray, k: int) -> MeasuredK:
        w = window(rng, prompt, tpot(k))
        length = 1 + sum(PROFILE[:k])
        w = dataclasses.replace(w, chunks=np.round(64 / length) * np.ones(w.size) + 1)
        metrics = {"acceptance_length": 64 / np.round(64 / length)} if k else {}
        return MeasuredK((w,), (metrics,))

    rng = np.random.default_rng(6)
    hits = 0
    for s in range(trials):
        prompt = rng.normal(0, 0.3, 64)
        got = model_windows({0: measured(rng, prompt, 0), 4: measured(rng, prompt, 4)}, opts, seed=s)
        top = got[4]
        inputs = kcurve.RateInputs(1.0, got[0], top, PROFILE)
        found = kcurve.extrapolate(inputs, 2, opts)
        # The prompts' own median scales every window alike and cancels in the speedup: its truth is known.
        true_speedup = tpot(0) / tpot(2)
        hits += found.speedup_low <= true_speedup <= found.speedup_high
    return hits, trials


def capacity_interval(trials: int, opts: StatsOptions, n: int) -> tuple[int, int]:
    """A server whose p99 TPOT reaches 20 ms at exactly 3 req/s, probed at five rates."""
    rng = np.random.default_rng(7 + n)
    limit, z = 3.0, 2.3263
    target = SloTarget(tpot_s=0.010 * math.exp(0.3 * z), min_goodput=0.0)
    hits = 0
    for _ in range(trials):
        found = []
        for rate in (1.0, 2.0, 4.0, 2.83, 3.36):
            tpot = 0.01 * rate / limit * np.exp(rng.normal(0, 0.3, n))
            sample = Sample(
                index=np.arange(n),
                values={"tpot": tpot, "ttft": np.full(n, 0.1), "e2el": tpot * 64},
                itl=(),
                output_tokens=np.full(n, 65.0),
                chunks=np.full(n, 65.0),
                duration_s=30.0,
            )
            found.append(probe(rate, sample, target, opts, rng))
        b = boundary(found, opts)
        hits += b.low is not None and b.high is not None and b.low <= limit <= b.high
    return hits, trials


CROSSING_ATTEMPTS = 3  # simulated sweeps per wanted resolved one, at most


def crossing_interval(trials: int, opts: StatsOptions) -> tuple[int, int, int]:
    """True speedups 2.0, 1.4, 0.7 at 1, 4 and 16 req/s, log-linear between 4 and 16: the truth
    crosses 1.0 at 4 + 12 log 1.4 / log 2 = 9.83 req/s. Counted where the crossing is resolved:
    sweeps are simulated until ``trials`` of them resolved it (at most CROSSING_ATTEMPTS x
    ``trials``). Returns (hits, resolved, attempted)."""
    rng = np.random.default_rng(8)
    truth = 4 + 12 * math.log(1.4) / (math.log(1.4) - math.log(0.7))
    hits = resolved = attempted = 0
    while resolved < trials and attempted < CROSSING_ATTEMPTS * trials:
        s, attempted = attempted, attempted + 1
        ratios = [
            paired_ratio("speedup_median_tpot", *pair(rng, 64, t, 1, 0.0), opts, np.random.default_rng([s, i]))
            for i, t in enumerate((2.0, 1.4, 0.7))
        ]
        cross = decisions.crossing([1.0, 4.0, 16.0], decide(ratios, opts), opts)
        if cross.rate is not None:
            resolved += 1
            hits += cross.low <= truth <= cross.high  # type: ignore[operator]
    return hits, resolved, attempted


# The drafter map (pipeline/analysis/drafter_map.py) at one load: S(L) = L / 1.6 (Leviathan's form,
# k c + 1 = 1.6), which reaches 1 + floor at L = 1.02 x 1.6 = 1.632.
BREAK_EVEN_COST = 1.6
BREAK_EVEN_LENGTHS = (1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0)


def break_even_interval(trials: int, opts: StatsOptions) -> tuple[int, int]:
    """The break-even L as the report computes it (pipeline/analysis/drafter_map.py): one baseline
    server shared by every L, each L on a speculative server of its own (each server moves its
    ratios by a N(0, AA_SD / sqrt 2) log offset, so that a pair of servers moves one by AA_SD), every
    L's bootstrap drawing the same prompts (one seed per curve), and the A/A spread of 10
    comparisons added to the curve as a whole."""
    rng = np.random.default_rng(44)
    truth = (1 + opts.floor) * BREAK_EVEN_COST
    server = AA_SD / math.sqrt(2)
    hits = 0
    for s in range(trials):
        aa = dataclasses.replace(opts, server_spread=aa_spread(rng))
        prompt = rng.normal(0, 0.1, 64)
        base = window(rng, prompt, 0.04 * math.exp(rng.normal(0, server)))
        ratios = []
        for length in BREAK_EVEN_LENGTHS:
            spec = window(rng, prompt, 0.04 * BREAK_EVEN_COST / length * math.exp(rng.normal(0, server)))
            ratios.append(paired_ratio("speedup_median_tpot", [base], [spec], opts, np.random.default_rng([s, 44])))
        found = break_even(BREAK_EVEN_LENGTHS, with_shared_baseline_spread(ratios, aa, s), aa.floor, aa)
        hits += found.low is not None and found.high is not None and found.low <= truth <= found.high
    return hits, trials


# ---- the other ratios the report shows, and the acceptance length -----------------------------


def p99_coverage(trials: int, opts: StatsOptions, n: int) -> tuple[int, int]:
    """The p99-TPOT ratio of one run of ``n`` requests (the report gives a p99 a verdict from 100
    paired requests per window): the windows of :func:`pair`, whose true p99 ratio is 1.5 (the
    speculative window's TPOT is the baseline's distribution over 1.5)."""
    rng = np.random.default_rng(13 + n)
    hits = 0
    for s in range(trials):
        base, spec = pair(rng, n, 1.5, 1, 0.0)
        hits += covers(paired_ratio("speedup_p99_tpot", base, spec, opts, np.random.default_rng(s), True), 1.5)
    return hits, trials


@functools.cache
def log_latency_quantile(q: float, draws: int = 4_000_000) -> float:
    """The q-quantile of the windows' log TPOT shape (prompt N(0, 0.1) + 0.15 t4), by a large draw."""
    rng = np.random.default_rng(29)
    return float(np.quantile(rng.normal(0, 0.1, draws) + 0.15 * rng.standard_t(4, draws), q))


def censored_truth(true: float, q: float, fail: float, side: str = "speculative") -> float:
    """The true ratio (baseline / speculative) of the q-quantiles where one side fails a share
    ``fail`` of its requests, a failure counting as +inf: that side's q-quantile is its latency's
    q / (1 - fail) quantile, or a failure (+inf: the ratio is 0 or infinite) where that is >= 1."""
    level = q / (1 - fail)
    if level >= 1:
        return 0.0 if side == "speculative" else math.inf
    shift = log_latency_quantile(q) - log_latency_quantile(level)
    return true * math.exp(shift if side == "speculative" else -shift)


def censored_p99(trials: int, opts: StatsOptions, failures: int) -> tuple[int, int]:
    """The p99-TPOT ratio of one run of 128 requests (truth 1.5x) whose speculative window fails
    exactly ``failures`` of its requests (at random prompts), each a latency of +inf: against the
    truth with failures at that share (:func:`censored_truth`; two of 128 put the speculative p99
    on a failure, a true ratio of 0, which an interval covers by reaching 0)."""
    rng = np.random.default_rng(31 + failures)
    truth = censored_truth(1.5, 0.99, failures / 128)
    hits = 0
    for s in range(trials):
        (base,), (spec,) = pair(rng, 128, 1.5, 1, 0.0)
        failed = rng.choice(128, failures, replace=False)
        kept = spec.with_index(np.setdiff1d(spec.index, failed))
        spec = dataclasses.replace(kept, failed=failures, failed_index=np.sort(failed))
        ratio = paired_ratio("speedup_p99_tpot", [base], [spec], opts, np.random.default_rng(s), True)
        assert ratio.low is not None and not math.isnan(ratio.low), ratio  # defined, never NaN
        hits += covers(ratio, truth)
    return hits, trials


def prompts(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` prompts' own effects, the same on both servers: on TPOT (sd 0.1, as in :func:`pair`),
    on prefill (sd 0.4: prompt lengths vary) and the output length (lognormal, median 128 tokens,
    2-512; lossless at temperature 0, so the same on both servers)."""
    tokens = np.clip(np.round(128 * np.exp(rng.normal(0, 0.5, n))), 2, 512)
    return rng.normal(0, 0.1, n), rng.normal(0, 0.4, n), tokens


def latency_window(
    rng: np.random.Generator, prompt: tuple[np.ndarray, np.ndarray, np.ndarray], tpot_scale: float, ttft_scale: float
) -> Sample:
    """One window whose TTFT and E2EL are their own: TPOT as in :func:`window`, TTFT =
    ttft_scale x exp(prefill + 0.3 t4) (queueing noise heavier than TPOT's), E2EL = TTFT +
    (tokens - 1) x TPOT."""
    decode, prefill, tokens = prompt
    n = len(tokens)
    tpot = tpot_scale * np.exp(decode + 0.15 * rng.standard_t(4, n))
    ttft = ttft_scale * np.exp(prefill + 0.3 * rng.standard_t(4, n))
    return Sample(
        index=np.arange(n),
        values={"tpot": tpot, "ttft": ttft, "e2el": ttft + (tokens - 1) * tpot},
        itl=(),
        output_tokens=tokens,
        chunks=tokens,
        duration_s=30.0,
    )


# Baseline scales of the latency windows, and speculation's true effect on each part.
TTFT_S, TPOT_S = 0.5, 0.04
TTFT_TRUE, TPOT_TRUE = 0.9, 1.5  # speculation's prefill runs the draft too: its TTFT is 10 % slower


@functools.cache
def e2el_truth(draws: int = 2_000_000) -> float:
    """The true median-E2EL ratio of :func:`latency_window`'s windows: no closed form (a sum of
    two heavy-tailed terms), so the ratio of the two population medians from ``draws`` requests,
    both sides drawn from common random numbers (its error, about 0.05 %, is far inside any
    interval's width)."""
    rng = np.random.default_rng(14)
    decode, prefill, tokens = prompts(rng, draws)
    tpot = np.exp(decode + 0.15 * rng.standard_t(4, draws))
    ttft = np.exp(prefill + 0.3 * rng.standard_t(4, draws))
    base = TTFT_S * ttft + (tokens - 1) * TPOT_S * tpot
    spec = TTFT_S / TTFT_TRUE * ttft + (tokens - 1) * TPOT_S / TPOT_TRUE * tpot
    return float(np.median(base) / np.median(spec))


def ttft_with_aa_spread(trials: int, opts: StatsOptions) -> tuple[int, int]:
    """The median-TTFT ratio of one run of 64 requests on one pair of servers, which move it by a
    N(0, 8.0 %) log offset; the A/A spread (10 comparisons) is added, as the report adds it."""
    rng = np.random.default_rng(15)
    hits = 0
    for s in range(trials):
        prompt = prompts(rng, 64)
        offset = math.exp(rng.normal(0, AA_TTFT_SD))
        base = latency_window(rng, prompt, TPOT_S, TTFT_S)
        spec = latency_window(rng, prompt, TPOT_S / TPOT_TRUE, TTFT_S / TTFT_TRUE * offset)
        spread = dataclasses.replace(opts, server_spread=aa_spread(rng, 10, "speedup_median_ttft", AA_TTFT_SD))
        ratio = paired_ratio("speedup_median_ttft", [base], [spec], spread, np.random.default_rng(s), True)
        hits += covers(ratio, TTFT_TRUE)
    return hits, trials


def e2el_repeats(trials: int, opts: StatsOptions) -> tuple[int, int]:
    """The median-E2EL ratio of 3 repeats of 32 requests, each on fresh servers that move it by a
    N(0, 6.4 %) log offset (the truth: the mean over servers, :func:`e2el_truth`)."""
    rng = np.random.default_rng(16)
    truth = e2el_truth()
    hits = 0
    for s in range(trials):
        base, spec = [], []
        for _ in range(3):
            prompt = prompts(rng, 32)
            offset = math.exp(rng.normal(0, AA_SD))
            base.append(latency_window(rng, prompt, TPOT_S, TTFT_S))
            spec.append(latency_window(rng, prompt, TPOT_S / TPOT_TRUE * offset, TTFT_S / TTFT_TRUE * offset))
        hits += covers(paired_ratio("speedup_median_e2el", base, spec, opts, np.random.default_rng(s)), truth)
    return hits, trials


def throughput_repeats(trials: int, opts: StatsOptions) -> tuple[int, int]:
    """The output-throughput ratio of 3 repeats of 64 requests on fresh servers (N(0, 6.4 %)
    offsets), Student's t over the repeats' ratios. The windows are throughput-bound: a window's
    span is its mean TPOT's share of 30 s, times a heavy-tailed window noise exp(0.03 t4) (its
    last request), so the true ratio is the TPOT one, 1.3."""
    rng = np.random.default_rng(17)
    hits = 0
    for s in range(trials):
        base, spec = (
            [
                dataclasses.replace(
                    w, duration_s=30.0 * float(np.mean(w.values["tpot"])) / 0.04 * math.exp(0.03 * rng.standard_t(4))
                )
                for w in side
            ]
            for side in pair(rng, 64, 1.3, 3, AA_SD)
        )
        hits += covers(paired_ratio("output_throughput_ratio", base, spec, opts, np.random.default_rng(s)), 1.3)
    return hits, trials


DRAFT_K = 4  # draft tokens per step in the acceptance-length row


def decode_steps(rng: np.random.Generator, alpha: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each request's decode steps at k = DRAFT_K: a step emits 1 + a tokens, a the leading run
    of accepted drafts (each accepted with the prompt's alpha, at most k), until the request has
    its ``tokens`` (its first came from the prefill; the last step is cut at the request's end).
    Returns (steps, accepted): steps per request and its drafts accepted, as the engine counts
    them (uncut)."""
    width = int(tokens.max()) - 1
    accepted = np.minimum(rng.geometric(1 - alpha[:, None], (len(alpha), width)) - 1, DRAFT_K)
    emitted = np.cumsum(1 + accepted, axis=1)
    steps = (emitted < (tokens - 1)[:, None]).sum(axis=1) + 1
    counted = np.where(np.arange(width) < steps[:, None], accepted, 0).sum(axis=1)
    return steps, counted


def acceptance_prompts(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Each prompt's acceptance rate alpha ~ Beta(7, 3) (some prompts draft far better than
    others) and output length (lognormal, median 128 tokens, 2-384)."""
    return rng.beta(7, 3, n), np.clip(np.round(128 * np.exp(rng.normal(0, 0.5, n))), 2, 384)


@functools.cache
def acceptance_truth(requests: int = 200_000) -> float:
    """The engine's acceptance length 1 + accepted / drafting steps over an unbounded window of
    :func:`acceptance_prompts` (no closed form: long requests weigh by their steps), from
    ``requests`` requests (its error, about 0.05 %, is far inside any interval's width)."""
    rng = np.random.default_rng(18)
    steps = counted = 0
    for _ in range(requests // 5000):
        got = decode_steps(rng, *acceptance_prompts(rng, 5000))
        steps, counted = steps + int(got[0].sum()), counted + int(got[1].sum())
    return 1 + counted / steps


def acceptance_interval(trials: int, opts: StatsOptions) -> tuple[int, int]:
    """The acceptance-length interval of one run of 64 requests, as the report computes it: the
    bootstrap of the requests' (tokens - 1) / (chunks - 1), centred on the window's own counter
    (1 + accepted / steps, uncut), within [1, k + 1]."""
    rng = np.random.default_rng(19)
    truth = acceptance_truth()
    hits = 0
    for s in range(trials):
        alpha, tokens = acceptance_prompts(rng, 64)
        steps, counted = decode_steps(rng, alpha, tokens)
        w = dataclasses.replace(window(rng, np.zeros(64), 0.04), output_tokens=tokens, chunks=steps + 1.0)
        length = acceptance_length_interval([w], 1 + counted.sum() / steps.sum(), opts, np.random.default_rng(s))
        hits += covers(verdicts._within_bounds(length, DRAFT_K), truth)
    return hits, trials


# ---- the hints' power ------------------------------------------------------------------------


def _named(hint: str) -> tuple[int, float]:
    """What a hint names: its size ("at ~113 requests ...", "repeats.count >= 4, ...", "at ~26
    repeats, ...") and the effect it says resolves there ("an effect of 1.21x or more")."""
    size = re.search(r">= (\d+)", hint) or re.search(r"~(\d+)", hint)
    effect = re.search(r"an effect of ([\d.]+)x or (?:more|less) resolves", hint)
    if size is None or effect is None:
        raise ValueError(f"the hint names no size or effect: {hint}")
    return int(size.group(1)), float(effect.group(1))


HINTS = {
    # kind: (what the observed window is, the words its hint must hold)
    "requests": ("one run, within-window spread", "requests per window, an effect of"),
    "server": ("one run, the A/A spread alone too wide", "repeats.count >="),
    "restarted": ("3 repeats on fresh servers", "repeats, an effect of"),  # "at ~R repeats, ..."
}


def hint_power(hints: int, sims: int, opts: StatsOptions, kind: str) -> tuple[str, float, float]:
    """Observe an inconclusive window at a fixed truth (1.12x), take its hint ("at N ..., an
    effect of X or more resolves with 80 % power"), and simulate what it claims: windows of the
    size it names with X as the truth, counting how often the verdict is reached. Averaged over
    ``hints`` observed windows (each hint rests on one window's noisy spread and interval).
    Returns one hint's wording, the power at the named size and effect, and the power at the
    named size of the fixed truth (what following the hint buys where the truth is smaller
    than X: less, as the hint says).

    ``kind``: "requests" (one run, no server spread), "server" (one run with a stored A/A spread
    too wide for any window size: "repeats.restart=true and repeats.count >= R") or "restarted"
    (3 repeats on fresh servers, whose own spread sizes the hint)."""
    rng = np.random.default_rng({"requests": 9, "server": 10, "restarted": 11}[kind])
    true, n0 = 1.12, 24
    wanted = HINTS[kind][1]
    server = kind == "server"
    powers, at_truth, shown = [], [], ""

    def called(size: int, effect: float, s: int) -> bool:
        if kind == "requests":  # the hint: one run of that many requests
            base, spec = pair(rng, size, effect, 1, 0.0)
            got = paired_ratio("speedup_median_tpot", base, spec, opts, np.random.default_rng(s), True)
        else:  # the hint: that many repeats, each on fresh servers
            base, spec = pair(rng, n0, effect, size, AA_SD)
            got = paired_ratio("speedup_median_tpot", base, spec, opts, np.random.default_rng(s))
        return decide([got], opts)[0].label == ("helps" if effect >= 1 else "hurts")

    for _ in range(hints):
        # Each hint rests on an A/A sweep of its own (20 comparisons): its spread is a random draw too.
        with_spread = dataclasses.replace(opts, server_spread=aa_spread(rng, 20) if server else None)
        for _ in range(400):
            if kind == "restarted":
                base, spec = pair(rng, n0, true, 3, AA_SD)
                ratio = paired_ratio("speedup_median_tpot", base, spec, opts, rng)
            else:
                base, spec = pair(rng, n0, true, 1, AA_SD if server else 0.0)
                ratio = paired_ratio("speedup_median_tpot", base, spec, with_spread, rng, shared_servers=True)
            decision = decide([ratio], with_spread)[0]
            # A hint only: "not resolvable at practical sizes" names no size to test.
            if decision.label == "inconclusive" and wanted in decision.detail and "resolves with" in decision.detail:
                break
        else:
            return f"no inconclusive window with a '{wanted}' hint ({HINTS[kind][0]})", math.nan, math.nan
        shown = decision.detail
        size, effect = _named(decision.detail)
        powers.append(float(np.mean([called(size, effect, s) for s in range(sims)])))
        at_truth.append(float(np.mean([called(size, true, s) for s in range(sims)])))
    return f"{shown} ({HINTS[kind][0]}; one of {hints})", float(np.mean(powers)), float(np.mean(at_truth))


# ---- the table -------------------------------------------------------------------------------

CEILING = 0.995  # a conservative interval above this is a miss unless its reason explains why


@dataclasses.dataclass(frozen=True)
class Conservative:
    reason: str  # why this interval may cover more than 97 %: printed whenever it does
    ceiling: float = CEILING
    ceiling_reason: str = ""  # required where ceiling > CEILING: why coverage may exceed it

    def __post_init__(self) -> None:
        if self.ceiling > CEILING and not self.ceiling_reason:
            raise ValueError(f"a ceiling above {CEILING:.1%} needs its own reason")


CONSERVATIVE = {
    "one run, A/A spread added": Conservative(
        "the stored A/A spread is an RMS over A/A log ratios that hold the windows' own noise too, and it is "
        "added on top of the within-window replicates: it errs wide"
    ),
    "3 repeats, one pair of servers, A/A spread added": Conservative(
        "as in 'one run, A/A spread added': the stored A/A spread holds the windows' own noise too and is added "
        "on top of the within-window replicates"
    ),
    "one run, 64 requests, strong prompt effect": Conservative(
        "where the same prompt is slow on both servers, the bootstrap of a ratio of two medians over-states its spread"
    ),
    "crossing rate (where resolved)": Conservative(
        "a replicate that does not cross within the segment is censored at the segment's end, which pulls the "
        "interval outward"
    ),
    "predict: speedup at k=2 from k=0 and k=4": Conservative(
        "the speedup is a ratio of two medians over the same prompts, as in the strong-prompt row"
    ),
    "one run, 5 % failed requests (censored)": Conservative(
        "censored at +inf, each window's median is a higher quantile of a heavy-tailed (t4) distribution, where the "
        "percentile bootstrap errs wide"
    ),
    "median TTFT: one run, A/A spread added": Conservative(
        "as in 'one run, A/A spread added': the stored A/A spread (TTFT's, 8.0 %) holds the windows' own noise too "
        "and is added on top of the within-window replicates; and a prompt's prefill is slow on both servers, the "
        "strong-prompt row's case"
    ),
    "median E2EL: 3 repeats on fresh servers, 32 requests": Conservative(
        "a prompt's output length, the same on both servers, sets most of its E2EL: where the same prompt is slow on "
        "both servers, the bootstrap of a ratio of two medians over-states its spread (the strong-prompt row's case)"
    ),
    "group: each of 2 categories x 32 requests, one run": Conservative(
        "32 requests a group: the percentile bootstrap of a median of so few draws is lumpy (it takes few distinct "
        "values) and errs wide; the family's false alarms and power are in the table below it"
    ),
    **{
        f"p99 TPOT censored: 128 requests, speculation fails {k}": Conservative(
            f"a window holding {k} failure(s) cannot bound its p99 ratio from below: {share} of the bootstrap's "
            "replicates draw a failure into the p99 (a ratio of 0), so the interval reaches 0 in every trial",
            ceiling=1.0,
            ceiling_reason="the lower end is the censored one, 0, by construction; the upper end is what is tested",
        )
        for k, share in ((1, "about a quarter"), (2, "about 60 %"))
    },
    "capacity boundary, 400 requests per probe": Conservative(
        "each probe's percentile is drawn from its order statistics (distribution-free, uniform between neighbours), "
        "and a p99 with no finite upper bound opens the interval"
    ),
}


# ---- verdicts per group: categories, and stretches of a trace (analysis/categories.py, timeline.py) --

GROUP_FRAME = pd.DataFrame(
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
            "trace_requests": 64.0,
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
            "trace_requests": 64.0,
        },
    ]
)


def grouped_pair(
    rng: np.random.Generator, truths: Sequence[float], per_group: int, fails: tuple[str, float] | None = None
) -> tuple[Sample, Sample]:
    """One run: ``per_group`` requests per group, group g's true ratio ``truths[g]``; each request
    scheduled in its group's stretch of a 60 s window (group = category = stretch). ``fails``:
    (side, share): that side alone ("baseline" or "speculative") fails each request of the first
    group with that probability (recorded as the client records it: with its category and
    scheduled time)."""
    n = per_group * len(truths)
    group = np.repeat(np.arange(len(truths)), per_group)
    prompt = rng.normal(0, 0.1, n)
    true = np.asarray(truths)[group]
    scheduled = (group + (np.arange(n) % per_group + 0.5) / per_group) * 60.0 / len(truths)
    names = np.array([f"g{g}" for g in group], dtype=object)
    made = []
    for side, scale in (("baseline", np.full(n, 0.04)), ("speculative", 0.04 / true)):
        tpot = scale * np.exp(prompt + 0.15 * rng.standard_t(4, n))
        failed = np.zeros(n, bool)
        if fails is not None and fails[0] == side:
            failed = (group == 0) & (rng.random(n) < fails[1])
        ok = ~failed
        made.append(
            Sample(
                index=np.arange(n)[ok],
                values={"tpot": tpot[ok], "ttft": tpot[ok] * 5, "e2el": tpot[ok] * 64},
                itl=tuple(np.full(2, v) for v in tpot[ok]),
                output_tokens=np.full(int(ok.sum()), 65.0),
                chunks=np.full(int(ok.sum()), 33.0),
                duration_s=62.0,
                failed=int(failed.sum()),
                failed_index=np.flatnonzero(failed),
                scheduled=scheduled[ok],
                failed_scheduled=scheduled[failed],
                category=names[ok],
                failed_category=names[failed],
            )
        )
    return made[0], made[1]


def group_table(kind: str, base: Sample, spec: Sample, opts: StatsOptions) -> GroupComparisons:
    """The groups' comparisons, their table in the groups' order (category name, or time)."""
    from pipeline.analysis import categories, timeline

    samples = {"b": base, "s": spec}
    if kind == "category":
        found = categories.compare_groups(GROUP_FRAME, samples, opts)
        return dataclasses.replace(found, table=found.table.sort_values("category"))
    found = timeline.compare_stretches(GROUP_FRAME, samples, opts)
    return dataclasses.replace(found, table=found.table.sort_values("start_s"))


def group_coverage(
    seed: int,
    trials: int,
    opts: StatsOptions,
    kind: str,
    truths: Sequence[float],
    per_group: int,
    fails: tuple[str, float] | None = None,
) -> tuple[int, int]:
    """Each group's interval against its own truth: hits over groups x trials. With ``fails``,
    the first group's truth is its censored one (failures as +inf on the failing side)."""
    rng = np.random.default_rng(seed)
    expected = list(truths)
    if fails is not None:
        expected[0] = censored_truth(truths[0], 0.5, fails[1], fails[0])
    hits = count = 0
    for _ in range(trials):
        table = group_table(kind, *grouped_pair(rng, truths, per_group, fails), opts).table
        for truth, low, high in zip(
            expected, table["speedup_median_tpot_low"], table["speedup_median_tpot_high"], strict=True
        ):
            hits += int(low <= truth <= high)
            count += 1
    return hits, count


def group_calls(
    seed: int, trials: int, opts: StatsOptions, kind: str, truths: Sequence[float], per_group: int
) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    calls = []
    for _ in range(trials):
        groups = group_table(kind, *grouped_pair(rng, truths, per_group), opts)
        calls.append(list(groups.labels(groups.table)))  # each group's verdict, from its Decision
    return calls


def row(
    name: str, hits: int, trials: int, note: str = "", minimum: int = 0, seconds: float = math.nan
) -> tuple[str, bool, str]:
    """The table row, whether the interval met its goal, and a line to print under the table
    (why a conservative row may be conservative, or why a row missed), or ""."""
    if trials == 0:
        return f"| {name} | no trials | {note or '—'} | miss | {seconds:.1f} |", False, f"{name}: no trials"
    rate = hits / trials
    ci = scipy_stats.binomtest(hits, trials).proportion_ci(method="exact")
    low_goal, high_goal = COVERAGE_GOAL
    allowance = CONSERVATIVE.get(name)
    if trials < minimum:
        status, why = "miss", f"{name}: {trials} trials, fewer than the {minimum} this run asks of a gated interval"
    elif low_goal <= rate <= high_goal:
        status, why = "ok", ""
    elif rate > high_goal and allowance is not None and rate <= allowance.ceiling:
        status, why = "conservative", f"conservative, {name}: {allowance.reason}"
        if allowance.ceiling_reason:
            why += f" (allowed up to {allowance.ceiling:.1%}: {allowance.ceiling_reason})"
    elif rate > high_goal and allowance is not None:
        status = "miss"
        why = f"{name}: {rate:.1%} is above even a conservative interval's ceiling ({allowance.ceiling:.1%})"
    else:
        status = "miss"
        why = f"{name}: {rate:.1%} is outside {low_goal:.0%}-{high_goal:.0%}" + (
            "" if rate < low_goal else " and no reason for a conservative interval is given"
        )
    text = (
        f"| {name} | {hits}/{trials} = {rate:.1%} [{ci.low:.1%}, {ci.high:.1%}] | {note or '—'} | {status} | "
        f"{seconds:.1f} |"
    )
    return text, status != "miss", why


# Trials per gated interval, and replicates per interval, by mode.
FULL_TRIALS, QUICK_TRIALS = 1000, 200
FULL_RESAMPLES, QUICK_RESAMPLES = 1000, 500


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer trials and resamples (under 5 minutes)")
    parser.add_argument(
        "--trials",
        type=int,
        default=None,
        help="trials per interval, in place of the mode's (a smoke run, or a timing; the hints are "
        "scaled down with it; --quick still sets the resamples)",
    )
    parser.add_argument(
        "--only",
        default="",
        help="only the interval rows whose name contains this text, and the group verdicts (a check of some rows)",
    )
    args = parser.parse_args()
    trials = args.trials if args.trials is not None else QUICK_TRIALS if args.quick else FULL_TRIALS
    if trials < 1:
        parser.error("--trials must be >= 1")
    opts = StatsOptions(resamples=QUICK_RESAMPLES if args.quick else FULL_RESAMPLES)
    hints, sims = (8, 30) if args.quick else (10, 60)
    if args.trials is not None:
        hints, sims = min(hints, max(1, trials // 10)), min(sims, trials)
    start = time.monotonic()
    experiments: list[tuple[str, Callable[[], tuple[int, ...]], str]] = [
        ("one run, 64 requests", lambda: paired_coverage(1, trials, opts, 64, 1.5), ""),
        (
            "one run, 64 requests, strong prompt effect",
            lambda: paired_coverage(11, trials, opts, 64, 1.5, prompt_sd=0.6),
            "prompt sd 0.6",
        ),
        # 5 % of requests fail on both sides at random: censored at +inf, the true ratio of the
        # medians (failures counted as the slowest) is still 1.5.
        ("one run, 5 % failed requests (censored)", lambda: paired_coverage(2, trials, opts, 64, 1.5, fail=0.05), ""),
        (
            "3 repeats on fresh servers, 32 requests",
            lambda: paired_coverage(3, trials, opts, 32, 1.3, 3, AA_SD),
            f"offset sd {AA_SD}",
        ),
        (
            "one run, requests serially correlated in arrival order (AR(1) 0.6)",
            lambda: serially_correlated(trials, opts),
            "high load; widened by the lag-1 autocorrelation",
        ),
        ("one run, A/A spread added", lambda: one_run_with_aa_spread(trials, opts), "10 A/A comparisons"),
        (
            "3 repeats, one pair of servers, A/A spread added",
            lambda: repeats_shared_with_aa_spread(trials, opts),
            "10 A/A comparisons",
        ),
        # The report's other ratios (stats.RATIOS) and the acceptance length, each as the report computes it.
        ("p99 TPOT: one run, 128 requests", lambda: p99_coverage(trials, opts, 128), "a p99 verdict needs >= 100"),
        (
            "p99 TPOT censored: 128 requests, speculation fails 1",
            lambda: censored_p99(trials, opts, 1),
            f"truth {censored_truth(1.5, 0.99, 1 / 128):.3f} (failures as +inf)",
        ),
        (
            "p99 TPOT censored: 128 requests, speculation fails 2",
            lambda: censored_p99(trials, opts, 2),
            "truth 0: its p99 is a failure",
        ),
        (
            "median TTFT: one run, A/A spread added",
            lambda: ttft_with_aa_spread(trials, opts),
            f"offset sd {AA_TTFT_SD}; 10 A/A comparisons",
        ),
        (
            "median E2EL: 3 repeats on fresh servers, 32 requests",
            lambda: e2el_repeats(trials, opts),
            f"offset sd {AA_SD}; truth {e2el_truth():.3f}",
        ),
        (
            "throughput: 3 repeats on fresh servers, 64 requests",
            lambda: throughput_repeats(trials, opts),
            f"offset sd {AA_SD}; Student's t",
        ),
        (
            "acceptance length: one run, 64 requests",
            lambda: acceptance_interval(trials, opts),
            f"k={DRAFT_K}, alpha ~ Beta(7, 3); truth L {acceptance_truth():.3f}",
        ),
        ("predict: speedup at k=2 from k=0 and k=4", lambda: predict_interval(trials, opts), "model exact"),
        ("capacity boundary, 400 requests per probe", lambda: capacity_interval(trials, opts, 400), "p99"),
        ("crossing rate (where resolved)", lambda: crossing_interval(trials, opts), "truth 9.83 req/s"),
        (
            "break-even L: one server per L, shared baseline, A/A spread added",
            lambda: break_even_interval(trials, opts),
            f"S(L) = L / {BREAK_EVEN_COST}, L {BREAK_EVEN_LENGTHS[0]:g}-{BREAK_EVEN_LENGTHS[-1]:g}; truth 1.632",
        ),
        (
            "group: each of 2 categories x 32 requests, one run",
            lambda: group_coverage(21, trials, opts, "category", (1.5, 0.9), 32),
            "truths 1.5x and 0.9x; each category's own interval",
        ),
        (
            "group: each of 4 stretches of a trace x 12 requests, one run",
            lambda: group_coverage(22, trials, opts, "time", (1.5, 1.5, 0.9, 1.5), 12),
            "truths 1.5, 1.5, 0.9, 1.5x",
        ),
        *(
            (
                f"group failures: {count} {kind} x {per}, the {side} fails 20 % of the first",
                functools.partial(group_coverage, seed, trials, opts, kind, (1.0,) * count, per, (side, 0.2)),
                f"first group's truth {censored_truth(1.0, 0.5, 0.2, side):.3f} (failures as +inf), the others 1x",
            )
            for seed, kind, count, per, side in (
                (41, "category", 2, 32, "speculative"),
                (42, "category", 2, 32, "baseline"),
                (43, "time", 4, 12, "speculative"),
                (44, "time", 4, 12, "baseline"),
            )
        ),
    ]
    print("| interval (nominal 95 %) | covered [exact 95 % CI] | setting | status | s |")
    print("|---|---|---|---|---|")
    failures, notes = [], []
    experiments = [e for e in experiments if args.only in e[0]]
    for name, run, note in experiments:
        began = time.monotonic()
        hits, n, *attempted = run()
        if attempted:
            note = f"{note}; resolved in {n} of {attempted[0]} sweeps"
        text, ok, why = row(name, hits, n, note, trials, time.monotonic() - began)
        print(text, flush=True)
        if why:
            notes.append(why)
        if not ok:
            failures.append(name)
    # A sensitivity band, not a calibrated interval: shown, not gated.
    if args.only:  # a check of some rows: the sensitivity band and the hints are skipped
        for why in notes:
            print(f"- {why}")
        return _group_verdicts(trials, opts, failures, start)
    began = time.monotonic()
    hits, n = capacity_interval(max(1, trials // 4), opts, 100)
    print(
        f"| capacity boundary, 100 requests per probe (sensitivity band) | {hits}/{n} = {hits / n:.1%} | p99 "
        f"from 100 requests | not gated | {time.monotonic() - began:.1f} |"
    )
    for why in notes:
        print(f"- {why}")
    print()
    print("| hint (observed at a true 1.12x) | power at the named size and effect | at the true 1.12x | status | s |")
    print("|---|---|---|---|---|")
    for kind in HINTS:
        began = time.monotonic()
        hint, power, at_truth = hint_power(hints, sims, opts, kind)
        ok = power >= POWER_GOAL
        print(
            f"| {hint} | {power:.0%} | {at_truth:.0%} | {'ok' if ok else 'miss'} | {time.monotonic() - began:.1f} |",
            flush=True,
        )
        if not ok:
            failures.append(f"hint ({hint})")
    return _group_verdicts(trials, opts, failures, start)


def _group_verdicts(trials: int, opts: StatsOptions, failures: list[str], start: float) -> int:
    """The per-group families' false alarms and power, then the summary line and the exit code."""
    print()
    print("| group verdicts (one Benjamini-Hochberg family per point) | rate [exact 95 % CI] | goal | status | s |")
    print("|---|---|---|---|---|")
    for kind, label, per_group, groups in (
        ("category", "2 categories x 32", 32, 2),
        ("time", "4 stretches x 12", 12, 4),
    ):
        began = time.monotonic()
        null = group_calls(23, trials, opts, kind, (1.0,) * groups, per_group)
        alarms = sum(any(v in ("helps", "hurts") for v in calls) for calls in null)
        # 12 requests a stretch resolve less than 32 a category: the power is asked at 1.5x there.
        truths = (1.3, 1.0) if groups == 2 else (1.5, 1.0, 1.0, 1.0)
        found = sum(calls[0] == "helps" for calls in group_calls(24, trials, opts, kind, truths, per_group))
        for what, hits, goal, ok in (
            (
                f"{label}, all truths 1: any group called (false alarm per point)",
                alarms,
                "<= 5 %",
                alarms / trials <= 0.05,
            ),
            (f"{label}, one group {truths[0]:g}x: called helps (power)", found, ">= 80 %", found / trials >= 0.80),
        ):
            ci = scipy_stats.binomtest(hits, trials).proportion_ci(method="exact")
            print(
                f"| {what} | {hits}/{trials} = {hits / trials:.1%} [{ci.low:.1%}, {ci.high:.1%}] | {goal} | "
                f"{'ok' if ok else 'miss'} | {time.monotonic() - began:.1f} |",
                flush=True,
            )
            if not ok:
                failures.append(what)
    elapsed = time.monotonic() - start
    summary = f"all intervals within their coverage goals and all hints at >= {POWER_GOAL:.0%} power"
    print(f"stats_calibration: {'FAIL: ' + '; '.join(failures) if failures else 'ok: ' + summary} ({elapsed:.0f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
