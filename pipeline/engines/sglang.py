"""SGLang: from a job's settings to the exact ``sglang.launch_server`` command.

Our methods map onto ``--speculative-algorithm``: eagle -> EAGLE, eagle3 -> EAGLE3,
draft -> STANDALONE (with ``--speculative-draft-model-path``), ngram -> NGRAM (with its
``--speculative-ngram-*`` options), mtp -> NEXTN. k is ``--speculative-num-steps``; the tree
is ``--speculative-eagle-topk`` and ``--speculative-num-draft-tokens`` (method options), which
default to SGLang's documented chain: topk 1 and draft tokens = steps + 1.

Which flags exist is asked of the installed SGLang's own argument parser, in the engine's
interpreter. Where that parser cannot be imported (PyPI's SGLang needs CUDA to import), the
flags recorded below for SGLang 0.5.23 are used, and the command says so.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from pipeline.config import ConfigError, EngineConfig, JobConfig, SpecConfig
from pipeline.engines.acceptance import Acceptance, Scrape, WindowAcceptance
from pipeline.engines.base import EngineServer, Server, ServerSpec
from pipeline.engines.engine import (
    EngineNotInstalled,
    LaunchPlan,
    Target,
    check_extra_args,
    check_own_servers,
    launch_args,
    planned_device,
    resolve_models,
    run_probe,
)
from pipeline.engines.sglang_acceptance import server_info, sglang_acceptance
from pipeline.load.client import RequestRecord

NAME = "sglang"
LABEL = "SGLang"
ALGORITHMS = {"eagle": "EAGLE", "eagle3": "EAGLE3", "draft": "STANDALONE", "ngram": "NGRAM", "mtp": "NEXTN"}
NEEDS_DRAFT_PATH = ("eagle", "eagle3", "draft")
# spec.options key -> flag. Tree shape for every method; the ngram cache for NGRAM.
TREE_OPTIONS = {"eagle_topk": "--speculative-eagle-topk", "num_draft_tokens": "--speculative-num-draft-tokens"}
NGRAM_OPTIONS = {
    "min_match_window_size": "--speculative-ngram-min-match-window-size",
    "max_match_window_size": "--speculative-ngram-max-match-window-size",
    "min_bfs_breadth": "--speculative-ngram-min-bfs-breadth",
    "max_bfs_breadth": "--speculative-ngram-max-bfs-breadth",
    "match_type": "--speculative-ngram-match-type",
    "branch_length": "--speculative-ngram-branch-length",
    "capacity": "--speculative-ngram-capacity",
}
# The flags this adapter emits, recorded for SGLang 0.5.23: the speculative flags and
# --enable-metrics as listed for that version when SGLang 0.5.23 was installed; the names of the individual
# --speculative-ngram-* flags and of the base flags from SGLang's documentation
# (docs/advanced_features/speculative_decoding.md, server_arguments.md), not from 0.5.23's --help.
RECORDED_VERSION = Version("0.5.23")
RECORDED_FLAGS = frozenset(
    {
        "--model-path",
        "--served-model-name",
        "--host",
        "--port",
        "--dtype",
        "--context-length",
        "--random-seed",
        "--tp-size",
        "--enable-metrics",
        "--disable-radix-cache",
        "--speculative-algorithm",
        "--speculative-draft-model-path",
        "--speculative-num-steps",
        *TREE_OPTIONS.values(),
        *NGRAM_OPTIONS.values(),
    }
)
RECORDED_ALGORITHMS = frozenset(ALGORITHMS.values())
COMMON_ENV = {"DO_NOT_TRACK": "1"}


@dataclass(frozen=True)
class SglangInstall:
    python: str
    version: Version
    flags: frozenset[str]
    algorithms: frozenset[str]
    flags_source: str  # "parser" (asked the installed SGLang) or "recorded" (RECORDED_VERSION)
    installed: bool = True
    distribution: str = "sglang"


# Runs in the engine's interpreter: the version always, the parser's flags where it imports.
_PROBE = """
import argparse, importlib.metadata as m, json
out = {"version": None, "flags": None, "algorithms": None}
try:
    out["version"] = m.version("sglang")
    from sglang.srt.server_args import ServerArgs
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    out["flags"] = sorted(o for a in parser._actions for o in a.option_strings)
    for a in parser._actions:
        if "--speculative-algorithm" in a.option_strings and a.choices:
            out["algorithms"] = sorted(a.choices)
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def recorded(python: str, installed: bool, version: Version = RECORDED_VERSION) -> SglangInstall:
    return SglangInstall(python, version, RECORDED_FLAGS, RECORDED_ALGORITHMS, "recorded", installed)


