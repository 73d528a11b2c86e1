"""Prompt sets: bundled ones built from text that ships with Python, and users' files.

Every set is seeded: the same (name, seed, count) gives the same prompts on any machine
with the same Python. Acceptance depends on the kind of text, so every request carries its
category, and the bundled sets span code editing, summarisation, chat and question answering.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

from pipeline.config import ConfigError, WorkloadConfig
from pipeline.load import datasets, traces
from pipeline.load.bundled import BUNDLED, draw
from pipeline.load.items import Item, Request, Tokenizer

FILE_FORMATS = ("sharegpt", "spec_bench", "jsonl")
WORKLOAD_NAMES = (*BUNDLED, *FILE_FORMATS, "random", "trace")


def load_items(workload: WorkloadConfig, count: int, seed: int, tokenizer: Tokenizer | None) -> list[Item]:
    rng = random.Random(f"{workload.name}:{seed}")
    if workload.name in BUNDLED:
        return BUNDLED[workload.name](rng, count)
    if workload.name == "trace":  # on its own schedule: pipeline/run/job.py point_requests
        replayed = traces.load_replay(workload, None)  # read and checked, slice included
        if replayed.synthetic and tokenizer is None:
            return []  # lengths only: the text needs the model's tokenizer
        return traces.replay_items(replayed, tokenizer, workload)[:count]
    if workload.name == "random":
        if tokenizer is None:
            raise ConfigError("workload.name=random needs the model's tokenizer to build prompts of exact lengths")
        return datasets.random_items(workload, count, rng, tokenizer)
    if workload.name in FILE_FORMATS:
        if not workload.path:
            raise ConfigError(f"workload.name={workload.name} reads a file: set workload.path=/path/to/file")
        items = datasets.read(workload.name, workload.path, tokenizer)
        return draw(rng, items, count)
    raise ConfigError(f"workload.name={workload.name!r} is not valid; choose one of: {', '.join(WORKLOAD_NAMES)}")


FINGERPRINT_DRAW = 64  # prompts in the canonical draw a generated set is fingerprinted by


def data_fingerprint(workload: WorkloadConfig) -> str:
    """What a point's prompts are made from, as a short digest for its identity: the bytes of
    the workload's file, or, for a generated set, the content of a fixed draw from it (the
    bundled sets come from Python's own sources, which another Python may hold differently) or
    the generator's own code (random prompts, whose tokens are the model's). Seeds, counts and
    lengths are settings, in the point's hash already. Computed where the point runs."""
    import hashlib
    import inspect

    digest = hashlib.sha256(f"{workload.name}\n".encode())
    if workload.path and workload.path != traces.BUNDLED_PATH:
        with open(workload.path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    elif workload.path == traces.BUNDLED_PATH:
        digest.update(repr(traces.bundled_trace()).encode())
    elif workload.name in BUNDLED:
        for item in BUNDLED[workload.name](random.Random(f"{workload.name}:fingerprint"), FINGERPRINT_DRAW):
            digest.update(repr((item.prompt, item.messages, item.category, item.output_tokens)).encode())
    else:  # random: token ids drawn by this code from the model's vocabulary
        digest.update(inspect.getsource(datasets.random_items).encode())
    return digest.hexdigest()[:16]


def to_requests(items: Sequence[Item], workload: WorkloadConfig, tokenizer: Tokenizer | None) -> list[Request]:
    requests = []
    last_turn: dict[str, int] = {}  # conversation -> index of its latest turn so far
    for i, item in enumerate(items):
        length = item.input_length if item.input_length is not None else _count(item.prompt, tokenizer)
        requests.append(
            Request(
                index=i,
                prompt=item.prompt,
                category=item.category,
                max_tokens=max_tokens(item, workload),
                prompt_tokens=length,
                messages=item.messages,
                conversation=item.conversation,
                turn=item.turn,
                after=last_turn.get(item.conversation) if item.delay_s is not None else None,
                delay_s=item.delay_s or 0.0,
                prompt_ids=item.prompt_ids,
                input_length=item.input_length,
                stated_length=item.output_tokens is not None and not item.capped,
            )
        )
        if item.conversation:
            last_turn[item.conversation] = i
    return requests


def max_tokens(item: Item, workload: WorkloadConfig) -> int:
    """A stated length is sent as it is (a trace's or a JSONL file's line); workload.max_tokens
    is for items that state none, and caps a source's reference length (ShareGPT's reply)."""
    if item.output_tokens is None:
        return workload.max_tokens
    return min(item.output_tokens, workload.max_tokens) if item.capped else item.output_tokens


def _count(prompt: str, tokenizer: Tokenizer | None) -> int | None:
    return len(tokenizer.encode(prompt, add_special_tokens=False)) if tokenizer is not None else None


def build_requests(
    workload: WorkloadConfig, count: int, seed: int, tokenizer: Tokenizer | None = None
) -> list[Request]:
    return to_requests(load_items(workload, count, seed, tokenizer), workload, tokenizer)


def split_warmup(
    workload: WorkloadConfig, measured: int, warmup: int, seed: int, tokenizer: Tokenizer | None = None
) -> tuple[list[Request], list[Request]]:
    """Warm-up prompts are drawn apart from the measured ones, so they never warm their cache."""
    both = build_requests(workload, measured + warmup, seed, tokenizer)
    return [replace(r, index=i) for i, r in enumerate(both[measured:])], both[:measured]
