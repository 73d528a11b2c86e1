"""Config schema and validation: the one place where Hydra's values become typed records.

The schema is written once, as frozen dataclasses. Hydra must mutate a config to apply
overrides, so :func:`register_schema` stores unfrozen twins of these classes; the composed
config is turned back into the frozen ones by :func:`to_job_config`, and nothing past
``sweep.py`` sees a ``DictConfig``.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any

SPEC_METHODS = ("none", "ngram", "draft", "eagle", "eagle3", "medusa", "mtp", "suffix")
DEVICES = ("auto", "cpu", "gpu")
ENDPOINTS = ("chat", "completions", "generate")  # generate: SGLang's native streaming endpoint
ENGINES = ("vllm", "sglang")
DTYPES = ("auto", "bfloat16", "float16", "float32")
PREFIX_CACHE_POLICIES = ("cold", "warm", "off")
VLLM_RESULT_MODES = ("off", "summary", "detailed")  # pipeline/vllm_result.py
# grid: measure every point; predict: measure the baseline and the largest k, predict the
# other k and confirm the best; capacity: the highest rate each server sustains under the SLO.
SEARCH_MODES = ("grid", "predict", "capacity")
# Flags that turn prefix caching off behind engine.prefix_cache's back.
NO_PREFIX_CACHE_FLAGS = {"vllm": "--no-enable-prefix-caching", "sglang": "--disable-radix-cache"}


class ConfigError(ValueError):
    """A config that cannot run; the message names the key, the valid choices and the fix."""


@dataclass(frozen=True)
class EngineConfig:
    name: str = "vllm"
    device: str = "auto"  # auto detects a GPU; cpu and gpu force one
    host: str = "127.0.0.1"
    dtype: str = "bfloat16"
    max_model_len: int = 2048
    # None: eager on CPU, where compiling costs ~100 s of start-up; compiled on GPU.
    enforce_eager: bool | None = None
    tensor_parallel_size: int = 1
    # The prefix-cache state every measured window starts from, the same on both servers:
    # cold empties the cache before the window; warm empties it, then sends the window's
    # prompts once, unmeasured (what a user sees re-running a benchmark on a warm server);
    # off runs the server without prefix caching.
    prefix_cache: str = "cold"
    startup_timeout_s: float = 600.0
    # A server that dies or hangs during a window fails that point; restart it for the rest.
    restart_on_crash: bool = True
    cpu_kvcache_gib: int = 2
    # Interpreter of the environment the engine is installed in (default: this one).
    python: str | None = None
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    # Variables the server gets from this process's environment, by name: how secrets (an HF
    # token, an API key) reach it without being written into a config, an output or MLflow.
    env_from: list[str] = field(default_factory=list)
    # engine.host other than loopback must be asked for: the server then runs without vLLM's
    # dev mode (its endpoints can reset caches and more), so prefix-cache resets are skipped.
    allow_remote: bool = False


@dataclass(frozen=True)
class ModelConfig:
    # embedded:NAME (built from a PyPI package), a local folder, or a hub id.
    id: str = "embedded:smollm2-135m"


@dataclass(frozen=True)
class SpecConfig:
    method: str = "ngram"
    k: int = 3  # draft tokens per step (vLLM num_speculative_tokens)
    # embedded:NAME, a folder, a hub id, or "self" for the target as its own draft.
    draft_model: str | None = None
    # Extra keys for the engine's speculative config, e.g. prompt_lookup_max for ngram.
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LoadConfig:
    request_rate: float = 1.0  # requests per second; inf sends every request at once
    burstiness: float = 1.0  # gamma shape of inter-arrival times; 1.0 is Poisson
    num_requests: int = 16
    # Instead of num_requests: every arrival due within this many seconds (finite rates).
    duration_s: float | None = None
    # Cap on requests in flight; with request_rate=inf this is closed-loop load.
    max_concurrency: int | None = None
    warmup_requests: int = 2
    request_timeout_s: float = 300.0
    # Client processes sharing the schedule, for rates one process cannot send on time.
    client_workers: int = 1
    # Stop a window early: once min 10 requests finished, more than this share of them failed
    # (the point fails, saying why); null runs every window to its end.
    max_error_rate: float | None = None
    # Seconds from a window's start after which its unfinished requests are abandoned and the
    # point fails as a hung server (restarted with engine.restart_on_crash); null: no deadline
    # beyond each request's own load.request_timeout_s.
    window_timeout_s: float | None = None


@dataclass(frozen=True)
class WorkloadConfig:
    # Bundled: code_edit, summarize, chat, qa, mixed. Files: sharegpt, spec_bench, jsonl
    # (set path). Or random, with the length settings below.
    name: str = "code_edit"
    path: str | None = None
    endpoint: str = "chat"
    max_tokens: int = 128  # the cap on every request's output length
    ignore_eos: bool = False
    temperature: float = 0.0
    random_input_len: int = 256
    random_output_len: int = 128
    random_range_ratio: float = 0.0  # lengths drawn uniformly in len × [1 - ratio, 1 + ratio]


@dataclass(frozen=True)
class SloConfig:
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None
    # search=capacity: a window meets the SLO when this percentile of each set metric is within
    # its threshold and at least min_goodput of its requests meet every threshold.
    percentile: float = 99.0
    min_goodput: float = 0.99


@dataclass(frozen=True)
class TrackingConfig:
    # None: a SQLite store under the project's mlruns/.
    uri: str | None = None
    experiment: str | None = None  # default: the sweep name
    # Each point also as a `vllm bench serve` result JSON (vllm_result.json): off, summary, or
    # detailed (with --save-detailed's per-request arrays).
    vllm_result: str = "summary"


@dataclass(frozen=True)
class LosslessConfig:
    # After its points, each server answers these prompts one at a time at temperature 0;
    # the report compares each speculative server's outputs with its baseline's. 0 skips it.
    prompts: int = 4
    max_tokens: int = 64


@dataclass(frozen=True)
class RayConfig:
    # None: start a local Ray; "auto" or host:port joins a running cluster.
    address: str | None = None
    connect_timeout_s: float = 30.0  # an unreachable address fails after this long
    # What each server group asks of a node, e.g. {specsweep_slot: 1} on CPU nodes started
    # with that custom resource, or {GPU: 1}. Empty: one GPU per engine rank on GPU machines,
    # and on CPU-only machines the groups run one at a time. Set, the groups run concurrently,
    # as many as the nodes offer.
    resources_per_group: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class GateConfig:
    """The regression gate at the end of a sweep (python -m pipeline.gate runs it later)."""

    enabled: bool = False  # judge this sweep against its reference when it ends
    history: int = 5  # the reference: the per-point median of the last this-many runs
    confirm: bool = False  # re-measure flagged points once on a fresh server; one sighting is "suspect"
    skip_if_done: bool = False  # skip when this engine version already ran this sweep's fingerprint
    floor_median: float = 0.05  # practical floors: a ratio must be past these to count
    floor_p99: float = 0.10
    floor_acceptance_pp: float = 2.0  # percentage points of acceptance rate


@dataclass(frozen=True)
class PredictConfig:
    """search=predict: how many predicted k values are measured to confirm the choice."""

    # Each confirmed k costs one server start; candidates beyond the cap are reported, not measured.
    max_confirm: int = 1


@dataclass(frozen=True)
class CapacityConfig:
    """search=capacity: bracketing, then bisection on the request rate, on one server."""

    start_rate: float = 1.0  # the first probe, requests per second
    min_rate: float = 0.1  # below this the search gives up: "cannot meet this SLO at 0.1 req/s"
    resolution: float = 0.1  # stop when the bracket's high / low - 1 is at most this
    max_probes: int = 8  # windows per server at the most


@dataclass(frozen=True)
class RepeatsConfig:
    # Measure every point this many times, each with new prompts and arrivals (seed + repeat).
    count: int = 1
    # A fresh server for each repeat, so that the spread between server starts is measured
    # rather than assumed; false: the repeats share their server (cheaper, narrower spread).
    restart: bool = False


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
    engine: EngineConfig = field(default_factory=EngineConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    spec: SpecConfig = field(default_factory=SpecConfig)
    load: LoadConfig = field(default_factory=LoadConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    sweep_name: str = "default"
    seed: int = 0
    output_dir: str = "outputs"
    dry_run: bool = False  # print the servers, their exact commands and a time estimate; start nothing
    force: bool = False  # re-measure points that an earlier run of this sweep finished
    repeats: RepeatsConfig = field(default_factory=lambda: RepeatsConfig())
    repeat: int = 0  # set by the sweep for each repeat; not a setting
    stats: StatsConfig = field(default_factory=lambda: StatsConfig())
    # A/A: pair each baseline server with a second, identical one compared as if it were
    # speculative (spec.method=none only); the report gives the noise floor of this setup.
    aa: bool = False
    replica: int = 0  # set by the sweep: 1 for the A/A twin server; not a setting
    lossless: LosslessConfig = field(default_factory=LosslessConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    search: str = "grid"  # grid | predict | capacity (see SEARCH_MODES)
    predict: PredictConfig = field(default_factory=PredictConfig)
    capacity: CapacityConfig = field(default_factory=CapacityConfig)
    verbose: bool = False  # true: MLflow's download bars, library notices and the like reach the terminal
    progress_every_s: float = 10.0  # off a terminal (CI, ray job logs): a progress line this often

    def baseline(self) -> JobConfig:
        """The same point without speculation: what this job is compared against."""
        return dataclasses.replace(self, spec=SpecConfig(method="none", k=0))


# ---- Hydra bridge -------------------------------------------------------------------

_MUTABLE: dict[type, type] = {}


def _mutable_twin(cls: type) -> type:
    """An unfrozen copy of a frozen schema class, nested classes included."""
    if cls in _MUTABLE:
        return _MUTABLE[cls]
    hints = typing.get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            twin = _mutable_twin(hint)
            fields.append((f.name, twin, field(default_factory=twin)))
        elif f.default_factory is not dataclasses.MISSING:
            fields.append((f.name, hint, field(default_factory=f.default_factory)))
        else:
            fields.append((f.name, hint, field(default=f.default)))
    _MUTABLE[cls] = dataclasses.make_dataclass(cls.__name__, fields)
    return _MUTABLE[cls]


# Set by the sweeper for each job it launches: the server group that job runs. Not part of
# JobConfig, since it says how a job was launched, not what is measured.
GROUP_FILE_KEY = "group_file"


def register_schema() -> None:
    from hydra.core.config_store import ConfigStore

    root = dataclasses.make_dataclass(
        "SpecsweepRoot", [(GROUP_FILE_KEY, str | None, field(default=None))], bases=(_mutable_twin(JobConfig),)
    )
    ConfigStore.instance().store(name="specsweep_schema", node=root)


def from_dict(cls: type, values: dict[str, Any], path: str = "") -> Any:
    """Build a frozen schema record from plain values, rejecting unknown keys."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join(path + k for k in unknown)}; valid keys: {sorted(names)}")
    kwargs = {}
    for name, value in values.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint) and isinstance(value, dict):
            value = from_dict(hint, value, f"{path}{name}.")
        kwargs[name] = value
    return cls(**kwargs)


