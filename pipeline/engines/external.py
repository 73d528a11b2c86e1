"""Servers that already run (``engine=external``): measured as they are, never started or stopped.

A user who serves a model already has a baseline deployment and a speculative one; like
``vllm bench serve --base-url``, GuideLLM's ``--target`` and AIPerf's ``--url``, specsweep
then only sends the load. What it cannot do there is said, not guessed: it cannot see the
servers' processes (no RSS, no restart), it cannot reset their prefix caches unless they run
vLLM's dev mode, and behind a load balancer one replica's ``/metrics`` is not the window's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit

import httpx

from pipeline.config import SERVER_URL, ConfigError, EngineConfig, JobConfig
from pipeline.engines.acceptance import Acceptance, Scrape, WindowAcceptance
from pipeline.engines.base import Server, ServerError, ServerSpec
from pipeline.engines.engine import Target
from pipeline.engines.models import resolve_model
from pipeline.load.client import RequestRecord

# What the two URLs are called in the config, for messages.
ROLE_KEYS = {"speculative": "engine.url", "baseline": "engine.baseline_url"}


@dataclass(frozen=True)
class LoadLimit:
    """The load a sweep may send a running server without a yes (engine.external_ok_to_load)."""

    rate: float  # requests per second at the peak
    requests: int  # in all, warm-ups and probes included

    def holds(self, rate: float, requests: int) -> bool:
        return rate <= self.rate and requests <= self.requests

    @property
    def text(self) -> str:
        return f"{self.rate:g} req/s or {self.requests} requests"


# A production server shrugs this off: one request a second, a hundred in all.
SMALL_LOAD = LoadLimit(1.0, 100)


def url_problem(key: str, url: str | None) -> str | None:
    """Why ``url`` cannot be a server's address, or None. Pure, for the config check."""
    if not url:
        return f"engine=external needs {key}, the address of a running server, e.g. {key}=http://10.0.0.5:8000"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{key}={url!r} is not an http(s) address; e.g. {key}=http://10.0.0.5:8000"
    declared = SERVER_URL.problem(
        key, url
    )  # the declared rules (credentials, a port in range), which validate() applies first
    if declared:
        return declared
    if parts.query or parts.fragment or parts.path.rstrip("/") not in ("", "/v1"):
        return f"{key}={url!r}: give the server's root (http://host:port), without a path or query"
    return None


def root(url: str) -> str:
    """The server's root, as the OpenAI routes hang off it (a trailing /v1 is dropped)."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


@dataclass(frozen=True)
class ExternalInstall:
    """What the tags record of an external server's engine: its own /version where it serves one."""

    version: str
    distribution: str = "external"


def served_version(url: str, timeout_s: float = 10.0) -> str:
    """vLLM's ``/version`` (SGLang's ``/get_server_info`` carries ``version`` too), else "unknown"."""
    for path in ("/version", "/get_server_info"):
        try:
            response = httpx.get(root(url) + path, timeout=timeout_s, trust_env=False)
            if response.status_code == 200:
                version = response.json().get("version")
                if version:
                    return str(version)
        except (httpx.HTTPError, ValueError, AttributeError):
            continue
    return "unknown"


def check_server_reachable(key: str, url: str, timeout_s: float = 10.0) -> None:
    """Refuse a server that does not answer, naming the key; before anything is measured."""
    problem = _unhealthy(url, timeout_s)
    if problem:
        raise ConfigError(f"{key}={url} {problem}; start the server, or fix {key}")


def _unhealthy(url: str, timeout_s: float) -> str | None:
    # /health is vLLM's and SGLang's; an OpenAI-compatible proxy may serve only /v1/models.
    last = ""
    for path in ("/health", "/v1/models"):
        try:
            response = httpx.get(root(url) + path, timeout=timeout_s, trust_env=False)
        except httpx.HTTPError as exc:
            last = f"cannot be reached ({type(exc).__name__}: {exc})"
            continue
        if response.status_code == 200:
            return None
        last = f"answered GET {path} with HTTP {response.status_code}"
    return last


def external_spec(url: str, engine_version: str, log_path: Path) -> ServerSpec:
    """A :class:`ServerSpec` that names the server instead of a command to start it."""
    parts = urlsplit(url)
    return ServerSpec(
        engine="external",
        engine_version=engine_version,
        command=("external", root(url)),
        host=parts.hostname or "",
        port=parts.port or (443 if parts.scheme == "https" else 80),
        log_path=log_path,
        startup_timeout_s=30.0,
    )


