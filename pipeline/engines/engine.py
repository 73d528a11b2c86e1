"""The one interface every engine meets, and what a job's servers run (:class:`Target`).

The sweep asks its engine object, never the engine's name: how to check a job's settings,
how to resolve it (install, device, models), the server's command, the server object that runs it, the label
and version note of the dry run, how the prefix cache is emptied between windows, and what a
window's acceptance is read from. The implementations are :class:`~pipeline.engines.vllm.VllmEngine`,
:class:`~pipeline.engines.sglang.SglangEngine` and :class:`~pipeline.engines.external.ExternalEngine`;
:mod:`pipeline.engines.registry` names them.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pipeline.config import ConfigError, EngineConfig, JobConfig
from pipeline.engines import head_check
from pipeline.engines.acceptance import Acceptance, Scrape, WindowAcceptance
from pipeline.engines.base import Server, ServerSpec
from pipeline.engines.hardware import gpu_names, hardware_key, resolve_device
from pipeline.engines.models import ModelError, resolve_model, revision
from pipeline.identity import UNKNOWN, System
from pipeline.load.client import RequestRecord


class EngineNotInstalled(RuntimeError):
    """The engine's interpreter is missing, fails, or lacks the engine: no server can start."""


def run_probe(python: str, code: str, timeout_s: float = 120.0) -> dict:
    """Run ``code`` in the engine's interpreter (it prints one JSON line) and parse it: an engine
    is asked about its install in its own interpreter, never imported into ours."""
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout_s, check=True).stdout
    except FileNotFoundError as exc:
        raise EngineNotInstalled(f"engine.python={python} does not exist; point it at a Python interpreter") from exc
    except subprocess.CalledProcessError as exc:
        raise EngineNotInstalled(f"engine.python={python} failed to run: {exc.stderr.strip()}") from exc
    return json.loads(out.strip().splitlines()[-1])


@dataclass(frozen=True)
class LaunchPlan:
    """An engine's server command and the environment it runs in (each engine's ``build_launch``)."""

    command: list[str]
    env: dict[str, str]


@dataclass(frozen=True)
class Target:
    """What every server of a job runs: the engine install, the device, the model paths."""

    install: Any  # the engine's install record: VllmInstall, SglangInstall or ExternalInstall
    on_gpu: bool
    model_path: str
    draft_path: str | None
    model_revision: str | None = None  # model.revision: a hub model's pinned commit

    def engine_gpus(self, job: JobConfig) -> int:
        """GPUs the server takes; a draft model shares the target's GPUs in vLLM."""
        return job.engine.tensor_parallel_size if self.on_gpu else 0

    def system(self) -> System:
        """What this target is, as a point's identity holds it (pipeline.identity.System): run
        where the server runs, since the install, the device and the weights are that node's."""
        version = str(self.install.version)
        engine = UNKNOWN if version.startswith("unknown") else f"{self.install.distribution} {version}"
        draft = revision(self.draft_path) if self.draft_path else "none"
        return System(engine, hardware_key(self.on_gpu), revision(self.model_path, self.model_revision), draft)


def planned_device(job: JobConfig, plan_only: bool) -> tuple[bool, bool]:
    """(on a GPU, only planned): a dry run plans engine.device=gpu servers from a machine without
    a GPU, as for a cluster's GPU nodes, and this machine's device and build are then not checked."""
    planned = plan_only and job.engine.device == "gpu" and not gpu_names()
    return (True if planned else resolve_device(job.engine.device)), planned


def resolve_models(job: JobConfig, install: Any, on_gpu: bool, *, build: bool) -> Target:
    """The model and draft paths (embedded models built unless ``build=False``); a draft or head
    that does not fit the target is refused, before it is built where its name tells."""
    model_path = resolve_model(job.model.id, build=build)
    draft = job.spec.draft_model
    if not draft:
        return Target(install, on_gpu, model_path, None, job.model.revision)
    method = job.spec.method
    problem = head_check.check_names(method, job.model.id, draft, model_path)
    draft_path = resolve_model(draft, target=model_path, build=build) if problem is None else ""
    problem = problem or head_check.against_target(method, job.model.id, draft, model_path, draft_path)
    if problem:
        raise ModelError(problem)
    return Target(install, on_gpu, model_path, draft_path, job.model.revision)