def to_job_config(cfg: Any) -> JobConfig:
    """Convert Hydra's composed config once, at the entry point, and validate it."""
    from omegaconf import OmegaConf

    # Hydra's own node is left out: outside a running job some of it is still unset.
    own = OmegaConf.masked_copy(cfg, [k for k in cfg if k not in ("hydra", GROUP_FILE_KEY)])
    values = OmegaConf.to_container(own, resolve=True, throw_on_missing=True)
    assert isinstance(values, dict)
    job = from_dict(JobConfig, values)
    validate(job)
    return job


# ---- Validation (engine-independent; engines add their own checks) --------------------


def _choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not valid; choose one of: {', '.join(choices)}")


def validate(job: JobConfig) -> None:
    spec, load, engine, workload = job.spec, job.load, job.engine, job.workload
    _choice("engine.name", engine.name, ENGINES)
    _choice("spec.method", spec.method, SPEC_METHODS)
    _choice("engine.device", engine.device, DEVICES)
    _choice("engine.dtype", engine.dtype, DTYPES)
    _choice("workload.endpoint", workload.endpoint, ENDPOINTS)
    _choice("engine.prefix_cache", engine.prefix_cache, PREFIX_CACHE_POLICIES)
    _choice("tracking.vllm_result", job.tracking.vllm_result, VLLM_RESULT_MODES)
    if not job.progress_every_s > 0:
        raise ConfigError(f"progress_every_s={job.progress_every_s} must be > 0 (seconds between progress lines)")
    no_cache_flag = NO_PREFIX_CACHE_FLAGS.get(engine.name)
    if engine.prefix_cache != "off" and no_cache_flag in engine.extra_args:
        raise ConfigError(
            f"engine.prefix_cache={engine.prefix_cache} needs prefix caching, but engine.extra_args turns it "
            f"off ({no_cache_flag}); remove the flag and set engine.prefix_cache=off"
        )
    _validate_exposure(engine)
    if workload.endpoint == "generate" and engine.name != "sglang":
        raise ConfigError("workload.endpoint=generate is SGLang's native API; with engine=vllm use chat or completions")
    if spec.method != "none" and spec.k < 1:
        raise ConfigError(f"spec.k={spec.k} is not valid: speculation drafts at least 1 token per step; use spec.k>=1")
    if spec.method in ("draft", "eagle", "eagle3", "medusa") and not spec.draft_model:
        hint = (
            "embedded:smollm2-135m-l4, self, a folder or a hub id"
            if spec.method == "draft"
            else "a folder or hub id of the head"
        )
        raise ConfigError(f"spec.method={spec.method} needs spec.draft_model ({hint}); e.g. spec=draft")
    if spec.method in ("none", "ngram", "suffix", "mtp") and spec.draft_model:
        raise ConfigError(f"spec.method={spec.method} takes no spec.draft_model; remove it or use spec.method=draft")
    if not (load.request_rate > 0):
        raise ConfigError(f"load.request_rate={load.request_rate} must be > 0 (use inf to send all at once)")
    if not (load.burstiness > 0) or math.isinf(load.burstiness):
        raise ConfigError(f"load.burstiness={load.burstiness} must be a positive number (1.0 is Poisson)")
    if load.num_requests < 1:
        raise ConfigError(f"load.num_requests={load.num_requests} must be >= 1")
    if load.duration_s is not None:
        if not load.duration_s > 0 or math.isinf(load.duration_s):
            raise ConfigError(f"load.duration_s={load.duration_s} must be a positive number of seconds or null")
        if math.isinf(load.request_rate):
            raise ConfigError("load.duration_s needs a finite load.request_rate; for closed loop use load.num_requests")
    if load.max_concurrency is not None and load.max_concurrency < 1:
        raise ConfigError(f"load.max_concurrency={load.max_concurrency} must be >= 1 or null")
    if load.client_workers < 1:
        raise ConfigError(f"load.client_workers={load.client_workers} must be >= 1")
    if load.max_concurrency is not None and load.client_workers > 1:
        # Split into per-worker caps, one worker's free slot could not take another's
        # queued request: the cap would not be vLLM's one global --max-concurrency.
        raise ConfigError(
            f"load.max_concurrency={load.max_concurrency} with load.client_workers={load.client_workers}: a "
            f"concurrency cap needs one client process; set load.client_workers=1 (a capped load rarely needs more)"
        )
    if load.max_error_rate is not None and not 0 <= load.max_error_rate < 1:
        raise ConfigError(f"load.max_error_rate={load.max_error_rate} must lie in [0, 1), e.g. 0.5, or null")
    if load.window_timeout_s is not None and not load.window_timeout_s > 0:
        raise ConfigError(f"load.window_timeout_s={load.window_timeout_s} must be a positive number of seconds or null")
    if load.warmup_requests < 0:
        raise ConfigError(f"load.warmup_requests={load.warmup_requests} must be >= 0")
    if load.request_timeout_s <= 0:
        raise ConfigError(f"load.request_timeout_s={load.request_timeout_s} must be > 0")
    if not 0 <= workload.random_range_ratio < 1:
        raise ConfigError(f"workload.random_range_ratio={workload.random_range_ratio} must be in [0, 1)")
    if workload.random_input_len < 1 or workload.random_output_len < 1:
        raise ConfigError("workload.random_input_len and workload.random_output_len must be >= 1")
    if workload.max_tokens < 1:
        raise ConfigError(f"workload.max_tokens={workload.max_tokens} must be >= 1")
    if engine.max_model_len < workload.max_tokens + 1:
        raise ConfigError(
            f"engine.max_model_len={engine.max_model_len} leaves no room for workload.max_tokens={workload.max_tokens}"
        )
    if job.repeats.count < 1:
        raise ConfigError(f"repeats.count={job.repeats.count} must be >= 1")
    problem = stats_problem(job.stats.confidence, job.stats.floor, job.stats.resamples)
    if problem:
        raise ConfigError(problem)
    if job.aa and spec.method != "none":
        raise ConfigError(
            f"aa=true compares two servers without speculation; set spec=none (got spec.method={spec.method})"
        )
    if job.lossless.prompts < 0 or job.lossless.max_tokens < 1:
        raise ConfigError("lossless.prompts must be >= 0 and lossless.max_tokens >= 1")
    if job.ray.connect_timeout_s <= 0:
        raise ConfigError(f"ray.connect_timeout_s={job.ray.connect_timeout_s} must be > 0")
    for name, amount in job.ray.resources_per_group.items():
        if not isinstance(amount, (int, float)) or not amount > 0:
            raise ConfigError(f"ray.resources_per_group.{name}={amount!r} must be a positive number, e.g. 1")
    gate = job.gate
    if gate.history < 1:
        raise ConfigError(f"gate.history={gate.history} must be >= 1 (the number of past runs in the reference)")
    for key in ("floor_median", "floor_p99"):
        if not 0 <= getattr(gate, key) < 1:
            raise ConfigError(f"gate.{key}={getattr(gate, key)} must lie in [0, 1), e.g. 0.05 for 5 %")
    if not 0 <= gate.floor_acceptance_pp < 100:
        raise ConfigError(f"gate.floor_acceptance_pp={gate.floor_acceptance_pp} must lie in [0, 100)")
    for key in ("ttft_ms", "tpot_ms", "e2el_ms"):
        value = getattr(job.slo, key)
        if value is not None and value <= 0:
            raise ConfigError(f"slo.{key}={value} must be > 0 or null")
    if not 0 < job.slo.percentile <= 100:
        raise ConfigError(f"slo.percentile={job.slo.percentile} must lie in (0, 100], e.g. 99 for p99")
    if not 0 < job.slo.min_goodput <= 1:
        raise ConfigError(f"slo.min_goodput={job.slo.min_goodput} must lie in (0, 1], e.g. 0.99")
    _validate_search(job)


