"""Does a draft model or an EAGLE head fit the target it is given? Checked before any server starts.

vLLM loads a head made for another target without complaint where the shapes allow, and then
drafts nothing it accepts; where they don't, the server dies at start-up after a minute with a
shape error. Both are cheaper to refuse up front, naming the head and the target. What is
compared, from each one's ``config.json`` (the folder's, or the local Hugging Face cache's for a
hub id; a hub id not in the cache is not checked, and the dry run says nothing of it):

- the kind: ``spec.method=eagle3`` takes an EAGLE-3 head (an ``*Eagle3*`` architecture, or
  speculators' ``eagle3`` format); ``eagle`` an EAGLE-1 head; ``draft`` a whole model, not a head;
- the hidden size the head reads (``target_hidden_size``, else its own) against the target's;
- the vocabulary: the head's against the target's, and a reduced draft vocabulary's mapping
  (``d2t``: draft id + offset = target id) inside the target's;
- the target layers an EAGLE-3 head reads (``eagle_aux_hidden_state_layer_ids``), and the
  architecture it records for its verifier (speculators' format), against the target's.

The comparison is pure (:func:`problems`); reading the files is :func:`read_shape`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EMBEDDED_PREFIX = "embedded:"
HEAD_METHODS = ("eagle", "eagle3")


@dataclass(frozen=True)
class Shape:
    """What a model's or a head's config says, as far as fitting a target goes."""

    kind: str  # "eagle3", "eagle" (a one-layer head without EAGLE-3's fc), or "model"
    architectures: tuple[str, ...] = ()
    hidden_size: int | None = None  # for a head: the target hidden size it reads
    vocab_size: int | None = None
    num_layers: int | None = None
    draft_vocab_size: int | None = None
    aux_layers: tuple[int, ...] = ()
    verifier_architectures: tuple[str, ...] = ()
    # (lowest, highest) target token id the draft vocabulary maps to, where it is reduced.
    draft_ids: tuple[int, int] | None = None


def shape_of(config: dict[str, Any], draft_ids: tuple[int, int] | None = None) -> Shape:
    """A config.json as a :class:`Shape`: speculators' format, vLLM's EAGLE formats, or a model."""
    if config.get("speculators_model_type"):
        layer = config.get("transformer_layer_config") or {}
        verifier = (config.get("speculators_config") or {}).get("verifier") or {}
        kind = (
            "eagle3"
            if config["speculators_model_type"] in ("eagle3", "peagle")
            else str(config["speculators_model_type"])
        )
        return Shape(
            kind,
            tuple(config.get("architectures") or ()),
            config.get("target_hidden_size") or layer.get("hidden_size"),
            layer.get("vocab_size"),
            layer.get("num_hidden_layers"),
            config.get("draft_vocab_size"),
            tuple(config.get("eagle_aux_hidden_state_layer_ids") or ()),
            tuple(verifier.get("architectures") or ()),
            draft_ids,
        )
    architectures = tuple(config.get("architectures") or ())
    names = " ".join(architectures).lower()
    kind = (
        "eagle3"
        if "eagle3" in names
        else "eagle"
        if "eagle" in names or config.get("model_type") == "eagle"
        else "model"
    )
    eagle = config.get("eagle_config") or {}
    return Shape(
        kind,
        architectures,
        config.get("target_hidden_size") or config.get("hidden_size"),
        config.get("vocab_size"),
        config.get("num_hidden_layers"),
        config.get("draft_vocab_size"),
        tuple(eagle.get("eagle_aux_hidden_state_layer_ids") or config.get("eagle_aux_hidden_state_layer_ids") or ()),
        (),
        draft_ids,
    )


def problems(method: str, head: Shape, target: Shape) -> list[str]:
    """Why ``head`` (a draft for ``spec.method=method``) does not fit ``target``; empty if it does."""
    out = _kind_problems(method, head)
    if out:
        return out  # the other figures mean different things for the wrong kind
    if method in HEAD_METHODS and _differ(head.hidden_size, target.hidden_size):
        out.append(f"it reads hidden states of size {head.hidden_size}, the target's are {target.hidden_size}")
    if _differ(head.vocab_size, target.vocab_size):
        out.append(f"its vocabulary has {head.vocab_size} tokens, the target's {target.vocab_size}")
    out += _draft_vocab_problems(head, target)
    if head.aux_layers and target.num_layers is not None and max(head.aux_layers) > target.num_layers:
        out.append(f"it reads target layers {list(head.aux_layers)}, the target has {target.num_layers}")
    if head.verifier_architectures and target.architectures:
        if not set(head.verifier_architectures) & set(target.architectures):
            out.append(
                f"it was trained for a {'/'.join(head.verifier_architectures)}, the target is a "
                f"{'/'.join(target.architectures)}"
            )
    return out


def _kind_problems(method: str, head: Shape) -> list[str]:
    if method == "eagle3" and head.kind != "eagle3":
        what = "a whole model" if head.kind == "model" else f"an {head.kind.upper()} head"
        return [f"spec.method=eagle3 needs an EAGLE-3 head, and this is {what} ({'/'.join(head.architectures) or '?'})"]
    if method == "eagle" and head.kind == "eagle3":
        return ["it is an EAGLE-3 head: use spec.method=eagle3"]
    if method == "draft" and head.kind != "model":
        return [f"it is an {head.kind.upper()} head, not a model: use spec.method={head.kind}"]
    return []


def _draft_vocab_problems(head: Shape, target: Shape) -> list[str]:
    vocab = target.vocab_size
    if head.draft_vocab_size is None or vocab is None or head.draft_vocab_size == vocab:
        return []
    if head.draft_vocab_size > vocab:
        return [f"its draft vocabulary ({head.draft_vocab_size}) is larger than the target's ({vocab})"]
    if head.draft_ids is None:
        return []  # no mapping read (a hub head): vLLM checks it as it loads
    low, high = head.draft_ids
    if low < 0 or high >= vocab:
        return [f"its draft vocabulary maps to target ids {low}..{high}, outside the target's 0..{vocab - 1}"]
    return []


def _differ(a: int | None, b: int | None) -> bool:
    return a is not None and b is not None and a != b


def read_config(path: str) -> dict[str, Any] | None:
    """A folder's config.json, or a hub id's from the local Hugging Face cache; None if neither."""
    folder = Path(path)
    if folder.is_dir():
        file = folder / "config.json"
        return json.loads(file.read_text()) if file.is_file() else None
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(path, "config.json")
    except ValueError:  # HFValidationError: not a valid repo id: nothing cached under it
        return None
    return json.loads(Path(cached).read_text()) if isinstance(cached, str) else None


def draft_ids(path: str) -> tuple[int, int] | None:
    """The target ids a reduced draft vocabulary maps to (its ``d2t`` offsets added to the draft
    ids), read from a folder's safetensors; None where there is no such tensor."""
    import numpy as np
    from safetensors import safe_open

    folder = Path(path)
    if not folder.is_dir():
        return None
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="numpy") as f:
            if "d2t" in f.keys():  # safe_open has keys(), not __contains__
                d2t = f.get_tensor("d2t")
                ids = np.arange(len(d2t)) + d2t
                return int(ids.min()), int(ids.max())
    return None


