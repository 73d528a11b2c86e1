"""A draft or an EAGLE head against its target, before any server starts (pipeline/engines/head_check.py),
and the embedded head's cache key (pipeline/engines/eagle_head.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from pipeline.engines import eagle_head, head_check, models
from pipeline.engines.head_check import problems, shape_of

# The embedded target's config, as pipeline/engines/models.py builds it (the figures that matter).
SMOLLM2 = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "vocab_size": 49152,
    "model_type": "llama",
}
LLAMA_8B = {**SMOLLM2, "hidden_size": 4096, "num_hidden_layers": 32, "vocab_size": 128256}


def speculators_head(hidden: int = 576, vocab: int = 49152, draft_vocab: int = 8192, aux=(2, 15, 27)) -> dict:
    """A config as speculators' save_pretrained writes it for an EAGLE-3 head."""
    return {
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": "eagle3",
        "draft_vocab_size": draft_vocab,
        "eagle_aux_hidden_state_layer_ids": list(aux),
        "target_hidden_size": None,
        "speculators_config": {"verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": "/t"}},
        "transformer_layer_config": {**SMOLLM2, "hidden_size": hidden, "num_hidden_layers": 1, "vocab_size": vocab},
    }


# The yuhuili EAGLE-3 head for Llama-3.1-8B-Instruct: vLLM's own LlamaForCausalLMEagle3 format.
YUHUILI_8B = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "hidden_size": 4096,
    "num_hidden_layers": 1,
    "vocab_size": 128256,
    "draft_vocab_size": 32000,
}


def folder(tmp_path: Path, name: str, config: dict, d2t: np.ndarray | None = None) -> str:
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    if d2t is not None:
        save_file({"d2t": d2t, "fc.weight": np.zeros((2, 2), np.float32)}, str(path / "model.safetensors"))
    return str(path)


def test_a_head_made_for_the_target_fits() -> None:
    target = shape_of(SMOLLM2)
    assert problems("eagle3", shape_of(speculators_head(), draft_ids=(0, 49151)), target) == []
    assert problems("draft", shape_of({**SMOLLM2, "num_hidden_layers": 4}), target) == []


def test_a_head_for_another_target_is_refused_for_its_hidden_size_vocabulary_and_layers() -> None:
    found = problems("eagle3", shape_of(YUHUILI_8B), shape_of(SMOLLM2))
    assert "it reads hidden states of size 4096, the target's are 576" in found
    assert "its vocabulary has 128256 tokens, the target's 49152" in found
    assert "its draft vocabulary (32000) is larger" not in " ".join(found)  # 32000 < 49152: not that
    aux = problems(
        "eagle3", shape_of(speculators_head(aux=(2, 16, 31))), shape_of({**SMOLLM2, "num_hidden_layers": 24})
    )
    assert aux == ["it reads target layers [2, 16, 31], the target has 24"]
    qwen = problems(
        "eagle3", shape_of(speculators_head()), shape_of({**SMOLLM2, "architectures": ["Qwen3ForCausalLM"]})
    )
    assert qwen == ["it was trained for a LlamaForCausalLM, the target is a Qwen3ForCausalLM"]


def test_the_kind_of_head_must_match_the_method() -> None:
    target = shape_of(SMOLLM2)
    assert problems("eagle3", shape_of(SMOLLM2), target) == [
        "spec.method=eagle3 needs an EAGLE-3 head, and this is a whole model (LlamaForCausalLM)"
    ]
    assert problems("eagle", shape_of(speculators_head()), target) == ["it is an EAGLE-3 head: use spec.method=eagle3"]
    assert problems("draft", shape_of(YUHUILI_8B), shape_of(LLAMA_8B)) == [
        "it is an EAGLE3 head, not a model: use spec.method=eagle3"
    ]
    assert problems("draft", shape_of({**SMOLLM2, "vocab_size": 32000}), target) == [
        "its vocabulary has 32000 tokens, the target's 49152"
    ]


def test_a_draft_vocabulary_mapping_outside_the_target_is_refused() -> None:
    head = dataclasses.replace(shape_of(speculators_head()), draft_ids=(0, 50000))
    assert problems("eagle3", head, shape_of(SMOLLM2)) == [
        "its draft vocabulary maps to target ids 0..50000, outside the target's 0..49151"
    ]
    bigger = shape_of(speculators_head(draft_vocab=60000))
    assert problems("eagle3", bigger, shape_of(SMOLLM2)) == [
        "its draft vocabulary (60000) is larger than the target's (49152)"
    ]


def test_the_mapping_is_read_from_the_heads_weights(tmp_path: Path) -> None:
    """d2t holds offsets: draft id i is target id i + d2t[i] (speculators' and vLLM's convention)."""
    d2t = np.array([0, 4, 9, 49148], dtype=np.int64)  # -> target ids 0, 5, 11, 49151
    path = folder(tmp_path, "head", speculators_head(draft_vocab=4), d2t)
    assert head_check.read_shape(path) == dataclasses.replace(
        shape_of(speculators_head(draft_vocab=4)), draft_ids=(0, 49151)
    )
    bad = folder(tmp_path, "bad", speculators_head(draft_vocab=4), d2t + 1)
    assert head_check.draft_ids(bad) == (1, 49152)