def parse_probe(python: str, found: dict) -> SglangInstall:
    if not found.get("version"):
        raise EngineNotInstalled(
            f"SGLang is not installed for {python}. PyPI's sglang runs on CUDA GPUs: in an environment of its own, "
            f"`pip install sglang`, then set engine.python to that environment's interpreter; or use engine=vllm"
        )
    try:
        version = Version(found["version"])
    except InvalidVersion as exc:
        raise EngineNotInstalled(f"cannot read the version of sglang: {found['version']!r}") from exc
    if not found.get("flags"):  # installed, but its parser needs what this machine lacks (CUDA)
        return recorded(python, True, version)
    algorithms = frozenset(found.get("algorithms") or RECORDED_ALGORITHMS)
    return SglangInstall(python, version, frozenset(found["flags"]), algorithms, "parser")


def detect_install(python: str | None = None, *, required: bool = True) -> SglangInstall:
    """The engine interpreter's SGLang; ``required=False`` (dry runs) falls back to the record."""
    python = python or sys.executable
    found = run_probe(python, _PROBE)
    if not found.get("version") and not required:
        return recorded(python, installed=False)
    return parse_probe(python, found)


def validate_engine(engine: EngineConfig, install: SglangInstall, on_gpu: bool, *, python_given: bool) -> None:
    if not on_gpu and not python_given:
        raise ConfigError(
            "engine=sglang needs a CUDA GPU: PyPI's SGLang has no CPU path. On this machine use engine=vllm, "
            "or set engine.python to an interpreter whose SGLang runs here"
        )


def validate_spec(spec: SpecConfig, install: SglangInstall) -> None:
    """Refuse, before launch, what this SGLang cannot run or what contradicts itself."""
    if spec.method == "none":
        return
    if spec.method not in ALGORITHMS:
        raise ConfigError(
            f"SGLang has no method {spec.method!r}; choose one of: none, {', '.join(ALGORITHMS)} (or use engine=vllm)"
        )
    algorithm = ALGORITHMS[spec.method]
    if algorithm not in install.algorithms:
        raise ConfigError(
            f"spec.method={spec.method} needs --speculative-algorithm {algorithm}, which SGLang {install.version} "
            f"lacks (it has: {', '.join(sorted(install.algorithms))}); upgrade SGLang or pick another method"
        )
    allowed = set(TREE_OPTIONS) | (set(NGRAM_OPTIONS) if spec.method == "ngram" else set())
    unknown = sorted(set(spec.options) - allowed)
    if unknown:
        raise ConfigError(
            f"spec.options {unknown} are not SGLang options for {spec.method}; valid: {sorted(allowed)}. "
            f"(vLLM's prompt_lookup_* become SGLang's min/max_match_window_size.)"
        )
    topk, draft_tokens = tree_shape(spec)
    if topk < 1 or draft_tokens < 2:
        raise ConfigError(f"spec.options eagle_topk={topk} and num_draft_tokens={draft_tokens} must be >= 1 and >= 2")
    if topk == 1 and draft_tokens != spec.k + 1:
        raise ConfigError(
            f"spec.options.num_draft_tokens={draft_tokens} conflicts with spec.k={spec.k} at eagle_topk=1: a chain "
            f"of {spec.k} steps verifies {spec.k + 1} tokens (SGLang's rule); drop num_draft_tokens or set it to "
            f"{spec.k + 1}, or raise eagle_topk for a tree"
        )
    if topk > 1 and draft_tokens > topk * spec.k + 1:
        raise ConfigError(
            f"spec.options.num_draft_tokens={draft_tokens} exceeds what {spec.k} steps of top-{topk} can propose "
            f"({topk * spec.k + 1}); lower it or raise spec.k"
        )


def tree_shape(spec: SpecConfig) -> tuple[int, int]:
    """(topk, draft tokens): SGLang's chain by default, draft tokens = steps + 1."""
    topk = int(spec.options.get("eagle_topk", 1))
    return topk, int(spec.options.get("num_draft_tokens", spec.k + 1))


