"""Prompts for lengths-only trace lines (vLLM's timed_trace, Mooncake): exactly as long as the line says.

A line gives ``input_length`` and ``hash_ids``, no text. Its prompt is made of token ids: hash
id *h* is a block of ``block_tokens`` ids drawn by a generator seeded with *h* (special tokens
excluded), so lines that share hash ids share a prefix and hit the prefix cache, as in vLLM's
``TimedTrace`` (``vllm/benchmarks/datasets/datasets.py``); tokens past the blocks the hash ids
cover are a tail of the line's own. vLLM sends such a prompt as token ids to the completions
endpoint, and so does specsweep. The chat endpoint takes text, which the server re-tokenises
after applying the chat template: that text is built here so that the model's own tokenizer
counts exactly ``input_length`` tokens for the whole templated prompt, or the line is refused
(checked before launch, with the fix: the completions endpoint sends ids as they are).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from pipeline.config import ConfigError
from pipeline.load.items import Tokenizer

MOONCAKE_BLOCK_TOKENS = 512  # tokens per hash id in Mooncake's published traces (vLLM's default is 16)
MAX_TRIES = 24  # decode/re-encode rounds before a chat prompt's length is given up on


class LengthError(ConfigError):
    """A lengths-only line whose text cannot be made exactly as long as it says."""


def vocabulary(tokenizer: Tokenizer) -> list[int]:
    """The ids random prompts draw from: the vocabulary less the special tokens, sorted (as
    vLLM's ``TimedTrace._sample_token`` draws them)."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    get_vocab = getattr(tokenizer, "get_vocab", None)
    ids = sorted(set(get_vocab().values())) if callable(get_vocab) else range(tokenizer.vocab_size)
    return [i for i in ids if i not in special]


def _block(seed: str, size: int, vocab: Sequence[int]) -> list[int]:
    rng = random.Random(seed)
    return [vocab[rng.randrange(len(vocab))] for _ in range(size)]


def prompt_ids(length: int, hash_ids: Sequence[int], vocab: Sequence[int], block_tokens: int) -> list[int]:
    """``length`` token ids: one block per hash id (a block's ids depend on its hash id alone),
    then, where the hash ids cover fewer tokens than ``length``, a tail of the line's own. vLLM
    sends only the tokens its hash ids cover; a line's stated length is sent here."""
    ids: list[int] = []
    for hash_id in hash_ids:
        if len(ids) >= length:
            break
        ids += _block(f"trace-block:{hash_id}:{block_tokens}", block_tokens, vocab)
    while len(ids) < length:
        ids += _block(f"trace-tail:{tuple(hash_ids)}:{len(ids)}", block_tokens, vocab)
    return ids[:length]


def chat_tokens(tokenizer: Tokenizer, text: str | Sequence[dict[str, str]]) -> int:
    """What a server counts for a chat request (``text``: its one user message): the chat
    template applied, then tokenised without special tokens added (vLLM's chat default)."""
    messages = [{"role": "user", "content": text}] if isinstance(text, str) else list(text)
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return len(tokenizer.encode(str(rendered), add_special_tokens=False))


def chat_text(ids: Sequence[int], length: int, tokenizer: Tokenizer, vocab: Sequence[int]) -> str:
    """Text whose templated chat prompt the tokenizer counts as exactly ``length`` tokens: a
    prefix of ``ids`` decoded, grown or cut until the count is exact (vLLM's
    ``gen_prompt_decode_to_target_len`` does the same for its random dataset's text)."""
    overhead = chat_tokens(tokenizer, "")
    if length <= overhead:
        raise LengthError(
            f"input_length={length} is not more than the chat template's own {overhead} tokens; send the line's "
            f"token ids as they are with workload.endpoint=completions"
        )
    pool = list(ids) + _block(f"trace-pad:{len(ids)}", length, vocab)  # room to grow past a merge
    take = length - overhead
    seen: set[int] = set()
    for _ in range(MAX_TRIES):
        text = tokenizer.decode(pool[:take])
        counted = chat_tokens(tokenizer, text)
        if counted == length:
            return text
        seen.add(take)
        step = length - counted
        take = max(1, min(len(pool), take + step))
        if take in seen:  # a merge at the cut oscillates: step one token past it
            take = max(1, min(len(pool), take + (1 if step > 0 else -1)))
    raise LengthError(
        f"no text of the model's tokens makes a chat prompt of exactly input_length={length} tokens here; send the "
        f"line's token ids as they are with workload.endpoint=completions"
    )