class ExternalServer:
    """The :class:`~pipeline.engines.base.EngineServer` surface over a server someone else runs.

    Entering checks that it answers; leaving stops nothing. A "restart" after a fault only
    checks again that it answers, since its process is not ours to start.
    """

    def __init__(self, spec: ServerSpec, timeout_s: float = 10.0) -> None:
        self.spec = spec
        self.timeout_s = timeout_s
        self.startup_s: float | None = None  # not started here: no start-up time to record

    @property
    def base_url(self) -> str:
        return self.spec.command[1]

    def __enter__(self) -> ExternalServer:
        self.spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.spec.log_path.open("a") as log:  # the group's server.log says whose log this is not
            log.write(
                f"{time.strftime('%Y-%m-%dT%H:%M:%S')} external server {self.base_url}: not started by "
                f"specsweep, so its log is wherever its operator keeps it\n"
            )
        problem = _unhealthy(self.base_url, self.timeout_s)
        if problem:
            raise ServerError(f"the external server {self.base_url} {problem}")
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    def alive(self) -> bool:
        return True  # its process is not visible from here; healthy() is what can be checked

    def healthy(self, timeout_s: float = 10.0) -> bool:
        return _unhealthy(self.base_url, timeout_s) is None

    @property
    def returncode(self) -> int | None:
        return None

    def restart(self) -> None:
        self.__enter__()

    def rss_mib(self) -> float | None:
        return None

    def gpu_memory_mib(self) -> float | None:
        return None  # another machine's processes

    def niceness(self) -> int | None:
        return None

    def stop(self, grace_s: float | None = None) -> None:
        return None


def external_url(job: JobConfig) -> tuple[str, str]:
    """The config key and address of the running server a job of engine=external measures."""
    role = "baseline" if job.spec.method == "none" else "speculative"
    url = job.engine.baseline_url if role == "baseline" else job.engine.url
    assert url is not None  # validate() refused engine=external without both
    return ROLE_KEYS[role], url


class ExternalEngine:
    """Two servers that already run, behind the :class:`~pipeline.engines.engine.Engine` interface."""

    name = "external"
    label = "external"
    starts_servers = False
    per_position_counters = False
    endpoints = ("chat", "completions")
    no_prefix_cache_flag: str | None = None
    reset_path: str | None = None  # their caches are left as they are (prefix_cache=as_is)
    reset_hint = ""
    report_note: str | None = (
        "external servers: measured as they ran, not started here, so there is no start-up time, server memory "
        "or server log, and each server's version is what its /version answered"
    )
    emits_k_schedule = False  # its engine is not known here
    synthetic_acceptance = False  # its servers run as they were started: none of their settings is ours
    run_prefix = "external-"

    def check(self, job: JobConfig) -> None:
        """Two servers that already run are measured as they are: what would start, restart or
        reconfigure a server is refused, not ignored."""
        engine = job.engine
        for key in ("url", "baseline_url"):
            problem = url_problem(f"engine.{key}", getattr(engine, key))
            if problem:
                raise ConfigError(problem)
        if engine.url.rstrip("/") == engine.baseline_url.rstrip("/"):  # type: ignore[union-attr]
            raise ConfigError(
                "engine.url and engine.baseline_url are the same server; the baseline is the same model served "
                "without speculation, at its own address"
            )
        if job.spec.method == "none" or job.aa:
            raise ConfigError(
                "engine=external compares the speculative server at engine.url with engine.baseline_url; set spec "
                "to the method engine.url runs, e.g. spec=eagle3 spec.k=3 (aa=true needs two servers specsweep starts)"
            )
        if engine.prefix_cache not in ("as_is", "warm"):
            raise ConfigError(
                f"engine.prefix_cache={engine.prefix_cache} needs a cache reset or a server flag, which a server "
                f"that is not ours does not give; engine=external measures the cache as it is "
                f"(engine.prefix_cache=as_is), or warms both servers with each window's prompts first "
                f"(engine.prefix_cache=warm)"
            )
        ignored = [name for name in ("extra_args", "env", "env_from", "python") if getattr(engine, name)]
        if ignored:
            raise ConfigError(
                f"engine.{ignored[0]} configures a server specsweep starts; engine=external starts none, so it "
                f"would be ignored: remove it"
            )
        if job.repeats.restart:
            raise ConfigError("repeats.restart=true restarts servers, which engine=external cannot; set it to false")
        if job.engine.device == "gpu":
            raise ConfigError("engine.device=gpu picks the device of a server specsweep starts; remove it")

    def resolve(self, job: JobConfig, *, build: bool, plan_only: bool) -> Target:
        """Nothing to install or start. The model's tokenizer is still needed (prompt lengths,
        the lossless check), so model.id names what the servers serve and where its tokenizer
        is found. A dry run does not contact the servers."""
        key, url = external_url(job)
        version = "unknown, a dry run contacts no server"
        if not plan_only:
            check_server_reachable(key, url)
            version = served_version(url)
        return Target(
            ExternalInstall(version), False, resolve_model(job.model.id, build=build), None, job.model.revision
        )

    def server_spec(self, target: Target, job: JobConfig, log_path: Path, port: int) -> ServerSpec:
        return external_spec(external_url(job)[1], target.install.version, log_path)

    def server(self, spec: ServerSpec) -> Server:
        return ExternalServer(spec)

    def version_note(self, target: Target) -> str:
        return ""

    def resets_cache(self, engine: EngineConfig) -> bool:
        return False

    def window_acceptance(
        self, records: Sequence[RequestRecord], counters: Acceptance, after: Scrape, base_url: str
    ) -> WindowAcceptance:
        return WindowAcceptance.of_counters(counters)
