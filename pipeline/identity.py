"""What identifies a point and a server, derived from the roles the schema declares.

A point's hash is what resume and the regression gate's history match on; a server key says
which jobs can share one server. Both are read off :class:`pipeline.config.Role`, marked on
each field where it is declared, so a new field is placed by its declaration and not by a list
kept here. Pure: imports only the schema.

The hash has a version (:data:`HASH_VERSION`, recorded on each point run). Version 1 was the
whole config less four hand-kept lists; it still named ``engine.startup_timeout_s`` and
``engine.python``, which do not change what is measured. :func:`point_hash_v1` computes it
as it was, frozen, so that a store written before version 2 keeps resuming and keeps its gate
history: each new point run also records its version-1 hash as an alias.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeVar

from pipeline.config import ADDED, ROLE, JobConfig, LoadConfig, Role

HASH_VERSION = 2
# Tags on each point run: its hash's version, and (version 2 on) the version-1 hash it had.
HASH_VERSION_TAG = "point_hash.version"
ALIAS_V1_TAG = "point_hash.v1"
# In a table of finished points keyed by hash, a version-1 run's key (its hash cannot be
# translated to version 2 without its config, which MLflow holds only as flattened params).
V1_PREFIX = "v1:"

T = TypeVar("T")
IDENTITY = (Role.SERVER, Role.POINT)
SERVER = (Role.SERVER, Role.SERVER_ONLY)


def _digest(values: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _role(field: dataclasses.Field[Any]) -> Role | None:
    return field.metadata.get(ROLE)


def roles(cls: type = JobConfig, prefix: str = "") -> Iterator[tuple[str, Role | None]]:
    """Every setting's dotted name and role; a section without a role is walked into."""
    for field in dataclasses.fields(cls):
        name = f"{prefix}{field.name}"
        role = _role(field)
        section = field.default_factory if field.default_factory is not dataclasses.MISSING else None
        kind = type(section()) if section is not None else None
        if role is None and kind is not None and dataclasses.is_dataclass(kind):
            yield from roles(kind, f"{name}.")
        else:
            yield name, role