# Bytes a parameter takes when the server runs at engine.dtype ("auto" keeps the stored width).
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "half": 2, "float": 4}


def weight_metrics(path: str | None, dtype: str) -> dict[str, float]:
    """The draft's or head's own parameters (a head's are what it does not share with the
    target: vLLM takes the target's embeddings where the head has none), counted from its
    safetensors headers, and their bytes at the server's dtype: the memory it costs beside the
    KV cache the engine reports. Empty for a hub id, or a folder without safetensors."""
    import math

    from safetensors import safe_open

    files = sorted(Path(path).glob("*.safetensors")) if path and Path(path).is_dir() else []
    count = stored = 0
    for file in files:
        with safe_open(str(file), framework="numpy") as f:
            for name in f.keys():  # safe_open has keys(), not __contains__
                if name in ("d2t", "t2d"):
                    continue  # the vocabulary mapping: indices, not weights
                piece = f.get_slice(name)
                numel = math.prod(piece.get_shape())
                count += numel
                stored += numel * _WIDTHS.get(piece.get_dtype(), 4)
    if not count:
        return {}
    width = DTYPE_BYTES.get(dtype)
    return {"draft_parameters": float(count), "draft_parameter_bytes": float(count * width if width else stored)}


_WIDTHS = {"F32": 4, "BF16": 2, "F16": 2, "F64": 8, "I64": 8, "I32": 4, "BOOL": 1, "U8": 1, "I8": 1}


def read_shape(path: str) -> Shape | None:
    config = read_config(path)
    if config is None:
        return None
    reduced = config.get("draft_vocab_size") is not None
    return shape_of(config, draft_ids(path) if reduced else None)


def check_names(method: str, model_id: str, draft_ref: str, model_path: str) -> str | None:
    """Before anything is built: an embedded draft or head (made for the embedded target) given
    to a hub model. A local folder is compared by its config once the draft is there (:func:`check`)."""
    if method not in ("draft", *HEAD_METHODS) or not draft_ref.startswith(EMBEDDED_PREFIX):
        return None
    if model_id.startswith(EMBEDDED_PREFIX) or Path(model_path).is_dir():
        return None
    return (
        f"spec.draft_model={draft_ref} is made for the embedded model (model.id=embedded:smollm2-135m), "
        f"but model.id={model_id}: give a draft or head trained for {model_id} in a spec group of its own "
        f"(docs/gpu.md has EAGLE-3 heads for Llama-3.1-8B and Llama-3.3-70B)"
    )


def against_target(method: str, model_id: str, draft_ref: str, model_path: str, draft_path: str) -> str | None:
    """Why the draft ``draft_ref`` (resolved to ``draft_path``) cannot serve ``model_id``
    (``model_path``) with ``spec.method=method``, naming both; None if it can, or if either
    config cannot be read here (then :func:`check_names` is all that is checked)."""
    if method not in ("draft", *HEAD_METHODS) or draft_ref == "self":
        return None
    head, target = read_shape(draft_path), read_shape(model_path)
    if head is None or target is None:
        return check_names(method, model_id, draft_ref, model_path)
    found = problems(method, head, target)
    if not found:
        return None
    return f"spec.draft_model={draft_ref} does not fit model.id={model_id}: {'; '.join(found)}"
