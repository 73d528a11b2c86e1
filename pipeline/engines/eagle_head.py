"""The embedded model's EAGLE-3 head: trained here, on the CPU, from the target's own answers.

No hub can be reached at run time, and no EAGLE-3 head for SmolLM2-135M exists to download, so
``embedded:smollm2-135m-eagle3`` is trained on first use and cached beside the target, in a
folder named by the recipe's digest (a changed recipe builds a new head). The stages:

1. prompts of the bundled kinds drawn from text the bundled workloads never draw
   (:func:`pipeline.load.bundled.training_items`), so the head is measured on prompts it never saw;
2. the target's own greedy answers (transformers on the CPU, float32), and in the same pass the
   residual stream at the three layers vLLM feeds an EAGLE-3 head (2, 15 and 27 of 30: vLLM's
   default, ``get_eagle3_default_aux_hidden_state_layers``) and at the last layer, which gives
   the target's next-token distribution the head learns;
3. a draft vocabulary of the tokens those answers use most (speculators'
   ``build_vocab_mappings_from_distribution``): the head's output layer shrinks from 49,152
   rows to ``draft_vocab``, which is most of its training cost;
4. training with the EAGLE-3 objective: the head is unrolled over ``ttt_steps`` steps, each fed
   its own previous hidden state (training-time test), with a KL loss against the target's
   distribution at every step (speculators' ``Eagle3DraftModel.forward``);
5. the head saved with speculators' ``save_pretrained``: the speculators format, which the
   installed vLLM loads (``vllm/transformers_utils/configs/speculators/algos.py``).

Why speculators, and why a loop of our own: speculators (Red Hat, on PyPI) defines the EAGLE-3
model, its training-time-test forward, its loss, its vocabulary mapping and its checkpoint
format, and all of those run on the CPU. What it lacks here is the rest of training: its data
generation asks a vLLM server with hidden-state extraction for the target's hidden states, and
its trainer assumes an accelerator and a distributed launch. So this module generates the data
with transformers and runs a plain AdamW loop over speculators' model, and nothing else.

Seeded and single-threaded in its data order: the same recipe on the same machine gives the
same head. The cost is printed before it starts, and each stage reports its progress.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Part of the cache key beside the recipe: bump it when the code changes what a recipe means
# (the training prompts, the loop, the saved format), so that no old head is reused.
HEAD_FORMAT = 2


@dataclass(frozen=True)
class HeadRecipe:
    """How a head is trained. Every field enters the cache key (:meth:`key`)."""

    prompts: int = 96  # training prompts (code edits, chat, summaries, questions)
    max_new_tokens: int = 128  # the answer length: the bundled workloads' default max_tokens
    aux_layers: tuple[int, ...] = (2, 15, 27)  # vLLM's default for a 30-layer target
    draft_vocab: int = 8192  # the head's output vocabulary (of the target's 49,152)
    ttt_steps: int = 3  # training-time-test unroll: the draft positions trained
    steps: int = 90  # optimiser steps
    pack_tokens: int = 2048  # tokens per optimiser step (whole answers packed together)
    lr: float = 1e-3
    warmup: int = 10
    seed: int = 0
    gen_batch: int = 32  # prompts generated together (padding changes the numerics a little)

    def key(self, target_revision: str) -> str:
        """The cache key: this recipe, the head format and the target it is trained for."""
        payload = json.dumps({"recipe": asdict(self), "format": HEAD_FORMAT, "target": target_revision}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


# The head users get (embedded:smollm2-135m-eagle3), and one small enough for a test session.
FULL = HeadRecipe()
QUICK = HeadRecipe(prompts=24, max_new_tokens=64, draft_vocab=4096, steps=40, pack_tokens=1024, warmup=5, gen_batch=24)


@dataclass(frozen=True)
class TrainingSequence:
    """One training sequence: tokens, and the target's residual stream at each token."""

    input_ids: Any  # [T] long
    aux: Any  # [T, len(aux_layers) * hidden] float32
    last: Any  # [T, hidden] float32, before the final norm