def is_loopback(host: str) -> bool:
    import ipaddress

    try:
        return host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _validate_exposure(engine: EngineConfig) -> None:
    """Nothing reachable from other hosts, and no secret in a config, unless asked for."""
    from pipeline.redact import SECRET_FLAGS, is_secret_name

    if not is_loopback(engine.host) and not engine.allow_remote:
        raise ConfigError(
            f"engine.host={engine.host} makes the server reachable from other machines; bind 127.0.0.1, or set "
            f"engine.allow_remote=true to mean it (vLLM then runs without its dev-mode endpoints, and the "
            f"prefix-cache resets they serve are skipped)"
        )
    for name, value in engine.env.items():
        if is_secret_name(name) and value:
            raise ConfigError(
                f"engine.env.{name} puts a secret into the config, which outputs and logs would keep; export "
                f"{name} in the environment and pass engine.env_from=[{name}] instead"
            )
    flags = [a for a in engine.extra_args if a.split("=", 1)[0] in SECRET_FLAGS]
    if flags:
        raise ConfigError(
            f"engine.extra_args holds {flags[0].split('=', 1)[0]} with its value, which outputs and logs would "
            f"keep; vLLM reads VLLM_API_KEY from its environment: export it and pass engine.env_from=[VLLM_API_KEY]"
        )
    import os

    for name in engine.env_from:
        if not name.isidentifier():
            raise ConfigError(f"engine.env_from entry {name!r} is not a variable name; e.g. engine.env_from=[HF_TOKEN]")
        if name not in os.environ:
            raise ConfigError(f"engine.env_from names {name}, which this environment does not set; export {name}=...")