def _values(obj: Any, wanted: tuple[Role, ...]) -> dict[str, Any]:
    """The fields of ``obj`` whose role is wanted, as nested dicts (sections walked into); a
    setting added since version 2 only where it is not at its default."""
    out: dict[str, Any] = {}
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        role = _role(field)
        if field.metadata.get(ADDED) and value == getattr(type(obj)(), field.name):
            continue
        if role is None and dataclasses.is_dataclass(value):
            inner = _values(value, wanted)
            if inner:
                out[field.name] = inner
        elif role in wanted:
            out[field.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return out


def sweep_level() -> tuple[str, ...]:
    """The top-level settings a grid may not vary: one value for the whole sweep."""
    return tuple(f.name for f in dataclasses.fields(JobConfig) if _role(f) is Role.SWEEP)


def point_hash(job: JobConfig) -> str:
    """Identifies a measured point (its server's settings, its load and workload), for resume
    and the gate: every SERVER and POINT setting, and nothing else. A window is identified by
    the requests it sends: ``load.min_duration_s`` enters as the ``num_requests`` it makes, so a
    window it leaves as it was keeps the hash it had before the setting existed, and one it
    lengthens gets the hash of that many requests."""
    return _digest(_values(_window_as_sent(job), IDENTITY))


def _window_as_sent(job: JobConfig) -> JobConfig:
    load = job.load
    if load.duration_s is not None:
        return job
    default = LoadConfig().min_duration_s
    sent = dataclasses.replace(load, num_requests=load.requests_in_window, min_duration_s=default)
    return dataclasses.replace(job, load=sent)


def server_key(job: JobConfig) -> str:
    """Jobs with equal keys can be measured on one server."""
    key = _values(job, SERVER)
    # cold and warm are applied per window on one server; only off changes its command.
    key["engine"]["prefix_cache"] = job.engine.prefix_cache == "off"
    key.pop("repeat", None)
    if job.repeats.restart:  # a fresh server for each repeat (otherwise they share one)
        key["repeat"] = job.repeat
    return _digest(key)


def point_key(job: JobConfig) -> str:
    """A point without its repeat index: the repeats of one point share this key."""
    return point_hash(dataclasses.replace(job, repeat=0))


def setting_key(job: JobConfig) -> str:
    """A point without its k, rate and repeat: the points of one curve share this key, and
    nothing that differs otherwise (workload, temperature, draft, options) is pooled."""
    spec = dataclasses.replace(job.spec, k=0)
    load = dataclasses.replace(job.load, request_rate=0.0)
    return point_hash(dataclasses.replace(job, repeat=0, spec=spec, load=load))


def hash_tags(job: JobConfig) -> dict[str, str]:
    """What a point run records of its identity besides ``point_hash``."""
    alias = point_hash_v1(job)
    return {HASH_VERSION_TAG: str(HASH_VERSION), **({ALIAS_V1_TAG: alias} if alias else {})}


def recorded_hash(tags: Mapping[str, str]) -> str:
    """A run's hash as a key of this version: its own, or ``v1:<hash>`` where it predates
    version 2 (recorded no version); :func:`translate` maps those to this version's."""
    found = tags.get("point_hash", "")
    return found if tags.get(HASH_VERSION_TAG) or not found else V1_PREFIX + found


def translate(key: str, aliases: dict[str, str]) -> str:
    """A recorded key in this version's terms, where a point of this sweep had that alias."""
    return aliases.get(key.removeprefix(V1_PREFIX), key) if key.startswith(V1_PREFIX) else key


def aliases_of(jobs: Iterable[JobConfig]) -> dict[str, str]:
    """Version-1 hash -> this version's, for the points of this sweep that have one."""
    return {alias: point_hash(j) for j in jobs if (alias := point_hash_v1(j))}


def in_this_version(found: Mapping[str, T], jobs: Iterable[JobConfig]) -> dict[str, T]:
    """Records keyed by :func:`recorded_hash`, re-keyed by these jobs' hashes of this version;
    a record of this version wins over a version-1 one of the same point."""
    aliases = aliases_of(jobs)
    out = {translate(k, aliases): v for k, v in found.items() if k.startswith(V1_PREFIX)}
    return out | {k: v for k, v in found.items() if not k.startswith(V1_PREFIX)}


# --- Version 1, frozen: the settings it knew and the lists it left out -----------------------

# Every key the schema had when version 1 was last written, by section (top-level settings
# under ""). A key added since is left out at its default, and a point that sets one has no
# version-1 hash: no run before version 2 can have measured it.
_V1_KNOWN = {
    "": (
        "engine",
        "model",
        "spec",
        "load",
        "workload",
        "slo",
        "tracking",
        "sweep_name",
        "seed",
        "output_dir",
        "dry_run",
        "force",
        "repeats",
        "repeat",
        "stats",
        "aa",
        "replica",
        "lossless",
        "ray",
        "gate",
        "search",
        "predict",
        "capacity",
        "verbose",
        "progress_every_s",
    ),
    "engine": (
        "name",
        "device",
        "host",
        "dtype",
        "max_model_len",
        "enforce_eager",
        "tensor_parallel_size",
        "prefix_cache",
        "startup_timeout_s",
        "restart_on_crash",
        "cpu_kvcache_gib",
        "python",
        "extra_args",
        "env",
        "env_from",
        "allow_remote",
        "url",
        "baseline_url",
    ),
    "model": ("id", "revision"),
    "spec": ("method", "k", "draft_model", "options"),
    "load": (
        "request_rate",
        "burstiness",
        "num_requests",
        "duration_s",
        "max_concurrency",
        "warmup_requests",
        "request_timeout_s",
        "client_workers",
        "max_error_rate",
        "window_timeout_s",
    ),
    "workload": (
        "name",
        "path",
        "endpoint",
        "max_tokens",
        "ignore_eos",
        "temperature",
        "random_input_len",
        "random_output_len",
        "random_range_ratio",
        "timestamp_unit",
        "time_scale",
        "start_s",
        "duration_s",
        "sort",
        "think_time_s",
    ),
    "slo": ("ttft_ms", "tpot_ms", "e2el_ms", "percentile", "min_goodput"),
}
_V1_LEFT_OUT = (
    "output_dir",
    "tracking",
    "sweep_name",
    "dry_run",
    "force",
    "ray",
    "repeats",
    "lossless",
    "stats",
    "aa",
    "gate",
    "search",
    "predict",
    "capacity",
    "verbose",
    "progress_every_s",
)
_V1_NOT_MEASURED = (
    ("slo", "percentile"),
    ("slo", "min_goodput"),
    ("load", "max_error_rate"),
    ("load", "window_timeout_s"),
    ("engine", "restart_on_crash"),
)
_V1_AT_DEFAULT_LEFT_OUT = (
    ("engine", "allow_remote", False),
    ("engine", "env_from", []),
    ("workload", "timestamp_unit", "auto"),
    ("workload", "time_scale", 1.0),
    ("workload", "start_s", 0.0),
    ("workload", "duration_s", None),
    ("workload", "sort", False),
    ("workload", "think_time_s", None),
    ("engine", "url", None),
    ("engine", "baseline_url", None),
    ("model", "revision", None),
)


def _drop_unknown(values: dict[str, Any], defaults: dict[str, Any], known: tuple[str, ...]) -> bool:
    """Remove the keys version 1 did not know; False where one of them is set."""
    for key in [k for k in values if k not in known]:
        if values.pop(key) != defaults[key]:
            return False
    return True


def point_hash_v1(job: JobConfig) -> str | None:
    """The hash version 1 gave this point; None where the point sets a key added since (a
    window that load.min_duration_s lengthens counts as its num_requests, as in point_hash)."""
    point, defaults = dataclasses.asdict(_window_as_sent(job)), dataclasses.asdict(JobConfig())
    if not _drop_unknown(point, defaults, _V1_KNOWN[""]):
        return None
    for section, known in _V1_KNOWN.items():
        if section and not _drop_unknown(point[section], defaults[section], known):
            return None
    for key in _V1_LEFT_OUT:
        point.pop(key)
    for section, key in _V1_NOT_MEASURED:
        point[section].pop(key)
    for section, key, default in _V1_AT_DEFAULT_LEFT_OUT:
        if point[section][key] == default:
            point[section].pop(key)
    return _digest(point)