@dataclass
class Progress:
    """Progress lines on stderr, each with the time since the build began."""

    started: float = field(default_factory=time.monotonic)
    write: Callable[[str], None] = field(default=lambda line: print(line, file=sys.stderr, flush=True))

    def __call__(self, message: str) -> None:
        self.write(f"  [{(time.monotonic() - self.started) / 60:4.1f} min] {message}")


def build_head(
    target: Path,
    out: Path,
    recipe: HeadRecipe,
    progress: Progress | None = None,
    snapshots: dict[int, Path] | None = None,
) -> dict[str, Any]:
    """Train a head for the target folder ``target`` into ``out``; returns what the build measured.
    ``snapshots``: optimiser step -> a folder to save the head as it is then (for a curve of
    acceptance against training time, ``benchmarks/methods_side_by_side.py curve``)."""
    import torch
    from loguru import logger

    logger.disable("speculators")  # its INFO lines about each file it reads; our progress lines say enough
    say = progress or Progress()
    # One thread: with two, a busy second core stalls every parallel region (generation ran 2-5x
    # slower so here, beside one other job); one is also what vLLM's CPU build computes on, and
    # its reductions are the same every run.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _build(target, out, recipe, say, snapshots or {})
    finally:
        torch.set_num_threads(threads)


def _build(target: Path, out: Path, recipe: HeadRecipe, say: Progress, snapshots: dict[int, Path]) -> dict[str, Any]:
    import torch

    torch.manual_seed(recipe.seed)
    random.seed(recipe.seed)
    samples, tokens, vocab_size = _generate(target, recipe, say)
    d2t, t2d = _draft_vocabulary(samples, vocab_size, recipe, say)
    model = _new_head(target, recipe, d2t, t2d)
    curve = _train(model, samples, recipe, say, snapshots)
    save_head(model, out)
    report = {
        "recipe": asdict(recipe),
        "training_tokens": tokens,
        "samples": len(samples),
        "build_minutes": round((time.monotonic() - say.started) / 60, 2),
        "curve": curve,
    }
    (out / "specsweep-head.json").write_text(json.dumps(report, indent=1) + "\n")
    say(f"done: {len(samples)} answers, {tokens} tokens, loss {curve[-1]['loss']:.3f}")
    return report


