"""The checks that refuse a config before anything runs: each error names the key and the fix.

Every declared rule (:class:`pipeline.config.Valid`), then what settings mean together. What
an engine refuses of a job is its own (:meth:`pipeline.engines.engine.Engine.check`, called
here); what needs its install, device or models is checked when the driver resolves it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

from pipeline.config import (
    NEEDS_DRAFT_MODEL,
    REFUSES_DRAFT_MODEL,
    VALID,
    ConfigError,
    EngineConfig,
    JobConfig,
    SweepSettings,
    Valid,
    stats_problem,
)
from pipeline.engines import synthetic
from pipeline.engines.registry import ENGINES
from pipeline.redact import SECRET_FLAGS, flag_name, is_secret_name


def _choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not valid; choose one of: {', '.join(choices)}")


def declared(section: Any, prefix: str = "") -> Iterator[tuple[str, Any, Valid]]:
    """Every setting that declares its valid values (config.Valid), with its dotted key."""
    for field in dataclasses.fields(section):
        value = getattr(section, field.name)
        if dataclasses.is_dataclass(value):
            yield from declared(value, f"{prefix}{field.name}.")
        elif VALID in field.metadata:
            yield f"{prefix}{field.name}", value, field.metadata[VALID]


def validate(job: JobConfig) -> None:
    """Each setting against what it declares, then what settings mean together."""
    _choice("engine.name", job.engine.name, tuple(ENGINES))
    for key, value, valid in declared(job):
        problem = valid.problem(key, value)
        if problem:
            raise ConfigError(problem)
    _validate_together(job)
    _validate_exposure(job.engine)
    _validate_revision(job.model.id, job.model.revision)
    ENGINES[job.engine.name].check(job)  # what is the engine's own to refuse
    _validate_search(job)
    _validate_paired_gate(job)


def _validate_together(job: JobConfig) -> None:
    _validate_engine_use(job)
    _validate_method(job)
    _validate_load_shape(job)
    _validate_sweep_wide(job)


def _validate_engine_use(job: JobConfig) -> None:
    """What the engine serves and how it is started, against the workload."""
    engine, workload = job.engine, job.workload
    serving = ENGINES[engine.name]
    no_cache_flag = serving.no_prefix_cache_flag
    if engine.prefix_cache != "off" and no_cache_flag and no_cache_flag in engine.extra_args:
        raise ConfigError(
            f"engine.prefix_cache={engine.prefix_cache} needs prefix caching, but engine.extra_args turns it "
            f"off ({no_cache_flag}); remove the flag and set engine.prefix_cache=off"
        )
    if workload.endpoint not in serving.endpoints:
        raise ConfigError(
            f"workload.endpoint={workload.endpoint} is not served by {serving.label} (generate is SGLang's native "
            f"API); with engine={engine.name} use {' or '.join(serving.endpoints)}"
        )
    if engine.max_model_len < workload.max_tokens + 1:
        raise ConfigError(
            f"engine.max_model_len={engine.max_model_len} leaves no room for workload.max_tokens={workload.max_tokens}"
        )


def _validate_method(job: JobConfig) -> None:
    spec, serving = job.spec, ENGINES[job.engine.name]
    if spec.method != "none" and spec.k < 1:
        raise ConfigError(f"spec.k={spec.k} is not valid: speculation drafts at least 1 token per step; use spec.k>=1")
    if spec.method in NEEDS_DRAFT_MODEL and not spec.draft_model and serving.starts_servers:
        hint = (
            "embedded:smollm2-135m-l4, self, a folder or a hub id"
            if spec.method == "draft"
            else "a folder or hub id of the head"
        )
        example = {"draft": "spec=draft", "eagle3": "spec=eagle3 (the embedded model's head)"}.get(
            spec.method, "spec.draft_model=/path/to/the/head"
        )
        raise ConfigError(f"spec.method={spec.method} needs spec.draft_model ({hint}); e.g. {example}")
    problem = synthetic.problem(spec)  # vLLM's own rules, before any server starts
    if problem:
        raise ConfigError(problem)
    if synthetic.is_synthetic(spec) and not serving.synthetic_acceptance:
        raise ConfigError(
            f"spec.synthetic_acceptance_* is vLLM's synthetic rejection sampling, which engine={job.engine.name} "
            f"cannot run ({serving.label}); use engine=vllm, or leave spec.synthetic_acceptance_* unset"
        )
    if spec.method in REFUSES_DRAFT_MODEL and spec.draft_model:
        raise ConfigError(
            f"spec.method={spec.method} takes no spec.draft_model; remove it or use spec.method=draft. To sweep "
            f"{spec.method} beside a method with a draft, put the draft in that method's own group "
            f"(conf/spec/<name>.yaml with draft_model: ..., docs/methods.md), not on the command line"
        )


def _validate_load_shape(job: JobConfig) -> None:
    load = job.load
    if load.duration_s is not None and math.isinf(load.request_rate):
        raise ConfigError("load.duration_s needs a finite load.request_rate; for closed loop use load.num_requests")
    if load.max_concurrency is not None and load.client_workers > 1:
        # Split into per-worker caps, one worker's free slot could not take another's
        # queued request: the cap would not be vLLM's one global --max-concurrency.
        raise ConfigError(
            f"load.max_concurrency={load.max_concurrency} with load.client_workers={load.client_workers}: a "
            f"concurrency cap needs one client process; set load.client_workers=1 (a capped load rarely needs more)"
        )


def _validate_sweep_wide(job: JobConfig) -> None:
    spec = job.spec
    problem = stats_problem(job.stats.confidence, job.stats.floor, job.stats.resamples)
    if problem:
        raise ConfigError(problem)
    if job.aa and spec.method != "none":
        raise ConfigError(
            f"aa=true compares two servers without speculation; set spec=none (got spec.method={spec.method})"
        )
    for name, amount in job.ray.resources_per_group.items():
        if not isinstance(amount, (int, float)) or not amount > 0:
            raise ConfigError(f"ray.resources_per_group.{name}={amount!r} must be a positive number, e.g. 1")
    asked_gpus = job.ray.resources_per_group.get("GPU")
    tp = job.engine.tensor_parallel_size
    if asked_gpus is not None and job.engine.device != "cpu" and asked_gpus < tp:
        raise ConfigError(
            f"ray.resources_per_group.GPU={asked_gpus:g} is fewer than the {tp} GPUs a server with "
            f"engine.tensor_parallel_size={tp} takes; leave GPU out (each group then asks for its server's GPUs) "
            f"or set ray.resources_per_group.GPU={tp}"
        )


def is_loopback(host: str) -> bool:
    import ipaddress

    try:
        return host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _validate_exposure(engine: EngineConfig) -> None:
    """Nothing reachable from other hosts, and no secret in a config, unless asked for."""

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
    flags = [a for a in engine.extra_args if flag_name(a) in SECRET_FLAGS]
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


def _validate_revision(model_id: str, revision: str | None) -> None:
    """model.revision pins a hub model; a folder's or the embedded model's files are their own revision."""
    from pathlib import Path

    if revision is None:
        return
    if not revision or any(c.isspace() for c in revision):
        raise ConfigError(
            f"model.revision={revision!r} is not a revision; give a commit, tag or branch, e.g. "
            "model.revision=0e9e39f249a16976918f6564b8830bc894c89659"
        )
    local = model_id.startswith(("embedded:", "/", "./", "../", "~")) or Path(model_id).expanduser().exists()
    if local:
        raise ConfigError(
            f"model.revision pins a hub model's commit; model.id={model_id} is local, and its files are its "
            "revision (the gate keys on a digest of them): remove model.revision"
        )


# What a reference build may change: how its servers run, never what the pairs measure (and not
# the engine, method or k, which name the point a pair is matched by).
REFERENCE_KEYS = ("engine.", "model.", "spec.draft_model", "spec.options")
NOT_IN_REFERENCE = ("engine.name", "engine.url", "engine.baseline_url")
SECONDARY_METRICS = ("p99_tpot_ms", "median_ttft_ms", "output_throughput")


def _validate_paired_gate(job: JobConfig) -> None:
    gate = job.gate
    unknown = [m for m in gate.gated if m not in SECONDARY_METRICS]
    if unknown:
        raise ConfigError(f"gate.gated={unknown} names no secondary metric; choose from {', '.join(SECONDARY_METRICS)}")
    if not gate.paired:
        if gate.reference:
            raise ConfigError("gate.reference is the paired gate's reference build: set gate.mode=paired with it")
        return
    if not gate.enabled:
        raise ConfigError("gate.mode=paired is the regression gate's design: set gate.enabled=true")
    from pipeline.run.search.kinds import SEARCHES

    pairable = SEARCHES[job.search].pairable
    if not pairable or job.aa or job.repeats.count > 1 or not ENGINES[job.engine.name].starts_servers:
        raise ConfigError(
            "gate.mode=paired measures the grid on fresh servers of both builds, gate.pairs times each: use "
            "search=grid, leave aa and repeats.count at their defaults, and an engine specsweep starts"
        )
    _validate_pairs(gate.pairs, gate.detect, gate.alpha, gate.decision_floor)
    stray = [
        o
        for o in gate.reference
        if not o.lstrip("+").startswith(REFERENCE_KEYS) or o.lstrip("+").startswith(NOT_IN_REFERENCE)
    ]
    if stray:
        raise ConfigError(
            f"gate.reference {stray} would change what the pairs measure; a reference build may change only "
            f"how its servers run: keys under {', '.join(REFERENCE_KEYS)} (e.g. engine.python=/opt/prev/bin/python)"
        )
    from pipeline.schema import apply_overrides

    # A key that does not exist, or a value of the wrong type, is refused here; so is a reference
    # build that would be refused as a sweep of its own.
    reference = apply_overrides(job, gate.reference)
    validate(dataclasses.replace(reference, gate=dataclasses.replace(reference.gate, mode="history", reference=[])))
    # The overrides are logged as the sweep's gate.reference param: no secret may be among them.
    for override in gate.reference:
        key, _, value = override.lstrip("+").partition("=")
        if value and (is_secret_name(key) or any(flag_name(a) in SECRET_FLAGS for a in value.strip("[]").split(","))):
            raise ConfigError(
                f"gate.reference sets {key} to a secret, which the sweep's params would keep; export it in the "
                f"environment and pass it by name (engine.env_from) in the reference instead"
            )


def _validate_pairs(pairs: int, detect: float, alpha: float, floor: float) -> None:
    """Fewer than four pairs see only large slowdowns: refused unless gate.detect says so."""
    from pipeline.analysis import paired

    if pairs >= paired.FEWEST_PAIRS:
        return
    seen = paired.design_detectable(pairs, alpha, floor)
    spread = f"the pair spread real nights measured here ({math.expm1(paired.PLANNED_SPREAD[0]):.1%})"
    if seen is None:
        raise ConfigError(
            f"gate.pairs={pairs} cannot see a slowdown under 10x at {spread}: use gate.pairs>={paired.FEWEST_PAIRS}"
        )
    if detect < seen:
        enough = math.ceil(seen * 100) / 100
        raise ConfigError(
            f"gate.pairs={pairs} detects a slowdown of {seen:.0%} with {paired.DESIGN_POWER:.0%} power at {spread}, "
            f"not gate.detect={detect:g}: use gate.pairs>={paired.FEWEST_PAIRS}, or set gate.detect={enough:.2f} "
            "to say what this design can see"
        )


def _validate_search(job: JobConfig) -> None:
    """One job's search settings, by its search (SearchKind.check); what needs the whole grid
    (two k values) is checked by the planner."""
    from pipeline.run.search.kinds import SEARCHES

    cap = job.capacity
    if not 0 < cap.min_rate <= cap.start_rate:
        raise ConfigError(f"capacity.min_rate={cap.min_rate} must lie in (0, capacity.start_rate={cap.start_rate}]")
    SEARCHES[job.search].check(job, SweepSettings.of([job]))
