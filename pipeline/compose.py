"""From Hydra's composed config to a frozen :class:`~pipeline.config.JobConfig`, and back to a schema.

Hydra must mutate a config to apply overrides, so :func:`register_schema` stores unfrozen
twins of the schema's classes; the composed config is turned back into the frozen ones by
:func:`to_job_config`, and nothing past ``sweep.py`` sees a ``DictConfig``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from pipeline.config import ConfigError, JobConfig
from pipeline.schema import from_dict, mutable_twin
from pipeline.validate import validate


def paired_if_set(reference: Any) -> str:
    """``${paired_if_set:${gate.reference}}``: the gate's mode a config derives from its reference
    build, paired where one is named and the history mode where none is (sweeps/nightly.yaml)."""
    return "paired" if reference else "history"


def register_schema() -> None:
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("paired_if_set", paired_if_set, replace=True)

    ConfigStore.instance().store(name="specsweep_schema", node=mutable_twin(JobConfig))


def to_job_config(cfg: Any) -> JobConfig:
    """Convert Hydra's composed config once, at the entry point, and validate it."""
    from omegaconf import OmegaConf

    # Hydra's own node is left out: outside a running job some of it is still unset.
    own = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    values = OmegaConf.to_container(own, resolve=True, throw_on_missing=True)
    assert isinstance(values, dict)
    job = from_dict(JobConfig, values)
    job = resolve_trace_rate(job)
    validate(job)
    return job


def resolve_trace_rate(job: JobConfig) -> JobConfig:
    """A trace point's mean request rate, fixed once here, before any plan: the rate a sweep
    asks for (the trace scaled to it), or with ``load.request_rate=null`` the trace's own (its
    slice's mean rate over ``workload.time_scale``). Reading the trace here refuses a bad one
    before anything starts. Everything past this point sees a number."""
    from pipeline.load import traces

    load, workload = job.load, job.workload
    if workload.name != "trace":
        if load.request_rate is None:
            raise ConfigError("load.request_rate=null replays a trace on its own timestamps: it needs workload=trace")
        if workload.think_time_s is not None:
            raise ConfigError("workload.think_time_s paces a trace's conversations: it needs workload=trace")
        return job
    _check_trace_settings(job)
    rate = traces.with_rate(workload, load.request_rate)
    replayed = traces.load_replay(workload, None)
    chats = sum(bool(line.messages) for line in replayed.lines)
    if (replayed.conversations or chats) and workload.endpoint != "chat":
        # The completions and generate endpoints take one text: the history would be dropped, and
        # the chat template with it; the chat endpoint applies the server's own template, once.
        what = (
            "conversations, whose turns carry their history as chat messages"
            if replayed.conversations
            else f"{chats} line(s) of chat messages"
        )
        raise ConfigError(
            f"the trace holds {what}; workload.endpoint={workload.endpoint} sends one text "
            f"without the chat template and would drop all but the last message: use workload.endpoint=chat"
        )
    over = traces.over_context(replayed.lines, job.engine.max_model_len, workload.max_tokens)
    if over:
        raise ConfigError(traces.over_context_text(over, job.engine.max_model_len, "input_length"))
    if replayed.conversations:
        if load.client_workers > 1:
            raise ConfigError(
                f"the trace holds conversations, whose turns wait for each other's answers in one client; "
                f"load.client_workers={load.client_workers} splits them: use load.client_workers=1"
            )
    return dataclasses.replace(job, load=dataclasses.replace(load, request_rate=rate))


def _check_trace_settings(job: JobConfig) -> None:
    """What a trace keeps for itself (its arrivals, its length), and its slice and time scale."""
    from pipeline.load import traces

    load, workload = job.load, job.workload
    think = workload.think_time_s
    if think is not None and (not think >= 0 or math.isinf(think)):
        raise ConfigError(f"workload.think_time_s={think} must be a number of seconds >= 0 (or null: the trace's own)")
    if load.burstiness != 1.0:
        raise ConfigError(
            f"load.burstiness={load.burstiness} shapes generated arrivals; a trace keeps its own (its bursts and "
            f"lulls): remove load.burstiness (use load=poisson with workload=trace)"
        )
    if load.duration_s is not None:
        raise ConfigError("load.duration_s does not apply to a trace; slice it with workload.start_s and duration_s")
    if load.request_rate is not None and workload.time_scale != 1.0:
        raise ConfigError(
            f"load.request_rate={load.request_rate} and workload.time_scale={workload.time_scale} both set the "
            f"trace's speed; keep one (load.request_rate=null replays at the time scale)"
        )
    if workload.timestamp_unit not in (*traces.TIMESTAMP_UNITS, "auto"):
        raise ConfigError(
            f"workload.timestamp_unit={workload.timestamp_unit!r} is not valid; choose one of: auto, s, ms"
        )
    if not (workload.time_scale > 0) or math.isinf(workload.time_scale):
        raise ConfigError(f"workload.time_scale={workload.time_scale} must be a positive number (0.5: twice as fast)")
    if not workload.start_s >= 0 or (workload.duration_s is not None and not workload.duration_s > 0):
        raise ConfigError("workload.start_s must be >= 0 and workload.duration_s > 0 (or null: to the trace's end)")
