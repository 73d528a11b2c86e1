"""What one server of a sweep runs, and what one point sends to it.

Everything that can be refused (engine install, device, methods, model paths) is checked in
:func:`resolve_target`, which the driver calls for every server before any of them starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from pipeline.config import JobConfig
from pipeline.engines import sglang, vllm
from pipeline.engines.base import ServerSpec
from pipeline.engines.external import ROLE_KEYS, ExternalInstall, check_reachable, external_spec, served_version
from pipeline.engines.hardware import gpu_names, resolve_device
from pipeline.engines.models import cache_root, resolve_model
from pipeline.engines.process import free_port
from pipeline.load import traces
from pipeline.load.items import Request, Tokenizer
from pipeline.load.loadgen import schedule
from pipeline.load.workloads import split_warmup, to_requests
from pipeline.run.plan import WARMUP_MAX_TOKENS


@dataclass(frozen=True)
class Target:
    """What every server of a job runs: the engine install, the device, the model paths."""

    install: vllm.VllmInstall | sglang.SglangInstall | ExternalInstall
    on_gpu: bool
    model_path: str
    draft_path: str | None
    model_revision: str | None = None  # model.revision: a hub model's pinned commit

    def engine_gpus(self, job: JobConfig) -> int:
        """GPUs the server takes; a draft model shares the target's GPUs in vLLM."""
        return job.engine.tensor_parallel_size if self.on_gpu else 0


def resolve_target(job: JobConfig, *, build: bool = True, plan_only: bool = False) -> Target:
    """Check the engine, device and models. ``build=False`` names embedded models unbuilt, and
    plans an SGLang server even where SGLang cannot run. ``plan_only`` (a dry run) plans
    engine.device=gpu servers from a machine without a GPU, as for a cluster's GPU nodes: the
    device and the engine build are then not checked here."""
    if job.engine.name == "external":
        return _external_target(job, build=build, plan_only=plan_only)
    planned_gpu = plan_only and job.engine.device == "gpu" and not gpu_names()
    on_gpu = True if planned_gpu else resolve_device(job.engine.device)
    install: vllm.VllmInstall | sglang.SglangInstall | ExternalInstall
    if job.engine.name == "sglang":
        install = sglang.detect_install(job.engine.python, required=build)
        if build:
            sglang.validate_engine(job.engine, install, on_gpu, python_given=job.engine.python is not None)
        sglang.validate_spec(job.spec, install)
    else:
        install = vllm.detect_install(job.engine.python)
        if not planned_gpu:  # this machine's build is not the GPU nodes'
            vllm.validate_engine(job.engine, install, on_gpu)
        vllm.validate_spec(job.spec, install.version)
    model_path = resolve_model(job.model.id, build=build)
    draft = job.spec.draft_model
    draft_path = resolve_model(draft, target=model_path, build=build) if draft else None
    return Target(install, on_gpu, model_path, draft_path, job.model.revision)


def external_url(job: JobConfig) -> tuple[str, str]:
    """The config key and address of the running server a job of engine=external measures."""
    role = "baseline" if job.spec.method == "none" else "speculative"
    url = job.engine.baseline_url if role == "baseline" else job.engine.url
    assert url is not None  # validate() refused engine=external without both
    return ROLE_KEYS[role], url


def _external_target(job: JobConfig, *, build: bool, plan_only: bool) -> Target:
    """Two running servers: nothing to install or start. The model's tokenizer is still needed
    (prompt lengths, the lossless check), so model.id names what the servers serve and where
    its tokenizer is found. A dry run does not contact the servers."""
    key, url = external_url(job)
    version = "unknown, a dry run contacts no server"
    if not plan_only:
        check_reachable(key, url)
        version = served_version(url)
    return Target(ExternalInstall(version), False, resolve_model(job.model.id, build=build), None, job.model.revision)


@dataclass(frozen=True)
class PointRequests:
    """What a point sends: warm-up prompts, measured prompts, and when each is due."""

    warmup: tuple[Request, ...]
    requests: tuple[Request, ...]
    offsets: tuple[float, ...]  # seconds from the window start
    metrics: dict[str, float] = field(default_factory=dict)  # what the point records of its load's source


def point_requests(job: JobConfig, tokenizer: Tokenizer | None) -> PointRequests:
    if job.workload.name == "trace":
        return _trace_requests(job, tokenizer)
    seed = job.seed + job.repeat  # a repeat draws new prompts and arrivals
    offsets = schedule(job.load, seed)
    warmup, requests = split_warmup(job.workload, len(offsets), job.load.warmup_requests, seed, tokenizer)
    # Warm-up exercises the code paths (prefill, decode, drafting); a few tokens do that.
    capped = tuple(replace(r, max_tokens=min(r.max_tokens, WARMUP_MAX_TOKENS)) for r in warmup)
    return PointRequests(capped, tuple(requests), tuple(offsets))


def _trace_requests(job: JobConfig, tokenizer: Tokenizer | None) -> PointRequests:
    """A trace's slice on its own schedule, scaled to the point's mean rate (compose.py fixed
    it). Every repeat replays the same requests at the same offsets. The warm-up sends the
    slice's last prompts; under the default cold policy the cache is reset after it."""
    replayed = traces.load_replay(job.workload, job.load.request_rate)
    requests = to_requests(traces.items(replayed, tokenizer), job.workload, tokenizer)
    # A warm-up request stands alone: a conversation's turn is sent as its user text only.
    warmup = [
        replace(r.alone(), index=i, max_tokens=min(r.max_tokens, WARMUP_MAX_TOKENS))
        for i, r in enumerate(requests[::-1][: job.load.warmup_requests])
    ]
    metrics = {
        "trace_requests": float(len(requests)),
        "trace_mean_rate": replayed.own_mean_rate,  # the slice's own, before scaling
        "trace_peak_rate": replayed.own_peak_rate,  # its busiest 10 s, per second
        "trace_scale": replayed.scale,  # offsets = trace seconds x this
        "trace_synthetic": float(replayed.synthetic),
        "trace_sorted_lines": float(replayed.sorted_lines),
        "trace_conversations": float(replayed.conversations),
    }
    return PointRequests(tuple(warmup), tuple(requests), replayed.offsets, metrics)


def server_spec(target: Target, job: JobConfig, log_path: Path, port: int | None = None) -> ServerSpec:
    if isinstance(target.install, ExternalInstall):
        return external_spec(external_url(job)[1], target.install.version, log_path)
    port = free_port(job.engine.host) if port is None else port
    common = {
        "engine": job.engine,
        "spec": job.spec,
        "model_path": target.model_path,
        "draft_path": target.draft_path if job.spec.method != "none" else None,
        "served_name": job.model.id,
        "port": port,
        "seed": job.seed,
        "model_revision": job.model.revision,
    }
    if isinstance(target.install, sglang.SglangInstall):
        launch = sglang.build_launch(install=target.install, **common)
    else:
        launch = vllm.build_launch(install=target.install, on_gpu=target.on_gpu, cache_dir=cache_root(), **common)
    return ServerSpec(
        engine=job.engine.name,
        engine_version=str(target.install.version),
        command=tuple(launch.command),
        host=job.engine.host,
        port=port,
        log_path=log_path,
        startup_timeout_s=job.engine.startup_timeout_s,
        env=launch.env,
        env_from=tuple(job.engine.env_from),
    )