def check_extra_args(extra_args: Sequence[str], flags: frozenset[str], engine: str, *, dashes: bool) -> None:
    """Refuse a flag in ``engine.extra_args`` that the installed engine's own argument parser
    lacks, before any server starts: the server would exit at start-up with argparse's usage
    text. ``dashes``: the parser reads ``--a_b`` as ``--a-b`` (vLLM's FlexibleArgumentParser)."""
    import difflib

    for arg in extra_args:
        if not arg.startswith("--"):
            continue  # a value, or a short flag such as -O3 with its value attached
        name = arg.split("=", 1)[0]
        key = "--" + name[2:].replace("_", "-") if dashes else name
        if key not in flags:
            near = difflib.get_close_matches(key, sorted(flags), n=3)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            raise ConfigError(
                f"engine.extra_args passes {name}, which the installed {engine} does not have (asked its own "
                f"argument parser){hint} Drop it or fix its spelling."
            )


def check_own_servers(engine: EngineConfig) -> None:
    """What an engine whose servers specsweep starts refuses: an address given for a server it
    starts, and the cache policy of a server that is not ours."""
    for key in ("url", "baseline_url"):
        if getattr(engine, key):
            raise ConfigError(
                f"engine.{key} is for engine=external (servers that already run); with "
                f"engine={engine.name} specsweep starts its own servers: remove engine.{key}"
            )
    if engine.prefix_cache == "as_is":
        raise ConfigError(
            "engine.prefix_cache=as_is is for engine=external; a server specsweep starts is measured cold, "
            "warm or off (engine.prefix_cache=cold is the default)"
        )


def launch_args(target: Target, job: JobConfig, port: int) -> dict[str, Any]:
    """What every engine's command is built from."""
    return {
        "engine": job.engine,
        "spec": job.spec,
        "model_path": target.model_path,
        "draft_path": target.draft_path if job.spec.method != "none" else None,
        "served_name": job.model.id,
        "port": port,
        "seed": job.seed,
        "model_revision": job.model.revision,
    }


class Engine(Protocol):
    name: str  # engine.name
    label: str  # how the dry run names it
    starts_servers: bool  # False: the servers already run, and are not ours (engine=external)
    endpoints: tuple[str, ...]  # the workload.endpoint values it serves
    # vLLM's per-position acceptance counters, which search=predict's k-curve rests on.
    per_position_counters: bool
    # The flag that turns its prefix cache off, which engine.extra_args may not pass behind
    # engine.prefix_cache's back; None where it has none.
    no_prefix_cache_flag: str | None
    reset_path: str | None  # POST this to empty its prefix cache between windows
    reset_hint: str  # what a refused reset usually means
    # The report's note on what this engine's figures mean differently; None for nothing.
    report_note: str | None
    # Whether the report's tuning advice can give a k schedule in this engine's own format.
    emits_k_schedule: bool
    # Whether it can run spec.synthetic_acceptance_* (vLLM's synthetic rejection sampling);
    # its version is checked when the job is resolved.
    synthetic_acceptance: bool
    # What its servers' and points' names start with: "" for the default engine, whose runs
    # were named before there was another.
    run_prefix: str

    def check(self, job: JobConfig) -> None:
        """Refuse what this engine cannot do with the job's settings, before anything starts:
        pure (no install, no server, no file), a ConfigError naming the key and the fix."""
        ...

    def resolve(self, job: JobConfig, *, build: bool, plan_only: bool) -> Target:
        """Check the install, device, methods and models; raise ConfigError and the like."""
        ...

    def server_spec(self, target: Target, job: JobConfig, log_path: Path, port: int) -> ServerSpec: ...

    def server(self, spec: ServerSpec) -> Server: ...

    def version_note(self, target: Target) -> str:
        """What the dry run adds after the version ("" for nothing)."""
        ...

    def resets_cache(self, engine: EngineConfig) -> bool:
        """Whether each window can start from an emptied prefix cache on this server."""
        ...

    def window_acceptance(
        self, records: Sequence[RequestRecord], counters: Acceptance, after: Scrape, base_url: str
    ) -> WindowAcceptance:
        """The window's acceptance on the one scale: from the /metrics ``counters``, or from what
        the engine reads besides them (SGLang's per-request counts), with its own figures."""
        ...