def _validate_search(job: JobConfig) -> None:
    """One job's search settings; what needs the whole grid (two k values) is checked by the planner."""
    _choice("search", job.search, SEARCH_MODES)
    if job.predict.max_confirm < 0:
        raise ConfigError(f"predict.max_confirm={job.predict.max_confirm} must be >= 0 (0 measures no prediction)")
    cap = job.capacity
    if not (0 < cap.start_rate < math.inf):
        raise ConfigError(f"capacity.start_rate={cap.start_rate} must be a positive, finite rate, e.g. 1")
    if not 0 < cap.min_rate <= cap.start_rate:
        raise ConfigError(f"capacity.min_rate={cap.min_rate} must lie in (0, capacity.start_rate={cap.start_rate}]")
    if not 0 < cap.resolution < 1:
        raise ConfigError(f"capacity.resolution={cap.resolution} must lie in (0, 1), e.g. 0.1 for 10 %")
    if cap.max_probes < 2:
        raise ConfigError(f"capacity.max_probes={cap.max_probes} must be >= 2 (a bracket needs two probes)")
    if job.search == "capacity":
        slo = job.slo
        if slo.ttft_ms is None and slo.tpot_ms is None and slo.e2el_ms is None:
            raise ConfigError(
                "search=capacity needs an SLO to search under; set at least one of slo.ttft_ms, slo.tpot_ms, "
                "slo.e2el_ms, e.g. slo.tpot_ms=50"
            )
        if job.repeats.count > 1 or job.aa:
            raise ConfigError("search=capacity measures each server once; drop repeats.count and aa")
        if job.gate.enabled:
            raise ConfigError("search=capacity probes adaptive rates that no reference shares; set gate.enabled=false")
    if job.search == "predict":
        from pipeline.analysis.predict import VALIDATED_METHODS

        if job.spec.method not in ("none", *VALIDATED_METHODS):
            raise ConfigError(
                f"search=predict is validated for spec.method in {', '.join(VALIDATED_METHODS)} only (chain drafters "
                f"whose k-draft is the start of a longer one); spec.method={job.spec.method} needs search=grid"
            )
        if job.engine.name != "vllm":
            raise ConfigError(
                f"search=predict reads vLLM's per-position acceptance counters; engine={job.engine.name} needs "
                "search=grid (SGLang's trees with topk > 1 break the prefix property it rests on)"
            )
        if job.workload.temperature > 0:
            raise ConfigError(
                f"search=predict is validated for greedy decoding only; workload.temperature="
                f"{job.workload.temperature} needs search=grid or workload.temperature=0"
            )
        if job.aa:
            raise ConfigError("search=predict compares speculative k values; aa=true needs search=grid")