def _generate(target: Path, recipe: HeadRecipe, say: Progress) -> tuple[list[TrainingSequence], int, int]:
    """The target's greedy answers to the training prompts, with its hidden states."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from pipeline.load.bundled import training_items

    tokenizer = AutoTokenizer.from_pretrained(str(target))
    tokenizer.padding_side = "left"
    model = LlamaForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    items = training_items(random.Random(f"eagle3-head:{recipe.seed}"), recipe.prompts)
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": i.prompt}], tokenize=False, add_generation_prompt=True
        )
        for i in items
    ]
    texts.sort(key=len)  # batches of like lengths pad little
    layers = [*(a - 1 for a in recipe.aux_layers), model.config.num_hidden_layers - 1]
    samples: list[TrainingSequence] = []
    for start in range(0, len(texts), recipe.gen_batch):
        batch = texts[start : start + recipe.gen_batch]
        samples += _generate_batch(model, tokenizer, batch, layers, recipe.max_new_tokens)
        say(f"answers {min(start + recipe.gen_batch, len(texts))}/{len(texts)}")
    return samples, sum(int(s.input_ids.numel()) for s in samples), int(model.config.vocab_size)


def _generate_batch(
    model: Any, tokenizer: Any, texts: Sequence[str], layers: list[int], new: int
) -> list[TrainingSequence]:
    """One batch: hooks keep each listed layer's output (the residual stream after it: vLLM's
    auxiliary state at layer i is the stream after layer i - 1) for the prompt and every fed
    answer token; the last answer token is never fed, so it is dropped."""
    import torch

    kept: dict[int, list[Any]] = {i: [] for i in layers}
    hooks = [
        model.model.layers[i].register_forward_hook(lambda _m, _a, out, i=i: kept[i].append(_first(out).detach()))
        for i in layers
    ]
    try:
        enc = tokenizer(list(texts), return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=new, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    finally:
        for h in hooks:
            h.remove()
    streams = {i: torch.cat(v, dim=1) for i, v in kept.items()}
    width = enc.input_ids.shape[1]
    samples = []
    for b in range(len(texts)):
        pads = int((enc.attention_mask[b] == 0).sum())
        answer = out[b, width:].tolist()
        length = answer.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in answer else len(answer)
        end = width + length - 1  # positions whose hidden states were computed
        samples.append(
            TrainingSequence(
                out[b, pads:end].clone(),
                torch.cat([streams[i][b, pads:end] for i in layers[:-1]], dim=-1).float(),
                streams[layers[-1]][b, pads:end].float(),
            )
        )
    return samples


def _first(out: Any) -> Any:
    return out[0] if isinstance(out, tuple) else out


def _draft_vocabulary(
    samples: Sequence[TrainingSequence], vocab_size: int, recipe: HeadRecipe, say: Progress
) -> tuple[Any, Any]:
    """The draft vocabulary: the tokens the training text uses most (speculators' mapping)."""
    from collections import Counter

    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    counts: Counter[int] = Counter()
    for s in samples:
        counts.update(s.input_ids.tolist())
    d2t, t2d = build_vocab_mappings_from_distribution(dict(counts), recipe.draft_vocab, vocab_size)
    say(f"draft vocabulary: {recipe.draft_vocab} of {vocab_size} tokens ({len(counts)} distinct in the training text)")
    return d2t, t2d


def _new_head(target: Path, recipe: HeadRecipe, d2t: Any, t2d: Any) -> Any:
    """speculators' EAGLE-3 model: one Llama decoder layer shaped like the target's, its
    embeddings and (draft-vocabulary rows of its) output layer taken from the target, frozen."""
    from speculators.models.eagle3 import Eagle3DraftModel
    from transformers import AutoConfig

    layer = AutoConfig.from_pretrained(str(target))
    layer.num_hidden_layers = 1
    if getattr(layer, "layer_types", None):
        layer.layer_types = layer.layer_types[:1]
    layer.tie_word_embeddings = False
    return Eagle3DraftModel.from_training_args(
        verifier_config=layer,
        verifier_name_or_path=str(target),
        target_layer_ids=list(recipe.aux_layers),
        draft_vocab_size=recipe.draft_vocab,
        norm_before_residual=True,  # speculators' defaults for EAGLE-3, which vLLM reads from the config
        norm_before_fc=True,
        norm_output=True,
        ttt_steps=recipe.ttt_steps,
        draft_attn_impl="sdpa",  # flex attention needs torch.compile on the CPU
        t2d=t2d,
        d2t=d2t,
    )


def save_head(model: Any, out: Path) -> None:
    """speculators' checkpoint writer, less the embeddings vLLM takes from the target."""
    model.save_pretrained(str(out), safe_serialization=True)
    _drop_embeddings(out)


def _train(
    model: Any, samples: Sequence[TrainingSequence], recipe: HeadRecipe, say: Progress, snapshots: dict[int, Path]
) -> list[dict[str, float]]:
    """AdamW with a linear warm-up and a cosine decay, over packed rows of whole answers, in a
    seeded order; returns the loss and the per-step accuracies every tenth of the run."""
    import torch
    from speculators.losses import resolve_loss_config

    loss_config = resolve_loss_config("kl_div", "eager")  # the fused loss is a GPU kernel
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, recipe))
    rows = _rows(samples, recipe)
    order = random.Random(recipe.seed)
    curve: list[dict[str, float]] = []
    model.train()
    window: list[dict[str, float]] = []
    for step in range(recipe.steps):
        if step % len(rows) == 0:
            order.shuffle(rows)
        _, loss, metrics = model(**rows[step % len(rows)], ttt_steps=recipe.ttt_steps, loss_config=loss_config)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        window.append(_scalars(loss, metrics, recipe.ttt_steps))
        if step + 1 in snapshots:
            save_head(model, snapshots[step + 1])
            minutes = (time.monotonic() - say.started) / 60
            (snapshots[step + 1] / "specsweep-head.json").write_text(json.dumps({"step": step + 1, "minutes": minutes}))
        if (step + 1) % max(1, recipe.steps // 10) == 0 or step + 1 == recipe.steps:
            point = {k: sum(w[k] for w in window) / len(window) for k in window[0]}
            curve.append({"step": step + 1, "minutes": (time.monotonic() - say.started) / 60, **point})
            accs = " ".join(f"{point[f'acc_{i}']:.2f}" for i in range(recipe.ttt_steps))
            say(f"training step {step + 1}/{recipe.steps}: loss {point['loss']:.3f}, accuracy per position {accs}")
            window = []
    model.eval()
    return curve


def _lr_factor(step: int, recipe: HeadRecipe) -> float:
    if step < recipe.warmup:
        return (step + 1) / recipe.warmup
    done = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
    return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, done)))


