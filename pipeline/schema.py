"""The schema as data: the frozen records' mutable twins for OmegaConf, records from plain values,
and overrides of a finished record, as a command line gives them.

``gate.reference`` names the paired gate's reference build as overrides
(``engine.python=/opt/prev/bin/python``): the sweep's own settings with a few changed. They are
applied through the same typed schema Hydra composes with, so a key that does not exist and a
value of the wrong type are refused as on the command line, before anything starts.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from dataclasses import field
from typing import Any

from pipeline.config import ConfigError, JobConfig

_MUTABLE: dict[type, type] = {}


def mutable_twin(cls: type) -> type:
    """An unfrozen copy of a frozen schema class, nested classes included."""
    if cls in _MUTABLE:
        return _MUTABLE[cls]
    hints = typing.get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            twin = mutable_twin(hint)
            fields.append((f.name, twin, field(default_factory=twin)))
        elif f.default_factory is not dataclasses.MISSING:
            fields.append((f.name, hint, field(default_factory=f.default_factory)))
        else:
            fields.append((f.name, hint, field(default=f.default)))
    _MUTABLE[cls] = dataclasses.make_dataclass(cls.__name__, fields)
    return _MUTABLE[cls]


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


def apply_overrides(job: JobConfig, overrides: Sequence[str], what: str = "gate.reference") -> JobConfig:
    """``job`` with each ``key=value`` applied (``+key=value`` adds a key to a mapping such as
    engine.env); values are read as YAML and typed by the schema, as Hydra reads them."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    cfg = OmegaConf.merge(OmegaConf.structured(mutable_twin(JobConfig)), dataclasses.asdict(job))
    for override in overrides:
        key, sep, text = override.partition("=")
        if not sep or not key.lstrip("+"):
            raise ConfigError(
                f"{what}: {override!r} is not key=value, e.g. {what}=[engine.python=/opt/prev/bin/python]"
            )
        adding, key = key.startswith("+"), key.lstrip("+")
        if not adding and OmegaConf.select(cfg, key, default=KeyError) is KeyError:
            raise ConfigError(f"{what}: {key} is not a setting of the sweep's config; check its spelling")
        try:
            OmegaConf.update(cfg, key, yaml.safe_load(text) if text else "", merge=False, force_add=adding)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"{what}: {override!r} cannot be applied: {str(exc).splitlines()[0]}") from exc
    values = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(values, dict)
    return from_dict(JobConfig, values)