def speculative_args(spec: SpecConfig, draft_path: str | None) -> list[str]:
    if spec.method == "none":
        return []
    topk, draft_tokens = tree_shape(spec)
    args = ["--speculative-algorithm", ALGORITHMS[spec.method]]
    if spec.method in NEEDS_DRAFT_PATH and draft_path is not None:
        args += ["--speculative-draft-model-path", draft_path]
    args += ["--speculative-num-steps", str(spec.k)]
    args += ["--speculative-eagle-topk", str(topk), "--speculative-num-draft-tokens", str(draft_tokens)]
    if spec.method == "ngram":
        for key, flag in NGRAM_OPTIONS.items():
            if key in spec.options:
                args += [flag, str(spec.options[key])]
    return args


def build_launch(
    *,
    install: SglangInstall,
    engine: EngineConfig,
    spec: SpecConfig,
    model_path: str,
    draft_path: str | None,
    served_name: str,
    port: int,
    seed: int,
    model_revision: str | None = None,
) -> LaunchPlan:
    cmd = [
        install.python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        model_path,
        "--served-model-name",
        served_name,
        "--host",
        engine.host,
        "--port",
        str(port),
        "--dtype",
        engine.dtype,
        "--context-length",
        str(engine.max_model_len),
        "--random-seed",
        str(seed),
        "--enable-metrics",
    ]
    if model_revision:
        cmd += ["--revision", model_revision]
    if engine.tensor_parallel_size != 1:
        cmd += ["--tp-size", str(engine.tensor_parallel_size)]
    if engine.prefix_cache == "off":
        cmd.append("--disable-radix-cache")
    cmd += speculative_args(spec, draft_path)
    missing = sorted({a for a in cmd if a.startswith("--")} - install.flags)
    if missing:
        raise ConfigError(
            f"SGLang {install.version} has no {', '.join(missing)} (asked its {install.flags_source} flags); "
            f"upgrade SGLang, or drop the setting that needs it"
        )
    cmd += list(engine.extra_args)
    env = dict(COMMON_ENV) | dict(engine.env)
    return LaunchPlan(command=cmd, env=env)


class SglangEngine:
    """SGLang behind the :class:`~pipeline.engines.engine.Engine` interface."""

    name = "sglang"
    label = "SGLang"
    starts_servers = True
    per_position_counters = False
    endpoints = ("chat", "completions", "generate")  # generate: its native streaming endpoint
    no_prefix_cache_flag: str | None = "--disable-radix-cache"
    reset_path: str | None = "/flush_cache"
    reset_hint = "the server refused it"
    report_note: str | None = (
        "ITL on SGLang is the gap between streamed chunks, as vLLM's bench counts it; SGLang's own "
        "bench spreads a multi-token chunk's gap over its tokens, so its ITL reads lower under speculation"
    )
    emits_k_schedule = False  # its adaptive-speculation tiers: format not verified here
    synthetic_acceptance = False  # SGLang has no synthetic rejection sampling
    run_prefix = "sglang-"

    def check(self, job: JobConfig) -> None:
        check_own_servers(job.engine)

    def resolve(self, job: JobConfig, *, build: bool, plan_only: bool) -> Target:
        # build=False (before anything is built) plans a server even where SGLang cannot run.
        on_gpu, _ = planned_device(job, plan_only)
        install = detect_install(job.engine.python, required=build)
        if build:
            validate_engine(job.engine, install, on_gpu, python_given=job.engine.python is not None)
        validate_spec(job.spec, install)
        if install.flags_source == "parser":  # the recorded flags are only those this adapter emits
            check_extra_args(job.engine.extra_args, install.flags, f"SGLang {install.version}", dashes=False)
        return resolve_models(job, install, on_gpu, build=build)

    def server_spec(self, target: Target, job: JobConfig, log_path: Path, port: int) -> ServerSpec:
        launch = build_launch(install=target.install, **launch_args(target, job, port))
        return ServerSpec.for_engine(
            job.engine, str(target.install.version), launch.command, launch.env, port, log_path
        )

    def server(self, spec: ServerSpec) -> Server:
        return EngineServer(spec)

    def version_note(self, target: Target) -> str:
        install = target.install
        if install.flags_source != "recorded":
            return ""
        where = "installed, but its parser does not import here" if install.installed else "not installed here"
        return f" ({where}: flags as recorded for SGLang {RECORDED_VERSION})"

    def resets_cache(self, engine: EngineConfig) -> bool:
        return engine.prefix_cache not in ("off", "as_is")

    def window_acceptance(
        self, records: Sequence[RequestRecord], counters: Acceptance, after: Scrape, base_url: str
    ) -> WindowAcceptance:
        return sglang_acceptance(records, after, server_info(base_url)).on_scale(counters)