def test_a_mismatched_head_is_refused_naming_both(tmp_path: Path) -> None:
    target = folder(tmp_path, "smollm2", SMOLLM2)
    head = folder(tmp_path, "eagle3-8b", YUHUILI_8B)
    message = head_check.against_target("eagle3", "/models/smollm2", "/heads/eagle3-8b", target, head)
    assert message is not None
    assert message.startswith("spec.draft_model=/heads/eagle3-8b does not fit model.id=/models/smollm2: ")
    assert "hidden states of size 4096, the target's are 576" in message
    good = folder(tmp_path, "mine", speculators_head(draft_vocab=49152))
    assert head_check.against_target("eagle3", "t", "h", target, good) is None
    assert head_check.against_target("draft", "t", "self", target, target) is None
    assert head_check.against_target("ngram", "t", "h", target, head) is None  # no draft to check


def test_the_embedded_head_on_a_hub_model_is_refused_before_it_is_built() -> None:
    message = head_check.check_names(
        "eagle3", "meta-llama/Llama-3.1-8B-Instruct", "embedded:smollm2-135m-eagle3", "meta-llama/Llama-3.1-8B-Instruct"
    )
    assert message is not None
    assert "spec.draft_model=embedded:smollm2-135m-eagle3 is made for the embedded model" in message
    assert "but model.id=meta-llama/Llama-3.1-8B-Instruct" in message and "docs/gpu.md" in message
    assert head_check.check_names("eagle3", "embedded:smollm2-135m", "embedded:smollm2-135m-eagle3", "/x") is None


def test_a_hub_head_not_in_the_local_cache_is_not_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    target = folder(tmp_path, "smollm2", SMOLLM2)
    assert head_check.read_config("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B") is None
    assert head_check.against_target("eagle3", "t", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", target, "yuhuili/x") is None


def test_the_heads_cache_key_follows_its_recipe_and_its_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSWEEP_CACHE", str(tmp_path))
    full = eagle_head.FULL
    assert full.key("smollm2-135m-r1") == eagle_head.HeadRecipe().key("smollm2-135m-r1")  # a digest, stable
    assert len({full.key("smollm2-135m-r1"), full.key("smollm2-135m-r2"), eagle_head.QUICK.key("smollm2-135m-r1")}) == 3
    for field in dataclasses.fields(full):
        value = getattr(full, field.name)
        changed = (*value, 3) if isinstance(value, tuple) else value * 2 if value else 1
        assert dataclasses.replace(full, **{field.name: changed}).key("t") != full.key("t"), field.name
    path = models.embedded_path("smollm2-135m-eagle3")
    assert path == tmp_path / "models" / f"smollm2-135m-eagle3-{full.key(f'smollm2-135m-r{models.RECIPE_VERSION}')}"
    assert models.embedded_path("smollm2-135m-eagle3-quick") != path


def test_a_recipe_change_builds_a_new_head_beside_the_old_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSWEEP_CACHE", str(tmp_path))
    built: list[tuple[Path, eagle_head.HeadRecipe]] = []
    monkeypatch.setattr(models, "_build_target", lambda out: (out / "config.json").write_text("{}"))
    monkeypatch.setattr(eagle_head, "build_head", lambda target, out, recipe: built.append((target, recipe)))
    first = models.ensure_embedded("smollm2-135m-eagle3")
    assert models.ensure_embedded("smollm2-135m-eagle3") == first and len(built) == 1  # cached
    artifact = models.EMBEDDED["smollm2-135m-eagle3"]
    monkeypatch.setitem(
        models.EMBEDDED,
        "smollm2-135m-eagle3",
        dataclasses.replace(artifact, head=dataclasses.replace(eagle_head.FULL, steps=eagle_head.FULL.steps + 1)),
    )
    second = models.ensure_embedded("smollm2-135m-eagle3")
    assert second != first and first.is_dir() and second.is_dir() and len(built) == 2
    assert built[0][0] == models.embedded_path("smollm2-135m")  # trained on the embedded target's folder


def test_a_drafts_own_weights_are_counted_from_its_files_at_the_servers_dtype(tmp_path: Path) -> None:
    """The memory a draft costs beside the KV cache: its parameters (the vocabulary mapping is
    indices, not weights), and their bytes at engine.dtype, or as stored for auto."""
    path = tmp_path / "head"
    path.mkdir()
    save_file(
        {
            "fc.weight": np.zeros((4, 6), np.float32),
            "norm.weight": np.zeros(4, np.float16),
            "d2t": np.zeros(3, np.int64),
        },
        str(path / "model.safetensors"),
    )
    assert head_check.weight_metrics(str(path), "bfloat16") == {"draft_parameters": 28.0, "draft_parameter_bytes": 56.0}
    assert head_check.weight_metrics(str(path), "float32")["draft_parameter_bytes"] == 112.0
    assert head_check.weight_metrics(str(path), "auto")["draft_parameter_bytes"] == 24 * 4 + 4 * 2
    assert head_check.weight_metrics("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "bfloat16") == {}  # a hub id: not read
    assert head_check.weight_metrics(None, "bfloat16") == {}
