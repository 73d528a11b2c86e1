"""The engines by name (``engine.name``): the only place that maps a name to its behaviour."""

from __future__ import annotations

from pipeline.config import ConfigError, JobConfig
from pipeline.engines.engine import Engine
from pipeline.engines.external import ExternalEngine
from pipeline.engines.sglang import SglangEngine
from pipeline.engines.vllm import VllmEngine

ENGINES: dict[str, Engine] = {e.name: e for e in (VllmEngine(), SglangEngine(), ExternalEngine())}


def engine_named(name: str) -> Engine:
    try:
        return ENGINES[name]
    except KeyError:
        raise ConfigError(f"engine={name} is not an engine; choose one of {sorted(ENGINES)}") from None


def engine_of(job: JobConfig) -> Engine:
    return engine_named(job.engine.name)


def report_note(name: str) -> str | None:
    """What the report says of a recorded run's engine (None: nothing, or a name no engine has now)."""
    engine = ENGINES.get(name)
    return engine.report_note if engine else None


def emits_k_schedule(name: str) -> bool:
    engine = ENGINES.get(name)
    return bool(engine and engine.emits_k_schedule)


def starts_servers(name: str) -> bool:
    """Whether specsweep starts this engine's servers (False: servers that already run; a
    recorded name no engine has now counts as started)."""
    engine = ENGINES.get(name)
    return engine.starts_servers if engine else True