def _scalars(loss: Any, metrics: dict[str, Any], steps: int) -> dict[str, float]:
    """The loss and each position's accuracy given the earlier ones were right (speculators'
    cond_acc: the chance that the draft at that position is accepted)."""
    out = {"loss": float(loss.detach())}
    for i in range(steps):
        total = float(metrics[f"cond_acc_{i}_total"])
        out[f"acc_{i}"] = float(metrics[f"cond_acc_{i}_sum"]) / total if total else 0.0
    return out


def _rows(samples: Sequence[TrainingSequence], recipe: HeadRecipe) -> list[dict[str, Any]]:
    """Whole answers packed into rows of at most ``pack_tokens``, each aligned as speculators'
    ``shift_batch`` aligns one: token t with the target's state at t - 1 and its distribution at t."""
    import torch
    from speculators.models.eagle3 import shift_batch

    shifted = []
    for s in samples:
        n = int(s.input_ids.numel())
        shifted.append(
            shift_batch(
                {
                    "input_ids": s.input_ids,
                    "hidden_states": s.aux,
                    "verifier_last_hidden_states": s.last,
                    "loss_mask": torch.ones(n, dtype=torch.long),
                    "lengths": torch.tensor([n]),
                    "position_ids": torch.arange(n),
                }
            )
        )
    rows, current, used = [], [], 0
    for item in shifted:
        n = int(item["input_ids"].numel())
        if current and used + n > recipe.pack_tokens:
            rows.append(_pack(current))
            current, used = [], 0
        current.append(item)
        used += n
    if current:
        rows.append(_pack(current))
    return rows


def _pack(items: list[dict[str, Any]]) -> dict[str, Any]:
    import torch

    def cat(key: str) -> Any:
        return torch.cat([i[key] for i in items], dim=0).unsqueeze(0)

    docs = torch.cat([torch.full((int(i["input_ids"].numel()),), d) for d, i in enumerate(items)]).unsqueeze(0)
    return {
        "input_ids": cat("input_ids"),
        "hidden_states": cat("hidden_states"),
        "verifier_last_hidden_states": cat("verifier_last_hidden_states"),
        "loss_mask": cat("loss_mask"),
        "position_ids": cat("position_ids"),
        "document_ids": docs,
    }


def _drop_embeddings(out: Path) -> None:
    """vLLM shares the target's embeddings with an EAGLE-3 head that has none of its own
    (``llama_eagle3.py``: ``embed_tokens`` is skipped when absent): the copy speculators saves
    would be 28 M frozen parameters read from disk for nothing, and counted as the head's."""
    from safetensors.torch import load_file, save_file

    for path in out.glob("*.safetensors"):
        tensors = load_file(str(path))
        kept = {k: v.contiguous() for k, v in tensors.items() if not k.startswith("embed_tokens")}
        if len(kept) != len(tensors):
            save_file(kept, str(path), metadata={"format": "pt"})
